// User tensors of `ctxpar attn` in HDF5 (io/h5_tensors.hpp), on the I/O module's helpers
// (io/h5_common.hpp) and its crash-safe scheme (io/atomic_file.hpp).
#include "io/h5_tensors.hpp"

#include <filesystem>
#include <functional>
#include <stdexcept>

#include "core/error.hpp"
#include "io/atomic_file.hpp"
#include "io/h5_common.hpp"

namespace ctxpar {

using h5::Handle;

using h5::fatal_on_error;

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

TensorFileReader::TensorFileReader(const std::string& path)
    : file_(h5::open_user_file(path, "in = '" + path + "': ")), path_(path) {}

TensorFileReader::~TensorFileReader() {
  if (file_ >= 0) H5Fclose(hid_t(file_));
}

bool TensorFileReader::has_dataset(const std::string& name) const { return h5::is_dataset(hid_t(file_), name); }

std::vector<int64_t> TensorFileReader::dims(const std::string& name) const {
  const std::vector<hsize_t> h = fatal_on_error([&] { return h5::dims_of(hid_t(file_), name, path_); });
  return std::vector<int64_t>(h.begin(), h.end());
}

TensorType TensorFileReader::type(const std::string& name) const {
  return fatal_on_error([&] {
    Handle d(h5::check(H5Dopen2(hid_t(file_), name.c_str(), H5P_DEFAULT), "H5Dopen2 " + name, path_), H5Dclose);
    Handle t(H5Dget_type(d.get()), H5Tclose);
    const H5T_class_t c = H5Tget_class(t.get());
    const size_t sz = H5Tget_size(t.get());
    if (c == H5T_FLOAT) return sz == 4 ? TensorType::float32 : sz == 8 ? TensorType::float64 : TensorType::other;
    if (c == H5T_INTEGER) return sz == 4 && H5Tget_sign(t.get()) == H5T_SGN_2 ? TensorType::int32 : TensorType::other_int;
    return TensorType::other;
  });
}

bool TensorFileReader::has_attr(const std::string& name) const { return H5Aexists(hid_t(file_), name.c_str()) > 0; }

int64_t TensorFileReader::attr_int(const std::string& name) const {
  int64_t v = 0;
  const std::string why = h5::read_attr_int(hid_t(file_), name, v);
  if (!why.empty())
    throw UsageError("in = '" + path_ + "': attribute '" + name + "' " + why + "; valid: one whole number");
  return v;
}

namespace {
void read_rows_as(hid_t file, const std::string& path, const std::string& name, int64_t begin, int64_t end,
                  hid_t memtype, void* out) {
  if (end <= begin) return;
  fatal_on_error([&] {
    std::vector<hsize_t> count = h5::dims_of(file, name, path), start(count.size(), 0);
    CTXPAR_CHECK(!count.empty() && hsize_t(end) <= count[0], "HDF5: rows [" << begin << "," << end << ") outside '" << name << "'");
    start[0] = hsize_t(begin);
    count[0] = hsize_t(end - begin);
    h5::read_block(file, name, start, count, memtype, out, path);
  });
}
}  // namespace

void TensorFileReader::read_rows(const std::string& name, int64_t begin, int64_t end, float* out) const {
  read_rows_as(hid_t(file_), path_, name, begin, end, H5T_NATIVE_FLOAT, out);
}
void TensorFileReader::read_rows(const std::string& name, int64_t begin, int64_t end, int32_t* out) const {
  read_rows_as(hid_t(file_), path_, name, begin, end, H5T_NATIVE_INT32, out);
}

// ---- writer ---------------------------------------------------------------------------------

TensorFileWriter::TensorFileWriter(const std::string& path)
    : out_(h5::local_fault_on_error([&] { return std::make_unique<AtomicFile>(path, /*keep_abandoned=*/false); })) {
  file_ = h5::local_fault_on_error([&] { return h5::create_file(out_->partial_path()); });
}

TensorFileWriter::~TensorFileWriter() {
  if (file_ >= 0) H5Fclose(hid_t(file_));  // before out_ removes an uncommitted partial file
}

template <class F> void TensorFileWriter::guarded(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    if (file_ >= 0) h5::close_written_file(hid_t(file_), out_->partial_path(), /*discard=*/true);
    file_ = -1;
    out_.reset();  // uncommitted: removes NAME.partial
    throw LocalFault(std::string("I/O error: ") + e.what());
  }
}

void TensorFileWriter::write(const std::string& name, const std::vector<int64_t>& dims, const float* data) {
  guarded([&] {
    h5::write_dataset(hid_t(file_), name, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, std::vector<hsize_t>(dims.begin(), dims.end()),
                      data, out_->partial_path());
  });
}
void TensorFileWriter::write(const std::string& name, const std::vector<int64_t>& dims, const int32_t* data) {
  guarded([&] {
    h5::write_dataset(hid_t(file_), name, H5T_NATIVE_INT32, H5T_STD_I32LE, std::vector<hsize_t>(dims.begin(), dims.end()),
                      data, out_->partial_path());
  });
}

void TensorFileWriter::attr(const std::string& name, int64_t value) {
  guarded([&] { h5::attr_i64(hid_t(file_), name, value, out_->partial_path()); });
}

void TensorFileWriter::attr(const std::string& name, const std::string& value) {
  guarded([&] { h5::attr_string(hid_t(file_), name, value, h5::Str::fixed, out_->partial_path()); });
}

void TensorFileWriter::commit() {
  guarded([&] { h5::check_status(H5Fflush(hid_t(file_), H5F_SCOPE_GLOBAL), "H5Fflush", out_->partial_path()); });
  h5::close_written_file(hid_t(file_), out_->partial_path(), /*discard=*/false);
  file_ = -1;
  h5::local_fault_on_error([&] { out_->commit(); });
}

}  // namespace ctxpar
