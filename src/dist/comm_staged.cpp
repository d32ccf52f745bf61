// The staged MPI backend of Comm (dist/comm_device.hpp): device buffers go device → pinned host
// → MPI Comm → pinned host → device; host buffers go to the MPI Comm as they are.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "dist/comm_device.hpp"
#include "dist/comm_device_base.hpp"
#include "dist/cuda_util.hpp"

namespace ctxpar {

namespace {

// One tag for all staged point-to-point traffic: MPI matches messages of one (source, tag,
// communicator) in order, which gives NCCL's issue-order matching (comm.hpp's contract).
constexpr int kStagedTag = 7;

// Pinned host memory: the only kind the GPU copies asynchronously, at full PCIe/NVLink-C2C speed.
struct Pinned {
  void* ptr = nullptr;
  size_t capacity_bytes = 0;
  bool busy = false;
};

bool is_float16(DType t) { return t == DType::bf16 || t == DType::f16; }

// 16-bit floats ↔ f32 on the host (cuda_bf16.h/cuda_fp16.h conversions are host-callable;
// f32 → 16 bit rounds to nearest even).
void widen(DType t, const void* src, float* dst, size_t n) {
  if (t == DType::bf16) {
    const auto* s = static_cast<const __nv_bfloat16*>(src);
    for (size_t i = 0; i < n; ++i) dst[i] = __bfloat162float(s[i]);
  } else {
    const auto* s = static_cast<const __half*>(src);
    for (size_t i = 0; i < n; ++i) dst[i] = __half2float(s[i]);
  }
}
void narrow(DType t, const float* src, void* dst, size_t n) {
  if (t == DType::bf16) {
    auto* d = static_cast<__nv_bfloat16*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = __float2bfloat16_rn(src[i]);
  } else {
    auto* d = static_cast<__half*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = __float2half_rn(src[i]);
  }
}

// Calls f with a typed host span over `p` for the element types MPI reduces natively.
template <class F> void with_host_span(DType t, void* p, size_t n, F&& f) {
  switch (t) {
    case DType::f32: f(std::span<float>(static_cast<float*>(p), n)); return;
    case DType::f64: f(std::span<double>(static_cast<double*>(p), n)); return;
    case DType::i32: f(std::span<int32_t>(static_cast<int32_t*>(p), n)); return;
    case DType::i64: f(std::span<int64_t>(static_cast<int64_t*>(p), n)); return;
    default: CTXPAR_FATAL("staged comm: no native host reduction for " << dtype_name(t));
  }
}

std::span<std::byte> bytes_of(void* p, size_t n) { return std::span<std::byte>(static_cast<std::byte*>(p), n); }

class CommStaged final : public dist_detail::DeviceBackendComm {
 public:
  CommStaged(Comm& host, int device) : DeviceBackendComm(host, device) {
    int current = -1;
    CTXPAR_DIST_CUDA_CHECK(cudaGetDevice(&current));
    CTXPAR_CHECK(current == device, "make_staged_comm: device " << device << " is not the current CUDA device ("
                                                                << current << "); call select_device first");
    CTXPAR_DIST_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    CTXPAR_DIST_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CTXPAR_DIST_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }

  ~CommStaged() override {
    cudaStreamSynchronize(comm_stream_);
    size_t leaked = 0;
    for (auto& p : pool_) {
      // A buffer still busy belongs to a request nobody completed; MPI may still write into it.
      if (p->busy) ++leaked;
      else cudaFreeHost(p->ptr);
    }
    if (leaked > 0)
      std::fprintf(stderr, "ctxpar: staged comm '%s' destroyed with %zu pinned buffers of incomplete requests (left allocated)\n",
                   host_.name().c_str(), leaked);
    for (auto& s : slots_) cudaEventDestroy(s.event);
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(comm_stream_);
  }

