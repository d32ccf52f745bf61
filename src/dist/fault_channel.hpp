// Fault notices: a rank that is about to end the job (out of memory, a stalled peer seen by its
// watchdog, any fail_run) tells rank 0 why before it aborts, so rank 0 can mark the trace failed
// with the reason while the other ranks are still blocked in their collectives. Its own
// communicator (a duplicate of the world's), so a notice never matches the run's traffic; used
// from the monitor thread (MPI_THREAD_MULTIPLE).
#pragma once
#include <memory>
#include <string>

namespace ctxpar {

class Comm;

class FaultChannel {
 public:
  virtual ~FaultChannel() = default;
  // A rank other than 0: sends `reason` to rank 0 and waits up to `wait_s` seconds for rank 0 to
  // say it has recorded it; true when it did.
  virtual bool notify(const std::string& reason, double wait_s) = 0;
  // Rank 0: true and the sender and reason of a notice that has arrived; never blocks.
  virtual bool poll(int& from, std::string& reason) = 0;
  // Rank 0: tells `rank` its notice is recorded.
  virtual void acknowledge(int rank) = 0;
};

// Collective over `world`; null when `world` is not an MPI communicator (test doubles).
std::unique_ptr<FaultChannel> make_fault_channel(Comm& world);

}  // namespace ctxpar
