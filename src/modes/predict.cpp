// `ctxpar predict`: the cost model's table for a model (the model fields, e.g. --config
// inputs/llama3-405b.toml), a hardware profile (hardware=h100-gtt) and a predicted mesh
// (predict_mesh=tp:8,ring:16, which need not match this job's ranks: predict runs on one rank
// for clusters we do not have). One row per strategy — time, MFU, compute split, exposed and total
// communication, memory per chip, fits — and the recommended strategy; `sweep=seq=128K,1M`
// repeats the table for each value of one key; `--csv` prints the rows as CSV.
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "core/table.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "model/flops.hpp"
#include "modes/modes.hpp"
#include "ops.hpp"
#include "perf/cost_model.hpp"

namespace ctxpar {

namespace {

PerfMesh predicted_mesh(const Config& cfg) {
  const MeshSpec s = parse_mesh(cfg.predict_mesh.empty() ? cfg.mesh : cfg.predict_mesh, 1);
  return PerfMesh{s.dp, s.tp, s.ulysses, s.ring};
}

std::string mesh_text(const PerfMesh& m) {
  std::string s;
  auto add = [&](const char* n, int64_t v) {
    // '/' between axes keeps the cell one CSV field (predict_mesh takes ',' instead)
    if (v > 1) s += (s.empty() ? "" : "/") + std::string(n) + ":" + std::to_string(v);
  };
  add(axis_name(Axis::dp), m.dp);
  add(axis_name(Axis::tp), m.tp);
  add(axis_name(Axis::ulysses), m.ulysses);
  add(axis_name(Axis::ring), m.ring);
  return s.empty() ? "1" : s;
}

// New and cached tokens of the predicted request: partial prefill takes `cached` or else
// T = miss_rate * seq (the inference modes' rule); decode's context is all cached.
PerfWorkload workload_of(const Config& cfg, const HardwareProfile& hw) {
  PerfWorkload w;
  w.mode = cfg.predict_mode;
  w.seq = cfg.seq;
  if (w.mode == PerfMode::partial_prefill) {
    const int64_t T = cfg.cached > 0 ? cfg.seq - cfg.cached : std::max<int64_t>(1, std::llround(cfg.miss_rate * double(cfg.seq)));
    w.cached = cfg.seq - T;
  } else if (w.mode == PerfMode::decode) {
    w.cached = cfg.seq;
  }
  w.batch = cfg.batch;
  w.precision = cfg.predict_precision == Precision::automatic ? hw.default_precision : cfg.predict_precision;
  w.remat = cfg.remat;
  w.zero = cfg.predict_zero;
  w.partition = cfg.partition;
  return w;
}

// The configs of a sweep: the given one with `key` set to each value (parsed as user input).
std::vector<std::pair<std::string, Config>> sweep_configs(const Config& cfg) {
  std::vector<std::pair<std::string, Config>> out;
  if (cfg.sweep.empty()) {
    out.emplace_back("", cfg);
    return out;
  }
  const size_t eq = cfg.sweep.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 >= cfg.sweep.size())
    throw UsageError("config: sweep = '" + cfg.sweep + "' is invalid; expected KEY=V1,V2,... (e.g. sweep=seq=128K,256K,1M)");
  const std::string key = cfg.sweep.substr(0, eq);
  if (key == "sweep" || key == "mode") throw UsageError("config: sweep = '" + cfg.sweep + "' cannot sweep '" + key + "'");
  std::vector<std::string> base;
  for (const Field& f : config_fields())
    if (f.name != "sweep") base.push_back(std::string(f.name) + "=" + field_text(cfg, f));
  // Values may themselves hold commas (predict_mesh=tp:8,ring:2): split on ';' when present.
  const char sep = cfg.sweep.find(';') != std::string::npos ? ';' : ',';
  std::vector<std::string> values;
  if (const std::string err = split_list(cfg.sweep.substr(eq + 1), sep, values); !err.empty())
    throw UsageError("config: sweep = '" + cfg.sweep + "': " + err + "; expected KEY=V1,V2,... (e.g. sweep=seq=128K,256K,1M)");
  for (const std::string& v : values) {
    std::vector<std::string> ov = base;
    ov.push_back(key + "=" + v);
    Config c = parse_config("", "sweep", ov);  // unknown key / bad value → UsageError naming it
    c.mode = cfg.mode;
    c.bench = cfg.bench;
    out.emplace_back(v, c);
  }
  if (out.empty()) throw UsageError("config: sweep = '" + cfg.sweep + "' has no values");
  return out;
}

}  // namespace

