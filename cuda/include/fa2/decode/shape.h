// A decode call's launch shape from its sizes alone: query rows per CTA, shared memory, and how many splits of the KV
// length it runs where the caller leaves that to the library (num_splits 0). Plain host C++, for the plan
// (decode_dispatch.cpp) and fa2.dev.plan("decode"), which shows it on a machine without a GPU.
#pragma once
#include <algorithm>
#include <cstdint>

#include "fa2/decode/tile_config.h"

namespace fa2 {
namespace decode {

// The CTAs of one split over a kv head's query rows (seqlen_q x nheads / nheads_k): row blocks of up to
// kMaxRowsPerCta, warps over a block's rows and the shared memory that takes. decline: more rows than kMaxRowBlocks
// blocks hold (the dense kernels' larger query tiles serve those better).
struct DecodeShape {
  const char* decline = nullptr;
  int row_blocks = 1, warps_m = 1, smem_bytes = 0;
};
inline DecodeShape decode_shape(int64_t rows_per_kv_head, int headdim_rounded) {
  DecodeShape shape;
  if (rows_per_kv_head > int64_t(kMaxRowsPerCta) * kMaxRowBlocks) {
    shape.decline = "more than 256 query rows per kv head (seqlen_q x nheads / nheads_k)";
    return shape;
  }
  shape.row_blocks = int((rows_per_kv_head + kMaxRowsPerCta - 1) / kMaxRowsPerCta);
  shape.warps_m = warps_m_for_rows(int(std::min<int64_t>(rows_per_kv_head, kMaxRowsPerCta)));
  shape.smem_bytes = decode_smem_bytes(headdim_rounded, shape.warps_m);
  return shape;
}

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
