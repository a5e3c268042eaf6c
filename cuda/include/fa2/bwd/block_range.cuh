// The backward's per-key-block range: which query blocks see a key block (causal, windows).
#pragma once
#include <cstdint>

namespace fa2 {
namespace bwd {

// floor(a / b) for b > 0 and any sign of a.
__host__ __device__ __forceinline__ int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// Which query blocks a key block meets (the transpose of BlockInfo::key_blocks), bottom-right aligned:
//   query i sees key j  iff  i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right.
// Both ends are non-decreasing in the key block, so the key blocks that meet a query block are contiguous too.
struct QueryBlockRange {
  int seqlen_q, seqlen_k, window_left, window_right, block_m, block_n, num_m_blocks;

  // First query block that sees a key of key block n.
  __device__ __forceinline__ int lo(int n) const {
    if (window_right < 0) return 0;
    const int64_t first_row = int64_t(n) * block_n - (seqlen_k - seqlen_q) - window_right;
    return int(max(int64_t(0), floor_div(first_row, block_m)));
  }
  // Last query block that sees a key of key block n (may be < lo(n): the key block is seen by no query).
  __device__ __forceinline__ int hi(int n) const {
    if (window_left < 0) return num_m_blocks - 1;
    const int64_t last_key = min(int64_t(seqlen_k), int64_t(n + 1) * block_n) - 1;
    const int64_t last_row = last_key - (seqlen_k - seqlen_q) + window_left;
    return int(min(int64_t(num_m_blocks - 1), floor_div(last_row, block_m)));
  }
  // First key block that meets query block m (given that some key block does): the smallest n with hi(n) >= m.
  __device__ __forceinline__ int first_key_block(int m, int num_n_blocks) const {
    int a = 0, b = num_n_blocks - 1;
    while (a < b) {
      const int mid = (a + b) / 2;
      if (hi(mid) >= m) b = mid; else a = mid + 1;
    }
    return a;
  }
};

}  // namespace bwd
}  // namespace fa2
