// The trace file (trace/trace.hpp's writer and its read-back): compound tables appended per step,
// attributes, small datasets; crash-safe through io/atomic_file.
#include "io/h5_trace.hpp"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cstddef>
#include <stdexcept>
#include <type_traits>

#include "io/atomic_file.hpp"
#include "io/h5_common.hpp"
#include "io/io_lock.hpp"

namespace ctxpar {

static_assert(std::is_same_v<hid_t, int64_t>, "h5_trace.hpp stores hid_t as int64_t (HDF5 >= 1.10)");

using trace_detail::RankStepRow;
using trace_detail::StepRow;

namespace {

using h5::Handle;
using h5::check;
using h5::check_status;

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
  hid_t space = check(H5Screate_simple(1, dims, maxdims), "H5Screate_simple", path);
  Handle cs(space, H5Sclose);
  hid_t dcpl = check(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate", path);
  Handle cp(dcpl, H5Pclose);
  check_status(H5Pset_chunk(dcpl, 1, chunk), "H5Pset_chunk", path);
  return check(H5Dcreate2(file, name, file_t, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
             std::string("H5Dcreate2 ") + name, path);
}

void append_rows(hid_t dset, hid_t mem_t, const void* data, size_t n, const std::string& path) {
  if (n == 0) return;
  hid_t fspace = check(H5Dget_space(dset), "H5Dget_space", path);
  hsize_t old_n = 0;
  H5Sget_simple_extent_dims(fspace, &old_n, nullptr);
  H5Sclose(fspace);
  hsize_t new_n[1] = {old_n + n};
  check_status(H5Dset_extent(dset, new_n), "H5Dset_extent", path);
  fspace = check(H5Dget_space(dset), "H5Dget_space", path);
  Handle cf(fspace, H5Sclose);
  hsize_t start[1] = {old_n}, count[1] = {n};
  check_status(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr),
      "H5Sselect_hyperslab", path);
  hid_t mspace = check(H5Screate_simple(1, count, nullptr), "H5Screate_simple", path);
  Handle cm(mspace, H5Sclose);
  check_status(H5Dwrite(dset, mem_t, mspace, fspace, H5P_DEFAULT, data), "H5Dwrite (append)", path);
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
                 {"device_peak_bytes", offsetof(StepRow, device_peak_bytes), H5T_NATIVE_INT64, H5T_STD_I64LE},
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
                 {"peak_rss_bytes", offsetof(RankStepRow, peak_rss_bytes), H5T_NATIVE_INT64, H5T_STD_I64LE},
                 {"device_peak_bytes", offsetof(RankStepRow, device_peak_bytes), H5T_NATIVE_INT64, H5T_STD_I64LE}},
                sizeof(RankStepRow), mem_t, file_t);
}

}  // namespace

H5TraceWriter::H5TraceWriter(const std::string& final_path)
    : out_(std::make_unique<AtomicFile>(final_path, /*keep_abandoned=*/true)) {
  file_ = h5::create_file(out_->partial_path());
  struct stat st {};
  if (stat(out_->partial_path().c_str(), &st) == 0) dev_ = uint64_t(st.st_dev), ino_ = uint64_t(st.st_ino);
  span_types(span_mem_t_, span_file_t_);
  step_types(step_mem_t_, step_file_t_);
  rank_step_types(rank_step_mem_t_, rank_step_file_t_);
  // Chunk sizes: spans arrive by the hundreds per step; steps and per-rank rows are few.
  spans_ = create_table(file_, "/spans", span_file_t_, 4096, partial_path());
  steps_ = create_table(file_, "/steps", step_file_t_, 64, partial_path());
  rank_steps_ = create_table(file_, "/rank_steps", rank_step_file_t_, 256, partial_path());
}

const std::string& H5TraceWriter::final_path() const { return out_->final_path(); }
const std::string& H5TraceWriter::partial_path() const { return out_->partial_path(); }

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
  Handle o(h5::open_object(file_, obj, partial_path()), H5Oclose);
  h5::attr_string(o.get(), name, value, h5::Str::vlen_utf8, partial_path());
}

void H5TraceWriter::attr(const std::string& obj, const std::string& name, int64_t value) {
  Handle o(h5::open_object(file_, obj, partial_path()), H5Oclose);
  h5::attr_i64(o.get(), name, value, partial_path());
}

