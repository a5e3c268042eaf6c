// The warp-specialized backward's scores: P^T from the transposed scores S^T and the stage's row statistics (masked
// at the causal / window / sequence edges), and a consumer's register-A fragments of P^T or dS^T into shared memory
// for the products that read them from there.
#pragma once
#include <cstdint>

#include "fa2/block_info.cuh"
#include "fa2/bwd/scores.cuh"  // kLog2e
#include "fa2/params.h"
#include "fa2/softmax.cuh"  // exp2_ftz

namespace fa2 {
namespace bwd {

// A stage's row statistics as the consumers read them: the query block's row r at lse[r], dsum[r], shift[r]
// (ws_stats_offset values into each box, so read as single floats).
struct WsStats {
  const float* lse;
  const float* dsum;
  const float* shift;
};

// P^T from S^T in place, for one thread's fragments of the transposed scores (element (j, 2 half + e): key
// key_first + 8 half, query m0 + 8 j + 2 tig + e), rounded later: P = exp2(q.k scale log2e - lse log2e), or with a
// key-row bias (kKeyBias) exp2((q.k scale + bias[key] - shift) log2e - lse log2e) against bwd_row_stats_kernel's
// (shift, lse). kMasked: P = 0 for keys outside each query's range and for queries past seqlen_q (their lse and D are
// another row's; kVarlen: past info's, the sequence's, whose next rows are the next sequence's). stats: the stage's
// (WsStats).
template <bool kKeyBias, bool kMasked, bool kVarlen = false, int kSNTiles>
__device__ __forceinline__ void ws_scores_to_p(float (&s_frag)[kSNTiles][4], const WsStats& stats,
                                               const AttentionParams& p, const BlockInfo& info, int m0, int key_first,
                                               int tig, const float (&key_bias)[2]) {
#pragma unroll
  for (int j = 0; j < kSNTiles; ++j) {
    const int r = 8 * j + 2 * tig;
    const float lse2[2] = {stats.lse[r] * kLog2e, stats.lse[r + 1] * kLog2e};
    float2 shift = make_float2(0.f, 0.f);
    if constexpr (kKeyBias) shift = make_float2(stats.shift[r], stats.shift[r + 1]);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      int key_lo = 0, key_hi = 0;
      if constexpr (kMasked) {
        const int query = m0 + 8 * j + 2 * tig + e;
        info.key_range(query, key_lo, key_hi);
        if (query >= (kVarlen ? info.seqlen_q : p.seqlen_q)) key_hi = -1;  // (its lse and D are another row's: P = 0)
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float prob;
        if constexpr (kKeyBias) {
          const float x = fmaf(s_frag[j][half * 2 + e], p.scale, key_bias[half]);
          prob = exp2_ftz(fmaf(x - (e == 0 ? shift.x : shift.y), kLog2e, -lse2[e]));
        } else {
          prob = exp2_ftz(fmaf(s_frag[j][half * 2 + e], p.scale_log2, -lse2[e]));
        }
        if constexpr (kMasked) {
          const int key = key_first + 8 * half;
          if (key < key_lo || key > key_hi) prob = 0.f;
        }
        s_frag[j][half * 2 + e] = prob;
      }
    }
  }
}

// D of the queries past the sequence set to 0 in the stage: their rows there hold another row's D (dense: the next
// head's, varlen: the next sequence's), inf or NaN where that row's O or dO is, and dS = P (dP - D) with P = 0 is then
// 0 (dP - 0), not NaN. This thread's rows (8 j + 2 tig + e, every j, as ws_scores_to_p's and dS's), which it reads
// back itself later (the dsplit kernel's warpgroup 1 after its barrier: each warp of warpgroup 0 covers every row).
// Only where the block reaches past the sequence (queries_left: its queries inside it). The stage's next TMA load
// comes after the proxy fence each caller issues for its P^T / dS^T stores later in the step. (Q and dO past the
// sequence still meet P = 0 and dS = 0 in the products: an inf or NaN there reaches dV / dK, docs/design.md.)
template <int kSNTiles>
__device__ __forceinline__ void ws_zero_dsum_past_sequence(const WsStats& stats, int queries_left, int tig) {
  if (queries_left >= 8 * kSNTiles) return;
  float* const dsum = const_cast<float*>(stats.dsum);  // (the stage's, written before any read of these rows)
#pragma unroll
  for (int j = 0; j < kSNTiles; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = 8 * j + 2 * tig + e;
      if (r >= queries_left) dsum[r] = 0.f;
    }
}

// One thread's register-A fragments of P^T or dS^T (k16 step kt: keys key_first + 8 half, queries 16 kt + 8 e +
// 2 tig, + 1) into a (keys, queries) swizzled tile, for wgmma operands that read it from shared memory: one stmatrix
// .x4 per k16 step (its four 8x8 matrices are exactly the fragment's four registers: keys +0 / +8, queries +0 / +8;
// lanes 8 i .. 8 i + 7 give matrix i's row addresses), a quarter of the shared-memory instructions of 32-bit stores.
// (It takes the lane from threadIdx: key_first must be the warp's first row + lane / 4, as both kernels' key0 is.)
template <typename Tile, int kKSteps>
__device__ __forceinline__ void ws_store_a_fragments(uint32_t sTile, const uint32_t (&a)[kKSteps][4], int key_first) {
  const int lane = int(threadIdx.x) & 31, i = lane >> 3;
  const int row = key_first - (lane >> 2) + 8 * (i & 1) + (lane & 7);  // (key_first - group: the warp's 16 rows)
  const uint32_t lane_base = sTile + Tile::lane_bytes(row, i >> 1);
#pragma unroll
  for (int kt = 0; kt < kKSteps; ++kt) {
    const uint32_t addr = Tile::fragment_address(lane_base, 0, 2 * kt);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a[kt][0]),
                 "r"(a[kt][1]), "r"(a[kt][2]), "r"(a[kt][3])
                 : "memory");
  }
}

}  // namespace bwd
}  // namespace fa2
