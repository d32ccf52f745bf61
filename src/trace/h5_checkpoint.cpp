#include "trace/h5_checkpoint.hpp"

#include <hdf5.h>

#include <cstdio>
#include <filesystem>

#include "core/error.hpp"

namespace ctxpar {

namespace {

// Creates the groups on the way to `name` ("a/b/c" → a, a/b).
void make_parents(hid_t file, const std::string& name) {
  for (size_t p = name.find('/'); p != std::string::npos; p = name.find('/', p + 1)) {
    const std::string g = name.substr(0, p);
    if (H5Lexists(file, g.c_str(), H5P_DEFAULT) > 0) continue;
    const hid_t id = H5Gcreate2(file, g.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    CTXPAR_CHECK(id >= 0, "HDF5: cannot create group " << g);
    H5Gclose(id);
  }
}

void write_dataset(hid_t file, const std::string& name, int rank, const hsize_t* dims, hid_t mem_type,
                   hid_t file_type, const void* data) {
  make_parents(file, name);
  const hid_t sp = H5Screate_simple(rank, dims, nullptr);
  const hid_t d = H5Dcreate2(file, name.c_str(), file_type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  CTXPAR_CHECK(d >= 0, "HDF5: cannot create dataset " << name);
  CTXPAR_CHECK(H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0, "HDF5: cannot write " << name);
  H5Dclose(d);
  H5Sclose(sp);
}

template <class T> void write_attr(hid_t file, const std::string& name, hid_t type, const T& v) {
  const hid_t sp = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(file, name.c_str(), type, sp, H5P_DEFAULT, H5P_DEFAULT);
  CTXPAR_CHECK(a >= 0 && H5Awrite(a, type, &v) >= 0, "HDF5: cannot write attribute " << name);
  H5Aclose(a);
  H5Sclose(sp);
}

}  // namespace

void h5_write_tensors(const std::string& path, const H5Attrs& attrs, const std::vector<H5Tensor>& tensors,
                      const std::vector<H5IntTensor>& ints) {
  namespace fs = std::filesystem;
  const std::string tmp = path + ".tmp";
  fs::path dir = fs::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) fs::create_directories(dir, ec);
  const hid_t f = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  CTXPAR_CHECK(f >= 0, "HDF5: cannot create " << tmp);
  for (const auto& [k, v] : attrs.ints) write_attr(f, k, H5T_NATIVE_INT64, int64_t(v));
  for (const auto& [k, v] : attrs.doubles) write_attr(f, k, H5T_NATIVE_DOUBLE, v);
  for (const auto& [k, v] : attrs.strings) {
    const hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, v.size() + 1);
    const hid_t sp = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(f, k.c_str(), t, sp, H5P_DEFAULT, H5P_DEFAULT);
    CTXPAR_CHECK(a >= 0 && H5Awrite(a, t, v.c_str()) >= 0, "HDF5: cannot write attribute " << k);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
  }
  for (const H5Tensor& t : tensors) {
    const hsize_t dims[2] = {hsize_t(t.rows), hsize_t(t.cols)};
    write_dataset(f, t.name, 2, dims, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, t.data);
  }
  for (const H5IntTensor& t : ints) {
    const hsize_t dims[1] = {hsize_t(t.n)};
    write_dataset(f, t.name, 1, dims, H5T_NATIVE_INT32, H5T_STD_I32LE, t.data);
  }
  CTXPAR_CHECK(H5Fflush(f, H5F_SCOPE_GLOBAL) >= 0 && H5Fclose(f) >= 0, "HDF5: cannot close " << tmp);
  fs::rename(tmp, path, ec);
  CTXPAR_CHECK(!ec, "cannot rename " << tmp << " to " << path << ": " << ec.message());
}

H5TensorReader::H5TensorReader(const std::string& path) : file_(-1), path_(path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw UsageError("'" + path + "': no such file");
  hid_t f = -1;
  H5E_BEGIN_TRY { f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT); }
  H5E_END_TRY;
  if (f < 0) throw UsageError("'" + path + "': cannot open as an HDF5 file");
  file_ = int64_t(f);
}

H5TensorReader::~H5TensorReader() {
  if (file_ >= 0) H5Fclose(hid_t(file_));
}

bool H5TensorReader::has(const std::string& name) const {
  // Every parent must exist for H5Lexists on a nested path.
  for (size_t p = name.find('/'); p != std::string::npos; p = name.find('/', p + 1))
    if (H5Lexists(hid_t(file_), name.substr(0, p).c_str(), H5P_DEFAULT) <= 0) return false;
  return H5Lexists(hid_t(file_), name.c_str(), H5P_DEFAULT) > 0;
}

