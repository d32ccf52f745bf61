// The parallel checkpoint writer (io/h5_checkpoint.hpp h5_write_tensors_parallel): HDF5's MPI-IO
// driver, every rank writing its parts of each dataset into one file.
//
// Every call that HDF5 makes collective (file create and close, group, dataset and attribute
// creation) is made by every rank in the same order whatever happened before on that rank, so a
// failure on one rank never leaves the others waiting in a collective; the data transfers are
// independent (a rank's parts need no other rank). The ranks then agree on the outcome before
// rank 0 renames the file.
#include <mpi.h>
#include <sys/statvfs.h>

#include <filesystem>
#include <memory>
#include <stdexcept>

#include "core/error.hpp"
#include "io/atomic_file.hpp"
#include "io/h5_checkpoint.hpp"
#include "io/h5_common.hpp"
#include "io/io_lock.hpp"

namespace ctxpar {

using h5::Handle;

namespace {

// The first failure of this rank (later ones are consequences).
struct Status {
  std::string err;
  void fail(const std::string& what) {
    if (err.empty()) err = what;
  }
  void check(herr_t st, const std::string& what) {
    if (st < 0) fail(what);
  }
};

// After a failed write: ": no space left on device" when the file system of `path` has less
// than 1 MiB left (a full disk), else "".
std::string space_note(const std::string& path) {
  struct statvfs v {};
  if (statvfs(path.c_str(), &v) != 0) return "";
  return double(v.f_bavail) * double(v.f_frsize) < double(1 << 20) ? ": no space left on device" : "";
}

// This rank's parts of one dataset as a union of blocks of the file's dataspace: a run of a
// slice's row-major elements is a partial first row, whole rows (one block), a partial last row.
void select_parts(hid_t space, const std::vector<H5SlicePart>& parts, Status& st) {
  H5Sselect_none(space);
  for (const H5SlicePart& p : parts) {
    int64_t e = p.first;
    const int64_t end = p.first + p.n;
    while (e < end) {
      const int64_t r = e / p.width, c = e % p.width;
      // a partial row, or as many whole rows as the run holds
      const int64_t rows = c == 0 ? std::max<int64_t>(1, (end - e) / p.width) : 1;
      const int64_t cols = c == 0 && (end - e) >= p.width ? p.width : std::min(p.width - c, end - e);
      const hsize_t start[2] = {hsize_t(p.row0 + r), hsize_t(p.col0 + c)}, count[2] = {hsize_t(rows), hsize_t(cols)};
      st.check(H5Sselect_hyperslab(space, H5S_SELECT_OR, start, nullptr, count, nullptr), "H5Sselect_hyperslab");
      e += rows * cols;
    }
  }
}

// Writes one dataset collectively created; this rank's parts (their data gathered in order).
void write_tensor(hid_t f, const H5SharedTensor& t, hid_t dxpl, std::vector<float>& buf, Status& st,
                  const std::string& fname) {
  try {
    h5::make_parents(f, t.name, fname);
  } catch (const std::runtime_error& e) {
    st.fail(e.what());
  }
  const hsize_t dims[2] = {hsize_t(t.rows), hsize_t(t.cols)};
  Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  Handle ds(H5Dcreate2(f, t.name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (ds.get() < 0) return st.fail("H5Dcreate2 " + t.name);
  int64_t n = 0;
  for (const H5SlicePart& p : t.parts) n += p.n;
  if (n == 0) return;
  select_parts(space.get(), t.parts, st);
  buf.clear();
  for (const H5SlicePart& p : t.parts) buf.insert(buf.end(), p.data, p.data + p.n);
  const hsize_t m = hsize_t(n);
  Handle mem(H5Screate_simple(1, &m, nullptr), H5Sclose);
  st.check(H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), dxpl, buf.data()), "H5Dwrite " + t.name);
}

}  // namespace

void h5_write_tensors_parallel(const std::string& path, const H5Attrs& attrs,
                               const std::vector<H5SharedTensor>& tensors, const void* comm_handle) {
  const MPI_Comm comm = *static_cast<const MPI_Comm*>(comm_handle);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const IoLock lock = io_lock();
  h5::quiet_error_stack();
  Status st;
  // Rank 0 prepares the place (parent directory, a stale partial file removed) and renames at the end.
  std::unique_ptr<AtomicFile> out;
  if (rank == 0) {
    try {
      out = std::make_unique<AtomicFile>(path, /*keep_abandoned=*/false);
    } catch (const std::runtime_error& e) {
      st.fail(e.what());
    }
  }
  int ok = st.err.empty() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
  if (!ok) {
    if (!st.err.empty()) throw LocalFault("checkpoint: " + st.err);
    return;  // rank 0's fault, which the caller's agreement reports
  }
  const std::string tmp = path + ".partial";  // AtomicFile's partial path
  std::string note;                            // the cause, where it is known
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  st.check(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL), "H5Pset_fapl_mpio");
  Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  st.check(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_INDEPENDENT), "H5Pset_dxpl_mpio");
  const hid_t f = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());  // collective
  if (f < 0) {
    st.fail("cannot create '" + tmp + "'");
  } else {
    try {  // attributes: collective, the same values on every rank
      for (const auto& [k, v] : attrs.ints) h5::attr_i64(f, k, v, tmp);
      for (const auto& [k, v] : attrs.doubles) h5::attr_f64(f, k, v, tmp);
      for (const auto& [k, v] : attrs.strings) h5::attr_string(f, k, v, h5::Str::fixed, tmp);
    } catch (const std::runtime_error& e) {
      st.fail(e.what());
    }
    std::vector<float> buf;
    for (const H5SharedTensor& t : tensors) write_tensor(f, t, dxpl.get(), buf, st, tmp);
    // A failed write (a full disk): rank 0 empties the file first, so that the close's metadata
    // flush finds room and the file leaves HDF5's table (a file HDF5 could not close is closed
    // again at MPI_Finalize, where the MPI-IO driver no longer can: a crash).
    ok = st.err.empty() ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
    if (!ok) {
      if (!st.err.empty()) note = space_note(tmp);  // before the file is emptied
      MPI_Barrier(comm);
      if (rank == 0) {
        std::error_code ec;  // best effort: the close below reports what still fails
        std::filesystem::resize_file(tmp, 0, ec);
      }
      MPI_Barrier(comm);
    }
    st.check(H5Fclose(f), "H5Fclose (the disk refused the last of the data)");
  }
  ok = st.err.empty() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
  if (!st.err.empty()) throw LocalFault("I/O error: HDF5: " + st.err + " failed (file " + tmp + ")" + note);
  if (!ok || !out) return;  // another rank's fault (rank 0 removes the partial file), or not rank 0
  try {
    out->commit();
  } catch (const std::runtime_error& e) {
    throw LocalFault(e.what());
  }
}

}  // namespace ctxpar
