#include "model/model.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/random.hpp"

namespace ctxpar {

ModelDims model_dims(const Config& c, int tp, int tp_rank) {
  ModelDims d;
  d.layers = c.layers;
  d.dim = c.dim;
  d.ffn = c.ffn_dim;
  d.vocab = c.vocab;
  d.H_q = int32_t(c.heads);
  d.H_kv = int32_t(c.kv_heads);
  d.D = int32_t(c.head_dim);
  d.norm_eps = float(c.norm_eps);
  d.rope_theta = c.rope_theta;
  d.rope_factor = c.rope_scale_factor;
  d.rope_low = c.rope_low_freq_factor;
  d.rope_high = c.rope_high_freq_factor;
  d.rope_orig_max = double(c.rope_original_max_pos);
  d.tp = tp;
  d.tp_rank = tp_rank;
  d.exact_heads = int32_t(c.exact_heads);
  if (c.attention == "mla") {
    d.mla = true;
    d.q_lora = int32_t(c.q_lora_rank);
    d.kv_lora = int32_t(c.kv_lora_rank);
    d.nope = int32_t(c.qk_nope_head_dim);
    d.rope = int32_t(c.qk_rope_head_dim);
    d.v_dim = int32_t(c.v_head_dim);
    d.D = d.nope + d.rope;
    d.H_kv = d.H_q;
  }
  if (c.layer_pattern.find_first_of("DL") != std::string::npos) {
    for (int64_t l = 0; l < c.layers; ++l) d.kinds += c.layer_pattern[size_t(l) % c.layer_pattern.size()];
    if (d.has_local()) d.window = c.window;
  }
  if (c.layer_pattern.find('D') != std::string::npos) {
    d.gdn_H = int32_t(c.gdn_heads > 0 ? c.gdn_heads : c.heads);
    d.gdn_Dk = int32_t(c.gdn_head_dim_k > 0 ? c.gdn_head_dim_k : c.head_dim);
    d.gdn_Dv = int32_t(c.gdn_head_dim_v > 0 ? c.gdn_head_dim_v : c.head_dim);
    d.gdn_conv = int32_t(c.gdn_conv);
    d.gdn_chunk = int32_t(c.gdn_chunk);
    d.gdn_schedule = c.gdn_schedule;
    d.gdn_replicated = c.gdn_state == "replicated";
  }
  return d;
}

int64_t ModelDims::gdn_layers() const { return int64_t(std::count(kinds.begin(), kinds.end(), 'D')); }

int64_t ModelDims::param_count() const {
  const int64_t mlp = dim + 3 * dim * ffn;
  const int64_t H = H_q, qd = H * D;
  const int64_t attn = mla ? dim + (q_lora > 0 ? dim * q_lora + q_lora + int64_t(q_lora) * qd : dim * qd) +
                                 dim * (kv_lora + rope) + kv_lora + int64_t(kv_lora) * H * (nope + v_dim) + H * v_dim * dim
                           : dim + dim * int64_t(H_q) * D * 2 + dim * int64_t(H_kv) * D * 2;
  const int64_t qk = gdn_qk_width(), v = gdn_v_width();
  const int64_t gdn = dim + dim * (2 * qk + v) + int64_t(gdn_conv) * (2 * qk + v) + 2 * dim * gdn_H + 2 * gdn_H +
                      dim * v + gdn_Dv + v * dim;
  const int64_t G = gdn_layers();
  return (layers - G) * (attn + mlp) + G * (gdn + mlp) + 2 * vocab * dim + dim;
}

int64_t exact_tp_units(const ModelDims& d) {
  const int32_t per_part = d.exact_heads > 0 ? d.exact_heads : d.H_q / d.H_kv;  // query heads
  return std::gcd(int64_t(d.H_q / per_part), d.ffn);
}

int64_t exact_tp_sum_cols(const ModelDims& d) {
  return std::max({d.dim, int64_t(d.q_lora), int64_t(d.kv_lora + d.rope)});
}

std::string validate_model_shape(const Config& c, int tp, bool kv_replication) {
  auto s = [](int64_t v) { return std::to_string(v); };
  if (c.head_dim % 2 != 0)
    return "config: head_dim = " + s(c.head_dim) + " is odd; RoPE rotates pairs of dimensions, valid: an even head_dim";
  const bool mla = c.attention == "mla";  // kv_heads unused: checked below
  if (!mla && (c.heads % tp != 0 || (c.kv_heads % tp != 0 && !(kv_replication && tp % c.kv_heads == 0)))) {
    std::string ok;  // every tp that runs: the hint names them, not a rule the mode does not have
    for (int64_t t = 1; t <= c.heads; ++t)
      if (c.heads % t == 0 && (c.kv_heads % t == 0 || (kv_replication && t % c.kv_heads == 0)))
        ok += (ok.empty() ? "" : ", ") + s(t);
    return "config: tensor parallel tp:" + s(tp) + " must divide heads = " + s(c.heads) +
           (kv_replication ? ", and divide or be a multiple of kv_heads = " + s(c.kv_heads) +
                                 " (K/V heads split over tp, or each replicated on tp/kv_heads ranks)"
                           : " and kv_heads = " + s(c.kv_heads) + " (whole heads per tp rank; K/V heads are not " +
                                 "replicated over tp here)") +
           "; valid: tp = " + ok;
  }
  if (c.ffn_dim % tp != 0)
    return "config: tensor parallel tp:" + s(tp) + " must divide ffn_dim = " + s(c.ffn_dim) +
           "; valid: an ffn_dim that is a multiple of " + s(tp);
  if (c.layer_pattern.find('D') != std::string::npos) {
    if (tp > 1)
      return "config: layer_pattern = '" + c.layer_pattern + "' has Gated DeltaNet layers (D), which run without "
             "tensor parallelism so far; valid: tp:1 (context and data parallelism serve them)";
  }
  if (c.attention == "mla") {
    const int64_t D = c.qk_nope_head_dim + c.qk_rope_head_dim;
    if (c.heads % tp != 0)
      return "config: attention = mla: tp:" + s(tp) + " does not divide heads = " + s(c.heads) +
             " (MLA's heads are split over tp, its latent projections replicated); valid: a tp dividing " + s(c.heads);
    if (D > 256)
      return "config: attention = mla: qk_nope_head_dim + qk_rope_head_dim = " + s(D) + " is the attention's head "
             "dim, above the kernels' 256; valid: a sum of at most 256 (DeepSeek-V2/V3: 128 + 64)";
    if (c.qk_rope_head_dim % 2 != 0)
      return "config: qk_rope_head_dim = " + s(c.qk_rope_head_dim) + " is odd; RoPE rotates pairs, valid: an even value";
    if (c.v_head_dim > D)
      return "config: v_head_dim = " + s(c.v_head_dim) + " is above qk_nope_head_dim + qk_rope_head_dim = " + s(D) +
             " (values are padded to the key's head dim for the attention kernel); valid: v_head_dim <= " + s(D);
  }
  if (c.rope_high_freq_factor < c.rope_low_freq_factor)
    return "config: rope_high_freq_factor = " + std::to_string(c.rope_high_freq_factor) + " < rope_low_freq_factor = " +
           std::to_string(c.rope_low_freq_factor) + "; valid: high >= low (Llama 3: low 1, high 4)";
  return "";
}

ParamLayout::ParamLayout(const ModelDims& d) : d_(d) {
  // Uniform with std 0.02 (half-width 0.02 sqrt 3); output projections that write into the
  // residual stream scaled by 1/sqrt(2L) so the stream's variance does not grow with depth.
  const float base = 0.02f * std::sqrt(3.0f);
  const float out_scale = base / std::sqrt(2.0f * float(d.layers));
  // kv: a K/V projection, split by whole heads (one head replicated where tp exceeds H_kv).
  auto add = [&](std::string name, int64_t rows, int64_t cols, Split split, bool decay, bool ones, float scale,
                 float center = 0, bool kv = false) {
    ParamInfo p;
    p.name = std::move(name);
    p.rows = rows;
    p.cols = cols;
    p.split = split;
    p.loc_rows = rows;
    p.loc_cols = cols;
    if (kv) {
      p.kv = true;
      p.copies = d.H_kv >= d.tp ? 1 : d.tp / d.H_kv;
      p.loc_cols = int64_t(d.H_kv_loc()) * d.D;
      p.col0 = int64_t(d.kv_head0()) * d.D;
    } else if (split == Split::cols) {
      p.loc_cols = cols / d.tp;
      p.col0 = p.loc_cols * d.tp_rank;
    } else if (split == Split::rows) {
      p.loc_rows = rows / d.tp;
      p.row0 = p.loc_rows * d.tp_rank;
    }
    p.offset = total_;
    p.tensor_id = 0x1000 + t_.size();
    p.decay = decay;
    p.ones = ones;
    p.init_scale = scale;
    p.init_center = center;
    // 16-float (64-byte) alignment of every tensor keeps the GEMM operands aligned.
    total_ += (p.loc_elems() + 15) / 16 * 16;
    t_.push_back(std::move(p));
  };
  const int64_t qw = int64_t(d.H_q) * d.D, kw = int64_t(d.H_kv) * d.D;
  add("emb", d.vocab, d.dim, Split::replicated, true, false, base);
  for (int64_t l = 0; l < d.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    if (d.is_gdn(l)) {  // model/gdn_layer.hpp (tp = 1: the mesh check refuses tp > 1 with GDN layers)
      const int64_t gq = d.gdn_qk_width(), gv = d.gdn_v_width(), H = d.gdn_H;
      const float conv_scale = 1.0f / std::sqrt(float(d.gdn_conv));  // PyTorch's Conv1d default
      add(p + "attn_norm", 1, d.dim, Split::replicated, false, true, 0);
      add(p + "wq", d.dim, gq, Split::cols, true, false, base);
      add(p + "wk", d.dim, gq, Split::cols, true, false, base);
      add(p + "wv", d.dim, gv, Split::cols, true, false, base);
      add(p + "conv_q", d.gdn_conv, gq, Split::cols, true, false, conv_scale);
      add(p + "conv_k", d.gdn_conv, gq, Split::cols, true, false, conv_scale);
      add(p + "conv_v", d.gdn_conv, gv, Split::cols, true, false, conv_scale);
      add(p + "wa", d.dim, H, Split::cols, true, false, base);
      add(p + "wb", d.dim, H, Split::cols, true, false, base);
      // A = exp(a_log) in [1, 16], dt = softplus(dt_bias) in about [1e-3, 0.1] (the published init's ranges)
      add(p + "a_log", 1, H, Split::cols, false, false, 0.5f * std::log(16.0f), 0.5f * std::log(16.0f));
      add(p + "dt_bias", 1, H, Split::cols, false, false, 2.3f, -4.6f);
      add(p + "wg", d.dim, gv, Split::cols, true, false, base);
      add(p + "o_norm", 1, d.gdn_Dv, Split::replicated, false, true, 0);
      add(p + "wo", gv, d.dim, Split::rows, true, false, out_scale);
      add(p + "mlp_norm", 1, d.dim, Split::replicated, false, true, 0);
      add(p + "w1", d.dim, d.ffn, Split::cols, true, false, base);
      add(p + "w3", d.dim, d.ffn, Split::cols, true, false, base);
      add(p + "w2", d.ffn, d.dim, Split::rows, true, false, out_scale);
      continue;
    }
    if (d.mla) {  // model/mla_layer.hpp: heads split over tp (whole heads), the latent projections replicated
      const int64_t H = d.H_q;
      add(p + "attn_norm", 1, d.dim, Split::replicated, false, true, 0);
      if (d.q_lora > 0) {
        add(p + "wq_a", d.dim, d.q_lora, Split::replicated, true, false, base);
        add(p + "q_norm", 1, d.q_lora, Split::replicated, false, true, 0);
        add(p + "wq_b", d.q_lora, qw, Split::cols, true, false, base);
      } else {
        add(p + "wq", d.dim, qw, Split::cols, true, false, base);
      }
      add(p + "wkv_a", d.dim, d.kv_lora + d.rope, Split::replicated, true, false, base);
      add(p + "kv_norm", 1, d.kv_lora, Split::replicated, false, true, 0);
      add(p + "wkv_b", d.kv_lora, H * (d.nope + d.v_dim), Split::cols, true, false, base);
      add(p + "wo", H * d.v_dim, d.dim, Split::rows, true, false, out_scale);
      add(p + "mlp_norm", 1, d.dim, Split::replicated, false, true, 0);
      add(p + "w1", d.dim, d.ffn, Split::cols, true, false, base);
      add(p + "w3", d.dim, d.ffn, Split::cols, true, false, base);
      add(p + "w2", d.ffn, d.dim, Split::rows, true, false, out_scale);
      continue;
    }
    add(p + "attn_norm", 1, d.dim, Split::replicated, false, true, 0);
    add(p + "wq", d.dim, qw, Split::cols, true, false, base);
    add(p + "wk", d.dim, kw, Split::cols, true, false, base, 0, true);
    add(p + "wv", d.dim, kw, Split::cols, true, false, base, 0, true);
    add(p + "wo", qw, d.dim, Split::rows, true, false, out_scale);
    add(p + "mlp_norm", 1, d.dim, Split::replicated, false, true, 0);
    add(p + "w1", d.dim, d.ffn, Split::cols, true, false, base);
    add(p + "w3", d.dim, d.ffn, Split::cols, true, false, base);
    add(p + "w2", d.ffn, d.dim, Split::rows, true, false, out_scale);
  }
  const size_t head = t_.size();
  add("final_norm", 1, d.dim, Split::replicated, false, true, 0);
  add("lm_head", d.dim, d.vocab, Split::replicated, true, false, base);
  // The units: the embedding, each layer (the tensors whose names start with its prefix), the head.
  units_.push_back({0, 0, 0, 1});
  for (int64_t l = 0; l < d.layers; ++l) {
    const size_t first = units_.back().last;
    size_t last = first;
    while (last < head && t_[last].name.rfind("layers." + std::to_string(l) + ".", 0) == 0) ++last;
    units_.push_back({0, 0, first, last});
  }
  units_.push_back({0, 0, units_.back().last, t_.size()});
  CTXPAR_CHECK(units_.back().first == head, "ParamLayout: the layers' tensors are not in layer order");
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].begin = t_[units_[u].first].offset;
    units_[u].end = u + 1 < units_.size() ? t_[units_[u + 1].first].offset : total_;
  }
}

