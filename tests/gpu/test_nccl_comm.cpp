// Comm (dist/comm.hpp) on device buffers, both backends, against the MPI Comm's result
// on host copies of the same data:
//   mpi-staged: any number of ranks, sharing GPUs (device_for_local_rank), e.g. 4 ranks on 1 GPU;
//   nccl:       one rank per GPU; skipped when the node has fewer GPUs than ranks (then the test
//               that NCCL refuses a shared GPU runs instead).
// Without a usable GPU every test is skipped, and rank 0 prints "ctxpar-gpu-skip: no CUDA device"
// (ctest's SKIP_REGULAR_EXPRESSION reports the run as skipped).
//
// Values are small integers (exact in f32 and bf16), so sums are exact in any order and the
// device result must equal the host result bit for bit.
#include <cuda_runtime.h>  // the typed cudaMalloc/cudaMallocHost overloads
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "dist/chips.hpp"
#include "dist/comm_device.hpp"
#include "mpi_test_env.hpp"

using namespace ctxpar;
using ctxpar::test::all_ok;
using ctxpar::test::world;

namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// What every rank agrees on before any GPU test: GPUs visible (minimum over ranks) and why none.
struct GpuState {
  int devices = 0;
  std::string why;
  NodeLocal node;
};

const GpuState& gpu_state() {
  static const GpuState s = [] {
    GpuState g;
    g.node = node_local(world());
    const DeviceCount dc = cuda_device_count();
    int32_t n = dc.count;
    world().all_reduce(std::span<int32_t>(&n, 1), ReduceOp::min);
    g.devices = n;
    g.why = dc.count == 0 ? dc.why : "another rank sees no CUDA device";
    if (g.devices == 0 && world().rank() == 0)
      std::printf("ctxpar-gpu-skip: no CUDA device (%s); the device communication tests are skipped\n", g.why.c_str());
    return g;
  }();
  return s;
}

// One device Comm per backend for the whole run (NCCL init takes a while), destroyed in the
// environment's TearDown, i.e. before the gtest main finalizes MPI.
struct Backends : ::testing::Environment {
  struct Entry {
    std::unique_ptr<Comm> comm;
    cudaStream_t compute = nullptr;
  };
  std::map<std::string, Entry> made;
  void TearDown() override {
    for (auto& [name, e] : made) {
      e.comm.reset();
      if (e.compute) cudaStreamDestroy(e.compute);
    }
    made.clear();
  }
};
Backends* g_backends = static_cast<Backends*>(::testing::AddGlobalTestEnvironment(new Backends));

Comm& backend(const std::string& name) {
  auto it = g_backends->made.find(name);
  if (it != g_backends->made.end()) return *it->second.comm;
  const GpuState& g = gpu_state();
  const int dev = select_device(g.node.rank, g.node.size);
  Backends::Entry e;
  e.comm = name == "nccl" ? make_nccl_comm(world(), dev, NcclOptions{60, 120}) : make_staged_comm(world(), dev);
  // A non-blocking compute stream: ordering must come from the comm's events, not from implicit
  // synchronization with the legacy default stream.
  if (cudaStreamCreateWithFlags(&e.compute, cudaStreamNonBlocking) != cudaSuccess) CTXPAR_FATAL("cudaStreamCreate");
  e.comm->set_compute_stream(e.compute);
  return *g_backends->made.emplace(name, std::move(e)).first->second.comm;
}

// Device buffer with upload/download through pinned memory on the comm's compute stream.
template <class T> class DevVec {
 public:
  explicit DevVec(size_t n) : n_(n) {
    if (cudaMalloc(&d_, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) CTXPAR_FATAL("cudaMalloc");
    if (cudaMallocHost(&h_, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) CTXPAR_FATAL("cudaMallocHost");
  }
  ~DevVec() {
    cudaFree(d_);
    cudaFreeHost(h_);
  }
  DevVec(const DevVec&) = delete;
  DevVec& operator=(const DevVec&) = delete;
  DeviceSpan<T> span() { return DeviceSpan<T>(d_, n_); }
  // Asynchronous on `s`: no host synchronization, so the comm must order itself after it.
  void upload(const std::vector<T>& v, cudaStream_t s) {
    std::memcpy(h_, v.data(), n_ * sizeof(T));
    if (cudaMemcpyAsync(d_, h_, n_ * sizeof(T), cudaMemcpyHostToDevice, s) != cudaSuccess) CTXPAR_FATAL("upload");
  }
  // On `s`, then waits for `s`: sees the comm's result only if the comm ordered `s` after itself.
  std::vector<T> download(cudaStream_t s) {
    if (cudaMemcpyAsync(h_, d_, n_ * sizeof(T), cudaMemcpyDeviceToHost, s) != cudaSuccess) CTXPAR_FATAL("download");
    if (cudaStreamSynchronize(s) != cudaSuccess) CTXPAR_FATAL("cudaStreamSynchronize");
    return std::vector<T>(h_, h_ + n_);
  }
  void fill_bytes(int byte) {
    if (cudaMemset(d_, byte, n_ * sizeof(T)) != cudaSuccess) CTXPAR_FATAL("cudaMemset");
    if (cudaDeviceSynchronize() != cudaSuccess) CTXPAR_FATAL("cudaDeviceSynchronize");
  }

 private:
  size_t n_;
  T* d_ = nullptr;
  T* h_ = nullptr;
};

// Holds the compute stream for `ms` (a host function on the stream), so an operation that does
// not wait for the compute stream reads its inputs before they are uploaded — and fails.
void stall(cudaStream_t s, int ms) {
  const cudaError_t e = cudaLaunchHostFunc(
      s, [](void* p) { std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<intptr_t>(p))); },
      reinterpret_cast<void*>(intptr_t(ms)));
  if (e != cudaSuccess) CTXPAR_FATAL("cudaLaunchHostFunc: " << cudaGetErrorString(e));
}

