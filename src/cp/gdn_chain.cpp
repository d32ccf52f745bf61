// GdnChain (gdn_cp.hpp): which rank holds which piece of the sequence.
#include "cp/gdn_cp.hpp"

#include <algorithm>
#include <span>
#include <stdexcept>
#include <string>

namespace ctxpar {

namespace {
void check_pieces(int n) {
  if (n < 1 || n > GdnChain::kMaxPieces)
    throw std::invalid_argument("GDN context parallelism: a chain of " + std::to_string(n) + " pieces (1.." +
                                std::to_string(GdnChain::kMaxPieces) + ")");
}
}  // namespace

GdnChain GdnChain::contiguous(int P) {
  check_pieces(P);
  GdnChain c;
  for (int q = 0; q < P; ++q) c.owner.push_back(q);
  return c;
}

GdnChain GdnChain::zigzag(int P) {
  check_pieces(2 * P);
  GdnChain c;
  for (int q = 0; q < 2 * P; ++q) c.owner.push_back(q < P ? q : 2 * P - 1 - q);
  return c;
}

std::vector<int> GdnChain::positions_of(int rank) const {
  std::vector<int> v;
  for (int q = 0; q < size(); ++q)
    if (owner[size_t(q)] == rank) v.push_back(q);
  return v;
}

}  // namespace ctxpar

namespace ctxpar {

namespace {
// + the receiving piece. The ranges of the ring schedule (gdn_ring.cpp): every exchange completes
// before the next one is posted, so the ranges may be shared.
constexpr int kTagHaloFwd = 1000, kTagHaloBwd = 9000;
}  // namespace

void chain_halo_fwd(Comm& comm, const GdnChain& chain, const std::vector<const float*>& tail, int64_t rows,
                    int64_t width, std::vector<std::vector<float>>& halo, CpStats* st) {
  const int r = comm.rank(), Q = chain.size();
  const std::vector<int> mine = chain.positions_of(r);
  const size_t n = size_t(rows * width);
  halo.assign(mine.size(), std::vector<float>(n, 0.0f));
  std::vector<Request> reqs;
  for (size_t j = 0; j < mine.size(); ++j) {
    const int q = mine[j];
    // receive the predecessor's tail
    if (q > 0 && chain.owner[size_t(q - 1)] != r)
      reqs.push_back(comm.send_recv_async(std::span<const float>(), Comm::kNone, std::span<float>(halo[j]),
                                          chain.owner[size_t(q - 1)], kTagHaloFwd + q));
    if (q > 0 && chain.owner[size_t(q - 1)] == r) std::copy(tail[j - 1], tail[j - 1] + n, halo[j].begin());
    // send this piece's tail to the successor
    if (q + 1 < Q && chain.owner[size_t(q + 1)] != r) {
      reqs.push_back(comm.send_recv_async(std::span<const float>(tail[j], n), chain.owner[size_t(q + 1)],
                                          std::span<float>(), Comm::kNone, kTagHaloFwd + q + 1));
      if (st) st->bytes_sent += double(n) * sizeof(float), st->messages += 1;
    }
  }
  const double t = comm.now();
  for (Request& rq : reqs) comm.wait(rq);
  if (st) st->exposed_comm_s += comm.now() - t;
}

void chain_halo_bwd(Comm& comm, const GdnChain& chain, const std::vector<float*>& dtail, int64_t rows, int64_t width,
                    const std::vector<std::vector<float>>& dhalo, CpStats* st) {
  const int r = comm.rank(), Q = chain.size();
  const std::vector<int> mine = chain.positions_of(r);
  const size_t n = size_t(rows * width);
  std::vector<std::vector<float>> in(mine.size());
  std::vector<Request> reqs;
  for (size_t j = 0; j < mine.size(); ++j) {
    const int q = mine[j];
    if (q + 1 < Q && chain.owner[size_t(q + 1)] != r) {
      in[j].resize(n);
      reqs.push_back(comm.send_recv_async(std::span<const float>(), Comm::kNone, std::span<float>(in[j]),
                                          chain.owner[size_t(q + 1)], kTagHaloBwd + q));
    }
    if (q > 0 && chain.owner[size_t(q - 1)] != r) {
      reqs.push_back(comm.send_recv_async(std::span<const float>(dhalo[j]), chain.owner[size_t(q - 1)],
                                          std::span<float>(), Comm::kNone, kTagHaloBwd + q - 1));
      if (st) st->bytes_sent += double(n) * sizeof(float), st->messages += 1;
    }
  }
  const double t = comm.now();
  for (Request& rq : reqs) comm.wait(rq);
  if (st) st->exposed_comm_s += comm.now() - t;
  for (size_t j = 0; j < mine.size(); ++j) {
    const int q = mine[j];
    if (q + 1 >= Q) continue;
    const float* g = chain.owner[size_t(q + 1)] == r ? dhalo[j + 1].data() : in[j].data();
    for (size_t e = 0; e < n; ++e) dtail[j][e] += g[e];
  }
}

}  // namespace ctxpar
