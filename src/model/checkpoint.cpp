#include "model/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/stats.hpp"
#include "dist/topology.hpp"
#include "io/h5_checkpoint.hpp"
#include "io/h5_probe.hpp"

namespace ctxpar {

namespace {

// The settings a checkpoint records and a resume compares, by field name: every one that changes
// the model's function (kModel), and the ones that define the data stream a resumed run
// continues (kStream: compared by training only). Numerics (deterministic, remat, gdn_chunk, the
// mesh) and the optimizer's settings may change between runs.
enum { kModel = 1, kStream = 2 };
int identity_key(std::string_view name) {
  static constexpr std::string_view model[] = {
      "layers", "dim", "ffn_dim", "vocab", "heads", "kv_heads", "head_dim", "norm_eps", "rope_theta",
      "rope_scale_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_pos", "layer_pattern",
      "window", "attention", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
      "gdn_heads", "gdn_head_dim_k", "gdn_head_dim_v", "gdn_conv"};
  static constexpr std::string_view data[] = {"seed", "seq", "data", "data_dtype", "docs", "doc_mean", "eos_id"};
  for (std::string_view m : model)
    if (m == name) return kModel;
  for (std::string_view d : data)
    if (d == name) return kStream;
  return 0;
}

std::string quoted(const std::string& v) { return "'" + printable(v, 1) + "'"; }

// The root attributes of a checkpoint: its kind, where the run is, every identity setting, and
// which writer on which rank layout wrote it (a reader needs none of that: the tensors are global).
H5Attrs checkpoint_attrs(const Config& cfg, const TrainState& st, Topology& topo) {
  H5Attrs a;
  a.ints = {{"step", st.step}, {"next_sample", st.next_sample}};
  a.strings = {{"ctxpar_file", "checkpoint"}};
  for (const Field& f : config_fields())
    if (identity_key(f.name)) a.strings.emplace_back(std::string(f.name), field_text(cfg, f));
  const MeshSpec& m = topo.mesh();
  a.strings.emplace_back("written_by", std::string(name_of(cfg.checkpoint_io)) + " writer, " +
                                           std::to_string(topo.world().size()) + " ranks, mesh dp:" + std::to_string(m.dp) +
                                           ",tp:" + std::to_string(m.tp) + ",ulysses:" + std::to_string(m.ulysses) +
                                           ",ring:" + std::to_string(m.ring) + ", shard=" + name_of(cfg.shard));
  return a;
}

}  // namespace

std::vector<std::vector<float>> gather_global_tensors(const ParamLayout& layout, const float* local, Topology& topo) {
  std::vector<std::vector<float>> out;
  if (topo.coord(Axis::dp) != 0 || topo.cp().rank() != 0) return out;
  Comm& tp = topo.axis(Axis::tp);
  const int T = tp.size();
  std::vector<float> all;
  tp.gather_v(std::span<const float>(local, size_t(layout.local_elems())), all, 0);
  if (topo.world().rank() != 0) return out;
  const int64_t n_loc = layout.local_elems();
  for (const ParamInfo& p : layout.tensors()) {
    std::vector<float> g(size_t(p.rows * p.cols));
    for (int t = 0; t < T; ++t) {
      const float* src = all.data() + t * n_loc + p.offset;
      const int64_t r0 = p.split == Split::rows ? t * p.loc_rows : 0;
      const int64_t c0 = p.kv ? int64_t(layout.dims().kv_head0_of(t)) * layout.dims().D
                              : p.split == Split::cols ? t * p.loc_cols : 0;  // a replicated K/V head: its copies agree
      for (int64_t r = 0; r < p.loc_rows; ++r)
        for (int64_t c = 0; c < p.loc_cols; ++c) g[size_t((r0 + r) * p.cols + c0 + c)] = src[r * p.loc_cols + c];
      if (p.split == Split::replicated) break;
    }
    out.push_back(std::move(g));
  }
  return out;
}

void save_checkpoint(const std::string& path, const Config& cfg, const ParamLayout& layout, const float* params,
                     const float* m, const float* v, const TrainState& st, Topology& topo) {
  const auto gp = gather_global_tensors(layout, params, topo);
  const auto gm = gather_global_tensors(layout, m, topo);
  const auto gv = gather_global_tensors(layout, v, topo);
  const H5Attrs attrs = checkpoint_attrs(cfg, st, topo);
  // Rank 0 writes; every rank then agrees on how that went (a full disk ends the run on every rank
  // alike, exit 3), and nobody goes on (e.g. to a job end that a test then inspects) before the
  // file is in place.
  run_then_agree(topo.world(), [&] {
    if (topo.world().rank() != 0) return;
    const auto& info = layout.tensors();
    // Never a NaN or Inf in a checkpoint (a resume would refuse it): the last complete one stays.
    for (size_t i = 0; i < info.size(); ++i)
      for (const auto& [group, g] : {std::pair{"params/", &gp}, {"adam_m/", &gm}, {"adam_v/", &gv}})
        if (const std::string bad = first_non_finite((*g)[i].data(), {info[i].rows, info[i].cols}); !bad.empty())
          throw LocalFault("checkpoint at step " + std::to_string(st.step) + ": " + group + info[i].name + " has " + bad +
                           " ([row, col]); not written, " + path + " keeps the last complete checkpoint");
    std::vector<H5Tensor> t;
    for (size_t i = 0; i < info.size(); ++i) {
      t.push_back({"params/" + info[i].name, info[i].rows, info[i].cols, gp[i].data()});
      t.push_back({"adam_m/" + info[i].name, info[i].rows, info[i].cols, gm[i].data()});
      t.push_back({"adam_v/" + info[i].name, info[i].rows, info[i].cols, gv[i].data()});
    }
    h5_write_tensors(path, attrs, t);
  });
}

void save_checkpoint_parallel(const std::string& path, const Config& cfg, const ParamLayout& layout,
                              const StateShard& held, bool params_in_pieces, const float* params, const float* m,
                              const float* v, const TrainState& st, Topology& topo) {
  // What this rank writes: its pieces of every unit over the shard group (the run's own pieces
  // when the state is sharded; else the same cut of the whole buffers), of the tensors its tp rank
  // writes: tp rank 0 those every tp rank holds alike, a K/V head's first copy its columns.
  Comm& group = topo.host_shard();
  const StateShard write(layout, ShardLevel::optimizer, group.rank(), group.size());
  const int t_rank = topo.coord(Axis::tp);
  const auto& info = layout.tensors();
  const char* groups[3] = {"params/", "adam_m/", "adam_v/"};
  // params whole (flat) unless in pieces; the moments in the held pieces (flat when unsharded)
  const bool in_pieces[3] = {params_in_pieces, held.sharded(), held.sharded()};
  const float* arrays[3] = {params, m, v};
  std::vector<H5SharedTensor> tensors;
  int64_t bad = int64_t(3 * info.size());  // the first (tensor, group) with a non-finite value here
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const StateShard::Piece& w = write.pieces[u];
    for (size_t i = layout.units()[u].first; i < layout.units()[u].last; ++i) {
      const ParamInfo& p = info[i];
      const bool writes = (p.split != Split::replicated || t_rank == 0) && (p.copies == 1 || t_rank % p.copies == 0);
      const int64_t a = std::max(p.offset, w.lo), b = std::min(p.offset + p.loc_elems(), w.hi);
      for (int g = 0; g < 3; ++g) {
        H5SharedTensor t{groups[g] + p.name, p.rows, p.cols, {}};
        if (writes && a < b) {
          const float* d = arrays[g] + (in_pieces[g] ? held.pieces[u].at + (a - held.pieces[u].lo) : a);
          t.parts.push_back({p.row0, p.col0, p.loc_cols, a - p.offset, b - a, d});
          for (int64_t j = 0; j < b - a && bad == int64_t(3 * info.size()); ++j)
            if (!std::isfinite(d[j])) bad = int64_t(3 * i + size_t(g));
        }
        tensors.push_back(std::move(t));
      }
    }
  }
  // Never a NaN or Inf in a checkpoint (a resume would refuse it): the last complete one stays.
  topo.world().all_reduce(std::span<int64_t>(&bad, 1), ReduceOp::min);
  const H5Attrs attrs = checkpoint_attrs(cfg, st, topo);
  const void* world = mpi_comm_of(topo.world());
  run_then_agree(topo.world(), [&] {
    if (bad < int64_t(3 * info.size())) {
      if (topo.world().rank() != 0) return;
      throw LocalFault("checkpoint at step " + std::to_string(st.step) + ": " + groups[bad % 3] + info[size_t(bad / 3)].name +
                       " holds a non-finite value; not written, " + path + " keeps the last complete checkpoint");
    }
    h5_write_tensors_parallel(path, attrs, tensors, world);
  });
}

