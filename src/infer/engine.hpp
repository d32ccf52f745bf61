// Inference with context parallelism on the training model (src/model: same ParamLayout, same
// seeded weights or a training checkpoint): full prefill, partial prefill over the sharded KV
// cache, and decode, on the N ranks of the CP group (topo.cp()).
//
//   full prefill     T prompt tokens, zigzag-sharded (2N chunks) so every rank has equal causal
//                    work (a batch: one forward, each sequence sharded on its own, its own
//                    document in the attention calls); attention by the configured CP strategy (ring = pass-KV by default;
//                    allgather, ulysses, usp selectable) or by pass-Q; the K/V stay where computed.
//                    With placement = balanced (and frugal) the batch's sequences are placed from
//                    their lengths instead, short ones whole on one rank (use_placement).
//   partial prefill  T new tokens after `cached` ones, zigzag-sharded over the ranks (positions
//                    cached + zigzag index, so the causal mask comes from global positions):
//                    pass-KV  the ring strategy over each rank's cached + new keys (blocks padded
//                             to the longest rank's);
//                    pass-Q   the pass_q strategy (cp/pass_q.cpp): queries circulate, K/V stay.
//   decode           B sequences, one token each. Sequence b's dense work (projections, MLP,
//                    LM head) runs on rank b / ceil(B/N); its query, with its new K/V, goes to
//                    every rank by decode_pass_q (ring) or decode_allgather (cp/decode_*.cpp);
//                    the KV cache's round-robin target rank stores the K/V on the visit.
// Every attention is a CP strategy of src/cp; the layers are the training model's code. MLA
// models (attention = mla) attend in the absorbed form (model/mla_layer.hpp): the cache holds the
// latent rows, and every call is multi-query attention over them.
// Every call ends with the greedy next token of every sequence on every rank.
// On a GPU (device = cuda): the weights' fp32 copy and their bf16 mirror (the GEMMs' operands),
// every activation and the KV cache (bf16) live on the device, the layers run there (bf16 GEMMs
// and attention inputs, fp32 accumulation, softmax statistics and residual stream), and the
// strategies move device buffers; per call the host uploads token ids, positions and document ids
// and reads back the logits rows it needs. MLA and Gated DeltaNet layers run on the CPU only.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.hpp"
#include "core/settings.hpp"
#include "cp/strategy.hpp"
#include "perf/prefill_choice.hpp"
#include "infer/gdn_infer.hpp"
#include "infer/kv_cache.hpp"
#include "model/layer.hpp"
#include "model/mla_layer.hpp"
#include "model/model.hpp"

namespace ctxpar {
class Topology;
class Tracer;
class Comm;
}  // namespace ctxpar

namespace ctxpar::infer {

// DecodeAlgo: core/settings.hpp (an enumerated setting).
// How a prefill of several sequences runs: one forward for the batch, or one per sequence.
enum class PrefillBatching { packed, sequential };

// Work of one call on this rank (seconds, bytes) and its communication counters.
struct CallStats {
  double total_s = 0, attn_s = 0, gemm_s = 0;
  CpStats cp;  // bytes_sent, exposed_comm_s, messages, attn_flops
  std::vector<double> layer_pair_heads;  // [layers]: each layer's share of cp.attn_pair_heads
};

// A next token where the logits it would come from are not finite (weights whose products overflow
// fp32): no token is chosen from them; the caller ends the run (modes/infer.cpp).
constexpr int32_t kNonFiniteLogits = -2;

struct StepOutput {
  // [B] greedy (argmax, lowest index on ties), every rank; -1 for a sequence without new tokens,
  // kNonFiniteLogits where its logits are not finite.
  std::vector<int32_t> next_tokens;
  std::vector<float> logits;         // [B, V] of the last position, every rank (when requested)
  // Tests: logits of every new position of every sequence, [B][T * V] in global order.
  std::vector<std::vector<float>> all_logits;
  // Prefill: per sequence, seconds from the call's start until the forward that gave its next
  // token ended on this rank (its time to first token within the call: a packed batch's
  // sequences finish together, the pass-Q group of a mixed batch after the pass-KV one, each
  // sequence of a sequential batch after its own forward); 0 without new tokens.
  std::vector<double> ready_s;
};

class Engine {
 public:
  // `params`: this rank's weights in `layout` (tp = 1). `full_strategy`: CP strategy name for
  // full prefills with pass-KV (a training strategy of the registry, strategy_names()).
  // `params` is host memory also with `device` = cuda (the engine keeps its own device copy).
  // `capacity[r][b]`: the KV cache's tokens of sequence b on CP rank r (cache_capacity,
  // infer/schedule.hpp; the batch is their count).
  Engine(const ParamLayout& layout, const float* params, Topology& topo, const std::vector<std::vector<int64_t>>& capacity,
         const std::string& full_strategy, Device device = Device::cpu, Stream stream = nullptr);
  ~Engine();