std::vector<float> ints_f32(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float((int(i) * 7 + seed * 13) % 61 - 30);
  return v;
}
std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = __float2bfloat16_rn(v[i]);
  return b;
}
std::vector<float> from_bf16(const std::vector<__nv_bfloat16>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = __bfloat162float(b[i]);
  return v;
}

// Mismatches between two vectors (a count, so one EXPECT reports a whole buffer).
template <class T> size_t mismatches(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return std::max(got.size(), want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
  return bad;
}

class CommDeviceBackend : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const GpuState& g = gpu_state();
    if (g.devices == 0) GTEST_SKIP() << "ctxpar-gpu-skip: no CUDA device (" << g.why << ")";
    if (GetParam() == "nccl" && g.devices < g.node.size)
      GTEST_SKIP() << "nccl: " << g.node.size << " ranks on this node but " << g.devices
                   << " GPU(s); NCCL needs one GPU per rank (NcclRefusesSharedGpu covers this layout)";
    c_ = &backend(GetParam());
    s_ = c_->compute_stream();
  }
  Comm& c() { return *c_; }
  cudaStream_t s() { return s_; }
  int P() { return world().size(); }
  int r() { return world().rank(); }

 private:
  Comm* c_ = nullptr;
  cudaStream_t s_ = nullptr;
};

TEST_P(CommDeviceBackend, IdentityMatchesHostComm) {
  EXPECT_EQ(c().rank(), world().rank());
  EXPECT_EQ(c().size(), world().size());
  EXPECT_EQ(c().backend(), GetParam());
  int current = -1;
  CUDA_OK(cudaGetDevice(&current));
  EXPECT_EQ(c().device(), current);
  EXPECT_NE(c().comm_stream(), c().compute_stream());
}

// Ring step as in ring attention: send to r+1, receive from r-1; completed three ways.
TEST_P(CommDeviceBackend, SendRecvRingMatchesHost) {
  const int to = (r() + 1) % P(), from = (r() - 1 + P()) % P();
  for (const char* how : {"wait", "test", "stream_wait"}) {
    SCOPED_TRACE(how);
    const size_t n = 1000 + 17;
    std::vector<float> send = ints_f32(n, r());
    std::vector<float> want(n, -1.f);
    Request hq = world().send_recv_async(std::span<const float>(send), to, std::span<float>(want), from);
    world().wait(hq);

    DevVec<float> dsend(n), drecv(n);
    drecv.fill_bytes(0xff);
    stall(s(), 50);
    dsend.upload(send, s());
    Request q = c().send_recv_async(DeviceSpan<const float>(dsend.span()), to, drecv.span(), from);
    EXPECT_TRUE(q.pending());
    if (std::string(how) == "wait") {
      c().wait(q);
    } else if (std::string(how) == "test") {
      while (!c().test(q)) {
      }
    } else {
      c().stream_wait(q);
    }
    EXPECT_FALSE(q.pending());
    EXPECT_EQ(mismatches(drecv.download(s()), want), 0u);
  }
}

