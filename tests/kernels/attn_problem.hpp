// Random attention problems for the kernel tests: tensors, global positions and document ids
// for one query block against one key block, in the layouts the CP strategies produce.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn_params.hpp"

namespace ctxpar::test {

// Where the key block sits relative to the query block (global positions).
enum class Layout {
  diagonal,  // keys and queries start at the same position (the diagonal block)
  past,      // every key before every query
  future,    // every key after every query (causal: nothing visible)
  straddle,  // keys start before the queries and end inside them
  zigzag,    // queries are two chunks (r and 2P-1-r), keys the whole sequence
};

struct Shape {
  int64_t S_q, S_k;
  int32_t H_q, H_kv, D;
  MaskKind mask;
  Layout layout;
  int64_t window = 0;
  bool docs = false;  // packed documents (random lengths, ids from global positions)
};

inline std::string layout_name(Layout l) {
  switch (l) {
    case Layout::diagonal: return "diag";
    case Layout::past: return "past";
    case Layout::future: return "future";
    case Layout::straddle: return "straddle";
    case Layout::zigzag: return "zigzag";
  }
  return "?";
}

inline std::string shape_name(const Shape& s) {
  // ostringstream rather than operator+ chains: GCC 12 -O3 warns falsely (-Wrestrict) on those
  std::ostringstream n;
  n << "q" << s.S_q << "_k" << s.S_k << "_h" << s.H_q << "x" << s.H_kv << "_d" << s.D << "_"
    << (s.mask == MaskKind::none ? "none" : s.mask == MaskKind::causal ? "causal" : "window") << "_"
    << layout_name(s.layout);
  if (s.mask == MaskKind::window) n << "_w" << s.window;
  if (s.docs) n << "_docs";
  return n.str();
}

struct Problem {
  Shape shape;
  std::vector<float> q, k, v, dout;
  std::vector<int64_t> q_pos, k_pos;
  std::vector<int32_t> q_doc, k_doc;

  Problem(const Shape& s, uint64_t seed) : shape(s) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n01(0.f, 1.f);
    auto fill = [&](std::vector<float>& x, int64_t n) {
      x.resize(n);
      for (auto& e : x) e = n01(rng);
    };
    fill(q, s.S_q * s.H_q * s.D);
    fill(k, s.S_k * s.H_kv * s.D);
    fill(v, s.S_k * s.H_kv * s.D);
    fill(dout, s.S_q * s.H_q * s.D);
    q_pos.resize(s.S_q);
    k_pos.resize(s.S_k);
    switch (s.layout) {
      case Layout::diagonal:
        for (int64_t i = 0; i < s.S_q; ++i) q_pos[i] = 1000 + i;
        for (int64_t j = 0; j < s.S_k; ++j) k_pos[j] = 1000 + j;
        break;
      case Layout::past:
        for (int64_t i = 0; i < s.S_q; ++i) q_pos[i] = s.S_k + 7 + i;
        for (int64_t j = 0; j < s.S_k; ++j) k_pos[j] = j;
        break;
      case Layout::future:
        for (int64_t i = 0; i < s.S_q; ++i) q_pos[i] = i;
        for (int64_t j = 0; j < s.S_k; ++j) k_pos[j] = s.S_q + 3 + j;
        break;
      case Layout::straddle:  // keys start S_k/2 before the first query
        for (int64_t i = 0; i < s.S_q; ++i) q_pos[i] = s.S_k / 2 + i;
        for (int64_t j = 0; j < s.S_k; ++j) k_pos[j] = j;
        break;
      case Layout::zigzag: {  // P = 2, rank 0 of the queries: chunks 0 and 3 of 4
        const int64_t half = s.S_q / 2, chunk = s.S_k / 4;
        for (int64_t i = 0; i < s.S_q; ++i) q_pos[i] = i < half ? i : 3 * chunk + (i - half);
        for (int64_t j = 0; j < s.S_k; ++j) k_pos[j] = j;
        break;
      }
    }
    if (s.docs) {
      // Document boundaries at random global positions; a token's id is its document's index.
      int64_t max_pos = 0;
      for (auto x : q_pos) max_pos = std::max(max_pos, x);
      for (auto x : k_pos) max_pos = std::max(max_pos, x);
      std::vector<int32_t> doc_of(max_pos + 1);
      std::uniform_int_distribution<int64_t> len(1, std::max<int64_t>(2, (max_pos + 1) / 3));
      int32_t id = 0;
      for (int64_t x = 0; x <= max_pos;) {
        const int64_t L = len(rng);
        for (int64_t y = x; y < std::min(max_pos + 1, x + L); ++y) doc_of[y] = id;
        x += L;
        ++id;
      }
      q_doc.resize(s.S_q);
      k_doc.resize(s.S_k);
      for (int64_t i = 0; i < s.S_q; ++i) q_doc[i] = doc_of[q_pos[i]];
      for (int64_t j = 0; j < s.S_k; ++j) k_doc[j] = doc_of[k_pos[j]];
    }
  }

  AttnParams params() const {
    AttnParams p;
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.dout = dout.data();
    p.S_q = shape.S_q;
    p.S_k = shape.S_k;
    p.H_q = shape.H_q;
    p.H_kv = shape.H_kv;
    p.D = shape.D;
    p.q_pos = q_pos.data();
    p.k_pos = k_pos.data();
    if (shape.docs) {
      p.q_doc = q_doc.data();
      p.k_doc = k_doc.data();
    }
    p.mask = shape.mask;
    p.window = shape.window;
    return p;
  }
};

template <class T, class U>
std::vector<T> convert(const std::vector<U>& x) { return std::vector<T>(x.begin(), x.end()); }

// max_i |a_i - ref_i| over finite reference entries; infinities must match exactly (returned
// as +inf error when they do not), NaN anywhere is +inf error.
template <class A>
double max_abs_err(const std::vector<A>& a, const std::vector<double>& ref) {
  double e = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double x = static_cast<double>(a[i]);
    if (std::isnan(x) || std::isnan(ref[i])) return std::numeric_limits<double>::infinity();
    if (std::isinf(ref[i]) || std::isinf(x)) {
      if (x != ref[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    e = std::max(e, std::abs(x - ref[i]));
  }
  return e;
}

}  // namespace ctxpar::test
