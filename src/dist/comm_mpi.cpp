#include "dist/comm_mpi.hpp"

#include <chrono>
#include <climits>
#include <thread>
#include <mutex>
#include <vector>

#include "core/error.hpp"
#include "dist/fault_channel.hpp"

// Every MPI call goes through this: a failing call reports rank, host, file, line and the MPI
// error string, then aborts the job.
#define MPI_CHECK(call)                                                                    \
  do {                                                                                     \
    int ctxpar_rc_ = (call);                                                               \
    if (ctxpar_rc_ != MPI_SUCCESS) {                                                       \
      char ctxpar_s_[MPI_MAX_ERROR_STRING];                                                \
      int ctxpar_n_ = 0;                                                                   \
      MPI_Error_string(ctxpar_rc_, ctxpar_s_, &ctxpar_n_);                                 \
      ::ctxpar::fatal(__FILE__, __LINE__, #call, std::string("MPI error: ") + ctxpar_s_); \
    }                                                                                      \
  } while (0)

namespace ctxpar {

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_BYTE;
    case DType::bf16:
    case DType::f16: break;
  }
  CTXPAR_FATAL("MPI backend: no MPI type for " << dtype_name(t) << " (16-bit floats travel as device buffers of the "
               "staged or NCCL backend, or as bytes)");
}

