#include "cp/common.hpp"

#include <algorithm>
#include <cstring>
#include <span>
#include <stdexcept>

#include "core/error.hpp"
#include "model/flops.hpp"
#include "ops.hpp"
#include "shard/partition.hpp"

namespace ctxpar {

void CpStats::settle() {
  for (DeviceWait& w : device_waits) {
    exposed_comm_s += event_seconds(w.before, w.after, w.device);
    event_destroy(w.before, w.device);
    event_destroy(w.after, w.device);
    ++device_waits_timed;
  }
  device_waits.clear();
}

CpStats::~CpStats() {
  for (DeviceWait& w : device_waits) {  // never settled: released unread (the events may still be pending)
    event_destroy(w.before, w.device);
    event_destroy(w.after, w.device);
  }
}

}  // namespace ctxpar

namespace ctxpar::cp {

std::string check_common(const std::string& strategy, const CpCall& s, int P) {
  const std::string pre = strategy + ": ";
  if (s.H_q <= 0 || s.H_kv <= 0 || s.D <= 0)
    return pre + "heads, kv_heads and head_dim must be positive (got H_q=" + std::to_string(s.H_q) +
           ", H_kv=" + std::to_string(s.H_kv) + ", D=" + std::to_string(s.D) + ")";
  if (s.H_q % s.H_kv != 0)
    return pre + "heads H_q=" + std::to_string(s.H_q) + " is not a multiple of kv_heads H_kv=" +
           std::to_string(s.H_kv) + " (GQA groups must be whole); use a divisor of " + std::to_string(s.H_q);
  if (s.mask == MaskKind::window && s.window <= 0)
    return pre + "mask=window needs window > 0 (got " + std::to_string(s.window) + ")";
  if (!s.packed()) return pre + kPackedOnly;
  // Every strategy shards tokens zigzag over the CP group (see strategy files for why).
  const std::string part = Partition::check(PartitionKind::zigzag, s.S_q, P);
  if (!part.empty()) return pre + part;
  return "";
}

std::string refuse_latent(const std::string& strategy, const CpCall& s) {
  if (s.latent_width <= 0) return "";
  return strategy + ": attention = mla: every head's K and V are expanded from one latent shared by all heads (" +
         std::to_string(s.latent_width) + " values per token), so a split of the heads over ranks would have to move " +
         "the expanded K and V (" + std::to_string(2 * int64_t(s.H_kv) * s.D) + " values per token) instead; valid: " +
         "ring or allgather, which move the latent" + (s.mask == MaskKind::window ? ", or halo" : "");
}

void counted_fwd(const AttnParams& p, Tracer* tr, CpStats& st, int32_t step) {
  const int64_t pairs = visible_pairs(p);
  const double flops = attn_fwd_flops(double(pairs), p.H_q, p.D);
  const double t0 = tr ? tr->stamp() : 0;
  attn_fwd(p);
  st.count_attn(pairs, p.H_q, flops, false);
  if (tr) tr->add_span(Phase::attn_fwd, -1, step, t0, tr->stamp(), flops, 0);
}

void counted_bwd(const AttnParams& p, Tracer* tr, CpStats& st, int32_t step, void (*kernel)(const AttnParams&)) {
  const int64_t pairs = visible_pairs(p);
  const double flops = attn_bwd_flops(double(pairs), p.H_q, p.D);
  const double t0 = tr ? tr->stamp() : 0;
  kernel(p);
  st.count_attn(pairs, p.H_q, flops, true);
  if (tr) tr->add_span(Phase::attn_bwd, -1, step, t0, tr->stamp(), flops, 0);
}

void timed_wait(Comm& c, Request& r, CpStats& st, Tracer* tr, int32_t ring_step, double bytes) {
  if (!r.pending()) return;
  const double tb = tr ? tr->stamp() : 0;
  // A device transfer (a device backend's own request, not a forwarded host one): the compute
  // stream waits, timed by events around the wait (CpStats::settle), not by the host's clock.
  const bool on_device = c.device() >= 0 && r.via() == nullptr;
  if (on_device) {
    const Device d = Device::cuda;
    CpStats::DeviceWait w{event_record(c.compute_stream(), d), nullptr, d};
    c.stream_wait(r);
    w.after = event_record(c.compute_stream(), d);
    st.device_waits.push_back(w);
    if (tr) tr->add_span(Phase::comm_wait, -1, ring_step, tb, tr->stamp(), 0, bytes);
    return;
  }
  const double t0 = c.now();
  c.stream_wait(r);  // host buffers: wait()
  st.exposed_comm_s += c.now() - t0;
  if (tr) tr->add_span(Phase::comm_wait, -1, ring_step, tb, tr->stamp(), 0, bytes);
}

void timed_collective(Comm& c, CpStats& st, Tracer* tr, Phase ph, double bytes_sent,
                      const std::function<void()>& op, Device on) {
  const double tb = tr ? tr->stamp() : 0;
  if (on != Device::cpu) {
    CpStats::DeviceWait w{event_record(c.compute_stream(), on), nullptr, on};
    op();
    w.after = event_record(c.compute_stream(), on);
    st.device_waits.push_back(w);
    st.bytes_sent += bytes_sent;
    if (tr) tr->add_span(ph, -1, -1, tb, tr->stamp(), 0, bytes_sent);
    return;
  }
  const double t0 = c.now();
  op();
  st.exposed_comm_s += c.now() - t0;
  st.bytes_sent += bytes_sent;
  if (tr) tr->add_span(ph, -1, -1, tb, tr->stamp(), 0, bytes_sent);
}

namespace {
// The positions and document ids after the payload (`payload_end`), each section 64-byte aligned.
void place_meta(KvLayout& L, size_t payload_end) {
  L.pos_off = payload_end;
  L.doc_off = L.pos_off + (L.has_pos ? align64(size_t(L.S_k) * sizeof(int64_t)) : 0);
  L.bytes = L.doc_off + (L.has_doc ? align64(size_t(L.S_k) * sizeof(int32_t)) : 0);
}
}  // namespace

KvLayout kv_layout(int64_t S_k, int32_t H_kv, int32_t D, DType dtype, bool has_doc, bool has_pos, bool shared_kv) {
  KvLayout L;
  L.S_k = S_k;
  L.H_kv = H_kv;
  L.D = D;
  L.dtype = dtype;
  L.has_doc = has_doc;
  L.has_pos = has_pos;
  L.shared_kv = shared_kv;
  const size_t kv_bytes = L.kv_bytes();
  L.k_off = 0;
  L.v_off = shared_kv ? 0 : align64(kv_bytes);
  place_meta(L, L.v_off + align64(kv_bytes));
  return L;
}

KvLayout latent_layout(int64_t S_k, int32_t latent_width, bool has_doc, bool has_pos) {
  KvLayout L;
  L.S_k = S_k;
  L.has_doc = has_doc;
  L.has_pos = has_pos;
  L.latent_width = latent_width;
  L.k_off = L.v_off = 0;
  place_meta(L, align64(L.latent_bytes()));
  return L;
}

KvLayout key_layout(const CpCall& a) {
  const bool pos = a.k_pos_zigzag <= 0;
  if (a.expander) return latent_layout(a.S_k, a.latent_width, a.k_doc != nullptr, pos);
  return kv_layout(a.S_k, a.H_kv, a.D, a.dtype, a.k_doc != nullptr, pos, a.k == a.v);
}

std::vector<std::vector<int64_t>> derived_key_positions(const CpCall& a, int P, int rank) {
  std::vector<std::vector<int64_t>> all;
  if (a.k_pos_zigzag <= 0) return all;
  const Partition part(PartitionKind::zigzag, a.k_pos_zigzag, P);
  for (int j = 0; j < P; ++j) all.push_back(part.positions(j));
  const std::vector<int64_t>& mine = all[size_t(rank)];
  CTXPAR_CHECK(int64_t(mine.size()) == a.S_k && std::equal(mine.begin(), mine.end(), a.k_pos),
               "k_pos_zigzag = " << a.k_pos_zigzag << " but this rank's key positions are not its zigzag shard");
  return all;
}

void point_keys_at(const KvLayout& L, std::byte* base, CpCall& p) {
  p.S_k = L.S_k;
  if (L.latent_width == 0) {
    p.k = base + L.k_off;
    p.v = base + L.v_off;
  }
  if (L.has_pos) p.k_pos = reinterpret_cast<const int64_t*>(base + L.pos_off);
  p.k_doc = L.has_doc ? reinterpret_cast<const int32_t*>(base + L.doc_off) : nullptr;
}

void pack_kv(const KvLayout& L, const CpCall& p, std::byte* base) {
  const auto copy = [&](size_t off, const void* src, size_t bytes) { device_copy(base + off, src, bytes, p.device, p.stream); };
  if (L.latent_width > 0) {
    copy(L.k_off, p.latent, L.latent_bytes());
  } else {
    copy(L.k_off, p.k, L.kv_bytes());
    if (!L.shared_kv) copy(L.v_off, p.v, L.kv_bytes());
  }
  if (L.has_pos) copy(L.pos_off, p.k_pos, size_t(L.S_k) * sizeof(int64_t));
  if (L.has_doc) copy(L.doc_off, p.k_doc, size_t(L.S_k) * sizeof(int32_t));
}

std::string device_call_error(const std::string& strategy, const Comm& c, const CpCall& a) {
  const std::string pre = strategy + " on device = " + name_of(a.device) + ": ";
  if (c.size() > 1 && c.device() < 0)
    return pre + "the communicator '" + c.name() + "' (" + c.backend() + ") moves host buffers only; a device call " +
           "needs a device backend (nccl or mpi-staged: Topology::use_device_comms)";
  if (c.size() > 1 && c.compute_stream() != a.stream)
    return pre + "the call's stream is not the communicator's compute stream (Comm::set_compute_stream)";
  if (a.expander) return pre + "MLA's latent K/V (attention = mla) is CPU only so far";
  const bool by_pos = a.mask != MaskKind::none;
  if ((by_pos && (!a.q_pos_host || !a.k_pos_host)) || (a.q_doc && !a.q_doc_host) || (a.k_doc && !a.k_doc_host))
    return pre + "the host copies of the positions and document ids are missing (CpCall::q_pos_host, k_pos_host, "
                 "q_doc_host, k_doc_host)";
  return "";
}

void check_device_call(const std::string& strategy, const Comm& c, const CpCall& a) {
  const std::string e = device_call_error(strategy, c, a);
  if (!e.empty()) throw std::invalid_argument(e);
}

void GroupKeyRows::point(CpCall& p, int j0, int j1) const {
  const size_t at = size_t(j0) * size_t(S_k);
  p.S_k = int64_t(j1 - j0) * S_k;
  p.k_pos = pos.empty() ? nullptr : pos_dev.data() + at;
  p.k_pos_host = pos.empty() ? nullptr : pos.data() + at;
  p.k_doc = doc.empty() ? nullptr : doc_dev.data() + at;
  p.k_doc_host = doc.empty() ? nullptr : doc.data() + at;
}

GroupKeyRows group_key_rows(Comm& c, const CpCall& a, Tracer* tr, CpStats& st) {
  const int P = c.size(), r = c.rank();
  const size_t n = size_t(a.S_k);
  const CpCall h = a.host_rows();
  GroupKeyRows g;
  g.S_k = a.S_k;
  if (a.k_pos_zigzag > 0) {
    for (const std::vector<int64_t>& x : derived_key_positions(h, P, r)) g.pos.insert(g.pos.end(), x.begin(), x.end());
  } else if (h.k_pos) {
    g.pos.resize(n * size_t(P));
    timed_collective(c, st, tr, Phase::all_gather, double((P - 1) * n * sizeof(int64_t)),
                     [&] { c.all_gather(std::span<const int64_t>(h.k_pos, n), std::span<int64_t>(g.pos)); });
  }
  if (h.k_doc) {
    g.doc.resize(n * size_t(P));
    timed_collective(c, st, tr, Phase::all_gather, double((P - 1) * n * sizeof(int32_t)),
                     [&] { c.all_gather(std::span<const int32_t>(h.k_doc, n), std::span<int32_t>(g.doc)); });
  }
  g.pos_dev = to_device(g.pos, a.device, a.stream);
  g.doc_dev = to_device(g.doc, a.device, a.stream);
  return g;
}

int64_t progress_chunk_rows(int64_t S_q, int parts, Device device) {
  if (device != Device::cpu) return std::max<int64_t>(S_q, 1);
  // Whole query tiles of the CPU kernel (96 rows for D <= 128, 48 above; 64 for other
  // backends): a chunk boundary inside a tile would cost a partial tile per chunk.
  const int64_t tile = 192;
  int64_t c = (S_q + parts - 1) / std::max(parts, 1);
  c = (c + tile - 1) / tile * tile;
  return std::max<int64_t>(c, tile);
}

void fwd_chunked(const CpCall& p, int64_t chunk, bool merge, float* o_tmp, float* lse_tmp,
                 const std::function<void()>& between) {
  CTXPAR_CHECK(chunk > 0, "chunk rows must be positive");
  for (int64_t a = 0; a < p.S_q; a += chunk) {
    const int64_t n = std::min(chunk, p.S_q - a);
    CpCall c = p.query_rows(a, n);
    if (merge) {
      c.o = o_tmp;
      c.lse = lse_tmp;
      attn_fwd(c);
      lse_merge(p.o + a * p.H_q * p.D, p.lse + a * p.H_q, o_tmp, lse_tmp, n, p.H_q, p.D, p.device, p.stream);
    } else {
      attn_fwd(c);
    }
    if (between) between();
  }
}

void bwd_chunked(const CpCall& p, int64_t chunk, const std::function<void()>& between) {
  CTXPAR_CHECK(chunk > 0, "chunk rows must be positive");
  for (int64_t a = 0; a < p.S_q; a += chunk) {
    attn_bwd(p.query_rows(a, std::min(chunk, p.S_q - a)));
    if (between) between();
  }
}

}  // namespace ctxpar::cp
