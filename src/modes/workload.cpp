#include "modes/workload.hpp"

#include <algorithm>
#include <sstream>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/random.hpp"
#include "dist/topology.hpp"
#include "model/model.hpp"
#include "ops.hpp"

namespace ctxpar {

CpCall attn_problem(const Config& cfg) {
  if (cfg.attention == "mla") {  // bench cp's MLA rows: every head of nope + rope, K/V from the latent
    const ModelDims d = model_dims(cfg, 1, 0);
    CpCall p = attn_problem(cfg.seq, d.H_q, d.H_kv, d.D, cfg.mask, cfg.window);
    p.latent_width = d.kv_lora + d.rope;
    return p;
  }
  return attn_problem(cfg.seq, int32_t(cfg.heads), int32_t(cfg.kv_heads), int32_t(cfg.head_dim), cfg.mask,
                      cfg.window);
}

bool has_docs(const Config& cfg) { return packed_docs(cfg); }

std::string validate_workload(const Config& cfg, Topology& topo) {
  if (cfg.attention == "mla" && !(cfg.mode == Mode::bench && cfg.bench == Bench::cp))
    return std::string("config: attention = mla applies to train, bench train, bench cp and inference (its projections "
                       "make K and V); `") + name_of(cfg.mode) + "` runs attention on synthetic Q, K, V; valid here: attention=mha";
  std::unique_ptr<CpStrategy> strat = make_strategy(cfg.strategy, topo);
  if (!strat) return std::string("config: strategy = '") + cfg.strategy + "' is not built into this binary";
  // strategy = all: bench cp runs the schedule's row of each strategy that has one beside the plain rows
  std::string err = schedule_refusal(cfg.strategy, cfg.cp_schedule(), "all");
  if (!err.empty()) return err;
  err = make_strategy(cfg.strategy, topo, cfg.cp_schedule())->validate(attn_problem(cfg), topo);
  if (!err.empty()) return err;
  err = Partition::check(strat->partition(), cfg.seq, topo.cp().size());
  if (!err.empty()) return "config: " + err;
  err = check_docs(cfg.docs, cfg.seq, cfg.doc_mean);
  if (!err.empty()) return "config: docs = '" + cfg.docs + "': " + err;
  return "";
}

WorkloadPlan plan_workload(const Config& cfg, Topology& topo) {
  WorkloadPlan p;
  std::unique_ptr<CpStrategy> strat = make_strategy(cfg.strategy, topo);
  const int P = topo.cp().size();
  // exact rows (:det) run on a layout padded to whole query tiles: the larger one is planned
  const int64_t block = cfg.exact ? attn_query_block(attn_problem(cfg).D) : 1;
  p.partition = std::make_unique<Partition>(strat->partition(), cfg.seq, P, block);
  p.partition_name = partition_name(strat->partition());
  for (int r = 0; r < P; ++r) p.S_loc_max = std::max(p.S_loc_max, p.partition->local_size(r));
  // Local tensors: q, o, dout, dq [S_loc, H_q, D]; k, v, dk, dv [S_loc, H_kv, D]; lse [S_loc, H_q];
  // plus the strategy's transfer buffers (twice one forward message, for double buffering).
  const double f = sizeof(float);
  const CpCall shape = attn_problem(cfg);  // MLA: heads of nope + rope, the latent besides
  const double local = double(p.S_loc_max) *
                       (4.0 * shape.H_q * shape.D + 4.0 * shape.H_kv * shape.D + shape.H_q + 2.0 * shape.latent_width) * f;
  const double comm = 2.0 * strat->comm_volume_fwd(attn_problem(cfg), has_docs(cfg), topo);
  // exact rows (the strategies' schedule of exact sums): every K/V row gathered twice over (the packed
  // blocks and the position-ordered copy), the exact dK/dV of every key as 8-byte integers twice
  // (the kernel's sums and the blocks reduce-scattered), on the layout padded to whole tiles.
  const double canon =
      cfg.exact
          ? double(Partition::padded_length(strat->partition(), cfg.seq, P, attn_query_block(shape.D))) * shape.H_kv *
                shape.D * (2.0 * 2.0 * f + 2.0 * 2.0 * sizeof(int64_t))
          : 0.0;
  p.bytes_per_rank = local + std::max(comm, canon);
  std::ostringstream os;
  os << "local tensors " << fmt_bytes(local) << " + transfer buffers " << fmt_bytes(comm);
  if (canon > 0) os << " (" << schedule_key(cfg.cp_schedule()) << " rows: " << fmt_bytes(canon) << " of gathered keys and exact sums)";
  os << "; attention working set of the kernel not included";
  p.memory_note = os.str();
  return p;
}

std::vector<float> gather_rows_at(Comm& cp, std::span<const int64_t> pos, int64_t S, std::span<const float> local,
                                  int64_t width) {
  CTXPAR_CHECK(int64_t(local.size()) == int64_t(pos.size()) * width,
               "gather_rows_at: " << local.size() << " elements for " << pos.size() << " rows of " << width);
  std::vector<float> all, global;
  std::vector<int64_t> all_pos;
  cp.gather_v(local, all, 0);
  cp.gather_v(pos, all_pos, 0);
  if (cp.rank() != 0) return global;
  global.resize(size_t(S * width));
  for (size_t i = 0; i < all_pos.size(); ++i)
    if (all_pos[i] < S)  // padding rows (positions >= S) are left out
      std::copy_n(all.data() + i * size_t(width), size_t(width), global.data() + all_pos[i] * width);
  return global;
}

std::vector<float> gather_rows_global(Comm& cp, const Partition& part, std::span<const float> local, int64_t width) {
  const std::vector<int64_t> pos = part.positions(cp.rank());
  return gather_rows_at(cp, pos, part.S(), local, width);
}

std::vector<int32_t> doc_ids_at(std::span<const int64_t> pos, int64_t S, bool padded, std::span<const int32_t> global_doc,
                                MaskKind mask) {
  std::vector<int32_t> doc;
  if (global_doc.empty() && !(padded && mask == MaskKind::none)) return doc;
  for (int64_t p : pos) doc.push_back(p >= S ? -1 : global_doc.empty() ? 0 : global_doc[size_t(p)]);
  return doc;
}
std::vector<int32_t> local_doc_ids(const Partition& part, int r, std::span<const int32_t> global_doc, MaskKind mask) {
  const std::vector<int64_t> pos = part.positions(r);
  return doc_ids_at(pos, part.S(), part.padding() > 0, global_doc, mask);
}

void clear_rows_at(std::span<const int64_t> pos, int64_t S, std::initializer_list<std::pair<float*, int64_t>> tensors) {
  for (size_t i = 0; i < pos.size(); ++i)
    if (pos[i] >= S)
      for (const auto& [data, width] : tensors) std::fill_n(data + int64_t(i) * width, width, 0.0f);
}
void clear_padding_rows(const Partition& part, int r, std::initializer_list<std::pair<float*, int64_t>> tensors) {
  const std::vector<int64_t> pos = part.positions(r);
  clear_rows_at(pos, part.S(), tensors);
}

int64_t problem_visible_pairs(const CpCall& shape, std::span<const int32_t> global_doc) {
  CpCall p = shape;
  p.S_q = p.S_k = shape.S_q;
  std::vector<int64_t> pos(static_cast<size_t>(shape.S_q));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int64_t(i);
  p.q_pos = p.k_pos = pos.data();
  p.q_doc = p.k_doc = global_doc.empty() ? nullptr : global_doc.data();
  return visible_pairs(p);
}

CpCall Workload::local() {
  CpCall t = problem;
  t.S_q = t.S_k = int64_t(pos.size());
  t.q_pos = t.k_pos = pos.data();
  t.q_doc = t.k_doc = doc.empty() ? nullptr : doc.data();
  t.q = q.data(); t.k = k.data(); t.v = v.data();
  t.o = o.data(); t.lse = lse.data(); t.dout = dout.data();
  t.dq = dq.data(); t.dk = dk.data(); t.dv = dv.data();
  return t;
}

Workload make_workload(const Config& cfg, Topology& topo) {
  Workload w;
  w.problem = attn_problem(cfg);
  w.strategy = make_strategy(cfg.strategy, topo);
  const int P = topo.cp().size(), r = topo.cp().rank();
  w.partition = std::make_unique<Partition>(w.strategy->partition(), cfg.seq, P);
  w.pos = w.partition->positions(r);
  const std::string err = parse_docs(cfg.docs, cfg.seq, cfg.doc_mean, uint64_t(cfg.seed), w.global_doc);
  CTXPAR_CHECK(err.empty(), err);  // validated before
  w.doc = local_doc_ids(*w.partition, r, w.global_doc, cfg.mask);
  const int64_t S_loc = int64_t(w.pos.size()), Hq = cfg.heads, Hkv = cfg.kv_heads, D = cfg.head_dim;
  w.q.resize(size_t(S_loc * Hq * D), false);
  w.k.resize(size_t(S_loc * Hkv * D), false);
  w.v.resize(size_t(S_loc * Hkv * D), false);
  w.dout.resize(size_t(S_loc * Hq * D), false);
  w.o.resize(size_t(S_loc * Hq * D));
  w.lse.resize(size_t(S_loc * Hq));
  w.dq.resize(size_t(S_loc * Hq * D));
  w.dk.resize(size_t(S_loc * Hkv * D));
  w.dv.resize(size_t(S_loc * Hkv * D));
  const uint64_t seed = uint64_t(cfg.seed);
  fill_rows(seed, kTensorQ, w.pos, Hq * D, 1.0f, w.q.data());
  fill_rows(seed, kTensorK, w.pos, Hkv * D, 1.0f, w.k.data());
  fill_rows(seed, kTensorV, w.pos, Hkv * D, 1.0f, w.v.data());
  fill_rows(seed, kTensorDout, w.pos, Hq * D, 1.0f, w.dout.data());
  clear_padding_rows(*w.partition, r, {{w.q.data(), Hq * D}, {w.k.data(), Hkv * D}, {w.v.data(), Hkv * D},
                                       {w.dout.data(), Hq * D}});
  return w;
}

}  // namespace ctxpar
