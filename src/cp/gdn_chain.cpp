// GdnChain (gdn_cp.hpp): which rank holds which piece of the sequence.
#include "cp/gdn_cp.hpp"

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