  // Prefill of the new tokens of every sequence: tokens[b] holds T_b ids (the same on every rank;
  // any lengths, 0 = sequence b takes no part, its next token is -1), after the T_b' tokens its
  // cache holds already (any, per sequence; all empty with pass-KV: a full prefill by the
  // configured strategy). `packed` (the default) runs the whole batch as one forward, every
  // sequence zigzag-balanced over the ranks on its own and its own document in one CP attention
  // call per layer; `sequential` one forward per sequence (the comparison of bench infer).
  StepOutput prefill(const std::vector<std::vector<int32_t>>& tokens, CpAlgo algo, Tracer* tr, CallStats& st,
                     bool want_logits = false, bool want_all_logits = false,
                     PrefillBatching batching = PrefillBatching::packed);
  // The same with an algorithm per sequence (cp_algo=auto per sequence): packed, the pass-KV
  // sequences run as one forward and the pass-Q ones as another.
  StepOutput prefill(const std::vector<std::vector<int32_t>>& tokens, const std::vector<CpAlgo>& algos, Tracer* tr,
                     CallStats& st, bool want_logits = false, bool want_all_logits = false,
                     PrefillBatching batching = PrefillBatching::packed);
  // One decode step: tokens[b] is the last generated token of sequence b.
  StepOutput decode(const std::vector<int32_t>& tokens, DecodeAlgo algo, Tracer* tr, CallStats& st,
                    bool want_logits = false);

  // The coverage audit of the last prefill or decode call (model/coverage.hpp
  // infer_layer_pair_heads): the pairs x heads each layer's attention counted (`st`: the stats
  // the call was given, less what they held before it), summed over the CP and tp ranks, against
  // what its new rows see (each sequence's new tokens, padded to the zigzag length, after its
  // cached ones; a local layer the window's). "" when every layer matches, else the first
  // mismatch in words, naming the layer. Collective over CP and tp.
  std::string audit(const CallStats& st);

  // placement = balanced (shard/placement.hpp, infer/schedule.hpp prefill_placement): a full
  // prefill by pass-KV places its sequences' rows from their lengths (a short one whole on one
  // rank, a long one zigzag over a group), each rank holding as many rows as with zigzag, and
  // attends by the visible-keys row of the strategy, so a sequence on one rank exchanges nothing.
  // Needs the visible-keys schedule (use_numerics with CpSchedule::visible) and no Gated DeltaNet
  // layer; the KV cache then holds each sequence's rows where they were placed (a capacity from
  // cache_capacity with the placement). Other calls are not placed.
  void use_placement(PlacementKind placement);

