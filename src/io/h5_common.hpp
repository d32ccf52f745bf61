// The HDF5 helpers of the I/O module, one set for every file it reads or writes (internal to
// src/io: the only place that includes hdf5.h). Every call that can fail goes through check(): a
// negative id or status becomes a std::runtime_error naming the call and the file (HDF5's own
// error stack goes to stderr as well). The callers turn those into their own error path.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace ctxpar::h5 {

[[noreturn]] void fail(const std::string& what, const std::string& file);
hid_t check(hid_t id, const std::string& what, const std::string& file);
void check_status(herr_t st, const std::string& what, const std::string& file);

// Closes an HDF5 object on scope exit (files, datasets, attributes, spaces, types, groups).
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5's automatic error-stack printing off, once per process (create_file and open_read_only
// call it; every file of src/io is opened through them).
void quiet_error_stack();
// Closes a file this process writes. `discard`: after a failed write, its contents to be thrown
// away: the file is emptied first, so the close's own flush has room on a full disk. A close that
// fails leaves HDF5 unable to go on (1.10 segfaults at its exit on such a file): fail_run.
void close_written_file(hid_t f, const std::string& path, bool discard);
// Creates the file (truncating), or opens it read-only: a file that is not HDF5 (or absent)
// throws std::runtime_error("... cannot open ...") without HDF5's error stack.
hid_t create_file(const std::string& path);
hid_t open_read_only(const std::string& path);
bool is_hdf5_file(const std::string& path);
// A file the user named: UsageError(prefix + "no such file" / "cannot open as an HDF5 file").
hid_t open_user_file(const std::string& path, const std::string& prefix);

// Runs f; an HDF5 failure (std::runtime_error) ends the run as a fault (core/error.hpp fail_run,
// exit 3): for the readers and writers whose inputs were validated before (a file changed since,
// a full disk).
template <class F> auto fatal_on_error(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::runtime_error& e) {
    fail_run(std::string("I/O error: ") + e.what());
  }
}
// Runs f; an HDF5 or file-system failure becomes a LocalFault ("I/O error: ..."): for the writers
// one rank runs while the others wait to agree (dist/comm.hpp run_then_agree).
template <class F> auto local_fault_on_error(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const LocalFault&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw LocalFault(std::string("I/O error: ") + e.what());
  }
}

// Groups: the one at `path` (created with its parents when missing); the parents of `name`.
hid_t open_group(hid_t file, const std::string& path, const std::string& fname);
void make_parents(hid_t file, const std::string& name, const std::string& fname);
// The object at `obj`: an existing dataset or group, else a new group.
hid_t open_object(hid_t file, const std::string& obj, const std::string& fname);
bool has_link(hid_t file, const std::string& name);  // every parent group checked too
bool is_dataset(hid_t file, const std::string& name);  // has_link, and not a group or a named type

// String attributes: variable-length UTF-8 (the trace, read by h5py as str) or fixed-length
// null-padded (tensor files and checkpoints, as h5py's numpy bytes).
enum class Str { vlen_utf8, fixed };
hid_t vlen_string_type();
hid_t bool_enum_type();  // numpy.bool_'s layout: an int8 enum {FALSE = 0, TRUE = 1}
// Writes attribute `name` of `obj` (replacing an existing one).
void write_attr(hid_t obj, const std::string& name, hid_t type, hid_t space, const void* data, const std::string& fname);
void attr_string(hid_t obj, const std::string& name, const std::string& value, Str enc, const std::string& fname);
void attr_i64(hid_t obj, const std::string& name, int64_t value, const std::string& fname);
void attr_f64(hid_t obj, const std::string& name, double value, const std::string& fname);
// Reads a string attribute of either encoding; false when absent or not a string.
bool read_attr_string(hid_t obj, const std::string& name, std::string& out);
// Reads an attribute that holds one whole number: an integer, or a float that is a finite whole
// number within int64. "" and the value, else what is wrong with it (never reads past one value:
// an array attribute is refused).
std::string read_attr_int(hid_t obj, const std::string& name, int64_t& out);

// A dataset at `path` (parents created; an existing one replaced), written whole.
void write_dataset(hid_t file, const std::string& path, hid_t mem_t, hid_t file_t, const std::vector<hsize_t>& dims,
                   const void* data, const std::string& fname);
// Dimensions of the dataset `name`.
std::vector<hsize_t> dims_of(hid_t file, const std::string& name, const std::string& fname);
// The hyperslab [start, start + count) of dataset `name`, converted to `mem_t`, into `out`.
void read_block(hid_t file, const std::string& name, const std::vector<hsize_t>& start,
                const std::vector<hsize_t>& count, hid_t mem_t, void* out, const std::string& fname);

}  // namespace ctxpar::h5
