// Checkpoint and restart of `ctxpar train` (HDF5 via io/h5_checkpoint): global tensors by
// name — params/<name>, adam_m/<name>, adam_v/<name> — so the file does not depend on the tp
// split, plus attributes step (completed steps), next_sample (data position: the stream is a
// function of the sample index), and as text every setting that changes the model's function
// (shapes, layer pattern, window, RoPE, attention kind, MLA and GDN shapes, norms) or the data
// stream (seed, the only RNG state; seq, data, docs, ...): a resume compares them all; and
// written_by (the writer, the mesh and the shard level). PATH.partial is written (by rank 0, or
// by every rank with checkpoint_io = parallel) and renamed (io/atomic_file); every rank reads its
// own slices, or its pieces (model/state_shard.hpp), so any mesh and level resumes it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.hpp"
#include "model/state_shard.hpp"

namespace ctxpar {

struct Config;
class Topology;

// Global tensors of a flat per-rank buffer, assembled on world rank 0 (empty elsewhere).
// Collective over the tp axis of the ranks with dp = 0 and CP rank 0; others return at once.
std::vector<std::vector<float>> gather_global_tensors(const ParamLayout& layout, const float* local, Topology& topo);

struct TrainState {
  int64_t step = 0;         // completed optimizer steps
  int64_t next_sample = 0;  // index of the next sample of the data stream
};

// `m`, `v`: the whole layout's moments on the ranks that gather_global_tensors reads (dp 0, CP
// rank 0); sharded moments are first assembled there (gather_pieces).
void save_checkpoint(const std::string& path, const Config& cfg, const ParamLayout& layout, const float* params,
                     const float* m, const float* v, const TrainState& st, Topology& topo);
// The same file by the parallel writer (checkpoint_io = parallel, io/h5_checkpoint.hpp
// h5_write_tensors_parallel): no gather; every rank writes its pieces of each unit over the shard
// group (model/state_shard.hpp), tp rank 0 the tensors every tp rank holds alike. `params`: the
// whole flat weights, or (`params_in_pieces`: shard=params, or offload=params with a shard) this
// rank's pieces (`held`); `m`, `v`: the held pieces (the whole flat moments when unsharded). Host
// memory. Collective over every rank.
void save_checkpoint_parallel(const std::string& path, const Config& cfg, const ParamLayout& layout,
                              const StateShard& held, bool params_in_pieces, const float* params, const float* m,
                              const float* v, const TrainState& st, Topology& topo);
// "" when `path` is a checkpoint of this model (and, for training, of this data stream): its
// recorded settings and tensor shapes, no values read; else what is wrong; `step` (when given) receives the checkpoint's step.
std::string check_checkpoint(const std::string& path, const Config& cfg, const ParamLayout& layout,
                             int64_t* step = nullptr);
// "" when every value of the checkpoint is finite, else the first NaN/Inf with its tensor and
// index. Rank `rank` of `nranks` reads its share of the tensors (call on every rank, agree).
std::string scan_checkpoint(const std::string& path, const ParamLayout& layout, int rank, int nranks);
// Every rank reads its tp slice: the parameters whole (`params`, the flat layout) or, with
// `params_in_pieces`, its pieces of them (`params`, a shard buffer: model/state_shard.hpp); the
// AdamW moments of its pieces (`m`, `v`: shard buffers; null: not read). Padding stays as it was.
TrainState load_checkpoint(const std::string& path, const ParamLayout& layout, float* params, const StateShard& s,
                           bool params_in_pieces, float* m, float* v);

}  // namespace ctxpar
