#include "perf/hardware.hpp"

#include <algorithm>
#include <fstream>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <map>
#include <sstream>
#include <toml.hpp>
#include <unistd.h>

#include "core/config.hpp"
#include "core/error.hpp"

#ifndef CTXPAR_SOURCE_DIR
#define CTXPAR_SOURCE_DIR "."
#endif

namespace ctxpar {

namespace fs = std::filesystem;

double EffCurve::at(double v) const {
  if (x.empty()) return x_half > 0 ? eff_inf * v / (v + x_half) : eff_inf;
  if (v <= x.front()) return eff.front();
  if (v >= x.back()) return eff.back();
  size_t i = 1;
  while (x[i] < v) ++i;
  const double t = (std::log(v) - std::log(x[i - 1])) / (std::log(x[i]) - std::log(x[i - 1]));
  return eff[i - 1] + t * (eff[i] - eff[i - 1]);
}

std::string hardware_name(const Config& cfg, HardwareUse use) {
  if (cfg.hardware == "auto") return use == HardwareUse::live_choice ? "measured" : "local";
  if (cfg.hardware == "measured" && use == HardwareUse::plan)
    throw UsageError("hardware = measured: the ranks of a running job are measured for cp_algo=auto only; a plan "
                     "(predict, strategy=auto, bench calibrate) needs a profile: hardware=local (bench calibrate's) or "
                     "one of " + [] {
                       std::string n;
                       for (const std::string& h : hardware_names()) n += (n.empty() ? "" : ", ") + h;
                       return n;
                     }());
  return cfg.hardware;
}

std::string this_host() {
  char b[256] = {};
  return gethostname(b, sizeof b - 1) == 0 ? std::string(b) : std::string();
}

std::string this_cpu() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      std::string v = line.substr(line.find(':') + 1);
      const size_t b = v.find_first_not_of(" \t");
      return b == std::string::npos ? std::string() : v.substr(b);
    }
  return "";
}

std::string calibrated_shapes(const Config& cfg) {
  return "dim=" + std::to_string(cfg.dim) + " ffn_dim=" + std::to_string(cfg.ffn_dim) + " vocab=" +
         std::to_string(cfg.vocab) + " H_q=" + std::to_string(cfg.heads) + " H_kv=" + std::to_string(cfg.kv_heads) +
         " D=" + std::to_string(cfg.head_dim);
}

std::string profile_mismatch(const HardwareProfile& hw, const Config& cfg) {
  const std::string tail = "; its rates may not hold here: run `ctxpar bench calibrate` with this model on this "
                           "machine (it writes " + std::string(kCalibratedProfile) + ")";
  if (hw.measured_host.empty()) {
    // The repository's example of bench calibrate's output, measured on a machine of ours.
    if (hw.name == "local")
      return "warning: hardware profile local (" + hw.source_file + ") is the repository's example, measured on "
             "another machine" + tail;
    return "";
  }
  std::string diff;
  auto differs = [&](const std::string& what, const std::string& then, const std::string& now) {
    if (then != now) diff += (diff.empty() ? "" : ", ") + what + " " + then + " (here: " + (now.empty() ? "?" : now) + ")";
  };
  differs("host", hw.measured_host, this_host());
  differs("CPU", hw.measured_cpu, this_cpu());
  differs("shapes", hw.measured_shapes, calibrated_shapes(cfg));
  if (diff.empty()) return "";
  return "warning: hardware profile " + hw.name + " (" + hw.source_file + ") was measured with " + diff + tail;
}

double calibrated_core_peak_flops() {
  std::error_code ec;
  if (!fs::is_regular_file(kCalibratedProfile, ec)) return 0;
  try {
    const HardwareProfile h = load_hardware(kCalibratedProfile);
    return h.measured_host == this_host() && h.measured_cpu == this_cpu() ? h.core_fma_flops : 0;
  } catch (const UsageError&) {
    return 0;  // unreadable: the run measures its own (predict and auto report the profile's error)
  }
}

std::string hardware_dir() {
  std::error_code ec;
  if (fs::is_directory("inputs/hardware", ec)) return "inputs/hardware";
  return std::string(CTXPAR_SOURCE_DIR) + "/inputs/hardware";
}

std::vector<std::string> hardware_names() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(hardware_dir(), ec))
    if (e.path().extension() == ".toml") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

std::string join_names() {
  std::string s;
  for (const std::string& n : hardware_names()) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "(none found in " + hardware_dir() + ")" : s;
}