std::pair<int64_t, int64_t> H5TensorReader::shape(const std::string& name) const {
  if (!has(name)) return {-1, -1};
  const hid_t d = H5Dopen2(hid_t(file_), name.c_str(), H5P_DEFAULT);
  if (d < 0) return {-1, -1};
  const hid_t sp = H5Dget_space(d);
  hsize_t dims[2] = {0, 0};
  const int n = H5Sget_simple_extent_ndims(sp);
  if (n == 2) H5Sget_simple_extent_dims(sp, dims, nullptr);
  H5Sclose(sp);
  H5Dclose(d);
  if (n != 2) return {-1, -1};
  return {int64_t(dims[0]), int64_t(dims[1])};
}

void H5TensorReader::read_block(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                                float* out) const {
  const hid_t d = H5Dopen2(hid_t(file_), name.c_str(), H5P_DEFAULT);
  CTXPAR_CHECK(d >= 0, "HDF5: no dataset " << name << " in " << path_);
  const hid_t fs = H5Dget_space(d);
  const hsize_t start[2] = {hsize_t(row0), hsize_t(col0)}, count[2] = {hsize_t(rows), hsize_t(cols)};
  H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, nullptr, count, nullptr);
  const hid_t ms = H5Screate_simple(2, count, nullptr);
  CTXPAR_CHECK(H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, out) >= 0,
               "HDF5: cannot read " << name << " block from " << path_);
  H5Sclose(ms);
  H5Sclose(fs);
  H5Dclose(d);
}

bool H5TensorReader::attr_int(const std::string& name, int64_t& out) const {
  if (H5Aexists(hid_t(file_), name.c_str()) <= 0) return false;
  const hid_t a = H5Aopen(hid_t(file_), name.c_str(), H5P_DEFAULT);
  const bool ok = H5Aread(a, H5T_NATIVE_INT64, &out) >= 0;
  H5Aclose(a);
  return ok;
}

bool H5TensorReader::attr_string(const std::string& name, std::string& out) const {
  if (H5Aexists(hid_t(file_), name.c_str()) <= 0) return false;
  const hid_t a = H5Aopen(hid_t(file_), name.c_str(), H5P_DEFAULT);
  const hid_t t = H5Aget_type(a);
  bool ok = false;
  if (H5Tget_class(t) == H5T_STRING && !H5Tis_variable_str(t)) {
    std::string s(H5Tget_size(t), '\0');
    const hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_size(mt, s.size());
    ok = H5Aread(a, mt, s.data()) >= 0;
    H5Tclose(mt);
    out = s.c_str();
  }
  H5Tclose(t);
  H5Aclose(a);
  return ok;
}

std::string h5_check_tokens(const std::string& path, int64_t& count) {
  hid_t f = -1;
  H5E_BEGIN_TRY { f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT); }
  H5E_END_TRY;
  if (f < 0) return "cannot open as an HDF5 file";
  std::string err;
  hid_t d = -1;
  H5E_BEGIN_TRY { d = H5Dopen2(f, "tokens", H5P_DEFAULT); }
  H5E_END_TRY;
  if (d < 0) {
    err = "no dataset 'tokens'; valid: a 1-D integer dataset named tokens";
  } else {
    const hid_t sp = H5Dget_space(d);
    const hid_t t = H5Dget_type(d);
    hsize_t n = 0;
    if (H5Sget_simple_extent_ndims(sp) != 1) err = "dataset 'tokens' is not 1-D; valid: a 1-D integer dataset";
    else if (H5Tget_class(t) != H5T_INTEGER) err = "dataset 'tokens' is not an integer type; valid: uint16/uint32/int32";
    else H5Sget_simple_extent_dims(sp, &n, nullptr);
    count = int64_t(n);
    H5Tclose(t);
    H5Sclose(sp);
    H5Dclose(d);
  }
  H5Fclose(f);
  return err;
}

int64_t h5_token_count(const std::string& path) {
  int64_t n = 0;
  const std::string err = h5_check_tokens(path, n);
  CTXPAR_CHECK(err.empty(), path << ": " << err);
  return n;
}

void h5_read_tokens(const std::string& path, int64_t first, int64_t count, int32_t* out) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  CTXPAR_CHECK(f >= 0, "HDF5: cannot open " << path);
  const hid_t d = H5Dopen2(f, "tokens", H5P_DEFAULT);
  CTXPAR_CHECK(d >= 0, "HDF5: no dataset 'tokens' in " << path);
  const hid_t fs = H5Dget_space(d);
  const hsize_t start = hsize_t(first), cnt = hsize_t(count);
  H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, nullptr, &cnt, nullptr);
  const hid_t ms = H5Screate_simple(1, &cnt, nullptr);
  // HDF5 converts any stored integer type to int32 (values beyond int32 would fail the vocab check).
  CTXPAR_CHECK(H5Dread(d, H5T_NATIVE_INT32, ms, fs, H5P_DEFAULT, out) >= 0,
               "HDF5: cannot read tokens [" << first << ", " << first + count << ") of " << path);
  H5Sclose(ms);
  H5Sclose(fs);
  H5Dclose(d);
  H5Fclose(f);
}

}  // namespace ctxpar