  std::string backend() const override { return "mpi-staged"; }
  [[noreturn]] void abort(int code) override {
    host_.abort(code);
    std::abort();  // not reached
  }

  void synchronize() override {
    CTXPAR_DIST_CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
    CTXPAR_DIST_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }

 protected:
  bool test_device(Request& r) override {
    bool all = true;
    for (int64_t id : r.ids()) all = advance(slots_[size_t(id)], false) && all;
    if (all) release(r);
    return all;
  }

  void wait_device(Request& r) override {
    for (int64_t id : r.ids()) advance(slots_[size_t(id)], true);
    release(r);
  }

  // MPI completes on the host, so ordering a staged transfer before compute needs the host.
  void stream_wait_device(Request& r) override { wait_device(r); }

  Request send_recv_device(Buf send, int to, Buf recv, int from, int tag) override {
    (void)tag;  // one tag for all staged traffic (kStagedTag)
    Pinned* s = acquire(send.bytes());
    Pinned* r = acquire(recv.bytes());
    to_host(send, s->ptr);
    host_ready();
    Request hreq = host_.send_recv_async(std::span<const std::byte>(bytes_of(s->ptr, send.bytes())), to,
                                         bytes_of(r->ptr, recv.bytes()), from, kStagedTag);
    return in_flight(std::move(hreq), recv, s, r);
  }

  Request all_gather_async_device(Buf send, Buf recv) override {
    CTXPAR_CHECK(recv.count == send.count * size_t(size()), "all_gather_async: recv holds " << recv.count
                 << " elements, expected size*send = " << size() << "*" << send.count);
    Pinned* s = acquire(send.bytes());
    Pinned* r = acquire(recv.bytes());
    to_host(send, s->ptr);
    host_ready();
    Request hreq = host_.all_gather_async(std::span<const std::byte>(bytes_of(s->ptr, send.bytes())),
                                          bytes_of(r->ptr, recv.bytes()));
    return in_flight(std::move(hreq), recv, s, r);
  }

  // The reduction runs on the host after MPI's transfer (reduce_scatter_device): complete on return.
  Request reduce_scatter_async_device(Buf send, Buf recv, ReduceOp op) override {
    reduce_scatter_device(send, recv, op);
    return Request();
  }

  void all_gather_device(Buf send, Buf recv) override {
    CTXPAR_CHECK(recv.count == send.count * size_t(size()), "all_gather: recv holds " << recv.count
                 << " elements, expected size*send = " << size() << "*" << send.count);
    Scoped s(this, send.bytes()), r(this, recv.bytes());
    to_host(send, s.p->ptr);
    host_ready();
    host_.all_gather(std::span<const std::byte>(bytes_of(s.p->ptr, send.bytes())), bytes_of(r.p->ptr, recv.bytes()));
    to_device(r.p->ptr, recv);
  }

  void all_to_all_device(Buf send, Buf recv) override {
    CTXPAR_CHECK(send.count == recv.count && send.count % size_t(size()) == 0,
                 "all_to_all: send " << send.count << " / recv " << recv.count
                                     << " elements must be equal and a multiple of " << size());
    Scoped s(this, send.bytes()), r(this, recv.bytes());
    to_host(send, s.p->ptr);
    host_ready();
    // Equal blocks of elements are equal blocks of bytes, so the exchange can run on bytes.
    host_.all_to_all(std::span<const std::byte>(bytes_of(s.p->ptr, send.bytes())), bytes_of(r.p->ptr, recv.bytes()));
    to_device(r.p->ptr, recv);
  }

