// Validation, dry-run plan and output naming shared by every mode.
#include <unistd.h>

#include <filesystem>
#include <iomanip>
#include <sstream>

#include "core/config.hpp"
#include "core/log.hpp"
#include "core/memory.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "modes/modes.hpp"
#include "modes/workload.hpp"
#if defined(CTXPAR_WITH_CUDA)
#include "dist/chips.hpp"
#endif

namespace ctxpar {

std::string mode_words(const Config& cfg, const char* sep) {
  return std::string(name_of(cfg.mode)) + (cfg.mode == Mode::bench ? sep + std::string(name_of(cfg.bench)) : "");
}

std::string attn_result_path(const Config& cfg) { return cfg.out.empty() ? "out/attn_result.h5" : cfg.out; }

std::string trace_path(const Config& cfg) {
  if (cfg.mode == Mode::attn) {
    // attn writes its tensors to `out`; the trace goes beside it.
    std::string base = attn_result_path(cfg);
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
    if (!row.device_memory)
      return "config: device = 'cuda' is built for `run`, `attn`, `train`, `prefill`, `decode`, `chat`, `bench attn`, "
             "`bench cp`, `bench train` and `bench infer`, not for " + mode_words(cfg, " ") +
             " (it measures the host or models, not a GPU run); valid: device=cpu for this mode";
    // Every rank checks its own node, before anything touches the GPU.
    if (const DeviceCount dc = cuda_device_count(); dc.count == 0)
      return "config: device = 'cuda' but no GPU is usable on host " + topo.hosts()[size_t(topo.world().rank())] + " (" +
             dc.why + "); valid: device=cpu, or a node with a GPU";
    if (cfg.head_dim % 8 != 0)
      return "config: head_dim = " + std::to_string(cfg.head_dim) + " with device = cuda: the GPU kernels load 16-byte "
             "rows, so head_dim must be a multiple of 8 (e.g. " + std::to_string((cfg.head_dim + 7) / 8 * 8) + ")";
#endif
  }
  // attn with --in takes its shape from the file (validate_attn_mode checks it against the strategy);
  // bench cp with strategy=all skips the strategies that do not fit, row by row.
  const bool shape_from_file = cfg.mode == Mode::attn && !cfg.in.empty();
  if (row.attention_workload && !shape_from_file && cfg.strategy != "all") {
    err = validate_workload(cfg, topo);
    if (!err.empty()) return err;
  }
  if (row.validate) {
    err = row.validate(cfg, topo);
    if (!err.empty()) return err;
  }
  return err;
}

double workload_memory(const Config& cfg, Topology& topo) {
  if (cfg.strategy != "all") return plan_workload(cfg, topo).bytes_per_rank;
  double most = 0;  // bench cp strategy=all: the hungriest strategy that runs on this mesh
  for (const std::string& s : strategy_names()) {
    Config c = cfg;
    c.strategy = s;
    c.visible_keys = c.exact = false;  // strategy=all: every strategy's plain row, then its scheduled one
    if (validate_workload(c, topo).empty()) most = std::max(most, plan_workload(c, topo).bytes_per_rank);
    c.visible_keys = cfg.visible_keys;
    c.exact = cfg.exact;
    if (validate_workload(c, topo).empty()) most = std::max(most, plan_workload(c, topo).bytes_per_rank);
  }
  return most;
}

namespace {

struct MemoryBudget {
  double bytes_per_rank = -1;  // < 0: unknown (nothing to check against)
  std::string source;
};

MemoryBudget memory_budget(const Config& cfg, Topology& topo) {
  MemoryBudget b;
  if (cfg.mem_per_rank > 0) {
    b.bytes_per_rank = double(cfg.mem_per_rank);
    b.source = "mem_per_rank";
    return b;
  }
  std::string src;
  const int64_t avail = node_available_bytes(&src);
  if (avail < 0) return b;
  const int n = std::max(1, topo.local_size());
  b.bytes_per_rank = double(avail) / n;
  b.source = "this node (" + src + " " + fmt_bytes(double(avail)) + " shared by its " + std::to_string(n) + " rank" +
             (n > 1 ? "s" : "") + ")";
  return b;
}

// The largest seq (a multiple of 2P: no padding) whose plan fits `budget`; 0 when none does
// or the plan does not follow seq (chat's schedule, explicit document lengths).
int64_t largest_fitting_seq(const Config& cfg, Topology& topo, const ModeRow& row, double budget) {
  if (cfg.mode == Mode::chat || (cfg.docs != "none" && cfg.docs != "random")) return 0;
  const int64_t unit = 2 * int64_t(topo.cp().size());
  const auto fits = [&](int64_t chunks) {
    Config c = cfg;
    c.seq = chunks * unit;
    c.cached = 0;
    return row.memory(c, topo) <= budget;
  };
  int64_t lo = 0, hi = cfg.seq / unit;  // fits(lo) (or lo = 0), !fits(hi)
  if (hi < 1 || !fits(1)) return 0;
  lo = 1;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo * unit;
}

}  // namespace

namespace {

// The inference engine's runs: prefill, decode, chat and bench infer.
bool infer_mode(const Config& cfg) {
  return cfg.mode == Mode::prefill || cfg.mode == Mode::decode || cfg.mode == Mode::chat ||
         (cfg.mode == Mode::bench && cfg.bench == Bench::infer);
}

// train, prefill, decode, chat and their benches on a GPU: the host holds copies of the weights (and AdamW
// moments) only, so their plan is checked against the GPU's memory, not the host's.
bool device_plan_only(const Config& cfg) {
  return cfg.device == Device::cuda &&
         (cfg.mode == Mode::train || (cfg.mode == Mode::bench && cfg.bench == Bench::train) || infer_mode(cfg));
}

// The mode's host memory per rank: its plan, or on a GPU what the host keeps beside it.
double host_need(const Config& cfg, Topology& topo, const ModeRow& row) {
  if (!device_plan_only(cfg)) return row.memory(cfg, topo);
  return infer_mode(cfg) ? infer_host_memory_on_gpu(cfg, topo) : train_host_memory_on_gpu(cfg, topo);
}

#if defined(CTXPAR_WITH_CUDA)
// device=cuda: the mode's GPU memory per rank against the free memory of this rank's GPU, shared by
// the ranks on it (bench attn: its largest row; attn, run, bench cp: the call).
struct DeviceFit {
  double need = 0, free_per_rank = -1;
  int device = 0, sharing = 1;
  double free_bytes = -1;
};
DeviceFit device_fit(const Config& cfg, Topology& topo, const ModeRow& row) {
  DeviceFit f;
  const DeviceCount dc = cuda_device_count();
  f.device = device_for_local_rank(topo.local_rank(), topo.local_size(), std::max(1, dc.count));
  const DeviceMemory m = cuda_device_memory(f.device);
  f.sharing = std::max(1, (topo.local_size() + dc.count - 1) / std::max(1, dc.count));
  f.need = row.device_memory ? row.device_memory(cfg, topo) : 0.0;
  f.free_bytes = double(m.free_bytes);
  if (m.free_bytes >= 0) f.free_per_rank = double(m.free_bytes) / f.sharing;
  return f;
}
#endif

}  // namespace

std::string check_memory(const Config& cfg, Topology& topo, const ModeRow& row) {
#if defined(CTXPAR_WITH_CUDA)
  if (cfg.device == Device::cuda) {
    const DeviceFit f = device_fit(cfg, topo, row);
    if (f.free_per_rank >= 0 && f.need > f.free_per_rank)
      return "config: this " + mode_words(cfg) + " needs about " + fmt_bytes(f.need) + " of GPU memory per rank, but GPU " +
             std::to_string(f.device) + " on " + topo.hosts()[size_t(topo.world().rank())] + " has " +
             fmt_bytes(f.free_bytes) + " free for " + std::to_string(f.sharing) +
             " rank(s); valid: " + (infer_mode(cfg) && cfg.mode != Mode::bench ? "shorter prompts (schedule) or a smaller batch"
                                                            : infer_mode(cfg) ? "a shorter seq or a smaller batch" : "a shorter seq") +
             ", or fewer ranks per GPU";
  }
#endif
  if (!row.memory) return "";
  const MemoryBudget b = memory_budget(cfg, topo);
  if (b.bytes_per_rank < 0) return "";
  const double need = host_need(cfg, topo, row);
  if (need <= b.bytes_per_rank) return "";
  std::ostringstream os;
  os << "config: this " << mode_words(cfg) << " plan needs about " << fmt_bytes(need)
     << " of host memory per rank (--dry-run shows its parts), but " << b.source << " leaves "
     << fmt_bytes(b.bytes_per_rank) << " per rank on " << topo.hosts()[size_t(topo.world().rank())] << "; valid: ";
  // What the plan grows with, mode by mode: the setting to change first.
  const bool train = cfg.mode == Mode::train || cfg.bench == Bench::train;
  if (cfg.mode == Mode::bench && cfg.bench == Bench::comm) {
    os << "bench_max_bytes <= " << int64_t(b.bytes_per_rank / 2) << ", or mem_per_rank=SIZE when you know better";
    return os.str();
  } else if (cfg.mode == Mode::chat) {
    os << "a schedule with fewer tokens (schedule = '" << cfg.schedule << "'), "
       << (cfg.batch > 1 ? "batch < " + std::to_string(cfg.batch) + ", " : "");
  } else if (const int64_t fit = largest_fitting_seq(cfg, topo, row, b.bytes_per_rank); fit > 0) {
    os << "seq <= " << fit << " on this mesh (seq = " << cfg.seq << "), "
       << (cfg.batch > 1 && !train ? "batch < " + std::to_string(cfg.batch) + ", " : "");
  } else if (train || cfg.mode == Mode::prefill || cfg.mode == Mode::decode || cfg.bench == Bench::calibrate) {
    os << "a smaller model (layers, dim, ffn_dim, vocab: even the shortest seq does not fit), ";
  }
  os << "more ranks or nodes" << (train ? ", remat=full" : "") << ", or mem_per_rank=SIZE when you know better";
  return os.str();
}

std::string dry_run_plan(const Config& cfg, Topology& topo, const ModeRow& row) {
  std::ostringstream os;
  const MeshSpec& m = topo.mesh();
  os << "ctxpar dry run: mode " << mode_words(cfg, " ") << ", " << topo.world().size()
     << " ranks, mesh dp:" << m.dp << ",tp:" << m.tp << ",ulysses:" << m.ulysses << ",ring:" << m.ring << "\n";
  os << "trace: " << trace_path(cfg) << "\n";
  const bool attention = row.attention_workload && cfg.strategy != "all";
  WorkloadPlan plan;
  if (attention) plan = plan_workload(cfg, topo);
  if (attention)
    os << "workload: S=" << cfg.seq << " H_q=" << cfg.heads << " H_kv=" << cfg.kv_heads << " D=" << cfg.head_dim
       << " mask=" << name_of(cfg.mask) << (cfg.mask == MaskKind::window ? "(" + std::to_string(cfg.window) + ")" : "")
       << " docs=" << cfg.docs << ", strategy " << cfg.strategy << ", partition " << plan.partition_name << "\n";
  if (attention && plan.partition->padding() > 0) os << "padding: " << plan.partition->padding_note() << "\n";
  // The tokens of each CP rank where the mode runs one attention layout (others lay out per call).
  os << " rank  host            node   dp  tp  uly ring   cp_rank" << (attention ? "  tokens (global ranges)" : "") << "\n";
  const auto& coords = topo.all_coords();
  for (int r = 0; r < topo.world().size(); ++r) {
    const auto& c = coords[size_t(r)];
    const int U = topo.size(Axis::ulysses);
    const int cp_rank = c[int(Axis::ring)] * U + c[int(Axis::ulysses)];
    os << std::setw(5) << r << "  " << std::left << std::setw(15) << topo.hosts()[size_t(r)].substr(0, 15) << std::right
       << std::setw(5) << topo.node_of_rank()[size_t(r)] << std::setw(5) << c[int(Axis::dp)]
       << std::setw(4) << c[int(Axis::tp)] << std::setw(5) << c[int(Axis::ulysses)] << std::setw(5)
       << c[int(Axis::ring)] << std::setw(10) << cp_rank;
    if (attention) {
      os << "  ";
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
#if defined(CTXPAR_WITH_CUDA)
  if (cfg.device == Device::cuda) {
    const DeviceFit f = device_fit(cfg, topo, row);
    if (f.need > 0 && f.free_per_rank >= 0)
      os << "GPU memory check: " << fmt_bytes(f.need) << " per rank against " << fmt_bytes(f.free_per_rank)
         << " per rank (GPU " << f.device << ": " << fmt_bytes(f.free_bytes) << " free, " << f.sharing << " rank(s) on it): "
         << (f.need <= f.free_per_rank ? "fits" : "does NOT fit (a run would be refused)") << "\n";
  }
#endif
  if (row.memory) {
    const double need = host_need(cfg, topo, row);
    const MemoryBudget b = memory_budget(cfg, topo);
    if (need > 0 && b.bytes_per_rank >= 0)
      os << (device_plan_only(cfg) ? "host memory check: " : "memory check: ") << fmt_bytes(need) << " per rank against "
         << fmt_bytes(b.bytes_per_rank) << " per rank from "
         << b.source << ": " << (need <= b.bytes_per_rank ? "fits" : "does NOT fit (a run would be refused)") << "\n";
  }
  return os.str();
}

}  // namespace ctxpar
