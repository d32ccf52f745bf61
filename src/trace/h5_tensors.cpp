#include "trace/h5_tensors.hpp"

#include <hdf5.h>

#include <cstdio>
#include <filesystem>

#include "core/error.hpp"

namespace ctxpar {

const char* tensor_type_name(TensorType t) {
  switch (t) {
    case TensorType::float32: return "float32";
    case TensorType::float64: return "float64";
    case TensorType::int32: return "int32";
    case TensorType::other_int: return "integer (not int32)";
    case TensorType::other: return "non-numeric or unsupported type";
  }
  return "?";
}

// ---- reader ---------------------------------------------------------------------------------

TensorFileReader::TensorFileReader(const std::string& path) : file_(-1), path_(path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw UsageError("in = '" + path + "': no such file");
  htri_t is_h5 = -1;
  H5E_BEGIN_TRY { is_h5 = H5Fis_hdf5(path.c_str()); }
  H5E_END_TRY;
  if (is_h5 <= 0) throw UsageError("in = '" + path + "': cannot open as an HDF5 file");
  H5E_BEGIN_TRY { file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT); }
  H5E_END_TRY;
  if (file_ < 0) throw UsageError("in = '" + path + "': cannot open as an HDF5 file");
}

TensorFileReader::~TensorFileReader() {
  if (file_ >= 0) H5Fclose(hid_t(file_));
}

bool TensorFileReader::has_dataset(const std::string& name) const {
  htri_t e = -1;
  H5E_BEGIN_TRY { e = H5Lexists(hid_t(file_), name.c_str(), H5P_DEFAULT); }
  H5E_END_TRY;
  if (e <= 0) return false;
  hid_t d = -1;  // a group or a named type of that name is not a dataset
  H5E_BEGIN_TRY { d = H5Dopen2(hid_t(file_), name.c_str(), H5P_DEFAULT); }
  H5E_END_TRY;
  if (d < 0) return false;
  H5Dclose(d);
  return true;
}

std::vector<int64_t> TensorFileReader::dims(const std::string& name) const {
  const hid_t d = H5Dopen2(hid_t(file_), name.c_str(), H5P_DEFAULT);
  CTXPAR_CHECK(d >= 0, "HDF5: cannot open dataset '" << name << "' of " << path_);
  const hid_t sp = H5Dget_space(d);
  const int n = H5Sget_simple_extent_ndims(sp);
  std::vector<hsize_t> h(size_t(std::max(n, 0)));
  if (n > 0) H5Sget_simple_extent_dims(sp, h.data(), nullptr);
  H5Sclose(sp);
  H5Dclose(d);
  return std::vector<int64_t>(h.begin(), h.end());
}

TensorType TensorFileReader::type(const std::string& name) const {
  const hid_t d = H5Dopen2(hid_t(file_), name.c_str(), H5P_DEFAULT);
  CTXPAR_CHECK(d >= 0, "HDF5: cannot open dataset '" << name << "' of " << path_);
  const hid_t t = H5Dget_type(d);
  TensorType r = TensorType::other;
  const H5T_class_t c = H5Tget_class(t);
  const size_t sz = H5Tget_size(t);
  if (c == H5T_FLOAT) r = sz == 4 ? TensorType::float32 : sz == 8 ? TensorType::float64 : TensorType::other;
  else if (c == H5T_INTEGER) r = sz == 4 && H5Tget_sign(t) == H5T_SGN_2 ? TensorType::int32 : TensorType::other_int;
  H5Tclose(t);
  H5Dclose(d);
  return r;
}

bool TensorFileReader::has_attr(const std::string& name) const {
  return H5Aexists(hid_t(file_), name.c_str()) > 0;
}

int64_t TensorFileReader::attr_int(const std::string& name) const {
  const hid_t a = H5Aopen(hid_t(file_), name.c_str(), H5P_DEFAULT);
  CTXPAR_CHECK(a >= 0, "HDF5: cannot open attribute '" << name << "' of " << path_);
  const hid_t t = H5Aget_type(a);
  int64_t v = 0;
  herr_t rc;
  if (H5Tget_class(t) == H5T_FLOAT) {
    double x = 0;
    rc = H5Aread(a, H5T_NATIVE_DOUBLE, &x);
    v = int64_t(x);
  } else {
    rc = H5Aread(a, H5T_NATIVE_INT64, &v);
  }
  H5Tclose(t);
  H5Aclose(a);
  if (rc < 0) throw UsageError("in = '" + path_ + "': attribute '" + name + "' is not a number");
  return v;
}

