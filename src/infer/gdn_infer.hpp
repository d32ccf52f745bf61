// The Gated DeltaNet layers of a hybrid model in inference (model/gdn_layer.hpp is the layer).
// A sequence's GDN context is, per GDN layer, its recurrent state [H, Dv, Dk] and the short
// convolution's tail (the q|k|v projections of its last conv-1 tokens, [conv-1, C]); both live on
// the sequence's home rank, its decode owner (rank b / ceil(B/N), as Engine::decode places the
// sequence's dense work), and only there: decode then needs no communication for GDN layers.
//   prefill  the new tokens zigzag-sharded as the attention's (2N pieces of a GdnChain); the home
//            sends the stored state to the chain's head, the GDN schedule (gdn_schedule) carries
//            it along the chain, the chain's end sends the state after the last real token home.
//            The convolution's halos and the new tail come from one all-gather of every piece's
//            last conv-1 real rows (pieces may be shorter than the halo: a short prompt on many
//            ranks). Padding rows (positions past the prompt) get beta = 0 and g = 0, which leave
//            the state as it is. With exact numerics the recurrence runs instead as one call
//            over the whole prompt on every rank (whole_prompt): the chunks of one rank on any mesh.
//   decode   on the home rank: the convolution over the tail and the new token, one step of the
//            recurrence per head, the tail shifted by one.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/memory.hpp"
#include "cp/gdn_cp.hpp"
#include "model/layer.hpp"
#include "model/model.hpp"

namespace ctxpar {
class Comm;
class Partition;
}  // namespace ctxpar

namespace ctxpar::infer {

class GdnInfer {
 public:
  GdnInfer(const ModelDims& d, Comm& cp, int64_t batch);
  // The rank that holds sequence b's GDN context (its decode owner).
  int home(int64_t b) const { return int(b / Bq_); }
  // Forgets every sequence's context (a fresh cache).
  void clear();
  // x1 = x + mixer(x) for this rank's n rows of sequence b (the zigzag share `part` of its T new
  // tokens: pieces r and 2N-1-r, n/2 rows each), GDN layer number gl (0-based among GDN layers),
  // after `cached` earlier tokens whose context is stored (0: a fresh sequence). Every rank calls
  // it for every sequence of a prefill, in the same order.
  void prefill(const LayerRun& r, const LayerView& w, int64_t gl, int64_t b, int64_t cached, const Partition& part,
               int64_t n, const float* x, float* x1);
  // One decode token per row: row i of x (n rows) is sequence seqs[i], whose home is this rank.
  void decode(const LayerRun& r, const LayerView& w, int64_t gl, const std::vector<int64_t>& seqs, int64_t n,
              const float* x, float* x1);
  // Bytes held by the stored contexts on this rank.
  double used_bytes() const;

 private:
  void ensure(int64_t n);
  // src (on rank `from`) into dst (on rank `to`, sized already): a copy when they are one rank.
  void move_state(int from, int to, const std::vector<float>& src, std::vector<float>& dst, int tag);
  // The convolution over each row's tail (moved on by the row), the gates and one recurrence step
  // of sequences seqs[i] from their projections proj [n, C] and ab [n, 2H]; outputs o [n, H Dv].
  void step_rows(const LayerView& w, int64_t gl, const std::vector<int64_t>& seqs, int64_t n, const float* proj,
                 const float* ab, float* o);
  void decode_replicated(const LayerRun& r, const LayerView& w, int64_t gl, int64_t n, const float* x, float* x1);
  // The recurrence of sequence b's prompt along the chain of this prefill's pieces (gdn_schedule):
  // the stored state to the chain's head, the state after the prompt from its end home.
  void chain_prompt(const LayerRun& r, int64_t b, int64_t gl, int64_t cached, int64_t cs, int64_t n);
  // exact numerics (r.num->exact()): the recurrence of sequence b's T-token prompt as ONE gdn_fwd
  // call on every rank (the rows of q_, k_, v_, g_, beta_ all-gathered, the stored state
  // broadcast), so its chunks are those of one rank whatever the pieces; o_ gets this rank's rows,
  // the context's home the state after the prompt. Costs: every rank runs the whole recurrence.
  void whole_prompt(const LayerRun& r, int64_t b, int64_t gl, int64_t cached, int64_t T, int64_t cs, int64_t n);
  std::vector<float>& state(int64_t b, int64_t gl) { return S_[size_t(b * G_ + gl)]; }
  std::vector<float>& tail(int64_t b, int64_t gl) { return tail_[size_t(b * G_ + gl)]; }

  ModelDims d_;
  Comm& cp_;
  int64_t B_, Bq_, G_, C_;
  std::unique_ptr<GdnCp> sched_;
  std::vector<std::vector<float>> S_, tail_;  // [b * G + gl]; filled on home(b) only
  int64_t cap_ = 0;
  Buffer<float> h_, rstd_, proj_, pre_, q_, k_, v_, qinv_, kinv_, ab_, g_, beta_, o_, z_, on_, orstd_, y_;
};

}  // namespace ctxpar::infer
