// Which keys a block of queries may see (causal / sliding window, bottom-right aligned), and the element mask for
// the boundary blocks. The causal flag arrives folded into window_right (params.h).
//   query i sees key j  iff  i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right,
//   0 <= j < seqlen_k,  a window side of -1 (or < 0) being unbounded.
#pragma once
#include <cmath>

#include "fa2/params.h"

namespace fa2 {

// Where one (batch element's) sequence lies: its first rows of q / out (q_row0) and of k / v (k_row0), and its
// lengths. Dense calls: rows 0 of the batch element (its offset is the batch stride) and the call's lengths; a varlen
// call (params.h): sequence b of the packed tensors, causal and windows aligned bottom-right over its own lengths.
struct SequenceBounds {
  int q_row0, k_row0, seqlen_q, seqlen_k;
};

// The bounds of sequence `batch` of a call with cu_seqlens (params.h): the backward's only varlen layout.
__device__ __forceinline__ SequenceBounds indexed_sequence_bounds(const AttentionParams& p, int batch) {
  const int q0 = __ldg(p.cu_seqlens_q + batch), q1 = __ldg(p.cu_seqlens_q + batch + 1);
  const int k0 = __ldg(p.cu_seqlens_k + batch);
  const int seqlen_k = p.seqused_k != nullptr ? __ldg(p.seqused_k + batch) : __ldg(p.cu_seqlens_k + batch + 1) - k0;
  return {q0, k0, q1 - q0, seqlen_k};
}

// The bounds of sequence `batch` in a forward call (kVarlen: from cu_seqlens / seqused_k, or, with kEvenlySpaced,
// evenly spaced; else the call's lengths, no loads). kEvenlySpaced: the sm_90a kernels (on the sm80 path's, near 255
// registers, the branch cost 24-108 B of spills: the glue gives those kernels index tensors, varlen_cuda.cpp).
template <bool kVarlen, bool kEvenlySpaced = false>
__device__ __forceinline__ SequenceBounds sequence_bounds(const AttentionParams& p, int batch) {
  if constexpr (kVarlen) {
    if (kEvenlySpaced && p.varlen_q_rows_each > 0) {  // evenly spaced (params.h)
      int seqlen_k = p.seqlen_k;
      if (p.seqused_k != nullptr) {  // clamp(used + added, 0, seqlen_k), clamped before the sum: it cannot wrap
        seqlen_k = min(max(__ldg(p.seqused_k + batch), -p.seqused_k_added), p.seqlen_k - p.seqused_k_added) +
                   p.seqused_k_added;
      }
      return {batch * p.varlen_q_rows_each, batch * p.varlen_k_rows_apart, p.varlen_q_rows_each, seqlen_k};
    }
    return indexed_sequence_bounds(p, batch);
  } else {
    return {0, 0, p.seqlen_q, p.seqlen_k};
  }
}

struct KeyBlockRange {
  int lo, hi;  // key blocks [lo, hi); empty when hi <= lo
  __device__ __forceinline__ bool empty() const { return hi <= lo; }
};

// The key blocks for which BlockInfo::needs_mask holds, as two thresholds (both of its right terms grow with the block
// index, its left term falls): needs_mask(n) == (n >= right_from || n < left_below). Two integers where the lengths
// and windows would take four: what the warp-specialized varlen producer holds through a tile's key blocks.
#if defined(__CUDACC__)
#define FA2_BLOCK_INFO_FN __host__ __device__ constexpr
#else
#define FA2_BLOCK_INFO_FN constexpr
#endif
struct MaskedKeyBlocks {
  int right_from, left_below;
  FA2_BLOCK_INFO_FN bool contains(int n) const { return n >= right_from || n < left_below; }
};
FA2_BLOCK_INFO_FN int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }  // (b > 0)
FA2_BLOCK_INFO_FN MaskedKeyBlocks masked_key_blocks(int seqlen_q, int seqlen_k, int window_left, int window_right,
                                                    int m0, int block_m, int block_n) {
  const int shift = seqlen_k - seqlen_q;
  // n block_n + block_n > seqlen_k  <=>  n >= floor(seqlen_k / block_n)  (seqlen_k >= 0)
  int right_from = seqlen_k / block_n;
  if (window_right >= 0) {  // n block_n + block_n - 1 > m0 + shift + window_right
    const int edge = floor_div(m0 + shift + window_right + 1, block_n);
    right_from = edge < right_from ? edge : right_from;
  }
  int left_below = -1;  // (no block: n >= 0)
  if (window_left >= 0) {  // n block_n < last_row + shift - window_left  <=>  n < ceil(that / block_n)
    const int last_row = (m0 + block_m < seqlen_q ? m0 + block_m : seqlen_q) - 1;
    left_below = -floor_div(-(last_row + shift - window_left), block_n);
  }
  return {right_from, left_below};
}

struct BlockInfo {
  int seqlen_q, seqlen_k, window_left, window_right;