// Two transfers in flight at once (K and V of a ring step), plus a large one (pool growth,
// NCCL chunking), completed by polling.
TEST_P(CommDeviceBackend, TwoOutstandingTransfersAndLargeMessage) {
  const int to = (r() + 1) % P(), from = (r() - 1 + P()) % P();
  const size_t nk = 4096, nv = size_t(8) << 20;  // 16 KiB and 32 MiB of f32
  std::vector<float> k = ints_f32(nk, r()), v = ints_f32(nv, r() + 100);
  std::vector<float> wk(nk), wv(nv);
  Request h1 = world().send_recv_async(std::span<const float>(k), to, std::span<float>(wk), from, 1);
  Request h2 = world().send_recv_async(std::span<const float>(v), to, std::span<float>(wv), from, 2);
  world().wait(h1);
  world().wait(h2);

  DevVec<float> dk(nk), dv(nv), rk(nk), rv(nv);
  dk.upload(k, s());
  dv.upload(v, s());
  Request q1 = c().send_recv_async(DeviceSpan<const float>(dk.span()), to, rk.span(), from);
  Request q2 = c().send_recv_async(DeviceSpan<const float>(dv.span()), to, rv.span(), from);
  bool d1 = false, d2 = false;
  while (!(d1 && d2)) {
    if (!d1) d1 = c().test(q1);
    if (!d2) d2 = c().test(q2);
  }
  EXPECT_EQ(mismatches(rk.download(s()), wk), 0u);
  EXPECT_EQ(mismatches(rv.download(s()), wv), 0u);
}

TEST_P(CommDeviceBackend, AllToAllMatchesHost) {
  const size_t block = 257;  // odd, so no accidental alignment
  std::vector<float> send(block * size_t(P()));
  for (int dst = 0; dst < P(); ++dst)
    for (size_t i = 0; i < block; ++i) send[size_t(dst) * block + i] = float(r() * 1000 + dst * 10 + int(i % 10));
  std::vector<float> want(send.size());
  world().all_to_all(std::span<const float>(send), std::span<float>(want));

  DevVec<float> ds(send.size()), dr(send.size());
  stall(s(), 50);
  ds.upload(send, s());
  c().all_to_all(DeviceSpan<const float>(ds.span()), dr.span());
  EXPECT_EQ(mismatches(dr.download(s()), want), 0u);

  // bf16 moves the same bits.
  DevVec<__nv_bfloat16> bs(send.size()), br(send.size());
  bs.upload(to_bf16(send), s());
  c().all_to_all(DeviceSpan<const __nv_bfloat16>(bs.span()), br.span());
  EXPECT_EQ(mismatches(from_bf16(br.download(s())), from_bf16(to_bf16(want))), 0u);
}

TEST_P(CommDeviceBackend, AllGatherMatchesHost) {
  const size_t n = 333;
  std::vector<int64_t> send(n);
  for (size_t i = 0; i < n; ++i) send[i] = int64_t(r()) << 40 | int64_t(i);
  std::vector<int64_t> want(n * size_t(P()));
  world().all_gather(std::span<const int64_t>(send), std::span<int64_t>(want));

  DevVec<int64_t> ds(n), dr(want.size());
  stall(s(), 50);
  ds.upload(send, s());
  c().all_gather(DeviceSpan<const int64_t>(ds.span()), dr.span());
  EXPECT_EQ(mismatches(dr.download(s()), want), 0u);
}

// The nonblocking forms: two in flight, each ordered after the compute stream's earlier work
// (the stall) and before its later work (stream_wait), with the host's result.
TEST_P(CommDeviceBackend, AsyncCollectivesMatchHost) {
  const size_t n = 4099;
  std::vector<float> send = ints_f32(n, r() + 2), gwant(n * size_t(P()));
  world().all_gather(std::span<const float>(send), std::span<float>(gwant));
  std::vector<float> parts = ints_f32(n * size_t(P()), r() + 7), rwant(n);
  world().reduce_scatter(std::span<const float>(parts), std::span<float>(rwant));

  DevVec<float> gs(n), gr(gwant.size()), ps(parts.size()), pr(n);
  stall(s(), 50);
  gs.upload(send, s());
  ps.upload(parts, s());
  Request g = c().all_gather_async(DeviceSpan<const float>(gs.span()), gr.span());
  Request rs = c().reduce_scatter_async(DeviceSpan<const float>(ps.span()), pr.span());
  c().stream_wait(g);
  c().stream_wait(rs);
  EXPECT_FALSE(g.pending());
  EXPECT_FALSE(rs.pending());
  EXPECT_EQ(mismatches(gr.download(s()), gwant), 0u);
  EXPECT_EQ(mismatches(pr.download(s()), rwant), 0u);

  // Host buffers through the same Comm: the MPI Comm's requests, completed by test.
  std::vector<float> hr(gwant.size(), -1.0f);
  Request h = c().all_gather_async(std::span<const float>(send), std::span<float>(hr));
  while (!c().test(h)) {
  }
  EXPECT_EQ(hr, gwant);
}