template <class At> ModelView ParamLayout::view_with(At at) const {
  ModelView v;
  size_t i = 0;
  v.emb = at(i++);
  v.layers.resize(size_t(d_.layers));
  for (size_t li = 0; li < v.layers.size(); ++li) {
    LayerView& l = v.layers[li];
    if (d_.is_gdn(int64_t(li))) {  // the order of the constructor
      for (float** f : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.conv_q, &l.conv_k, &l.conv_v, &l.wa, &l.wb, &l.a_log,
                        &l.dt_bias, &l.wg, &l.o_norm, &l.wo, &l.mlp_norm, &l.w1, &l.w3, &l.w2})
        *f = at(i++);
      continue;
    }
    if (d_.mla) {  // the order of the constructor
      l.attn_norm = at(i++);
      if (d_.q_lora > 0) {
        for (float** f : {&l.wq_a, &l.q_norm, &l.wq_b}) *f = at(i++);
      } else {
        l.wq = at(i++);
      }
      for (float** f : {&l.wkv_a, &l.kv_norm, &l.wkv_b, &l.wo, &l.mlp_norm, &l.w1, &l.w3, &l.w2}) *f = at(i++);
      continue;
    }
    l.attn_norm = at(i++);
    l.wq = at(i++);
    l.wk = at(i++);
    l.wv = at(i++);
    l.wo = at(i++);
    l.mlp_norm = at(i++);
    l.w1 = at(i++);
    l.w3 = at(i++);
    l.w2 = at(i++);
  }
  v.final_norm = at(i++);
  v.lm_head = at(i++);
  return v;
}

