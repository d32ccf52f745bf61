// Validation, dry-run plan and output naming shared by every mode.
#include <unistd.h>

#include <filesystem>
#include <iomanip>
#include <sstream>

#include "core/config.hpp"
#include "core/log.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "modes/modes.hpp"
#include "modes/workload.hpp"

namespace ctxpar {

namespace {
// "train", "bench cp", ...: the mode as typed, joined by `sep`.
std::string mode_words(const Config& cfg, const char* sep) {
  return std::string(name_of(cfg.mode)) + (cfg.mode == Mode::bench ? sep + std::string(name_of(cfg.bench)) : "");
}
}  // namespace

std::string trace_path(const Config& cfg) {
  if (cfg.mode == Mode::attn) {
    // attn writes its tensors to `out`; the trace goes beside it.
    std::string base = cfg.out.empty() ? "out/attn_result.h5" : cfg.out;
    if (base.size() > 3 && base.compare(base.size() - 3, 3, ".h5") == 0) base.resize(base.size() - 3);
    return base + ".trace.h5";
  }
  if (!cfg.out.empty()) return cfg.out;
  return "out/" + mode_words(cfg, "_") + ".h5";
}

std::string check_output(const std::string& path, const char* field) {
  namespace fs = std::filesystem;
  fs::path p(path);
  fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (fs::is_directory(p, ec))
    return std::string("config: ") + field + " = '" + path + "' is a directory; give a file name such as " + (p / "run.h5").string();
  fs::path probe = dir;
  while (!probe.empty() && !fs::exists(probe, ec)) probe = probe.parent_path();
  if (probe.empty()) probe = ".";
  if (!fs::is_directory(probe, ec) || access(probe.c_str(), W_OK) != 0)
    return std::string("config: ") + field + " = '" + path + "': directory '" + probe.string() +
           "' is not writable; valid: a path in a writable directory";
  return "";
}

std::string validate_mode(const Config& cfg, Topology& topo, const ModeRow& row) {
  std::string err;
  if (cfg.device == Device::cuda) {
#if !defined(CTXPAR_WITH_CUDA)
    return "config: device = 'cuda' but this binary was built without the CUDA backend (configure with nvcc and NCCL "
           "under /usr/local/cuda, CTXPAR_CUDA=AUTO or ON); valid here: device=cpu";
#else
    if (!row.cuda)
      return "config: device = 'cuda' is built for `bench attn` only so far (mode " + mode_words(cfg, " ") +
             "); valid: device=cpu for this mode";
    if (cfg.head_dim % 8 != 0)
      return "config: head_dim = " + std::to_string(cfg.head_dim) + " with device = cuda: the GPU kernels load 16-byte "
             "rows, so head_dim must be a multiple of 8 (e.g. " + std::to_string((cfg.head_dim + 7) / 8 * 8) + ")";
#endif
  }
  // attn with --in takes its shape from the file (validate_attn_mode checks it against the strategy);
  // bench cp with strategy=all skips the strategies that do not fit, row by row.
  const bool shape_from_file = cfg.mode == Mode::attn && !cfg.in.empty();
  if (row.attention_workload && !shape_from_file && cfg.strategy != StrategySetting::all) {
    err = validate_workload(cfg, topo);
    if (!err.empty()) return err;
  }
  if (row.validate) {
    err = row.validate(cfg, topo);
    if (!err.empty()) return err;
  }
  if (topo.world().rank() == 0) {
    err = check_output(trace_path(cfg), "out");
    if (err.empty() && cfg.mode == Mode::attn && !cfg.out.empty()) err = check_output(cfg.out, "out");
  }
  return err;
}

std::string dry_run_plan(const Config& cfg, Topology& topo, const ModeRow& row) {
  std::ostringstream os;
  const MeshSpec& m = topo.mesh();
  os << "ctxpar dry run: mode " << mode_words(cfg, " ") << ", " << topo.world().size()
     << " ranks, mesh dp:" << m.dp << ",tp:" << m.tp << ",ulysses:" << m.ulysses << ",ring:" << m.ring << "\n";
  os << "trace: " << trace_path(cfg) << "\n";
  const bool attention = row.attention_workload && cfg.strategy != StrategySetting::all;
  WorkloadPlan plan;
  if (attention) plan = plan_workload(cfg, topo);
  if (attention)
    os << "workload: S=" << cfg.seq << " H_q=" << cfg.heads << " H_kv=" << cfg.kv_heads << " D=" << cfg.head_dim
       << " mask=" << name_of(cfg.mask) << (cfg.mask == MaskKind::window ? "(" + std::to_string(cfg.window) + ")" : "")
       << " docs=" << cfg.docs << ", strategy " << name_of(cfg.strategy) << ", partition " << plan.partition_name << "\n";
  os << " rank  host            node   dp  tp  uly ring   cp_rank  tokens (global ranges)\n";
  const auto& coords = topo.all_coords();
  for (int r = 0; r < topo.world().size(); ++r) {
    const auto& c = coords[size_t(r)];
    const int U = topo.size(Axis::ulysses);
    const int cp_rank = c[int(Axis::ring)] * U + c[int(Axis::ulysses)];
    os << std::setw(5) << r << "  " << std::left << std::setw(15) << topo.hosts()[size_t(r)].substr(0, 15) << std::right
       << std::setw(5) << topo.node_of_rank()[size_t(r)] << std::setw(5) << c[int(Axis::dp)]
       << std::setw(4) << c[int(Axis::tp)] << std::setw(5) << c[int(Axis::ulysses)] << std::setw(5)
       << c[int(Axis::ring)] << std::setw(10) << cp_rank << "  ";
    if (attention) {
      const auto ranges = plan.ranges_of(cp_rank);
      int64_t n = 0;
      for (auto [b, e] : ranges) n += e - b;
      os << n << ": ";
      for (size_t i = 0; i < ranges.size() && i < 4; ++i) os << (i ? " " : "") << "[" << ranges[i].first << "," << ranges[i].second << ")";
      if (ranges.size() > 4) os << " ... (" << ranges.size() << " ranges)";
    }
    os << "\n";
  }
  if (attention) {
    os << "memory estimate per rank: " << fmt_bytes(plan.bytes_per_rank) << " (" << plan.memory_note << ")\n";
  }
  if (row.plan) os << row.plan(cfg, topo);
  return os.str();
}

}  // namespace ctxpar
