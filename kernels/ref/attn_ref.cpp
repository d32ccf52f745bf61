// Reference attention: the definitions, written for reading, not for speed.
#include "ref/attn_ref.hpp"

#include <cmath>
#include <limits>
#include <vector>

namespace ctxpar::ref {

namespace {

// Scores s_j = scale * q_i . k_j of the visible keys of row i, head h; returns their max
// (-inf when none is visible). Invisible keys get -inf.
template <class T>
T row_scores(const AttnParams& p, const T* q, const T* k, int64_t i, int32_t h, std::vector<T>& s) {
  const int32_t D = p.D, g = h / (p.H_q / p.H_kv);
  const T scale = static_cast<T>(p.softmax_scale());
  const T* qi = q + i * p.q_ld() + h * D;
  T m = -std::numeric_limits<T>::infinity();
  s.assign(p.S_k, -std::numeric_limits<T>::infinity());
  for (int64_t j = 0; j < p.S_k; ++j) {
    if (!p.visible(i, j)) continue;
    const T* kj = k + j * p.k_ld() + g * D;
    T dot = 0;
    for (int32_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
    s[j] = scale * dot;
    m = std::max(m, s[j]);
  }
  return m;
}

}  // namespace

template <class T>
void attn_fwd(const AttnParams& p, const T* q, const T* k, const T* v, T* o, T* lse) {
  const int32_t D = p.D, group = p.H_q / p.H_kv;
  std::vector<T> s;
  for (int64_t i = 0; i < p.S_q; ++i) {
    for (int32_t h = 0; h < p.H_q; ++h) {
      T* oi = o + (i * p.H_q + h) * D;
      for (int32_t d = 0; d < D; ++d) oi[d] = 0;
      const T m = row_scores(p, q, k, i, h, s);
      if (m == -std::numeric_limits<T>::infinity()) {  // sees no key
        lse[i * p.H_q + h] = m;
        continue;
      }
      // softmax with the max subtracted (exp never overflows), then O = sum_j p_j v_j
      T l = 0;
      for (int64_t j = 0; j < p.S_k; ++j) {
        if (s[j] == -std::numeric_limits<T>::infinity()) continue;
        const T pj = std::exp(s[j] - m);
        l += pj;
        const T* vj = v + j * p.v_ld() + (h / group) * D;
        for (int32_t d = 0; d < D; ++d) oi[d] += pj * vj[d];
      }
      for (int32_t d = 0; d < D; ++d) oi[d] /= l;
      lse[i * p.H_q + h] = m + std::log(l);
    }
  }
}

// FlashAttention-2 backward, per row: p_j = exp(s_j - lse), D_i = dO_i . O_i,
// dV_j += p_j dO_i, dS_j = p_j (dO_i . v_j - D_i), dQ_i += scale dS_j k_j, dK_j += scale dS_j q_i.
template <class T>
void attn_bwd(const AttnParams& p, const T* q, const T* k, const T* v, const T* o, const T* lse,
              const T* dout, T* dq, T* dk, T* dv) {
  const int32_t D = p.D, group = p.H_q / p.H_kv;
  const T scale = static_cast<T>(p.softmax_scale());
  std::vector<T> s;
  for (int64_t i = 0; i < p.S_q; ++i) {
    for (int32_t h = 0; h < p.H_q; ++h) {
      const T l = lse[i * p.H_q + h];
      if (l == -std::numeric_limits<T>::infinity()) continue;  // no key: no gradient
      row_scores(p, q, k, i, h, s);
      const int64_t row = (i * p.H_q + h) * D;  // o, dq (packed)
      const T* qi = q + i * p.q_ld() + h * D;
      const T* gi = dout + i * p.dout_ld() + h * D;
      T Di = 0;
      for (int32_t d = 0; d < D; ++d) Di += gi[d] * o[row + d];
      for (int64_t j = 0; j < p.S_k; ++j) {
        if (s[j] == -std::numeric_limits<T>::infinity()) continue;
        const T pj = std::exp(s[j] - l);
        const int64_t kv_row = (j * p.H_kv + h / group) * D;  // dk, dv (packed)
        const T* kj = k + j * p.k_ld() + (h / group) * D;
        const T* vj = v + j * p.v_ld() + (h / group) * D;
        T dp = 0;
        for (int32_t d = 0; d < D; ++d) dp += gi[d] * vj[d];
        const T ds = pj * (dp - Di);
        for (int32_t d = 0; d < D; ++d) {
          dv[kv_row + d] += pj * gi[d];
          dq[row + d] += scale * ds * kj[d];
          dk[kv_row + d] += scale * ds * qi[d];
        }
      }
    }
  }
}

// lse = m + log(e^(lse_a - m) + e^(lse_b - m)), m = max(lse_a, lse_b);
// o = e^(lse_a - lse) o_a + e^(lse_b - lse) o_b. A -inf side has weight exactly 0.
template <class T>
void lse_merge(T* o, T* lse, const T* o_b, const T* lse_b, int64_t rows, int32_t H, int32_t D) {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < rows * H; ++r) {
    const T la = lse[r], lb = lse_b[r];
    if (lb == ninf) continue;
    T* oa = o + r * D;
    const T* ob = o_b + r * D;
    if (la == ninf) {
      for (int32_t d = 0; d < D; ++d) oa[d] = ob[d];
      lse[r] = lb;
      continue;
    }
    const T m = std::max(la, lb);
    const T l = m + std::log(std::exp(la - m) + std::exp(lb - m));
    const T wa = std::exp(la - l), wb = std::exp(lb - l);
    for (int32_t d = 0; d < D; ++d) oa[d] = wa * oa[d] + wb * ob[d];
    lse[r] = l;
  }
}

template void attn_fwd<double>(const AttnParams&, const double*, const double*, const double*,
                               double*, double*);
template void attn_fwd<float>(const AttnParams&, const float*, const float*, const float*, float*,
                              float*);
template void attn_bwd<double>(const AttnParams&, const double*, const double*, const double*,
                               const double*, const double*, const double*, double*, double*,
                               double*);
template void attn_bwd<float>(const AttnParams&, const float*, const float*, const float*,
                              const float*, const float*, const float*, float*, float*, float*);
template void lse_merge<double>(double*, double*, const double*, const double*, int64_t, int32_t,
                                int32_t);
template void lse_merge<float>(float*, float*, const float*, const float*, int64_t, int32_t,
                               int32_t);

}  // namespace ctxpar::ref
