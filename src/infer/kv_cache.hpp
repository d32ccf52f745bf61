// The KV cache of inference, sharded over the N ranks of the CP group: the K/V of a prefill stay on
// the rank that computed them (the zigzag shard of that prefill, so the cache is load-balanced like
// the prefill), and each decode token's K/V goes to one rank, round-robin over the sequence's
// decode tokens (rank (decoded + b) mod N for sequence b). Every rank keeps the bookkeeping of all
// ranks (how many tokens each holds of each sequence): it is a function of the
// schedule, so no communication is needed to know the padded block sizes of pass-KV.
//
// Layout per layer l: K and V [rows][H_kv][D] (one array when shared: MLA's latent; post-RoPE
// keys), sequence b's slab of capacity(b) rows starting at first_row(b) (the capacities of the
// sequences before it), positions [rows] shared by all layers: one array per layer, so a decode
// call describes every sequence's keys at once (CpCall' k_doc_begin / k_doc_len). Each sequence
// has its own capacity on each rank (infer/schedule.hpp cache_capacity: a short prompt beside a
// long one takes its own rows, not the long one's, and a prompt placed whole on one rank takes
// none elsewhere), so a pass-KV key block padded to the rank holding most of a sequence can be
// longer than another rank's slab (the engine pads it there: capacity(b, r)). Unused slots hold
// K = V = 0 and position kNoPos, which no causal query sees, so a block padded up to the longest
// rank's length adds no visible pair.
// On a GPU (device = cuda) the K/V arrays live on the device in bf16 (the attention kernels' input
// type); the positions stay on the host, with a device copy that sync_positions() refreshes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attn_params.hpp"
#include "core/memory.hpp"

namespace ctxpar::infer {

// Position of an empty slot: larger than any query position, so causally invisible.
constexpr int64_t kNoPos = int64_t(1) << 60;

class KvCache {
 public:
  // `kinds` (model/model.hpp ModelDims::kinds): layers marked 'D' (Gated DeltaNet) hold no K/V and
  // get no arrays; empty = every layer attention.
  // `shared_kv`: keys and values are the same rows (MLA's latent, model/mla_layer.hpp): one array
  // per layer, v() the same memory as k().
  // `capacity[r][b]`: tokens of sequence b on rank r (N = its size; every rank's row the same
  // length, the batch); this rank (`rank`) allocates its own row.
  KvCache(const std::vector<std::vector<int64_t>>& capacity, int64_t layers, int32_t H_kv, int32_t D, int rank,
          const std::string& kinds = "", bool shared_kv = false, Device device = Device::cpu,
          Stream stream = nullptr);

  int64_t batch() const { return B_; }
  int64_t capacity(int64_t b, int r) const { return capacity_[size_t(r)][size_t(b)]; }
  int64_t capacity(int64_t b) const { return capacity(b, rank_); }
  const std::vector<std::vector<int64_t>>& capacities() const { return capacity_; }  // [rank][sequence]
  int64_t rows() const { return first_.back(); }  // every sequence's slab
  // Committed tokens of sequence b on CP rank r (any rank's, from the shared bookkeeping).
  int64_t len(int64_t b, int r) const { return len_[size_t(b * N_ + r)]; }
  int64_t len(int64_t b) const { return len(b, rank_); }
  int64_t seq_len(int64_t b) const;          // global context length of sequence b
  int64_t decoded(int64_t b) const { return decoded_[size_t(b)]; }
  // The rank that stores the next decode token of sequence b.
  int decode_target(int64_t b) const { return int((decoded_[size_t(b)] + b) % N_); }

  // Elements are `dtype()`: f32 on the CPU, bf16 on a GPU (elem_bytes() each).
  DType dtype() const { return device_ == Device::cpu ? DType::f32 : DType::bf16; }
  size_t elem_bytes() const { return dtype_bytes(dtype()); }
  Device device() const { return device_; }
  void* k(int64_t b, int64_t l) { return k_layer(l) + size_t(first_row(b)) * row_bytes(); }
  void* v(int64_t b, int64_t l) { return v_layer(l) + size_t(first_row(b)) * row_bytes(); }
  const int64_t* pos(int64_t b) const { return pos_.data() + first_row(b); }
  // The whole cache of layer l (rows() rows) and every sequence's positions.
  char* k_layer(int64_t l) { return reinterpret_cast<char*>(k_[size_t(l)].data()); }
  char* v_layer(int64_t l) { return reinterpret_cast<char*>((shared_ ? k_ : v_)[size_t(l)].data()); }
  const int64_t* pos_all() const { return pos_.data(); }
  // The positions on the cache's device (the host array itself on the CPU), as of the last
  // sync_positions() (call it after reserve, before an attention reads them).
  const int64_t* pos_all_device() const { return device_ == Device::cpu ? pos_.data() : pos_dev_.data(); }
  void sync_positions();
  int64_t first_row(int64_t b) const { return first_[size_t(b)]; }  // sequence b's slab in the layer arrays
  int64_t row_elems() const { return int64_t(H_kv_) * D_; }

  // Writes the positions of `n` new local tokens of sequence b after the committed ones and
  // returns their first slot; their K/V are written per layer by the caller; attention may use
  // len(b) + n rows from then on. Fatal when the capacity would be exceeded.
  int64_t reserve(int64_t b, int64_t n, const int64_t* positions);
  // Commits the reserved tokens: `added[r]` tokens of sequence b on every rank r (the same call
  // on every rank); `decode` counts them as one decode token for the round-robin. This rank's
  // reserved tokens past added[rank] (a prefill's padding rows, the last ones) are dropped: their
  // slots get position kNoPos again.
  void commit(int64_t b, const std::vector<int64_t>& added, bool decode);

  // Empties every sequence (a fresh cache of the same capacity).
  void clear();
  // The bookkeeping of the committed tokens; restore() drops everything committed after the
  // snapshot (benches repeat a prefill or decode on the same cached context).
  struct Snapshot {
    std::vector<int64_t> len, decoded;
  };
  Snapshot snapshot() const { return {len_, decoded_}; }
  void restore(const Snapshot& s);

  // Bytes of committed K/V (+ positions) on this rank, and bytes allocated.
  double used_bytes() const;
  double allocated_bytes() const;
  double token_bytes() const;  // per token: K and V (once when shared) of every attention layer, its position

 private:
  size_t row_bytes() const { return size_t(row_elems()) * elem_bytes(); }
  int64_t B_, L_;
  int64_t attn_layers_ = 0;  // layers with K/V (not Gated DeltaNet)
  bool shared_ = false;
  int32_t H_kv_, D_;
  int N_, rank_;
  Device device_ = Device::cpu;
  Stream stream_ = nullptr;
  std::vector<std::vector<int64_t>> capacity_;  // [N][B]
  std::vector<int64_t> first_;  // [B + 1]: sequence b's slab is rows [first_[b], first_[b + 1])
  std::vector<Buffer<std::byte>> k_, v_;  // per layer: [rows][H_kv][D] of dtype()
  Buffer<int64_t> pos_;               // [rows]
  Buffer<int64_t> pos_dev_;           // GPU: pos_'s device copy
  std::vector<int64_t> len_;          // [B][N]
  std::vector<int64_t> decoded_;      // [B]
  std::vector<int64_t> pending_;      // [B] reserved, not yet committed, on this rank
};

}  // namespace ctxpar::infer
