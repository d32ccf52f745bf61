// Tracer over a real Topology on 1/2/4 ranks: every rank's spans and every step reach the file,
// the file is renamed at finish, a signal on one rank stops all ranks after the same step, span
// times are on rank 0's clock (message causality holds across ranks), and a bad output path is
// a usage error on every rank.
#include <gtest/gtest.h>

#include <csignal>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "cp/strategy.hpp"
#include "core/error.hpp"
#include "dist/topology.hpp"
#include "mpi_test_env.hpp"
#include "io/h5_trace.hpp"
#include "trace/trace.hpp"
#include "trace/trace_detail.hpp"

using namespace ctxpar;
using ctxpar::test::all_ok;
using ctxpar::test::world;
namespace fs = std::filesystem;

namespace {

// A mesh that uses two axes when it can, so coords are not all on one axis.
MeshSpec test_mesh(int P) {
  MeshSpec m;
  if (P % 2 == 0) {
    m.ulysses = 2;
    m.ring = P / 2;
  } else {
    m.ring = P;
  }
  return m;
}

Config test_config(int64_t warmup) {
  // The watchdog turns a hang (e.g. ranks disagreeing about stopping) into a quick failure.
  state_strategy_choices();  // the registry's strategy names, as the program states them
  Config cfg = parse_config("", "test", {"warmup=" + std::to_string(warmup), "watchdog_s=60"});
  return cfg;
}

// Same path on every rank (ctest runs each rank count in its own process group; the name
// carries the rank count so np=2 and np=4 can run at once).
std::string out_path(const std::string& name) {
  return (fs::current_path() / ("trace_mpi_np" + std::to_string(world().size())) / name).string();
}

void remove_outputs(const std::string& path) {
  if (world().rank() == 0) {
    fs::remove(path);
    fs::remove(path + ".partial");
  }
  world().barrier();
}

// Spans rank r records in step s: (r + 1) attention spans with ring steps 0..r, one wait span.
int spans_per_step(int r) { return r + 2; }
double span_flops(int r, int64_t step, int i) { return 1e6 * (r + 1) + 1e3 * double(step) + i; }

}  // namespace

