#include "io/h5_common.hpp"

#include "io/io_lock.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <stdexcept>

namespace ctxpar {
std::recursive_timed_mutex& io_mutex() {
  static std::recursive_timed_mutex mu;
  return mu;
}
}  // namespace ctxpar

namespace ctxpar::h5 {

void fail(const std::string& what, const std::string& file) {
  // The one cause a user can act on, when the file driver left it in errno.
  const std::string cause = errno == ENOSPC ? ": no space left on device" : errno == EDQUOT ? ": disk quota exceeded" : "";
  throw std::runtime_error("HDF5: " + what + " failed (file " + file + ")" + cause);
}
hid_t check(hid_t id, const std::string& what, const std::string& file) {
  if (id < 0) fail(what, file);
  return id;
}
void check_status(herr_t st, const std::string& what, const std::string& file) {
  if (st < 0) fail(what, file);
}

void quiet_error_stack() {
  // HDF5 prints its whole error stack (dozens of lines per failure) unless told not to; the
  // messages of check()/fail() name the call, the file and the cause instead.
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

hid_t create_file(const std::string& path) {
  quiet_error_stack();
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) throw std::runtime_error("cannot create '" + path + "'");
  return f;
}

void close_written_file(hid_t f, const std::string& path, bool discard) {
  if (discard) {
    std::error_code ec;  // best effort: a close that still fails ends below
    std::filesystem::resize_file(path, 0, ec);
  }
  if (H5Fclose(f) < 0)
    fail_run("I/O error: cannot close '" + path + "' (its data could not be written: " +
             (discard ? "a write failed before" : "the disk refused the last of it") + ")");
}

bool is_hdf5_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  htri_t r = -1;
  H5E_BEGIN_TRY { r = H5Fis_hdf5(path.c_str()); }
  H5E_END_TRY;
  return r > 0;
}

hid_t open_read_only(const std::string& path) {
  quiet_error_stack();
  hid_t f = -1;
  if (is_hdf5_file(path)) {
    H5E_BEGIN_TRY { f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT); }
    H5E_END_TRY;
  }
  if (f < 0) throw std::runtime_error("cannot open '" + path + "' as an HDF5 file");
  return f;
}

hid_t open_user_file(const std::string& path, const std::string& prefix) {
  std::error_code ec;
  namespace fs = std::filesystem;
  if (!fs::is_regular_file(path, ec))
    throw UsageError(prefix + (fs::is_directory(path, ec) ? "is a directory"
                               : fs::exists(path, ec)     ? "is not a regular file"
                                                          : "no such file") +
                     "; valid: an HDF5 file");
  try {
    return open_read_only(path);
  } catch (const std::runtime_error&) {
    throw UsageError(prefix + "cannot open as an HDF5 file; valid: an HDF5 file (h5dump -H shows its contents)");
  }
}

hid_t open_group(hid_t file, const std::string& path, const std::string& fname) {
  if (path == "/" || path.empty()) return check(H5Gopen2(file, "/", H5P_DEFAULT), "H5Gopen2 /", fname);
  make_parents(file, path + "/", fname);
  return check(H5Gopen2(file, path.c_str(), H5P_DEFAULT), "H5Gopen2 " + path, fname);
}