namespace {
void read_rows_as(hid_t file, const std::string& path, const std::string& name, int64_t begin, int64_t end,
                  hid_t memtype, void* out) {
  if (end <= begin) return;
  const hid_t d = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  CTXPAR_CHECK(d >= 0, "HDF5: cannot open dataset '" << name << "' of " << path);
  const hid_t fs = H5Dget_space(d);
  const int n = H5Sget_simple_extent_ndims(fs);
  std::vector<hsize_t> dims(static_cast<size_t>(n)), start(static_cast<size_t>(n), 0), count;
  H5Sget_simple_extent_dims(fs, dims.data(), nullptr);
  CTXPAR_CHECK(n >= 1 && hsize_t(end) <= dims[0], "HDF5: rows [" << begin << "," << end << ") outside '" << name << "'");
  count = dims;
  start[0] = hsize_t(begin);
  count[0] = hsize_t(end - begin);
  H5Sselect_hyperslab(fs, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  const hid_t ms = H5Screate_simple(n, count.data(), nullptr);
  const herr_t rc = H5Dread(d, memtype, ms, fs, H5P_DEFAULT, out);
  H5Sclose(ms);
  H5Sclose(fs);
  H5Dclose(d);
  CTXPAR_CHECK(rc >= 0, "HDF5: reading rows [" << begin << "," << end << ") of '" << name << "' from " << path << " failed");
}
}  // namespace

void TensorFileReader::read_rows(const std::string& name, int64_t begin, int64_t end, float* out) const {
  read_rows_as(hid_t(file_), path_, name, begin, end, H5T_NATIVE_FLOAT, out);
}
void TensorFileReader::read_rows(const std::string& name, int64_t begin, int64_t end, int32_t* out) const {
  read_rows_as(hid_t(file_), path_, name, begin, end, H5T_NATIVE_INT32, out);
}

// ---- writer ---------------------------------------------------------------------------------

TensorFileWriter::TensorFileWriter(const std::string& path) : file_(-1), path_(path), partial_(path + ".partial") {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  file_ = H5Fcreate(partial_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  CTXPAR_CHECK(file_ >= 0, "HDF5: cannot create " << partial_);
}

TensorFileWriter::~TensorFileWriter() {
  if (file_ >= 0) H5Fclose(hid_t(file_));
  if (!committed_) std::remove(partial_.c_str());
}

namespace {
void write_as(hid_t file, const std::string& name, const std::vector<int64_t>& dims, hid_t filetype, hid_t memtype,
              const void* data) {
  std::vector<hsize_t> h(dims.begin(), dims.end());
  const hid_t sp = H5Screate_simple(int(h.size()), h.data(), nullptr);
  const hid_t d = H5Dcreate2(file, name.c_str(), filetype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  CTXPAR_CHECK(d >= 0, "HDF5: cannot create dataset '" << name << "'");
  const herr_t rc = H5Dwrite(d, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  H5Dclose(d);
  H5Sclose(sp);
  CTXPAR_CHECK(rc >= 0, "HDF5: writing dataset '" << name << "' failed");
}
}  // namespace

void TensorFileWriter::write(const std::string& name, const std::vector<int64_t>& dims, const float* data) {
  write_as(hid_t(file_), name, dims, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, data);
}
void TensorFileWriter::write(const std::string& name, const std::vector<int64_t>& dims, const int32_t* data) {
  write_as(hid_t(file_), name, dims, H5T_STD_I32LE, H5T_NATIVE_INT32, data);
}

void TensorFileWriter::attr(const std::string& name, int64_t value) {
  const hid_t sp = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(hid_t(file_), name.c_str(), H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  CTXPAR_CHECK(a >= 0, "HDF5: cannot create attribute '" << name << "'");
  H5Awrite(a, H5T_NATIVE_INT64, &value);
  H5Aclose(a);
  H5Sclose(sp);
}

void TensorFileWriter::attr(const std::string& name, const std::string& value) {
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, std::max<size_t>(value.size(), 1));
  H5Tset_strpad(t, H5T_STR_NULLPAD);
  const hid_t sp = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(hid_t(file_), name.c_str(), t, sp, H5P_DEFAULT, H5P_DEFAULT);
  CTXPAR_CHECK(a >= 0, "HDF5: cannot create attribute '" << name << "'");
  H5Awrite(a, t, value.empty() ? "" : value.data());
  H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
}

void TensorFileWriter::commit() {
  CTXPAR_CHECK(H5Fclose(hid_t(file_)) >= 0, "HDF5: closing " << partial_ << " failed");
  file_ = -1;
  std::error_code ec;
  std::filesystem::rename(partial_, path_, ec);
  CTXPAR_CHECK(!ec, "cannot rename " << partial_ << " to " << path_ << ": " << ec.message());
  committed_ = true;
}

}  // namespace ctxpar