ModelView ParamLayout::view(float* b) const {
  return view_with([&](size_t i) { return b + t_[i].offset; });
}

ModelView ParamLayout::unit_view(size_t u, float* unit_base) const {
  const ParamUnit& n = units_[u];
  return view_with([&](size_t i) { return i >= n.first && i < n.last ? unit_base + (t_[i].offset - n.begin) : nullptr; });
}

void ParamLayout::init(uint64_t seed, float* b) const {
  for (const ParamInfo& p : t_) init_tensor(seed, p, b + p.offset);
}

void ParamLayout::init_unit(uint64_t seed, size_t u, float* unit_base) const {
  const ParamUnit& n = units_[u];
  for (size_t i = n.first; i < n.last; ++i) init_tensor(seed, t_[i], unit_base + (t_[i].offset - n.begin));
}

void ParamLayout::init_tensor(uint64_t seed, const ParamInfo& p, float* out) const {
  if (p.ones) {
    for (int64_t i = 0; i < p.loc_elems(); ++i) out[i] = 1.0f;
    return;
  }
  // The key of global element (r, c) is exactly fill_rows' (core/random.hpp) for a [rows, cols]
  // tensor, so a slice is the same numbers as the corresponding part of the whole tensor.
  const uint64_t key0 = splitmix64(seed * 0x100000001b3ull + p.tensor_id);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.loc_rows; ++r)
    for (int64_t c = 0; c < p.loc_cols; ++c) {
      const uint64_t g = uint64_t(p.row0 + r) * uint64_t(p.cols) + uint64_t(p.col0 + c);
      out[r * p.loc_cols + c] = p.init_center + p.init_scale * uniform_pm1(key0 ^ g * 0x9e3779b97f4a7c15ull);
    }
}

}  // namespace ctxpar
