// Exclusive outputs: a job holds a lock on every file it will write before it creates or
// truncates any of them, so a second job naming the same output stops at once (exit 2, naming
// the holder) and the first job's files stay untouched. No HDF5 here.
//
// The lock of OUTPUT is an fcntl write lock on OUTPUT.lock (an open-file-description lock where
// Linux has them, so reading the file elsewhere in the process cannot drop it), a small text file
// holding the holder's host, pid, mode and start time. The kernel drops the lock when the process ends, even
// by SIGKILL, so a crash never leaves a stale lock, only a stale file (taken over by the next
// job). fcntl locks work on local file systems and on NFS and Lustre mounted with locking; where
// a file system refuses locks the run goes on unlocked and says so.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace ctxpar {

class OutputLocks {
 public:
  OutputLocks() = default;
  ~OutputLocks();  // unlocks and removes every lock file it made
  OutputLocks(const OutputLocks&) = delete;
  OutputLocks& operator=(const OutputLocks&) = delete;
  OutputLocks(OutputLocks&&) noexcept;
  OutputLocks& operator=(OutputLocks&&) noexcept;

  // Locks `output` (its directory is created when missing). "" on success; otherwise the message
  // for the user: the holder (host, pid, mode, since) when another job holds it ("another job
  // ..."), or why the lock file could not be made. `label` names the holder in the lock file
  // (e.g. "train").
  std::string add(const std::string& output, const std::string& label);
  // Outputs whose file system refused locking (the run goes on unlocked; the caller warns).
  const std::vector<std::string>& unlocked() const { return unlocked_; }
  void release();
  // release(), and remove the directories add() created when they are still empty: a run refused
  // after its locks leaves nothing behind.
  void abandon();

 private:
  struct Held {
    std::string path;
    int fd;
  };
  std::vector<Held> held_;
  std::vector<std::string> unlocked_;
  std::vector<std::string> created_dirs_;  // outermost first
};

// The lock file of `output` (OUTPUT.lock).
std::string lock_path(const std::string& output);

}  // namespace ctxpar
