// HDF5 files of `ctxpar train` (src/io is the module that holds every HDF5 reader and writer;
// callers see no HDF5 types):
//   checkpoints and oracle dumps — float tensors by name ("params/layers.0.wq", ...) with 2-D
//     global shapes, plus scalar attributes on the root (step, seed, ...);
//   token datasets — a 1-D integer dataset "tokens" read as int32 windows.
// A checkpoint is written to PATH.partial and renamed to PATH only when complete (atomic on
// POSIX; io/atomic_file.hpp), so a crash mid-write never leaves a half checkpoint under the real
// name.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/io_lock.hpp"

namespace ctxpar {

struct H5Tensor {
  std::string name;          // may contain '/' (groups are created)
  int64_t rows = 0, cols = 0;
  const float* data = nullptr;  // rows * cols, row-major
};
struct H5IntTensor {
  std::string name;
  int64_t n = 0;
  const int32_t* data = nullptr;
};
struct H5Attrs {
  std::vector<std::pair<std::string, int64_t>> ints;
  std::vector<std::pair<std::string, double>> doubles;
  std::vector<std::pair<std::string, std::string>> strings;
};

// Writes everything to path + ".partial", closes it, renames to path. An I/O error removes the
// partial file and throws LocalFault (core/error.hpp): the caller's ranks agree on it.
void h5_write_tensors(const std::string& path, const H5Attrs& attrs, const std::vector<H5Tensor>& tensors,
                      const std::vector<H5IntTensor>& ints = {});

// One rank's part of a 2-D float dataset in a collective write: `n` consecutive elements, in
// row-major order, of a slice `width` columns wide whose element (0, 0) is the dataset's
// (row0, col0), from slice element `first` (a tp slice of a tensor, or the whole tensor).
struct H5SlicePart {
  int64_t row0 = 0, col0 = 0, width = 0, first = 0, n = 0;
  const float* data = nullptr;
};
struct H5SharedTensor {
  std::string name;
  int64_t rows = 0, cols = 0;
  std::vector<H5SlicePart> parts;  // this rank's (none: it writes nothing of this tensor)
};
// The parallel writer: one file written by every rank of `comm` at once through HDF5's MPI-IO
// driver (datasets and attributes created collectively, each rank's parts written independently),
// to path + ".partial", which rank 0 renames to path once every rank has closed it. Every rank
// passes the same attributes and the same tensor names and shapes; the ranks' parts cover every
// element once. An I/O error on any rank: the partial file removed and LocalFault thrown on every
// rank (the same message). `comm`: an MPI communicator (MPI_Comm) of every rank of the job.
void h5_write_tensors_parallel(const std::string& path, const H5Attrs& attrs,
                               const std::vector<H5SharedTensor>& tensors, const void* comm);

class H5TensorReader {
 public:
  // Throws UsageError (naming `path`) when the file cannot be opened as HDF5.
  explicit H5TensorReader(const std::string& path);
  ~H5TensorReader();
  H5TensorReader(const H5TensorReader&) = delete;
  H5TensorReader& operator=(const H5TensorReader&) = delete;
  bool has(const std::string& name) const;
  // [rows, cols] of a 2-D float dataset; {-1, -1} when missing or not 2-D.
  std::pair<int64_t, int64_t> shape(const std::string& name) const;
  // Reads the block [row0, row0+rows) x [col0, col0+cols) into out (rows x cols).
  void read_block(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols, float* out) const;
  bool attr_int(const std::string& name, int64_t& out) const;
  bool attr_string(const std::string& name, std::string& out) const;

 private:
  IoLock lock_ = io_lock();  // first: held while the file is open (io/io_lock.hpp)
  int64_t file_;
  std::string path_;
};

// Token datasets ("tokens", 1-D, any integer type): "" and the count, or what is wrong.
std::string h5_check_tokens(const std::string& path, int64_t& count);
int64_t h5_token_count(const std::string& path);
void h5_read_tokens(const std::string& path, int64_t first, int64_t count, int32_t* out);
// The same as int64 (ids beyond int32, unclamped, for the validation's vocabulary check); throws
// std::runtime_error when the tokens cannot be read (the validation reports it).
void h5_read_tokens_i64(const std::string& path, int64_t first, int64_t count, int64_t* out);

}  // namespace ctxpar
