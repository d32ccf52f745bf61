// Deterministic, platform-independent random numbers (splitmix64): the same seed gives the same
// data on every rank, mesh and standard library. Synthetic tensors are a function of the global
// token position, so a rank generates exactly its own shard and every mesh sees the same inputs.
#pragma once
#include <cstdint>
#include <span>

namespace ctxpar {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1) from a 64-bit key.
inline float uniform_pm1(uint64_t key) { return float(int64_t(splitmix64(key) >> 11) - (1ll << 52)) * float(1.0 / (1ll << 52)); }

// Row-major [rows, width] tensor whose row i is global row positions[i] of a synthetic tensor
// identified by (seed, tensor_id); values uniform in [-scale, scale).
inline void fill_rows(uint64_t seed, uint64_t tensor_id, std::span<const int64_t> positions, int64_t width,
                      float scale, float* out) {
  const uint64_t base = splitmix64(seed * 0x100000001b3ull + tensor_id);
  for (size_t i = 0; i < positions.size(); ++i)
    for (int64_t c = 0; c < width; ++c)
      out[int64_t(i) * width + c] = scale * uniform_pm1(base ^ (uint64_t(positions[i]) * uint64_t(width) + uint64_t(c)) * 0x9e3779b97f4a7c15ull);
}

}  // namespace ctxpar
