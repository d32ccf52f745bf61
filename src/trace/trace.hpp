// In-memory trace of one run: spans (step, layer, phase, ring_step, rank, begin/end µs, flops,
// bytes), per-step records, peak memory; written to HDF5 by io/h5_trace (src/io, the module that
// knows HDF5) on rank 0 after every step. Crash-safe: NAME.h5.partial is flushed every step and
// renamed to NAME.h5 at a clean end. The status attribute says how the run ended:
//   running    (in NAME.h5.partial) the job is running, or ended without a word (SIGKILL, a crash);
//   complete   every step ran;
//   truncated  a stop signal (core/signals.hpp) on any rank ended it after a step every rank
//              agreed on; stop_reason names the signal, the rank and the step;
//   failed     (in NAME.h5.partial) a fault ended it: the watchdog (no progress for watchdog_s
//              seconds), out of memory, an I/O error, a non-finite loss; `failure` says which rank
//              and why. A rank other than 0 tells rank 0 through the fault channel first.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "attn_params.hpp"    // Device, Stream
#include "core/signals.hpp"  // install_stop_signals, stop_signal_seen (checked by end_step)

namespace ctxpar {

class Comm;
struct Config;
class Topology;

enum class Phase : int32_t {
  other = 0, attn_fwd, attn_bwd, comm_send_recv, comm_wait, all_to_all, all_gather,
  reduce_scatter, all_reduce, gemm, norm, rope, mlp, loss, optimizer, embed, bench, shard,
  offload,  // host offload: copies between the GPU and pinned host memory (bytes: moved)
  state_gather,  // shard=: weights' pieces all-gathered over the shard group (bytes: received)
  state_reduce,  // shard=grads, params: a unit's gradient reduce-scattered over the shard group (bytes: sent)
  kNumPhases
};
const char* phase_name(Phase p);
using PhaseSeconds = std::array<double, size_t(Phase::kNumPhases)>;
// The CP attention's share of phase seconds: its kernels and its communication phases (the
// attention time of train's and bench infer's tables on a GPU, where host clocks see launches only).
double attention_seconds(const PhaseSeconds& ph);

// One timed interval on one rank. Times are µs on rank 0's clock (local time + clock offset).
struct SpanRecord {
  int32_t step, layer, phase, ring_step, rank, pad_;
  double t_begin_us, t_end_us, flops, bytes;
};

// One row of /steps (rank 0 fills in the cross-rank fields).
struct StepRecord {
  int64_t step = 0;
  double time_s = 0;             // max over ranks of the step's wall time
  int64_t tokens = 0;
  double model_flops = 0;        // whole job, this step (recompute not counted)
  double mfu = 0;                // model_flops / (time_s * peak_flops_per_rank * ranks); 0 if no peak
  double tflops_per_rank = 0;
  double exposed_comm_s = 0;     // max over ranks of time blocked on communication
  int64_t peak_bytes = 0;        // max over ranks of tracked peak bytes
  double loss = 0;               // train
  int32_t turn = -1;             // inference
  double ttft_s = 0, ttit_s = 0; // inference
};

class Tracer {
 public:
  // Opens `path`.partial on rank 0 (collective), writing provenance, /config and /topology.
  // `mode_label`: the mode attribute when the writer is not a ctxpar mode (test drivers);
  // "" = the config's mode.
  Tracer(Comm& world, const Config& cfg, const Topology& topo, const std::string& path,
         double peak_flops_per_rank, const std::string& mode_label = "");
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  void begin_step(int64_t step);
  // The layer a caller is working on (-1: none): spans and heartbeats recorded with layer -1
  // (as the CP strategies do, which do not know the layer) get this layer instead. The inference
  // engine sets it per layer; training leaves it at -1.
  void set_layer(int32_t layer) { layer_ctx_ = layer; }
  // Records a finished span (times from now_us()).
  void add_span(Phase ph, int32_t layer, int32_t ring_step, double t_begin_us, double t_end_us,
                double flops = 0, double bytes = 0);
  double now_us() const;  // local clock, µs since the tracer started
  // A span's boundary for add_span: now_us() on the host clock; after time_on_device, an opaque
  // mark — a CUDA event recorded on the compute stream — that end_step turns into the time the
  // device reached it (on the host clock of begin_step's mark), so spans of asynchronous GPU work
  // show when the GPU ran it, not when the host queued it. Pass stamps only to add_span.
  double stamp();
  // GPU runs: span boundaries from events on `stream` (Device::cpu: the host clock, the default),
  // and an NVTX range (named by the phase) around every Scope, for Nsight Systems.
  void time_on_device(Device device, Stream stream);
  // Seconds of this rank's spans of the open step, per phase (index: int(Phase)), device marks
  // resolved (this waits for the GPU to reach them). Nested spans count in each of their phases.
  PhaseSeconds phase_seconds();
  // Heartbeat for the watchdog: what the rank is doing now.
  void progress(Phase ph, int32_t layer = -1);

