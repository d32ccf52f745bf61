// Checkpoints, oracle dumps and token datasets (io/h5_checkpoint.hpp), on the I/O module's
// helpers (io/h5_common.hpp) and its crash-safe scheme (io/atomic_file.hpp).
#include "io/h5_checkpoint.hpp"

#include <filesystem>
#include <stdexcept>

#include "core/error.hpp"
#include "io/atomic_file.hpp"
#include "io/h5_common.hpp"
#include "io/io_lock.hpp"

namespace ctxpar {

using h5::Handle;

using h5::fatal_on_error;

void h5_write_tensors(const std::string& path, const H5Attrs& attrs, const std::vector<H5Tensor>& tensors,
                      const std::vector<H5IntTensor>& ints) {
  const IoLock lock = io_lock();
  h5::local_fault_on_error([&] {
    AtomicFile out(path, /*keep_abandoned=*/false);  // an uncommitted partial file is removed
    const std::string& tmp = out.partial_path();
    const hid_t f = h5::create_file(tmp);
    try {
      for (const auto& [k, v] : attrs.ints) h5::attr_i64(f, k, v, tmp);
      for (const auto& [k, v] : attrs.doubles) h5::attr_f64(f, k, v, tmp);
      for (const auto& [k, v] : attrs.strings) h5::attr_string(f, k, v, h5::Str::fixed, tmp);
      for (const H5Tensor& t : tensors)
        h5::write_dataset(f, t.name, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, {hsize_t(t.rows), hsize_t(t.cols)}, t.data, tmp);
      for (const H5IntTensor& t : ints)
        h5::write_dataset(f, t.name, H5T_NATIVE_INT32, H5T_STD_I32LE, {hsize_t(t.n)}, t.data, tmp);
      h5::check_status(H5Fflush(f, H5F_SCOPE_GLOBAL), "H5Fflush", tmp);
    } catch (const std::runtime_error&) {
      h5::close_written_file(f, tmp, /*discard=*/true);
      throw;
    }
    h5::close_written_file(f, tmp, /*discard=*/false);  // before the rename
    out.commit();
  });
}

H5TensorReader::H5TensorReader(const std::string& path)
    : file_(h5::open_user_file(path, "'" + path + "': ")), path_(path) {}

H5TensorReader::~H5TensorReader() {
  if (file_ >= 0) H5Fclose(hid_t(file_));
}

bool H5TensorReader::has(const std::string& name) const { return h5::has_link(hid_t(file_), name); }

std::pair<int64_t, int64_t> H5TensorReader::shape(const std::string& name) const {
  if (!h5::is_dataset(hid_t(file_), name)) return {-1, -1};
  const std::vector<hsize_t> dims = fatal_on_error([&] { return h5::dims_of(hid_t(file_), name, path_); });
  if (dims.size() != 2) return {-1, -1};
  return {int64_t(dims[0]), int64_t(dims[1])};
}

void H5TensorReader::read_block(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                                float* out) const {
  fatal_on_error([&] {
    h5::read_block(hid_t(file_), name, {hsize_t(row0), hsize_t(col0)}, {hsize_t(rows), hsize_t(cols)}, H5T_NATIVE_FLOAT,
                   out, path_);
  });
}

bool H5TensorReader::attr_int(const std::string& name, int64_t& out) const {
  return h5::read_attr_int(hid_t(file_), name, out).empty();
}

bool H5TensorReader::attr_string(const std::string& name, std::string& out) const {
  return h5::read_attr_string(hid_t(file_), name, out);
}

std::string h5_check_tokens(const std::string& path, int64_t& count) {
  const IoLock lock = io_lock();
  hid_t f = -1;
  try {
    f = h5::open_read_only(path);
  } catch (const std::runtime_error&) {
    return "cannot open as an HDF5 file";
  }
  Handle cf(f, H5Fclose);
  hid_t d = -1;
  H5E_BEGIN_TRY { d = H5Dopen2(f, "tokens", H5P_DEFAULT); }
  H5E_END_TRY;
  if (d < 0) return "no dataset 'tokens'; valid: a 1-D integer dataset named tokens";
  Handle cd(d, H5Dclose);
  Handle sp(H5Dget_space(d), H5Sclose);
  Handle t(H5Dget_type(d), H5Tclose);
  if (H5Sget_simple_extent_ndims(sp.get()) != 1) return "dataset 'tokens' is not 1-D; valid: a 1-D integer dataset";
  if (H5Tget_class(t.get()) != H5T_INTEGER) return "dataset 'tokens' is not an integer type; valid: uint16/uint32/int32";
  hsize_t n = 0;
  H5Sget_simple_extent_dims(sp.get(), &n, nullptr);
  count = int64_t(n);
  return "";
}

int64_t h5_token_count(const std::string& path) {
  const IoLock lock = io_lock();
  int64_t n = 0;
  const std::string err = h5_check_tokens(path, n);
  CTXPAR_CHECK(err.empty(), path << ": " << err);
  return n;
}

void h5_read_tokens(const std::string& path, int64_t first, int64_t count, int32_t* out) {
  const IoLock lock = io_lock();
  fatal_on_error([&] {
    Handle f(h5::open_read_only(path), H5Fclose);
    // HDF5 converts any stored integer type to int32 (values beyond int32 clamp: the validation
    // reads them as int64 first, h5_read_tokens_i64).
    h5::read_block(f.get(), "tokens", {hsize_t(first)}, {hsize_t(count)}, H5T_NATIVE_INT32, out, path);
  });
}

void h5_read_tokens_i64(const std::string& path, int64_t first, int64_t count, int64_t* out) {
  const IoLock lock = io_lock();
  Handle f(h5::open_read_only(path), H5Fclose);
  h5::read_block(f.get(), "tokens", {hsize_t(first)}, {hsize_t(count)}, H5T_NATIVE_INT64, out, path);
}

}  // namespace ctxpar