  // Key blocks of size block_n that queries [m0, m0 + block_m) may see; blocks outside are never loaded.
  __device__ __forceinline__ KeyBlockRange key_blocks(int m0, int block_m, int block_n) const {
    const int last_row = min(m0 + block_m, seqlen_q) - 1;
    const int shift = seqlen_k - seqlen_q;
    int hi_key = seqlen_k;  // exclusive
    if (window_right >= 0) hi_key = min(hi_key, last_row + shift + window_right + 1);
    int lo_key = 0;
    if (window_left >= 0) lo_key = max(lo_key, m0 + shift - window_left);
    if (hi_key <= lo_key) return {0, 0};
    return {lo_key / block_n, (hi_key + block_n - 1) / block_n};
  }

  // Whether every block of queries sees some key: no window side set and keys present; then key_blocks is never
  // empty. (Causal sets window_right = 0: with seqlen_q > seqlen_k its first blocks may see none.)
  __device__ __forceinline__ bool every_block_sees_keys() const {
    return window_left < 0 && window_right < 0 && seqlen_k > 0;
  }

  // Whether key block n holds any element that some query of [m0, m0 + block_m) must not see (sequence tail,
  // causal diagonal, window edges). Conservative: a false answer means every (query, key) pair is visible.
  __device__ __forceinline__ bool needs_mask(int n, int block_n, int m0, int block_m) const {
    const int n0 = n * block_n;
    const int last_row = min(m0 + block_m, seqlen_q) - 1;
    const int shift = seqlen_k - seqlen_q;
    return n0 + block_n > seqlen_k ||
           (window_right >= 0 && n0 + block_n - 1 > m0 + shift + window_right) ||
           (window_left >= 0 && n0 < last_row + shift - window_left);
  }

  __device__ __forceinline__ MaskedKeyBlocks masked_blocks(int m0, int block_m, int block_n) const {
    return masked_key_blocks(seqlen_q, seqlen_k, window_left, window_right, m0, block_m, block_n);
  }

  // Visible keys [lo, hi] (inclusive) of query row `row`.
  __device__ __forceinline__ void key_range(int row, int& lo, int& hi) const {
    const int shift = seqlen_k - seqlen_q;
    lo = window_left >= 0 ? row + shift - window_left : 0;
    hi = window_right >= 0 ? min(seqlen_k - 1, row + shift + window_right) : seqlen_k - 1;
  }

  // Sets to -inf the invisible elements of a per-thread S fragment set s[mt][nt][4] (mma C layout), whose
  // element (mt, nt, r) sits at row row0 + 16 mt + 8 (r / 2), column col0 + 8 nt + r % 2.
  template <int kMTiles, int kNTiles>
  __device__ __forceinline__ void apply_mask(float (&s)[kMTiles][kNTiles][4], int row0, int col0) const {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        int lo, hi;
        key_range(row0 + mt * 16 + half * 8, lo, hi);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = col0 + nt * 8 + e;
            if (col < lo || col > hi) s[mt][nt][half * 2 + e] = -INFINITY;
          }
        }
      }
    }
  }
};

// (compile-time check of masked_key_blocks against needs_mask's terms, over small lengths, windows, rows and blocks)
constexpr bool masked_key_blocks_match() {
  for (int block_n : {16, 64}) {
    for (int seqlen_q = 1; seqlen_q <= 71; seqlen_q += 7) {
      for (int seqlen_k = 0; seqlen_k <= 150; seqlen_k += 11) {
        for (int window_left = -1; window_left <= 45; window_left += 23) {
          for (int window_right = -1; window_right <= 40; window_right += 9) {
            for (int m0 = 0; m0 < seqlen_q; m0 += 16) {
              const MaskedKeyBlocks blocks =
                  masked_key_blocks(seqlen_q, seqlen_k, window_left, window_right, m0, 16, block_n);
              const int last_row = (m0 + 16 < seqlen_q ? m0 + 16 : seqlen_q) - 1, shift = seqlen_k - seqlen_q;
              for (int n = 0; n * block_n < seqlen_k + block_n; ++n) {
                const int n0 = n * block_n;
                const bool masked = n0 + block_n > seqlen_k ||
                                    (window_right >= 0 && n0 + block_n - 1 > m0 + shift + window_right) ||
                                    (window_left >= 0 && n0 < last_row + shift - window_left);
                if (masked != blocks.contains(n)) return false;
              }
            }
          }
        }
      }
    }
  }
  return true;
}
static_assert(masked_key_blocks_match(), "masked_key_blocks: the key blocks needs_mask masks");

// Sequence `batch`'s BlockInfo (varlen: its lengths, bottom-right aligned over them; dense: the call's).
template <bool kVarlen, bool kEvenlySpaced = false>
__device__ __forceinline__ BlockInfo sequence_block_info(const AttentionParams& p, int batch) {
  const SequenceBounds seq = sequence_bounds<kVarlen, kEvenlySpaced>(p, batch);
  return BlockInfo{seq.seqlen_q, seq.seqlen_k, p.window_left, p.window_right};
}

}  // namespace fa2