// The keys a profile may hold; every other key is an error (a typo must not pass silently).
const std::vector<std::string> kKeys = {
    "name", "description", "peak_tflops_bf16", "peak_tflops_fp8", "peak_tflops_fp32", "default_precision",
    "hbm_gb", "hbm_tb_s", "hbm_eff", "chips_per_node", "compute_units_per_node", "intra_gb_s",
    "intra_latency_us", "intra_collective_gb_s", "intra_alltoall_gb_s", "inter_gb_s", "inter_latency_us", "inter_collective_gb_s", "inter_allgather_gb_s", "inter_alltoall_gb_s",
    "inter_overlap_loss_ns_per_byte", "gemm_eff", "gemm_eff_at_rows", "gemm_half_rows",
    "gemm_eff_rows", "gemm_eff_values", "attn_eff", "attn_eff_at_keys", "attn_half_keys",
    "attn_eff_keys", "attn_eff_values", "attn_diag_waste_keys", "attn_bwd_work", "elementwise_gb_s", "loss_gb_s", "optimizer_gb_s",
    "step_overhead_us", "rank_jitter", "shared_core_eff", "overlap_collectives", "measured_host", "measured_cpu",
    "measured_shapes", "core_fma_tflops"};
// Keys of earlier versions, with what replaced them (a profile that still has one gets told).
const std::vector<std::pair<std::string, std::string>> kRenamed = {
    {"attn_eff_tokens", "attn_eff_keys (the curve's x is now visible keys per query row of a call)"},
    {"attn_eff_at_tokens", "attn_eff_at_keys (a causal block of b tokens has b/2 keys per query row)"},
    {"attn_half_tokens", "attn_half_keys"}};
const std::vector<std::string> kRequired = {"name", "hbm_gb", "hbm_tb_s", "chips_per_node",
                                            "intra_gb_s", "intra_latency_us", "inter_gb_s", "inter_latency_us"};

// The physical range of each rate, size and latency, in the profile's units: wide enough for a
// laptop core and a next-decade accelerator, narrow enough that a typo (1e-300, 1e300) is caught
// instead of pricing a step at zero or at years.
struct Range {
  std::string_view key, unit;
  double lo, hi;
  bool zero_ok = false;        // 0 is a documented setting ("unset": another key's value)
  std::string_view zero = "";  // what 0 means
};
const Range kRanges[] = {
    {"peak_tflops_bf16", "TFLOP/s", 1e-4, 1e5, true, "no such unit"},
    {"peak_tflops_fp8", "TFLOP/s", 1e-4, 1e5, true, "no such unit"},
    {"peak_tflops_fp32", "TFLOP/s", 1e-4, 1e5, true, "no such unit"},
    {"core_fma_tflops", "TFLOP/s", 1e-6, 1e3, true, "not measured"},
    {"hbm_gb", "GB", 0.01, 1e5},
    {"hbm_tb_s", "TB/s", 1e-4, 1e3},
    {"chips_per_node", "chips", 1, 1e6},
    {"compute_units_per_node", "units", 1e-3, 1e6, true, "chips_per_node"},  // a fraction: hosts sharing cores
    {"intra_gb_s", "GB/s", 1e-3, 1e5},
    {"inter_gb_s", "GB/s", 1e-3, 1e5},
    {"intra_collective_gb_s", "GB/s", 1e-3, 1e5, true, "intra_gb_s"},
    {"intra_alltoall_gb_s", "GB/s", 1e-3, 1e5, true, "intra_collective_gb_s"},
    {"inter_collective_gb_s", "GB/s", 1e-3, 1e5, true, "inter_gb_s"},
    {"inter_allgather_gb_s", "GB/s", 1e-3, 1e5, true, "inter_collective_gb_s"},
    {"inter_alltoall_gb_s", "GB/s", 1e-3, 1e5, true, "inter_collective_gb_s"},
    {"intra_latency_us", "us", 0, 1e6},
    {"inter_latency_us", "us", 0, 1e6},
    {"inter_overlap_loss_ns_per_byte", "ns/byte", 0, 1e3},
    {"elementwise_gb_s", "GB/s", 1e-3, 1e5, true, "the achieved HBM rate"},
    {"loss_gb_s", "GB/s", 1e-3, 1e5, true, "the achieved HBM rate"},
    {"optimizer_gb_s", "GB/s", 1e-3, 1e5, true, "the achieved HBM rate"},
    {"step_overhead_us", "us", 0, 1e8},
    {"gemm_eff_at_rows", "rows", 0, 1e9},
    {"gemm_half_rows", "rows", 0, 1e9},
    {"gemm_eff_rows", "rows", 0, 1e9},
    {"attn_eff_at_keys", "keys", 0, 1e12},
    {"attn_half_keys", "keys", 0, 1e12},
    {"attn_eff_keys", "keys", 0, 1e12},
    {"attn_diag_waste_keys", "keys", 0, 1e9},
};

