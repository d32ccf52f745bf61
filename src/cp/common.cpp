#include "cp/common.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/error.hpp"
#include "ops.hpp"
#include "shard/partition.hpp"

namespace ctxpar::cp {

std::string check_common(const std::string& strategy, const AttnShape& s, int P) {
  const std::string pre = strategy + ": ";
  if (s.H_q <= 0 || s.H_kv <= 0 || s.D <= 0)
    return pre + "heads, kv_heads and head_dim must be positive (got H_q=" + std::to_string(s.H_q) +
           ", H_kv=" + std::to_string(s.H_kv) + ", D=" + std::to_string(s.D) + ")";
  if (s.H_q % s.H_kv != 0)
    return pre + "heads H_q=" + std::to_string(s.H_q) + " is not a multiple of kv_heads H_kv=" +
           std::to_string(s.H_kv) + " (GQA groups must be whole); use a divisor of " + std::to_string(s.H_q);
  if (s.mask == MaskKind::window && s.window <= 0)
    return pre + "mask=window needs window > 0 (got " + std::to_string(s.window) + ")";
  // Every strategy shards tokens zigzag over the CP group (see strategy files for why).
  const std::string part = Partition::check(PartitionKind::zigzag, s.S, P);
  if (!part.empty()) return pre + part;
  return "";
}

int64_t count_visible_pairs(int64_t S_q, const int64_t* q_pos, const int32_t* q_doc, int64_t S_k,
                            const int64_t* k_pos, const int32_t* k_doc, MaskKind mask, int64_t window) {
  if (S_q == 0 || S_k == 0) return 0;
  // A document id only matters when both sides carry one (as in AttnParams::visible).
  const bool docs = q_doc && k_doc;
  struct Key { int32_t doc; int64_t pos; };
  std::vector<Key> keys(static_cast<size_t>(S_k));
  for (int64_t j = 0; j < S_k; ++j)
    keys[size_t(j)] = {docs ? k_doc[j] : 0, mask == MaskKind::none ? 0 : k_pos[j]};
  auto less = [](const Key& a, const Key& b) { return a.doc != b.doc ? a.doc < b.doc : a.pos < b.pos; };
  std::sort(keys.begin(), keys.end(), less);
  int64_t pairs = 0;
  for (int64_t i = 0; i < S_q; ++i) {
    const int32_t d = docs ? q_doc[i] : 0;
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    if (mask != MaskKind::none) {
      hi = q_pos[i];
      if (mask == MaskKind::window) lo = q_pos[i] - window + 1;
    }
    if (lo > hi) continue;
    auto b = std::lower_bound(keys.begin(), keys.end(), Key{d, lo}, less);
    auto e = std::upper_bound(keys.begin(), keys.end(), Key{d, hi}, less);
    pairs += int64_t(e - b);
  }
  return pairs;
}

void timed_wait(Comm& c, Request& r, CpStats& st, Tracer* tr, int32_t ring_step, double bytes) {
  if (!r.pending()) return;
  const double tb = tr ? tr->now_us() : 0;
  const double t0 = c.now();
  c.wait(r);
  st.exposed_comm_s += c.now() - t0;
  if (tr) tr->add_span(Phase::comm_wait, -1, ring_step, tb, tr->now_us(), 0, bytes);
}

void timed_collective(Comm& c, CpStats& st, Tracer* tr, Phase ph, double bytes_sent,
                      const std::function<void()>& op) {
  const double tb = tr ? tr->now_us() : 0;
  const double t0 = c.now();
  op();
  st.exposed_comm_s += c.now() - t0;
  st.bytes_sent += bytes_sent;
  if (tr) tr->add_span(ph, -1, -1, tb, tr->now_us(), 0, bytes_sent);
}

namespace {
size_t align64(size_t x) { return (x + 63) & ~size_t(63); }
}  // namespace

KvLayout kv_layout(int64_t S_k, int32_t H_kv, int32_t D, bool has_doc) {
  KvLayout L;
  L.S_k = S_k;
  L.H_kv = H_kv;
  L.D = D;
  L.has_doc = has_doc;
  const size_t kv_bytes = L.kv_elems() * sizeof(float);
  L.k_off = 0;
  L.v_off = align64(kv_bytes);
  L.pos_off = L.v_off + align64(kv_bytes);
  L.doc_off = L.pos_off + align64(size_t(S_k) * sizeof(int64_t));
  L.bytes = L.doc_off + (has_doc ? align64(size_t(S_k) * sizeof(int32_t)) : 0);
  return L;
}

KvView kv_view(const KvLayout& L, std::byte* base) {
  return KvView{reinterpret_cast<float*>(base + L.k_off), reinterpret_cast<float*>(base + L.v_off),
                reinterpret_cast<int64_t*>(base + L.pos_off),
                L.has_doc ? reinterpret_cast<int32_t*>(base + L.doc_off) : nullptr};
}

void pack_kv(const KvLayout& L, const float* k, const float* v, const int64_t* pos, const int32_t* doc,
             std::byte* base) {
  KvView w = kv_view(L, base);
  std::copy_n(k, L.kv_elems(), w.k);
  std::copy_n(v, L.kv_elems(), w.v);
  std::copy_n(pos, L.S_k, w.pos);
  if (L.has_doc) std::copy_n(doc, L.S_k, w.doc);
}

int64_t progress_chunk_rows(int64_t S_q, int parts) {
  // Whole query tiles of the CPU kernel (96 rows for D <= 128, 48 above; 64 for other
  // backends): a chunk boundary inside a tile would cost a partial tile per chunk.
  const int64_t tile = 192;
  int64_t c = (S_q + parts - 1) / std::max(parts, 1);
  c = (c + tile - 1) / tile * tile;
  return std::max<int64_t>(c, tile);
}

namespace {
// The sub-call of `p` on query rows [a, a + n).
AttnParams rows(const AttnParams& p, int64_t a, int64_t n) {
  AttnParams c = p;
  const int64_t qoff = a * p.H_q * p.D;
  c.S_q = n;
  c.q = p.q + qoff;
  if (p.o) c.o = p.o + qoff;
  if (p.lse) c.lse = p.lse + a * p.H_q;
  if (p.dout) c.dout = p.dout + qoff;
  if (p.dq) c.dq = p.dq + qoff;
  if (p.q_pos) c.q_pos = p.q_pos + a;
  if (p.q_doc) c.q_doc = p.q_doc + a;
  return c;
}
}  // namespace

void fwd_chunked(const AttnParams& p, int64_t chunk, bool merge, float* o_tmp, float* lse_tmp,
                 const std::function<void()>& between) {
  CTXPAR_CHECK(chunk > 0, "chunk rows must be positive");
  for (int64_t a = 0; a < p.S_q; a += chunk) {
    const int64_t n = std::min(chunk, p.S_q - a);
    AttnParams c = rows(p, a, n);
    if (merge) {
      c.o = o_tmp;
      c.lse = lse_tmp;
      attn_fwd(c);
      lse_merge(p.o + a * p.H_q * p.D, p.lse + a * p.H_q, o_tmp, lse_tmp, n, p.H_q, p.D);
    } else {
      attn_fwd(c);
    }
    if (between) between();
  }
}

void bwd_chunked(const AttnParams& p, int64_t chunk, const std::function<void()>& between) {
  CTXPAR_CHECK(chunk > 0, "chunk rows must be positive");
  for (int64_t a = 0; a < p.S_q; a += chunk) {
    attn_bwd(rows(p, a, std::min(chunk, p.S_q - a)));
    if (between) between();
  }
}

}  // namespace ctxpar::cp
