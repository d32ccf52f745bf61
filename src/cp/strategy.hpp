// CpStrategy: one interface for every context-parallel attention pattern, training and inference;
// one file per strategy (file name = config value), listed in registry.cpp. A strategy talks only
// to Comm, Topology, CpCall, the attention ops and lse_merge.
//
// The call: every rank of the strategy's group holds its local query rows and its local key rows,
// described by one CpCall (below: the kernels' AttnParams and the strategies' fields) with global
// positions and document ids:
// q, q_pos, q_doc [S_q]; k, v, k_pos, k_doc [S_k]. forward() produces O and LSE for the local
// queries over all visible keys of every rank of the group; backward() produces dQ for the local
// queries and dK, dV for the local keys (summed over every query on every rank that saw them).
// Unlike a kernel call, backward OVERWRITES dq, dk, dv.
//   training strategies (allgather, ulysses, ring, usp): queries and keys are the same tokens
//     (S_q == S_k, q_pos == k_pos, q_doc == k_doc), sharded by partition();
//   inference (pass_q, decode_*; forward only): the keys are a rank's KV cache and the queries
//     its new tokens; ring and allgather serve pass-KV prefills over a cache too (S_k >= S_q).
// Where a strategy moves fixed-size blocks, S_k (and for pass-Q / decode S_q) is equal on every
// rank; padding rows carry a position no query sees (infer::kNoPos) or a document id -1.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attn_params.hpp"
#include "core/settings.hpp"
#include "shard/partition.hpp"

namespace ctxpar {

class Topology;
class Tracer;

// MLA (CpCall::expander): turns latent rows into K and V rows and back. The owner (the model's
// layer) holds the expansion's weights and accumulates their gradient, so a strategy can expand
// any block it receives and return the latent's gradient instead of dK/dV.
class KvExpander {
 public:
  virtual ~KvExpander() = default;
  // k, v [rows, H_kv * D] (overwritten) from latent rows [rows, latent_width].
  virtual void expand(const float* latent, int64_t rows, float* k, float* v) = 0;
  // dlatent [rows, latent_width] += the gradient through the expansion of dk, dv [rows, H_kv * D];
  // the expansion's weight gradient accumulates in the owner (from every block this rank saw).
  virtual void backward(const float* latent, int64_t rows, const float* dk, const float* dv, float* dlatent) = 0;
};

// CpCall: a strategy's argument. Its attention part is the kernels' descriptor (AttnParams: the
// rows of this rank's shard, their positions and document ids, the mask); the rest is what only
// the strategies read. A kernel call takes the AttnParams part (a CpCall converts to it).
struct CpCall : AttnParams {
  // ---- KV cache of an inference call (read by the inference strategies, which split such a call
  // per document into kernel calls). As flash-attention's fwd_kvcache: with k_doc_len set, k, v,
  // k_pos hold the rows of a KV cache of documents (sequences): document d's keys are rows
  // [k_doc_begin[d], k_doc_begin[d] + k_doc_len[d]), and a query row of document q_doc[i] (-1: a
  // padding row, sees nothing) sees only those. Decode: each query row is a new token whose own
  // key/value rows are k_new / v_new [S_q, H_kv, D], visible to it; this rank stores document d's
  // new token at cache row k_new_slot[d] of k_cache / v_cache (the writable view of k / v) when
  // k_new_slot[d] >= 0 (another rank does when -1), and it is visible from then on; the caller
  // reserves the slot, so k_pos at k_new_slot[d] already holds the new token's position.
  const int64_t* k_doc_begin = nullptr;
  const int64_t* k_doc_len = nullptr;
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  const int64_t* k_new_slot = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;

  // ---- Derivable key positions (read by the ring). When > 0: every rank of the strategy's group
  // holds, as its keys, its own zigzag shard of one sequence of k_pos_zigzag tokens
  // (shard/partition.hpp: Partition(zigzag, k_pos_zigzag, P).positions(rank), padding rows
  // included), so another rank's key positions can be computed instead of sent.
  int64_t k_pos_zigzag = 0;
  // The batch a call belongs to (> 0), the same on every rank: a visible-keys schedule
  // (cp/visible.hpp) computes its plan once per batch and mask and reuses it for the other layers
  // and the backward (0: no reuse).
  int64_t batch_id = 0;

  // ---- MLA's latent K/V (read by the CP strategies). With `expander` set, this rank's K and V rows
  // are expanded from per-token latent rows `latent` [S_k, latent_width] (fp32; model/mla_layer.hpp:
  // the K/V latent and the shared RoPE key). A strategy that moves the latent
  // (CpStrategy::moves_latent) sends those rows instead of K and V, expands each block it receives,
  // and its backward writes `dlatent` [S_k, latent_width] (the latent's gradient summed over the
  // group; overwritten) instead of dk and dv. In a shape-only descriptor latent_width alone says
  // that K/V come from a latent of that width.
  int32_t latent_width = 0;
  const float* latent = nullptr;
  float* dlatent = nullptr;
  KvExpander* expander = nullptr;

