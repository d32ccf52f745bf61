// What is already in a file a run is about to read or replace (src/io, the module that holds
// every HDF5 reader): the kind of an existing output, so a run never replaces a file that is
// not its own kind of output, and the first non-finite value of an input dataset, so a NaN is
// reported at load instead of absorbed.
#pragma once
#include <string>

namespace ctxpar {

struct ExistingFile {
  bool exists = false;
  bool regular = false;  // a regular file (not a directory, device, ...)
  // "trace", "checkpoint", "attn_result", "oracle_dump" (written by ctxpar: the root attribute
  // ctxpar_file, or for older files their telltale attributes and datasets), "hdf5" (another HDF5
  // file), "" (not HDF5, or unreadable).
  std::string kind;
  std::string mode;    // trace: its mode ("train", "bench cp", ...)
  std::string status;  // trace: running, complete, truncated, failed
};
ExistingFile describe_file(const std::string& path);

// The first value of dataset `name` in `path` that is NaN or ±Inf, or (for a float64 dataset)
// outside float32's range, as "nan at [t, h, d]"; "" when every value is finite. Reads in blocks
// of rows (bounded memory). Throws UsageError naming the file when it cannot be read.
std::string first_non_finite(const std::string& path, const std::string& name);

}  // namespace ctxpar
