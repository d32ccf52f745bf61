// The coverage audit of a training step: did the CP schedules compute every visible
// (query, key) pair of the batch, and each only once? Every attention call counts the visible
// pairs of the rows it was given, times its query heads (CpStats::attn_pair_heads); the
// transformer keeps them per layer (Transformer::attn_pair_heads); summed over every rank (CP,
// tp, dp) each attention layer's backward must equal the batch's visible pairs (causal, or the
// window's for a local layer) times H_q, and its forward the same (twice with remat, whose
// backward recomputes the forward). A schedule that drops a block, repeats one or hands a
// kernel the wrong rows fails it: the run ends INVALID naming the step and the layer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/settings.hpp"
#include "model/model.hpp"

namespace ctxpar {

// What a correct step computes, per layer l: [2l] forward (twice with remat), [2l + 1] backward
// pairs x heads, summed over every rank (0 for a Gated DeltaNet layer).
std::vector<double> coverage_expected(const ModelDims& d, double causal_pairs, double window_pairs, Remat remat);

// `got`: per layer l, [2l] forward and [2l + 1] backward pairs x heads, summed over every rank.
// `causal_pairs`, `window_pairs`: the visible pairs of the step's batches (summed over the dp
// replicas; model/flops.hpp). "" when every layer matches, else the first mismatch, in words.
std::string coverage_audit(const std::vector<double>& got, const ModelDims& d, double causal_pairs, double window_pairs,
                           Remat remat, int64_t step);

// An inference call's share of the same rule, over the layers at once: `news[b]` new rows of
// sequence b after its `olds[b]` cached ones, each seeing the cached keys and the new ones up to
// itself (a local layer the last d.window of them), times `heads` query heads (all tp ranks'),
// summed over the attention layers.
double infer_visible_pair_heads(const ModelDims& d, int64_t heads, const std::vector<int64_t>& news,
                                const std::vector<int64_t>& olds);
// The same for layer l alone (0 for a Gated DeltaNet layer): what Engine::audit holds each layer
// of a prefill, decode or chat call (and bench infer's) to.
double infer_layer_pair_heads(const ModelDims& d, int64_t heads, int64_t l, const std::vector<int64_t>& news,
                              const std::vector<int64_t>& olds);

}  // namespace ctxpar