  // The same call with its attention part replaced, the strategies' fields kept; the sub-calls of
  // AttnParams (query_rows, key_rows, host_rows) likewise.
  CpCall with(const AttnParams& a) const {
    CpCall c = *this;
    static_cast<AttnParams&>(c) = a;
    return c;
  }
  CpCall query_rows(int64_t a, int64_t n) const { return with(AttnParams::query_rows(a, n)); }
  CpCall key_rows(int64_t a, int64_t n) const { return with(AttnParams::key_rows(a, n)); }
  CpCall host_rows() const { return with(AttnParams::host_rows()); }
};

// Counters of one call, for bench tables and traces.
struct CpStats {
  double bytes_sent = 0;      // bytes this rank sent
  double exposed_comm_s = 0;  // time blocked waiting on transfers
  int64_t messages = 0;       // point-to-point messages posted by this rank
  double attn_flops = 0;      // attention FLOPs this rank computed (visible pairs, model/flops.hpp)
  // (query, key) pairs x query heads this rank's attention calls computed (the visible pairs of
  // each call's rows under its mask): [0] forward calls, [1] backward calls. Summed over the
  // ranks, train's coverage audit holds them to the batch's visible pairs (model/coverage.hpp).
  double attn_pair_heads[2] = {0, 0};
  // One attention call: its FLOPs and its visible pairs x heads.
  void count_attn(int64_t pairs, int64_t heads, double flops, bool backward) {
    attn_flops += flops;
    attn_pair_heads[backward ? 1 : 0] += double(pairs) * double(heads);
  }
  // Device calls: a wait on a device transfer does not block the host, so its exposed time is
  // timed on the device, by a pair of events around the compute stream's wait (the time the
  // stream sat idle there); they are read by settle(), once the caller has synchronized the
  // stream, and added to exposed_comm_s. Until then they are pending.
  struct DeviceWait {
    Event before = nullptr, after = nullptr;
    Device device = Device::cpu;
  };
  std::vector<DeviceWait> device_waits;
  int64_t device_waits_timed = 0;  // how many settle() has read
  void settle();                   // cp/common.cpp; synchronizes on the pending events
  CpStats() = default;
  CpStats(const CpStats&) = delete;  // owns its pending events
  CpStats& operator=(const CpStats&) = delete;
  CpStats(CpStats&&) = default;
  CpStats& operator=(CpStats&&) = default;
  ~CpStats();
};

class CpStrategy {
 public:
  virtual ~CpStrategy() = default;
  virtual std::string name() const = 0;
  // Partition the caller must shard tokens with for this strategy.
  virtual PartitionKind partition() const = 0;
  // "" when the problem fits the topology, else a message naming what is wrong and what would be
  // valid. `global` is the shape of the whole problem (S_q = S_k = global tokens, heads, D, mask;
  // no pointers needed). Same result on every rank (depends only on its arguments).
  virtual std::string validate(const CpCall& global, const Topology& topo) const = 0;
  virtual void forward(const CpCall& local, Tracer* tr, CpStats& st) = 0;
  // Training strategies only (has_backward()); inference strategies refuse.
  virtual void backward(const CpCall& local, Tracer* tr, CpStats& st) = 0;
  virtual bool has_backward() const { return true; }
  // Does the strategy move an MLA latent (CpCall::expander) instead of K and V? A caller
  // passes the latent only to one that does; the others get expanded K/V and return dk, dv.
  virtual bool moves_latent() const { return false; }
  // Bytes this rank sends in one forward of the problem `global` (for busbw and the cost model);
  // `docs`: document ids travel with the keys.
  virtual double comm_volume_fwd(const CpCall& global, bool docs, const Topology& topo) const = 0;
  // Peak bytes of the strategy's transient buffers on a rank during a training step (forward and
  // backward), for the --dry-run memory plan. Default: three forward volumes, as if everything
  // received were held at once; a strategy that streams (the ring) holds less.
  virtual double buffer_bytes(const CpCall& global, bool docs, const Topology& topo) const {
    return 3.0 * comm_volume_fwd(global, docs, topo);
  }
};

// The registry (registry.cpp), one table: strategy_names() are the training strategies in config
// order (the values of `strategy`), inference_strategy_names() the forward-only ones of the
// inference engine, local_strategy_names() the values of `local_strategy` (a model's
// sliding-window layers: halo, which serves only those, then the training ones). A training
// strategy has a row per schedule it serves (CpSchedule: plain; exact, the
// schedule of cp/exact.hpp; visible, the visible-keys schedule of cp/visible.hpp), each
// built by its own file; a schedule's strategy reports the name of the strategy it schedules.
// make_strategy returns null for an unknown name or a schedule the strategy has no row for.
//
// Each row also states what the strategy serves, once: tests/mpi/test_cp.cpp (RowsStateWhatTheStrategiesDo)
// checks every claim against the strategy's own answers (has_backward, partition, moves_latent,
// validate), tests/gpu/test_cp_device.cpp that every row claiming device = cuda runs there, and
// the configuration refuses what a row does not serve; `ctxpar --features` prints the table.
enum class StrategyUse : int8_t {
  training,   // has a backward; a value of `strategy` (and of `local_strategy`)
  inference,  // forward only: the inference engine's
  local,      // sliding-window (L) layers only: a value of `local_strategy`
};
// MLA models (attention = mla): the strategy moves the latent and expands each block it receives,
// takes the K/V expanded by the model, or refuses them; inference strategies serve MLA's absorbed
// attention (multi-query over the cached latent rows).
enum class MlaSupport : int8_t { latent, expanded, refused, absorbed };
// How the strategy's messages go: the pattern the cost model prices (src/perf/cost_model.cpp has
// one formula per pattern, none per name), the same for every schedule of a strategy.
enum class CommPattern : int8_t {
  gather,      // every rank gathers the group's K/V (and reduce-scatters dK/dV): exposed
  heads,       // all-to-all over the CP group: the whole sequence, a share of the heads
  heads_ring,  // all-to-all over the ulysses axis, then a K/V ring over the ring axis
  kv_ring,     // K/V blocks passed around the group under the compute (pass-KV)
  q_ring,      // query blocks passed around, their partial outputs sent home (pass-Q)
  window,      // only a sliding window's rows from the neighbouring chunks
  decode,      // decode: one new token's attention over the ranks' cache blocks
};
// Does the pattern split the heads over the ulysses ranks (MLA's shared latent refused, the head
// counts divisible, the full prefill only in inference)?
constexpr bool splits_heads(CommPattern c) { return c == CommPattern::heads || c == CommPattern::heads_ring; }
struct StrategyRow {
  const char* name;
  CpSchedule schedule;
  StrategyUse use;
  PartitionKind partition;  // contiguous or zigzag also serves Gated DeltaNet layers' neighbours
  MlaSupport mla;
  bool cuda;  // device = cuda
  CommPattern comm;
};
const std::vector<StrategyRow>& strategy_rows();
// The row of (name, schedule); null without one.
const StrategyRow* strategy_row(const std::string& name, CpSchedule sched = CpSchedule::plain);
// The strategy x feature table of every row (`ctxpar --features`), one line per row.
std::string strategy_features_table();
const std::vector<std::string>& strategy_names();
const std::vector<std::string>& inference_strategy_names();
const std::vector<std::string>& local_strategy_names();
bool has_schedule(const std::string& name, CpSchedule sched);
// Tells the configuration (core/config.hpp set_strategy_choices) the names `strategy` and
// `local_strategy` take: a program calls it once before it parses a configuration.
void state_strategy_choices();
// The training strategies with a row of schedule `sched`, in config order, as a message lists
// them ("allgather, ulysses, ring or usp"), `also` (e.g. "all") last when given.
std::string strategies_with(CpSchedule sched, const std::string& also = "");
// The configuration's schedule, refused or served here once: "" when `strategy` has a row of
// `sched`, else a message naming the setting that selected it and the strategies that serve it
// (`also`, e.g. "all", last).
std::string schedule_refusal(const std::string& strategy, CpSchedule sched, const std::string& also = "");
// The setting whose `true` selects a schedule ("deterministic", "frugal"; "" for plain), for the
// tables and notes that name it, and the suffix of its rows in bench cp's table (":det", ":frugal").
std::string schedule_key(CpSchedule sched);
std::string schedule_suffix(CpSchedule sched);
std::unique_ptr<CpStrategy> make_strategy(const std::string& name, Topology& topo,
                                          CpSchedule sched = CpSchedule::plain);
// The inference engine's rows, by the settings that select them: cp_algo = pass_kv runs the
// ring's row over the KV cache, pass_q pass_q's; decode_algo its decode row. Every algo has one.
const StrategyRow& prefill_row(CpAlgoSetting algo);
const StrategyRow& decode_row(DecodeAlgo algo);
// The training row (plain schedule) whose messages go as `comm`; null without one.
const StrategyRow* training_row(CommPattern comm);

// The shape-only descriptor of a CP problem of S global tokens.
CpCall attn_problem(int64_t S, int32_t H_q, int32_t H_kv, int32_t D, MaskKind mask, int64_t window);

}  // namespace ctxpar