  void reduce_scatter_device(Buf send, Buf recv, ReduceOp op) override {
    CTXPAR_CHECK(send.type != DType::u8, "reduce_scatter: no reductions on u8 (MPI has no arithmetic on bytes)");
    CTXPAR_CHECK(send.count == recv.count * size_t(size()), "reduce_scatter: send holds " << send.count
                 << " elements, expected size*recv = " << size() << "*" << recv.count);
    Scoped s(this, send.bytes()), r(this, recv.bytes());
    to_host(send, s.p->ptr);
    host_ready();
    const size_t n = recv.count;
    if (is_float16(send.type)) {
      std::vector<float> wide(send.count), mine(n);
      widen(send.type, s.p->ptr, wide.data(), send.count);
      host_.reduce_scatter(std::span<const float>(wide), std::span<float>(mine), op);
      narrow(send.type, mine.data(), r.p->ptr, n);
    } else {
      // Same element type on both sides; the lambda is instantiated per type.
      with_host_span(send.type, s.p->ptr, send.count, [&](auto all) {
        using T = typename decltype(all)::element_type;
        host_.reduce_scatter(std::span<const T>(all), std::span<T>(static_cast<T*>(r.p->ptr), n), op);
      });
    }
    to_device(r.p->ptr, recv);
  }

  void all_reduce_device(Buf inout, ReduceOp op) override {
    CTXPAR_CHECK(inout.type != DType::u8, "all_reduce: no reductions on u8 (MPI has no arithmetic on bytes)");
    Scoped s(this, inout.bytes());
    to_host(inout, s.p->ptr);
    host_ready();
    if (is_float16(inout.type)) {
      std::vector<float> wide(inout.count);
      widen(inout.type, s.p->ptr, wide.data(), inout.count);
      host_.all_reduce(std::span<float>(wide), op);
      narrow(inout.type, wide.data(), s.p->ptr, inout.count);
    } else {
      with_host_span(inout.type, s.p->ptr, inout.count, [&](auto all) { host_.all_reduce(all, op); });
    }
    to_device(s.p->ptr, inout);
  }

  void broadcast_device(Buf data, int root) override {
    Scoped s(this, data.bytes());
    // Non-roots upload into `data` below, so they too must wait for earlier compute on it.
    if (rank() == root) to_host(data, s.p->ptr);
    else order_after_compute();
    host_ready();
    host_.broadcast(bytes_of(s.p->ptr, data.bytes()), root);
    to_device(s.p->ptr, data);
  }

 private:

  // A send_recv_async or all_gather_async in flight: MPI on pinned buffers, then the copy of the received bytes to
  // the device, then done.
  struct Slot {
    enum State { idle, mpi, copy } state = idle;
    Request host_req;
    void* recv_dev = nullptr;
    size_t recv_bytes = 0;
    Pinned* send_pin = nullptr;
    Pinned* recv_pin = nullptr;
    cudaEvent_t event = nullptr;  // recorded after the copy to the device
  };

  // A slot for MPI request `hreq` moving bytes from pinned `s` into pinned `r`, then to `recv`.
  Request in_flight(Request hreq, Buf recv, Pinned* s, Pinned* r) {
    const int64_t id = acquire_slot();
    Slot& slot = slots_[size_t(id)];
    slot.host_req = std::move(hreq);
    slot.recv_dev = recv.ptr;
    slot.recv_bytes = recv.bytes();
    slot.send_pin = s;
    slot.recv_pin = r;
    slot.state = Slot::mpi;
    return Request({id});
  }

  // Moves a slot forward; returns true when it is complete (copy on the device finished).
  bool advance(Slot& s, bool block) {
    if (s.state == Slot::mpi) {
      if (block) host_.wait(s.host_req);
      else if (!host_.test(s.host_req)) return false;
      CTXPAR_DIST_CUDA_CHECK(cudaMemcpyAsync(s.recv_dev, s.recv_pin->ptr, s.recv_bytes, cudaMemcpyHostToDevice, comm_stream_));
      CTXPAR_DIST_CUDA_CHECK(cudaEventRecord(s.event, comm_stream_));
      s.state = Slot::copy;
    }
    if (block) {
      CTXPAR_DIST_CUDA_CHECK(cudaEventSynchronize(s.event));
      return true;
    }
    const cudaError_t q = cudaEventQuery(s.event);
    if (q == cudaErrorNotReady) return false;
    CTXPAR_DIST_CUDA_CHECK(q);
    return true;
  }

