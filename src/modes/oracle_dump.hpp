// The oracle dump of `ctxpar train` (dump_init=PATH; tests/oracle checks it against PyTorch):
// the settings, the sample of every step, the losses, step 0's logits, and per step s the weights
// and AdamW moments before it and its gradients (after the sums over ranks), so that a reference
// can judge each step from ctxpar's own state: the loss and gradients from the weights before the
// step, the update from those weights, moments and gradients (tests/README.md, the oracle rule).
// HDF5 layout: steps/<s>/{params,adam_m,adam_v}/<tensor> for s = 0 .. n (n steps recorded: the
// state after the last one too), steps/<s>/grads/<tensor> for s < n; logits [S, vocab]; losses
// [1, steps]; tokens and doc_ids [steps * S]. Whole (global) tensors, gathered on world rank 0.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.hpp"

namespace ctxpar {

struct Config;
class Topology;
class TokenSource;

class OracleDump {
 public:
  // On when cfg.dump_init is set and the run starts at step 0; records cfg.dump_steps steps (0:
  // every step run).
  OracleDump(const Config& cfg, const ParamLayout& layout, Topology& topo, bool from_step0);
  bool on() const { return on_; }
  // Whether step s is recorded (its state before, its gradients, the state after).
  bool records(int64_t s) const { return on_ && (limit_ == 0 || s < limit_); }
  // The state before the next recorded step (host arrays of this rank's slices). Collective over tp.
  void state(const float* params, const float* m, const float* v);
  // The recorded step's gradients (host, this rank's slices, summed over ranks). Collective over tp.
  void gradients(const float* grads);
  // Step 0's logits, gathered whole (world rank 0; empty elsewhere).
  void logits(std::vector<float> rows) { logits_ = std::move(rows); }
  // Writes the file (world rank 0; every rank waits for it). `losses` of every step run.
  void write(const std::vector<double>& losses, const TokenSource& src);
  // Bytes rank 0 holds for a run of `steps` steps (the memory plan).
  static double gather_bytes(const Config& cfg, double global_param_bytes);

 private:
  struct State {
    std::vector<std::vector<float>> p, m, v, g;  // per tensor
  };
  const Config& cfg_;
  const ParamLayout& layout_;
  Topology& topo_;
  bool on_ = false;
  int64_t limit_ = 0;
  std::vector<State> steps_;
  std::vector<float> logits_;
};

}  // namespace ctxpar