void make_parents(hid_t file, const std::string& name, const std::string& fname) {
  for (size_t p = name.find('/', 1); p != std::string::npos; p = name.find('/', p + 1)) {
    const std::string g = name.substr(0, p);
    if (H5Lexists(file, g.c_str(), H5P_DEFAULT) > 0) continue;
    Handle id(check(H5Gcreate2(file, g.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "H5Gcreate2 " + g, fname),
              H5Gclose);
  }
}

hid_t open_object(hid_t file, const std::string& obj, const std::string& fname) {
  if (obj != "/" && H5Lexists(file, obj.c_str(), H5P_DEFAULT) > 0)
    return check(H5Oopen(file, obj.c_str(), H5P_DEFAULT), "H5Oopen " + obj, fname);
  return open_group(file, obj, fname);
}

bool has_link(hid_t file, const std::string& name) {
  for (size_t p = name.find('/', 1); p != std::string::npos; p = name.find('/', p + 1))
    if (H5Lexists(file, name.substr(0, p).c_str(), H5P_DEFAULT) <= 0) return false;
  return H5Lexists(file, name.c_str(), H5P_DEFAULT) > 0;
}

bool is_dataset(hid_t file, const std::string& name) {
  if (!has_link(file, name)) return false;
  hid_t d = -1;
  H5E_BEGIN_TRY { d = H5Dopen2(file, name.c_str(), H5P_DEFAULT); }
  H5E_END_TRY;
  if (d < 0) return false;
  H5Dclose(d);
  return true;
}

hid_t vlen_string_type() {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

hid_t bool_enum_type() {
  hid_t t = H5Tenum_create(H5T_NATIVE_INT8);
  int8_t v = 0;
  H5Tenum_insert(t, "FALSE", &v);
  v = 1;
  H5Tenum_insert(t, "TRUE", &v);
  return t;
}

void write_attr(hid_t obj, const std::string& name, hid_t type, hid_t space, const void* data, const std::string& fname) {
  if (H5Aexists(obj, name.c_str()) > 0) check_status(H5Adelete(obj, name.c_str()), "H5Adelete " + name, fname);
  Handle a(check(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), "H5Acreate2 " + name, fname),
           H5Aclose);
  check_status(H5Awrite(a.get(), type, data), "H5Awrite " + name, fname);
}

void attr_string(hid_t obj, const std::string& name, const std::string& value, Str enc, const std::string& fname) {
  Handle s(H5Screate(H5S_SCALAR), H5Sclose);
  if (enc == Str::vlen_utf8) {
    Handle t(vlen_string_type(), H5Tclose);
    const char* p = value.c_str();
    write_attr(obj, name, t.get(), s.get(), &p, fname);
  } else {
    Handle t(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(t.get(), std::max<size_t>(value.size(), 1));
    H5Tset_strpad(t.get(), H5T_STR_NULLPAD);
    write_attr(obj, name, t.get(), s.get(), value.empty() ? "" : value.data(), fname);
  }
}

void attr_i64(hid_t obj, const std::string& name, int64_t value, const std::string& fname) {
  Handle s(H5Screate(H5S_SCALAR), H5Sclose);
  write_attr(obj, name, H5T_NATIVE_INT64, s.get(), &value, fname);
}

void attr_f64(hid_t obj, const std::string& name, double value, const std::string& fname) {
  Handle s(H5Screate(H5S_SCALAR), H5Sclose);
  write_attr(obj, name, H5T_NATIVE_DOUBLE, s.get(), &value, fname);
}

std::string read_attr_int(hid_t obj, const std::string& name, int64_t& out) {
  if (H5Aexists(obj, name.c_str()) <= 0) return "is missing";
  Handle a(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (a.get() < 0) return "cannot be opened";
  Handle sp(H5Aget_space(a.get()), H5Sclose);
  if (H5Sget_simple_extent_npoints(sp.get()) != 1) return "is not a single value";
  Handle t(H5Aget_type(a.get()), H5Tclose);
  const H5T_class_t c = H5Tget_class(t.get());
  if (c == H5T_INTEGER) return H5Aread(a.get(), H5T_NATIVE_INT64, &out) >= 0 ? "" : "cannot be read as an integer";
  if (c != H5T_FLOAT) return "is not a number";
  double x = 0;
  if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, &x) < 0) return "cannot be read as a number";
  if (!std::isfinite(x) || x != std::floor(x) || std::fabs(x) > 9.0e18) return "is not a whole number (" + std::to_string(x) + ")";
  out = int64_t(x);
  return "";
}

bool read_attr_string(hid_t obj, const std::string& name, std::string& out) {
  if (H5Aexists(obj, name.c_str()) <= 0) return false;
  Handle a(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  Handle t(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(t.get()) != H5T_STRING) return false;
  if (H5Tis_variable_str(t.get()) > 0) {
    Handle mt(vlen_string_type(), H5Tclose);
    char* p = nullptr;
    if (H5Aread(a.get(), mt.get(), &p) < 0) return false;
    out = p ? p : "";
    H5free_memory(p);
    return true;
  }
  // One byte more than stored: the memory type is null-terminated, a stored null-padded string may
  // use its whole size.
  std::string s(H5Tget_size(t.get()) + 1, '\0');
  Handle mt(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mt.get(), s.size());
  if (H5Aread(a.get(), mt.get(), s.data()) < 0) return false;
  out = s.c_str();  // up to the padding
  return true;
}

void write_dataset(hid_t file, const std::string& path, hid_t mem_t, hid_t file_t, const std::vector<hsize_t>& dims,
                   const void* data, const std::string& fname) {
  if (dims.empty()) throw std::runtime_error("dataset " + path + ": no dimensions given");
  make_parents(file, path, fname);
  if (H5Lexists(file, path.c_str(), H5P_DEFAULT) > 0)
    check_status(H5Ldelete(file, path.c_str(), H5P_DEFAULT), "H5Ldelete " + path, fname);
  Handle space(check(H5Screate_simple(int(dims.size()), dims.data(), nullptr), "H5Screate_simple", fname), H5Sclose);
  Handle ds(check(H5Dcreate2(file, path.c_str(), file_t, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                  "H5Dcreate2 " + path, fname),
            H5Dclose);
  check_status(H5Dwrite(ds.get(), mem_t, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dwrite " + path, fname);
}

std::vector<hsize_t> dims_of(hid_t file, const std::string& name, const std::string& fname) {
  Handle d(check(H5Dopen2(file, name.c_str(), H5P_DEFAULT), "H5Dopen2 " + name, fname), H5Dclose);
  Handle sp(check(H5Dget_space(d.get()), "H5Dget_space", fname), H5Sclose);
  const int n = H5Sget_simple_extent_ndims(sp.get());
  std::vector<hsize_t> dims(size_t(std::max(n, 0)));
  if (n > 0) H5Sget_simple_extent_dims(sp.get(), dims.data(), nullptr);
  return dims;
}

void read_block(hid_t file, const std::string& name, const std::vector<hsize_t>& start,
                const std::vector<hsize_t>& count, hid_t mem_t, void* out, const std::string& fname) {
  Handle d(check(H5Dopen2(file, name.c_str(), H5P_DEFAULT), "H5Dopen2 " + name, fname), H5Dclose);
  Handle fs(check(H5Dget_space(d.get()), "H5Dget_space", fname), H5Sclose);
  check_status(H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
               "H5Sselect_hyperslab " + name, fname);
  Handle ms(check(H5Screate_simple(int(count.size()), count.data(), nullptr), "H5Screate_simple", fname), H5Sclose);
  check_status(H5Dread(d.get(), mem_t, ms.get(), fs.get(), H5P_DEFAULT, out), "H5Dread " + name, fname);
}

}  // namespace ctxpar::h5
