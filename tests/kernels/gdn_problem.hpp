// A Gated DeltaNet problem for the tests (kernels and CP): inputs as the layer gives them, the
// fp64/fp32 recurrence's outputs and gradients, the chunked kernel's.
#pragma once
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attn_problem.hpp"
#include "ops.hpp"
#include "ref/gdn_ref.hpp"

namespace ctxpar::test {

struct GdnShape {
  int64_t T;
  int32_t H, Dk, Dv, chunk;
  bool with_s0;
  float g_min = -0.4f;  // log decay drawn from [g_min, 0)
  int docs = 1;         // packed documents (random boundaries; 1: one document, no doc ids)
};

inline std::string name(const GdnShape& s) {
  return "T" + std::to_string(s.T) + " H" + std::to_string(s.H) + " Dk" + std::to_string(s.Dk) + " Dv" +
         std::to_string(s.Dv) + " chunk" + std::to_string(s.chunk) + (s.with_s0 ? " s0" : "") +
         (s.docs > 1 ? " docs" + std::to_string(s.docs) : "");
}

// Inputs as the layer gives them: q, k L2-normalised, beta in (0, 1), g <= 0.
struct GdnProblem {
  GdnShape s;
  std::vector<float> q, k, v, g, beta, s0, d_o, ds_out;
  std::vector<int32_t> doc;  // empty: one document
  GdnProblem(const GdnShape& sh, unsigned seed) : s(sh) {
    std::mt19937 rng(seed);
    if (s.docs > 1) {  // docs - 1 distinct boundaries in (0, T)
      doc.assign(size_t(s.T), 0);
      std::vector<int64_t> cut;
      std::uniform_int_distribution<int64_t> at(1, s.T - 1);
      while (int(cut.size()) < std::min<int64_t>(s.docs - 1, s.T - 1)) {
        const int64_t c = at(rng);
        if (std::find(cut.begin(), cut.end(), c) == cut.end()) cut.push_back(c);
      }
      for (int64_t c : cut)
        for (int64_t t = c; t < s.T; ++t) doc[size_t(t)] += 1;
    }
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> ud(0, 1);
    auto normed = [&](int32_t D) {
      std::vector<float> x(s.T * s.H * D);
      for (auto& e : x) e = nd(rng);
      for (int64_t r = 0; r < s.T * s.H; ++r) {
        double n = 0;
        for (int d = 0; d < D; ++d) n += double(x[r * D + d]) * x[r * D + d];
        for (int d = 0; d < D; ++d) x[r * D + d] = float(x[r * D + d] / std::sqrt(n));
      }
      return x;
    };
    q = normed(s.Dk);
    k = normed(s.Dk);
    v.resize(s.T * s.H * s.Dv);
    for (auto& e : v) e = nd(rng);
    g.resize(s.T * s.H);
    beta.resize(s.T * s.H);
    for (auto& e : g) e = s.g_min * ud(rng);
    for (auto& e : beta) e = 0.05f + 0.9f * ud(rng);
    const int64_t SS = int64_t(s.H) * s.Dv * s.Dk;
    if (s.with_s0) {
      s0.resize(SS);
      for (auto& e : s0) e = 0.5f * nd(rng);
    }
    d_o.resize(v.size());
    for (auto& e : d_o) e = nd(rng);
    ds_out.resize(SS);
    for (auto& e : ds_out) e = 0.3f * nd(rng);
  }
  GdnParams params() const {
    GdnParams p;
    p.T = s.T, p.H = s.H, p.Dk = s.Dk, p.Dv = s.Dv, p.chunk = s.chunk;
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.g = g.data(), p.beta = beta.data();
    p.s0 = s.with_s0 ? s0.data() : nullptr;
    p.doc = doc.empty() ? nullptr : doc.data();
    return p;
  }
};

// The recurrence's outputs in type T.
template <class T>
struct RefOut {
  std::vector<T> o, s_out, dq, dk, dv, dg, dbeta, ds0;
};

template <class T>
RefOut<T> run_ref(const GdnProblem& pr) {
  const GdnShape& s = pr.s;
  auto q = convert<T>(pr.q), k = convert<T>(pr.k), v = convert<T>(pr.v), g = convert<T>(pr.g),
       b = convert<T>(pr.beta), s0 = convert<T>(pr.s0), d_o = convert<T>(pr.d_o), ds = convert<T>(pr.ds_out);
  const int64_t SS = int64_t(s.H) * s.Dv * s.Dk;
  RefOut<T> r;
  r.o.resize(v.size()), r.s_out.resize(SS), r.dq.resize(q.size()), r.dk.resize(k.size()), r.dv.resize(v.size());
  r.dg.resize(g.size()), r.dbeta.resize(b.size()), r.ds0.resize(SS);
  const T sc = T(1) / std::sqrt(T(s.Dk));
  const T* s0p = s.with_s0 ? s0.data() : nullptr;
  const int32_t* doc = pr.doc.empty() ? nullptr : pr.doc.data();
  ref::gdn_fwd<T>(s.T, s.H, s.Dk, s.Dv, sc, q.data(), k.data(), v.data(), g.data(), b.data(), doc, s0p, r.o.data(),
                  r.s_out.data());
  ref::gdn_bwd<T>(s.T, s.H, s.Dk, s.Dv, sc, q.data(), k.data(), v.data(), g.data(), b.data(), doc, s0p, d_o.data(),
                  ds.data(), r.dq.data(), r.dk.data(), r.dv.data(), r.dg.data(), r.dbeta.data(), r.ds0.data());
  return r;
}

inline RefOut<float> run_fast(const GdnProblem& pr) {
  const GdnShape& s = pr.s;
  const int64_t SS = int64_t(s.H) * s.Dv * s.Dk;
  RefOut<float> r;
  r.o.resize(pr.v.size()), r.s_out.resize(SS), r.dq.resize(pr.q.size()), r.dk.resize(pr.k.size());
  r.dv.resize(pr.v.size()), r.dg.resize(pr.g.size()), r.dbeta.resize(pr.beta.size()), r.ds0.resize(SS);
  GdnParams p = pr.params();
  p.o = r.o.data(), p.s_out = r.s_out.data();
  gdn_fwd(p);
  p.d_o = pr.d_o.data(), p.ds_out = pr.ds_out.data();
  p.dq = r.dq.data(), p.dk = r.dk.data(), p.dv = r.dv.data(), p.dg = r.dg.data(), p.dbeta = r.dbeta.data();
  p.ds0 = r.ds0.data();
  gdn_bwd(p);
  return r;
}

}  // namespace ctxpar::test
