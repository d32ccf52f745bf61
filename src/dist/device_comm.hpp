// DeviceComm: communication on GPU (device) memory. Built only with the CUDA backend
// (CTXPAR_HAVE_CUDA; target ctxpar_dist_cuda).
//
// Why a second interface next to Comm (dist/comm.hpp) and not a Comm backend:
//  - Comm's front-end takes host std::spans and some of its callers read the data on the host
//    (gather_v resizes a std::vector, agree_on_error reads the message). A device pointer in a
//    std::span would compile and then crash or corrupt memory far from the mistake. DeviceComm
//    takes DeviceSpan<T>, which must be built explicitly from a device pointer and an element
//    count, so host and device buffers never mix silently.
//  - GPU communication is stream-ordered: "ready" means "ordered before later work on the
//    compute stream", not "done on the host". The contract below says that once for both
//    backends.
//  - GPU tensors are bf16/f16, which Comm's DType (and MPI) do not have.
// The method names and argument order are Comm's, so a strategy written against one reads the
// same against the other.
//
// Backends:
//  - make_nccl_comm (dist/comm_nccl.hpp): NCCL on its own communication stream; needs one GPU
//    per rank (NCCL refuses two ranks on one device).
//  - make_staged_comm (below): the MPI Comm on host copies in pinned memory. Debian's OpenMPI is
//    not CUDA-aware, so device pointers cannot go to MPI directly; staging also lets several ranks
//    share one GPU (tests on a one-GPU machine, comm=mpi).
//
// Stream contract (both backends):
//  - The compute stream (set_compute_stream; default the legacy default stream 0) is where the
//    caller produces send buffers and consumes receive buffers. An operation starts only after
//    all work enqueued on the compute stream before the call (a CUDA event orders it).
//  - Collectives (all_gather, all_to_all, reduce_scatter, all_reduce, broadcast) are complete for
//    all work enqueued on the compute stream after the call returns. The host must still
//    synchronize the compute stream before reading results on the host. NCCL returns without
//    blocking the host; the staged backend blocks the host (MPI runs on the host).
//  - send_recv_async returns a Request. Until the request completes, the caller must not write the
//    send buffer nor touch the receive buffer, on any stream. test() polls (cudaEventQuery for
//    NCCL, MPI_Test + event query for staged) and never blocks; wait() blocks the host until the
//    transfer is complete; stream_wait() orders it before later compute-stream work without
//    blocking the host (NCCL; the staged backend has to block, MPI completes on the host).
//    This is how ring steps overlap compute: post the next block's send_recv_async, run the
//    attention on the current block on the compute stream, then stream_wait.
//  - Operations are matched between ranks in issue order (NCCL has no tags): every rank issues the
//    same sequence of collectives, and for each pair of peers the point-to-point transfers in the
//    same order.
//  - Counts are elements (never bytes); all ranks pass the same counts for collectives.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "dist/comm.hpp"

namespace ctxpar {

// Element types on the device: Comm's DType plus the 16-bit floats of GPU tensors.
enum class DevDType : int32_t { f32, f64, i32, i64, u8, bf16, f16 };
size_t dev_dtype_bytes(DevDType t);
const char* dev_dtype_name(DevDType t);

template <class T> constexpr DevDType dev_dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return DevDType::f32;
  else if constexpr (std::is_same_v<U, double>) return DevDType::f64;
  else if constexpr (std::is_same_v<U, int32_t>) return DevDType::i32;
  else if constexpr (std::is_same_v<U, int64_t>) return DevDType::i64;
  else if constexpr (std::is_same_v<U, __nv_bfloat16>) return DevDType::bf16;
  else if constexpr (std::is_same_v<U, __half>) return DevDType::f16;
  else {
    static_assert(std::is_same_v<U, std::byte> || std::is_same_v<U, uint8_t>, "unsupported device element type");
    return DevDType::u8;
  }
}

