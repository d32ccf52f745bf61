// `ctxpar attn`: one attention forward and backward with the configured strategy and mesh, on
// tensors from an HDF5 file (`in`) or generated from the seed; the results go to `out` in global
// token order (the trace beside it, see trace_path()).
//
// Input file: datasets q [S,H_q,D], k [S,H_kv,D], v [S,H_kv,D], do [S,H_q,D] (float32 or
// float64), optional doc_id [S] (int32); root attributes causal (0/1, default 1) and window
// (tokens, 0 = none, default 0; window > 0 needs causal = 1). With `in`, the file defines the
// shape and mask; seq, heads, kv_heads, head_dim, mask, window and docs are not used.
// Output file: o [S,H_q,D], lse [S,H_q], dq [S,H_q,D], dk, dv [S,H_kv,D] (float32); when the
// inputs were generated, also q, k, v, do (and doc_id), so the file can be checked on its own.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>
#include <span>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/memory.hpp"
#include "core/random.hpp"
#include "core/stats.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "model/flops.hpp"
#include "modes/device_run.hpp"
#include "modes/modes.hpp"
#include "modes/workload.hpp"
#include "ops.hpp"
#include "shard/partition.hpp"
#include "io/h5_probe.hpp"
#include "io/h5_tensors.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

namespace {

std::string shape_text(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// Reads and checks the header of an input file (no tensor data); fills the problem's shape `s`
// and whether the file has document ids. "" when valid,
// else a message naming the dataset or attribute and what was expected.
std::string inspect_input(const std::string& path, CpCall& s, bool& has_docs) {
  try {
    TensorFileReader f(path);
    const std::string pre = "in = '" + path + "': ";
    const char* layout =
        " (expected datasets q [S, H_q, D], k [S, H_kv, D], v [S, H_kv, D], do [S, H_q, D] of float32 or float64, "
        "optional doc_id [S] int32)";
    for (const char* name : {"q", "k", "v", "do"}) {
      if (!f.has_dataset(name)) return pre + "dataset '" + name + "' is missing" + layout;
      const TensorType t = f.type(name);
      if (t != TensorType::float32 && t != TensorType::float64)
        return pre + "dataset '" + name + "' has type " + tensor_type_name(t) + "; expected float32 or float64";
    }
    const std::vector<int64_t> q = f.dims("q");
    if (q.size() != 3 || q[0] < 1 || q[1] < 1 || q[2] < 1)
      return pre + "dataset 'q' has shape " + shape_text(q) + "; expected [S, H_q, D] with every size >= 1";
    const int64_t S = q[0], D = q[2];
    const std::vector<int64_t> k = f.dims("k");
    if (k.size() != 3 || k[0] != S || k[1] < 1 || k[2] != D)
      return pre + "dataset 'k' has shape " + shape_text(k) + "; expected [S, H_kv, D] = [" + std::to_string(S) +
             ", H_kv, " + std::to_string(D) + "] (S and D of 'q')";
    const std::vector<int64_t> v = f.dims("v");
    if (v != k) return pre + "dataset 'v' has shape " + shape_text(v) + "; expected " + shape_text(k) + " (the shape of 'k')";
    const std::vector<int64_t> dO = f.dims("do");
    if (dO != q) return pre + "dataset 'do' has shape " + shape_text(dO) + "; expected " + shape_text(q) + " (the shape of 'q')";
    has_docs = f.has_dataset("doc_id");
    if (has_docs) {
      const std::vector<int64_t> d = f.dims("doc_id");
      if (d != std::vector<int64_t>{S})
        return pre + "dataset 'doc_id' has shape " + shape_text(d) + "; expected [" + std::to_string(S) + "] (S of 'q')";
      if (f.type("doc_id") != TensorType::int32)
        return pre + "dataset 'doc_id' has type " + tensor_type_name(f.type("doc_id")) + "; expected int32";
    }
    const int64_t causal = f.has_attr("causal") ? f.attr_int("causal") : 1;
    const int64_t window = f.has_attr("window") ? f.attr_int("window") : 0;
    if (causal != 0 && causal != 1) return pre + "attribute causal = " + std::to_string(causal) + "; expected 0 or 1";
    if (window < 0) return pre + "attribute window = " + std::to_string(window) + "; expected >= 0 (0 = no window)";
    if (window > 0 && causal == 0)
      return pre + "attribute window = " + std::to_string(window) + " needs causal = 1 (a sliding window is causal)";
    s = attn_problem(S, int32_t(q[1]), int32_t(k[1]), int32_t(D),
                     causal == 0 ? MaskKind::none : window > 0 ? MaskKind::window : MaskKind::causal, window);
    return "";
  } catch (const UsageError& e) {
    return e.what();
  }
}

// The host call `t` (device results already downloaded into its outputs) run again on the CPU
// path with its inputs rounded to bf16 (the device's values): per tensor, max |device - cpu| over
// every rank relative to max(1, max |cpu|).
std::vector<std::pair<std::string, double>> compare_with_cpu(CpStrategy& strat, const CpCall& t, Comm& cp) {
  const size_t nq = size_t(t.S_q) * t.H_q * t.D, nk = size_t(t.S_k) * t.H_kv * t.D, nl = size_t(t.S_q) * t.H_q;
  const auto rounded = [](const void* x, size_t n) {
    std::vector<float> r(static_cast<const float*>(x), static_cast<const float*>(x) + n);
    round_to_bf16(r.data(), n);
    return r;
  };
  const std::vector<float> q = rounded(t.q, nq), k = rounded(t.k, nk), v = rounded(t.v, nk), dout = rounded(t.dout, nq);
  std::vector<float> o(nq), lse(nl), dq(nq), dk(nk), dv(nk);
  CpCall c = t;
  c.q = q.data(); c.k = k.data(); c.v = v.data(); c.dout = dout.data();
  c.o = o.data(); c.lse = lse.data(); c.dq = dq.data(); c.dk = dk.data(); c.dv = dv.data();
  CpStats s1, s2;
  strat.forward(c, nullptr, s1);
  strat.backward(c, nullptr, s2);
  std::vector<std::pair<std::string, double>> out;
  const auto diff = [&](const char* name, const float* dev, const std::vector<float>& cpu) {
    double m[2] = {0, 1};  // max |dev - cpu|, max(1, max |cpu|)
    for (size_t i = 0; i < cpu.size(); ++i) {
      if (std::isinf(cpu[i]) && dev[i] == cpu[i]) continue;  // rows that see no key: -inf on both
      m[0] = std::max(m[0], double(std::abs(dev[i] - cpu[i])));
      if (std::isfinite(cpu[i])) m[1] = std::max(m[1], double(std::abs(cpu[i])));
    }
    cp.all_reduce(std::span<double>(m, 2), ReduceOp::max);
    out.emplace_back(name, m[0] / m[1]);
  };
  diff("o", t.o, o);
  diff("lse", t.lse, lse);
  diff("dq", t.dq, dq);
  diff("dk", t.dk, dk);
  diff("dv", t.dv, dv);
  return out;
}

std::string mesh_text(const Topology& topo) {
  const MeshSpec& m = topo.mesh();
  return "dp:" + std::to_string(m.dp) + ",tp:" + std::to_string(m.tp) + ",ulysses:" + std::to_string(m.ulysses) +
         ",ring:" + std::to_string(m.ring);
}

}  // namespace

std::string validate_attn_mode(const Config& cfg, Topology& topo) {
  if (cfg.in.empty()) return "";  // generated inputs: the workload checks covered the shape
  if (topo.world().rank() != 0) return "";  // rank 0 reads the file; main agrees on the result
  CpCall s;
  bool docs = false;
  std::string err = inspect_input(cfg.in, s, docs);
  if (!err.empty()) return err;
  std::unique_ptr<CpStrategy> strat = make_strategy(cfg.strategy, topo);
  if (!strat) return std::string("config: strategy = '") + cfg.strategy + "' is not built into this binary";
  err = strat->validate(s, topo);
  if (!err.empty())
    return "in = '" + cfg.in + "' (S=" + std::to_string(s.S_q) + ", H_q=" + std::to_string(s.H_q) + ", H_kv=" +
           std::to_string(s.H_kv) + ", D=" + std::to_string(s.D) + ") on mesh " + mesh_text(topo) + ": " + err;
  return "";
}

std::string scan_attn_inputs(const Config& cfg, Topology& topo) {
  if (cfg.in.empty()) return "";
  // Non-finite values are reported here, not absorbed: a NaN in a row would give that row O = 0
  // and LSE = -inf (the kernels treat it as fully masked) and spread through the gradients.
  // Dataset i is read by rank i mod P.
  const char* names[] = {"q", "k", "v", "do"};
  const Comm& world = topo.world();
  for (int i = world.rank(); i < 4; i += world.size()) {
    try {
      const std::string bad = first_non_finite(cfg.in, names[i]);
      if (!bad.empty())
        return "in = '" + cfg.in + "': dataset '" + names[i] + "' has " + bad + " ([token, head, dim]); valid: finite " +
               "values within float32's range";
    } catch (const std::exception& e) {
      return "in = '" + cfg.in + "': dataset '" + names[i] + "' cannot be read: " + e.what();
    }
  }
  // Document ids >= 0: -1 marks the padding rows of a seq the partition does not divide.
  if (world.rank() == 4 % world.size()) {
    try {
      TensorFileReader f(cfg.in);
      if (f.has_dataset("doc_id")) {
        const int64_t S = f.dims("doc_id")[0];
        std::vector<int32_t> ids(static_cast<size_t>(S));
        f.read_rows("doc_id", 0, S, ids.data());
        for (int64_t i = 0; i < S; ++i)
          if (ids[size_t(i)] < 0)
            return "in = '" + cfg.in + "': dataset 'doc_id' has " + std::to_string(ids[size_t(i)]) + " at token " +
                   std::to_string(i) + "; valid: document ids >= 0";
      }
    } catch (const std::exception& e) {
      return "in = '" + cfg.in + "': dataset 'doc_id' cannot be read: " + e.what();
    }
  }
  return "";
}

double attn_memory(const Config& cfg, Topology& topo) {
  if (cfg.in.empty()) return workload_memory(cfg, topo);
  // The file's shape (its header only; validate_attn_mode has checked it on rank 0).
  CpCall s;
  bool docs = false;
  if (!inspect_input(cfg.in, s, docs).empty()) return 0;
  Config c = cfg;
  c.in.clear();
  c.seq = s.S_q;
  c.heads = s.H_q;
  c.kv_heads = s.H_kv;
  c.head_dim = s.D;
  c.mask = s.mask;
  c.window = s.window;
  c.docs = "none";
  return workload_memory(c, topo);
}

double attn_device_memory(const Config& cfg, Topology& topo) {
  CpCall s = attn_problem(cfg);
  bool docs = cfg.docs != "none";
  if (!cfg.in.empty() && !inspect_input(cfg.in, s, docs).empty()) return 0;
  s.dtype = DType::bf16;
  const int P = topo.cp_size();
  const double n = double(s.S_q) / P, wq = double(s.H_q) * s.D, wk = double(s.H_kv) * s.D;
  // bf16 q, k, v, dout; fp32 o, lse, dq, dk, dv; positions and ids; the strategy's transient buffers.
  const double tensors = n * (2 * (wq + wk) * 2 + (2 * wq + 2 * wk + s.H_q) * 4 + 12);
  std::unique_ptr<CpStrategy> strat = make_strategy(cfg.strategy, topo);
  return tensors + (strat ? strat->buffer_bytes(s, docs, topo) : 0);
}

namespace {

// One attention call's host tensors: this rank's rows of the inputs and results.
struct AttnTensors {
  Buffer<float> q, k, v, dout, o, lse, dq, dk, dv;
  std::vector<int32_t> doc;         // this rank's document ids (empty: one document)
  std::vector<int32_t> global_doc;  // the whole sequence's (generated inputs with docs)
  bool has_docs = false;
  AttnTensors(int64_t S_loc, int64_t wq, int64_t wk, int32_t H_q)
      : q(size_t(S_loc * wq), false), k(size_t(S_loc * wk), false), v(size_t(S_loc * wk), false),
        dout(size_t(S_loc * wq), false), o(size_t(S_loc * wq)), lse(size_t(S_loc * H_q)), dq(size_t(S_loc * wq)),
        dk(size_t(S_loc * wk)), dv(size_t(S_loc * wk)) {}
};

// This rank's input rows: its shard of the file `in` (each rank reads only the partition's token
// ranges, in local order), or generated from the seed; padding rows zeroed.
void fill_attn_inputs(const Config& cfg, const CpCall& s, const Partition& part, int r,
                      const std::vector<int64_t>& pos, bool has_docs_in_file, AttnTensors& t) {
  const int64_t S_loc = int64_t(pos.size()), wq = int64_t(s.H_q) * s.D, wk = int64_t(s.H_kv) * s.D;
  if (!cfg.in.empty()) {
    TensorFileReader f(cfg.in);
    std::vector<int32_t> file_doc;
    if (has_docs_in_file) file_doc.resize(size_t(S_loc));
    int64_t row = 0;
    for (auto [b, e] : part.ranges(r)) {
      f.read_rows("q", b, e, t.q.data() + row * wq);
      f.read_rows("k", b, e, t.k.data() + row * wk);
      f.read_rows("v", b, e, t.v.data() + row * wk);
      f.read_rows("do", b, e, t.dout.data() + row * wq);
      if (has_docs_in_file) f.read_rows("doc_id", b, e, file_doc.data() + row);
      row += e - b;
    }
    CTXPAR_CHECK(row == part.real_size(r), "partition ranges cover " << row << " rows, expected " << part.real_size(r));
    if (has_docs_in_file || (part.padding() > 0 && s.mask == MaskKind::none)) {
      t.doc.assign(size_t(S_loc), -1);  // padding rows: -1
      for (int64_t i = 0; i < row; ++i) t.doc[size_t(i)] = has_docs_in_file ? file_doc[size_t(i)] : 0;
    }
    t.has_docs = has_docs_in_file;
  } else {
    const uint64_t seed = uint64_t(cfg.seed);
    fill_rows(seed, kTensorQ, pos, wq, 1.0f, t.q.data());
    fill_rows(seed, kTensorK, pos, wk, 1.0f, t.k.data());
    fill_rows(seed, kTensorV, pos, wk, 1.0f, t.v.data());
    fill_rows(seed, kTensorDout, pos, wq, 1.0f, t.dout.data());
    const std::string err = parse_docs(cfg.docs, s.S_q, cfg.doc_mean, seed, t.global_doc);
    CTXPAR_CHECK(err.empty(), err);  // validated before
    t.doc = local_doc_ids(part, r, t.global_doc, s.mask);
    t.has_docs = !t.global_doc.empty();
  }
  clear_padding_rows(part, r, {{t.q.data(), wq}, {t.k.data(), wk}, {t.v.data(), wk}, {t.dout.data(), wq}});
}

// The largest magnitude of each input over every rank (q, k, v, do), and what a non-finite output
// says about them (collective): inputs of a scale whose products overflow fp32 (a score q.k sums
// D products, dP = dO.V likewise, and the gradients sum over the keys) or whose scores pass 1e12
// (fp32's softmax then has no precision left): `*input_made_it`; or of an ordinary one (then the
// kernels are at fault: a bug).
std::string input_scale_note(const AttnTensors& x, const CpCall& s, Comm& world, bool* input_made_it) {
  double m[4] = {0, 0, 0, 0};
  const Buffer<float>* in[4] = {&x.q, &x.k, &x.v, &x.dout};
  for (int i = 0; i < 4; ++i)
    for (float e : in[i]->span()) m[i] = std::max(m[i], double(std::fabs(e)));
  world.all_reduce(std::span<double>(m, 4), ReduceOp::max);
  const double D = s.D, keys = double(s.S_k);
  const bool overflows = m[0] * m[1] * D > FLT_MAX || m[3] * m[2] * D > FLT_MAX ||
                         keys * m[3] * m[2] * D * std::max(m[0], m[1]) > FLT_MAX || m[0] * m[1] * std::sqrt(D) > 1e12;
  *input_made_it = overflows;
  char b[256];
  std::snprintf(b, sizeof b, "every input is finite, largest |q| %.3g, |k| %.3g, |v| %.3g, |do| %.3g", m[0], m[1], m[2],
                m[3]);
  return std::string(b) + (overflows ? ": products of that scale overflow fp32, or leave its softmax no precision "
                                       "(the input made it so); valid: inputs whose q.k and do.v products stay within "
                                       "fp32 (e.g. |values| <= 1e3)"
                                     : ": of an ordinary scale, so the kernels are at fault (a bug: please report it "
                                       "with the input file)");
}

// The results in global token order, written by world rank 0 (CP rank 0 of its group; every dp/tp
// replica computed the same attention), with the generated inputs and the call's description.
// Returns "" (on every rank but 0 always), or on rank 0 why nothing was written: a result that is
// not finite, named with its index. A file-system fault throws LocalFault on rank 0.
std::string write_attn_results(const Config& cfg, Topology& topo, const Partition& part, const CpCall& s,
                               const CpStrategy& strat, const AttnTensors& t, const GpuRun& gpu,
                               const std::vector<std::pair<std::string, double>>& cpu_diff) {
  Comm& cpc = topo.cp();
  const int64_t S = s.S_q, wq = int64_t(s.H_q) * s.D, wk = int64_t(s.H_kv) * s.D;
  const std::vector<float> O = gather_rows_global(cpc, part, t.o.span(), wq);
  const std::vector<float> L = gather_rows_global(cpc, part, t.lse.span(), s.H_q);
  const std::vector<float> dQ = gather_rows_global(cpc, part, t.dq.span(), wq);
  const std::vector<float> dK = gather_rows_global(cpc, part, t.dk.span(), wk);
  const std::vector<float> dV = gather_rows_global(cpc, part, t.dv.span(), wk);
  if (topo.world().rank() != 0) return "";
  const std::pair<const char*, std::pair<const std::vector<float>*, std::vector<int64_t>>> results[] = {
      {"o", {&O, {S, s.H_q, s.D}}}, {"lse", {&L, {S, s.H_q}}}, {"dq", {&dQ, {S, s.H_q, s.D}}},
      {"dk", {&dK, {S, s.H_kv, s.D}}}, {"dv", {&dV, {S, s.H_kv, s.D}}}};
  for (const auto& [name, r] : results)
    if (const std::string bad = first_non_finite(r.first->data(), r.second); !bad.empty())
      return std::string("attn: result ") + name + " has " + bad + " (" + (r.second.size() == 2 ? "[token, head]" : "[token, head, dim]") +
             "); nothing written to " + attn_result_path(cfg);
  const bool from_file = !cfg.in.empty(), on_gpu = cfg.device == Device::cuda;
  const uint64_t seed = uint64_t(cfg.seed);
  TensorFileWriter w(attn_result_path(cfg));
  w.write("o", {S, s.H_q, s.D}, O.data());
  w.write("lse", {S, s.H_q}, L.data());
  w.write("dq", {S, s.H_q, s.D}, dQ.data());
  w.write("dk", {S, s.H_kv, s.D}, dK.data());
  w.write("dv", {S, s.H_kv, s.D}, dV.data());
  if (!from_file) {
    std::vector<int64_t> all(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; ++i) all[size_t(i)] = i;
    std::vector<float> x(size_t(S * wq));
    fill_rows(seed, kTensorQ, all, wq, 1.0f, x.data());
    w.write("q", {S, s.H_q, s.D}, x.data());
    fill_rows(seed, kTensorDout, all, wq, 1.0f, x.data());
    w.write("do", {S, s.H_q, s.D}, x.data());
    x.resize(size_t(S * wk));
    fill_rows(seed, kTensorK, all, wk, 1.0f, x.data());
    w.write("k", {S, s.H_kv, s.D}, x.data());
    fill_rows(seed, kTensorV, all, wk, 1.0f, x.data());
    w.write("v", {S, s.H_kv, s.D}, x.data());
    if (!t.global_doc.empty()) w.write("doc_id", {S}, t.global_doc.data());
  }
  w.attr("ctxpar_file", std::string("attn_result"));
  w.attr("causal", int64_t(s.mask == MaskKind::none ? 0 : 1));
  w.attr("window", int64_t(s.mask == MaskKind::window ? s.window : 0));
  w.attr("strategy", strat.name());
  w.attr("mesh", mesh_text(topo));
  w.attr("partition", std::string(partition_name(strat.partition())));
  w.attr("source", from_file ? "file:" + cfg.in : "seed:" + std::to_string(cfg.seed) + ",docs:" + cfg.docs);
  w.attr("flop_convention", std::string(kFlopConvention));
  w.attr("device", on_gpu ? "cuda (bf16 inputs, fp32 outputs; " + gpu.description + ", comm " + gpu.comm + ")"
                          : std::string("cpu (fp32)"));
  for (const auto& [name, d] : cpu_diff) w.attr("cpu_check_" + name, d);
  w.commit();
  return "";
}

// Model FLOPs of the call: the real tokens' visible pairs where the layout pads (the padding rows'
// pairs are work, not model), else what the kernels counted.
double attn_model_flops(const Config& cfg, const CpCall& s, const Partition& part, const AttnTensors& t,
                        double counted, Topology& topo) {
  if (part.padding() == 0) return counted;
  std::vector<int32_t> all_doc = t.global_doc;
  if (!cfg.in.empty() && t.has_docs) {
    TensorFileReader f(cfg.in);
    all_doc.resize(size_t(s.S_q));
    f.read_rows("doc_id", 0, s.S_q, all_doc.data());
  }
  return attn_train_flops(double(problem_visible_pairs(s, all_doc)), s.H_q, s.D) *
         double(topo.world().size() / topo.cp().size());
}

}  // namespace

int run_attn_mode(const Config& cfg, Topology& topo, Tracer& tracer) {
  const bool from_file = !cfg.in.empty();
  CpCall s = attn_problem(cfg);
  bool has_docs = false;
  if (from_file) {
    const std::string err = inspect_input(cfg.in, s, has_docs);
    CTXPAR_CHECK(err.empty(), err);  // validated on rank 0 before; a file changed since then is fatal
  }
  // device=cuda: this rank's GPU, one compute stream, and device communicators, before the
  // strategy binds to them.
  const bool on_gpu = cfg.device == Device::cuda;
  const GpuRun gpu(on_gpu ? &topo : nullptr, &tracer);
  std::unique_ptr<CpStrategy> strat = make_strategy(cfg.strategy, topo);
  CTXPAR_CHECK(strat, "unknown strategy " << cfg.strategy);
  Comm& cpc = topo.cp();
  const int P = cpc.size(), r = cpc.rank();
  const int64_t S = s.S_q;
  const Partition part(strat->partition(), S, P);
  const std::vector<int64_t> pos = part.positions(r);
  const int64_t S_loc = int64_t(pos.size());
  AttnTensors x(S_loc, int64_t(s.H_q) * s.D, int64_t(s.H_kv) * s.D, s.H_q);
  fill_attn_inputs(cfg, s, part, r, pos, has_docs, x);
  has_docs = x.has_docs;
  if (part.padding() > 0) log0("# %s\n", part.padding_note().c_str());

  CpCall t = s;
  t.S_q = t.S_k = S_loc;
  t.q_pos = t.k_pos = pos.data();
  t.q_doc = t.k_doc = x.doc.empty() ? nullptr : x.doc.data();
  t.q = x.q.data(); t.k = x.k.data(); t.v = x.v.data(); t.dout = x.dout.data();
  t.o = x.o.data(); t.lse = x.lse.data(); t.dq = x.dq.data(); t.dk = x.dk.data(); t.dv = x.dv.data();

  // On the GPU: the same rows rounded to bf16 and the fp32 outputs in device memory, with the
  // positions and document ids on both sides (CpCall::q_pos_host ...).
  DeviceTensors dev;
  const CpCall run = on_gpu ? dev.upload(t, gpu.stream) : t;

  Comm& world = topo.world();
  tracer.begin_step(0);
  CpStats fst, bst;
  world.barrier();
  const double t0 = world.now();
  strat->forward(run, &tracer, fst);
  stream_synchronize(gpu.stream, cfg.device);
  const double t1 = world.now();
  strat->backward(run, &tracer, bst);
  stream_synchronize(gpu.stream, cfg.device);
  const double t2 = world.now();
  fst.settle();  // device waits, timed on the device
  bst.settle();
  if (on_gpu) dev.download(t, gpu.stream);
  // device=cuda with cpu_check: the same call on the CPU path, on the same bf16-rounded values (the
  // strategy's device communicators hand host buffers to their MPI communicators), so the
  // differences are the device kernels' own roundings (P and dS in bf16) and any device-path error.
  std::vector<std::pair<std::string, double>> cpu_diff;
  if (on_gpu && cfg.cpu_check) cpu_diff = compare_with_cpu(*strat, t, cpc);
  double mx[3] = {t1 - t0, t2 - t1, fst.exposed_comm_s + bst.exposed_comm_s};
  double flops = fst.attn_flops + bst.attn_flops;
  world.all_reduce(std::span<double>(mx, 3), ReduceOp::max);
  world.all_reduce(std::span<double>(&flops, 1), ReduceOp::sum);
  flops = attn_model_flops(cfg, s, part, x, flops, topo);
  StepRecord rec;
  rec.step = 0;
  rec.time_s = mx[0] + mx[1];
  rec.tokens = S;
  rec.model_flops = flops;
  rec.tflops_per_rank = flops / (rec.time_s * world.size()) / 1e12;
  rec.exposed_comm_s = mx[2];
  tracer.end_step(rec);
  std::string bad;  // a result not finite; a full disk ends the run in run_then_agree (exit 3)
  run_then_agree(world, [&] { bad = write_attn_results(cfg, topo, part, s, *strat, x, gpu, cpu_diff); });
  if (bad = agree_on_error(world, bad); !bad.empty()) {
    bool input_made_it = false;  // else a bug of the kernels: exit 1 (docs/faults.md)
    bad += "; " + input_scale_note(x, s, world, &input_made_it);  // every rank is here: its reduction is collective
    err0("ctxpar: %s\n", bad.c_str());
    tracer.fail(bad);
    return input_made_it ? kExitFault : kExitBug;
  }
  log0("attn%s: strategy %s, mesh %s, S=%lld H_q=%d H_kv=%d D=%d mask=%s%s: fwd %.3f ms, bwd %.3f ms, exposed comm "
       "%.3f ms, %.4f TFLOP/s per rank; wrote %s (trace %s)\n",
       on_gpu ? " (device=cuda, bf16)" : "", strat->name().c_str(), mesh_text(topo).c_str(), (long long)S, s.H_q, s.H_kv, s.D,
       s.mask == MaskKind::none ? "none" : s.mask == MaskKind::causal ? "causal" : "window",
       has_docs ? "+docs" : "", mx[0] * 1e3, mx[1] * 1e3, mx[2] * 1e3, rec.tflops_per_rank, attn_result_path(cfg).c_str(),
       trace_path(cfg).c_str());
  if (!cpu_diff.empty()) {
    std::string line;
    for (const auto& [name, d] : cpu_diff) {
      char b[48];
      std::snprintf(b, sizeof b, " %s %.2e", name.c_str(), d);
      line += b;
    }
    log0("attn cpu_check: max |device - cpu| / max(1, max|cpu|) on the same bf16 inputs:%s\n", line.c_str());
  }
  return 0;
}

}  // namespace ctxpar
