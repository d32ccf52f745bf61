#include "dist/comm.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "core/memory.hpp"
#include "ops.hpp"  // stream_synchronize

namespace ctxpar {

void Comm::same_type(const Buf& send, const Buf& recv) {
  if (send.type != recv.type)
    throw std::invalid_argument(std::string("send and receive element types differ (") + dtype_name(send.type) +
                                " and " + dtype_name(recv.type) + ")");
}

std::string agree_on_error(Comm& comm, const std::string& my_error) {
  // Lowest rank with an error wins; then that rank broadcasts its message.
  int32_t who = my_error.empty() ? comm.size() : comm.rank();
  comm.all_reduce(std::span<int32_t>(&who, 1), ReduceOp::min);
  if (who == comm.size()) return "";
  int64_t len = comm.rank() == who ? int64_t(my_error.size()) : 0;
  comm.broadcast(std::span<int64_t>(&len, 1), who);
  std::string msg(size_t(len), '\0');
  if (comm.rank() == who) msg = my_error;
  comm.broadcast(std::span<uint8_t>(reinterpret_cast<uint8_t*>(msg.data()), msg.size()), who);
  return msg;
}

double measure_alltoall_rate(Comm& comm, size_t part_bytes, double fixed_s, int reps, Device dev, Stream stream) {
  const size_t n = part_bytes * size_t(comm.size());
  Buffer<uint8_t> send(n, true, dev, stream);
  if (dev == Device::cpu)
    for (size_t i = 0; i < n; ++i) send[i] = uint8_t(i);
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {  // r = 0: warm-up
    if (dev != Device::cpu) stream_synchronize(stream, dev);
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    Buffer<uint8_t> recv(n, false, dev, stream);
    comm.all_to_all(send.span(), recv.span());
    if (dev != Device::cpu) stream_synchronize(stream, dev);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, t);
  }
  double rate = rate_after_latency(double(part_bytes) * double(comm.size() - 1), best, fixed_s);
  comm.all_reduce(std::span<double>(&rate, 1), ReduceOp::min);
  return rate;
}

}  // namespace ctxpar
