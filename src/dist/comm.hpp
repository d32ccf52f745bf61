// Comm: the only communication interface. Buffers are typed spans (counts in elements, never
// bytes); the MPI backend (comm_mpi.cpp) works on host memory. Strategies, the model and the
// trace talk to a Comm; none of them names MPI.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dtype.hpp"

namespace ctxpar {

// A type-erased typed buffer: pointer, element count, element type.
struct Buf {
  void* ptr = nullptr;
  size_t count = 0;
  DType type = DType::u8;
  size_t bytes() const { return count * dtype_bytes(type); }
};
template <class T> Buf buf(std::span<T> s) {
  return Buf{const_cast<std::remove_cv_t<T>*>(s.data()), s.size(), dtype_of<T>()};
}

enum class ReduceOp : int32_t { sum, max, min };

// Handle of an asynchronous operation; wait() completes it. Movable, not copyable.
class Request {
 public:
  Request() = default;
  explicit Request(std::vector<int64_t> ids) : ids_(std::move(ids)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&&) noexcept = default;
  bool pending() const { return !ids_.empty(); }
  std::vector<int64_t>& ids() { return ids_; }

 private:
  std::vector<int64_t> ids_;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "world", "ring", "ulysses", "cp", ...

  // Typed front-end (counts in elements).
  // Posts a receive from `from` into `recv` and a send of `send` to `to` (tag separates streams).
  template <class T, class U>
  Request send_recv_async(std::span<T> send, int to, std::span<U> recv, int from, int tag = 0) {
    static_assert(std::is_same_v<std::remove_cv_t<T>, std::remove_cv_t<U>>, "send/recv types differ");
    return send_recv_async_impl(buf(send), to, buf(recv), from, tag);
  }
  // recv holds size() blocks of send.size() elements, in rank order.
  template <class T, class U> void all_gather(std::span<T> send, std::span<U> recv) {
    all_gather_impl(buf(send), buf(recv));
  }
  // send and recv each hold size() equal blocks; block j of send goes to rank j.
  template <class T, class U> void all_to_all(std::span<T> send, std::span<U> recv) {
    all_to_all_impl(buf(send), buf(recv));
  }
  // send holds size() equal blocks; this rank receives the sum of every rank's block rank().
  template <class T, class U> void reduce_scatter(std::span<T> send, std::span<U> recv) {
    reduce_scatter_impl(buf(send), buf(recv));
  }
  template <class T> void all_reduce(std::span<T> inout, ReduceOp op = ReduceOp::sum) {
    all_reduce_impl(buf(inout), op);
  }
  template <class T> void broadcast(std::span<T> data, int root) { broadcast_impl(buf(data), root); }
  // Variable-size gather to `root`: on root, recv is resized to the concatenation in rank order.
  template <class T> void gather_v(std::span<const T> send, std::vector<T>& recv, int root) {
    std::vector<int64_t> counts = gather_counts(int64_t(send.size()), root);
    if (rank() == root) {
      int64_t total = 0;
      for (int64_t c : counts) total += c;
      recv.resize(size_t(total));
    }
    gather_v_impl(buf(send), Buf{recv.data(), recv.size(), dtype_of<T>()}, counts, root);
  }

  virtual void wait(Request& r) = 0;
  // Lets pending transfers progress (OpenMPI moves large messages only inside MPI calls);
  // returns true when every operation of `r` has completed.
  virtual bool test(Request& r) = 0;
  virtual void barrier() = 0;
  // Ends the whole job (all ranks), e.g. from the watchdog.
  [[noreturn]] virtual void abort(int code) = 0;
  // Seconds on this process's clock (not synchronized across ranks; see clock offsets in trace/).
  virtual double now() const = 0;

 protected:
  virtual Request send_recv_async_impl(Buf send, int to, Buf recv, int from, int tag) = 0;
  virtual void all_gather_impl(Buf send, Buf recv) = 0;
  virtual void all_to_all_impl(Buf send, Buf recv) = 0;
  virtual void reduce_scatter_impl(Buf send, Buf recv) = 0;
  virtual void all_reduce_impl(Buf inout, ReduceOp op) = 0;
  virtual void broadcast_impl(Buf data, int root) = 0;
  // On root: every rank's count, in rank order; elsewhere empty.
  virtual std::vector<int64_t> gather_counts(int64_t count, int root) = 0;
  virtual void gather_v_impl(Buf send, Buf recv, const std::vector<int64_t>& counts, int root) = 0;
};

// Version string of the communication library (MPI_Get_library_version), for provenance.
std::string comm_library_version();

// Agreement on an input error: every rank passes its own message ("" = fine); all ranks return
// the first non-empty message in rank order (so rank 0 prints it and all exit alike).
std::string agree_on_error(Comm& comm, const std::string& my_error);

// Measured all-to-all rate over `comm` in bytes leaving a rank per second: every rank sends
// `part_bytes` to every rank, the receive buffer allocated per call as the strategies do (its
// first touch is part of their cost), `fixed_s` (the caller's latency term) subtracted; best of
// `reps` after one warm-up, the slowest rank's. Collective: every rank of `comm` calls it.
double measure_alltoall_rate(Comm& comm, size_t part_bytes, double fixed_s, int reps);

}  // namespace ctxpar
