// The one crash-safe scheme of every file ctxpar writes (traces, result tensors, checkpoints,
// oracle dumps): the data go to NAME.partial, which is renamed to NAME only when complete. POSIX
// rename is atomic, so an older NAME is replaced by a complete file or not at all, and a reader
// never sees half a file under the real name. A file abandoned before commit() is kept as
// NAME.partial when its flushed part is worth reading (the trace: every flushed step), or removed
// (tensors and checkpoints: partial data is useless). No HDF5 here.
#pragma once
#include <string>

namespace ctxpar {

// The outputs this process claimed (io/output_lock, when it locks them), with what was at each
// path then. A commit replaces only that (where nothing was, it creates the file without replacing
// one that appeared since); a file created or replaced there by someone else while the run went on
// is kept, the run's file goes beside it (DIR/STEM.EXT -> DIR/STEM.ctxpar-PID.EXT), and commit()
// throws naming both. After each commit the claim is the run's own new file (the next checkpoint
// replaces it).
void claim_output(const std::string& path);

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
  // NAME.partial → NAME (the caller has closed the file); throws std::runtime_error on failure,
  // and when NAME changed hands during the run (claim_output: the file then lies beside NAME).
  void commit();
  bool committed() const { return committed_; }

 private:
  std::string final_, partial_;
  bool keep_, committed_ = false;
};

}  // namespace ctxpar