std::string resolve_auto_strategy(Config& cfg, Topology& topo) {
  if (cfg.strategy != "auto") return "";
  if (cfg.mode == Mode::predict) return "";  // predict tabulates every strategy anyway
  if (cfg.mode == Mode::bench && cfg.bench != Bench::cp && cfg.bench != Bench::train && cfg.bench != Bench::infer)
    return "config: strategy = auto applies to modes that run a CP strategy (run, attn, train, prefill, decode, chat, "
           "bench cp/train/infer); valid here: " + strategies_with(CpSchedule::plain);
  HardwareProfile hw;
  try {
    hw = load_hardware(hardware_name(cfg, HardwareUse::plan));
  } catch (const UsageError& e) {
    return std::string("config: strategy = auto needs a hardware profile: ") + e.what();
  }
  const bool infer = cfg.mode == Mode::prefill || cfg.mode == Mode::decode || cfg.mode == Mode::chat ||
                     (cfg.mode == Mode::bench && cfg.bench == Bench::infer);
  if (infer && cfg.attention == "mla")
    return "config: strategy = auto: the cost model prices attention = mla in training only (inference attends in "
           "the absorbed form, which it does not price yet); valid: " + strategies_with(CpSchedule::plain);
  const PerfMesh mesh{topo.size(Axis::dp), topo.size(Axis::tp), topo.size(Axis::ulysses), topo.size(Axis::ring)};
  PerfWorkload w;
  w.mode = infer ? PerfMode::prefill : PerfMode::train;  // inference: the full prefill runs the strategy
  w.seq = cfg.seq;
  w.batch = infer ? cfg.batch : 1;  // training and the attention workloads: one sequence per replica
  w.precision = Precision::fp32;  // the executed CPU path computes in fp32
  w.remat = cfg.remat;
  w.partition = PartitionKind::zigzag;
  const ModelShape m = model_shape(cfg);
  // The registry's training strategies (the cost model prices the ring's row in a prefill as
  // pass-KV). A configured schedule (the visible keys': the strategies that move just the visible
  // rows, priced as the plain ones, an upper bound): only the strategies with a row of it are
  // candidates.
  const CpSchedule sched = cfg.cp_schedule();
  std::vector<StrategyPrediction> preds;
  for (const std::string& run_name : strategy_names()) {
    StrategyPrediction p = predict(m, hw, mesh, w, run_name);
    // usp runs on any mesh (one axis of 1 makes it ulysses or ring, as the runs do); on such a
    // mesh it is not a candidate of its own.
    const std::string alias = same_as(run_name, mesh);
    if (!alias.empty() && p.invalid.empty()) p.invalid = "the same as " + alias + " on this mesh";
    if (sched != CpSchedule::plain && p.invalid.empty() && !has_schedule(run_name, sched))
      p.invalid = "moves every key row (" + schedule_key(sched) + " = true)";
    p.strategy = run_name;
    preds.push_back(p);
  }
  const int best = recommend(preds);
  if (best < 0) return "config: strategy = auto: no strategy is valid for mesh " + cfg.mesh + " and this model";
  std::ostringstream os;
  os << "# strategy=auto (cost model, hardware " << hw.name << ", " << name_of(w.mode) << ", S = " << w.seq
     << "):";
  for (const StrategyPrediction& p : preds) {
    os << " " << p.strategy << " ";
    if (p.invalid.rfind("the same as", 0) == 0) os << "(" << p.invalid << ")";
    else if (!p.invalid.empty()) os << "invalid";
    else os << p.time_s * 1e3 << " ms";
    os << (&p == &preds[size_t(best)] ? " (chosen)" : "") << ";";
  }
  cfg.strategy = preds[size_t(best)].strategy;
  log0("%s\n", os.str().c_str());
  return "";
}

