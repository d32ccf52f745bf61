// Pieces shared by the CP strategies: the factories the registry lists, timed waits (exposed
// communication), the packed K/V message of the ring, and row-chunked kernel calls that let
// transfers progress while the kernel computes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attn_params.hpp"
#include "core/memory.hpp"
#include "cp/strategy.hpp"
#include "dist/comm.hpp"
#include "ops.hpp"
#include "trace/trace.hpp"

namespace ctxpar {

class Topology;

// One factory per strategy; registry.cpp lists them in one table.
std::unique_ptr<CpStrategy> make_allgather_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_ulysses_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_ring_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_usp_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_halo_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_pass_q_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_decode_pass_q_strategy(Topology& topo);
std::unique_ptr<CpStrategy> make_decode_allgather_strategy(Topology& topo);
// A strategy's other schedule (CpSchedule; its own registry row and file): what the plain
// strategy states of the problem (name, partition, validation, MLA latent, volumes) holds
// unchanged; the schedule brings its forward and backward, and keeps the plain strategy for the
// calls it does not serve.
class ScheduleOf : public CpStrategy {
 public:
  explicit ScheduleOf(std::unique_ptr<CpStrategy> plain) : plain_(std::move(plain)) {}
  std::string name() const override { return plain_->name(); }
  PartitionKind partition() const override { return plain_->partition(); }
  std::string validate(const CpCall& s, const Topology& topo) const override { return plain_->validate(s, topo); }
  bool moves_latent() const override { return plain_->moves_latent(); }
  double comm_volume_fwd(const CpCall& s, bool docs, const Topology& topo) const override {
    return plain_->comm_volume_fwd(s, docs, topo);
  }
  double buffer_bytes(const CpCall& s, bool docs, const Topology& topo) const override {
    return plain_->buffer_bytes(s, docs, topo);
  }

 protected:
  CpStrategy& plain() { return *plain_; }