TEST(Tracer, WritesEveryRanksSpansAndStepsThenRenames) {
  Comm& w = world();
  const int P = w.size(), me = w.rank();
  const std::string path = out_path("basic.h5");
  remove_outputs(path);
  auto topo = Topology::create(w, test_mesh(P));
  const int64_t warmup = 1, steps = 4;
  const double peak = 2e9;
  {
    Tracer tr(w, test_config(warmup), *topo, path, peak);
    if (me == 0) {
      EXPECT_TRUE(fs::exists(path + ".partial"));
    }
    EXPECT_EQ(tr.path(), path);
    for (int64_t s = 0; s < steps; ++s) {
      tr.begin_step(s);
      for (int i = 0; i <= me; ++i) {
        auto sc = tr.scope(Phase::attn_fwd, /*layer=*/0, /*ring_step=*/i, span_flops(me, s, i), 4096.0);
      }
      const double t0 = tr.now_us();
      tr.add_span(Phase::comm_wait, 0, -1, t0, tr.now_us(), 0, 128.0);
      EXPECT_EQ(tr.step_spans().size(), size_t(spans_per_step(me)));
      StepRecord rec;
      rec.tokens = me == 0 ? 1000 : -1;  // rank 0's values are the ones recorded
      rec.model_flops = 1e6;
      rec.loss = 3.0 - double(s);
      rec.exposed_comm_s = 0.001 * (me + 1);
      EXPECT_FALSE(tr.end_step(rec));
      EXPECT_TRUE(tr.step_spans().empty());
    }
    tr.finish(false);
  }

  // Rank 0 reads the file back; ASSERTs return from the lambda only, so every rank still
  // reaches the agreement below.
  auto check_file = [&] {
    EXPECT_TRUE(fs::exists(path));
    EXPECT_FALSE(fs::exists(path + ".partial"));
    const TraceDigest d = read_trace_digest(path);
    EXPECT_EQ(d.schema_version, trace_detail::kSchemaVersion);
    EXPECT_EQ(d.status, "complete");
    EXPECT_EQ(d.steps_completed, steps);
    size_t expected_spans = 0;
    for (int r = 0; r < P; ++r) expected_spans += size_t(steps * spans_per_step(r));
    EXPECT_EQ(d.spans.size(), expected_spans);
    std::vector<std::vector<int>> count(size_t(steps), std::vector<int>(size_t(P), 0));
    for (const SpanRecord& s : d.spans) {
      ASSERT_GE(s.rank, 0);
      ASSERT_LT(s.rank, P);
      ASSERT_GE(s.step, 0);
      ASSERT_LT(s.step, steps);
      EXPECT_LE(s.t_begin_us, s.t_end_us);
      if (s.phase == int32_t(Phase::attn_fwd)) {
        EXPECT_EQ(s.flops, span_flops(s.rank, s.step, s.ring_step));  // which rank, step, index
        EXPECT_EQ(s.bytes, 4096.0);
      } else {
        EXPECT_EQ(s.phase, int32_t(Phase::comm_wait));
        EXPECT_EQ(s.bytes, 128.0);
      }
      ++count[size_t(s.step)][size_t(s.rank)];
    }
    for (int64_t st = 0; st < steps; ++st)
      for (int r = 0; r < P; ++r)
        EXPECT_EQ(count[size_t(st)][size_t(r)], spans_per_step(r)) << "step " << st << " rank " << r;

    ASSERT_EQ(d.steps.size(), size_t(steps));
    std::vector<double> measured;
    for (int64_t st = 0; st < steps; ++st) {
      const auto& row = d.steps[size_t(st)];
      EXPECT_EQ(row.step, st);
      EXPECT_EQ(row.tokens, 1000);
      EXPECT_DOUBLE_EQ(row.loss, 3.0 - double(st));
      EXPECT_GT(row.time_s, 0.0);
      EXPECT_DOUBLE_EQ(row.exposed_comm_s, 0.001 * P);  // max over ranks
      EXPECT_NEAR(row.mfu, 1e6 / (row.time_s * peak * P), 1e-12 * row.mfu);
      EXPECT_GT(row.peak_rss_bytes, 0);
      if (st >= warmup) measured.push_back(row.time_s);
    }
    ASSERT_EQ(d.rank_steps.size(), size_t(steps * P));
    for (size_t i = 0; i < d.rank_steps.size(); ++i) {
      EXPECT_EQ(d.rank_steps[i].rank, int(i % size_t(P)));
      EXPECT_EQ(d.rank_steps[i].step, int64_t(i / size_t(P)));
      EXPECT_DOUBLE_EQ(d.rank_steps[i].exposed_comm_s, 0.001 * (d.rank_steps[i].rank + 1));
    }
    // Step time is the max over ranks.
    for (int64_t st = 0; st < steps; ++st) {
      double mx = 0;
      for (int r = 0; r < P; ++r) mx = std::max(mx, d.rank_steps[size_t(st * P + r)].time_s);
      EXPECT_EQ(d.steps[size_t(st)].time_s, mx);
    }
    EXPECT_TRUE(d.summary_valid);
    EXPECT_EQ(d.summary_measured_steps, steps - warmup);
    EXPECT_DOUBLE_EQ(d.summary_time_s_median, trace_detail::median(measured));
    ASSERT_EQ(d.coords.size(), size_t(P * kNumAxes));
    for (int r = 0; r < P; ++r)
      for (int a = 0; a < kNumAxes; ++a)
        EXPECT_EQ(d.coords[size_t(r * kNumAxes + a)], topo->all_coords()[size_t(r)][size_t(a)]);
    ASSERT_EQ(d.clock_offset_us.size(), size_t(P));
    EXPECT_EQ(d.clock_offset_us[0], 0.0);
  };
  if (me == 0) check_file();
  EXPECT_TRUE(all_ok(!::testing::Test::HasFailure()));
}

TEST(Tracer, SignalOnOneRankStopsEveryRankAfterTheSameStep) {
  Comm& w = world();
  const int P = w.size(), me = w.rank();
  const std::string path = out_path("signal.h5");
  remove_outputs(path);
  auto topo = Topology::create(w, test_mesh(P));
  clear_stop_signal();
  const int64_t signal_step = 2, max_steps = 50;
  int64_t stopped_after = -1;
  {
    Tracer tr(w, test_config(0), *topo, path, 0.0);
    for (int64_t s = 0; s < max_steps; ++s) {
      tr.begin_step(s);
      { auto sc = tr.scope(Phase::gemm); }
      if (s == signal_step && me == P - 1) std::raise(SIGUSR1);  // only the last rank sees it
      if (tr.end_step(StepRecord{})) {
        stopped_after = s;
        break;
      }
    }
    tr.finish(/*truncated=*/true);
  }
  clear_stop_signal();
  EXPECT_EQ(stopped_after, signal_step);
  auto check_file = [&] {
    EXPECT_FALSE(fs::exists(path + ".partial"));
    ASSERT_TRUE(fs::exists(path));
    const TraceDigest d = read_trace_digest(path);
    EXPECT_EQ(d.status, "truncated");
    EXPECT_EQ(d.steps_completed, signal_step + 1);
    EXPECT_EQ(d.steps.size(), size_t(signal_step + 1));
    EXPECT_EQ(d.spans.size(), size_t((signal_step + 1) * P));
  };
  if (me == 0) check_file();
  EXPECT_TRUE(all_ok(!::testing::Test::HasFailure()));
}

