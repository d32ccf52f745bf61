// User tensors in HDF5 for `ctxpar attn` (src/io, the module that holds every HDF5 reader and
// writer): a reader of token-major datasets (rows = tokens, read by row ranges so each rank
// reads only its shard) and a writer of result files.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/io_lock.hpp"

namespace ctxpar {

class AtomicFile;

// Element class of a dataset, as the user would name it.
enum class TensorType { float32, float64, int32, other_int, other };
const char* tensor_type_name(TensorType t);

class TensorFileReader {
 public:
  // Opens `path` read-only; throws UsageError("... cannot open ...") when it is not an HDF5 file.
  explicit TensorFileReader(const std::string& path);
  ~TensorFileReader();
  TensorFileReader(const TensorFileReader&) = delete;
  TensorFileReader& operator=(const TensorFileReader&) = delete;

  bool has_dataset(const std::string& name) const;
  std::vector<int64_t> dims(const std::string& name) const;  // of an existing dataset
  TensorType type(const std::string& name) const;
  bool has_attr(const std::string& name) const;              // attribute of the root group
  int64_t attr_int(const std::string& name) const;           // integer or float attribute, as int64

  // Rows [begin, end) of a dataset [S, ...] (all trailing dimensions), converted to the target
  // type by HDF5 (e.g. float64 → float32), appended at `out` (row width = product of dims[1:]).
  void read_rows(const std::string& name, int64_t begin, int64_t end, float* out) const;
  void read_rows(const std::string& name, int64_t begin, int64_t end, int32_t* out) const;

 private:
  IoLock lock_ = io_lock();  // first: held while the file is open (io/io_lock.hpp)
  int64_t file_;
  std::string path_;
};

// Writes NAME.partial and renames it to NAME on commit() (io/atomic_file.hpp); a writer destroyed
// without commit() removes the partial file, so an existing NAME is never replaced by a partial
// result. An I/O error removes the partial file and throws LocalFault (core/error.hpp).
class TensorFileWriter {
 public:
  explicit TensorFileWriter(const std::string& path);
  ~TensorFileWriter();
  TensorFileWriter(const TensorFileWriter&) = delete;
  TensorFileWriter& operator=(const TensorFileWriter&) = delete;

  void write(const std::string& name, const std::vector<int64_t>& dims, const float* data);
  void write(const std::string& name, const std::vector<int64_t>& dims, const int32_t* data);
  void attr(const std::string& name, int64_t value);
  void attr(const std::string& name, const std::string& value);
  void commit();

 private:
  IoLock lock_ = io_lock();  // first: held while the file is open (io/io_lock.hpp)
  std::unique_ptr<AtomicFile> out_;
  int64_t file_ = -1;
  // Runs an HDF5 step; on failure (a full disk) the partial file is closed and removed before the
  // run ends as a fault: an unreadable NAME.partial is never left behind.
  template <class F> void guarded(F&& f);
};

}  // namespace ctxpar