std::string validate_predict_mode(const Config& cfg, Topology& topo) {
  try {
    for (const auto& [v, c] : sweep_configs(cfg)) {
      // Each swept configuration passes the checks the same settings pass on the command line.
      try {
        validate_config(c, topo.world().size());
      } catch (const UsageError& e) {
        throw UsageError("sweep value '" + v + "': " + e.what());
      }
      const HardwareProfile hw = load_hardware(hardware_name(c, HardwareUse::plan));
      const PerfWorkload w = workload_of(c, hw);
      if (w.precision == Precision::fp8_ffn && hw.peak_fp8_flops <= 0)
        return "config: predict_precision = fp8_ffn but hardware " + hw.name + " has no FP8 peak; valid: bf16 or fp32";
      if (c.heads % c.kv_heads != 0 && c.attention != "mla") return "config: heads must be a multiple of kv_heads";
      if (c.attention == "mla" && w.mode != PerfMode::train)
        return "config: attention = mla: predict prices it in training (predict_mode=train); inference with the latent "
               "KV cache is not built yet";
      if (w.mode != PerfMode::train && c.layer_pattern.find('D') != std::string::npos)
        return "config: layer_pattern = '" + c.layer_pattern + "' has Gated DeltaNet layers (D): predict prices them in " +
               "training (predict_mode=train); the inference modes do not serve them yet";
      if (w.mode == PerfMode::partial_prefill && (w.cached <= 0 || w.cached >= w.seq))
        return "config: predict_mode = partial_prefill needs 0 < cached < seq (cached = " + std::to_string(w.cached) +
               ", seq = " + std::to_string(w.seq) + "); set cached=P or miss_rate below 1";
      // A tp that divides neither the heads nor the FFN fits no strategy: bad input, not a table of "-".
      if (const PerfMesh m = predicted_mesh(c); c.heads % m.tp != 0 || c.ffn_dim % m.tp != 0) {
        std::string valid;
        for (int64_t t = 1; t <= std::min(c.heads, c.ffn_dim); ++t)
          if (c.heads % t == 0 && c.ffn_dim % t == 0) valid += (valid.empty() ? "" : ", ") + std::to_string(t);
        const bool h = c.heads % m.tp != 0;
        return "config: predict_mesh = '" + (c.predict_mesh.empty() ? c.mesh : c.predict_mesh) + "': tp:" +
               std::to_string(m.tp) + " does not divide " + (h ? "heads = " + std::to_string(c.heads)
                                                              : "ffn_dim = " + std::to_string(c.ffn_dim)) +
               "; valid: tp in {" + valid + "} (dividing heads and ffn_dim)";
      }
    }
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

int run_predict(const Config& cfg, Topology& topo, Tracer& tracer) {
  (void)tracer;
  const auto configs = sweep_configs(cfg);
  const std::string sweep_key = cfg.sweep.empty() ? "" : cfg.sweep.substr(0, cfg.sweep.find('='));
  std::vector<TableColumn> cols = {
      {"mode", "mode", "", 16, 0},        {"hardware", "hardware", "", 11, 0},
      {"mesh", "mesh", "", 22, 0},        {"seq", "S", "tokens", 9, 0},
      {"cached", "P", "tokens", 9, 0},    {"strategy", "strategy", "", 10, 0},
      {"time_s", "time", "s", 11, 4},     {"mfu_pct", "MFU", "%", 7, 1},
      {"gemm_s", "gemm", "s", 10, 4},     {"attn_s", "attn", "s", 10, 4},
      {"other_s", "other", "s", 9, 4},    {"comm_s", "comm", "s", 10, 4},
      {"exposed_comm_s", "exposed", "s", 10, 4}, {"mem_gib", "mem/chip", "GiB", 10, 2},
      {"fits", "fits", "", 5, 0},         {"recommended", "best", "", 5, 0},
      {"note", "note", "", 3, 0}};
  std::vector<std::string> notes = {
      std::string("FLOP convention: ") + kFlopConvention +
          "; MFU = model FLOPs / (time * chips * peak of the profile's dense precision)",
      "time: train = one step; prefill / partial_prefill = TTFT; decode = TTIT (one token)",
      "attn includes the ring's hidden communication; exposed = communication on the critical path"};
  if (cfg.layer_pattern.find('L') != std::string::npos)
    notes.push_back(cfg.predict_mode == PerfMode::train
                        ? "layers " + cfg.layer_pattern + ": the strategy column is the global (G) layers'; the local (L) " +
                              "layers, window " + std::to_string(cfg.window) + ", are priced with local_strategy " +
                              cfg.local_strategy + " in every row"
                        : "layers " + cfg.layer_pattern + ": inference rows price the local (L) layers as global ones " +
                              "(their window is not priced yet: an upper bound)");
  Table t("ctxpar predict — cost model per strategy (src/perf/cost_model.hpp states the overlap rules)", cols,
               notes);
  std::vector<std::string> recs;
  for (const auto& [value, c] : configs) {
    const HardwareProfile hw = load_hardware(hardware_name(c, HardwareUse::plan));
    const ModelShape m = model_shape(c);
    const PerfMesh mesh = predicted_mesh(c);
    const PerfWorkload w = workload_of(c, hw);
    std::vector<StrategyPrediction> preds;
    for (const std::string& s : perf_strategies(w.mode)) preds.push_back(predict(m, hw, mesh, w, s));
    const int best = recommend(preds);
    for (size_t i = 0; i < preds.size(); ++i) {
      const StrategyPrediction& p = preds[i];
      const bool ok = p.invalid.empty();
      auto num = [&](size_t col, double v) { return ok ? t.cell(col, v) : std::string("-"); };
      // usp runs on any mesh; with one of its axes of size 1 it is ring (pass-KV) or ulysses.
      const std::string alias = same_as(p.strategy, mesh);
      const std::string note = !ok              ? "\"invalid: " + p.invalid + "\""
                               : !alias.empty() ? "\"the same as " + alias + " on this mesh\""
                                                : std::string();
      t.add_row({name_of(w.mode), hw.name, mesh_text(mesh), std::to_string(w.seq), std::to_string(w.cached), p.strategy,
                 num(6, p.time_s), num(7, 100 * p.mfu), num(8, p.gemm_s), num(9, p.attn_s), num(10, p.other_s),
                 num(11, p.comm_total_s), num(12, p.exposed_comm_s), num(13, p.mem_bytes / double(1ull << 30)),
                 ok ? (p.fits ? "yes" : "no") : "-", int(i) == best ? "*" : "", note});
    }
    std::ostringstream rec;
    rec << "# recommended" << (sweep_key.empty() ? "" : " for " + sweep_key + "=" + value) << ": ";
    if (best < 0) rec << "none (no strategy is valid on " << mesh_text(mesh) << ")";
    else
      rec << preds[size_t(best)].strategy << " (" << preds[size_t(best)].time_s << " s"
          << (preds[size_t(best)].fits ? "" : "; nothing fits in memory, fastest shown") << ")";
    recs.push_back(rec.str());
  }
  if (topo.world().rank() == 0) {
    t.print(cfg.csv);
    if (!cfg.csv)
      for (const std::string& r : recs) log0("%s\n", r.c_str());
  }
  return 0;
}

}  // namespace ctxpar
