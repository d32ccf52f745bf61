// The arithmetic of the trace, separated from MPI and HDF5 so unit tests can check it with
// synthetic numbers: rows of /steps and /rank_steps, clock-offset estimation, step aggregation
// over ranks and the /summary medians.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trace/trace.hpp"

namespace ctxpar::trace_detail {

// Schema of the trace file; bump on any incompatible change and teach analysis/ctxpar_trace.py.
constexpr int64_t kSchemaVersion = 1;

// One row of /steps as stored: the StepRecord fields (cross-rank values filled in on rank 0)
// plus the largest peak resident set over ranks.
struct StepRow {
  int64_t step = 0;
  double time_s = 0;
  int64_t tokens = 0;
  double model_flops = 0;
  double mfu = 0;
  double tflops_per_rank = 0;
  double exposed_comm_s = 0;
  int64_t peak_bytes = 0;
  int64_t peak_rss_bytes = 0;
  int64_t device_peak_bytes = 0;  // tracked GPU memory high-water mark (0 on the CPU)
  double loss = 0;
  int32_t turn = -1;
  int32_t pad_ = 0;
  double ttft_s = 0, ttit_s = 0;
};

// One row of /rank_steps: what each rank measured for each step (for imbalance analysis).
struct RankStepRow {
  int64_t step = 0;
  int32_t rank = 0;
  int32_t pad_ = 0;
  double time_s = 0;
  double exposed_comm_s = 0;
  int64_t peak_bytes = 0;
  int64_t peak_rss_bytes = 0;
  int64_t device_peak_bytes = 0;
};

// The per-rank values end_step gathers, as doubles (peak bytes < 2^53 are exact).
constexpr int kRankStatsDoubles = 5;  // time_s, exposed_comm_s, peak_bytes, peak_rss_bytes, device_peak_bytes

// Rank 0's row for one step: `root` carries the values every rank agrees on (step, tokens,
// model_flops, loss, turn, ttft, ttit — taken from rank 0); time, exposed communication and
// memory are the maxima over `ranks`. With P = ranks.size():
//   tflops_per_rank = model_flops / time_s / P / 1e12
//   mfu             = model_flops / (time_s * peak_flops_per_rank * P)   (0 when peak <= 0)
StepRow make_step_row(const StepRecord& root, const std::vector<RankStepRow>& ranks,
                      double peak_flops_per_rank);
// "" when every number of `row` is finite, else the first that is not: "tflops_per_rank is inf".
std::string non_finite_field(const StepRow& row);

// One ping-pong of the clock synchronization, in seconds: rank 0 read t0_s before it sent,
// rank r read tr_s on its own clock after it received rank 0's message and before it answered,
// rank 0 read t1_s after the answer arrived. So tr happened in [t0, t1] on rank 0's clock.
struct ClockSample {
  double t0_s, tr_s, t1_s;
};
struct ClockOffset {
  double offset_s = 0;  // rank r's clock minus rank 0's clock
  double error_s = 0;   // bound on |estimate - truth| (half the round trip of the best sample)
};
// Takes the sample with the shortest round trip (the tightest bound): offset = tr - (t0+t1)/2.
ClockOffset estimate_clock_offset(const std::vector<ClockSample>& samples);

// Shift that puts rank r's span times on rank 0's timeline. A span time is local µs since this
// rank's tracer start (t0_local_s on its own clock). On rank 0's clock that instant is
// t0_local_s - offset_s, so µs since rank 0's start (t0_root_s) = local_us + shift_us with
//   shift_us = (t0_local_s - offset_s - t0_root_s) * 1e6.
double timeline_shift_us(double t0_local_s, double offset_s, double t0_root_s);

// numpy-compatible median (mean of the two middle values for even n); NaN for empty input.
double median(std::vector<double> v);

struct Summary {
  int64_t steps_total = 0;
  int64_t warmup_excluded = 0;
  int64_t measured_steps = 0;
  bool valid = false;
  std::string valid_reason;  // why not valid ("" when valid)
  double time_s_median = 0, tokens_median = 0, model_flops_median = 0, mfu_median = 0,
         tflops_per_rank_median = 0, exposed_comm_s_median = 0, ttft_s_median = 0,
         ttit_s_median = 0, tokens_per_s_median = 0;
  double loss_last = 0;
  int64_t peak_bytes_max = 0, peak_rss_bytes_max = 0, device_peak_bytes_max = 0;
};
// Medians over the rows after the first `warmup` (rows in the order written). Valid when at
// least one measured step exists and every measured time is positive and finite.
Summary summarize(const std::vector<StepRow>& rows, int64_t warmup);

// "2024-05-01T12:34:56Z" for a time_t (UTC).
std::string iso8601_utc(int64_t unix_seconds);

}  // namespace ctxpar::trace_detail