  KvCache& cache() { return cache_; }
  // How the sums are taken (model/numerics.hpp; plain until this is called) and the attention's
  // schedule beside them (the configuration's, Config::cp_schedule); `num` must outlive this
  // object. Visible keys (frugal, CPU): a full prefill attends by the strategy's visible-keys row
  // (cp/visible.hpp), which moves only the rows some query can see; the other calls are unchanged.
  // Exact (CPU): the GEMMs on rows whose bits do not depend on how many rows a rank holds,
  // the tp sums in fixed parts, and every attention (local layers too) by pass_q's row of the
  // schedule (the keys stay, the query rows are all-gathered, exact sums), whatever cp_algo,
  // decode_algo and strategy say. Logits and tokens then have the same bits on any mesh.
  void use_numerics(Numerics& num, CpSchedule sched);
  // Empties every sequence: the KV cache and, in a hybrid model, the GDN layers' states.
  void clear();
  int N() const;
  // Model FLOPs of a prefill of T tokens after `cached` ones, per sequence (model/flops.hpp:
  // 2 m n k matmuls incl. one LM-head row, attention 4 H_q D per visible pair), and of a decode
  // token at context length `ctx` (before it).
  double prefill_flops(int64_t T, int64_t cached) const;
  double decode_flops(int64_t ctx) const;

 private:
  // q, k, v: the layer's attention inputs (f32 on the CPU, bf16 on a GPU: cache_.dtype()).
  using AttnFn = std::function<void(int64_t l, const void* q, const void* k, const void* v, float* o, float* lse)>;
  // A GDN layer's token mixer: x1 = x + mixer(x) on this rank's rows (gl: the layer's number
  // among the GDN layers); called on every rank, rows or not.
  using GdnFn = std::function<void(int64_t l, int64_t gl, const float* x, float* x1)>;
  // Embedding → L layers (the training model's layer code, model/layer.hpp, with the attention
  // by `attn`, a CP strategy of src/cp, or a GDN layer's mixer by `gdn`) → final norm; logits of
  // the local rows `logit_rows` into `logits` [|logit_rows|, V].
  void forward(int64_t n, const int32_t* tokens, const int64_t* pos, const AttnFn& attn, const GdnFn& gdn,
               const std::vector<int64_t>& logit_rows, float* logits);
  // One forward of the sequences `seqs` (see prefill), results into `out`.
  void prefill_seqs(const std::vector<int64_t>& seqs, const std::vector<std::vector<int32_t>>& tokens, CpAlgo algo,
                    bool want_all_logits, StepOutput& out);
  // A prefill's layout (prefill_seqs): each sequence zigzag-sharded on its own, or with placement
  // its rows where the batch's placement puts them; on each rank its rows after the previous
  // sequence's, their cache rows reserved.
  struct PrefillSeq {
    int64_t b, T, cached, n, first, off, S_k, k_off;  // this rank's n rows from off; S_k keys from k_off
    std::vector<std::vector<int64_t>> at;  // [rank]: its new tokens' indices there, ascending (>= T: padding)
    std::vector<int64_t> offs;             // [rank]: where they start among that rank's rows
    int owner(int64_t i) const;            // the rank of new token i, and its row among that rank's
    int64_t local_row(int64_t i) const;
    int64_t real_rows(int rank) const;     // of at[rank], the real tokens (a prefix)
  };
  struct PrefillPlan {
    std::vector<PrefillSeq> seqs;
    std::vector<int64_t> pos, apos;  // positions (RoPE, the cache) and the attention's
    std::vector<int32_t> tok, doc;
    int64_t rows = 0, keys = 0;
    bool full = false;    // every cache empty: the configured strategy on the new tokens
    bool placed = false;  // full, with placement = balanced: rows from prefill_placement
    // placed: each rank's padding rows (after its sequences' rows; contiguous positions past the
    // batch's tokens, a document of their own per rank, id batch + rank, so nothing sees them and
    // they exchange nothing)
    std::vector<int64_t> padding;
  };
  // The rows of every sequence of `seqs` on every rank, [sequence][rank] (see PrefillSeq::at), and
  // with placement the padding rows of this rank (global positions past the batch's tokens) and
  // how many every rank holds.
  std::vector<std::vector<std::vector<int64_t>>> layout_rows(const std::vector<int64_t>& seqs,
                                                             const std::vector<std::vector<int32_t>>& tokens,
                                                             bool placed, std::vector<int64_t>& pad_pos,
                                                             std::vector<int64_t>& padding) const;
  PrefillPlan plan_prefill(const std::vector<int64_t>& seqs, const std::vector<std::vector<int32_t>>& tokens,
                           CpAlgo algo);
  // The prefill's logits rows `lg` (rows `logit_rows`, see prefill_seqs) to every rank: each
  // sequence's next token and last logits, and with want_all_logits every row in global order.
  void share_prefill_logits(const PrefillPlan& pl, const std::vector<int64_t>& last_row, const float* lg,
                            bool want_all_logits, StepOutput& out);
  void ensure_rows(int64_t n);
  // `a` on this engine's device (for positions and document ids of a call; empty on the CPU).
  template <class T> Buffer<T> on_device(const std::vector<T>& a) const;
  // The device fields of a call: bf16 inputs on the stream, positions and document ids given as
  // host arrays (kept as the host copies) and their device copies (null: none).
  void set_device(CpCall& t, const int64_t* q_pos_dev, const int32_t* q_doc_dev, const int64_t* k_pos_dev,
                  const int32_t* k_doc_dev) const;
  LayerRun run(int64_t l);
  // The attention call of n query rows of this model (causal; tensors set by the caller).
  CpCall call(int64_t n, int64_t l) const;  // layer l's attention of n query rows
  // Per-call state: the tracer, the counters (returns the start time); and their closing.
  double begin_call(Tracer* tr, CallStats& st);
  void end_call(double t_start);