TEST_P(CommDeviceBackend, AllReduceMatchesHost) {
  const size_t n = 4099;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    SCOPED_TRACE(int(op));
    std::vector<float> v = ints_f32(n, r() * 3 + 1);
    std::vector<float> want = v;
    world().all_reduce(std::span<float>(want), op);

    DevVec<float> d(n);
    stall(s(), 30);
    d.upload(v, s());
    c().all_reduce(d.span(), op);
    EXPECT_EQ(mismatches(d.download(s()), want), 0u);

    // bf16: |sum| <= 30 * 8 ranks fits bf16's 8-bit significand exactly.
    DevVec<__nv_bfloat16> b(n);
    b.upload(to_bf16(v), s());
    c().all_reduce(b.span(), op);
    EXPECT_EQ(mismatches(from_bf16(b.download(s())), want), 0u);
  }
  std::vector<int64_t> iv(77, int64_t(r()) + 1), iwant = iv;
  world().all_reduce(std::span<int64_t>(iwant));
  DevVec<int64_t> di(iv.size());
  di.upload(iv, s());
  c().all_reduce(di.span());
  EXPECT_EQ(mismatches(di.download(s()), iwant), 0u);
}

TEST_P(CommDeviceBackend, ReduceScatterMatchesHost) {
  const size_t n = 129;
  std::vector<float> send = ints_f32(n * size_t(P()), r() + 5);
  std::vector<float> want(n);
  world().reduce_scatter(std::span<const float>(send), std::span<float>(want));

  DevVec<float> ds(send.size()), dr(n);
  stall(s(), 30);
  ds.upload(send, s());
  c().reduce_scatter(DeviceSpan<const float>(ds.span()), dr.span());
  EXPECT_EQ(mismatches(dr.download(s()), want), 0u);

  // max: the host reference is all_reduce(max) restricted to this rank's block.
  std::vector<double> dsend(send.begin(), send.end()), dall = dsend;
  world().all_reduce(std::span<double>(dall), ReduceOp::max);
  std::vector<double> dwant(dall.begin() + std::ptrdiff_t(n) * r(), dall.begin() + std::ptrdiff_t(n) * (r() + 1));
  DevVec<double> es(dsend.size()), er(n);
  es.upload(dsend, s());
  c().reduce_scatter(DeviceSpan<const double>(es.span()), er.span(), ReduceOp::max);
  EXPECT_EQ(mismatches(er.download(s()), dwant), 0u);
}

TEST_P(CommDeviceBackend, BroadcastFromLastRank) {
  const int root = P() - 1;
  const size_t n = 1001;
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = r() == root ? int32_t(i * 3 + 1) : -7;
  std::vector<int32_t> want = v;
  world().broadcast(std::span<int32_t>(want), root);

  DevVec<int32_t> d(n);
  stall(s(), 30);
  d.upload(v, s());
  c().broadcast(d.span(), root);
  EXPECT_EQ(mismatches(d.download(s()), want), 0u);
}

// After synchronize(), everything issued is complete on the device.
TEST_P(CommDeviceBackend, SynchronizeCompletesEverything) {
  const size_t n = 2048;
  std::vector<float> v = ints_f32(n, r());
  std::vector<float> want = v;
  world().all_reduce(std::span<float>(want));
  DevVec<float> d(n);
  d.upload(v, s());
  c().all_reduce(d.span());
  c().synchronize();
  EXPECT_EQ(cudaStreamQuery(s()), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(c().comm_stream()), cudaSuccess);
  EXPECT_EQ(mismatches(d.download(s()), want), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, CommDeviceBackend, ::testing::Values(std::string("mpi-staged"), std::string("nccl")),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return i.param == "nccl" ? std::string("nccl") : std::string("mpi_staged");
                         });

// With several ranks on one GPU, NCCL must be refused before it is touched, on every rank alike.
TEST(NcclComm, RefusesSharedGpu) {
  const GpuState& g = gpu_state();
  if (g.devices == 0) GTEST_SKIP() << "ctxpar-gpu-skip: no CUDA device (" << g.why << ")";
  if (g.devices >= g.node.size) GTEST_SKIP() << "every rank of this node has its own GPU";
  const int dev = select_device(g.node.rank, g.node.size);
  std::string msg;
  try {
    make_nccl_comm(world(), dev);
  } catch (const UsageError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("one GPU per rank"), std::string::npos) << msg;
  EXPECT_TRUE(all_ok(!msg.empty()));
}

TEST(NcclComm, LibraryVersion) {
  const GpuState& g = gpu_state();
  if (g.devices == 0) GTEST_SKIP() << "ctxpar-gpu-skip: no CUDA device (" << g.why << ")";
  const std::string v = nccl_library_version();
  EXPECT_EQ(v.rfind("NCCL 2.", 0), 0u) << v;
}

}  // namespace
