// A mode's or bench's run on the GPU (device=cuda): this rank's device, one compute stream and
// the device communicators (GpuRun), and one attention call's tensors on the device (DeviceTensors).
#pragma once
#include <cstdint>
#include <string>

#include "cp/strategy.hpp"  // CpCall
#include "core/memory.hpp"

namespace ctxpar {

class Topology;
class Tracer;

// With a topology: selects this rank's GPU, creates a compute stream and gives every communicator
// of `topo` a device backend on it (dist/comm_device.hpp use_gpu_comms: NCCL with a GPU per rank,
// else staged). Destroyed after its stream's work, and after every device buffer made later (declare
// it first); the communicators' compute stream is reset then (they outlive it). Without one
// (nullptr): nothing, stream null (a CPU run). With a tracer: its spans are timed by events on the
// stream (Tracer::time_on_device) until the GpuRun ends.
struct GpuRun {
  Stream stream = nullptr;
  std::string description, comm;
  Topology* topo = nullptr;
  Tracer* tracer = nullptr;
  int device = -1, devices = 0;  // this rank's CUDA device, and how many the node shows
  explicit GpuRun(Topology* t, Tracer* tr = nullptr);
  // Another topology of the same ranks (bench infer's sub-meshes): its communicators on this GPU
  // and stream too. Destroy it before the GpuRun.
  void attach(Topology& other) const;
  // Inference on it (prefill, decode, chat, bench infer): the log line naming the GPU and the
  // precision (nothing on a CPU run).
  void log_inference() const;
  GpuRun(const GpuRun&) = delete;
  GpuRun& operator=(const GpuRun&) = delete;
  ~GpuRun();
};

// One attention call's tensors on the GPU: q, k, v, dout rounded to bf16, the fp32 outputs,
// positions and document ids (the host call's kept as the host copies).
struct DeviceTensors {
  Buffer<uint16_t> q, k, v, dout;
  Buffer<int64_t> pos;
  Buffer<int32_t> doc;
  Buffer<float> o, lse, dq, dk, dv;
  // The device call of the host call `t` (fp32 host tensors, queries and keys the same rows).
  CpCall upload(const CpCall& t, Stream s);
  // The results into the host call's outputs (o, lse, dq, dk, dv).
  void download(const CpCall& t, Stream s) const;
};

// The trace's peak for MFU on the GPU: peak_tflops_per_rank when given, else the dense bf16 peak
// of this rank's GPU by its name (dist/chips.hpp; 0 for a GPU the table lacks).
struct Config;
double gpu_peak_flops_per_rank(const Config& cfg, Topology& topo);

// x rounded to bf16 (nearest, ties to even), as fp32 values: what the device computes on.
void round_to_bf16(float* x, size_t n);

}  // namespace ctxpar
