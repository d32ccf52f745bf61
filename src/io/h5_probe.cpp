#include "io/h5_probe.hpp"

#include <cfloat>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <vector>

#include "core/config.hpp"  // number_text
#include "io/h5_common.hpp"
#include "io/io_lock.hpp"

namespace ctxpar {

using h5::Handle;

ExistingFile describe_file(const std::string& path) {
  const IoLock lock = io_lock();
  ExistingFile f;
  std::error_code ec;
  f.exists = std::filesystem::exists(path, ec);
  f.regular = std::filesystem::is_regular_file(path, ec);
  if (!f.regular || !h5::is_hdf5_file(path)) return f;
  hid_t id = -1;
  try {
    id = h5::open_read_only(path);
  } catch (const std::runtime_error&) {
    f.kind = "hdf5";  // an HDF5 signature, but not readable now (e.g. a live file another writer locks)
    return f;
  }
  Handle file(id, H5Fclose);
  f.kind = "hdf5";
  std::string s;
  if (h5::read_attr_string(file.get(), "ctxpar_file", s)) {
    f.kind = s;
  } else if (H5Aexists(file.get(), "schema_version") > 0 && h5::read_attr_string(file.get(), "mode", s)) {
    f.kind = "trace";  // traces before the ctxpar_file attribute
  } else if (H5Aexists(file.get(), "step") > 0 && H5Aexists(file.get(), "next_sample") > 0) {
    f.kind = "checkpoint";
  } else if (h5::has_link(file.get(), "losses") && h5::has_link(file.get(), "logits")) {
    f.kind = "oracle_dump";
  } else if (h5::has_link(file.get(), "o") && h5::has_link(file.get(), "lse")) {
    f.kind = "attn_result";
  }
  if (f.kind == "trace") {
    if (h5::read_attr_string(file.get(), "mode", s)) f.mode = s;
    if (h5::read_attr_string(file.get(), "bench", s) && !s.empty() && s != "none") f.mode += " " + s;
    if (h5::read_attr_string(file.get(), "status", s)) f.status = s;
  }
  return f;
}

std::string first_non_finite(const std::string& path, const std::string& name) {
  const IoLock lock = io_lock();
  Handle file(h5::open_user_file(path, path + ": "), H5Fclose);
  const std::vector<hsize_t> dims = h5::dims_of(file.get(), name, path);
  if (dims.empty()) return "";
  hsize_t row = 1;
  for (size_t i = 1; i < dims.size(); ++i) row *= dims[i];
  if (row == 0 || dims[0] == 0) return "";
  const hsize_t rows_per_block = std::max<hsize_t>(1, (hsize_t(1) << 20) / row);
  std::vector<double> buf;
  for (hsize_t r0 = 0; r0 < dims[0]; r0 += rows_per_block) {
    const hsize_t n = std::min(rows_per_block, dims[0] - r0);
    buf.resize(size_t(n * row));
    std::vector<hsize_t> start(dims.size(), 0), count = dims;
    start[0] = r0;
    count[0] = n;
    h5::read_block(file.get(), name, start, count, H5T_NATIVE_DOUBLE, buf.data(), path);
    for (size_t i = 0; i < buf.size(); ++i) {
      const double x = buf[i];
      if (std::isfinite(x) && std::fabs(x) <= double(FLT_MAX)) continue;
      // The index of element i, in the dataset's dimensions.
      std::vector<hsize_t> idx(dims.size());
      hsize_t rem = hsize_t(i);
      for (size_t d = dims.size(); d-- > 1;) {
        idx[d] = rem % dims[d];
        rem /= dims[d];
      }
      idx[0] = r0 + rem;
      std::ostringstream os;
      os << (std::isnan(x) ? "nan" : std::isinf(x) ? (x > 0 ? "inf" : "-inf") : "a value outside float32's range (" +
                                                                                     number_text(x) + ")")
         << " at [";
      for (size_t d = 0; d < idx.size(); ++d) os << (d ? ", " : "") << idx[d];
      os << "]";
      return os.str();
    }
  }
  return "";
}

}  // namespace ctxpar