  // Collective: gathers this step's spans and records to rank 0, writes and flushes them.
  // `local` carries this rank's values (time_s, exposed_comm_s, loss, ...). Returns true when a
  // stop was requested by a signal on any rank (the caller should stop after this step).
  // Defaults: time_s 0 -> wall time since begin_step; peak_bytes 0 -> mem_peak_bytes(). The row's
  // step is begin_step's; tokens, model_flops, loss, turn, ttft_s, ttit_s are rank 0's values;
  // time_s, exposed_comm_s, peak_bytes (and peak RSS) are maxima over ranks.
  bool end_step(const StepRecord& local);

  // Collective: writes /summary and sets status ("complete" renames the file to its final name;
  // "truncated" too — the run ended cleanly but early; truncated is implied when end_step agreed
  // on a stop signal). A file fault (a full disk, NAME made by someone else meanwhile) throws
  // RunFailed on every rank.
  void finish(bool truncated);
  // Collective, instead of finish: a fault every rank knows of (a non-finite loss): status
  // "failed" with `reason`; the file stays NAME.h5.partial, an older NAME.h5 untouched.
  void fail(const std::string& reason);
  // After end_step agreed on a stop: the signal's number and the lowest rank that saw it (0, -1
  // when none).
  int stop_signal() const;
  int stop_rank() const;
  // Every stop signal and the ranks that saw it ("SIGUSR1 on rank 0 and rank 2; SIGTERM on rank 1").
  const std::string& stop_who() const;
  int64_t stop_step() const;
  int64_t steps_completed() const;

  // Extra objects of a mode, e.g. inference's /generated token ids [turn, step, batch] or a
  // bench's attributes. Rank 0 writes and flushes at once; on other ranks these do nothing.
  void write_dataset(const std::string& path, const std::vector<int32_t>& data,
                     const std::vector<uint64_t>& dims);
  void write_dataset(const std::string& path, const std::vector<double>& data,
                     const std::vector<uint64_t>& dims);
  void write_attr(const std::string& obj, const std::string& name, const std::string& value);
  void write_attr(const std::string& obj, const std::string& name, int64_t value);
  void write_attr(const std::string& obj, const std::string& name, double value);

  // RAII span.
  class Scope {
   public:
    Scope(Tracer* t, Phase ph, int32_t layer, int32_t ring_step, double flops, double bytes);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
   private:
    Tracer* t_;
    Phase ph_;
    int32_t layer_, ring_step_;
    double flops_, bytes_, t0_;
  };
  Scope scope(Phase ph, int32_t layer = -1, int32_t ring_step = -1, double flops = 0, double bytes = 0) {
    return Scope(this, ph, layer, ring_step, flops, bytes);
  }

  const std::vector<SpanRecord>& step_spans() const { return spans_; }

  // This rank's clock minus rank 0's clock (µs) and the bound on its error, measured by
  // ping-pong when the tracer was made; span times are shifted by it onto rank 0's clock.
  double clock_offset_us() const;
  double clock_offset_error_us() const;
  // The final file name (NAME.h5); the file being written is NAME.h5.partial until finish().
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<SpanRecord> spans_;
  int64_t step_ = 0;
  int32_t layer_ctx_ = -1;
  int32_t layer_or_ctx(int32_t layer) const { return layer == -1 ? layer_ctx_ : layer; }
  void resolve_marks(std::vector<SpanRecord>& spans);  // device marks → host-clock µs (with the shift)
};


}  // namespace ctxpar
