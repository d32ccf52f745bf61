// Comm: the only communication interface, for host and device buffers alike. Buffers are typed
// spans (counts in elements, never bytes): a std::span<T> is host memory, a DeviceSpan<T> device
// memory. Strategies, the model and the trace talk to a Comm; none of them names MPI or NCCL.
//
// Backends (each a factory; the caller picks by where its tensors live):
//  - MPI (comm_mpi.hpp, make_mpi_comm): host buffers only (Debian's OpenMPI is not CUDA-aware).
//  - MPI staged (comm_device.hpp, make_staged_comm; CUDA builds): device buffers go device →
//    pinned host → MPI → pinned host → device; host buffers go to the MPI Comm directly. Lets
//    several ranks share one GPU.
//  - NCCL (comm_device.hpp, make_nccl_comm; CUDA builds): device buffers through NCCL on its own
//    communication stream (one GPU per rank); host buffers through the bootstrap MPI Comm.
//
// Stream contract for device buffers (both device backends; host buffers complete on the host):
//  - The compute stream (set_compute_stream; default the legacy default stream 0) is where the
//    caller produces send buffers and consumes receive buffers. An operation starts only after
//    all work enqueued on the compute stream before the call (a CUDA event orders it).
//  - Collectives (all_gather, all_to_all, reduce_scatter, all_reduce, broadcast) are complete for
//    all work enqueued on the compute stream after the call returns; the host must still
//    synchronize the compute stream before reading results. NCCL returns without blocking the
//    host; the staged backend blocks the host (MPI runs on the host).
//  - send_recv_async returns a Request. Until it completes, the caller must not write the send
//    buffer nor touch the receive buffer, on any stream. test() polls and never blocks; wait()
//    blocks the host until the transfer is complete; stream_wait() orders it before later
//    compute-stream work without blocking the host (NCCL; the staged backend has to block: MPI
//    completes on the host; for host buffers it is wait()). This is how ring steps overlap
//    compute: post the next block's send_recv_async, compute on the current block, stream_wait.
//  - all_gather_async and reduce_scatter_async return a Request with the same rules (the sharded
//    training state prefetches the next unit's weights this way). The staged backend completes
//    reduce_scatter_async before it returns (its reduction runs on the host, after MPI).
//  - Matching: MPI matches point-to-point messages by (source, tag) in order; NCCL has no tags
//    and matches in issue order, so every rank issues the same sequence of collectives and, for
//    each pair of peers, its point-to-point transfers in the same order on both backends.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "dtype.hpp"

namespace ctxpar {

// A view of device memory: pointer and element count. Explicit, so that a host container never
// becomes one by accident (and a device pointer never becomes a std::span).
template <class T> struct DeviceSpan {
  using element_type = T;
  T* ptr = nullptr;
  size_t elems = 0;
  DeviceSpan() = default;
  DeviceSpan(T* device_ptr, size_t n_elems) : ptr(device_ptr), elems(n_elems) {}
  // DeviceSpan<T> → DeviceSpan<const T>, as for std::span.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  DeviceSpan(DeviceSpan<U> s) : ptr(s.ptr), elems(s.elems) {}
};
template <class T> DeviceSpan<T> dspan(T* device_ptr, size_t n_elems) { return DeviceSpan<T>(device_ptr, n_elems); }

// A type-erased typed buffer: pointer, element count, element type, where it lives.
struct Buf {
  void* ptr = nullptr;
  size_t count = 0;
  DType type = DType::u8;
  Device where = Device::cpu;
  size_t bytes() const { return count * dtype_bytes(type); }
};
template <class T> Buf buf(std::span<T> s) {
  return Buf{const_cast<std::remove_cv_t<T>*>(s.data()), s.size(), dtype_of<T>(), Device::cpu};
}
template <class T> Buf buf(DeviceSpan<T> s) {
  return Buf{const_cast<std::remove_cv_t<T>*>(s.ptr), s.elems, dtype_of<T>(), Device::cuda};
}

// Elements of type T at `p` on `where` (a host or device pointer, as `where` says).
template <class T> Buf buf_at(T* p, size_t n, Device where) {
  return Buf{const_cast<std::remove_cv_t<T>*>(p), n, dtype_of<std::remove_cv_t<T>>(), where};
}
// A Buffer (core/memory.hpp) as a communication buffer, on the device it lives on.
template <class T> Buf buf(Buffer<T>& b) { return buf_at(b.data(), b.size(), b.device()); }

enum class ReduceOp : int32_t { sum, max, min };

class Comm;

// Handle of an asynchronous operation; wait() completes it. Movable, not copyable. `via` names
// the communicator that issued it when a backend forwarded the operation (host buffers of a
// device backend), so that backend's test/wait can hand it back.
class Request {
 public:
  Request() = default;
  explicit Request(std::vector<int64_t> ids, Comm* via = nullptr) : ids_(std::move(ids)), via_(via) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&&) noexcept = default;
  bool pending() const { return !ids_.empty(); }
  std::vector<int64_t>& ids() { return ids_; }
  Comm* via() const { return via_; }

