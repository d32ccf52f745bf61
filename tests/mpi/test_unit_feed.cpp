// UnitFeed (model/state_shard.hpp) over the world as the shard group: every unit's weights, asked
// for in a training step's order (and out of it), equal the whole flat weights; the gradient
// pieces after finish() equal the sum over ranks; the next unit's gather starts ahead, so only the
// units no earlier one could make room for are gathered when asked.
#include <gtest/gtest.h>

#include <vector>

#include "model/state_shard.hpp"
#include "mpi_test_env.hpp"

using namespace ctxpar;
using ctxpar::test::world;

namespace {

ModelDims dims(int64_t layers) {
  ModelDims d;
  d.layers = layers;
  d.dim = 8;
  d.ffn = 24;
  d.vocab = 200;  // the embedding and the head (1600 elements) wider than a layer (784)
  d.H_q = 2;
  d.H_kv = 1;
  d.D = 4;
  return d;
}

float value(int64_t i) { return float(i % 101) - 50.0f; }  // small integers: sums over ranks exact

struct Fixture {
  ParamLayout layout;
  StateShard shard;
  std::vector<float> flat, pieces, grads;
  UnitFeed feed;
  explicit Fixture(int64_t layers)
      : layout(dims(layers)), shard(layout, ShardLevel::params, world().rank(), world().size()),
        flat(size_t(layout.local_elems())), pieces(size_t(shard.elems())), grads(size_t(shard.elems()), -7.0f),
        feed(layout, shard, shard.sharded() ? &world() : nullptr, false, Device::cpu, nullptr) {
    for (size_t i = 0; i < flat.size(); ++i) flat[i] = value(int64_t(i));
    take_pieces(shard, flat.data(), pieces.data(), Device::cpu, nullptr);
  }
  // Unit u's weights as handed out, against the whole flat weights.
  int64_t wrong_weights(size_t u) {
    const StateShard::Piece& p = shard.pieces[u];
    const float* w = feed.weights(u);
    int64_t wrong = 0;
    for (int64_t i = 0; i < p.len; ++i) wrong += w[i] != flat[size_t(p.begin + i)];
    return wrong;
  }
};

class UnitFeedLayers : public ::testing::TestWithParam<int64_t> {};

TEST_P(UnitFeedLayers, StepOrderWeightsAndGradientPieces) {
  Fixture f(GetParam());
  const int Z = world().size(), z = world().rank();
  const size_t units = f.shard.pieces.size();
  ASSERT_EQ(units, size_t(GetParam()) + 2);
  EXPECT_EQ(UnitFeed::step_order(units).size(), 2 * units - 2);
  for (int step = 0; step < 2; ++step) {  // the second: nothing left over from the first
    SCOPED_TRACE(step);
    f.feed.bind(f.shard.sharded() ? f.pieces.data() : f.flat.data(), f.grads.data(), nullptr, nullptr);
    for (size_t u : UnitFeed::step_order(units)) EXPECT_EQ(f.wrong_weights(u), 0) << "unit " << u;
    // Gathered when asked: the first unit; with an even number of layers also the head, whose
    // wide buffer the last layer holds.
    if (f.shard.sharded()) {
      EXPECT_EQ(f.feed.late_gathers(), GetParam() % 2 == 0 ? 2 : 1);
    }
    // The backward's gradients: rank r adds (r + 1) x value to every element of every unit.
    std::vector<size_t> back = {units - 1};
    for (size_t u = units - 1; u-- > 0;) back.push_back(u);
    for (size_t u : back) {
      const StateShard::Piece& p = f.shard.pieces[u];
      float* g = f.feed.grads(u);
      for (int64_t i = 0; i < p.len; ++i) g[i] += float(z + 1) * value(p.begin + i);
      f.feed.grads_done(u);
    }
    f.feed.finish();
    const float ranks = float(Z) * float(Z + 1) / 2;
    int64_t wrong = 0;
    for (const StateShard::Piece& p : f.shard.pieces)
      for (int64_t i = p.lo; i < p.hi; ++i) {
        const float got = f.shard.sharded() ? f.grads[size_t(p.at + i - p.lo)] : f.grads[size_t(i)];
        wrong += got != (f.shard.sharded() ? ranks : 1.0f) * value(i);
      }
    EXPECT_EQ(wrong, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, UnitFeedLayers, ::testing::Values(int64_t(2), int64_t(3)));

// Asked out of the step's order, every unit is still right (what is in flight completes first).
TEST(UnitFeed, AnyOrderStillRight) {
  Fixture f(3);
  f.feed.bind(f.shard.sharded() ? f.pieces.data() : f.flat.data(), f.grads.data(), nullptr, nullptr);
  for (size_t u : {2, 0, 4, 4, 1, 3, 0, 2}) EXPECT_EQ(f.wrong_weights(u), 0) << "unit " << u;
  f.feed.finish();
}

}  // namespace