std::string check_checkpoint(const std::string& path, const Config& cfg, const ParamLayout& layout, int64_t* step) {
  try {
    H5TensorReader r(path);
    std::string kind;
    if (!r.attr_string("ctxpar_file", kind) || kind != "checkpoint")
      return "config: resume = '" + path + "' is not a ctxpar checkpoint (no attribute ctxpar_file = checkpoint); " +
             "valid: a file written by ctxpar train's checkpoint_every";
    // Training continues the data stream too; inference needs the model only.
    const bool stream = cfg.mode == Mode::train || cfg.bench == Bench::train;
    std::string was, now;  // every setting that differs, as the checkpoint has it and as this run has it
    bool stream_differs = false;
    for (const Field& f : config_fields()) {
      const int k = identity_key(f.name);
      if (k == 0 || (k == kStream && !stream)) continue;
      const std::string name(f.name), want = field_text(cfg, f);
      std::string got;
      if (!r.attr_string(name, got))
        return "config: resume = '" + path + "' does not record " + name + " (written by an earlier ctxpar, which " +
               "did not store every setting of the model); valid: a checkpoint written by this version";
      if (got == want) continue;
      was += (was.empty() ? "" : ", ") + name + " = " + quoted(got);
      now += (now.empty() ? "" : ", ") + name + " = " + quoted(want);
      stream_differs |= k == kStream;
    }
    if (!was.empty())
      return "config: resume = '" + path + "' was written with " + was + "; this run has " + now + "; valid: the " +
             "settings of the run that wrote it (" + (stream_differs ? "they define the model and the data stream a " +
             std::string("resumed run continues") : "they change the model's function") + ")";
    for (const ParamInfo& p : layout.tensors())
      for (const char* g : {"params/", "adam_m/", "adam_v/"}) {
        const auto got = r.shape(g + p.name);
        if (got != std::make_pair(p.rows, p.cols))
          return "config: resume = '" + path + "': tensor " + g + p.name +
                 (got.first < 0 ? std::string(" is missing or not 2-D")
                                : " has shape [" + std::to_string(got.first) + ", " + std::to_string(got.second) + "]") +
                 "; this model expects [" + std::to_string(p.rows) + ", " + std::to_string(p.cols) + "]";
      }
    int64_t s = 0, next = 0;
    if (!r.attr_int("step", s) || s < 0 || !r.attr_int("next_sample", next) || next < 0)
      return "config: resume = '" + path + "' has no valid step and next_sample attributes (whole numbers >= 0); "
             "valid: a checkpoint written by ctxpar train";
    if (step) *step = s;
  } catch (const UsageError& e) {
    return std::string("config: resume = ") + e.what();
  }
  return "";
}

