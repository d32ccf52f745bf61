// The Llama-3-style decoder of `ctxpar train`: dimensions, the parameter layout and its tensor
// parallel slices, and seeded initialization.
//
// Dimension vocabulary (core/config.hpp): S global tokens, S_loc local tokens, H_q / H_kv heads,
// D head dim; here also `dim` (model width), F (SwiGLU hidden width), V (vocabulary), L layers,
// T the tp axis size. Weights are stored [in, out] row-major so a projection is y = x W.
//
// Tensor parallel (Megatron): Q/K/V and the gate/up projections are split by columns (whole
// heads, contiguous FFN blocks) over the tp ranks; the output and down projections by rows,
// their partial products summed by an all-reduce on the tp axis. Norm weights, the embedding and
// the LM head are replicated on every tp rank (their gradients come out identical there).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/memory.hpp"

namespace ctxpar {

struct Config;
class Topology;

struct ModelDims {
  int64_t layers = 0, dim = 0, ffn = 0, vocab = 0;
  int32_t H_q = 0, H_kv = 0, D = 0;
  float norm_eps = 1e-5f;
  double rope_theta = 5e5, rope_factor = 1, rope_low = 1, rope_high = 4, rope_orig_max = 8192;
  int tp = 1, tp_rank = 0;
  // exact numerics (model/numerics.hpp): query heads per exact part (0: a K/V group).
  // The parts of the exact dK/dV sums and of the tp sums (exact_tp_units).
  int32_t exact_heads = 0;
  // One letter per layer: 'G' global (full causal) attention, 'L' local attention over `window`
  // tokens (sliding window, as Gemma's), 'D' Gated DeltaNet (model/gdn_layer.hpp); empty = every
  // layer global attention.
  std::string kinds;
  int64_t window = 0;  // of the 'L' layers
  bool is_local(int64_t l) const { return !kinds.empty() && kinds[size_t(l)] == 'L'; }
  bool has_local() const { return kinds.find('L') != std::string::npos; }
  int32_t gdn_H = 0, gdn_Dk = 0, gdn_Dv = 0, gdn_conv = 4, gdn_chunk = 128;
  std::string gdn_schedule = "ring";  // under CP: ring or scan (src/cp/gdn_cp.hpp)
  bool gdn_replicated = false;        // inference: GDN states on every CP rank (infer/gdn_infer.hpp)
  bool is_gdn(int64_t l) const { return !kinds.empty() && kinds[size_t(l)] == 'D'; }
  bool has_gdn() const { return kinds.find('D') != std::string::npos; }
  int64_t gdn_layers() const;
  int64_t gdn_qk_width() const { return int64_t(gdn_H) * gdn_Dk; }
  int64_t gdn_v_width() const { return int64_t(gdn_H) * gdn_Dv; }
  int64_t gdn_conv_width() const { return 2 * gdn_qk_width() + gdn_v_width(); }  // q | k | v channels
  // attention = mla (DeepSeek-V2/V3, model/mla_layer.hpp): D = nope + rope is the attention's
  // query/key head dim, H_kv = H_q, values padded from v_dim to D for the attention kernel.
  bool mla = false;
  int32_t q_lora = 0, kv_lora = 0, nope = 0, rope = 0, v_dim = 0;
  int32_t rope_dim() const { return mla ? rope : D; }  // dims RoPE rotates per head
  int64_t o_width() const { return mla ? int64_t(H_q_loc()) * v_dim : q_width(); }  // the output projection's input
  int32_t H_q_loc() const { return H_q / tp; }
  // K/V heads of this tp rank: H_kv / tp, or 1 (replicated) when tp is a multiple of H_kv
  // (validate_model_shape's kv_replication; training sums the copies' gradients).
  int32_t H_kv_loc() const { return H_kv >= tp ? H_kv / tp : 1; }
  // The first global K/V head of this tp rank (of tp rank `t`).
  int32_t kv_head0() const { return kv_head0_of(tp_rank); }
  int32_t kv_head0_of(int t) const { return H_kv >= tp ? H_kv / tp * t : int32_t(int64_t(t) * H_kv / tp); }
  int64_t ffn_loc() const { return ffn / tp; }
  int64_t q_width() const { return int64_t(H_q_loc()) * D; }   // local Q / O columns
  int64_t kv_width() const { return int64_t(H_kv_loc()) * D; } // local K / V columns
  // Inference's attention over the KV cache: its K/V heads and head dim. MLA attends in the
  // absorbed form (model/mla_layer.hpp): one K/V "head" of the latent [c | k_pe], kv_lora + rope
  // wide, shared by every query head; otherwise this tp rank's K/V heads of D.
  int32_t cache_heads() const { return mla ? 1 : H_kv_loc(); }
  int32_t cache_dim() const { return mla ? kv_lora + rope : D; }
  int64_t cache_width() const { return int64_t(cache_heads()) * cache_dim(); }
  // Parameters of the whole model (every tp slice once).
  int64_t param_count() const;
};
ModelDims model_dims(const Config& cfg, int tp, int tp_rank);
// exact numerics: the parts into which the tp-summed products split their contraction, the
// same for every tp (layer.hpp layer_tp_sum); tp must divide it: gcd(H_q / exact_heads, ffn), so
// gcd(H_kv, ffn) by default, and more parts (tp above H_kv: K/V heads replicated) with fewer
// query heads per exact part.
int64_t exact_tp_units(const ModelDims& d);
// The widest tp-summed product's columns (layer_tp_sum's scratch per row): dim, or MLA's latents.
int64_t exact_tp_sum_cols(const ModelDims& d);

// "" when the model shape fits the mesh (tp divides heads, kv_heads and ffn_dim; head_dim even
// for RoPE), else a message naming the value and what would be valid. `kv_replication`
// (training and inference): tp may also be a multiple of kv_heads, each K/V head then replicated
// on the tp ranks whose query heads use it (training: reduce_replicated_kv_grads).
std::string validate_model_shape(const Config& cfg, int tp, bool kv_replication = false);

enum class Split : int32_t { replicated = 0, cols = 1, rows = 2 };

// One parameter tensor: global shape [rows, cols], this rank's slice, its offset in the flat
// per-rank buffer (params, grads and both AdamW moments share the layout).
struct ParamInfo {
  std::string name;       // e.g. "layers.3.wq"
  int64_t rows = 0, cols = 0;
  Split split = Split::replicated;
  int64_t row0 = 0, loc_rows = 0, col0 = 0, loc_cols = 0;
  int64_t offset = 0;     // elements into the flat buffer
  uint64_t tensor_id = 0; // for the seeded initialization
  bool decay = false;     // weight decay applies (matrices, not norm weights)
  bool ones = false;      // initialized to 1 (norm weights)
  float init_scale = 0;   // uniform in [init_center - init_scale, init_center + init_scale)
  float init_center = 0;
  // A K/V projection split by whole heads: with fewer K/V heads than tp, each head's columns are
  // held by `copies` = tp / H_kv consecutive tp ranks (their gradients summed among them,
  // reduce_replicated_kv_grads; counted once in the gradient norm).
  bool kv = false;
  int32_t copies = 1;
  int64_t loc_elems() const { return loc_rows * loc_cols; }
};

// One layer's tensors. attn_norm, wq, wk, wv, wo and the MLP's serve both kinds of layer (for a
// GDN layer wq/wk/wv are its query/key/value projections, wo its output projection); the GDN-only
// tensors are null in an attention layer.
struct LayerView {
  float *attn_norm, *wq, *wk, *wv, *wo, *mlp_norm, *w1, *w3, *w2;
  // MLA (wq when q_lora = 0; wk, wv unused): query latent [dim, q_lora], its norm [1, q_lora], its
  // up-projection [q_lora, H*D]; K/V latent + RoPE key [dim, kv_lora + rope], its norm
  // [1, kv_lora], its up-projection [kv_lora, H*(nope + v)].
  float *wq_a = nullptr, *q_norm = nullptr, *wq_b = nullptr, *wkv_a = nullptr, *kv_norm = nullptr, *wkv_b = nullptr;
  float *conv_q = nullptr, *conv_k = nullptr, *conv_v = nullptr;  // [conv, H*Dk], [conv, H*Dk], [conv, H*Dv]
  float *wa = nullptr, *wb = nullptr;                              // [dim, H]: decay and beta inputs
  float *a_log = nullptr, *dt_bias = nullptr;                      // [1, H]
  float *wg = nullptr, *o_norm = nullptr;                          // [dim, H*Dv] output gate, [1, Dv]
};
struct ModelView {
  float* emb;         // [V, dim]
  std::vector<LayerView> layers;
  float* final_norm;  // [dim]
  float* lm_head;     // [dim, V]
};

// A run of the flat layout that the model uses together (shard=params gathers the weights of one
// at a time): the embedding (unit 0), each layer (unit 1 + l), the final norm with the LM head
// (the last unit). [begin, end) covers its tensors and their alignment padding; tensors
// [first, last) of the layout.
struct ParamUnit {
  int64_t begin = 0, end = 0;
  size_t first = 0, last = 0;
  int64_t elems() const { return end - begin; }
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelDims& d);
  const ModelDims& dims() const { return d_; }
  const std::vector<ParamInfo>& tensors() const { return t_; }
  int64_t local_elems() const { return total_; }
  const std::vector<ParamUnit>& units() const { return units_; }
  static size_t embedding_unit() { return 0; }
  static size_t layer_unit(int64_t l) { return size_t(l) + 1; }
  size_t head_unit() const { return units_.size() - 1; }
  ModelView view(float* base) const;
  // The pointers of unit u's tensors, laid out as in the flat buffer from `unit_base` (its element
  // 0 is flat element units()[u].begin); every other pointer null.
  ModelView unit_view(size_t u, float* unit_base) const;
  // Fills `base` (local_elems()) with the seeded initial weights: element (i, j) of a global
  // tensor is a function of (seed, tensor_id, i * cols + j) only, so every mesh sees the same
  // model and a tp slice generates exactly its own elements.
  void init(uint64_t seed, float* base) const;
  // The same numbers for unit u's tensors only, laid out from `unit_base` as unit_view says.
  void init_unit(uint64_t seed, size_t u, float* unit_base) const;

 private:
  template <class At> ModelView view_with(At at) const;
  void init_tensor(uint64_t seed, const ParamInfo& p, float* out) const;
  std::vector<ParamUnit> units_;
  ModelDims d_;
  std::vector<ParamInfo> t_;
  int64_t total_ = 0;
};

}  // namespace ctxpar