 private:
  std::vector<int64_t> ids_;
  Comm* via_ = nullptr;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;     // "world", "ring", "ulysses", "cp", ...
  virtual std::string backend() const = 0;  // "mpi", "mpi-staged", "nccl"
  virtual int device() const { return -1; }  // CUDA device of its device buffers (-1: host only)
  static constexpr int kNone = -1;             // "no peer" for send_recv_async

  // Typed front-end (counts in elements); S and R are std::span<T> or DeviceSpan<T>.
  // Posts a receive from `from` into `recv` and a send of `send` to `to` (tag separates MPI
  // streams; NCCL matches in issue order). to = kNone posts no send, from = kNone no receive (a
  // chain's ends).
  template <class S, class R> Request send_recv_async(S send, int to, R recv, int from, int tag = 0) {
    same_type<S, R>();
    return send_recv_async_impl(buf(send), to, buf(recv), from, tag);
  }
  // recv holds size() blocks of send's elements, in rank order.
  template <class S, class R> void all_gather(S send, R recv) {
    same_type<S, R>();
    all_gather_impl(buf(send), buf(recv));
  }
  // The collectives' nonblocking forms: started here, completed by test, wait or stream_wait
  // (neither buffer touched before then). Every rank starts the collectives of one communicator,
  // blocking or not, in one order (MPI's rule for nonblocking collectives; NCCL's issue order).
  template <class S, class R> Request all_gather_async(S send, R recv) {
    same_type<S, R>();
    return all_gather_async_impl(buf(send), buf(recv));
  }
  template <class S, class R> Request reduce_scatter_async(S send, R recv, ReduceOp op = ReduceOp::sum) {
    same_type<S, R>();
    return reduce_scatter_async_impl(buf(send), buf(recv), op);
  }
  // send and recv each hold size() equal blocks; block j of send goes to rank j.
  template <class S, class R> void all_to_all(S send, R recv) {
    same_type<S, R>();
    all_to_all_impl(buf(send), buf(recv));
  }
  // send holds size() equal blocks; this rank receives the reduction of every rank's block rank().
  template <class S, class R> void reduce_scatter(S send, R recv, ReduceOp op = ReduceOp::sum) {
    same_type<S, R>();
    reduce_scatter_impl(buf(send), buf(recv), op);
  }
  template <class S> void all_reduce(S inout, ReduceOp op = ReduceOp::sum) { all_reduce_impl(buf(inout), op); }
  template <class S> void broadcast(S data, int root) { broadcast_impl(buf(data), root); }
  // Variable-size gather of host buffers to `root`: on root, recv is resized to the
  // concatenation in rank order.
  template <class T> void gather_v(std::span<const T> send, std::vector<T>& recv, int root) {
    std::vector<int64_t> counts = gather_counts(int64_t(send.size()), root);
    if (rank() == root) {
      int64_t total = 0;
      for (int64_t c : counts) total += c;
      recv.resize(size_t(total));
    }
    gather_v_impl(buf(send), Buf{recv.data(), recv.size(), dtype_of<T>(), Device::cpu}, counts, root);
  }

  // The same operations on type-erased buffers (Buf: host or device memory, e.g. a Buffer's
  // buf(), so one strategy serves both); send and receive of one element type.
  Request send_recv_async(Buf send, int to, Buf recv, int from, int tag = 0) {
    same_type(send, recv);
    return send_recv_async_impl(send, to, recv, from, tag);
  }
  void all_gather(Buf send, Buf recv) {
    same_type(send, recv);
    all_gather_impl(send, recv);
  }
  void all_to_all(Buf send, Buf recv) {
    same_type(send, recv);
    all_to_all_impl(send, recv);
  }
  void reduce_scatter(Buf send, Buf recv, ReduceOp op = ReduceOp::sum) {
    same_type(send, recv);
    reduce_scatter_impl(send, recv, op);
  }
  void all_reduce(Buf inout, ReduceOp op = ReduceOp::sum) { all_reduce_impl(inout, op); }
  Request all_gather_async(Buf send, Buf recv) {
    same_type(send, recv);
    return all_gather_async_impl(send, recv);
  }
  Request reduce_scatter_async(Buf send, Buf recv, ReduceOp op = ReduceOp::sum) {
    same_type(send, recv);
    return reduce_scatter_async_impl(send, recv, op);
  }
  virtual void wait(Request& r) = 0;
  // Lets pending transfers progress (OpenMPI moves large messages only inside MPI calls);
  // returns true when every operation of `r` has completed.
  virtual bool test(Request& r) = 0;
  // Later compute-stream work sees the result of `r` (device backends); else wait().
  virtual void stream_wait(Request& r) { wait(r); }
  // The compute stream of the stream contract above (device backends; a no-op for MPI).
  virtual void set_compute_stream(Stream) {}
  virtual Stream compute_stream() const { return nullptr; }
  // Where a device backend's copies and transfers run (null for MPI).
  virtual Stream comm_stream() const { return nullptr; }
  // Host blocks until every operation issued so far and the compute stream are complete.
  virtual void synchronize() {}
  virtual void barrier() = 0;
  // Ends the whole job (all ranks), e.g. from the watchdog.
  [[noreturn]] virtual void abort(int code) = 0;
  // Seconds on this process's clock (not synchronized across ranks; see clock offsets in trace/).
  virtual double now() const = 0;