  // The communication stream starts after everything already on the compute stream.
  void order_after_compute() {
    CTXPAR_DIST_CUDA_CHECK(cudaEventRecord(ready_, compute_));
    CTXPAR_DIST_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready_, 0));
  }
  // Device → pinned, ordered after the compute stream's earlier work.
  void to_host(Buf src, void* pinned) {
    order_after_compute();
    if (src.bytes() > 0)
      CTXPAR_DIST_CUDA_CHECK(cudaMemcpyAsync(pinned, src.ptr, src.bytes(), cudaMemcpyDeviceToHost, comm_stream_));
  }
  // Every host access to pinned memory comes after this: all earlier copies on the communication
  // stream (downloads just issued, and uploads from buffers the pool hands out again) are done.
  void host_ready() { CTXPAR_DIST_CUDA_CHECK(cudaStreamSynchronize(comm_stream_)); }
  // Pinned → device on the communication stream; later compute-stream work waits for it. The
  // pinned buffer may go back to the pool at once: its next user first calls host_ready().
  void to_device(void* pinned, Buf dst) {
    if (dst.bytes() > 0)
      CTXPAR_DIST_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, pinned, dst.bytes(), cudaMemcpyHostToDevice, comm_stream_));
    CTXPAR_DIST_CUDA_CHECK(cudaEventRecord(done_, comm_stream_));
    CTXPAR_DIST_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
  }

  // Smallest free pinned buffer that fits, else a new one (power-of-two capacity, at least 64 KiB,
  // so a growing message size allocates O(log) times; cudaHostAlloc costs milliseconds).
  Pinned* acquire(size_t bytes) {
    Pinned* best = nullptr;
    for (auto& p : pool_)
      if (!p->busy && p->capacity_bytes >= bytes && (best == nullptr || p->capacity_bytes < best->capacity_bytes))
        best = p.get();
    if (best == nullptr) {
      size_t cap = size_t(64) << 10;
      while (cap < bytes) cap *= 2;
      auto p = std::make_unique<Pinned>();
      CTXPAR_DIST_CUDA_CHECK(cudaHostAlloc(&p->ptr, cap, cudaHostAllocDefault));
      p->capacity_bytes = cap;
      best = p.get();
      pool_.push_back(std::move(p));
    }
    best->busy = true;
    return best;
  }
  struct Scoped {  // a pinned buffer for the duration of one collective
    CommStaged* c;
    Pinned* p;
    Scoped(CommStaged* comm, size_t bytes) : c(comm), p(comm->acquire(bytes)) {}
    ~Scoped() { p->busy = false; }
    Scoped(const Scoped&) = delete;
    Scoped& operator=(const Scoped&) = delete;
  };

  int64_t acquire_slot() {
    if (!free_slots_.empty()) {
      const int64_t id = free_slots_.back();
      free_slots_.pop_back();
      return id;
    }
    Slot s;
    CTXPAR_DIST_CUDA_CHECK(cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming));
    slots_.push_back(std::move(s));
    return int64_t(slots_.size()) - 1;
  }
  void release(Request& r) {
    for (int64_t id : r.ids()) {
      Slot& s = slots_[size_t(id)];
      s.send_pin->busy = false;
      s.recv_pin->busy = false;
      s.state = Slot::idle;
      free_slots_.push_back(id);
    }
    r.ids().clear();
  }

  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  std::vector<std::unique_ptr<Pinned>> pool_;
  std::vector<Slot> slots_;  // Request ids index this
  std::vector<int64_t> free_slots_;
};

}  // namespace

std::unique_ptr<Comm> make_staged_comm(Comm& host, int device) {
  return std::make_unique<CommStaged>(host, device);
}

}  // namespace ctxpar
