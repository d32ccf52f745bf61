// Trace arithmetic (step aggregation, clock offsets, medians, summary) and the HDF5 writer's
// round trip, without MPI: the writer runs serial HDF5 on one process.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "io/h5_trace.hpp"
#include "trace/trace.hpp"
#include "trace/trace_detail.hpp"

using namespace ctxpar;
using namespace ctxpar::trace_detail;
namespace fs = std::filesystem;

namespace {

fs::path scratch_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("ctxpar_test_trace_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  return d;
}

}  // namespace

TEST(TraceMath, MedianMatchesNumpyConvention) {
  EXPECT_DOUBLE_EQ(median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);  // mean of the two middle values
  EXPECT_DOUBLE_EQ(median({7.0}), 7.0);
  EXPECT_TRUE(std::isnan(median({})));
}

TEST(TraceMath, StepRowTakesMaximaOverRanksAndDerivesRates) {
  StepRecord root;
  root.step = 7;
  root.tokens = 4096;
  root.model_flops = 8e12;
  root.loss = 1.25;
  root.turn = 3;
  root.ttft_s = 0.5;
  root.ttit_s = 0.01;
  std::vector<RankStepRow> ranks(4);
  const double times[4] = {1.0, 2.0, 1.5, 0.5};
  for (int r = 0; r < 4; ++r) {
    ranks[size_t(r)].rank = r;
    ranks[size_t(r)].time_s = times[r];
    ranks[size_t(r)].exposed_comm_s = 0.1 * (4 - r);
    ranks[size_t(r)].peak_bytes = 1000 + r;
    ranks[size_t(r)].peak_rss_bytes = 5000 - r;
    ranks[size_t(r)].device_peak_bytes = r == 2 ? 9000 : 10 * r;
  }
  const StepRow row = make_step_row(root, ranks, /*peak_flops_per_rank=*/1e12);
  EXPECT_EQ(row.step, 7);
  EXPECT_EQ(row.tokens, 4096);
  EXPECT_DOUBLE_EQ(row.time_s, 2.0);
  EXPECT_DOUBLE_EQ(row.exposed_comm_s, 0.4);
  EXPECT_EQ(row.peak_bytes, 1003);
  EXPECT_EQ(row.peak_rss_bytes, 5000);
  EXPECT_EQ(row.device_peak_bytes, 9000);
  EXPECT_DOUBLE_EQ(row.tflops_per_rank, 8e12 / 2.0 / 4 / 1e12);  // 1.0
  EXPECT_DOUBLE_EQ(row.mfu, 8e12 / (2.0 * 1e12 * 4));            // 1.0
  EXPECT_DOUBLE_EQ(row.loss, 1.25);
  EXPECT_EQ(row.turn, 3);
  EXPECT_DOUBLE_EQ(row.ttft_s, 0.5);
  EXPECT_DOUBLE_EQ(row.ttit_s, 0.01);

  const StepRow no_peak = make_step_row(root, ranks, 0.0);
  EXPECT_EQ(no_peak.mfu, 0.0);
  EXPECT_DOUBLE_EQ(no_peak.tflops_per_rank, 1.0);
}

// A step row is written only when every number in it is finite; the first one that is not is named.
TEST(TraceMath, NonFiniteStepValuesAreNamed) {
  StepRow row;
  row.time_s = 0.5, row.model_flops = 1e12, row.tflops_per_rank = 2, row.loss = 3.25;
  EXPECT_EQ(non_finite_field(row), "");
  row.tflops_per_rank = INFINITY;
  EXPECT_EQ(non_finite_field(row), "tflops_per_rank is inf");
  row.tflops_per_rank = 2, row.loss = NAN;
  EXPECT_EQ(non_finite_field(row), "loss is nan");
}

