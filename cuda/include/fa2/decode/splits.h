// How many splits of the KV length a decode call runs where the caller leaves it to the library (num_splits 0).
// Plain host C++ from shapes alone, so that fa2.dev.plan("decode") shows the choice on a machine without a GPU.
#pragma once
#include <algorithm>
#include <cstdint>

#include "fa2/decode/tile_config.h"

namespace fa2 {
namespace decode {

// The splits where `ctas` CTAs a split (batch x kv heads x row blocks) leave the GPU's CTA slots (SMs x the CTAs one
// SM holds by shared memory, at most kSplitCtasPerSm) short: the count with the least modelled time, waves x (key
// tiles of the longest split + kFixedTiles), in key tiles of the cache's capacity (a split runs whole tiles;
// kFixedTiles: a split's own cost, its pipeline fill, merge and partial rows), a larger count taken only for a 5%
// gain. requested > 0: that many, clamped to the capacity's key tiles and kMaxSplits. sm_count / smem_optin <= 0:
// unknown (108 SMs, one CTA an SM).
inline int choose_splits(int64_t ctas, int capacity, int block_n, int smem_bytes, int sm_count, int smem_optin,
                         int requested) {
  constexpr double kFixedTiles = 2.0;
  const int capacity_tiles = std::max(1, (capacity + block_n - 1) / block_n);
  const int cap = std::min(kMaxSplits, capacity_tiles);
  if (requested > 0) return std::min(requested, cap);
  const int per_sm = smem_optin > 0 ? std::clamp(smem_optin / smem_bytes, 1, kSplitCtasPerSm) : 1;
  const int64_t slots = int64_t(sm_count > 0 ? sm_count : 108) * per_sm;
  if (ctas >= slots) return 1;
  int best = 1;
  double best_cost = capacity_tiles + kFixedTiles;
  for (int s = 2; s <= cap; ++s) {
    const double cost = double((ctas * s + slots - 1) / slots) * ((capacity_tiles + s - 1) / s + kFixedTiles);
    if (cost < 0.95 * best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace decode
}  // namespace fa2
