// The registry: one explicit table, in config order (greppable; nothing the linker can drop).
#include <utility>

#include "cp/common.hpp"
#include "cp/gdn_cp.hpp"
#include "cp/strategy.hpp"

namespace ctxpar {
namespace {

using Factory = std::unique_ptr<CpStrategy> (*)(Topology&);
// training: has a backward, a value of `strategy`; inference: forward only, the engine's;
// local: sliding-window layers only, a value of `local_strategy` (with the training ones).
enum class Use { training, inference, local };
struct Entry {
  const char* name;
  CpSchedule schedule;
  Factory make;
  Use use;
};
constexpr CpSchedule plain = CpSchedule::plain, deterministic = CpSchedule::deterministic, frugal = CpSchedule::frugal;
const Entry kStrategies[] = {
    {"allgather", plain, make_allgather_strategy, Use::training},
    {"allgather", deterministic, make_deterministic_allgather_strategy, Use::training},
    {"allgather", frugal, make_frugal_allgather_strategy, Use::training},
    {"ulysses", plain, make_ulysses_strategy, Use::training},
    {"ulysses", deterministic, make_deterministic_ulysses_strategy, Use::training},
    {"ring", plain, make_ring_strategy, Use::training},
    {"ring", deterministic, make_deterministic_ring_strategy, Use::training},
    {"ring", frugal, make_frugal_ring_strategy, Use::training},
    {"usp", plain, make_usp_strategy, Use::training},
    {"usp", deterministic, make_deterministic_usp_strategy, Use::training},
    {"halo", plain, make_halo_strategy, Use::local},
    {"pass_q", plain, make_pass_q_strategy, Use::inference},
    {"decode_pass_q", plain, make_decode_pass_q_strategy, Use::inference},
    {"decode_allgather", plain, make_decode_allgather_strategy, Use::inference},
};

const Entry* find(const std::string& name, CpSchedule sched) {
  for (const Entry& e : kStrategies)
    if (name == e.name && e.schedule == sched) return &e;
  return nullptr;
}

std::vector<std::string> names_where(Use use) {
  std::vector<std::string> n;
  for (const Entry& e : kStrategies)
    if (e.use == use && e.schedule == plain) n.emplace_back(e.name);
  return n;
}

}  // namespace

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names = names_where(Use::training);
  return names;
}

const std::vector<std::string>& inference_strategy_names() {
  static const std::vector<std::string> names = names_where(Use::inference);
  return names;
}

const std::vector<std::string>& local_strategy_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = names_where(Use::local);
    for (const std::string& t : names_where(Use::training)) n.push_back(t);
    return n;
  }();
  return names;
}

bool has_schedule(const std::string& name, CpSchedule sched) { return find(name, sched) != nullptr; }

std::unique_ptr<CpStrategy> make_strategy(const std::string& name, Topology& topo, CpSchedule sched) {
  const Entry* e = find(name, sched);
  return e ? e->make(topo) : nullptr;
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

std::unique_ptr<CpStrategy> make_strategy(StrategySetting s, Topology& topo, CpSchedule sched) {
  if (s == StrategySetting::automatic || s == StrategySetting::all) return nullptr;
  return make_strategy(std::string(name_of(s)), topo, sched);
}

AttnParams attn_problem(int64_t S, int32_t H_q, int32_t H_kv, int32_t D, MaskKind mask, int64_t window) {
  AttnParams p;
  p.S_q = p.S_k = S;
  p.H_q = H_q;
  p.H_kv = H_kv;
  p.D = D;
  p.mask = mask;
  p.window = window;
  return p;
}

}  // namespace ctxpar