TEST(TraceMath, ClockOffsetFromShortestRoundTrip) {
  // Rank r's clock runs 2.5 s ahead of rank 0's. One-way delays differ per sample; the
  // estimate must come from the sample with the shortest round trip and be within its bound.
  const double skew_s = 2.5;
  struct Delays { double out_s, back_s; };
  const Delays delays[] = {{40e-6, 10e-6}, {3e-6, 5e-6}, {100e-6, 1e-6}, {20e-6, 20e-6}};
  std::vector<ClockSample> samples;
  double t = 10.0;  // rank 0's clock
  for (const Delays& d : delays) {
    const double t0 = t, arrive = t0 + d.out_s, t1 = arrive + d.back_s;
    samples.push_back({t0, arrive + skew_s, t1});
    t += 1.0;
  }
  const ClockOffset off = estimate_clock_offset(samples);
  EXPECT_NEAR(off.error_s, 0.5 * (3e-6 + 5e-6), 1e-12);  // the second sample
  EXPECT_NEAR(off.offset_s, skew_s, off.error_s);
  EXPECT_NEAR(off.offset_s, skew_s + 0.5 * (3e-6 - 5e-6), 1e-12);  // tr - midpoint, exactly
  // A clock behind rank 0's gives a negative offset.
  for (ClockSample& s : samples) s.tr_s -= 2 * skew_s;
  EXPECT_NEAR(estimate_clock_offset(samples).offset_s, -skew_s, off.error_s);
}

TEST(TraceMath, TimelineShiftMapsLocalTimesOntoRankZeroClock) {
  // Rank r's clock reads 100 s when rank 0's reads 40 s (offset +60 s). Rank 0 started its
  // tracer at 40.0 s (its clock), rank r at 100.5 s (r's clock) = 40.5 s on rank 0's clock.
  const double offset_s = 60.0, t0_root_s = 40.0, t0_local_s = 100.5;
  const double shift_us = timeline_shift_us(t0_local_s, offset_s, t0_root_s);
  // An event 2 ms after rank r's start happened at 40.502 s on rank 0's clock: 502 ms after
  // rank 0's start.
  const double local_us = 2000.0;
  EXPECT_NEAR(local_us + shift_us, 502000.0, 1e-6);
  // Rank 0 itself: no shift.
  EXPECT_EQ(timeline_shift_us(t0_root_s, 0.0, t0_root_s), 0.0);
}

TEST(TraceMath, SummaryExcludesWarmupRows) {
  std::vector<StepRow> rows(5);
  const double times[5] = {9.0, 1.0, 3.0, 2.0, 4.0};  // first row is a slow warmup step
  for (int i = 0; i < 5; ++i) {
    rows[size_t(i)].step = i;
    rows[size_t(i)].time_s = times[i];
    rows[size_t(i)].tokens = 100;
    rows[size_t(i)].mfu = 0.1 * i;
    rows[size_t(i)].peak_bytes = 10 * i;
    rows[size_t(i)].loss = 5.0 - i;
  }
  const Summary s = summarize(rows, /*warmup=*/1);
  EXPECT_EQ(s.steps_total, 5);
  EXPECT_EQ(s.warmup_excluded, 1);
  EXPECT_EQ(s.measured_steps, 4);
  EXPECT_TRUE(s.valid) << s.valid_reason;
  EXPECT_DOUBLE_EQ(s.time_s_median, 2.5);              // median of 1, 3, 2, 4
  EXPECT_DOUBLE_EQ(s.mfu_median, 0.25);                // median of .1 .2 .3 .4
  EXPECT_DOUBLE_EQ(s.tokens_per_s_median, 0.5 * (100 / 3.0 + 100 / 2.0));  // median of 100/t
  EXPECT_EQ(s.peak_bytes_max, 40);
  EXPECT_DOUBLE_EQ(s.loss_last, 1.0);

  const Summary all_warm = summarize(rows, 10);
  EXPECT_EQ(all_warm.warmup_excluded, 5);
  EXPECT_EQ(all_warm.measured_steps, 0);
  EXPECT_FALSE(all_warm.valid);
  EXPECT_NE(all_warm.valid_reason.find("no measured steps"), std::string::npos);

  rows[3].time_s = 0;
  const Summary bad = summarize(rows, 1);
  EXPECT_FALSE(bad.valid);
  EXPECT_FALSE(bad.valid_reason.empty());
}