 private:
  std::unique_ptr<CpStrategy> plain_;
};

// The other schedules' factories are declared in those schedules' own headers.

namespace cp {

// "" when the sequence can be zigzag-sharded over P ranks, the heads form groups and the inputs
// are packed, else a message naming the value and what would be valid. Shared by every
// strategy's validate().
std::string check_common(const std::string& strategy, const CpCall& global, int P);
// "" unless K/V come from an MLA latent (s.latent_width > 0), which a strategy that splits the
// heads over ranks (ulysses, usp) cannot move: the message says why and what would be valid.
std::string refuse_latent(const std::string& strategy, const CpCall& s);
// The strategies copy and send whole rows of q, k, v and dout: they take packed tensors.
inline constexpr const char* kPackedOnly =
    "takes packed q, k, v, dout (row strides 0); strided views are for single kernel calls (attn_fwd, attn_bwd)";

// One whole kernel call attn_fwd(p) (attn_bwd(p)): its FLOPs added to st.attn_flops and, with a
// tracer, a span of phase attn_fwd (attn_bwd) at ring step `step` (-1: none).
void counted_fwd(const AttnParams& p, Tracer* tr, CpStats& st, int32_t step);
// `kernel`: attn_bwd, or attn_bwd_exact (the exact dK/dV sums, kernels/ops.hpp).
void counted_bwd(const AttnParams& p, Tracer* tr, CpStats& st, int32_t step, void (*kernel)(const AttnParams&) = attn_bwd);

// Waits for `r` and books the blocked time as exposed communication (stats, and a comm_wait span
// with `ring_step` when a tracer is given).
void timed_wait(Comm& c, Request& r, CpStats& st, Tracer* tr, int32_t ring_step, double bytes);

// Runs a blocking collective `op` and books its whole duration as exposed (nothing overlaps a
// blocking collective) with phase `ph`. On device buffers (`on` = Device::cuda) the duration is
// the compute stream's, timed by events around it (CpStats::settle), not the host's.
void timed_collective(Comm& c, CpStats& st, Tracer* tr, Phase ph, double bytes_sent,
                      const std::function<void()>& op, Device on = Device::cpu);

// Sections of packed messages start on 64-byte boundaries.
constexpr size_t align64(size_t x) { return (x + 63) & ~size_t(63); }

// The packed message of a ring hop: the K and V rows of one block (element type `dtype`), their
// positions and (optionally) document ids, in one byte buffer (one message per hop). Sections
// start on 64-byte boundaries so the typed views are aligned.
// MLA (latent_width > 0): the message holds the block's latent rows [S_k, latent_width] (fp32)
// at k_off instead of K and V (CpCall::expander).
struct KvLayout {
  int64_t S_k = 0;
  int32_t H_kv = 0, D = 0;
  DType dtype = DType::f32;
  bool has_doc = false;
  bool has_pos = true;  // false: the receiver derives them (CpCall::k_pos_zigzag)
  bool shared_kv = false;  // keys and values are the same rows (k == v: MLA's latent cache): sent once
  int32_t latent_width = 0;
  size_t k_off = 0, v_off = 0, pos_off = 0, doc_off = 0, bytes = 0;
  size_t kv_bytes() const { return size_t(S_k) * size_t(H_kv) * size_t(D) * dtype_bytes(dtype); }
  size_t latent_bytes() const { return size_t(S_k) * size_t(latent_width) * sizeof(float); }
};
KvLayout kv_layout(int64_t S_k, int32_t H_kv, int32_t D, DType dtype, bool has_doc, bool has_pos = true,
                   bool shared_kv = false);
KvLayout latent_layout(int64_t S_k, int32_t latent_width, bool has_doc, bool has_pos = true);
// The message layout of the key side of the call `a`: the latent's when it has an expander;
// without positions when they are derivable (k_pos_zigzag); K once when v is the same memory.
KvLayout key_layout(const CpCall& a);
// The key positions of every rank of a group of P when `a` says they are derivable
// (k_pos_zigzag > 0; checked against this rank's own), else empty.
std::vector<std::vector<int64_t>> derived_key_positions(const CpCall& a, int P, int rank);

// The key side of `p` pointed at a packed block at `base` (k_pos unless derived, k_doc, S_k; k and v
// unless the block is a latent, whose rows latent_at() gives).
void point_keys_at(const KvLayout& L, std::byte* base, CpCall& p);
inline const float* latent_at(const KvLayout& L, const std::byte* base) {
  return reinterpret_cast<const float*>(base + L.k_off);
}
// Packs the key side of `p` (k, v or the latent; k_pos, k_doc of L.S_k rows) into `base`, on the
// call's device.
void pack_kv(const KvLayout& L, const CpCall& p, std::byte* base);

// ---- calls on a device (CpCall::device other than the CPU) ----
// "" when the strategy `strategy` can run the call `a` on its device over `c`, else what is wrong:
// the communicator must move device buffers (a device backend, Topology::use_device_comms) with
// the call's stream as its compute stream, the host copies of positions and document ids must be
// given (CpCall::q_pos_host ...), and MLA's latent is CPU only so far (so are the schedules
// other than plain: they refuse device calls themselves).
std::string device_call_error(const std::string& strategy, const Comm& c, const CpCall& a);
// Throws std::invalid_argument with device_call_error's message, if any.
void check_device_call(const std::string& strategy, const Comm& c, const CpCall& a);

// A copy of n host elements on `device` (ordered on `stream`; the host array may be released at once).
template <class T> Buffer<T> to_device(const T* host, size_t n, Device device, Stream stream) {
  Buffer<T> d(n, false, device, stream);
  if (n) copy_to_device(d.data(), host, n * sizeof(T), device, stream);
  return d;
}
template <class T> Buffer<T> to_device(const std::vector<T>& host, Device device, Stream stream) {
  return to_device(host.data(), host.size(), device, stream);
}

// Every rank's key positions and document ids, on the host (to count and plan) and on the call's
// device (for the kernels), so that a device call's messages carry K and V only: positions derived
// where a.k_pos_zigzag says they are the zigzag shards, else all-gathered on the host with the
// document ids (a device backend hands host buffers to its host communicator), then one upload.
struct GroupKeyRows {
  int64_t S_k = 0;            // rows per rank
  std::vector<int64_t> pos;   // [P * S_k] (host)
  std::vector<int32_t> doc;   // [P * S_k] (host); empty without document ids
  Buffer<int64_t> pos_dev;    // the same on the call's device
  Buffer<int32_t> doc_dev;
  // Points the key side's positions and document ids of `p` (device and host) at ranks [j0, j1).
  void point(CpCall& p, int j0, int j1) const;
};
GroupKeyRows group_key_rows(Comm& c, const CpCall& a, Tracer* tr, CpStats& st);

// Query rows per kernel call while a transfer is in flight: OpenMPI moves a large message only
// inside MPI calls, so the block's compute is split into row chunks and the pending requests
// are tested between chunks. About `parts` chunks, each a multiple of 192 rows (whole kernel tiles).
// A device call (`device` other than the CPU) gets one chunk, the whole block: its kernels run
// asynchronously, so test() calls between launches would not fall inside the compute; its
// transfers progress on the communication stream (NCCL) or while the host waits (staged).
int64_t progress_chunk_rows(int64_t S_q, int parts, Device device = Device::cpu);

// Calls attn_fwd (or attn_bwd) on `p` for consecutive chunks of `chunk` query rows
// (CpCall::query_rows), calling `between()` after each chunk. Forward with `merge`: the chunk's (o, lse) are
// computed into the scratch `o_tmp`/`lse_tmp` (chunk rows) and lse-merged into p.o / p.lse.
void fwd_chunked(const CpCall& p, int64_t chunk, bool merge, float* o_tmp, float* lse_tmp,
                 const std::function<void()>& between);
void bwd_chunked(const CpCall& p, int64_t chunk, const std::function<void()>& between);

}  // namespace cp
}  // namespace ctxpar
