#include "model/coverage.hpp"

#include <cstdio>

#include "model/flops.hpp"

namespace ctxpar {

std::vector<double> coverage_expected(const ModelDims& d, double causal_pairs, double window_pairs, Remat remat) {
  std::vector<double> out;
  for (int64_t l = 0; l < d.layers; ++l) {
    const double pairs = d.is_gdn(l) ? 0.0 : (d.is_local(l) ? window_pairs : causal_pairs) * double(d.H_q);
    out.push_back(pairs * (remat == Remat::none ? 1.0 : 2.0));  // remat's backward recomputes the forward
    out.push_back(pairs);
  }
  return out;
}

double infer_layer_pair_heads(const ModelDims& d, int64_t heads, int64_t l, const std::vector<int64_t>& news,
                              const std::vector<int64_t>& olds) {
  double pairs = 0;
  for (size_t b = 0; b < news.size(); ++b) {
    if (d.is_gdn(l) || news[b] == 0) continue;
    pairs += double(heads) * (d.is_local(l) ? window_prefill_pairs(news[b], olds[b], d.window)
                                            : partial_prefill_pairs(news[b], olds[b]));
  }
  return pairs;
}

double infer_visible_pair_heads(const ModelDims& d, int64_t heads, const std::vector<int64_t>& news,
                                const std::vector<int64_t>& olds) {
  double pairs = 0;
  for (int64_t l = 0; l < d.layers; ++l) pairs += infer_layer_pair_heads(d, heads, l, news, olds);
  return pairs;
}

std::string coverage_audit(const std::vector<double>& got, const ModelDims& d, double causal_pairs, double window_pairs,
                           Remat remat, int64_t step) {
  if (got.size() != size_t(2 * d.layers))
    return "coverage audit: " + std::to_string(got.size()) + " counts for " + std::to_string(d.layers) + " layers";
  const std::vector<double> want = coverage_expected(d, causal_pairs, window_pairs, remat);
  for (int64_t l = 0; l < d.layers; ++l) {
    const bool attn = !d.is_gdn(l);
    // Integers below 2^53 in doubles: exact sums, compared exactly.
    const double want_fwd = want[size_t(2 * l)], want_bwd = want[size_t(2 * l + 1)];
    const double f = got[size_t(2 * l)], b = got[size_t(2 * l + 1)];
    if (f == want_fwd && b == want_bwd) continue;
    const bool fwd_bad = f != want_fwd;
    char msg[400];
    std::snprintf(msg, sizeof msg,
                  "coverage audit: step %lld, layer %lld (%s): the ranks' %s computed %.0f (query, key) pairs x heads, "
                  "the batch has %.0f visible (x %d heads%s): a CP schedule %s",
                  (long long)step, (long long)l, !attn ? "Gated DeltaNet" : d.is_local(l) ? "local" : "global",
                  fwd_bad ? "forward" : "backward", fwd_bad ? f : b, fwd_bad ? want_fwd : want_bwd, int(d.H_q),
                  fwd_bad && remat != Remat::none ? ", twice with remat's recompute" : "",
                  (fwd_bad ? f < want_fwd : b < want_bwd) ? "dropped keys some queries should see"
                                                      : "computed some pairs more than once");
    return msg;
  }
  return "";
}

}  // namespace ctxpar