TEST(TraceMath, Iso8601Utc) {
  EXPECT_EQ(iso8601_utc(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(iso8601_utc(1700000000), "2023-11-14T22:13:20Z");
}

TEST(TracePhases, NamesAreDistinctAndKnown) {
  std::set<std::string> names;
  for (int p = 0; p < int(Phase::kNumPhases); ++p) {
    const std::string n = phase_name(Phase(p));
    EXPECT_NE(n, "?") << "phase " << p << " has no name";
    names.insert(n);
  }
  EXPECT_EQ(names.size(), size_t(Phase::kNumPhases));
  EXPECT_STREQ(phase_name(Phase::attn_fwd), "attn_fwd");
  EXPECT_STREQ(phase_name(Phase::comm_wait), "comm_wait");
}

TEST(TraceSignals, HandlerOnlySetsTheFlag) {
  install_stop_signals();
  clear_stop_signal();
  EXPECT_FALSE(stop_signal_seen());
  std::raise(SIGUSR1);  // would terminate the process without the handler
  EXPECT_TRUE(stop_signal_seen());
  clear_stop_signal();
  EXPECT_FALSE(stop_signal_seen());
  std::raise(SIGTERM);
  EXPECT_TRUE(stop_signal_seen());
  clear_stop_signal();
}

TEST(TraceWriter, RoundTripPartialThenRenameWithoutClobbering) {
  const fs::path dir = scratch_dir("roundtrip");
  const fs::path final_path = dir / "nested" / "run.h5";  // parent directories do not exist yet
  ASSERT_FALSE(fs::exists(dir));

  H5TraceWriter w(final_path.string());
  EXPECT_EQ(w.partial_path(), final_path.string() + ".partial");
  ASSERT_TRUE(fs::exists(w.partial_path()));
  // An older complete trace at the final name must survive until the rename.
  ASSERT_FALSE(fs::exists(final_path));
  {
    std::ofstream old(final_path);
    old << "an older trace";
  }

  w.attr("/", "schema_version", kSchemaVersion);
  w.attr("/", "status", "running");
  w.attr("/", "steps_completed", int64_t(0));
  w.attr("/config", "seq", int64_t(4096));
  w.attr_bool("/config", "csv", true);
  w.dataset_i32("/topology/coords", {0, 0, 0, 0, 0, 1, 0, 0}, {2, 4});
  w.dataset_f64("/topology/clock_offset_us", {0.0, 12.5}, {2});
  w.dataset_strings("/topology/hosts", {"a", "b"});

  std::vector<SpanRecord> spans;
  for (int i = 0; i < 5; ++i) {
    SpanRecord s{};
    s.step = i / 3;
    s.layer = i;
    s.phase = int32_t(Phase::attn_fwd);
    s.ring_step = i % 2;
    s.rank = i % 2;
    s.t_begin_us = 10.0 * i;
    s.t_end_us = 10.0 * i + 3;
    s.flops = 1e9 + i;
    s.bytes = 64.0 * i;
    spans.push_back(s);
  }
  w.append_spans({spans.begin(), spans.begin() + 3});
  w.append_spans({});  // an empty step appends nothing
  w.append_spans({spans.begin() + 3, spans.end()});
  StepRow row;
  row.step = 0;
  row.time_s = 0.25;
  row.tokens = 4096;
  row.peak_rss_bytes = 123456789;
  row.device_peak_bytes = 987654321;
  row.turn = -1;
  w.append_steps({row});
  row.step = 1;
  w.append_steps({row});
  RankStepRow rr;
  rr.step = 1;
  rr.rank = 1;
  rr.peak_bytes = 77;
  w.append_rank_steps({rr});
  w.attr("/", "steps_completed", int64_t(2));  // replaces the attribute
  w.flush();

  // Flushed data is readable while the writer still holds the file.
  {
    const TraceDigest d = read_trace_digest(w.partial_path());
    EXPECT_EQ(d.status, "running");
    EXPECT_EQ(d.steps_completed, 2);
    EXPECT_EQ(d.spans.size(), 5u);
    EXPECT_EQ(d.steps.size(), 2u);
  }
  {
    std::ifstream old(final_path);
    std::string text;
    std::getline(old, text);
    EXPECT_EQ(text, "an older trace");
  }

  w.attr("/", "status", "complete");
  w.close_and_rename();
  EXPECT_FALSE(fs::exists(final_path.string() + ".partial"));
  ASSERT_TRUE(fs::exists(final_path));

  const TraceDigest d = read_trace_digest(final_path.string());
  EXPECT_EQ(d.schema_version, kSchemaVersion);
  EXPECT_EQ(d.status, "complete");
  EXPECT_EQ(d.steps_completed, 2);
  ASSERT_EQ(d.spans.size(), spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ(d.spans[i].step, spans[i].step);
    EXPECT_EQ(d.spans[i].layer, spans[i].layer);
    EXPECT_EQ(d.spans[i].phase, spans[i].phase);
    EXPECT_EQ(d.spans[i].ring_step, spans[i].ring_step);
    EXPECT_EQ(d.spans[i].rank, spans[i].rank);
    EXPECT_EQ(d.spans[i].t_begin_us, spans[i].t_begin_us);
    EXPECT_EQ(d.spans[i].t_end_us, spans[i].t_end_us);
    EXPECT_EQ(d.spans[i].flops, spans[i].flops);
    EXPECT_EQ(d.spans[i].bytes, spans[i].bytes);
  }
  ASSERT_EQ(d.steps.size(), 2u);
  EXPECT_EQ(d.steps[1].step, 1);
  EXPECT_EQ(d.steps[1].tokens, 4096);
  EXPECT_EQ(d.steps[1].peak_rss_bytes, 123456789);
  EXPECT_EQ(d.steps[1].device_peak_bytes, 987654321);
  EXPECT_EQ(d.steps[1].turn, -1);
  ASSERT_EQ(d.rank_steps.size(), 1u);
  EXPECT_EQ(d.rank_steps[0].peak_bytes, 77);
  EXPECT_EQ(d.coords, (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 0, 0}));
  EXPECT_EQ(d.clock_offset_us, (std::vector<double>{0.0, 12.5}));
  fs::remove_all(dir.parent_path());
}

TEST(TraceWriter, UnusablePathThrowsReadableError) {
  const fs::path dir = scratch_dir("badpath");
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "plainfile");
    f << "x";
  }
  try {
    H5TraceWriter w((dir / "plainfile" / "run.h5").string());  // parent is a file
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("plainfile"), std::string::npos) << e.what();
  }
  EXPECT_THROW(H5TraceWriter w(""), std::runtime_error);
  fs::remove_all(dir.parent_path());
}

TEST(TraceWriter, DatasetDimensionsMustMatchTheData) {
  const fs::path dir = scratch_dir("dims");
  H5TraceWriter w((dir / "d.h5").string());
  EXPECT_THROW(w.dataset_i32("/generated", {1, 2, 3}, {2, 2}), std::runtime_error);
  EXPECT_THROW(w.dataset_f64("/x", {1.0}, {}), std::runtime_error);
  EXPECT_NO_THROW(w.dataset_i32("/generated", {1, 2, 3, 4}, {2, 2}));
  EXPECT_NO_THROW(w.dataset_i32("/generated", {1, 2, 3, 4, 5, 6}, {3, 2}));  // replaced
  w.close_and_rename();
  fs::remove_all(dir.parent_path());
}
