// Plain recurrence of Gated DeltaNet and its reverse-mode derivative (see gdn_ref.hpp).
#include "ref/gdn_ref.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ctxpar::ref {

namespace {

// One step of the recurrence on one head: S <- a S + b (v - a S k) k^T; returns u in `u`.
template <class T>
void step(T* S, const T* kt, const T* vt, T a, T b, int32_t Dk, int32_t Dv, T* u) {
  for (int32_t i = 0; i < Dv; ++i) {
    T sk = 0;
    for (int32_t j = 0; j < Dk; ++j) sk += S[i * Dk + j] * kt[j];
    u[i] = vt[i] - a * sk;
  }
  for (int32_t i = 0; i < Dv; ++i)
    for (int32_t j = 0; j < Dk; ++j) S[i * Dk + j] = a * S[i * Dk + j] + b * u[i] * kt[j];
}

}  // namespace

template <class T>
void gdn_fwd(int64_t Tn, int32_t H, int32_t Dk, int32_t Dv, T scale, const T* q, const T* k, const T* v,
             const T* g, const T* beta, const int32_t* doc, const T* s0, T* o, T* s_out) {
  const int64_t SS = int64_t(Dv) * Dk;
  std::vector<T> S(SS), u(Dv);
  for (int32_t h = 0; h < H; ++h) {
    for (int64_t e = 0; e < SS; ++e) S[e] = s0 ? s0[h * SS + e] : T(0);
    for (int64_t t = 0; t < Tn; ++t) {
      const T* qt = q + (t * H + h) * Dk;
      const T* kt = k + (t * H + h) * Dk;
      if (doc && t > 0 && doc[t] != doc[t - 1]) std::fill(S.begin(), S.end(), T(0));
      step<T>(S.data(), kt, v + (t * H + h) * Dv, std::exp(g[t * H + h]), beta[t * H + h], Dk, Dv, u.data());
      for (int32_t i = 0; i < Dv; ++i) {
        T acc = 0;
        for (int32_t j = 0; j < Dk; ++j) acc += S[i * Dk + j] * qt[j];
        o[(t * H + h) * Dv + i] = scale * acc;
      }
    }
    if (s_out)
      for (int64_t e = 0; e < SS; ++e) s_out[h * SS + e] = S[e];
  }
}

template <class T>
void gdn_bwd(int64_t Tn, int32_t H, int32_t Dk, int32_t Dv, T scale, const T* q, const T* k, const T* v,
             const T* g, const T* beta, const int32_t* doc, const T* s0, const T* d_o, const T* ds_out, T* dq, T* dk,
             T* dv, T* dg, T* dbeta, T* ds0) {
  const int64_t SS = int64_t(Dv) * Dk;
  std::vector<T> states((Tn + 1) * SS), U(Tn * Dv), dS(SS), du(Dv), sk(Dv), zero(SS, T(0));
  for (int32_t h = 0; h < H; ++h) {
    // Forward again, keeping every state S_0..S_T and every u_t.
    for (int64_t e = 0; e < SS; ++e) states[e] = s0 ? s0[h * SS + e] : T(0);
    for (int64_t t = 0; t < Tn; ++t) {
      T* S = states.data() + (t + 1) * SS;
      const bool reset = doc && t > 0 && doc[t] != doc[t - 1];
      for (int64_t e = 0; e < SS; ++e) S[e] = reset ? T(0) : states[t * SS + e];
      step<T>(S, k + (t * H + h) * Dk, v + (t * H + h) * Dv, std::exp(g[t * H + h]), beta[t * H + h], Dk, Dv,
              U.data() + t * Dv);
    }
    for (int64_t e = 0; e < SS; ++e) dS[e] = ds_out ? ds_out[h * SS + e] : T(0);
    for (int64_t t = Tn - 1; t >= 0; --t) {
      const T* qt = q + (t * H + h) * Dk;
      const T* kt = k + (t * H + h) * Dk;
      const T* dot = d_o + (t * H + h) * Dv;
      const T* St = states.data() + (t + 1) * SS;
      const bool reset = doc && t > 0 && doc[t] != doc[t - 1];
      const T* Sp = reset ? zero.data() : states.data() + t * SS;
      const T* ut = U.data() + t * Dv;
      const T a = std::exp(g[t * H + h]), b = beta[t * H + h];
      T* dqt = dq + (t * H + h) * Dk;
      T* dkt = dk + (t * H + h) * Dk;
      // o_t = scale S_t q_t
      for (int32_t j = 0; j < Dk; ++j) {
        T acc = 0;
        for (int32_t i = 0; i < Dv; ++i) acc += St[i * Dk + j] * dot[i];
        dqt[j] = scale * acc;
      }
      for (int32_t i = 0; i < Dv; ++i)
        for (int32_t j = 0; j < Dk; ++j) dS[i * Dk + j] += scale * dot[i] * qt[j];
      // S_t = a S_{t-1} + b u k^T
      T da = 0, db = 0;
      for (int32_t i = 0; i < Dv; ++i) {
        T acc = 0;
        for (int32_t j = 0; j < Dk; ++j) acc += dS[i * Dk + j] * kt[j];
        du[i] = b * acc;
        db += ut[i] * acc;
      }
      for (int32_t j = 0; j < Dk; ++j) {
        T acc = 0;
        for (int32_t i = 0; i < Dv; ++i) acc += dS[i * Dk + j] * ut[i];
        dkt[j] = b * acc;
      }
      for (int64_t e = 0; e < SS; ++e) da += dS[e] * Sp[e];
      // u = v - a S_{t-1} k
      for (int32_t i = 0; i < Dv; ++i) {
        T acc = 0;
        for (int32_t j = 0; j < Dk; ++j) acc += Sp[i * Dk + j] * kt[j];
        sk[i] = acc;
        dv[(t * H + h) * Dv + i] = du[i];
        da -= acc * du[i];
      }
      for (int32_t j = 0; j < Dk; ++j) {
        T acc = 0;
        for (int32_t i = 0; i < Dv; ++i) acc += Sp[i * Dk + j] * du[i];
        dkt[j] -= a * acc;
      }
      for (int32_t i = 0; i < Dv; ++i)
        for (int32_t j = 0; j < Dk; ++j) dS[i * Dk + j] = a * dS[i * Dk + j] - a * du[i] * kt[j];
      dg[t * H + h] = da * a;
      dbeta[t * H + h] = db;
      if (reset) std::fill(dS.begin(), dS.end(), T(0));  // the state before a reset is unused
    }
    if (ds0)
      for (int64_t e = 0; e < SS; ++e) ds0[h * SS + e] = dS[e];
  }
}

#define CTXPAR_GDN_REF(T)                                                                                   \
  template void gdn_fwd<T>(int64_t, int32_t, int32_t, int32_t, T, const T*, const T*, const T*, const T*,    \
                           const T*, const int32_t*, const T*, T*, T*);                                      \
  template void gdn_bwd<T>(int64_t, int32_t, int32_t, int32_t, T, const T*, const T*, const T*, const T*,    \
                           const T*, const int32_t*, const T*, const T*, const T*, T*, T*, T*, T*, T*, T*);
CTXPAR_GDN_REF(double)
CTXPAR_GDN_REF(float)
#undef CTXPAR_GDN_REF

}  // namespace ctxpar::ref