// A view of device memory: pointer and element count. Explicit, so that a host container never
// becomes one by accident.
template <class T> struct DeviceSpan {
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

// Type-erased device buffer.
struct DevBuf {
  void* ptr = nullptr;
  size_t count = 0;  // elements
  DevDType type = DevDType::u8;
  size_t bytes() const { return count * dev_dtype_bytes(type); }
};
template <class T> DevBuf dev_buf(DeviceSpan<T> s) {
  return DevBuf{const_cast<std::remove_cv_t<T>*>(s.ptr), s.elems, dev_dtype_of<T>()};
}

class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;     // the bootstrap Comm's name: "world", "cp", ...
  virtual std::string backend() const = 0;  // "nccl" or "mpi-staged"
  virtual int device() const = 0;           // CUDA device index this rank uses

  virtual void set_compute_stream(cudaStream_t s) = 0;
  virtual cudaStream_t compute_stream() const = 0;
  virtual cudaStream_t comm_stream() const = 0;  // where this backend's copies/kernels run

  // Sends `send` to rank `to` and receives `recv` from rank `from` (either may be this rank).
  template <class T, class U> Request send_recv_async(DeviceSpan<T> send, int to, DeviceSpan<U> recv, int from) {
    static_assert(std::is_same_v<std::remove_cv_t<T>, std::remove_cv_t<U>>, "send/recv types differ");
    return send_recv_async_impl(dev_buf(send), to, dev_buf(recv), from);
  }
  // recv holds size() blocks of send.elems elements, in rank order.
  template <class T, class U> void all_gather(DeviceSpan<T> send, DeviceSpan<U> recv) {
    static_assert(std::is_same_v<std::remove_cv_t<T>, std::remove_cv_t<U>>, "send/recv types differ");
    all_gather_impl(dev_buf(send), dev_buf(recv));
  }
  // send and recv each hold size() equal blocks; block j of send goes to rank j.
  template <class T, class U> void all_to_all(DeviceSpan<T> send, DeviceSpan<U> recv) {
    static_assert(std::is_same_v<std::remove_cv_t<T>, std::remove_cv_t<U>>, "send/recv types differ");
    all_to_all_impl(dev_buf(send), dev_buf(recv));
  }
  // send holds size() equal blocks; this rank receives the reduction of every rank's block rank().
  template <class T, class U> void reduce_scatter(DeviceSpan<T> send, DeviceSpan<U> recv, ReduceOp op = ReduceOp::sum) {
    static_assert(std::is_same_v<std::remove_cv_t<T>, std::remove_cv_t<U>>, "send/recv types differ");
    reduce_scatter_impl(dev_buf(send), dev_buf(recv), op);
  }
  template <class T> void all_reduce(DeviceSpan<T> inout, ReduceOp op = ReduceOp::sum) {
    all_reduce_impl(dev_buf(inout), op);
  }
  template <class T> void broadcast(DeviceSpan<T> data, int root) { broadcast_impl(dev_buf(data), root); }

  virtual bool test(Request& r) = 0;         // true when complete (then r is no longer pending)
  virtual void wait(Request& r) = 0;         // host blocks until complete
  virtual void stream_wait(Request& r) = 0;  // later compute-stream work sees the result
  // Host blocks until every operation issued so far and the compute stream are complete.
  virtual void synchronize() = 0;

 protected:
  virtual Request send_recv_async_impl(DevBuf send, int to, DevBuf recv, int from) = 0;
  virtual void all_gather_impl(DevBuf send, DevBuf recv) = 0;
  virtual void all_to_all_impl(DevBuf send, DevBuf recv) = 0;
  virtual void reduce_scatter_impl(DevBuf send, DevBuf recv, ReduceOp op) = 0;
  virtual void all_reduce_impl(DevBuf inout, ReduceOp op) = 0;
  virtual void broadcast_impl(DevBuf data, int root) = 0;
};

// The MPI path for device tensors: copies device → pinned host memory on the communication
// stream, runs `host` (an MPI Comm; not owned, must outlive the result), copies back. Reductions of
// bf16/f16 are computed in f32 on the host and rounded once (NCCL reduces in the element type, so
// the two backends may differ in the last bf16 bit for sums of inexact values). u8 reductions are
// refused (MPI has no arithmetic on bytes). Messages are limited to MPI's int count in bytes
// (2 GiB), checked. Collective over `host`; `device` must be the current CUDA device.
std::unique_ptr<DeviceComm> make_staged_comm(Comm& host, int device);

}  // namespace ctxpar
