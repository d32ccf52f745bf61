// ulysses' and usp's exact schedule (CpSchedule::exact): the same all-to-all, with
// the exact call of cp/exact.hpp inside (over the ring axis for usp, this rank's
// gathered keys alone for ulysses). A K/V head replicated on several ranks (each holding part of
// its group's query heads) returns its dK/dV as integer sums, added over the copies before the one
// rounding (ulysses_bwd_exact); so does every head when the caller takes the integers
// (CpCall::dk_fixed: K/V heads replicated over tp too).
#include <numeric>

#include "cp/common.hpp"
#include "cp/exact.hpp"
#include "cp/strategy.hpp"
#include "cp/ulysses_core.hpp"
#include "dist/topology.hpp"

namespace ctxpar {
namespace {

// A replicated K/V head's copies must each hold whole exact parts (CpCall::fixed_heads) of
// its group's query heads, so their integer sums add up to the one-rank call's.
std::string check_exact_heads(const std::string& strategy, const CpCall& s, int U) {
  const int32_t part = s.fixed_heads > 0 ? s.fixed_heads : s.H_q / s.H_kv;
  if (U <= 1 || s.H_kv % U == 0 || (s.H_q / U) % part == 0) return "";
  return strategy + ": deterministic = true with kv_heads H_kv=" + std::to_string(s.H_kv) + " replicated on U=" +
         std::to_string(U) + " ranks: each holds " + std::to_string(s.H_q / U) + " of a K/V group's query heads, " +
         "not whole exact parts of " + std::to_string(part) + " heads (deterministic_heads" +
         (s.fixed_heads > 0 ? "" : ", 0: the whole group") + "); valid: deterministic_heads=" +
         std::to_string(std::gcd(s.H_q / U, int32_t(s.H_q / s.H_kv))) + " (or a divisor; the same on the runs compared), " +
         "a ulysses degree dividing H_kv, or strategy=allgather or ring";
}

class ExactUlysses final : public ScheduleOf {
 public:
  // ring: the ring axis (usp), or null (ulysses: the exact call of one rank's keys)
  ExactUlysses(std::unique_ptr<CpStrategy> plain, Comm& ulysses, Comm* ring)
      : ScheduleOf(std::move(plain)), ulysses_(ulysses), ring_(ring) {}
  std::string validate(const CpCall& s, const Topology& topo) const override {
    std::string e = ScheduleOf::validate(s, topo);
    if (e.empty()) e = check_exact_heads(name(), s, ulysses_.size());
    return e;
  }
  void forward(const CpCall& local, Tracer* tr, CpStats& st) override {
    cp::refuse_device_call(local);  // before the all-to-all moves anything
    cp::ulysses_fwd(ulysses_, local, [&](const CpCall& a) { cp::exact_fwd(ring_, a, /*ring_hops=*/true, tr, st); },
                    tr, st);
  }
  void backward(const CpCall& local, Tracer* tr, CpStats& st) override {
    cp::refuse_device_call(local);
    const cp::UlyssesInner inner = [&](const CpCall& a) { cp::exact_bwd(ring_, a, /*ring_hops=*/true, tr, st); };
    if (cp::head_split(local.H_kv, ulysses_.size()).replicated() || local.dk_fixed)
      cp::ulysses_bwd_exact(ulysses_, local, inner, tr, st);
    else
      cp::ulysses_bwd(ulysses_, local, inner, tr, st);
  }

 private:
  Comm& ulysses_;
  Comm* ring_;
};

}  // namespace

std::unique_ptr<CpStrategy> make_exact_ulysses_strategy(Topology& topo) {
  return std::make_unique<ExactUlysses>(make_ulysses_strategy(topo), topo.cp(), nullptr);
}
std::unique_ptr<CpStrategy> make_exact_usp_strategy(Topology& topo) {
  return std::make_unique<ExactUlysses>(make_usp_strategy(topo), topo.axis(Axis::ulysses), &topo.axis(Axis::ring));
}

}  // namespace ctxpar