 protected:
  virtual Request send_recv_async_impl(Buf send, int to, Buf recv, int from, int tag) = 0;
  virtual void all_gather_impl(Buf send, Buf recv) = 0;
  virtual void all_to_all_impl(Buf send, Buf recv) = 0;
  virtual void reduce_scatter_impl(Buf send, Buf recv, ReduceOp op) = 0;
  virtual Request all_gather_async_impl(Buf send, Buf recv) = 0;
  virtual Request reduce_scatter_async_impl(Buf send, Buf recv, ReduceOp op) = 0;
  virtual void all_reduce_impl(Buf inout, ReduceOp op) = 0;
  virtual void broadcast_impl(Buf data, int root) = 0;
  // On root: every rank's count, in rank order; elsewhere empty.
  virtual std::vector<int64_t> gather_counts(int64_t count, int root) = 0;
  virtual void gather_v_impl(Buf send, Buf recv, const std::vector<int64_t>& counts, int root) = 0;

  // A forwarding backend calls the protected entry points of the Comm it forwards to.
  static Request forward_send_recv(Comm& c, Buf send, int to, Buf recv, int from, int tag) {
    return c.send_recv_async_impl(send, to, recv, from, tag);
  }
  static void forward_all_gather(Comm& c, Buf send, Buf recv) { c.all_gather_impl(send, recv); }
  static void forward_all_to_all(Comm& c, Buf send, Buf recv) { c.all_to_all_impl(send, recv); }
  static void forward_reduce_scatter(Comm& c, Buf send, Buf recv, ReduceOp op) { c.reduce_scatter_impl(send, recv, op); }
  static Request forward_all_gather_async(Comm& c, Buf send, Buf recv) { return c.all_gather_async_impl(send, recv); }
  static Request forward_reduce_scatter_async(Comm& c, Buf send, Buf recv, ReduceOp op) {
    return c.reduce_scatter_async_impl(send, recv, op);
  }
  static void forward_all_reduce(Comm& c, Buf inout, ReduceOp op) { c.all_reduce_impl(inout, op); }
  static void forward_broadcast(Comm& c, Buf data, int root) { c.broadcast_impl(data, root); }
  static std::vector<int64_t> forward_gather_counts(Comm& c, int64_t count, int root) { return c.gather_counts(count, root); }
  static void forward_gather_v(Comm& c, Buf send, Buf recv, const std::vector<int64_t>& counts, int root) {
    c.gather_v_impl(send, recv, counts, root);
  }

 private:
  static void same_type(const Buf& send, const Buf& recv);  // throws std::invalid_argument
  template <class S, class R> static constexpr void same_type() {
    static_assert(std::is_same_v<std::remove_cv_t<typename S::element_type>, std::remove_cv_t<typename R::element_type>>,
                  "send and receive element types differ");
  }
};

// Version string of the communication library (MPI_Get_library_version), for provenance.
std::string comm_library_version();

// Agreement on an input error: every rank passes its own message ("" = fine); all ranks return
// the first non-empty message in rank order (so rank 0 prints it and all exit alike).
std::string agree_on_error(Comm& comm, const std::string& my_error);

// Runs `f`, the part of a collective step that some ranks do alone (rank 0 writes a file), then
// agrees: a LocalFault on any rank ends the run on every rank alike (RunFailed with the lowest
// such rank's message; main marks the trace failed, exit 3), with no job abort. Collective.
template <class F> void run_then_agree(Comm& comm, F&& f) {
  std::string mine;
  try {
    f();
  } catch (const LocalFault& e) {
    mine = e.what();
  }
  if (std::string msg = agree_on_error(comm, mine); !msg.empty()) throw RunFailed(msg);
}

// The MPI communicator (an MPI_Comm, valid while `c` lives) behind an MPI communicator `c`, as an
// opaque pointer for code that hands it to an MPI library without including mpi.h (the I/O
// module's MPI-IO checkpoints).
const void* mpi_comm_of(Comm& c);

// Bytes per second of a transfer of `bytes` that took `t` seconds, less a latency measured apart.
// On a loaded machine that latency may exceed the transfer's time: at most half of `t` is
// subtracted, so the rate stays within 2x of the raw one instead of dividing by ~0.
inline double rate_after_latency(double bytes, double t, double latency_s) {
  return bytes / (t - latency_s > 0.5 * t ? t - latency_s : 0.5 * t);
}

// Measured all-to-all rate over `comm` in bytes leaving a rank per second: every rank sends
// `part_bytes` to every rank, the receive buffer allocated per call as the strategies do (its
// first touch is part of their cost), `fixed_s` (the caller's latency term) subtracted; best of
// `reps` after one warm-up, the slowest rank's. Collective: every rank of `comm` calls it. With a
// GPU `dev`: device buffers through a device communicator, timed to the end of `stream`.
double measure_alltoall_rate(Comm& comm, size_t part_bytes, double fixed_s, int reps, Device dev = Device::cpu,
                             Stream stream = nullptr);

}  // namespace ctxpar
