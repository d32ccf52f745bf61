// The registry: one explicit table, in config order (greppable; nothing the linker can drop).
#include <cstdio>
#include <utility>

#include "core/config.hpp"
#include "cp/exact.hpp"
#include "cp/common.hpp"
#include "cp/gdn_cp.hpp"
#include "cp/strategy.hpp"
#include "cp/visible.hpp"
#include "shard/partition.hpp"

namespace ctxpar {
namespace {

using Factory = std::unique_ptr<CpStrategy> (*)(Topology&);
struct Entry {
  StrategyRow row;
  Factory make;
};
constexpr CpSchedule plain = CpSchedule::plain, exact = CpSchedule::exact, visible = CpSchedule::visible;
constexpr StrategyUse training = StrategyUse::training, inference = StrategyUse::inference, local = StrategyUse::local;
constexpr PartitionKind zigzag = PartitionKind::zigzag, contiguous = PartitionKind::contiguous;
constexpr MlaSupport latent = MlaSupport::latent, expanded = MlaSupport::expanded, refused = MlaSupport::refused,
                     absorbed = MlaSupport::absorbed;
constexpr CommPattern gather = CommPattern::gather, heads = CommPattern::heads, heads_ring = CommPattern::heads_ring,
                      kv_ring = CommPattern::kv_ring, q_ring = CommPattern::q_ring, window = CommPattern::window,
                      decode = CommPattern::decode;
// name, schedule, use, partition, MLA, device = cuda, messages; the factory
const Entry kStrategies[] = {
    {{"allgather", plain, training, zigzag, latent, true, gather}, make_allgather_strategy},
    {{"allgather", exact, training, zigzag, expanded, false, gather}, make_exact_allgather_strategy},
    {{"allgather", visible, training, zigzag, expanded, false, gather}, make_visible_allgather_strategy},
    {{"ulysses", plain, training, zigzag, refused, true, heads}, make_ulysses_strategy},
    {{"ulysses", exact, training, zigzag, refused, false, heads}, make_exact_ulysses_strategy},
    {{"ring", plain, training, zigzag, latent, true, kv_ring}, make_ring_strategy},
    {{"ring", exact, training, zigzag, expanded, false, kv_ring}, make_exact_ring_strategy},
    {{"ring", visible, training, zigzag, expanded, false, kv_ring}, make_visible_ring_strategy},
    {{"usp", plain, training, zigzag, refused, true, heads_ring}, make_usp_strategy},
    {{"usp", exact, training, zigzag, refused, false, heads_ring}, make_exact_usp_strategy},
    {{"halo", plain, local, zigzag, expanded, true, window}, make_halo_strategy},
    {{"pass_q", plain, inference, zigzag, absorbed, true, q_ring}, make_pass_q_strategy},
    {{"pass_q", exact, inference, zigzag, absorbed, false, q_ring}, make_exact_pass_q_strategy},
    {{"decode_pass_q", plain, inference, contiguous, absorbed, true, decode}, make_decode_pass_q_strategy},
    {{"decode_allgather", plain, inference, contiguous, absorbed, true, decode}, make_decode_allgather_strategy},
};
// The inference engine's rows by the settings that select them (the engine's cache rows: the
// ring's row serves a pass-KV prefill over the cache, S_k >= S_q).
const char* prefill_name(CpAlgoSetting a) { return a == CpAlgoSetting::pass_q ? "pass_q" : "ring"; }
const char* decode_name(DecodeAlgo a) { return a == DecodeAlgo::allgather ? "decode_allgather" : "decode_pass_q"; }

const Entry* find(const std::string& name, CpSchedule sched) {
  for (const Entry& e : kStrategies)
    if (name == e.row.name && e.row.schedule == sched) return &e;
  return nullptr;
}

std::vector<std::string> names_where(StrategyUse use, CpSchedule sched = plain) {
  std::vector<std::string> n;
  for (const Entry& e : kStrategies)
    if (e.row.use == use && e.row.schedule == sched) n.emplace_back(e.row.name);
  return n;
}

const char* use_name(StrategyUse u) { return u == training ? "training" : u == inference ? "inference" : "local"; }
std::string schedule_name(CpSchedule s) {  // e.g. "exact (deterministic=true)"
  if (s == plain) return "plain";
  return std::string(s == exact ? "exact" : "visible keys") + " (" + schedule_key(s) + "=true)";
}
const char* comm_name(CommPattern c) {
  switch (c) {
    case gather: return "gather";
    case heads: return "all-to-all";
    case heads_ring: return "all-to-all + K/V ring";
    case kv_ring: return "K/V ring";
    case q_ring: return "Q ring";
    case window: return "window's rows";
    case decode: return "decode";
  }
  return "?";
}
const char* mla_name(MlaSupport m) {
  return m == latent ? "moves the latent" : m == expanded ? "expanded K/V" : m == refused ? "refused" : "absorbed";
}

}  // namespace

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names = names_where(training);
  return names;
}