// Span times are shifted onto rank 0's clock. MPI_Wtime has a per-process origin, so without the
// shift the times of different ranks are unrelated. Message causality must hold after it: rank r
// stamps tC and sends to rank 0, which stamps tD after receiving, so tD >= tC; the reverse too.
// Allowed slack: the offset's error bound.
TEST(Tracer, SpanTimesAreCausalAcrossRanks) {
  Comm& w = world();
  const int P = w.size(), me = w.rank();
  const std::string path = out_path("clock.h5");
  remove_outputs(path);
  auto topo = Topology::create(w, test_mesh(P));
  Tracer tr(w, test_config(0), *topo, path, 0.0);
  EXPECT_GE(tr.clock_offset_error_us(), 0.0);
  if (me == 0) {
    EXPECT_EQ(tr.clock_offset_us(), 0.0);
  }
  tr.begin_step(0);
  // Each pair (0, r) in turn: [before-send, after-receive] per rank, on rank 0's timeline.
  std::vector<double> stamps;  // rank 0: per partner r: before, after; rank r: before, after
  for (int r = 1; r < P; ++r) {
    if (me != 0 && me != r) continue;
    const int peer = me == 0 ? r : 0;
    double out = 1, in = 0;
    const double before = tr.now_us();
    tr.add_span(Phase::comm_send_recv, -1, r, before, before);
    Request q = w.send_recv_async(std::span<double>(&out, 1), peer, std::span<double>(&in, 1), peer, 11);
    w.wait(q);
    const double after = tr.now_us();
    tr.add_span(Phase::comm_send_recv, -1, r, after, after);
  }
  const std::vector<SpanRecord>& sp = tr.step_spans();
  std::vector<double> mine(size_t(2 * P), 0.0);  // rank 0 fills partner slots; rank r its own
  if (me == 0) {
    for (int r = 1; r < P; ++r) {
      mine[size_t(2 * r)] = sp[size_t(2 * (r - 1))].t_begin_us;
      mine[size_t(2 * r + 1)] = sp[size_t(2 * (r - 1) + 1)].t_begin_us;
    }
  } else {
    mine[0] = sp[0].t_begin_us;
    mine[1] = sp[1].t_begin_us;
  }
  const int n = 2 * P;
  std::vector<double> all(size_t(n * P));
  w.all_gather(std::span<const double>(mine), std::span<double>(all));
  double err = tr.clock_offset_error_us();
  w.all_reduce(std::span<double>(&err, 1), ReduceOp::max);
  for (int r = 1; r < P; ++r) {
    const double root_before = all[size_t(2 * r)], root_after = all[size_t(2 * r + 1)];
    const double peer_before = all[size_t(r * n + 0)], peer_after = all[size_t(r * n + 1)];
    // +1 µs: rounding of the shifted doubles.
    EXPECT_GE(peer_after, root_before - err - 1.0) << "rank " << r << " received before rank 0 sent";
    EXPECT_GE(root_after, peer_before - err - 1.0) << "rank 0 received before rank " << r << " sent";
  }
  tr.end_step(StepRecord{});
  tr.finish(false);
}

TEST(Tracer, UnusableOutputPathIsAUsageErrorOnEveryRank) {
  Comm& w = world();
  const std::string dir = out_path("blocker");
  if (w.rank() == 0) {
    fs::create_directories(fs::path(dir).parent_path());
    std::ofstream f(dir);  // a plain file where a directory is needed
    f << "x";
  }
  w.barrier();
  auto topo = Topology::create(w, test_mesh(w.size()));
  bool threw = false;
  try {
    Tracer tr(w, test_config(0), *topo, dir + "/run.h5", 0.0);
  } catch (const UsageError& e) {
    threw = std::string(e.what()).find("blocker") != std::string::npos;
  }
  EXPECT_TRUE(threw);
  EXPECT_TRUE(all_ok(threw));
}