// The MPI backend moves host memory only.
void host_only(const Buf& b, const char* what) {
  CTXPAR_CHECK(b.where == Device::cpu, what << ": the MPI backend moves host buffers only; a device buffer needs "
                                            "make_staged_comm or make_nccl_comm (dist/comm_device.hpp)");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

int as_int(size_t count, const char* what) {
  CTXPAR_CHECK(count <= size_t(INT_MAX), what << ": " << count
                                               << " elements exceed MPI's int count limit; split the message");
  return int(count);
}

class CommMpi final : public Comm {
 public:
  CommMpi(MPI_Comm c, std::string name) : comm_(c), name_(std::move(name)) {
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~CommMpi() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  std::string backend() const override { return "mpi"; }
  MPI_Comm handle() const { return comm_; }
  const MPI_Comm* handle_ptr() const { return &comm_; }

  void wait(Request& r) override {
    if (!r.pending()) return;
    std::vector<MPI_Request> reqs = take(r);
    MPI_CHECK(MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
  }
  bool test(Request& r) override {
    if (!r.pending()) return true;
    std::vector<MPI_Request> reqs;
    for (int64_t id : r.ids()) reqs.push_back(slots_[size_t(id)]);
    int done = 0;
    MPI_CHECK(MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
    // MPI_Testall sets completed handles to MPI_REQUEST_NULL; keep the slots in sync.
    for (size_t i = 0; i < reqs.size(); ++i) slots_[size_t(r.ids()[i])] = reqs[i];
    if (done) release(r);
    return done != 0;
  }
  void barrier() override { MPI_CHECK(MPI_Barrier(comm_)); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(comm_, code);
    std::abort();
  }
  double now() const override { return MPI_Wtime(); }

 protected:
  Request send_recv_async_impl(Buf send, int to, Buf recv, int from, int tag) override {
    host_only(send, "send_recv_async");
    host_only(recv, "send_recv_async");
    MPI_Request rr, sr;
    // kNone: MPI_PROC_NULL, whose operations complete at once
    MPI_CHECK(MPI_Irecv(recv.ptr, as_int(recv.count, "recv"), mpi_type(recv.type), from == kNone ? MPI_PROC_NULL : from,
                        tag, comm_, &rr));
    MPI_CHECK(MPI_Isend(send.ptr, as_int(send.count, "send"), mpi_type(send.type), to == kNone ? MPI_PROC_NULL : to,
                        tag, comm_, &sr));
    return Request({put(rr), put(sr)});
  }
  void all_gather_impl(Buf send, Buf recv) override {
    host_only(send, "all_gather");
    host_only(recv, "all_gather");
    CTXPAR_CHECK(recv.count == send.count * size_t(size_), "all_gather: recv holds " << recv.count
                 << " elements, expected size*send = " << size_ << "*" << send.count);
    MPI_CHECK(MPI_Allgather(send.ptr, as_int(send.count, "all_gather"), mpi_type(send.type), recv.ptr,
                            as_int(send.count, "all_gather"), mpi_type(recv.type), comm_));
  }
  Request all_gather_async_impl(Buf send, Buf recv) override {
    host_only(send, "all_gather_async");
    host_only(recv, "all_gather_async");
    CTXPAR_CHECK(recv.count == send.count * size_t(size_), "all_gather_async: recv holds " << recv.count
                 << " elements, expected size*send = " << size_ << "*" << send.count);
    MPI_Request r;
    MPI_CHECK(MPI_Iallgather(send.ptr, as_int(send.count, "all_gather_async"), mpi_type(send.type), recv.ptr,
                             as_int(send.count, "all_gather_async"), mpi_type(recv.type), comm_, &r));
    return Request({put(r)});
  }
  Request reduce_scatter_async_impl(Buf send, Buf recv, ReduceOp op) override {
    host_only(send, "reduce_scatter_async");
    host_only(recv, "reduce_scatter_async");
    CTXPAR_CHECK(send.count == recv.count * size_t(size_), "reduce_scatter_async: send holds " << send.count
                 << " elements, expected size*recv = " << size_ << "*" << recv.count);
    MPI_Request r;
    MPI_CHECK(MPI_Ireduce_scatter_block(send.ptr, recv.ptr, as_int(recv.count, "reduce_scatter_async"),
                                        mpi_type(send.type), mpi_op(op), comm_, &r));
    return Request({put(r)});
  }
  void all_to_all_impl(Buf send, Buf recv) override {
    host_only(send, "all_to_all");
    host_only(recv, "all_to_all");
    CTXPAR_CHECK(send.count == recv.count && send.count % size_t(size_) == 0,
                 "all_to_all: send " << send.count << " / recv " << recv.count << " elements must be equal and a multiple of " << size_);
    const int block = as_int(send.count / size_t(size_), "all_to_all");
    MPI_CHECK(MPI_Alltoall(send.ptr, block, mpi_type(send.type), recv.ptr, block, mpi_type(recv.type), comm_));
  }
  void reduce_scatter_impl(Buf send, Buf recv, ReduceOp op) override {
    host_only(send, "reduce_scatter");
    host_only(recv, "reduce_scatter");
    CTXPAR_CHECK(send.count == recv.count * size_t(size_), "reduce_scatter: send holds " << send.count
                 << " elements, expected size*recv = " << size_ << "*" << recv.count);
    MPI_CHECK(MPI_Reduce_scatter_block(send.ptr, recv.ptr, as_int(recv.count, "reduce_scatter"),
                                       mpi_type(send.type), mpi_op(op), comm_));
  }
  void all_reduce_impl(Buf inout, ReduceOp op) override {
    host_only(inout, "all_reduce");
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, inout.ptr, as_int(inout.count, "all_reduce"), mpi_type(inout.type),
                            mpi_op(op), comm_));
  }
  void broadcast_impl(Buf data, int root) override {
    host_only(data, "broadcast");
    MPI_CHECK(MPI_Bcast(data.ptr, as_int(data.count, "broadcast"), mpi_type(data.type), root, comm_));
  }
  std::vector<int64_t> gather_counts(int64_t count, int root) override {
    std::vector<int64_t> counts(rank_ == root ? size_t(size_) : 0);
    MPI_CHECK(MPI_Gather(&count, 1, MPI_INT64_T, counts.data(), 1, MPI_INT64_T, root, comm_));
    return counts;
  }
  void gather_v_impl(Buf send, Buf recv, const std::vector<int64_t>& counts, int root) override {
    host_only(send, "gather_v");
    std::vector<int> cnt, disp;
    if (rank_ == root) {
      int64_t off = 0;
      for (int64_t c : counts) {
        cnt.push_back(as_int(size_t(c), "gather_v"));
        disp.push_back(as_int(size_t(off), "gather_v displacement"));
        off += c;
      }
    }
    MPI_CHECK(MPI_Gatherv(send.ptr, as_int(send.count, "gather_v"), mpi_type(send.type), recv.ptr, cnt.data(),
                          disp.data(), mpi_type(send.type), root, comm_));
  }

 private:
  // Request slots: a Request holds indices into slots_, so handles stay valid while the vector grows.
  int64_t put(MPI_Request r) {
    if (!free_.empty()) {
      int64_t id = free_.back();
      free_.pop_back();
      slots_[size_t(id)] = r;
      return id;
    }
    slots_.push_back(r);
    return int64_t(slots_.size()) - 1;
  }
  std::vector<MPI_Request> take(Request& r) {
    std::vector<MPI_Request> reqs;
    for (int64_t id : r.ids()) reqs.push_back(slots_[size_t(id)]);
    release(r);
    return reqs;
  }
  void release(Request& r) {
    for (int64_t id : r.ids()) {
      slots_[size_t(id)] = MPI_REQUEST_NULL;
      free_.push_back(id);
    }
    r.ids().clear();
  }

  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  std::vector<MPI_Request> slots_;
  std::vector<int64_t> free_;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(MPI_Comm comm, const std::string& name) {
  MPI_Comm dup;
  MPI_CHECK(MPI_Comm_dup(comm, &dup));
  return std::make_unique<CommMpi>(dup, name);
}

std::unique_ptr<Comm> adopt_mpi_comm(MPI_Comm comm, const std::string& name) {
  return std::make_unique<CommMpi>(comm, name);
}

MPI_Comm mpi_handle(Comm& c) {
  auto* m = dynamic_cast<CommMpi*>(&c);
  CTXPAR_CHECK(m != nullptr, "communicator '" << c.name() << "' is not an MPI communicator");
  return m->handle();
}

const void* mpi_comm_of(Comm& c) {
  auto* m = dynamic_cast<CommMpi*>(&c);
  CTXPAR_CHECK(m != nullptr, "communicator '" << c.name() << "' is not an MPI communicator");
  return m->handle_ptr();
}

namespace {

// The fault channel on MPI: rank 0 keeps one receive from any rank posted; a notice is a
// null-terminated string of at most kNoticeBytes; the acknowledgement is one byte back.
class FaultChannelMpi final : public FaultChannel {
 public:
  explicit FaultChannelMpi(MPI_Comm world) {
    MPI_CHECK(MPI_Comm_dup(world, &comm_));
    MPI_Comm_rank(comm_, &rank_);
    if (rank_ == 0) post();
  }
  ~FaultChannelMpi() override {
    if (pending_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&pending_);
      MPI_Wait(&pending_, MPI_STATUS_IGNORE);
    }
    MPI_Comm_free(&comm_);
  }
  bool notify(const std::string& reason, double wait_s) override {
    std::string msg = reason.substr(0, kNoticeBytes - 1);
    msg.push_back('\0');
    MPI_Request send = MPI_REQUEST_NULL, ack = MPI_REQUEST_NULL;
    char got = 0;
    if (MPI_Isend(msg.data(), int(msg.size()), MPI_CHAR, 0, kTagNotice, comm_, &send) != MPI_SUCCESS) return false;
    if (MPI_Irecv(&got, 1, MPI_CHAR, 0, kTagAck, comm_, &ack) != MPI_SUCCESS) return false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
    int done = 0;
    while (!done && std::chrono::steady_clock::now() < until) {
      MPI_Test(&ack, &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return done != 0;  // the job is about to be aborted: the requests go with it
  }
  bool poll(int& from, std::string& reason) override {
    if (pending_ == MPI_REQUEST_NULL) return false;
    int done = 0;
    MPI_Status st;
    if (MPI_Test(&pending_, &done, &st) != MPI_SUCCESS || !done) return false;
    from = st.MPI_SOURCE;
    buf_[kNoticeBytes - 1] = 0;
    reason = buf_;
    post();
    return true;
  }
  void acknowledge(int rank) override {
    static char one = 1;
    MPI_Request r;
    if (MPI_Isend(&one, 1, MPI_CHAR, rank, kTagAck, comm_, &r) == MPI_SUCCESS) MPI_Request_free(&r);
  }

 private:
  static constexpr int kNoticeBytes = 2048, kTagNotice = 1, kTagAck = 2;
  void post() { MPI_Irecv(buf_, kNoticeBytes, MPI_CHAR, MPI_ANY_SOURCE, kTagNotice, comm_, &pending_); }
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  MPI_Request pending_ = MPI_REQUEST_NULL;
  char buf_[kNoticeBytes] = {};
};

}  // namespace

std::unique_ptr<FaultChannel> make_fault_channel(Comm& world) {
  auto* m = dynamic_cast<CommMpi*>(&world);
  if (!m) return nullptr;
  return std::make_unique<FaultChannelMpi>(m->handle());
}

std::string comm_library_version() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int n = 0;
  MPI_Get_library_version(v, &n);
  std::string s(v, size_t(n));
  const size_t nl = s.find_first_of("\n,");  // "Open MPI v4.1.4, package: ..." → first part
  return nl == std::string::npos ? s : s.substr(0, nl);
}

}  // namespace ctxpar