  const ParamLayout& layout_;
  ModelDims d_;
  Device dev_ = Device::cpu;
  Stream stream_ = nullptr;
  // GPU: the weights (fp32) and their bf16 copy, which w_ and the layer GEMMs read.
  Buffer<float> params_dev_;
  Buffer<uint16_t> params_b_;
  Bf16Mirror mirror_;
  ModelView w_;
  Topology& topo_;
  Comm& cp_;
  KvCache cache_;
  // The CP strategies of src/cp: the configured one for full prefills, ring (pass-KV over the
  // cache), pass_q, and the two decode strategies.
  std::unique_ptr<CpStrategy> full_strategy_, pass_kv_, pass_q_, decode_pass_q_, decode_allgather_;
  std::string full_name_;
  CpSchedule full_sched_ = CpSchedule::plain;  // full_strategy_'s row
  PlacementKind placement_ = PlacementKind::zigzag;
  int64_t visible_batch_ = 0;  // the visible-keys row's plan id (CpCall::batch_id): one per full prefill
  std::unique_ptr<GdnInfer> gdn_;  // hybrid models: the GDN layers' states (null without 'D' layers)
  Numerics* num_ = &plain_numerics();
  // exact numerics: the strategy of every attention call (pass_q's row of their schedule); else null
  std::unique_ptr<CpStrategy> exact_attn_;
  int64_t rows_cap_ = 0;
  Buffer<float> x_, h_, rstd_, q_, k_, v_, o_, lse_, x1_, g_, u_, m_, cos_, sin_;
  Buffer<uint16_t> qb_, kb_, vb_;  // GPU: the attention's bf16 inputs
  Buffer<int32_t> tok_dev_;        // GPU: the call's token ids
  Buffer<float> logits_dev_;       // GPU: the logits rows before they go to the host
  Buffer<float> qa_;     // MLA: the absorbed queries [rows, H, kv_lora + rope]
  MlaActs mla_a_;        // MLA: the latent rows of the call (and the latents' scratch)
  MlaScratch mla_s_;
  std::vector<double> inv_freq_;
  // the last call's new rows and cached ones per sequence, and its CallStats' pair counts before
  // it ([layers] and the total) (audit)
  std::vector<int64_t> audit_news_, audit_olds_;
  std::vector<double> audit_base_;
  // per-call state
  Tracer* tr_ = nullptr;
  CallStats* st_ = nullptr;
  StepTimes times_;
};

// Greedy token of a logits row: argmax, the lowest index on ties.
int32_t greedy(const float* logits, int64_t V);

}  // namespace ctxpar::infer
