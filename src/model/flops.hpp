// Model FLOPs of one training step (DESIGN.md §3 convention): matmul 2*m*n*k, forward + backward
// = 3x forward for the projections and the LM head; attention 4*H_q*D per visible (q, k) pair
// forward and 2.5x that backward. Causal attention on packed documents of lengths L_i has
// sum_i L_i (L_i + 1) / 2 visible pairs (the Σ L_i² rule with the causal half). Recompute is
// not counted: MFU measures useful work.
#pragma once
#include <cstdint>
#include <vector>

namespace ctxpar {

struct ModelDims;
class Comm;

// Visible causal pairs of one packed sequence.
double causal_visible_pairs(const std::vector<int64_t>& doc_lengths);
// Forward+backward FLOPs of the whole model (all tp slices): the projections and LM head of S
// tokens, and the attention of `visible_pairs` pairs; a step is the sum over its sequences.
double train_matmul_flops(const ModelDims& d, int64_t S);
double train_attn_flops(const ModelDims& d, double visible_pairs);

// Peak FLOP/s one rank reaches on large sgemm calls while every rank of `world` runs the same
// measurement (so ranks sharing cores see their share): best of a few 1024^3 products, the
// largest over ranks (conservative for MFU). Collective.
double measure_sgemm_peak_flops(Comm& world);

}  // namespace ctxpar
