// CpStrategy: one interface for every context-parallel attention pattern; one file per strategy
// (file name = config value), listed in registry.cpp. A strategy talks only to Comm, Topology,
// AttnParams, the attention ops and lse_merge.
//
// Contract: every rank of the CP group (topo.cp()) holds the tokens of its shard of the global
// sequence (positions from the strategy's partition, ascending), as q [S_loc, H_q, D] and
// k, v [S_loc, H_kv, D] with their global positions and document ids. forward() produces O and
// LSE for the local queries over all visible global keys; backward() produces dQ, dK, dV for the
// local tokens (dK/dV summed over every query on every rank that saw them).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attn_params.hpp"
#include "shard/partition.hpp"

namespace ctxpar {

class Topology;
class Tracer;

struct AttnShape {
  int64_t S = 0;          // global tokens
  int32_t H_q = 0, H_kv = 0, D = 0;
  MaskKind mask = MaskKind::causal;
  int64_t window = 0;
  bool has_docs = false;
};

// Local tensors of one rank (token-major). Pointers are owned by the caller.
struct LocalAttn {
  int64_t S_loc = 0;
  const int64_t* pos = nullptr;   // [S_loc] global positions
  const int32_t* doc = nullptr;   // [S_loc] document ids or null
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  float *o = nullptr, *lse = nullptr;
  const float* dout = nullptr;
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;  // backward outputs (overwritten)
};

// Counters of one call, for bench tables and traces.
struct CpStats {
  double bytes_sent = 0;      // bytes this rank sent
  double exposed_comm_s = 0;  // time blocked waiting on transfers
  int64_t messages = 0;       // point-to-point messages posted by this rank
  double attn_flops = 0;      // attention FLOPs this rank computed (visible pairs)
};

class CpStrategy {
 public:
  virtual ~CpStrategy() = default;
  virtual std::string name() const = 0;
  // Partition the caller must shard tokens with for this strategy.
  virtual PartitionKind partition() const = 0;
  // "" when the shape fits the topology, else a message naming what is wrong and what would be
  // valid. Same result on every rank (depends only on its arguments).
  virtual std::string validate(const AttnShape& shape, const Topology& topo) const = 0;
  virtual void forward(const AttnShape& shape, LocalAttn& t, Tracer* tr, CpStats& st) = 0;
  virtual void backward(const AttnShape& shape, LocalAttn& t, Tracer* tr, CpStats& st) = 0;
  // Bytes this rank sends in one forward (for busbw and the cost model).
  virtual double comm_volume_fwd(const AttnShape& shape, const Topology& topo) const = 0;
};

// The registry (registry.cpp): names in config order; make_strategy returns null for an unknown name.
const std::vector<std::string>& strategy_names();
std::unique_ptr<CpStrategy> make_strategy(const std::string& name, Topology& topo);

}  // namespace ctxpar
