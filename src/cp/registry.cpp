// The registry: one explicit table, in config order (greppable; nothing the linker can drop).
#include <utility>

#include "cp/common.hpp"
#include "cp/strategy.hpp"

namespace ctxpar {
namespace {

using Factory = std::unique_ptr<CpStrategy> (*)(Topology&);
struct Entry {
  const char* name;
  Factory make;
};
const Entry kStrategies[] = {
    {"allgather", make_allgather_strategy},
    {"ulysses", make_ulysses_strategy},
    {"ring", make_ring_strategy},
    {"usp", make_usp_strategy},
};

}  // namespace

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const Entry& e : kStrategies) n.emplace_back(e.name);
    return n;
  }();
  return names;
}

std::unique_ptr<CpStrategy> make_strategy(const std::string& name, Topology& topo) {
  for (const Entry& e : kStrategies)
    if (name == e.name) return e.make(topo);
  return nullptr;
}

}  // namespace ctxpar
