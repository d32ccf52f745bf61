#include "model/flops.hpp"
#include "trace/trace.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <limits>
#include <mutex>
#include <span>
#include <type_traits>

#include "core/stats.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/memory.hpp"
#include "core/signals.hpp"
#include "core/version.hpp"
#include "core/watchdog.hpp"
#include "dist/comm.hpp"
#include "dist/fault_channel.hpp"
#include "dist/topology.hpp"
#include "kernels/ops.hpp"
#include "io/h5_trace.hpp"
#include "io/io_lock.hpp"
#include "trace/trace_detail.hpp"

// Provenance: the lead's generated header gains CTXPAR_GIT_DIRTY (0/1); -1 records "unknown"
// for builds configured before it existed.
#ifndef CTXPAR_GIT_DIRTY
#define CTXPAR_GIT_DIRTY -1
#endif

namespace ctxpar {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::other: return "other";
    case Phase::attn_fwd: return "attn_fwd";
    case Phase::attn_bwd: return "attn_bwd";
    case Phase::comm_send_recv: return "comm_send_recv";
    case Phase::comm_wait: return "comm_wait";
    case Phase::all_to_all: return "all_to_all";
    case Phase::all_gather: return "all_gather";
    case Phase::reduce_scatter: return "reduce_scatter";
    case Phase::all_reduce: return "all_reduce";
    case Phase::gemm: return "gemm";
    case Phase::norm: return "norm";
    case Phase::rope: return "rope";
    case Phase::mlp: return "mlp";
    case Phase::loss: return "loss";
    case Phase::optimizer: return "optimizer";
    case Phase::embed: return "embed";
    case Phase::bench: return "bench";
    case Phase::shard: return "shard";
    case Phase::offload: return "offload";
    case Phase::state_gather: return "state_gather";
    case Phase::state_reduce: return "state_reduce";
    case Phase::kNumPhases: break;
  }
  return "?";
}

// ---- pure arithmetic (trace_detail.hpp) -----------------------------------------------------