void H5TraceWriter::attr(const std::string& obj, const std::string& name, double value) {
  Handle o(h5::open_object(file_, obj, partial_path()), H5Oclose);
  h5::attr_f64(o.get(), name, value, partial_path());
}

void H5TraceWriter::attr_bool(const std::string& obj, const std::string& name, bool value) {
  Handle o(h5::open_object(file_, obj, partial_path()), H5Oclose);
  Handle t(h5::bool_enum_type(), H5Tclose);
  Handle s(H5Screate(H5S_SCALAR), H5Sclose);
  int8_t v = value ? 1 : 0;
  h5::write_attr(o.get(), name, t.get(), s.get(), &v, partial_path());
}

void H5TraceWriter::attr_strings(const std::string& obj, const std::string& name,
                                 const std::vector<std::string>& values) {
  Handle o(h5::open_object(file_, obj, partial_path()), H5Oclose);
  Handle t(h5::vlen_string_type(), H5Tclose);
  hsize_t n[1] = {values.size()};
  Handle s(H5Screate_simple(1, n, nullptr), H5Sclose);
  std::vector<const char*> ptrs;
  for (const std::string& v : values) ptrs.push_back(v.c_str());
  h5::write_attr(o.get(), name, t.get(), s.get(), ptrs.data(), partial_path());
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
  h5::write_dataset(file_, path, H5T_NATIVE_INT32, H5T_STD_I32LE, std::vector<hsize_t>(dims.begin(), dims.end()),
                    data.data(), partial_path());
}

void H5TraceWriter::dataset_f64(const std::string& path, const std::vector<double>& data,
                                const std::vector<uint64_t>& dims) {
  check_dims(path, data.size(), dims);
  h5::write_dataset(file_, path, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, std::vector<hsize_t>(dims.begin(), dims.end()),
                    data.data(), partial_path());
}

void H5TraceWriter::dataset_strings(const std::string& path, const std::vector<std::string>& data) {
  hid_t t = h5::vlen_string_type();
  Handle ct(t, H5Tclose);
  std::vector<const char*> ptrs;
  for (const std::string& v : data) ptrs.push_back(v.c_str());
  h5::write_dataset(file_, path, t, t, {hsize_t(data.size())}, ptrs.data(), partial_path());
}

void H5TraceWriter::append_spans(const std::vector<SpanRecord>& rows) {
  append_rows(spans_, span_mem_t_, rows.data(), rows.size(), partial_path());
}
void H5TraceWriter::append_steps(const std::vector<StepRow>& rows) {
  append_rows(steps_, step_mem_t_, rows.data(), rows.size(), partial_path());
}
void H5TraceWriter::append_rank_steps(const std::vector<RankStepRow>& rows) {
  append_rows(rank_steps_, rank_step_mem_t_, rows.data(), rows.size(), partial_path());
}

void H5TraceWriter::flush() { check_status(H5Fflush(file_, H5F_SCOPE_GLOBAL), "H5Fflush", partial_path()); }

int64_t H5TraceWriter::file_bytes() const {
  struct stat st {};
  return stat(partial_path().c_str(), &st) == 0 ? int64_t(st.st_size) : -1;
}

int64_t H5TraceWriter::free_bytes() const {
  struct statvfs s {};
  if (statvfs(partial_path().c_str(), &s) != 0) return -1;
  return int64_t(s.f_bavail) * int64_t(s.f_frsize);
}

std::string H5TraceWriter::moved() const {
  struct stat st {};
  if (stat(partial_path().c_str(), &st) == 0 && uint64_t(st.st_dev) == dev_ && uint64_t(st.st_ino) == ino_) return "";
  return "'" + partial_path() + "' is no longer where this run created it (its directory was moved or removed, or " +
         "the file renamed, while the run went on); the trace cannot be placed at '" + final_path() + "'";
}

