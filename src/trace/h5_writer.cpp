#include "trace/h5_writer.hpp"

#include <hdf5.h>

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <system_error>
#include <type_traits>

namespace ctxpar {

static_assert(std::is_same_v<hid_t, int64_t>, "h5_writer.hpp stores hid_t as int64_t (HDF5 >= 1.10)");

using trace_detail::RankStepRow;
using trace_detail::StepRow;

namespace {

// Every HDF5 call that can fail goes through here: a negative id/status becomes an exception
// naming the call and the file (HDF5's own error stack is printed to stderr as well).
[[noreturn]] void h5_fail(const std::string& what, const std::string& file) {
  throw std::runtime_error("HDF5: " + what + " failed (file " + file + ")");
}
hid_t h5c(hid_t id, const std::string& what, const std::string& file) {
  if (id < 0) h5_fail(what, file);
  return id;
}
void h5s(herr_t st, const std::string& what, const std::string& file) {
  if (st < 0) h5_fail(what, file);
}

// Closes an HDF5 object on scope exit (attributes, spaces, types, groups, property lists).
struct Closer {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Closer() {
    if (id >= 0) close(id);
  }
};

hid_t vlen_string_type() {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

hid_t bool_enum_type() {
  // The layout h5py uses for numpy.bool_: an int8 enum with members FALSE = 0, TRUE = 1.
  hid_t t = H5Tenum_create(H5T_NATIVE_INT8);
  int8_t v = 0;
  H5Tenum_insert(t, "FALSE", &v);
  v = 1;
  H5Tenum_insert(t, "TRUE", &v);
  return t;
}

struct Member {
  const char* name;
  size_t mem_offset;
  hid_t mem_type;   // native type
  hid_t file_type;  // little-endian standard type
};

// Memory type with the struct's layout (padding skipped by naming only real members) and a
// packed file type with the same member names.
void make_compound(const std::vector<Member>& members, size_t mem_size, hid_t& mem_t, hid_t& file_t) {
  mem_t = H5Tcreate(H5T_COMPOUND, mem_size);
  size_t file_size = 0;
  for (const Member& m : members) {
    H5Tinsert(mem_t, m.name, m.mem_offset, m.mem_type);
    file_size += H5Tget_size(m.file_type);
  }
  file_t = H5Tcreate(H5T_COMPOUND, file_size);
  size_t off = 0;
  for (const Member& m : members) {
    H5Tinsert(file_t, m.name, off, m.file_type);
    off += H5Tget_size(m.file_type);
  }
}

hid_t create_table(hid_t file, const char* name, hid_t file_t, hsize_t chunk_rows,
                   const std::string& path) {
  hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunk[1] = {chunk_rows};
  hid_t space = h5c(H5Screate_simple(1, dims, maxdims), "H5Screate_simple", path);
  Closer cs{space, H5Sclose};
  hid_t dcpl = h5c(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate", path);
  Closer cp{dcpl, H5Pclose};
  h5s(H5Pset_chunk(dcpl, 1, chunk), "H5Pset_chunk", path);
  return h5c(H5Dcreate2(file, name, file_t, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
             std::string("H5Dcreate2 ") + name, path);
}

void append_rows(hid_t dset, hid_t mem_t, const void* data, size_t n, const std::string& path) {
  if (n == 0) return;
  hid_t fspace = h5c(H5Dget_space(dset), "H5Dget_space", path);
  hsize_t old_n = 0;
  H5Sget_simple_extent_dims(fspace, &old_n, nullptr);
  H5Sclose(fspace);
  hsize_t new_n[1] = {old_n + n};
  h5s(H5Dset_extent(dset, new_n), "H5Dset_extent", path);
  fspace = h5c(H5Dget_space(dset), "H5Dget_space", path);
  Closer cf{fspace, H5Sclose};
  hsize_t start[1] = {old_n}, count[1] = {n};
  h5s(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr),
      "H5Sselect_hyperslab", path);
  hid_t mspace = h5c(H5Screate_simple(1, count, nullptr), "H5Screate_simple", path);
  Closer cm{mspace, H5Sclose};
  h5s(H5Dwrite(dset, mem_t, mspace, fspace, H5P_DEFAULT, data), "H5Dwrite (append)", path);
}

// Opens the group at `path`, creating it (and its parents) when missing.
hid_t open_or_create_group(hid_t file, const std::string& path, const std::string& fname) {
  if (path == "/") return h5c(H5Gopen2(file, "/", H5P_DEFAULT), "H5Gopen2 /", fname);
  std::string partial;
  size_t pos = 1;
  while (true) {
    size_t next = path.find('/', pos);
    partial = path.substr(0, next);
    if (H5Lexists(file, partial.c_str(), H5P_DEFAULT) <= 0) {
      hid_t g = h5c(H5Gcreate2(file, partial.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                    "H5Gcreate2 " + partial, fname);
      H5Gclose(g);
    }
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return h5c(H5Gopen2(file, path.c_str(), H5P_DEFAULT), "H5Gopen2 " + path, fname);
}

// Opens the object at `obj`: an existing dataset or group, else a new group.
hid_t open_object(hid_t file, const std::string& obj, const std::string& fname) {
  if (obj != "/" && H5Lexists(file, obj.c_str(), H5P_DEFAULT) > 0)
    return h5c(H5Oopen(file, obj.c_str(), H5P_DEFAULT), "H5Oopen " + obj, fname);
  return open_or_create_group(file, obj, fname);
}

void write_attr(hid_t file, const std::string& obj, const std::string& name, hid_t type,
                hid_t space, const void* data, const std::string& fname) {
  hid_t o = open_object(file, obj, fname);
  Closer co{o, H5Oclose};
  if (H5Aexists(o, name.c_str()) > 0)
    h5s(H5Adelete(o, name.c_str()), "H5Adelete " + obj + "@" + name, fname);
  hid_t a = h5c(H5Acreate2(o, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT),
                "H5Acreate2 " + obj + "@" + name, fname);
  Closer ca{a, H5Aclose};
  h5s(H5Awrite(a, type, data), "H5Awrite " + obj + "@" + name, fname);
}

void write_dataset(hid_t file, const std::string& path, hid_t mem_t, hid_t file_t,
                   const std::vector<uint64_t>& dims, const void* data, const std::string& fname) {
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    hid_t g = open_or_create_group(file, path.substr(0, slash), fname);
    H5Gclose(g);
  }
  if (H5Lexists(file, path.c_str(), H5P_DEFAULT) > 0)
    h5s(H5Ldelete(file, path.c_str(), H5P_DEFAULT), "H5Ldelete " + path, fname);
  std::vector<hsize_t> d(dims.begin(), dims.end());
  if (d.empty()) throw std::runtime_error("dataset " + path + ": no dimensions given");
  hid_t space = h5c(H5Screate_simple(int(d.size()), d.data(), nullptr), "H5Screate_simple", fname);
  Closer cs{space, H5Sclose};
  hid_t ds = h5c(H5Dcreate2(file, path.c_str(), file_t, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                 "H5Dcreate2 " + path, fname);
  Closer cd{ds, H5Dclose};
  h5s(H5Dwrite(ds, mem_t, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dwrite " + path, fname);
}

void span_types(hid_t& mem_t, hid_t& file_t) {
  make_compound({{"step", offsetof(SpanRecord, step), H5T_NATIVE_INT32, H5T_STD_I32LE},
                 {"layer", offsetof(SpanRecord, layer), H5T_NATIVE_INT32, H5T_STD_I32LE},
                 {"phase", offsetof(SpanRecord, phase), H5T_NATIVE_INT32, H5T_STD_I32LE},
                 {"ring_step", offsetof(SpanRecord, ring_step), H5T_NATIVE_INT32, H5T_STD_I32LE},
                 {"rank", offsetof(SpanRecord, rank), H5T_NATIVE_INT32, H5T_STD_I32LE},
                 {"t_begin_us", offsetof(SpanRecord, t_begin_us), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE},
                 {"t_end_us", offsetof(SpanRecord, t_end_us), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE},
                 {"flops", offsetof(SpanRecord, flops), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE},
                 {"bytes", offsetof(SpanRecord, bytes), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE}},
                sizeof(SpanRecord), mem_t, file_t);
}

void step_types(hid_t& mem_t, hid_t& file_t) {
  make_compound({{"step", offsetof(StepRow, step), H5T_NATIVE_INT64, H5T_STD_I64LE},
                 {"time_s", offsetof(StepRow, time_s), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE},
                 {"tokens", offsetof(StepRow, tokens), H5T_NATIVE_INT64, H5T_STD_I64LE},
                 {"model_flops", offsetof(StepRow, model_flops), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE},
                 {"mfu", offsetof(StepRow, mfu), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE},
                 {"tflops_per_rank", offsetof(StepRow, tflops_per_rank), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE},
                 {"exposed_comm_s", offsetof(StepRow, exposed_comm_s), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE},
                 {"peak_bytes", offsetof(StepRow, peak_bytes), H5T_NATIVE_INT64, H5T_STD_I64LE},
                 {"peak_rss_bytes", offsetof(StepRow, peak_rss_bytes), H5T_NATIVE_INT64, H5T_STD_I64LE},
                 {"loss", offsetof(StepRow, loss), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE},
                 {"turn", offsetof(StepRow, turn), H5T_NATIVE_INT32, H5T_STD_I32LE},
                 {"ttft_s", offsetof(StepRow, ttft_s), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE},
                 {"ttit_s", offsetof(StepRow, ttit_s), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE}},
                sizeof(StepRow), mem_t, file_t);
}

void rank_step_types(hid_t& mem_t, hid_t& file_t) {
  make_compound({{"step", offsetof(RankStepRow, step), H5T_NATIVE_INT64, H5T_STD_I64LE},
                 {"rank", offsetof(RankStepRow, rank), H5T_NATIVE_INT32, H5T_STD_I32LE},
                 {"time_s", offsetof(RankStepRow, time_s), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE},
                 {"exposed_comm_s", offsetof(RankStepRow, exposed_comm_s), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE},
                 {"peak_bytes", offsetof(RankStepRow, peak_bytes), H5T_NATIVE_INT64, H5T_STD_I64LE},
                 {"peak_rss_bytes", offsetof(RankStepRow, peak_rss_bytes), H5T_NATIVE_INT64, H5T_STD_I64LE}},
                sizeof(RankStepRow), mem_t, file_t);
}

}  // namespace

H5TraceWriter::H5TraceWriter(const std::string& final_path)
    : final_path_(final_path), partial_path_(final_path + ".partial") {
  namespace fs = std::filesystem;
  if (final_path.empty()) throw std::runtime_error("trace output path is empty");
  const fs::path parent = fs::path(final_path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec)
      throw std::runtime_error("cannot create directory '" + parent.string() + "' for the trace: " +
                               ec.message());
  }
  if (fs::is_directory(final_path))
    throw std::runtime_error("trace output '" + final_path + "' is a directory");
  file_ = H5Fcreate(partial_path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file_ < 0) throw std::runtime_error("cannot create trace file '" + partial_path_ + "'");
  span_types(span_mem_t_, span_file_t_);
  step_types(step_mem_t_, step_file_t_);
  rank_step_types(rank_step_mem_t_, rank_step_file_t_);
  // Chunk sizes: spans arrive by the hundreds per step; steps and per-rank rows are few.
  spans_ = create_table(file_, "/spans", span_file_t_, 4096, partial_path_);
  steps_ = create_table(file_, "/steps", step_file_t_, 64, partial_path_);
  rank_steps_ = create_table(file_, "/rank_steps", rank_step_file_t_, 256, partial_path_);
}

H5TraceWriter::~H5TraceWriter() { close_all(); }

void H5TraceWriter::close_all() {
  for (int64_t* d : {&spans_, &steps_, &rank_steps_}) {
    if (*d >= 0) H5Dclose(*d);
    *d = -1;
  }
  for (int64_t* t : {&span_mem_t_, &span_file_t_, &step_mem_t_, &step_file_t_, &rank_step_mem_t_,
                     &rank_step_file_t_}) {
    if (*t >= 0) H5Tclose(*t);
    *t = -1;
  }
  if (file_ >= 0) H5Fclose(file_);
  file_ = -1;
}

void H5TraceWriter::attr(const std::string& obj, const std::string& name, const std::string& value) {
  hid_t t = vlen_string_type();
  Closer ct{t, H5Tclose};
  hid_t s = H5Screate(H5S_SCALAR);
  Closer cs{s, H5Sclose};
  const char* p = value.c_str();
  write_attr(file_, obj, name, t, s, &p, partial_path_);
}

void H5TraceWriter::attr(const std::string& obj, const std::string& name, int64_t value) {
  hid_t s = H5Screate(H5S_SCALAR);
  Closer cs{s, H5Sclose};
  write_attr(file_, obj, name, H5T_NATIVE_INT64, s, &value, partial_path_);
}

void H5TraceWriter::attr(const std::string& obj, const std::string& name, double value) {
  hid_t s = H5Screate(H5S_SCALAR);
  Closer cs{s, H5Sclose};
  write_attr(file_, obj, name, H5T_NATIVE_DOUBLE, s, &value, partial_path_);
}

void H5TraceWriter::attr_bool(const std::string& obj, const std::string& name, bool value) {
  hid_t t = bool_enum_type();
  Closer ct{t, H5Tclose};
  hid_t s = H5Screate(H5S_SCALAR);
  Closer cs{s, H5Sclose};
  int8_t v = value ? 1 : 0;
  write_attr(file_, obj, name, t, s, &v, partial_path_);
}

void H5TraceWriter::attr_strings(const std::string& obj, const std::string& name,
                                 const std::vector<std::string>& values) {
  hid_t t = vlen_string_type();
  Closer ct{t, H5Tclose};
  hsize_t n[1] = {values.size()};
  hid_t s = H5Screate_simple(1, n, nullptr);
  Closer cs{s, H5Sclose};
  std::vector<const char*> ptrs;
  for (const std::string& v : values) ptrs.push_back(v.c_str());
  write_attr(file_, obj, name, t, s, ptrs.data(), partial_path_);
}

namespace {
void check_dims(const std::string& path, size_t n, const std::vector<uint64_t>& dims) {
  uint64_t prod = 1;
  for (uint64_t d : dims) prod *= d;
  if (dims.empty() || prod != n)
    throw std::runtime_error("dataset " + path + ": " + std::to_string(n) +
                             " values do not fill the given dimensions");
}
}  // namespace

void H5TraceWriter::dataset_i32(const std::string& path, const std::vector<int32_t>& data,
                                const std::vector<uint64_t>& dims) {
  check_dims(path, data.size(), dims);
  write_dataset(file_, path, H5T_NATIVE_INT32, H5T_STD_I32LE, dims, data.data(), partial_path_);
}

void H5TraceWriter::dataset_f64(const std::string& path, const std::vector<double>& data,
                                const std::vector<uint64_t>& dims) {
  check_dims(path, data.size(), dims);
  write_dataset(file_, path, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, dims, data.data(), partial_path_);
}

void H5TraceWriter::dataset_strings(const std::string& path, const std::vector<std::string>& data) {
  hid_t t = vlen_string_type();
  Closer ct{t, H5Tclose};
  std::vector<const char*> ptrs;
  for (const std::string& v : data) ptrs.push_back(v.c_str());
  write_dataset(file_, path, t, t, {uint64_t(data.size())}, ptrs.data(), partial_path_);
}

void H5TraceWriter::append_spans(const std::vector<SpanRecord>& rows) {
  append_rows(spans_, span_mem_t_, rows.data(), rows.size(), partial_path_);
}
void H5TraceWriter::append_steps(const std::vector<StepRow>& rows) {
  append_rows(steps_, step_mem_t_, rows.data(), rows.size(), partial_path_);
}
void H5TraceWriter::append_rank_steps(const std::vector<RankStepRow>& rows) {
  append_rows(rank_steps_, rank_step_mem_t_, rows.data(), rows.size(), partial_path_);
}

void H5TraceWriter::flush() { h5s(H5Fflush(file_, H5F_SCOPE_GLOBAL), "H5Fflush", partial_path_); }

void H5TraceWriter::close_and_rename() {
  if (file_ < 0) throw std::runtime_error("trace file '" + partial_path_ + "' is already closed");
  h5s(H5Fflush(file_, H5F_SCOPE_GLOBAL), "H5Fflush", partial_path_);
  close_all();
  std::error_code ec;
  // POSIX rename: atomic, replaces an older NAME.h5 only now that the new one is complete.
  std::filesystem::rename(partial_path_, final_path_, ec);
  if (ec)
    throw std::runtime_error("cannot rename '" + partial_path_ + "' to '" + final_path_ +
                             "': " + ec.message());
}

std::string hdf5_library_version() {
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  return std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel);
}

// ---- read-back ------------------------------------------------------------------------------

namespace {

template <class Row>
std::vector<Row> read_table(hid_t file, const char* name, hid_t mem_t, const std::string& path) {
  hid_t ds = h5c(H5Dopen2(file, name, H5P_DEFAULT), std::string("H5Dopen2 ") + name, path);
  Closer cd{ds, H5Dclose};
  hid_t sp = h5c(H5Dget_space(ds), "H5Dget_space", path);
  Closer cs{sp, H5Sclose};
  hsize_t n = 0;
  H5Sget_simple_extent_dims(sp, &n, nullptr);
  std::vector<Row> rows(n);
  if (n) h5s(H5Dread(ds, mem_t, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()), "H5Dread", path);
  return rows;
}

template <class T>
std::vector<T> read_flat(hid_t file, const char* name, hid_t mem_t, const std::string& path) {
  hid_t ds = h5c(H5Dopen2(file, name, H5P_DEFAULT), std::string("H5Dopen2 ") + name, path);
  Closer cd{ds, H5Dclose};
  hid_t sp = h5c(H5Dget_space(ds), "H5Dget_space", path);
  Closer cs{sp, H5Sclose};
  std::vector<T> v(size_t(H5Sget_simple_extent_npoints(sp)));
  if (!v.empty()) h5s(H5Dread(ds, mem_t, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), "H5Dread", path);
  return v;
}

hid_t open_attr(hid_t file, const char* obj, const char* name, const std::string& path) {
  return h5c(H5Aopen_by_name(file, obj, name, H5P_DEFAULT, H5P_DEFAULT),
             std::string("H5Aopen ") + obj + "@" + name, path);
}

template <class T> T read_scalar_attr(hid_t file, const char* obj, const char* name, hid_t mem_t,
                                      const std::string& path) {
  hid_t a = open_attr(file, obj, name, path);
  Closer ca{a, H5Aclose};
  T v{};
  h5s(H5Aread(a, mem_t, &v), std::string("H5Aread ") + name, path);
  return v;
}

std::string read_string_attr(hid_t file, const char* obj, const char* name, const std::string& path) {
  hid_t a = open_attr(file, obj, name, path);
  Closer ca{a, H5Aclose};
  hid_t t = vlen_string_type();
  Closer ct{t, H5Tclose};
  char* p = nullptr;
  h5s(H5Aread(a, t, &p), std::string("H5Aread ") + name, path);
  std::string s = p ? p : "";
  H5free_memory(p);
  return s;
}

}  // namespace

TraceDigest read_trace_digest(const std::string& path) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) throw std::runtime_error("cannot open trace file '" + path + "'");
  Closer cf{f, H5Fclose};
  TraceDigest d;
  d.schema_version = read_scalar_attr<int64_t>(f, "/", "schema_version", H5T_NATIVE_INT64, path);
  d.status = read_string_attr(f, "/", "status", path);
  d.steps_completed = read_scalar_attr<int64_t>(f, "/", "steps_completed", H5T_NATIVE_INT64, path);
  hid_t mt = -1, ft = -1;
  span_types(mt, ft);
  d.spans = read_table<SpanRecord>(f, "/spans", mt, path);
  H5Tclose(mt), H5Tclose(ft);
  step_types(mt, ft);
  d.steps = read_table<StepRow>(f, "/steps", mt, path);
  H5Tclose(mt), H5Tclose(ft);
  rank_step_types(mt, ft);
  d.rank_steps = read_table<RankStepRow>(f, "/rank_steps", mt, path);
  H5Tclose(mt), H5Tclose(ft);
  d.clock_offset_us = read_flat<double>(f, "/topology/clock_offset_us", H5T_NATIVE_DOUBLE, path);
  d.coords = read_flat<int32_t>(f, "/topology/coords", H5T_NATIVE_INT32, path);
  if (H5Lexists(f, "/summary", H5P_DEFAULT) > 0 &&
      H5Aexists_by_name(f, "/summary", "valid", H5P_DEFAULT) > 0) {
    hid_t bt = bool_enum_type();
    d.summary_valid = read_scalar_attr<int8_t>(f, "/summary", "valid", bt, path) != 0;
    H5Tclose(bt);
    d.summary_measured_steps =
        read_scalar_attr<int64_t>(f, "/summary", "measured_steps", H5T_NATIVE_INT64, path);
    d.summary_time_s_median =
        read_scalar_attr<double>(f, "/summary", "time_s_median", H5T_NATIVE_DOUBLE, path);
  }
  return d;
}

}  // namespace ctxpar