namespace trace_detail {

StepRow make_step_row(const StepRecord& root, const std::vector<RankStepRow>& ranks,
                      double peak_flops_per_rank) {
  StepRow row;
  row.step = root.step;
  row.tokens = root.tokens;
  row.model_flops = root.model_flops;
  row.loss = root.loss;
  row.turn = root.turn;
  row.ttft_s = root.ttft_s;
  row.ttit_s = root.ttit_s;
  for (const RankStepRow& r : ranks) {
    row.time_s = std::max(row.time_s, r.time_s);
    row.exposed_comm_s = std::max(row.exposed_comm_s, r.exposed_comm_s);
    row.peak_bytes = std::max(row.peak_bytes, r.peak_bytes);
    row.peak_rss_bytes = std::max(row.peak_rss_bytes, r.peak_rss_bytes);
    row.device_peak_bytes = std::max(row.device_peak_bytes, r.device_peak_bytes);
  }
  const double P = double(ranks.size());
  if (row.time_s > 0 && P > 0) {
    row.tflops_per_rank = row.model_flops / row.time_s / P / 1e12;
    if (peak_flops_per_rank > 0) row.mfu = row.model_flops / (row.time_s * peak_flops_per_rank * P);
  }
  return row;
}

std::string non_finite_field(const StepRow& row) {
  for (const auto& [name, x] : {std::pair{"time_s", row.time_s}, {"model_flops", row.model_flops}, {"mfu", row.mfu},
                                {"tflops_per_rank", row.tflops_per_rank}, {"exposed_comm_s", row.exposed_comm_s},
                                {"loss", row.loss}, {"ttft_s", row.ttft_s}, {"ttit_s", row.ttit_s}})
    if (!std::isfinite(x)) return std::string(name) + " is " + number_text(x);
  return "";
}

ClockOffset estimate_clock_offset(const std::vector<ClockSample>& samples) {
  ClockOffset best;
  double best_rtt = INFINITY;
  for (const ClockSample& s : samples) {
    const double rtt = s.t1_s - s.t0_s;
    if (rtt < best_rtt) {
      best_rtt = rtt;
      best.offset_s = s.tr_s - 0.5 * (s.t0_s + s.t1_s);
      best.error_s = 0.5 * rtt;
    }
  }
  return best;
}

double timeline_shift_us(double t0_local_s, double offset_s, double t0_root_s) {
  return (t0_local_s - offset_s - t0_root_s) * 1e6;
}

double median(std::vector<double> v) { return ctxpar::median(std::move(v)); }

Summary summarize(const std::vector<StepRow>& rows, int64_t warmup) {
  Summary s;
  s.steps_total = int64_t(rows.size());
  s.warmup_excluded = std::min<int64_t>(std::max<int64_t>(warmup, 0), s.steps_total);
  s.measured_steps = s.steps_total - s.warmup_excluded;
  std::vector<double> time, tokens, flops, mfu, tflops, comm, ttft, ttit, tps;
  bool times_ok = true;
  for (size_t i = size_t(s.warmup_excluded); i < rows.size(); ++i) {
    const StepRow& r = rows[i];
    time.push_back(r.time_s);
    tokens.push_back(double(r.tokens));
    flops.push_back(r.model_flops);
    mfu.push_back(r.mfu);
    tflops.push_back(r.tflops_per_rank);
    comm.push_back(r.exposed_comm_s);
    ttft.push_back(r.ttft_s);
    ttit.push_back(r.ttit_s);
    tps.push_back(r.time_s > 0 ? double(r.tokens) / r.time_s : 0.0);
    if (!(r.time_s > 0) || !std::isfinite(r.time_s)) times_ok = false;
  }
  for (const StepRow& r : rows) {
    s.peak_bytes_max = std::max(s.peak_bytes_max, r.peak_bytes);
    s.peak_rss_bytes_max = std::max(s.peak_rss_bytes_max, r.peak_rss_bytes);
    s.device_peak_bytes_max = std::max(s.device_peak_bytes_max, r.device_peak_bytes);
  }
  if (!rows.empty()) s.loss_last = rows.back().loss;
  if (s.measured_steps == 0) {
    s.valid_reason = "no measured steps (" + std::to_string(s.steps_total) + " steps, " +
                     std::to_string(s.warmup_excluded) + " warmup)";
    return s;
  }
  s.time_s_median = median(time);
  s.tokens_median = median(tokens);
  s.model_flops_median = median(flops);
  s.mfu_median = median(mfu);
  s.tflops_per_rank_median = median(tflops);
  s.exposed_comm_s_median = median(comm);
  s.ttft_s_median = median(ttft);
  s.ttit_s_median = median(ttit);
  s.tokens_per_s_median = median(tps);
  s.valid = times_ok;
  if (!times_ok) s.valid_reason = "a measured step has a non-positive or non-finite time";
  return s;
}

std::string iso8601_utc(int64_t unix_seconds) {
  std::time_t t = std::time_t(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace trace_detail

// ---- Tracer ---------------------------------------------------------------------------------

using trace_detail::ClockOffset;
using trace_detail::ClockSample;
using trace_detail::RankStepRow;
using trace_detail::StepRow;

namespace {

// Tags of the clock synchronization on the world comm (it runs while nothing else is in flight;
// distinct tags keep its two message streams apart).
constexpr int kClockTagPing = 7301;
constexpr int kClockTagPong = 7302;
// Ping-pongs per rank; the one with the shortest round trip gives the offset.
constexpr int kClockRounds = 16;

// Collective. Returns (offset_s, error_s) of every rank, on every rank. Protocol per round with
// rank r: rank 0 reads t0, exchanges a ping with r (so r's wait ends after t0), r reads tr and
// sends it back, rank 0 reads t1 after it arrived: tr happened within [t0, t1] on rank 0's clock.
std::vector<double> measure_clock_offsets(Comm& world) {
  const int P = world.size(), me = world.rank();
  std::vector<double> result(size_t(2 * P), 0.0);  // [offset_s, error_s] per rank
  double ping = 0, got = 0;
  if (me == 0) {
    for (int r = 1; r < P; ++r) {
      std::vector<ClockSample> samples;
      for (int k = 0; k < kClockRounds; ++k) {
        const double t0 = world.now();
        Request a = world.send_recv_async(std::span<double>(&ping, 1), r, std::span<double>(&got, 1), r,
                                          kClockTagPing);
        world.wait(a);
        double tr = 0;
        Request b = world.send_recv_async(std::span<double>(&ping, 1), r, std::span<double>(&tr, 1), r,
                                          kClockTagPong);
        world.wait(b);
        samples.push_back({t0, tr, world.now()});
      }
      const ClockOffset off = trace_detail::estimate_clock_offset(samples);
      result[size_t(2 * r)] = off.offset_s;
      result[size_t(2 * r + 1)] = off.error_s;
    }
  } else {
    for (int k = 0; k < kClockRounds; ++k) {
      Request a = world.send_recv_async(std::span<double>(&ping, 1), 0, std::span<double>(&got, 1), 0,
                                        kClockTagPing);
      world.wait(a);
      double tr = world.now();
      Request b = world.send_recv_async(std::span<double>(&tr, 1), 0, std::span<double>(&got, 1), 0,
                                        kClockTagPong);
      world.wait(b);
    }
  }
  world.broadcast(std::span<double>(result), 0);
  return result;
}

template <class... F> struct Overloaded : F... { using F::operator()...; };
template <class... F> Overloaded(F...) -> Overloaded<F...>;

}  // namespace

struct Tracer::Impl {
  Impl(Comm& w, const Config& c, double peak) : world(w), cfg(c), peak_flops_per_rank(peak) {}
  // Also runs when the Tracer constructor throws (bad output path): the thread must not outlive us.
  ~Impl() {
    stop_watchdog();  // first: the monitor thread may be calling the fault hook
    set_fault_hook(nullptr);
    if (writer) {
      const IoLock lock = io_lock();
      writer.reset();
    }
  }

  Comm& world;
  Config cfg;
  double peak_flops_per_rank;
  std::string mode_label;
  std::string path;
  int rank = 0, size = 1;
  double t0_local_s = 0;   // world.now() when the tracer was made
  double shift_us = 0;     // local now_us() + shift_us = µs since rank 0's start, rank 0's clock
  double offset_us = 0, offset_err_us = 0;
  double step_begin_us = 0;
  // time_on_device: the device and stream of the marks, begin_step's mark and its host time, and
  // the marks of the open step (stamp() returns -(index + 1)).
  Device mark_device = Device::cpu;
  Stream mark_stream = nullptr;
  Event step_mark = nullptr;
  double step_mark_us = 0;
  std::vector<Event> marks;
  void drop_marks() {
    for (Event e : marks) event_destroy(e, mark_device);
    marks.clear();
    if (step_mark) event_destroy(step_mark, mark_device);
    step_mark = nullptr;
  }
  int64_t steps_completed = 0;
  bool finished = false;
  // Agreed at end_step: the signal that stops the run, the lowest rank that saw it, the step after
  // which every rank stops.
  int stop_signal = 0, stop_rank = -1;
  std::string stop_who;  // every stop signal and the ranks that saw it: "SIGUSR1 on rank 0 and rank 2; SIGTERM on rank 1"
  int64_t stop_step = -1;
  std::mutex span_mu;  // add_span may be called from several threads

  // Rank 0 only.
  std::unique_ptr<H5TraceWriter> writer;
  std::vector<StepRow> rows;
  std::atomic<bool> marked_failed{false};
  int64_t file_bytes = 0, step_growth = 0;  // the trace's size after the last flush, and what that step added

  // Rank 0: "" when the trace's file system has room for the next step's write, else why not. A
  // flush cut short by a full disk can leave the whole HDF5 file unreadable: the run stops as
  // failed while the file is still whole. The margin: 1 MiB, or four steps' growth if more.
  std::string disk_short(int64_t step) const {
    const int64_t free = writer ? writer->free_bytes() : -1;
    const int64_t need = std::max<int64_t>(int64_t(1) << 20, 4 * step_growth);
    if (free < 0 || free >= need) return "";
    return "the trace's file system is full: " + fmt_bytes(double(free)) + " left for " + writer->partial_path() +
           ", below the " + fmt_bytes(double(need)) + " kept for the next writes; stopped before writing step " +
           std::to_string(step) + " (every completed step is in the trace); valid: an out= on a file system with room";
  }

  Watchdog watchdog;  // core/watchdog.hpp: stall check, and rank 0's poll of fault notices
  std::unique_ptr<FaultChannel> faults;  // dist/fault_channel.hpp (null for non-MPI test doubles)

  void touch(int64_t step, Phase ph, int32_t layer) { watchdog.heartbeat(step, layer, int32_t(ph)); }

  // The monitor thread of every rank: the stall check (when watchdog_s > 0), and on rank 0 the
  // notices of ranks about to end the job.
  void start_watchdog(double limit_s) {
    watchdog.start(
        limit_s, [](int32_t ph) { return phase_name(Phase(ph)); },
        [this](const std::string& line) {
          // Rank 0 blocked in a collective usually waits on the rank that stalled first: give that
          // rank's own report two checks to arrive, it names the real place.
          if (rank == 0)
            for (int i = 0; i < 20 && !marked_failed; ++i) {
              poll_faults();
              std::this_thread::sleep_for(std::chrono::duration<double>(watchdog.tick_s() / 10));
            }
          fail_run(line);
        },
        rank == 0 ? std::function<void()>([this] {
          poll_faults();
          mark_stop_in_stuck_step();
        })
                  : nullptr);
  }

  // Rank 0, at each watchdog tick: a stop signal met a step that makes no progress (a peer lost
  // with its host, a link down; the launcher's SIGKILL may follow within a second, as mpirun's
  // kill sequence does). The trace is marked "truncated" at once, naming the step and phase, so
  // its status is true even if the process is then killed; a step that still finishes ends the
  // run as usual and its end rewrites the reason ("after step N").
  std::atomic<bool> stop_marked_in_step{false};
  void mark_stop_in_stuck_step() {
    static constexpr double kStuck_s = 0.4;
    const int sig = stop_signal_number();
    if (sig == 0 || stop_marked_in_step || marked_failed) return;
    int64_t step = 0;
    int32_t layer = -1, ph = 0;
    const double idle = watchdog.idle_s(step, layer, ph);
    if (idle < kStuck_s) return;
    char reason[256];
    std::snprintf(reason, sizeof reason,
                  "%s on rank 0 during step %lld (layer %d, phase %s; no progress for %.1f s): the steps before it "
                  "are complete",
                  signal_name(sig), static_cast<long long>(step), int(layer), phase_name(Phase(ph)), idle);
    // A write in progress holds the lock: the next tick tries again.
    mark_status("truncated", "stop_reason", reason, std::chrono::milliseconds(200),
                [this] { return !marked_failed && !stop_marked_in_step.exchange(true); });
  }

  void stop_watchdog() { watchdog.stop(); }

  // Rank 0: a rank that is ending the job told us why; record it, then let it abort.
  void poll_faults() {
    int from = -1;
    std::string reason;
    if (!faults || !faults->poll(from, reason)) return;
    mark_failed(reason);
    run_abort_cleanups();  // the abort that follows gives this rank no time of its own
    faults->acknowledge(from);
  }

  // The fault hook (core/error.hpp), on the rank that fails, before the job is aborted.
  void on_fault(const std::string& msg) {
    const Identity& id = identity();
    const std::string reason = "rank " + std::to_string(id.rank) + " (" + id.host + "): " + msg;
    if (rank == 0) mark_failed(reason);
    else if (faults) faults->notify(reason, 10.0);
  }

  // Rank 0, any thread: status "failed" and the reason, flushed; the first reason wins. Bounded:
  // when HDF5 stays busy (the main thread stuck in a write), the trace keeps status "running".
  void mark_failed(const std::string& reason) {
    mark_status("failed", "failure", reason, std::chrono::seconds(5), [this] { return !marked_failed.exchange(true); });
  }

  // Rank 0, any thread: `status`, `key` = reason and the end time, flushed, when `claim` (run under
  // the I/O lock, where the main thread closes the writer too) says this mark is the one to write.
  // Gives up after `wait` when HDF5 stays busy; an I/O error leaves the status what it was.
  template <class Claim>
  void mark_status(const char* status, const char* key, const std::string& reason, std::chrono::milliseconds wait,
                   Claim&& claim) {
    IoLock lock(io_mutex(), std::defer_lock);
    if (!lock.try_lock_for(wait)) return;
    if (!writer || !claim()) return;
    try {
      writer->attr("/", "status", status);
      writer->attr("/", key, reason);
      writer->attr("/", "end_time_utc", trace_detail::iso8601_utc(int64_t(std::time(nullptr))));
      writer->flush();
    } catch (const std::exception&) {
      // A full disk or a broken file: the status stays what it was; the message went to stderr.
    }
  }


  // Rank 0: runs an HDF5 step; returns "" or what failed.
  template <class F> std::string try_writer(F&& f) {
    if (!writer) return "";
    const IoLock lock = io_lock();
    try {
      f(*writer);
    } catch (const std::exception& e) {
      return std::string("trace writer: ") + e.what();
    }
    return "";
  }
  // Rank 0: runs an HDF5 step; an I/O failure after the file was opened ends the job (the
  // other ranks are already past the collective and could not be told otherwise).
  template <class F> void on_writer(F&& f) {
    if (const std::string err = try_writer(f); !err.empty()) fail_run(err);
  }

  // Collective: gathers the spans of all ranks to rank 0 (rank order), as bytes.
  std::vector<SpanRecord> gather_spans(const std::vector<SpanRecord>& mine) {
    std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(mine.data()),
                                     mine.size() * sizeof(SpanRecord));
    std::vector<std::byte> all;
    world.gather_v(bytes, all, 0);
    std::vector<SpanRecord> spans;
    if (rank == 0) {
      CTXPAR_CHECK(all.size() % sizeof(SpanRecord) == 0, "span gather returned " << all.size() << " bytes");
      spans.resize(all.size() / sizeof(SpanRecord));
      if (!spans.empty()) std::memcpy(static_cast<void*>(spans.data()), all.data(), all.size());
    }
    return spans;
  }

  void write_header(const Topology& topo) {
    H5TraceWriter& w = *writer;
    const std::string R = "/";
    w.attr(R, "ctxpar_file", "trace");
    w.attr(R, "schema_version", trace_detail::kSchemaVersion);
    w.attr(R, "ctxpar_version", CTXPAR_VERSION);
    w.attr(R, "git_sha", CTXPAR_GIT_SHA);
    w.attr(R, "git_dirty", int64_t(CTXPAR_GIT_DIRTY));
    w.attr(R, "build_type", CTXPAR_BUILD_TYPE);
    w.attr(R, "cxx_compiler", CTXPAR_CXX_COMPILER);
    w.attr(R, "cxx_flags", CTXPAR_CXX_FLAGS);
    w.attr(R, "mpi_version", comm_library_version());
    w.attr(R, "hdf5_version", hdf5_library_version());
    w.attr(R, "blas", blas_name());
    // the CPU kernels' instruction set, and whether CTXPAR_ISA forced it
    w.attr(R, "kernel_isa", std::string(kernel_isa_name(kernel_isa())) + (kernel_isa_forced() ? " (CTXPAR_ISA)" : ""));
    std::vector<std::string> unique_hosts;
    for (const std::string& h : topo.hosts())
      if (std::find(unique_hosts.begin(), unique_hosts.end(), h) == unique_hosts.end())
        unique_hosts.push_back(h);
    w.attr_strings(R, "hostnames", unique_hosts);
    w.attr(R, "world_size", int64_t(size));
    w.attr(R, "start_time_utc", trace_detail::iso8601_utc(int64_t(std::time(nullptr))));
    w.attr(R, "mode", mode_label);
    w.attr(R, "bench", name_of(cfg.bench));
    w.attr(R, "strategy", cfg.strategy);
    w.attr(R, "mesh", cfg.mesh);
    w.attr(R, "flop_convention", kFlopConvention);
    w.attr(R, "peak_flops_per_rank", peak_flops_per_rank);
    w.attr(R, "mfu_note", peak_flops_per_rank > 0
                              ? std::string("mfu = model_flops / (time_s * peak_flops_per_rank * world_size)")
                              : std::string("peak_flops_per_rank not given (0): mfu is 0 in every row"));
    w.attr(R, "time_origin",
           "span t_begin_us/t_end_us: microseconds since rank 0's tracer start, on rank 0's clock "
           "(each rank's times shifted by /topology/clock_offset_us)");
    w.attr(R, "status", "running");
    w.attr(R, "steps_completed", int64_t(0));

    // /config: every field of the table, typed.
    const std::string C = "/config";
    for (const Field& f : config_fields()) {
      const std::string name(f.name);
      std::visit(Overloaded{[&](int64_t Config::*m) { w.attr(C, name, cfg.*m); },
                            [&](double Config::*m) { w.attr(C, name, cfg.*m); },
                            [&](std::string Config::*m) { w.attr(C, name, cfg.*m); },
                            [&](bool Config::*m) { w.attr_bool(C, name, cfg.*m); },
                            [&](EnumMember) { w.attr(C, name, field_text(cfg, f)); }},
                 f.member);
    }

    // /topology
    std::vector<int32_t> coords, node_id;
    for (const auto& c : topo.all_coords())
      for (int a = 0; a < kNumAxes; ++a) coords.push_back(int32_t(c[size_t(a)]));
    for (int n : topo.node_of_rank()) node_id.push_back(int32_t(n));
    std::vector<std::string> axis_names;
    std::vector<int32_t> axis_sizes;
    for (int a = 0; a < kNumAxes; ++a) {
      axis_names.emplace_back(axis_name(Axis(a)));
      axis_sizes.push_back(int32_t(topo.size(Axis(a))));
    }
    w.dataset_i32("/topology/coords", coords, {uint64_t(size), uint64_t(kNumAxes)});
    w.dataset_i32("/topology/node_id", node_id, {uint64_t(node_id.size())});
    w.dataset_strings("/topology/axis_names", axis_names);
    w.dataset_i32("/topology/axis_sizes", axis_sizes, {uint64_t(kNumAxes)});
    w.dataset_strings("/topology/hosts", topo.hosts());

    std::vector<std::string> phases;
    for (int p = 0; p < int(Phase::kNumPhases); ++p) phases.emplace_back(phase_name(Phase(p)));
    w.attr_strings("/spans", "phase_names", phases);
  }

  void write_offsets(const std::vector<double>& offs, const std::string& name) {
    std::vector<double> off_us, err_us;
    for (int r = 0; r < size; ++r) {
      off_us.push_back(offs[size_t(2 * r)] * 1e6);
      err_us.push_back(offs[size_t(2 * r + 1)] * 1e6);
    }
    writer->dataset_f64("/topology/" + name, off_us, {uint64_t(size)});
    writer->dataset_f64("/topology/" + name.substr(0, name.size() - 3) + "_error_us", err_us,
                        {uint64_t(size)});
  }
};

Tracer::Tracer(Comm& world, const Config& cfg, const Topology& topo, const std::string& path,
               double peak_flops_per_rank, const std::string& mode_label)
    : impl_(std::make_unique<Impl>(world, cfg, peak_flops_per_rank)) {
  Impl& I = *impl_;
  I.mode_label = mode_label.empty() ? std::string(name_of(cfg.mode)) : mode_label;
  I.path = path;
  I.rank = world.rank();
  I.size = world.size();
  I.touch(0, Phase::other, -1);
  install_stop_signals();
  I.faults = make_fault_channel(world);  // collective
  // Started first, so that a rank that never reaches the collectives below cannot hang the job.
  I.start_watchdog(cfg.watchdog_s);

  // Open the file on rank 0; a bad output path is the user's error, reported alike on all ranks.
  std::string err;
  if (I.rank == 0) {
    const IoLock lock = io_lock();
    try {
      I.writer = std::make_unique<H5TraceWriter>(path);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  err = agree_on_error(world, err);
  if (!err.empty()) throw UsageError("out=" + path + ": " + err);
  // From here on a fault on any rank marks this trace failed before the job ends.
  set_fault_hook([impl = impl_.get()](const std::string& msg) { impl->on_fault(msg); });

  // Clock offsets against rank 0, then every rank's shift onto rank 0's timeline.
  I.t0_local_s = world.now();
  const std::vector<double> offs = measure_clock_offsets(world);
  double t0_root = I.t0_local_s;
  world.broadcast(std::span<double>(&t0_root, 1), 0);
  const double off_s = offs[size_t(2 * I.rank)];
  I.offset_us = off_s * 1e6;
  I.offset_err_us = offs[size_t(2 * I.rank + 1)] * 1e6;
  I.shift_us = trace_detail::timeline_shift_us(I.t0_local_s, off_s, t0_root);

  if (I.rank == 0)
    I.on_writer([&](H5TraceWriter& w) {
      I.write_header(topo);
      I.write_offsets(offs, "clock_offset_us");
      w.flush();
    });
  I.touch(0, Phase::other, -1);
}

Tracer::~Tracer() {
  // Not collective: an unfinished run (exception, early return) leaves NAME.h5.partial with
  // status "running" and every flushed step (Impl's destructor closes it).
  impl_->stop_watchdog();
  set_fault_hook(nullptr);
}

double Tracer::now_us() const { return (impl_->world.now() - impl_->t0_local_s) * 1e6; }
double Tracer::clock_offset_us() const { return impl_->offset_us; }
double Tracer::clock_offset_error_us() const { return impl_->offset_err_us; }
const std::string& Tracer::path() const { return impl_->path; }

void Tracer::time_on_device(Device device, Stream stream) {
  {  // spans of an open step keep their device times
    std::lock_guard<std::mutex> lk(impl_->span_mu);
    resolve_marks(spans_);
  }
  impl_->drop_marks();
  impl_->mark_device = device;
  impl_->mark_stream = stream;
}

double Tracer::stamp() {
  Impl& I = *impl_;
  if (I.mark_device == Device::cpu || !I.step_mark) return now_us();
  std::lock_guard<std::mutex> lk(I.span_mu);
  I.marks.push_back(event_record(I.mark_stream, I.mark_device));
  return -double(I.marks.size());
}

void Tracer::resolve_marks(std::vector<SpanRecord>& spans) {
  Impl& I = *impl_;
  if (!I.step_mark) return;
  // The time the GPU reached each mark, on this rank's host clock (begin_step's mark = its host time).
  std::vector<double> at(I.marks.size(), -1.0);
  for (SpanRecord& s : spans)
    for (double* t : {&s.t_begin_us, &s.t_end_us}) {
      if (*t >= 0 || size_t(-*t) > at.size()) continue;
      double& a = at[size_t(-*t) - 1];
      if (a < 0) a = I.step_mark_us + event_seconds(I.step_mark, I.marks[size_t(-*t) - 1], I.mark_device) * 1e6 + I.shift_us;
      *t = a;
    }
}

double attention_seconds(const PhaseSeconds& ph) {
  double x = 0;
  for (Phase p : {Phase::attn_fwd, Phase::attn_bwd, Phase::comm_send_recv, Phase::comm_wait, Phase::all_to_all,
                  Phase::all_gather, Phase::reduce_scatter})
    x += ph[size_t(p)];
  return x;
}

PhaseSeconds Tracer::phase_seconds() {
  PhaseSeconds s{};
  std::lock_guard<std::mutex> lk(impl_->span_mu);
  resolve_marks(spans_);
  for (const SpanRecord& r : spans_)
    if (r.phase >= 0 && r.phase < int32_t(Phase::kNumPhases)) s[size_t(r.phase)] += (r.t_end_us - r.t_begin_us) * 1e-6;
  return s;
}

void Tracer::begin_step(int64_t step) {
  step_ = step;
  impl_->step_begin_us = now_us();
  if (impl_->mark_device != Device::cpu) {
    impl_->drop_marks();
    impl_->step_mark = event_record(impl_->mark_stream, impl_->mark_device);
    impl_->step_mark_us = impl_->step_begin_us;
  }
  impl_->touch(step, Phase::other, -1);
}

void Tracer::progress(Phase ph, int32_t layer) { impl_->touch(step_, ph, layer_or_ctx(layer)); }

void Tracer::add_span(Phase ph, int32_t layer, int32_t ring_step, double t_begin_us, double t_end_us,
                      double flops, double bytes) {
  Impl& I = *impl_;
  layer = layer_or_ctx(layer);
  SpanRecord s{};
  s.step = int32_t(step_);
  s.layer = layer;
  s.phase = int32_t(ph);
  s.ring_step = ring_step;
  s.rank = I.rank;
  s.pad_ = 0;
  // A device mark (stamp(), negative) is kept as it is until end_step resolves it.
  s.t_begin_us = t_begin_us < 0 ? t_begin_us : t_begin_us + I.shift_us;
  s.t_end_us = t_end_us < 0 ? t_end_us : t_end_us + I.shift_us;
  s.flops = flops;
  s.bytes = bytes;
  {
    std::lock_guard<std::mutex> lk(I.span_mu);
    spans_.push_back(s);
  }
  I.touch(step_, ph, layer);
}

bool Tracer::end_step(const StepRecord& local) {
  Impl& I = *impl_;
  CTXPAR_CHECK(!I.finished, "Tracer::end_step after finish");
  const double t_end_us = now_us();
  I.touch(step_, Phase::other, -1);
  // Defaults measured here when the caller leaves them 0: the step's wall time since
  // begin_step and the tracked peak of core/memory.
  const double time_s = local.time_s > 0 ? local.time_s : (t_end_us - I.step_begin_us) * 1e-6;
  const int64_t peak = local.peak_bytes > 0 ? local.peak_bytes : mem_peak_bytes();

  // All ranks agree whether any rank saw a stop signal, so they stop after the same step: the
  // largest signal number seen, and the lowest rank that saw it (one all-reduce of max over
  // signo * 2^20 + (2^20 - 1 - rank)).
  constexpr int32_t kRankBits = 1 << 20;
  constexpr int32_t kDiskFull = std::numeric_limits<int32_t>::max();  // above any signal's value
  const int my_sig = stop_signal_number();
  int32_t stop = my_sig ? my_sig * kRankBits + (kRankBits - 1 - I.rank) : 0;
  const std::string disk = I.rank == 0 ? I.disk_short(step_) : "";
  if (!disk.empty()) stop = kDiskFull;
  I.world.all_reduce(std::span<int32_t>(&stop, 1), ReduceOp::max);
  if (stop == kDiskFull) {  // every rank ends here, alike; main exits 3 on each
    if (I.rank == 0) {
      I.mark_failed(disk);
      const IoLock lock = io_lock();
      I.writer.reset();
    }
    I.finished = true;
    I.stop_watchdog();
    throw RunFailed(disk);
  }
  if (stop != 0 && I.stop_signal == 0) {
    I.stop_signal = stop / kRankBits;
    I.stop_rank = kRankBits - 1 - stop % kRankBits;
    // Every signal every rank saw, not only the one that gives the exit code.
    const int32_t mine = int32_t(stop_signal_mask());
    std::vector<int32_t> masks(size_t(I.world.size()));
    I.world.all_gather(std::span<const int32_t>(&mine, 1), std::span<int32_t>(masks));
    for (int sig = 1; sig < 32; ++sig) {
      std::string ranks;
      for (int r = 0; r < int(masks.size()); ++r)
        if (uint32_t(masks[size_t(r)]) >> sig & 1u) ranks += (ranks.empty() ? "rank " : " and rank ") + std::to_string(r);
      if (!ranks.empty()) I.stop_who += (I.stop_who.empty() ? "" : "; ") + std::string(signal_name(sig)) + " on " + ranks;
    }
    if (I.stop_who.empty()) I.stop_who = std::string(signal_name(I.stop_signal)) + " on rank " + std::to_string(I.stop_rank);
  }
  if (stop != 0) I.stop_step = step_;  // the last step ends the run (bench infer finishes its row)

  const double stats[trace_detail::kRankStatsDoubles] = {time_s, local.exposed_comm_s, double(peak),
                                                         double(mem_rss_peak_bytes()),
                                                         double(device_mem_peak_bytes())};
  std::vector<double> all_stats;
  I.world.gather_v(std::span<const double>(stats, trace_detail::kRankStatsDoubles), all_stats, 0);

  std::vector<SpanRecord> mine;
  {
    std::lock_guard<std::mutex> lk(I.span_mu);
    mine.swap(spans_);
  }
  if (I.step_mark) {
    resolve_marks(mine);
    I.drop_marks();
  }
  std::vector<SpanRecord> all_spans = I.gather_spans(mine);

  ++I.steps_completed;
  if (I.rank == 0) {
    std::vector<RankStepRow> per_rank(size_t(I.size));
    for (int r = 0; r < I.size; ++r) {
      const double* st = &all_stats[size_t(r) * trace_detail::kRankStatsDoubles];
      RankStepRow& rr = per_rank[size_t(r)];
      rr.step = step_;
      rr.rank = r;
      rr.time_s = st[0];
      rr.exposed_comm_s = st[1];
      rr.peak_bytes = int64_t(st[2]);
      rr.peak_rss_bytes = int64_t(st[3]);
      rr.device_peak_bytes = int64_t(st[4]);
    }
    StepRecord root = local;
    root.step = step_;
    const StepRow row = trace_detail::make_step_row(root, per_rank, I.peak_flops_per_rank);
    // Every number of the step's row is finite (the modes stop on a non-finite loss first): a
    // NaN or Inf here is a fault of what measured it, named, and never written.
    std::string bad = trace_detail::non_finite_field(row);
    for (const RankStepRow& rr : per_rank)  // and each rank's own row (/rank_steps)
      if (bad.empty() && !(std::isfinite(rr.time_s) && std::isfinite(rr.exposed_comm_s)))
        bad = "rank " + std::to_string(rr.rank) + "'s time_s or exposed_comm_s is " +
              number_text(std::isfinite(rr.time_s) ? rr.exposed_comm_s : rr.time_s);
    if (!bad.empty())
      fail_run("trace: step " + std::to_string(step_) + ": " + bad + "; not written (the steps before it are)");
    I.rows.push_back(row);
    I.on_writer([&](H5TraceWriter& w) {
      w.append_spans(all_spans);
      w.append_rank_steps(per_rank);
      w.append_steps({row});
      w.attr("/", "steps_completed", I.steps_completed);
      w.flush();
      const int64_t bytes = w.file_bytes();
      I.step_growth = std::max<int64_t>(0, bytes - I.file_bytes);
      I.file_bytes = bytes;
    });
  }
  I.touch(step_, Phase::other, -1);
  return stop != 0;
}

void Tracer::finish(bool truncated) {
  Impl& I = *impl_;
  if (I.finished) return;
  truncated = truncated || I.stop_signal != 0;
  I.touch(step_, Phase::other, -1);
  // Spans recorded after the last end_step (setup, teardown) are kept too.
  std::vector<SpanRecord> mine;
  {
    std::lock_guard<std::mutex> lk(I.span_mu);
    mine.swap(spans_);
  }
  std::vector<SpanRecord> all_spans = I.gather_spans(mine);
  // Offsets measured again at the end show the clocks' drift over the run.
  const std::vector<double> offs_end = measure_clock_offsets(I.world);

  std::string err;  // rank 0's: every rank agrees on it below (a fault, but no job abort)
  if (I.rank == 0) {
    const trace_detail::Summary s = trace_detail::summarize(I.rows, I.cfg.warmup);
    err = I.try_writer([&](H5TraceWriter& w) {
      // Moved away while the run went on: the file says so (failed) rather than complete.
      if (const std::string moved = w.moved(); !moved.empty()) {
        w.attr("/", "status", "failed");
        w.attr("/", "failure", moved);
        w.flush();
        throw std::runtime_error(moved);
      }
      w.append_spans(all_spans);
      I.write_offsets(offs_end, "clock_offset_end_us");
      const std::string S = "/summary";
      w.attr(S, "steps_total", s.steps_total);
      w.attr(S, "warmup_steps_excluded", s.warmup_excluded);
      w.attr(S, "measured_steps", s.measured_steps);
      w.attr_bool(S, "valid", s.valid);
      w.attr(S, "valid_reason", s.valid_reason);
      w.attr(S, "time_s_median", s.time_s_median);
      w.attr(S, "tokens_median", s.tokens_median);
      w.attr(S, "tokens_per_s_median", s.tokens_per_s_median);
      w.attr(S, "model_flops_median", s.model_flops_median);
      w.attr(S, "mfu_median", s.mfu_median);
      w.attr(S, "tflops_per_rank_median", s.tflops_per_rank_median);
      w.attr(S, "exposed_comm_s_median", s.exposed_comm_s_median);
      w.attr(S, "ttft_s_median", s.ttft_s_median);
      w.attr(S, "ttit_s_median", s.ttit_s_median);
      w.attr(S, "loss_last", s.loss_last);
      w.attr(S, "peak_bytes_max", s.peak_bytes_max);
      w.attr(S, "peak_rss_bytes_max", s.peak_rss_bytes_max);
      w.attr(S, "device_peak_bytes_max", s.device_peak_bytes_max);
      w.attr("/", "end_time_utc", trace_detail::iso8601_utc(int64_t(std::time(nullptr))));
      w.attr("/", "steps_completed", I.steps_completed);
      w.attr("/", "status", truncated ? "truncated" : "complete");
      if (I.stop_signal != 0)
        w.attr("/", "stop_reason", I.stop_who + ", after step " + std::to_string(I.stop_step));
      w.close_and_rename();
    });
    // A write that failed leaves NAME.partial, marked failed; a complete file placed beside a
    // NAME someone else made says complete, as it is.
    if (!err.empty()) I.mark_failed(err);
    const IoLock lock = io_lock();
    I.writer.reset();
  }
  I.finished = true;
  // After finish returns on any rank, NAME.h5 exists (or every rank throws).
  err = agree_on_error(I.world, err);
  I.stop_watchdog();
  if (!err.empty()) throw RunFailed(err);
}

void Tracer::fail(const std::string& reason) {
  Impl& I = *impl_;
  if (I.finished) return;
  I.touch(step_, Phase::other, -1);
  if (I.rank == 0) {
    I.mark_failed(reason);
    const IoLock lock = io_lock();
    I.writer.reset();  // closed as NAME.partial: an older NAME stays as it was
  }
  I.finished = true;
  I.world.barrier();
  I.stop_watchdog();
}

int Tracer::stop_signal() const { return impl_->stop_signal; }
int Tracer::stop_rank() const { return impl_->stop_rank; }
const std::string& Tracer::stop_who() const { return impl_->stop_who; }
int64_t Tracer::stop_step() const { return impl_->stop_step; }
int64_t Tracer::steps_completed() const { return impl_->steps_completed; }

void Tracer::write_dataset(const std::string& path, const std::vector<int32_t>& data,
                           const std::vector<uint64_t>& dims) {
  impl_->on_writer([&](H5TraceWriter& w) {
    w.dataset_i32(path, data, dims);
    w.flush();
  });
}
void Tracer::write_dataset(const std::string& path, const std::vector<double>& data,
                           const std::vector<uint64_t>& dims) {
  impl_->on_writer([&](H5TraceWriter& w) {
    w.dataset_f64(path, data, dims);
    w.flush();
  });
}
void Tracer::write_attr(const std::string& obj, const std::string& name, const std::string& value) {
  impl_->on_writer([&](H5TraceWriter& w) { w.attr(obj, name, value); w.flush(); });
}
void Tracer::write_attr(const std::string& obj, const std::string& name, int64_t value) {
  impl_->on_writer([&](H5TraceWriter& w) { w.attr(obj, name, value); w.flush(); });
}
void Tracer::write_attr(const std::string& obj, const std::string& name, double value) {
  impl_->on_writer([&](H5TraceWriter& w) { w.attr(obj, name, value); w.flush(); });
}

Tracer::Scope::Scope(Tracer* t, Phase ph, int32_t layer, int32_t ring_step, double flops, double bytes)
    : t_(t), ph_(ph), layer_(layer), ring_step_(ring_step), flops_(flops), bytes_(bytes),
      t0_(t ? t->stamp() : 0.0) {
  if (!t_) return;
  t_->progress(ph, layer);
  range_push(phase_name(ph), t_->impl_->mark_device);
}

Tracer::Scope::~Scope() {
  if (!t_) return;
  range_pop(t_->impl_->mark_device);
  t_->add_span(ph_, layer_, ring_step_, t0_, t_->stamp(), flops_, bytes_);
}

}  // namespace ctxpar
