// HDF5 as Debian builds it is not thread-safe. The process calls it from the main thread, and,
// when a run fails, from rank 0's monitor thread (trace/trace.cpp marks the trace failed while
// the main thread may be blocked anywhere). Every use of HDF5 holds this one lock: the readers
// and writers of src/io for their lifetime (their first member), the free functions for their
// call, the tracer around each write. The monitor only tries it for a bounded time.
#pragma once
#include <mutex>

namespace ctxpar {

std::recursive_timed_mutex& io_mutex();
using IoLock = std::unique_lock<std::recursive_timed_mutex>;
inline IoLock io_lock() { return IoLock(io_mutex()); }

}  // namespace ctxpar
