// Internal to dist/'s device backends (comm_staged.cpp, comm_nccl.cpp): what both share. Every
// operation on host buffers goes, as it is, to the MPI Comm the backend was made from (its
// Requests carry that Comm in via(), so test/wait hand them back); an operation that mixes host
// and device buffers is refused; device buffers go to the backend's *_device methods. Also the
// host-side members every device backend takes from its MPI Comm (rank, size, name, barrier,
// clock, gather_v) and the streams of comm.hpp's contract.
#pragma once
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "dist/comm.hpp"

namespace ctxpar::dist_detail {

class DeviceBackendComm : public Comm {
 public:
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string name() const override { return host_.name(); }
  int device() const override { return device_; }
  void set_compute_stream(Stream s) override { compute_ = s; }
  Stream compute_stream() const override { return compute_; }
  Stream comm_stream() const override { return comm_stream_; }
  void barrier() override { host_.barrier(); }
  double now() const override { return host_.now(); }

  bool test(Request& r) final {
    if (!r.pending()) return true;
    if (r.via()) return r.via()->test(r);
    return test_device(r);
  }
  void wait(Request& r) final {
    if (!r.pending()) return;
    if (r.via()) return r.via()->wait(r);
    wait_device(r);
  }
  void stream_wait(Request& r) final {
    if (!r.pending()) return;
    if (r.via()) return r.via()->wait(r);
    stream_wait_device(r);
  }

 protected:
  DeviceBackendComm(Comm& host, int device) : host_(host), device_(device) {}

  // The device side; each is called with device buffers of one element type only.
  virtual bool test_device(Request& r) = 0;
  virtual void wait_device(Request& r) = 0;
  virtual void stream_wait_device(Request& r) = 0;
  virtual Request send_recv_device(Buf send, int to, Buf recv, int from, int tag) = 0;
  virtual void all_gather_device(Buf send, Buf recv) = 0;
  virtual void all_to_all_device(Buf send, Buf recv) = 0;
  virtual void reduce_scatter_device(Buf send, Buf recv, ReduceOp op) = 0;
  virtual Request all_gather_async_device(Buf send, Buf recv) = 0;
  virtual Request reduce_scatter_async_device(Buf send, Buf recv, ReduceOp op) = 0;
  virtual void all_reduce_device(Buf inout, ReduceOp op) = 0;
  virtual void broadcast_device(Buf data, int root) = 0;

  Request send_recv_async_impl(Buf send, int to, Buf recv, int from, int tag) final {
    if (!on_host(send, recv, "send_recv_async")) return send_recv_device(send, to, recv, from, tag);
    Request hreq = forward_send_recv(host_, send, to, recv, from, tag);
    return Request(std::move(hreq.ids()), &host_);
  }
  void all_gather_impl(Buf send, Buf recv) final {
    if (on_host(send, recv, "all_gather")) return forward_all_gather(host_, send, recv);
    all_gather_device(send, recv);
  }
  Request all_gather_async_impl(Buf send, Buf recv) final {
    if (!on_host(send, recv, "all_gather_async")) return all_gather_async_device(send, recv);
    Request hreq = forward_all_gather_async(host_, send, recv);
    return Request(std::move(hreq.ids()), &host_);
  }
  Request reduce_scatter_async_impl(Buf send, Buf recv, ReduceOp op) final {
    if (!on_host(send, recv, "reduce_scatter_async")) return reduce_scatter_async_device(send, recv, op);
    Request hreq = forward_reduce_scatter_async(host_, send, recv, op);
    return Request(std::move(hreq.ids()), &host_);
  }
  void all_to_all_impl(Buf send, Buf recv) final {
    if (on_host(send, recv, "all_to_all")) return forward_all_to_all(host_, send, recv);
    all_to_all_device(send, recv);
  }
  void reduce_scatter_impl(Buf send, Buf recv, ReduceOp op) final {
    if (on_host(send, recv, "reduce_scatter")) return forward_reduce_scatter(host_, send, recv, op);
    reduce_scatter_device(send, recv, op);
  }
  void all_reduce_impl(Buf inout, ReduceOp op) final {
    if (inout.where == Device::cpu) return forward_all_reduce(host_, inout, op);
    all_reduce_device(inout, op);
  }
  void broadcast_impl(Buf data, int root) final {
    if (data.where == Device::cpu) return forward_broadcast(host_, data, root);
    broadcast_device(data, root);
  }
  std::vector<int64_t> gather_counts(int64_t count, int root) final { return forward_gather_counts(host_, count, root); }
  void gather_v_impl(Buf send, Buf recv, const std::vector<int64_t>& counts, int root) final {
    forward_gather_v(host_, send, recv, counts, root);
  }

  Comm& host_;            // the MPI Comm: host buffers, bootstrap, barrier, clock
  const int device_;      // the CUDA device of the device buffers
  Stream compute_ = nullptr;      // legacy default stream until set_compute_stream
  Stream comm_stream_ = nullptr;  // created by the backend

 private:
  // Both host buffers (forwarded) or both device buffers, of one element type; else an error.
  static bool on_host(const Buf& a, const Buf& b, const char* what) {
    CTXPAR_CHECK(a.type == b.type, what << ": types differ");
    CTXPAR_CHECK(a.where == b.where, what << ": one buffer is on the host, the other on the device");
    return a.where == Device::cpu;
  }
};

}  // namespace ctxpar::dist_detail