struct Reader {
  const toml::value& root;
  std::string file;
  bool has(const std::string& k) const { return root.as_table().count(k) != 0; }
  [[noreturn]] void bad(const std::string& k, const std::string& what) const {
    throw UsageError("hardware: " + k + " in " + file + " " + what);
  }
  // Every number of a profile is a rate, a size, a latency, a count or an efficiency: finite, >= 0,
  // and within the range of a physical machine where its key has one (kRanges).
  double checked(const std::string& k, double x) const {
    if (!std::isfinite(x) || x < 0) bad(k, "is " + number_text(x) + "; valid: a finite number >= 0");
    for (const Range& g : kRanges)
      if (g.key == k && !(x == 0 && g.zero_ok) && !(x >= g.lo && x <= g.hi)) {
        const std::string unit(g.unit), zero = g.zero_ok ? "0 (" + std::string(g.zero) + ") or " : "";
        bad(k, "is " + number_text(x) + " " + unit + "; valid: " + zero + number_text(g.lo) + " to " + number_text(g.hi) +
                   " " + unit + " (a physical machine's range)");
      }
    return x;
  }
  double num(const std::string& k, double def) const {
    if (!has(k)) return def;
    const toml::value& v = root.as_table().at(k);
    if (v.is_integer()) return checked(k, double(v.as_integer()));
    if (v.is_floating()) return checked(k, v.as_floating());
    bad(k, "must be a number");
  }
  std::vector<double> nums(const std::string& k) const {
    std::vector<double> out;
    if (!has(k)) return out;
    const toml::value& v = root.as_table().at(k);
    if (!v.is_array()) bad(k, "must be an array of numbers");
    for (const toml::value& e : v.as_array()) {
      if (e.is_integer()) out.push_back(checked(k, double(e.as_integer())));
      else if (e.is_floating()) out.push_back(checked(k, e.as_floating()));
      else bad(k, "must be an array of numbers");
    }
    return out;
  }
  std::string str(const std::string& k, const std::string& def) const {
    if (!has(k)) return def;
    const toml::value& v = root.as_table().at(k);
    if (!v.is_string()) bad(k, "must be a string");
    return v.as_string().str;
  }
  bool boolean(const std::string& k, bool def) const {
    if (!has(k)) return def;
    const toml::value& v = root.as_table().at(k);
    if (!v.is_boolean()) bad(k, "must be true or false");
    return v.as_boolean();
  }
  // A curve from either measured points (<p>_<xname>, <p>_values) or one efficiency `p` at the
  // size `at_key` with the half-efficiency size `half_key` (full key names).
  EffCurve curve(const std::string& p, const std::string& xs, const std::string& at_key, const std::string& half_key) const {
    EffCurve c;
    c.x = nums(p + "_" + xs);
    c.eff = nums(p + "_values");
    if (c.x.size() != c.eff.size()) bad(p + "_values", "must have as many entries as " + p + "_" + xs);
    for (size_t i = 0; i < c.x.size(); ++i) {
      if (c.x[i] <= 0 || (i && c.x[i] <= c.x[i - 1])) bad(p + "_" + xs, "must be positive and ascending");
      if (!(c.eff[i] > 0 && c.eff[i] <= 1.0)) bad(p + "_values", "must be efficiencies in (0, 1]");
    }
    if (!c.x.empty()) return c;
    const double e = num(p, 1.0), a = num(at_key, 0), h = num(half_key, 0);
    if (!(e > 0 && e <= 1)) bad(p, "must be an efficiency in (0, 1]");
    if (h < 0 || a < 0) bad(half_key, "must be ≥ 0");
    c.x_half = h;
    // eff(at) = e  ⇒  eff_inf = e (at + h) / at; with no reference size, e is the asymptote.
    c.eff_inf = (a > 0 && h > 0) ? e * (a + h) / a : e;
    if (c.eff_inf > 1)
      bad(half_key, "and " + at_key + " imply an asymptotic efficiency of " + std::to_string(c.eff_inf) +
                        " > 1 (" + p + " = " + std::to_string(e) + " at " + std::to_string(a) + "); valid: a smaller half size");
    return c;
  }
};