void H5TraceWriter::close_and_rename() {
  if (file_ < 0) throw std::runtime_error("trace file '" + partial_path() + "' is already closed");
  check_status(H5Fflush(file_, H5F_SCOPE_GLOBAL), "H5Fflush", partial_path());
  close_all();
  // Read back before it is placed: a file another process wrote into meanwhile (same inode) must
  // not be published as this run's trace.
  bool whole = false;
  try {
    Handle f(h5::open_read_only(partial_path()), H5Fclose);
    if (H5Lexists(f.get(), "steps", H5P_DEFAULT) > 0) {  // its object header too: a zeroed one fails here
      H5E_BEGIN_TRY { Handle d(H5Dopen2(f.get(), "steps", H5P_DEFAULT), H5Dclose); whole = d.get() >= 0; }
      H5E_END_TRY;
    }
  } catch (const std::runtime_error&) {
  }
  if (!whole)
    throw std::runtime_error("'" + partial_path() + "' was written into by another process while this run went on " +
                             "(it no longer reads as this run's trace); left as it is, not placed at '" + final_path() + "'");
  out_->commit();  // replaces an older NAME.h5 only now that the new one is complete
}

std::string hdf5_library_version() {
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  return std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel);
}

// ---- read-back ------------------------------------------------------------------------------

namespace {

// Every element of dataset `name` (a table's rows, or a flattened array).
template <class T>
std::vector<T> read_flat(hid_t file, const char* name, hid_t mem_t, const std::string& path) {
  hid_t ds = check(H5Dopen2(file, name, H5P_DEFAULT), std::string("H5Dopen2 ") + name, path);
  Handle cd(ds, H5Dclose);
  hid_t sp = check(H5Dget_space(ds), "H5Dget_space", path);
  Handle cs(sp, H5Sclose);
  std::vector<T> v(size_t(H5Sget_simple_extent_npoints(sp)));
  if (!v.empty()) check_status(H5Dread(ds, mem_t, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), "H5Dread", path);
  return v;
}

hid_t open_attr(hid_t file, const char* obj, const char* name, const std::string& path) {
  return check(H5Aopen_by_name(file, obj, name, H5P_DEFAULT, H5P_DEFAULT),
             std::string("H5Aopen ") + obj + "@" + name, path);
}

template <class T> T read_scalar_attr(hid_t file, const char* obj, const char* name, hid_t mem_t,
                                      const std::string& path) {
  hid_t a = open_attr(file, obj, name, path);
  Handle ca(a, H5Aclose);
  Handle sp(H5Aget_space(a), H5Sclose);
  if (H5Sget_simple_extent_npoints(sp.get()) != 1) h5::fail(std::string("attribute ") + name + " is not one value", path);
  T v{};
  check_status(H5Aread(a, mem_t, &v), std::string("H5Aread ") + name, path);
  return v;
}

std::string read_string_attr(hid_t file, const char* obj, const char* name, const std::string& path) {
  Handle o(check(H5Oopen(file, obj, H5P_DEFAULT), std::string("H5Oopen ") + obj, path), H5Oclose);
  std::string s;
  if (!h5::read_attr_string(o.get(), name, s)) h5::fail(std::string("H5Aread ") + obj + "@" + name, path);
  return s;
}

}  // namespace

TraceDigest read_trace_digest(const std::string& path) {
  const IoLock lock = io_lock();
  const hid_t f = h5::open_read_only(path);
  Handle cf(f, H5Fclose);
  TraceDigest d;
  d.schema_version = read_scalar_attr<int64_t>(f, "/", "schema_version", H5T_NATIVE_INT64, path);
  d.status = read_string_attr(f, "/", "status", path);
  d.steps_completed = read_scalar_attr<int64_t>(f, "/", "steps_completed", H5T_NATIVE_INT64, path);
  hid_t mt = -1, ft = -1;
  span_types(mt, ft);
  d.spans = read_flat<SpanRecord>(f, "/spans", mt, path);
  H5Tclose(mt), H5Tclose(ft);
  step_types(mt, ft);
  d.steps = read_flat<StepRow>(f, "/steps", mt, path);
  H5Tclose(mt), H5Tclose(ft);
  rank_step_types(mt, ft);
  d.rank_steps = read_flat<RankStepRow>(f, "/rank_steps", mt, path);
  H5Tclose(mt), H5Tclose(ft);
  d.clock_offset_us = read_flat<double>(f, "/topology/clock_offset_us", H5T_NATIVE_DOUBLE, path);
  d.coords = read_flat<int32_t>(f, "/topology/coords", H5T_NATIVE_INT32, path);
  if (H5Lexists(f, "/summary", H5P_DEFAULT) > 0 &&
      H5Aexists_by_name(f, "/summary", "valid", H5P_DEFAULT) > 0) {
    hid_t bt = h5::bool_enum_type();
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
