// `ctxpar predict`: the cost model's table for a model (the model fields, e.g. --config
// inputs/llama3-405b.toml), a hardware profile (hardware=h100-gtt) and a predicted mesh
// (predict_mesh=tp:8,ring:16, which need not match this job's ranks: predict runs on one rank
// for clusters we do not have). One row per strategy — time, MFU, compute split, exposed and total
// communication, memory per chip, fits — and the recommended strategy; `sweep=seq=128K,1M`
// repeats the table for each value of one key; `--csv` prints the rows as CSV.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "core/clock.hpp"
#include "core/table.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "model/data.hpp"
#include "model/flops.hpp"
#include "modes/modes.hpp"
#include "ops.hpp"
#include "perf/cost_model.hpp"
#include "perf/hardware.hpp"
#include "perf/prefill_choice.hpp"
#include "shard/partition.hpp"
#include "shard/placement.hpp"

namespace ctxpar {

namespace {

PerfMesh predicted_mesh(const Config& cfg) {
  const MeshSpec s = parse_mesh(cfg.predict_mesh.empty() ? cfg.mesh : cfg.predict_mesh, 1);
  return PerfMesh{s.dp, s.tp, s.ulysses, s.ring};
}

// The mesh as predict_mesh takes it (the CSV quotes it): tp:8,ring:16; "1" for one chip.
std::string mesh_text(const PerfMesh& m) {
  std::string s;
  auto add = [&](const char* n, int64_t v) {
    if (v > 1) s += (s.empty() ? "" : ",") + std::string(n) + ":" + std::to_string(v);
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
  w.shard = cfg.shard;
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
  // Values are separated by ',' or ';'; those of predict_mesh hold commas (tp:8,ring:2), so ';'.
  const char sep = key == "predict_mesh" || cfg.sweep.find(';') != std::string::npos ? ';' : ',';
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

// What ctxpar would need to run the predicted workload ("" when train / the inference modes run
// it): predict prices a few features the executed paths do not have yet.
std::string missing_feature(const PerfWorkload& w) {
  if (w.precision == Precision::fp8_ffn) return "ctxpar runs no FP8 GEMMs yet (predict_precision = fp8_ffn)";
  return "";
}

// Tokens a prediction's time covers: a training step's dp * batch sequences, a prefill's new
// tokens of its batch, a decode step's one token per sequence.
double tokens_of(const PerfWorkload& w, const PerfMesh& mesh) {
  if (w.mode == PerfMode::train) return double(mesh.dp * w.batch * w.seq);
  if (w.mode == PerfMode::decode) return double(w.batch);
  return double(w.batch * w.T());
}

// Every mesh of `chips` chips: tp dividing heads and ffn_dim, then ulysses x ring (x dp in
// training; an inference request runs on all the chips, so dp = 1 there).
std::vector<PerfMesh> meshes_of(int64_t chips, const Config& c, bool with_dp) {
  std::vector<PerfMesh> out;
  for (int64_t dp = 1; dp <= (with_dp ? chips : 1); ++dp) {
    if (chips % dp != 0) continue;
    for (int64_t tp = 1; tp <= chips / dp; ++tp) {
      if ((chips / dp) % tp != 0 || c.heads % tp != 0 || c.ffn_dim % tp != 0) continue;
      const int64_t cp = chips / dp / tp;
      for (int64_t u = 1; u <= cp; ++u)
        if (cp % u == 0) out.push_back(PerfMesh{dp, tp, u, cp / u});
    }
  }
  return out;
}

// The one CP layout a strategy is searched with (train runs any strategy on any split of its CP
// ranks, and the cost model prices them alike): the all-to-all on the ulysses axis, the ring,
// pass-KV, pass-Q and the all-gather on the ring axis, the all-to-all + ring on both axes. On a
// mesh without CP every strategy is the same: the first one stands for them.
bool searched_layout(const std::string& s, const PerfMesh& m, const std::string& first) {
  if (m.cp() == 1) return s == first;
  const StrategyRow* row = strategy_row(s);
  const CommPattern comm = row ? row->comm : CommPattern::kv_ring;  // pass_kv, pass_q: a ring
  if (comm == CommPattern::heads_ring) return m.ulysses >= 2 && m.ring >= 2;
  return splits_heads(comm) ? m.ring == 1 : m.ulysses == 1;
}

// One candidate: a mesh, a strategy and (training) a remat setting, priced.
struct Candidate {
  PerfMesh mesh;
  PerfWorkload w;
  StrategyPrediction p;
  double tokens_per_s = 0;
};

// Predicts every (mesh, strategy, remat) of `chips` chips; the valid ones, fastest first (training
// by throughput: dp changes the tokens of a step).
std::vector<Candidate> search(const Config& c, const HardwareProfile& hw, const PerfWorkload& base, size_t& priced) {
  const ModelShape m = model_shape(c);
  const bool train = base.mode == PerfMode::train;
  const std::vector<Remat> remats = train ? std::vector<Remat>{Remat::none, Remat::attention, Remat::full}
                                          : std::vector<Remat>{base.remat};
  const std::vector<std::string> strategies = perf_strategies(base.mode);
  std::vector<Candidate> out;
  for (const PerfMesh& mesh : meshes_of(c.predict_chips, c, train))
    for (const std::string& s : strategies) {
      if (!searched_layout(s, mesh, strategies.front())) continue;
      for (Remat r : remats) {
        PerfWorkload w = base;
        w.remat = r;
        StrategyPrediction p = predict(m, hw, mesh, w, s);
        ++priced;
        if (!p.invalid.empty() || p.time_s <= 0) continue;
        out.push_back(Candidate{mesh, w, p, tokens_of(w, mesh) / p.time_s});
      }
    }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    if (a.p.fits != b.p.fits) return a.p.fits;
    return a.p.fits ? a.tokens_per_s > b.tokens_per_s : a.p.mem_bytes < b.p.mem_bytes;
  });
  return out;
}

// The recommendation line of a mesh search.
std::string search_summary(const Config& c, const HardwareProfile& hw, const std::vector<Candidate>& cands,
                           size_t priced, const std::string& label) {
  const size_t fit = size_t(std::count_if(cands.begin(), cands.end(), [](const Candidate& x) { return x.p.fits; }));
  std::ostringstream os;
  os << std::setprecision(4) << "# " << c.predict_chips << " chips" << label << ": " << priced
     << " (mesh, strategy" << (c.predict_mode == PerfMode::train ? ", remat" : "") << ") priced, " << cands.size()
     << " valid, " << fit << " fit in " << hw.hbm_bytes / double(1ull << 30) << " GiB per chip; ";
  if (cands.empty()) return os.str() + "no strategy runs on any mesh of these chips";
  const Candidate& b = cands.front();
  if (fit == 0) {
    os << "none fits: the least memory is " << b.p.mem_bytes / double(1ull << 30) << " GiB (" << mesh_text(b.mesh)
       << " " << b.p.strategy << ")";
    if (b.w.shard != ShardLevel::params && b.w.mode == PerfMode::train)
      os << "; try shard=params to see what sharded state would fit";
    return os.str();
  }
  os << "best: " << mesh_text(b.mesh) << " strategy=" << b.p.strategy;
  if (b.w.mode == PerfMode::train) os << " remat=" << name_of(b.w.remat);
  os << " (" << b.p.time_s << " s";
  if (const std::string miss = missing_feature(b.w); !miss.empty()) os << "; not runnable yet: " << miss;
  return os.str() + ")";
}

std::string fixed(double v, int precision) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(precision) << v;
  return os.str();
}

// strategy=auto's tie rule: the registry's default strategy (the ring) when it is valid, fits as
// the best does and is predicted within `margin` of it; else the best.
int tie_to_default(const std::vector<StrategyPrediction>& preds, int best, double margin) {
  const std::string& def = strategy_choices().training_default;
  const StrategyPrediction& b = preds[size_t(best)];
  for (size_t i = 0; i < preds.size(); ++i) {
    const StrategyPrediction& p = preds[i];
    if (p.strategy == def && p.invalid.empty() && p.fits == b.fits && p.time_s <= (1 + margin) * b.time_s) return int(i);
  }
  return best;
}

// The log's verdict: how far the fastest is ahead of the next, against the model's expected error.
std::string verdict_text(const std::vector<StrategyPrediction>& preds, int best, int chosen, double margin) {
  const StrategyPrediction& b = preds[size_t(best)];
  const std::string err = "the model's " + fixed(100 * margin, 0) + "% error";
  if (chosen != best)
    return "a tie: " + b.strategy + " ahead of " + preds[size_t(chosen)].strategy + " by " +
           fixed(100 * (preds[size_t(chosen)].time_s / b.time_s - 1), 1) + "%, within " + err + "; " +
           preds[size_t(chosen)].strategy + ", the default";
  int next = -1;  // the runner-up
  for (size_t i = 0; i < preds.size(); ++i)
    if (int(i) != best && preds[i].invalid.empty() && (next < 0 || preds[i].time_s < preds[size_t(next)].time_s))
      next = int(i);
  if (next < 0) return "the only valid strategy";
  const double gap = preds[size_t(next)].time_s / b.time_s - 1;
  return b.strategy + " ahead of " + preds[size_t(next)].strategy + " by " + fixed(100 * gap, 1) + "%, " +
         (gap > margin ? "beyond " + err : "within " + err + ": a tie" +
                                               (b.strategy == strategy_choices().training_default ? ", and the default" : ""));
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
  const int chosen = tie_to_default(preds, best, choice_margin(hw));
  std::ostringstream os;
  os << "# strategy=auto (cost model, hardware " << hw.name << ", " << name_of(w.mode) << ", S = " << w.seq
     << "):";
  for (const StrategyPrediction& p : preds) {
    os << " " << p.strategy << " ";
    if (p.invalid.rfind("the same as", 0) == 0) os << "(" << p.invalid << ")";
    else if (!p.invalid.empty()) os << "invalid";
    else os << p.time_s * 1e3 << " ms";
    os << (&p == &preds[size_t(chosen)] ? " (chosen)" : "") << ";";
  }
  os << " " << verdict_text(preds, best, chosen, choice_margin(hw));
  cfg.strategy = preds[size_t(chosen)].strategy;
  log0("%s\n", os.str().c_str());
  if (const std::string warn = profile_mismatch(hw, cfg); !warn.empty()) log0("# %s\n", warn.c_str());
  return "";
}

std::string validate_predict_mode(const Config& cfg, Topology& topo) {
  try {
    const auto configs = sweep_configs(cfg);
    for (const auto& [v, c] : configs) {
      if ((c.predict_chips > 0) != (configs.front().second.predict_chips > 0))
        return "config: sweep = '" + cfg.sweep + "': predict_chips = 0 (one mesh) and > 0 (a search) in one sweep; " +
               "valid: predict_chips values all above 0";
      // Each swept configuration passes the checks the same settings pass on the command line.
      try {
        validate_config(c, topo.world().size());
      } catch (const UsageError& e) {
        throw UsageError("sweep value '" + v + "': " + e.what());
      }
      if (!synthetic_data(c)) {  // a token file: its documents placed over the CP group (print_placement)
        if (c.eos_id < 0)
          return "config: data = '" + c.data + "' in predict: its documents are placed over the CP group, and " +
                 "eos_id = -1 marks none; valid: eos_id=<the token that ends a document>";
        if (c.predict_chips > 0)
          return "config: data = '" + c.data + "' with predict_chips: placement is reported for predict_mesh's CP " +
                 "group (or this job's), not for a mesh search; valid: predict_mesh=ring:N";
        const std::string err = validate_data(c);
        if (!err.empty()) return err;
      }
      if (c.predict_chips > 0 && !c.predict_mesh.empty())
        return "config: predict_chips = " + std::to_string(c.predict_chips) + " and predict_mesh = '" + c.predict_mesh +
               "': give one (predict_chips searches the meshes of that many chips; predict_mesh prices one mesh)";
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
      if (const PerfMesh m = predicted_mesh(c); c.predict_chips == 0 && (c.heads % m.tp != 0 || c.ffn_dim % m.tp != 0)) {
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

namespace {

// data = a token file: zigzag against balanced placement (shard/placement.hpp) of its batches over
// each configuration's CP group (and per-document zigzag, placement=document: the dynamic-CP papers'
// baseline), from the document lengths alone (no kernel runs): the work's
// balance, the rows the frugal exchange moves, the attention compute's critical path, and the
// time placing one batch takes. Up to kPlacedBatches windows, spread evenly over the file.
constexpr int64_t kPlacedBatches = 32;

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// One batch's placements over a CP group, priced as a training step (placed_attention_s): the
// plain ring on zigzag rows, the frugal ring on them, on the balanced placement and on every
// document zigzag on its own; auto runs the cheaper of zigzag and balanced (a tie keeps zigzag),
// as make_batch does.
struct PlacedBatch {
  double zz_work = 0, bal_work = 0, doc_work = 0, zz_recv = 0, bal_recv = 0, doc_recv = 0, attn_gain = 0, place_ms = 0;
  double ring_s = 0, frugal_s = 0, balanced_s = 0, document_s = 0, auto_s = 0;
  bool auto_balanced = false;
};

PlacedBatch place_batch(const std::vector<int64_t>& lengths, int P, int64_t n, const ModelShape& m,
                        const HardwareProfile& hw, const PerfMesh& mesh, const PerfWorkload& w, double rest_s) {
  PlacedBatch r;
  const double t0 = now_s();
  const Placement bal = balanced_placement(lengths, P, n);
  r.place_ms = (now_s() - t0) * 1e3;
  const Placement zz = zigzag_placement(lengths, P), doc = document_placement(lengths, P);
  const double ring = double(n) * double(P - 1);
  const auto top = [](const std::vector<int64_t>& v) { return double(*std::max_element(v.begin(), v.end())); };
  const auto recv = [&](const Placement& p) { return P > 1 ? top(rows_received(p, lengths)) : 0.0; };
  const double zr = recv(zz), br = recv(bal), dr = recv(doc);
  r.zz_work = zz.imbalance();
  r.bal_work = bal.imbalance();
  r.doc_work = doc.imbalance();
  r.zz_recv = P > 1 ? zr / ring : 0.0;
  r.bal_recv = P > 1 ? br / ring : 0.0;
  r.doc_recv = P > 1 ? dr / ring : 0.0;
  r.attn_gain = top(zz.work) / std::max(1.0, top(bal.work));
  r.ring_s = rest_s + placed_attention_s(m, hw, mesh, w, top(zz.work), ring);
  r.frugal_s = rest_s + placed_attention_s(m, hw, mesh, w, top(zz.work), zr);
  r.balanced_s = rest_s + placed_attention_s(m, hw, mesh, w, top(bal.work), br);
  r.document_s = rest_s + placed_attention_s(m, hw, mesh, w, top(doc.work), dr);
  r.auto_balanced = r.balanced_s < r.frugal_s;
  r.auto_s = std::min(r.frugal_s, r.balanced_s);
  return r;
}

void print_placement(const Config& cfg, const std::vector<std::pair<std::string, Config>>& configs) {
  std::vector<TableColumn> cols = {
      {"ranks", "ranks", "", 6, 0},           {"seq", "S", "tokens", 9, 0},
      {"batches", "batches", "", 8, 0},       {"zigzag_work", "zigzag", "max/mean", 9, 3},
      {"zigzag_worst", "worst", "", 7, 3},    {"balanced_work", "balanced", "max/mean", 9, 3},
      {"balanced_worst", "worst", "", 7, 3},  {"zigzag_recv", "zz recv", "/ring", 8, 3},
      {"balanced_recv", "bal recv", "/ring", 9, 3}, {"attn_gain", "attn gain", "x", 10, 3},
      {"step_ring_ms", "step ring", "ms", 11, 2}, {"step_frugal_ms", "frugal", "ms", 11, 2},
      {"step_balanced_ms", "balanced", "ms", 11, 2}, {"step_auto_ms", "auto", "ms", 11, 2},
      {"auto_balanced", "auto bal", "share", 9, 2}, {"place_ms", "place", "ms", 9, 2},
      {"document_work", "document", "max/mean", 9, 3}, {"document_recv", "doc recv", "/ring", 9, 3},
      {"step_document_ms", "document", "ms", 11, 2}};
  const std::vector<std::string> notes = {
      "data " + cfg.data + " (eos " + std::to_string(cfg.eos_id) + "): up to " + std::to_string(kPlacedBatches) +
          " windows of S tokens, spread evenly; medians over them",
      "work: causal (query, key) pairs within documents per rank, max / mean; recv: rows of other ranks some query of a "
      "rank sees (the frugal exchange's K/V rows, forward), max over ranks, / a ring's (P-1) S/P",
      "attn gain: zigzag's busiest rank's pairs / balanced's (the attention compute on the critical path)",
      "step: a training step of one sequence per replica on the hardware profile (predict's ring, its attention priced "
      "per batch: the busiest rank's pairs pipelined with the rows it receives over the ring's steps, "
      "perf/cost_model.hpp placed_attention_s), medians over the batches: the plain ring on zigzag rows, the frugal "
      "ring on them, on the balanced placement, and placement=auto's choice of the two; auto bal: the share of "
      "batches auto places balanced. Not priced: more chunk borders (kernel calls), the positions a placed batch gathers",
      "place: one batch's balanced placement, computed on every rank every step",
      "document: every document zigzag over all ranks on its own (placement=document: the packed-sequence layout of "
      "Transformer Engine and Megatron-LM, the dynamic-CP papers' baseline): its work, rows received and step, priced "
      "as the frugal ring on it"};
  Table t("ctxpar predict — placement of packed documents (zigzag against placement=balanced and document)", cols, notes);
  for (const auto& [value, c] : configs) {
    const PerfMesh mesh = predicted_mesh(c);
    const int P = int(mesh.cp());
    const int64_t windows = token_windows(c), batches = std::min(windows, kPlacedBatches);
    const int64_t n = Partition::padded_length(PartitionKind::zigzag, c.seq, P) / P;
    const HardwareProfile hw = load_hardware(hardware_name(c, HardwareUse::plan));
    PerfWorkload w = workload_of(c, hw);
    w.mode = PerfMode::train;
    w.batch = 1;
    w.partition = PartitionKind::zigzag;
    const ModelShape m = model_shape(c);
    const StrategyPrediction ring = predict(m, hw, mesh, w, "ring");
    // What does not depend on the placement: the step less its global layers' attention as the
    // ring prices them on the whole (one-document) sequence.
    const double S = double(c.seq);
    const double rest = ring.time_s - placed_attention_s(m, hw, mesh, w, S * (S + 1) / 2 / double(P), double(n) * (P - 1));
    std::vector<PlacedBatch> pb;
    for (int64_t b = 0; b < batches; ++b)
      pb.push_back(place_batch(sample_document_lengths(c, b * (windows / batches)), P, n, m, hw, mesh, w, rest));
    const auto med = [&](double PlacedBatch::*f) {
      std::vector<double> v;
      for (const PlacedBatch& x : pb) v.push_back(x.*f);
      return median_of(v);
    };
    const auto worst = [&](double PlacedBatch::*f) {
      double x = 0;
      for (const PlacedBatch& y : pb) x = std::max(x, y.*f);
      return x;
    };
    double auto_bal = 0;
    for (const PlacedBatch& x : pb) auto_bal += x.auto_balanced ? 1.0 / double(pb.size()) : 0.0;
    t.add_row({std::to_string(P), std::to_string(c.seq), std::to_string(batches), t.cell(3, med(&PlacedBatch::zz_work)),
               t.cell(4, worst(&PlacedBatch::zz_work)), t.cell(5, med(&PlacedBatch::bal_work)),
               t.cell(6, worst(&PlacedBatch::bal_work)), t.cell(7, med(&PlacedBatch::zz_recv)),
               t.cell(8, med(&PlacedBatch::bal_recv)), t.cell(9, med(&PlacedBatch::attn_gain)),
               t.cell(10, 1e3 * med(&PlacedBatch::ring_s)), t.cell(11, 1e3 * med(&PlacedBatch::frugal_s)),
               t.cell(12, 1e3 * med(&PlacedBatch::balanced_s)), t.cell(13, 1e3 * med(&PlacedBatch::auto_s)),
               t.cell(14, auto_bal), t.cell(15, med(&PlacedBatch::place_ms)), t.cell(16, med(&PlacedBatch::doc_work)),
               t.cell(17, med(&PlacedBatch::doc_recv)), t.cell(18, 1e3 * med(&PlacedBatch::document_s))});
  }
  t.print(cfg.csv);
}

// A mesh search (predict_chips): the best fitting candidates of each swept configuration.
void print_mesh_search(const Config& cfg, const std::vector<std::pair<std::string, Config>>& configs) {
  constexpr size_t kShown = 8;
  std::vector<TableColumn> cols = {
      {"chips", "chips", "", 6, 0},       {"mode", "mode", "", 10, 0},      {"hardware", "hardware", "", 10, 0},
      {"seq", "S", "tokens", 9, 0},       {"mesh", "mesh", "", 24, 0},      {"strategy", "strategy", "", 10, 0},
      {"remat", "remat", "", 10, 0},      {"time_s", "time", "s", 10, 4},   {"tokens_per_s", "throughput", "tok/s", 12, 0},
      {"mfu_pct", "MFU", "%", 7, 1},      {"comm_s", "comm", "s", 9, 4},    {"exposed_comm_s", "exposed", "s", 9, 4},
      {"mem_gib", "mem/chip", "GiB", 10, 2}, {"fits", "fits", "", 5, 0},    {"note", "note", "", 3, 0}};
  Table t("ctxpar predict — the best meshes and strategies for predict_chips chips (cost model)", cols,
          {std::string("FLOP convention: ") + kFlopConvention + "; MFU against the profile's dense peak",
           "searched: tp x ulysses x ring (tp dividing heads and ffn_dim), x dp and remat in training; ranked by "
           "throughput (train: dp x batch x S tokens a step) among those that fit, else by memory",
           "time: train = one step; prefill / partial_prefill = TTFT; decode = TTIT (one token)"});
  std::vector<std::string> lines;
  for (const auto& [value, c] : configs) {
    const HardwareProfile hw = load_hardware(hardware_name(c, HardwareUse::plan));
    PerfWorkload w = workload_of(c, hw);
    if (c.predict_precision == Precision::automatic && !missing_feature(w).empty()) {
      w.precision = Precision::bf16;  // the profile's default (FP8 FFN GEMMs) is not built: the runnable one
      lines.push_back("# " + std::to_string(c.predict_chips) + " chips: priced in bf16 (hardware " + hw.name +
                      "'s default, fp8_ffn, is not runnable yet; predict_precision=fp8_ffn prices it)");
    }
    size_t priced = 0;
    std::vector<Candidate> cands = search(c, hw, w, priced);
    std::string label;
    if (c.shard != ShardLevel::params && w.mode == PerfMode::train && !cands.empty() && !cands.front().p.fits) {
      w.shard = ShardLevel::params;  // nothing fits: show what sharded training state would fit
      size_t more = 0;
      std::vector<Candidate> z = search(c, hw, w, more);
      if (!z.empty() && z.front().p.fits) {
        lines.push_back(search_summary(c, hw, cands, priced, ""));
        cands = std::move(z);
        priced = more;
        label = " with shard=params";
      }
    }
    lines.push_back(search_summary(c, hw, cands, priced, label));
    for (size_t i = 0; i < std::min(kShown, cands.size()); ++i) {
      const Candidate& x = cands[i];
      t.add_row({std::to_string(c.predict_chips), name_of(x.w.mode), hw.name, std::to_string(x.w.seq), mesh_text(x.mesh),
                 x.p.strategy, x.w.mode == PerfMode::train ? name_of(x.w.remat) : "-", t.cell(7, x.p.time_s),
                 t.cell(8, x.tokens_per_s), t.cell(9, 100 * x.p.mfu), t.cell(10, x.p.comm_total_s),
                 t.cell(11, x.p.exposed_comm_s), t.cell(12, x.p.mem_bytes / double(1ull << 30)), x.p.fits ? "yes" : "no",
                 missing_feature(x.w).empty() ? "" : "not runnable yet"});
    }
  }
  t.print(cfg.csv);
  if (!cfg.csv)
    for (const std::string& l : lines) log0("%s\n", l.c_str());
}

}  // namespace

int run_predict(const Config& cfg, Topology& topo, Tracer& tracer) {
  (void)tracer;
  const auto configs = sweep_configs(cfg);
  if (topo.world().rank() == 0 && !cfg.csv) {  // a calibrated profile measured elsewhere: say so once
    const std::string warn = profile_mismatch(load_hardware(hardware_name(cfg, HardwareUse::plan)), cfg);
    if (!warn.empty()) log0("# %s\n", warn.c_str());
  }
  if (configs.front().second.predict_chips > 0) {  // validate_predict_mode: all or none of a sweep search
    if (topo.world().rank() == 0) print_mesh_search(cfg, configs);
    return 0;
  }
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
  if (cfg.predict_mesh.empty())
    notes.push_back("mesh: this job's (" +
                    (predicted_mesh(cfg).chips() == 1 ? std::string("one chip") : mesh_text(predicted_mesh(cfg))) +
                    "); predict_mesh=tp:8,ring:16 prices another, " +
                    "predict_chips=N searches every mesh of N chips");
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
      const std::string note = !ok              ? "invalid: " + p.invalid
                               : !alias.empty() ? "the same as " + alias + " on this mesh"
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
          << (preds[size_t(best)].fits ? "" : "; nothing fits in memory, fastest shown")
          << (missing_feature(w).empty() ? "" : "; not runnable yet: " + missing_feature(w)) << ")";
    recs.push_back(rec.str());
  }
  if (topo.world().rank() == 0) {
    t.print(cfg.csv);
    if (!cfg.csv)
      for (const std::string& r : recs) log0("%s\n", r.c_str());
    if (!synthetic_data(cfg)) print_placement(cfg, configs);
  }
  return 0;
}

}  // namespace ctxpar
