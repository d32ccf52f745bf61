// The one crash-safe scheme of every file ctxpar writes (traces, result tensors, checkpoints,
// oracle dumps): the data go to NAME.partial, which is renamed to NAME only when complete. POSIX
// rename is atomic, so an older NAME is replaced by a complete file or not at all, and a reader
// never sees half a file under the real name. A file abandoned before commit() is kept as
// NAME.partial when its flushed part is worth reading (the trace: every flushed step), or removed
// (tensors and checkpoints: partial data is useless). No HDF5 here.
#pragma once
#include <string>

namespace ctxpar {

class AtomicFile {
 public:
  // Creates the parent directory of `final_path` when missing and removes a stale
  // `final_path`.partial (never writes through a link); throws std::runtime_error naming it.
  AtomicFile(std::string final_path, bool keep_abandoned);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& final_path() const { return final_; }
  const std::string& partial_path() const { return partial_; }
  // NAME.partial → NAME (the caller has closed the file); throws std::runtime_error on failure.
  void commit();
  bool committed() const { return committed_; }

 private:
  std::string final_, partial_;
  bool keep_, committed_ = false;
};

}  // namespace ctxpar