std::string scan_checkpoint(const std::string& path, const ParamLayout& layout, int rank, int nranks) {
  // Every value finite: a NaN loaded would train (or generate) on NaN. Rank `rank` reads its
  // share of the tensors.
  int64_t i = 0;
  for (const ParamInfo& p : layout.tensors())
    for (const char* g : {"params/", "adam_m/", "adam_v/"})
      if (i++ % nranks == rank) {
        std::string bad;
        try {
          bad = first_non_finite(path, g + p.name);
        } catch (const std::exception& e) {
          return std::string("config: resume = '") + path + "': tensor " + g + p.name + " cannot be read: " + e.what();
        }
        if (!bad.empty())
          return "config: resume = '" + path + "': tensor " + g + p.name + " has " + bad +
                 " ([row, col]); valid: a checkpoint with finite values (an earlier one, or a fresh start)";
      }
  return "";
}

TrainState load_checkpoint(const std::string& path, const ParamLayout& layout, float* params, const StateShard& s,
                           bool params_in_pieces, float* m, float* v) {
  H5TensorReader r(path);
  std::vector<float> slice;  // a tensor's tp slice, when only part of it is this rank's
  const auto& units = layout.units();
  for (size_t u = 0; u < units.size(); ++u) {
    const StateShard::Piece& pc = s.pieces[u];
    for (size_t i = units[u].first; i < units[u].last; ++i) {
      const ParamInfo& p = layout.tensors()[i];
      const std::string name = "params/" + p.name;
      if (!params_in_pieces) r.read_block(name, p.row0, p.loc_rows, p.col0, p.loc_cols, params + p.offset);
      const int64_t a = std::max(p.offset, pc.lo), b = std::min(p.offset + p.loc_elems(), pc.hi);
      if (a >= b) continue;
      for (const auto& [group, dst] : {std::pair{"params/", params_in_pieces ? params : nullptr}, {"adam_m/", m},
                                       {"adam_v/", v}}) {
        if (!dst) continue;
        float* to = dst + pc.at + (a - pc.lo);
        if (b - a == p.loc_elems()) {  // the whole slice
          r.read_block(group + p.name, p.row0, p.loc_rows, p.col0, p.loc_cols, to);
          continue;
        }
        slice.resize(size_t(p.loc_elems()));
        r.read_block(group + p.name, p.row0, p.loc_rows, p.col0, p.loc_cols, slice.data());
        std::copy(slice.begin() + (a - p.offset), slice.begin() + (b - p.offset), to);
      }
    }
  }
  TrainState st;
  CTXPAR_CHECK(r.attr_int("step", st.step) && r.attr_int("next_sample", st.next_sample),
               "checkpoint " << path << " lacks step / next_sample");
  return st;
}

}  // namespace ctxpar