std::string resolve(const std::string& name_or_path) {
  const bool is_path = name_or_path.find('/') != std::string::npos ||
                       (name_or_path.size() > 5 && name_or_path.compare(name_or_path.size() - 5, 5, ".toml") == 0);
  if (is_path) return name_or_path;
  std::error_code ec;
  if (name_or_path == "local" && fs::is_regular_file(kCalibratedProfile, ec)) return kCalibratedProfile;
  return hardware_dir() + "/" + name_or_path + ".toml";
}

}  // namespace

HardwareProfile load_hardware(const std::string& name_or_path) {
  if (name_or_path.empty())
    throw UsageError("hardware: no profile given; valid: hardware=NAME with NAME one of " + join_names());
  const std::string file = resolve(name_or_path);
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    // Say what is there: a directory or another kind of file is not "not found".
    const std::string what = fs::is_directory(file, ec) ? " is a directory"
                             : fs::exists(file, ec)     ? " is not a regular file"
                                                        : " not found";
    throw UsageError("hardware: no profile '" + name_or_path + "' (" + file + what + "); valid: " + join_names() +
                     ", or a path to a .toml profile (`ctxpar bench calibrate` writes " + kCalibratedProfile + ")");
  }
  std::string text;
  {
    std::ifstream f(file, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  if (const std::string nest = toml_nesting_error(text); !nest.empty())
    throw UsageError("hardware: " + file + ": " + nest + "; valid: a profile of key = value lines");
  toml::value root;
  try {
    std::istringstream is(text);
    root = toml::parse(is, file);
  } catch (const std::exception& e) {
    throw UsageError("hardware: cannot parse " + file + " as TOML (valid: a profile like inputs/hardware/h100-gtt.toml):\n" +
                     printable(e.what()));
  }
  if (!root.is_table()) throw UsageError("hardware: " + file + " is not a TOML table");
  for (const auto& [k, v] : root.as_table()) {
    for (const auto& [old_key, now] : kRenamed)
      if (k == old_key) throw UsageError("hardware: key '" + k + "' in " + file + " was renamed; use " + now);
    if (std::find(kKeys.begin(), kKeys.end(), k) == kKeys.end())
      throw UsageError("hardware: unknown key '" + k + "' in " + file + "; valid keys are listed in src/perf/hardware.cpp and inputs/hardware/README.md");
  }
  for (const std::string& k : kRequired)
    if (!root.as_table().count(k)) throw UsageError("hardware: " + file + " lacks the required key '" + k + "'");
  Reader r{root, file};
  HardwareProfile h;
  h.source_file = file;
  h.name = r.str("name", "");
  h.description = r.str("description", "");
  h.measured_host = r.str("measured_host", "");
  h.measured_cpu = r.str("measured_cpu", "");
  h.measured_shapes = r.str("measured_shapes", "");
  h.peak_bf16_flops = r.num("peak_tflops_bf16", 0) * 1e12;
  h.peak_fp8_flops = r.num("peak_tflops_fp8", 0) * 1e12;
  h.peak_fp32_flops = r.num("peak_tflops_fp32", 0) * 1e12;
  h.core_fma_flops = r.num("core_fma_tflops", 0) * 1e12;
  if (!parse_in(kPrecisionNames, r.str("default_precision", "bf16"), h.default_precision) ||
      h.default_precision == Precision::automatic)
    r.bad("default_precision", "must be one of bf16, fp8_ffn, fp32");
  h.hbm_bytes = r.num("hbm_gb", 0) * 1e9;
  h.hbm_bytes_per_s = r.num("hbm_tb_s", 0) * 1e12;
  h.hbm_eff = r.num("hbm_eff", 0.8);
  const double chips = r.num("chips_per_node", 8);
  if (chips != std::floor(chips)) r.bad("chips_per_node", "must be a whole number of chips (got " + number_text(chips) + ")");
  h.chips_per_node = int64_t(chips);
  h.compute_units_per_node = r.num("compute_units_per_node", 0);
  h.intra = {r.num("intra_gb_s", 0) * 1e9, r.num("intra_latency_us", 0) * 1e-6};
  h.inter = {r.num("inter_gb_s", 0) * 1e9, r.num("inter_latency_us", 0) * 1e-6};
  h.intra_collective_bytes_per_s = r.num("intra_collective_gb_s", 0) * 1e9;
  h.intra_alltoall_bytes_per_s = r.num("intra_alltoall_gb_s", 0) * 1e9;
  h.inter_collective_bytes_per_s = r.num("inter_collective_gb_s", 0) * 1e9;
  h.inter_allgather_bytes_per_s = r.num("inter_allgather_gb_s", 0) * 1e9;
  h.inter_alltoall_bytes_per_s = r.num("inter_alltoall_gb_s", 0) * 1e9;
  h.inter_overlap_loss_s_per_byte = r.num("inter_overlap_loss_ns_per_byte", 0) * 1e-9;
  h.gemm_eff = r.curve("gemm_eff", "rows", "gemm_eff_at_rows", "gemm_half_rows");
  h.attn_eff = r.curve("attn_eff", "keys", "attn_eff_at_keys", "attn_half_keys");
  h.attn_diag_waste_keys = r.num("attn_diag_waste_keys", 0);
  h.attn_bwd_work = r.num("attn_bwd_work", 2.5);
  if (!(h.attn_bwd_work >= 1 && h.attn_bwd_work <= 10)) r.bad("attn_bwd_work", "must be in [1, 10] (backward matmul work / forward)");
  h.elementwise_bytes_per_s = r.num("elementwise_gb_s", 0) * 1e9;
  h.loss_bytes_per_s = r.num("loss_gb_s", 0) * 1e9;
  h.optimizer_bytes_per_s = r.num("optimizer_gb_s", 0) * 1e9;
  if (h.attn_diag_waste_keys < 0) r.bad("attn_diag_waste_keys", "must be ≥ 0");
  if (h.elementwise_bytes_per_s < 0 || h.loss_bytes_per_s < 0 || h.optimizer_bytes_per_s < 0)
    r.bad("elementwise_gb_s", "loss_gb_s and optimizer_gb_s must be ≥ 0 (0 = the achieved HBM rate)");
  h.step_overhead_s = r.num("step_overhead_us", 0) * 1e-6;
  h.rank_jitter = r.num("rank_jitter", 0);
  h.shared_core_eff = r.num("shared_core_eff", 1);
  if (h.rank_jitter < 0 || h.rank_jitter > 1) r.bad("rank_jitter", "must be in [0, 1] (a relative standard deviation)");
  if (!(h.shared_core_eff > 0 && h.shared_core_eff <= 1)) r.bad("shared_core_eff", "must be in (0, 1]");
  h.overlap_collectives = r.boolean("overlap_collectives", true);
  const double peak_default = h.default_precision == Precision::fp32 ? h.peak_fp32_flops : h.peak_bf16_flops;
  if (peak_default <= 0)
    r.bad(h.default_precision == Precision::fp32 ? "peak_tflops_fp32" : "peak_tflops_bf16",
          std::string("must be > 0 (the peak of default_precision = ") + name_of(h.default_precision) + ")");
  if (h.hbm_bytes <= 0 || h.hbm_bytes_per_s <= 0) r.bad("hbm_gb", "and hbm_tb_s must be > 0");
  if (h.chips_per_node < 1) r.bad("chips_per_node", "must be ≥ 1");
  if (h.inter_collective_bytes_per_s < 0 || h.inter_allgather_bytes_per_s < 0 || h.inter_alltoall_bytes_per_s < 0)
    r.bad("inter_collective_gb_s", "inter_allgather_gb_s and inter_alltoall_gb_s must be ≥ 0 (0 = inter_gb_s)");
  if (h.inter_overlap_loss_s_per_byte < 0) r.bad("inter_overlap_loss_ns_per_byte", "must be ≥ 0");
  if (h.compute_units_per_node < 0) r.bad("compute_units_per_node", "must be ≥ 0 (0 = chips_per_node)");
  if (h.intra.bw_bytes_per_s <= 0 || h.inter.bw_bytes_per_s <= 0) r.bad("intra_gb_s", "and inter_gb_s must be > 0");
  if (!(h.hbm_eff > 0 && h.hbm_eff <= 1)) r.bad("hbm_eff", "must be in (0, 1]");
  return h;
}

std::string hardware_toml(const HardwareProfile& h, const std::vector<std::string>& notes,
                          const std::vector<std::pair<std::string, std::string>>& sources) {
  std::map<std::string, std::string> src(sources.begin(), sources.end());
  std::ostringstream os;
  os << std::setprecision(6);
  for (const std::string& n : notes) os << "# " << n << "\n";
  auto line = [&](const std::string& k, const std::string& v) {
    os << k << " = " << v;
    if (src.count(k)) os << "  # " << src[k];
    os << "\n";
  };
  auto num = [](double v) {
    std::ostringstream s;
    s << std::setprecision(6) << v;
    return s.str();
  };
  auto arr = [&](const std::vector<double>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + num(v[i]);
    return s + "]";
  };
  line("name", "\"" + h.name + "\"");
  line("description", "\"" + h.description + "\"");
  if (!h.measured_host.empty()) line("measured_host", "\"" + h.measured_host + "\"");
  if (!h.measured_cpu.empty()) line("measured_cpu", "\"" + h.measured_cpu + "\"");
  if (!h.measured_shapes.empty()) line("measured_shapes", "\"" + h.measured_shapes + "\"");
  line("peak_tflops_bf16", num(h.peak_bf16_flops / 1e12));
  line("peak_tflops_fp8", num(h.peak_fp8_flops / 1e12));
  line("peak_tflops_fp32", num(h.peak_fp32_flops / 1e12));
  if (h.core_fma_flops > 0) line("core_fma_tflops", num(h.core_fma_flops / 1e12));
  line("default_precision", std::string("\"") + name_of(h.default_precision) + "\"");
  line("hbm_gb", num(h.hbm_bytes / 1e9));
  line("hbm_tb_s", num(h.hbm_bytes_per_s / 1e12));
  line("hbm_eff", num(h.hbm_eff));
  line("chips_per_node", std::to_string(h.chips_per_node));
  line("compute_units_per_node", num(h.compute_units_per_node));
  line("intra_gb_s", num(h.intra.bw_bytes_per_s / 1e9));
  line("intra_latency_us", num(h.intra.latency_s * 1e6));
  if (h.intra_collective_bytes_per_s > 0) line("intra_collective_gb_s", num(h.intra_collective_bytes_per_s / 1e9));
  if (h.intra_alltoall_bytes_per_s > 0) line("intra_alltoall_gb_s", num(h.intra_alltoall_bytes_per_s / 1e9));
  line("inter_gb_s", num(h.inter.bw_bytes_per_s / 1e9));
  line("inter_latency_us", num(h.inter.latency_s * 1e6));
  if (h.inter_collective_bytes_per_s > 0) line("inter_collective_gb_s", num(h.inter_collective_bytes_per_s / 1e9));
  if (h.inter_allgather_bytes_per_s > 0) line("inter_allgather_gb_s", num(h.inter_allgather_bytes_per_s / 1e9));
  if (h.inter_alltoall_bytes_per_s > 0) line("inter_alltoall_gb_s", num(h.inter_alltoall_bytes_per_s / 1e9));
  if (h.inter_overlap_loss_s_per_byte > 0)
    line("inter_overlap_loss_ns_per_byte", num(h.inter_overlap_loss_s_per_byte * 1e9));
  if (!h.gemm_eff.x.empty()) {
    line("gemm_eff_rows", arr(h.gemm_eff.x));
    line("gemm_eff_values", arr(h.gemm_eff.eff));
  } else {
    line("gemm_eff", num(h.gemm_eff.eff_inf));
    line("gemm_half_rows", num(h.gemm_eff.x_half));
  }
  if (!h.attn_eff.x.empty()) {
    line("attn_eff_keys", arr(h.attn_eff.x));
    line("attn_eff_values", arr(h.attn_eff.eff));
  } else {
    line("attn_eff", num(h.attn_eff.eff_inf));
    line("attn_half_keys", num(h.attn_eff.x_half));
  }
  line("attn_diag_waste_keys", num(h.attn_diag_waste_keys));
  if (h.attn_bwd_work != 2.5) line("attn_bwd_work", num(h.attn_bwd_work));
  if (h.elementwise_bytes_per_s > 0) line("elementwise_gb_s", num(h.elementwise_bytes_per_s / 1e9));
  if (h.loss_bytes_per_s > 0) line("loss_gb_s", num(h.loss_bytes_per_s / 1e9));
  if (h.optimizer_bytes_per_s > 0) line("optimizer_gb_s", num(h.optimizer_bytes_per_s / 1e9));
  line("step_overhead_us", num(h.step_overhead_s * 1e6));
  if (h.rank_jitter > 0) line("rank_jitter", num(h.rank_jitter));
  if (h.shared_core_eff < 1) line("shared_core_eff", num(h.shared_core_eff));
  line("overlap_collectives", h.overlap_collectives ? "true" : "false");
  return os.str();
}

}  // namespace ctxpar
