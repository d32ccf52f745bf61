// The NCCL backend of Comm (dist/comm_device.hpp): device buffers through NCCL on its own
// communication stream, host buffers through the bootstrap MPI Comm.
#include "dist/comm_device.hpp"

#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "dist/comm_device_base.hpp"
#include "dist/cuda_util.hpp"

namespace ctxpar {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

class CommNccl final : public dist_detail::DeviceBackendComm {
 public:
  CommNccl(Comm& boot, int device, const NcclOptions& opt)
      : DeviceBackendComm(boot, device), rank_(boot.rank()), size_(boot.size()), name_(boot.name()), opt_(opt),
        host_name_(dist_detail::host_name()) {
    int current = -1;
    CTXPAR_DIST_CUDA_CHECK(cudaGetDevice(&current));
    CTXPAR_CHECK(current == device, "make_nccl_comm: device " << device << " is not the current CUDA device ("
                                                              << current << "); call select_device first");
    check_one_gpu_per_rank(boot);

    // The unique id carries rank 0's bootstrap address; every rank needs the same bytes.
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank_ == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    boot.broadcast(std::span<uint8_t>(reinterpret_cast<uint8_t*>(id.internal), sizeof id.internal), 0);

    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;  // init returns at once; poll below bounds it by init_timeout_s
    const ncclResult_t rc = ncclCommInitRankConfig(&comm_, size_, id, rank_, &cfg);
    if (rc != ncclSuccess && rc != ncclInProgress) fail(rc, "ncclCommInitRankConfig");
    poll_until_enqueued("communicator creation (ncclCommInitRankConfig)", opt_.init_timeout_s, true);

    // Non-blocking: never synchronizes with the legacy default stream, so transfers overlap
    // compute that runs there.
    CTXPAR_DIST_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    CTXPAR_DIST_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CTXPAR_DIST_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }

  ~CommNccl() override {
    // Destructors must not end the job: report and fall back to ncclCommAbort on any problem.
    if (comm_ != nullptr) {
      bool clean = cudaStreamSynchronize(comm_stream_) == cudaSuccess;
      if (clean) {
        ncclResult_t rc = ncclCommFinalize(comm_);
        const Clock::time_point t0 = Clock::now();
        ncclResult_t st = rc;
        while (st == ncclInProgress && seconds_since(t0) < opt_.init_timeout_s) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess) st = ncclSystemError;
        }
        clean = st == ncclSuccess;
        if (!clean)
          std::fprintf(stderr, "ctxpar: NCCL finalize of '%s' on rank %d (host %s, cuda:%d) did not complete (%s); aborting the communicator\n",
                       name_.c_str(), rank_, host_name_.c_str(), device_, ncclGetErrorString(st));
      }
      if (clean) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
    }
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (ready_) cudaEventDestroy(ready_);
    if (done_) cudaEventDestroy(done_);
    if (comm_stream_) cudaStreamDestroy(comm_stream_);
  }

  std::string backend() const override { return "nccl"; }
  [[noreturn]] void abort(int code) override {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    host_.abort(code);
    std::abort();  // not reached
  }

  void synchronize() override {
    CTXPAR_DIST_CUDA_CHECK(cudaEventRecord(ready_, compute_));
    CTXPAR_DIST_CUDA_CHECK(cudaEventRecord(done_, comm_stream_));
    const Clock::time_point t0 = Clock::now();
    for (;;) {
      check_async("synchronize");
      const cudaError_t a = cudaEventQuery(ready_), b = cudaEventQuery(done_);
      if (a == cudaSuccess && b == cudaSuccess) return;
      if (a != cudaErrorNotReady) CTXPAR_DIST_CUDA_CHECK(a);
      if (b != cudaErrorNotReady) CTXPAR_DIST_CUDA_CHECK(b);
      check_timeout(t0, "synchronize");
      std::this_thread::yield();
    }
  }

 protected:
  bool test_device(Request& r) override {
    check_async("test");
    for (int64_t id : r.ids()) {
      const cudaError_t q = cudaEventQuery(events_[size_t(id)]);
      if (q == cudaErrorNotReady) return false;
      CTXPAR_DIST_CUDA_CHECK(q);
    }
    release(r);
    return true;
  }

  void wait_device(Request& r) override {
    const Clock::time_point t0 = Clock::now();
    // Polls instead of cudaEventSynchronize so that a failed peer surfaces as NCCL's async
    // error (and op_timeout_s applies) instead of a silent hang.
    while (!test_device(r)) {
      check_timeout(t0, "wait for a request (send_recv_async, all_gather_async, reduce_scatter_async)");
      std::this_thread::yield();
    }
  }

  void stream_wait_device(Request& r) override {
    // The wait captures the event's current record, so the slot can be reused right away.
    for (int64_t id : r.ids()) CTXPAR_DIST_CUDA_CHECK(cudaStreamWaitEvent(compute_, events_[size_t(id)], 0));
    release(r);
  }

  Request send_recv_device(Buf send, int to, Buf recv, int from, int tag) override {
    (void)tag;  // NCCL has no tags: it matches in issue order (comm.hpp)
    CTXPAR_CHECK((to == kNone || (to >= 0 && to < size_)) && (from == kNone || (from >= 0 && from < size_)),
                 "send_recv_async: peer out of range (to " << to << ", from " << from << ", size " << size_ << ")");
    begin();
    group_start();
    if (send.count > 0 && to != kNone)
      check(ncclSend(send.ptr, send.count, nccl_type(send.type), to, comm_, comm_stream_), "ncclSend");
    if (recv.count > 0 && from != kNone)
      check(ncclRecv(recv.ptr, recv.count, nccl_type(recv.type), from, comm_, comm_stream_), "ncclRecv");
    group_end("send_recv_async (grouped ncclSend/ncclRecv)");
    return recorded();
  }

  void all_gather_device(Buf send, Buf recv) override {
    if (start_all_gather(send, recv)) end_collective();
  }
  Request all_gather_async_device(Buf send, Buf recv) override {
    return start_all_gather(send, recv) ? recorded() : Request();
  }

  void all_to_all_device(Buf send, Buf recv) override {
    CTXPAR_CHECK(send.count == recv.count && send.count % size_t(size_) == 0,
                 "all_to_all: send " << send.count << " / recv " << recv.count
                                     << " elements must be equal and a multiple of " << size_);
    if (send.count == 0) return;
    const size_t block = send.count / size_t(size_);
    const size_t block_bytes = block * dtype_bytes(send.type);
    begin();
    group_start();
    for (int peer = 0; peer < size_; ++peer) {
      check(ncclSend(static_cast<const char*>(send.ptr) + size_t(peer) * block_bytes, block, nccl_type(send.type),
                     peer, comm_, comm_stream_), "ncclSend (all_to_all)");
      check(ncclRecv(static_cast<char*>(recv.ptr) + size_t(peer) * block_bytes, block, nccl_type(recv.type), peer,
                     comm_, comm_stream_), "ncclRecv (all_to_all)");
    }
    group_end("all_to_all (grouped ncclSend/ncclRecv)");
    end_collective();
  }

  void reduce_scatter_device(Buf send, Buf recv, ReduceOp op) override {
    if (start_reduce_scatter(send, recv, op)) end_collective();
  }
  Request reduce_scatter_async_device(Buf send, Buf recv, ReduceOp op) override {
    return start_reduce_scatter(send, recv, op) ? recorded() : Request();
  }

  void all_reduce_device(Buf inout, ReduceOp op) override {
    CTXPAR_CHECK(inout.type != DType::u8, "all_reduce: no reductions on u8 (same rule as the staged MPI backend)");
    if (inout.count == 0) return;
    begin();
    enqueued(ncclAllReduce(inout.ptr, inout.ptr, inout.count, nccl_type(inout.type), nccl_op(op), comm_, comm_stream_),
             "ncclAllReduce");
    end_collective();
  }

  void broadcast_device(Buf data, int root) override {
    CTXPAR_CHECK(root >= 0 && root < size_, "broadcast: root " << root << " out of range (size " << size_ << ")");
    if (data.count == 0) return;
    begin();
    enqueued(ncclBroadcast(data.ptr, data.ptr, data.count, nccl_type(data.type), root, comm_, comm_stream_),
             "ncclBroadcast");
    end_collective();
  }

 private:

  // The collectives on the communication stream, after the compute stream's earlier work; false
  // when there is nothing to move.
  bool start_all_gather(Buf send, Buf recv) {
    CTXPAR_CHECK(recv.count == send.count * size_t(size_), "all_gather: recv holds " << recv.count
                 << " elements, expected size*send = " << size_ << "*" << send.count);
    if (send.count == 0) return false;
    begin();
    enqueued(ncclAllGather(send.ptr, recv.ptr, send.count, nccl_type(send.type), comm_, comm_stream_), "ncclAllGather");
    return true;
  }
  bool start_reduce_scatter(Buf send, Buf recv, ReduceOp op) {
    CTXPAR_CHECK(send.type != DType::u8, "reduce_scatter: no reductions on u8 (same rule as the staged MPI backend)");
    CTXPAR_CHECK(send.count == recv.count * size_t(size_), "reduce_scatter: send holds " << send.count
                 << " elements, expected size*recv = " << size_ << "*" << recv.count);
    if (recv.count == 0) return false;
    begin();
    enqueued(ncclReduceScatter(send.ptr, recv.ptr, recv.count, nccl_type(send.type), nccl_op(op), comm_, comm_stream_),
             "ncclReduceScatter");
    return true;
  }
  // A Request for everything issued so far on the communication stream (an event recorded there).
  Request recorded() {
    const int64_t id = acquire_event();
    CTXPAR_DIST_CUDA_CHECK(cudaEventRecord(events_[size_t(id)], comm_stream_));
    return Request({id});
  }

  // Where: "[NCCL 'cp' rank 2/4, host gpu01, cuda:2]", for every message.
  std::string where() const {
    std::ostringstream os;
    os << "NCCL communicator '" << name_ << "' rank " << rank_ << "/" << size_ << ", host " << host_name_ << ", cuda:" << device_;
    return os.str();
  }

  [[noreturn]] void fail(ncclResult_t rc, const char* what) {
    std::string detail = ncclGetErrorString(rc);
    const char* last = ncclGetLastError(comm_);
    if (last != nullptr && *last != '\0') detail += std::string(" — ") + last;
    CTXPAR_FATAL(what << " failed on " << where() << ": " << detail
                      << " (rerun with NCCL_DEBUG=WARN or INFO for NCCL's own log)");
  }

  void check(ncclResult_t rc, const char* what) {
    if (rc != ncclSuccess && rc != ncclInProgress) fail(rc, what);
  }

  void check_async(const char* what) {
    ncclResult_t st = ncclSuccess;
    check(ncclCommGetAsyncError(comm_, &st), "ncclCommGetAsyncError");
    if (st != ncclSuccess && st != ncclInProgress) fail(st, what);
  }

  void check_timeout(Clock::time_point t0, const char* what) {
    if (opt_.op_timeout_s > 0 && seconds_since(t0) > opt_.op_timeout_s) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      CTXPAR_FATAL(what << " did not complete within op_timeout_s = " << opt_.op_timeout_s << " s on " << where()
                        << " (a peer stopped or issued a different sequence of operations)");
    }
  }

  // A non-blocking communicator reports ncclInProgress until the last call's work is on the stream
  // (or, for init, until the communicator is ready). `sleepy` for init: seconds, not microseconds.
  void poll_until_enqueued(const char* what, double timeout_s, bool sleepy) {
    const Clock::time_point t0 = Clock::now();
    for (;;) {
      ncclResult_t st = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm_, &st);
      if (rc != ncclSuccess) fail(rc, "ncclCommGetAsyncError");
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) fail(st, what);
      if (timeout_s > 0 && seconds_since(t0) > timeout_s) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        CTXPAR_FATAL(what << " did not finish within " << timeout_s << " s on " << where()
                          << ": another rank did not reach it, or NCCL's bootstrap cannot connect (check "
                             "NCCL_SOCKET_IFNAME; NCCL_DEBUG=INFO shows the interfaces tried)");
      }
      if (sleepy) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      else std::this_thread::yield();
    }
  }

  void enqueued(ncclResult_t rc, const char* what) {
    check(rc, what);
    if (rc == ncclInProgress) poll_until_enqueued(what, opt_.op_timeout_s, false);
  }

  void group_start() { check(ncclGroupStart(), "ncclGroupStart"); }
  void group_end(const char* what) { enqueued(ncclGroupEnd(), what); }

  // The communication stream starts after everything already on the compute stream.
  void begin() {
    CTXPAR_DIST_CUDA_CHECK(cudaEventRecord(ready_, compute_));
    CTXPAR_DIST_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready_, 0));
  }
  // Later compute-stream work starts after the collective; the host does not block.
  void end_collective() {
    CTXPAR_DIST_CUDA_CHECK(cudaEventRecord(done_, comm_stream_));
    CTXPAR_DIST_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
  }

  int64_t acquire_event() {
    if (!free_.empty()) {
      const int64_t id = free_.back();
      free_.pop_back();
      return id;
    }
    cudaEvent_t e = nullptr;
    CTXPAR_DIST_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
    return int64_t(events_.size()) - 1;
  }
  void release(Request& r) {
    for (int64_t id : r.ids()) free_.push_back(id);
    r.ids().clear();
  }

  int rank_, size_;  // of the bootstrap Comm (host_), which NCCL's ranks equal
  std::string name_;
  NcclOptions opt_;
  std::string host_name_;
  ncclComm_t comm_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  std::vector<cudaEvent_t> events_;  // Request ids index this pool
  std::vector<int64_t> free_;

  // NCCL refuses (or hangs on) two ranks of one communicator on one GPU. Every rank gathers every
  // rank's GPU UUID and host, so all ranks throw the same UsageError before NCCL is touched.
  void check_one_gpu_per_rank(Comm& boot) {
    constexpr size_t kHost = 64;
    cudaDeviceProp prop{};
    CTXPAR_DIST_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    std::vector<uint8_t> mine(16 + kHost, 0), all(mine.size() * size_t(size_));
    std::memcpy(mine.data(), prop.uuid.bytes, 16);
    std::strncpy(reinterpret_cast<char*>(mine.data() + 16), host_name_.c_str(), kHost - 1);
    boot.all_gather(std::span<const uint8_t>(mine), std::span<uint8_t>(all));
    std::ostringstream dup;
    for (int a = 0; a < size_; ++a)
      for (int b = a + 1; b < size_; ++b)
        if (std::memcmp(&all[size_t(a) * mine.size()], &all[size_t(b) * mine.size()], 16) == 0) {
          dup << (dup.tellp() > 0 ? ", " : "") << "ranks " << a << " and " << b << " (host "
              << reinterpret_cast<const char*>(&all[size_t(a) * mine.size() + 16]) << ")";
        }
    if (dup.tellp() > 0)
      throw UsageError("comm=nccl needs one GPU per rank, but " + dup.str() + " of communicator '" + name_ +
                       "' use the same GPU; use fewer ranks per node, or comm=mpi (staged through host memory) "
                       "to share a GPU");
  }
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(Comm& bootstrap, int device, const NcclOptions& opt) {
  return std::make_unique<CommNccl>(bootstrap, device, opt);
}

std::string nccl_library_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  // NCCL_VERSION encodes X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z from 2.9 on.
  const int major = v < 10000 ? v / 1000 : v / 10000;
  const int minor = v < 10000 ? (v % 1000) / 100 : (v % 10000) / 100;
  const int patch = v % 100;
  return "NCCL " + std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

}  // namespace ctxpar
