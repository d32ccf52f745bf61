#include "modes/device_run.hpp"

#include <cstring>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "cp/common.hpp"  // to_device
#include "dist/topology.hpp"
#include "trace/trace.hpp"
#include "ops.hpp"
#if defined(CTXPAR_WITH_CUDA)
#include "cuda/ops_cuda.hpp"  // device_description
#include "dist/chips.hpp"
#include "dist/comm_device.hpp"
#endif

namespace ctxpar {

GpuRun::GpuRun(Topology* t, Tracer* tr) : topo(t), tracer(tr) {
  if (!t) return;
#if defined(CTXPAR_WITH_CUDA)
  devices = cuda_device_count().count;
  device = select_device(t->local_rank(), t->local_size());
  description = cuda::device_description();
  stream = stream_create(Device::cuda);
  comm = use_gpu_comms(*t, device, devices, stream);
  if (tracer) tracer->time_on_device(Device::cuda, stream);
#else
  CTXPAR_FATAL("device = cuda in a build without the CUDA backend (validate_mode refuses it first)");
#endif
}

void GpuRun::log_inference() const {
  if (!stream) return;
  log0("# device=cuda: %s, %s communicators; bf16 weights, GEMM and attention inputs and KV cache, fp32 "
       "accumulation and residual stream\n", description.c_str(), comm.c_str());
}

void GpuRun::attach(Topology& other) const {
#if defined(CTXPAR_WITH_CUDA)
  CTXPAR_CHECK(stream != nullptr, "GpuRun::attach on a CPU run");
  (void)use_gpu_comms(other, device, devices, stream);
#else
  (void)other;
#endif
}

GpuRun::~GpuRun() {
  if (!stream) return;
  stream_synchronize(stream, Device::cuda);
  if (tracer) tracer->time_on_device(Device::cpu, nullptr);  // spans after this: host clock
  topo->cp().set_compute_stream(nullptr);  // the communicators outlive the stream
  topo->shard().set_compute_stream(nullptr);
  for (int a = 0; a < kNumAxes; ++a) topo->axis(Axis(a)).set_compute_stream(nullptr);
  stream_destroy(stream, Device::cuda);
}

double gpu_peak_flops_per_rank(const Config& cfg, Topology& topo) {
  if (cfg.peak_tflops_per_rank > 0) return cfg.peak_tflops_per_rank * 1e12;
#if defined(CTXPAR_WITH_CUDA)
  const DeviceCount dc = cuda_device_count();
  if (dc.count == 0) return 0;
  const int dev = device_for_local_rank(topo.local_rank(), topo.local_size(), dc.count);
  return gpu_bf16_dense_peak_flops(this_chip(topo.world().rank(), topo.local_rank(), topo.local_size(), dev).name);
#else
  (void)topo;
  return 0;
#endif
}

namespace {
Buffer<uint16_t> bf16_of(const void* x, size_t n, Stream s) {
  std::vector<uint16_t> h(n);
  const float* f = static_cast<const float*>(x);
  for (size_t i = 0; i < n; ++i) h[i] = bf16_bits(f[i]);
  return cp::to_device(h, Device::cuda, s);
}
}  // namespace

CpCall DeviceTensors::upload(const CpCall& t, Stream s) {
  const size_t nq = size_t(t.S_q) * t.H_q * t.D, nk = size_t(t.S_k) * t.H_kv * t.D;
  q = bf16_of(t.q, nq, s);
  k = bf16_of(t.k, nk, s);
  v = bf16_of(t.v, nk, s);
  dout = bf16_of(t.dout, nq, s);
  pos = cp::to_device(t.q_pos, size_t(t.S_q), Device::cuda, s);
  if (t.q_doc) doc = cp::to_device(t.q_doc, size_t(t.S_q), Device::cuda, s);
  const auto out = [&](size_t n) { return Buffer<float>(n, true, Device::cuda, s); };
  o = out(nq);
  lse = out(size_t(t.S_q) * t.H_q);
  dq = out(nq);
  dk = out(nk);
  dv = out(nk);
  CpCall a = t;
  a.device = Device::cuda;
  a.stream = s;
  a.dtype = DType::bf16;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.dout = dout.data();
  a.o = o.data();
  a.lse = lse.data();
  a.dq = dq.data();
  a.dk = dk.data();
  a.dv = dv.data();
  a.q_pos_host = a.k_pos_host = t.q_pos;
  a.q_doc_host = a.k_doc_host = t.q_doc;
  a.q_pos = a.k_pos = pos.data();
  a.q_doc = a.k_doc = t.q_doc ? doc.data() : nullptr;
  return a;
}

void DeviceTensors::download(const CpCall& t, Stream s) const {
  const auto get = [&](float* dst, const Buffer<float>& src) {
    copy_to_host(dst, src.data(), src.size() * sizeof(float), Device::cuda, s);
  };
  get(t.o, o);
  get(t.lse, lse);
  get(t.dq, dq);
  get(t.dk, dk);
  get(t.dv, dv);
}

void round_to_bf16(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(bf16_bits(x[i])) << 16;
    std::memcpy(&x[i], &u, 4);
  }
}

}  // namespace ctxpar
