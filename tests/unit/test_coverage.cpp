// The coverage audit's rule (model/coverage.hpp): every attention layer's pairs x heads, summed
// over the ranks, equal to the batch's visible pairs x H_q (twice in the forward with remat); a
// planted drop or repeat on one layer fails it, naming the step, the layer and the direction.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/coverage.hpp"

namespace ctxpar {
namespace {

ModelDims dims(const std::string& kinds) {
  ModelDims d;
  d.layers = int64_t(kinds.size());
  d.kinds = kinds;
  d.H_q = 8;
  d.window = 64;
  return d;
}

// What a correct step computes: per layer [forward, backward].
std::vector<double> exact(const ModelDims& d, double causal, double window, Remat remat) {
  std::vector<double> got;
  for (int64_t l = 0; l < d.layers; ++l) {
    const double w = d.is_gdn(l) ? 0 : (d.is_local(l) ? window : causal) * d.H_q;
    got.push_back(remat == Remat::none ? w : 2 * w);
    got.push_back(w);
  }
  return got;
}

// An inference call's visible pairs against a count by positions: new rows after cached ones,
// causal or a window, several sequences; a Gated DeltaNet layer has none.
TEST(Coverage, InferencePairsCountByPositions) {
  const ModelDims d = dims("GLDG");
  const std::vector<int64_t> news = {5, 0, 70, 1}, olds = {0, 9, 33, 100};
  double want = 0, causal = 0, window = 0;
  for (size_t b = 0; b < news.size(); ++b)
    for (int64_t q = olds[b]; q < olds[b] + news[b]; ++q)   // each new row's position
      for (int64_t k = 0; k <= q; ++k) {                     // the keys before it, itself included
        want += 3.0 * (2 /* G layers */ + (q - k < d.window ? 1 : 0) /* the L layer */);
        causal += 3.0;
        window += q - k < d.window ? 3.0 : 0.0;
      }
  EXPECT_EQ(infer_visible_pair_heads(d, 3, news, olds), want);
  const double per_layer[4] = {causal, window, 0.0, causal};  // G, L, D, G
  for (int64_t l = 0; l < 4; ++l) EXPECT_EQ(infer_layer_pair_heads(d, 3, l, news, olds), per_layer[l]) << "layer " << l;
  EXPECT_EQ(infer_visible_pair_heads(dims("DD"), 3, news, olds), 0.0);
}

TEST(Coverage, ExactCountsPass) {
  for (const std::string kinds : {"GG", "GLGL", "DGLD"})
    for (Remat remat : {Remat::none, Remat::attention, Remat::full}) {
      const ModelDims d = dims(kinds);
      EXPECT_EQ(coverage_audit(exact(d, 5000, 1200, remat), d, 5000, 1200, remat, 3), "") << kinds;
    }
}

TEST(Coverage, PlantedDropOrRepeatIsNamed) {
  const ModelDims d = dims("GLG");
  std::vector<double> got = exact(d, 5000, 1200, Remat::none);
  got[3] -= 1;  // layer 1 (local), backward: one pair x head short
  std::string msg = coverage_audit(got, d, 5000, 1200, Remat::none, 7);
  EXPECT_NE(msg.find("step 7, layer 1 (local)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("backward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dropped keys"), std::string::npos) << msg;
  got = exact(d, 5000, 1200, Remat::none);
  got[4] += 8;  // layer 2, forward: a block repeated
  msg = coverage_audit(got, d, 5000, 1200, Remat::none, 0);
  EXPECT_NE(msg.find("layer 2 (global)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("more than once"), std::string::npos) << msg;
  // With remat the forward runs twice: a single forward is a drop.
  got = exact(d, 5000, 1200, Remat::none);
  EXPECT_NE(coverage_audit(got, d, 5000, 1200, Remat::full, 0).find("twice with remat"), std::string::npos);
  // A Gated DeltaNet layer computes no attention; attention counted there is wrong.
  const ModelDims g = dims("DG");
  got = exact(g, 5000, 0, Remat::none);
  got[0] = 1;
  EXPECT_NE(coverage_audit(got, g, 5000, 0, Remat::none, 0).find("layer 0 (Gated DeltaNet)"), std::string::npos);
  // Counts for another model are refused, not read past their end.
  EXPECT_NE(coverage_audit({1, 2}, d, 5000, 1200, Remat::none, 0), "");
}

}  // namespace
}  // namespace ctxpar
