// The registry: one explicit table, in config order (greppable; nothing the linker can drop).
#include <utility>

#include "cp/common.hpp"
#include "cp/gdn_cp.hpp"
#include "cp/strategy.hpp"

namespace ctxpar {
namespace {

using Factory = std::unique_ptr<CpStrategy> (*)(Topology&);
struct Entry {
  const char* name;
  Factory make;
  bool training;  // has a backward; a value of the `strategy` setting
};
const Entry kStrategies[] = {
    {"allgather", make_allgather_strategy, true},
    {"ulysses", make_ulysses_strategy, true},
    {"ring", make_ring_strategy, true},
    {"usp", make_usp_strategy, true},
    {"pass_q", make_pass_q_strategy, false},
    {"decode_pass_q", make_decode_pass_q_strategy, false},
    {"decode_allgather", make_decode_allgather_strategy, false},
};

std::vector<std::string> names_where(bool training) {
  std::vector<std::string> n;
  for (const Entry& e : kStrategies)
    if (e.training == training) n.emplace_back(e.name);
  return n;
}

}  // namespace

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names = names_where(true);
  return names;
}

const std::vector<std::string>& inference_strategy_names() {
  static const std::vector<std::string> names = names_where(false);
  return names;
}

std::unique_ptr<CpStrategy> make_strategy(const std::string& name, Topology& topo) {
  for (const Entry& e : kStrategies)
    if (name == e.name) return e.make(topo);
  return nullptr;
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

std::unique_ptr<CpStrategy> make_strategy(StrategySetting s, Topology& topo) {
  if (s == StrategySetting::automatic || s == StrategySetting::all) return nullptr;
  return make_strategy(std::string(name_of(s)), topo);
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
