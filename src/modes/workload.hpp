// The sharded attention workload of `ctxpar run` (and the shape checks shared with `attn` and
// `bench cp`): synthetic Q, K, V, dO generated per global token from the seed, sharded with the
// strategy's partition over the CP group; every dp/tp replica runs the same CP attention.
#pragma once
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/memory.hpp"
#include "cp/strategy.hpp"

namespace ctxpar {

struct Config;
class Topology;
class Comm;

// The configured attention problem: its shape (seq, heads, kv_heads, head_dim, mask, window),
// no tensors; `docs` says whether packed documents are configured. attention=mla (bench cp): every
// head of qk_nope + qk_rope dims, K/V from a latent of kv_lora + rope (latent_width).
CpCall attn_problem(const Config& cfg);
bool has_docs(const Config& cfg);

// "" when the configured strategy, partition, documents and shape fit the mesh.
std::string validate_workload(const Config& cfg, Topology& topo);

struct WorkloadPlan {
  std::string partition_name;
  std::unique_ptr<Partition> partition;
  int64_t S_loc_max = 0;
  double bytes_per_rank = 0;
  std::string memory_note;
  std::vector<std::pair<int64_t, int64_t>> ranges_of(int cp_rank) const { return partition->ranges(cp_rank); }
};
WorkloadPlan plan_workload(const Config& cfg, Topology& topo);

// Local tensors of this rank, generated from the seed.
struct Workload {
  CpCall problem;  // the global shape
  std::unique_ptr<CpStrategy> strategy;
  std::unique_ptr<Partition> partition;
  std::vector<int64_t> pos;
  std::vector<int32_t> doc;           // empty when no documents
  std::vector<int32_t> global_doc;    // document id of every global token (empty when none)
  Buffer<float> q, k, v, o, lse, dout, dq, dk, dv;
  CpCall local();  // this rank's shard, as the strategy's call
};
Workload make_workload(const Config& cfg, Topology& topo);

// Gathers a local [S_loc, width] tensor of every CP rank into global token order on CP rank 0
// (empty elsewhere).
std::vector<float> gather_rows_global(Comm& cp, const Partition& part, std::span<const float> local, int64_t width);
// The same for rows at any global positions `pos` (this rank's; a batch's placement): rank 0 gets
// the [S, width] rows in position order, rows at positions >= S (padding) left out.
std::vector<float> gather_rows_at(Comm& cp, std::span<const int64_t> pos, int64_t S, std::span<const float> local,
                                  int64_t width);

// Padding rows (any seq on any P, shard/partition.hpp) made inert. Document ids of rank r's rows:
// empty when neither documents nor the mask need them, else the global ids with -1 for the padding
// rows (under mask=none nothing else hides them from the real queries; 0 for real rows when there
// are no documents). clear_padding_rows zeroes the padding rows (a suffix of the local rows) of
// each [S_loc, width] tensor: zero inputs and a zero dO add nothing to any real row's result.
std::vector<int32_t> local_doc_ids(const Partition& part, int r, std::span<const int32_t> global_doc, MaskKind mask);
void clear_padding_rows(const Partition& part, int r, std::initializer_list<std::pair<float*, int64_t>> tensors);
// The same for rows at any positions `pos` of a layout of S real tokens (a batch's placement,
// shard/placement.hpp): rows at positions >= S are padding; `padded`: some rank of the layout has one.
std::vector<int32_t> doc_ids_at(std::span<const int64_t> pos, int64_t S, bool padded, std::span<const int32_t> global_doc,
                                MaskKind mask);
void clear_rows_at(std::span<const int64_t> pos, int64_t S, std::initializer_list<std::pair<float*, int64_t>> tensors);

// Visible pairs of the whole problem `shape` (positions 0..S-1, documents `global_doc` or none):
// the count model FLOPs are stated in, without the pairs of a partition's padding rows.
int64_t problem_visible_pairs(const CpCall& shape, std::span<const int32_t> global_doc);

// Synthetic tensor ids for fill_rows (core/random.hpp), shared by every mode and test.
enum SyntheticTensor : uint64_t { kTensorQ = 1, kTensorK = 2, kTensorV = 3, kTensorDout = 4 };

}  // namespace ctxpar