const std::vector<std::string>& inference_strategy_names() {
  static const std::vector<std::string> names = names_where(inference);
  return names;
}

const std::vector<std::string>& local_strategy_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = names_where(local);
    for (const std::string& t : names_where(training)) n.push_back(t);
    return n;
  }();
  return names;
}

bool has_schedule(const std::string& name, CpSchedule sched) { return find(name, sched) != nullptr; }

// The defaults: the ring (its messages overlap the compute, it serves every model feature and
// mesh) and the local row (halo: only the window's rows move).
void state_strategy_choices() {
  set_strategy_choices({strategy_names(), local_strategy_names(), training_row(kv_ring)->name,
                        local_strategy_names().front()});
}

std::string strategies_with(CpSchedule sched, const std::string& also) {
  std::vector<std::string> names = names_where(training, sched);
  if (!also.empty()) names.push_back(also);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

std::string schedule_refusal(const std::string& strategy, CpSchedule sched, const std::string& also) {
  if (has_schedule(strategy, sched)) return "";
  const std::string valid = "; valid: strategy=" + strategies_with(sched, also);
  if (sched == visible)
    return "config: frugal = true: strategy = " + strategy +
           " moves every key row (it splits heads or queries, not key rows)" + valid + ", or frugal=false";
  if (sched == exact)
    return "config: deterministic = true: strategy = " + strategy + " has no exact schedule" + valid +
           ", or deterministic=false";
  return "config: strategy = '" + strategy + "' is not built into this binary";
}

std::string schedule_key(CpSchedule sched) {
  return sched == exact ? "deterministic" : sched == visible ? "frugal" : "";
}
std::string schedule_suffix(CpSchedule sched) { return sched == exact ? ":det" : sched == visible ? ":frugal" : ""; }

std::unique_ptr<CpStrategy> make_strategy(const std::string& name, Topology& topo, CpSchedule sched) {
  const Entry* e = find(name, sched);
  return e ? e->make(topo) : nullptr;
}

const std::vector<StrategyRow>& strategy_rows() {
  static const std::vector<StrategyRow> rows = [] {
    std::vector<StrategyRow> r;
    for (const Entry& e : kStrategies) r.push_back(e.row);
    return r;
  }();
  return rows;
}

const StrategyRow* strategy_row(const std::string& name, CpSchedule sched) {
  for (const StrategyRow& r : strategy_rows())
    if (name == r.name && r.schedule == sched) return &r;
  return nullptr;
}

const StrategyRow& prefill_row(CpAlgoSetting algo) { return *strategy_row(prefill_name(algo)); }
const StrategyRow& decode_row(DecodeAlgo algo) { return *strategy_row(decode_name(algo)); }

const StrategyRow* training_row(CommPattern comm) {
  for (const StrategyRow& r : strategy_rows())
    if (r.use == training && r.schedule == plain && r.comm == comm) return &r;
  return nullptr;
}

std::string strategy_features_table() {
  std::string out =
      "# CP strategies and what each serves (src/cp/registry.cpp; held to the strategies by tests/mpi/test_cp.cpp)\n"
      "# every row serves sliding windows, and (its partition contiguous or zigzag) Gated DeltaNet layers beside it;\n"
      "# train refuses frugal=true with attention=mla (the plain ring and all-gather move the smaller latent)\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-17s %-31s %-10s %-10s %-17s %-11s %s\n", "strategy", "schedule", "use",
                "partition", "mla", "device=cuda", "messages");
  out += line;
  for (const StrategyRow& r : strategy_rows()) {
    std::snprintf(line, sizeof line, "%-17s %-31s %-10s %-10s %-17s %-11s %s\n", r.name,
                  schedule_name(r.schedule).c_str(), use_name(r.use), partition_name(r.partition), mla_name(r.mla),
                  r.cuda ? "yes" : "no", comm_name(r.comm));
    out += line;
  }
  return out;
}

const std::vector<std::string>& gdn_cp_names() {
  static const std::vector<std::string> names = {"ring", "scan"};
  return names;
}

std::unique_ptr<GdnCp> make_gdn_cp(const std::string& schedule) {
  if (schedule == "ring") return make_gdn_ring();
  if (schedule == "scan") return make_gdn_scan();
  return nullptr;
}

CpCall attn_problem(int64_t S, int32_t H_q, int32_t H_kv, int32_t D, MaskKind mask, int64_t window) {
  CpCall p;
  p.S_q = p.S_k = S;
  p.H_q = H_q;
  p.H_kv = H_kv;
  p.D = D;
  p.mask = mask;
  p.window = window;
  return p;
}

}  // namespace ctxpar
