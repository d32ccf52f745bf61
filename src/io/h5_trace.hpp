// The trace file of src/io, the module that holds every HDF5 reader and writer (docs/DESIGN.md
// §5). Serial HDF5 calls on one process (rank 0 of the run): the timing data is small and
// gathered there first. The header exposes no HDF5 types, so nothing else needs the HDF5
// include paths.
//
// Crash safety (io/atomic_file.hpp): the writer works on `final_path + ".partial"`; the caller
// flushes after every step, so a killed job leaves every flushed step readable;
// close_and_rename() replaces `final_path` only at a clean end, so an older complete trace is
// never clobbered by a failed run. The file uses the default (oldest compatible) format: HDF5
// 1.10's newer superblock marks files "open for writing" and refuses to open them after a crash
// without h5clear.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trace/trace.hpp"
#include "trace/trace_detail.hpp"

namespace ctxpar {

class AtomicFile;

class H5TraceWriter {
 public:
  // Creates the parent directory of `final_path` if missing and creates (truncates)
  // `final_path`.partial. Throws std::runtime_error with a readable message on failure.
  explicit H5TraceWriter(const std::string& final_path);
  // Closes the file if still open; does not rename (an unfinished run stays .partial).
  ~H5TraceWriter();
  H5TraceWriter(const H5TraceWriter&) = delete;
  H5TraceWriter& operator=(const H5TraceWriter&) = delete;

  const std::string& final_path() const;
  const std::string& partial_path() const;

  // Attributes of the object at `obj` ("/", "/config", "/summary", "/spans", ...); a missing
  // group is created. Writing an existing attribute replaces it (status, steps_completed).
  void attr(const std::string& obj, const std::string& name, const std::string& value);
  void attr(const std::string& obj, const std::string& name, const char* value) {
    attr(obj, name, std::string(value));
  }
  void attr(const std::string& obj, const std::string& name, int64_t value);
  void attr(const std::string& obj, const std::string& name, double value);
  // Stored as the HDF5 enum {FALSE, TRUE} that h5py reads as numpy.bool_.
  void attr_bool(const std::string& obj, const std::string& name, bool value);
  void attr_strings(const std::string& obj, const std::string& name,
                    const std::vector<std::string>& values);

  // Fixed-size datasets (`dims` multiply to data.size()); the parent group is created.
  void dataset_i32(const std::string& path, const std::vector<int32_t>& data,
                   const std::vector<uint64_t>& dims);
  void dataset_f64(const std::string& path, const std::vector<double>& data,
                   const std::vector<uint64_t>& dims);
  void dataset_strings(const std::string& path, const std::vector<std::string>& data);

  // Extendible compound tables /spans, /steps, /rank_steps (created empty by the constructor).
  void append_spans(const std::vector<SpanRecord>& rows);
  void append_steps(const std::vector<trace_detail::StepRow>& rows);
  void append_rank_steps(const std::vector<trace_detail::RankStepRow>& rows);

  // Writes everything HDF5 holds in memory to the file (H5Fflush, global scope).
  void flush();
  // Bytes of the file on disk now, and bytes free for it on its file system (-1: unknown).
  int64_t file_bytes() const;
  int64_t free_bytes() const;
  // "" while NAME.h5.partial is still the file this writer created, else what happened to it (its
  // directory moved or removed, the file renamed): the run cannot place its trace.
  std::string moved() const;
  // Closes the file and renames NAME.h5.partial to NAME.h5 (replacing an older NAME.h5).
  void close_and_rename();

 private:
  std::unique_ptr<AtomicFile> out_;
  uint64_t dev_ = 0, ino_ = 0;  // the partial file's, as created
  int64_t file_ = -1;  // hid_t
  int64_t spans_ = -1, steps_ = -1, rank_steps_ = -1;
  int64_t span_mem_t_ = -1, span_file_t_ = -1, step_mem_t_ = -1, step_file_t_ = -1,
          rank_step_mem_t_ = -1, rank_step_file_t_ = -1;
  void close_all();
};

// "1.10.8" (H5get_libversion).
std::string hdf5_library_version();

// Read-back of the essentials of a trace file, for tests and tools that must not include HDF5.
struct TraceDigest {
  int64_t schema_version = 0;
  std::string status;
  int64_t steps_completed = 0;
  std::vector<SpanRecord> spans;
  std::vector<trace_detail::StepRow> steps;
  std::vector<trace_detail::RankStepRow> rank_steps;
  std::vector<double> clock_offset_us;
  std::vector<int32_t> coords;  // [rank][kNumAxes], flattened
  bool summary_valid = false;
  int64_t summary_measured_steps = 0;
  double summary_time_s_median = 0;
};
// Throws std::runtime_error when the file cannot be opened or lacks an expected object.
TraceDigest read_trace_digest(const std::string& path);

}  // namespace ctxpar
