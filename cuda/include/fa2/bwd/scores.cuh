// The sm80 path's scores to probabilities and dS (bwd_kernel.cuh): P from q.k and the row statistics, masked at
// the causal / window / sequence edges, and dS = P (dP - D), on the warp tiles of S and dP.
#pragma once
#include <cstdint>
#include <type_traits>
#include "fa2/block_info.cuh"
#include "fa2/bwd/bias_value.cuh"
#include "fa2/bwd/fragments.cuh"  // unpack2
#include "fa2/params.h"
#include "fa2/ptx.cuh"
#include "fa2/softmax.cuh"  // exp2_ftz

namespace fa2 {
namespace bwd {

constexpr float kLog2e = 1.4426950408889634f;

// In place: s (raw q.k) -> P, dp -> dS (w.r.t. q.k / scale, i.e. with the softcap chain rule applied).
// Fragment element (mt, nt, 2 half + e) is query row0 + 16 mt + 8 half, key col0 + 8 nt + e (global indices).
// dbias (when given) receives P (dP - D), the gradient w.r.t. the biased (post-softcap) score.
template <bool kScoreMod, typename B, int kMTiles, int kNTiles>
__device__ __forceinline__ void scores_to_p_ds(float (&s)[kMTiles][kNTiles][4], float (&dp)[kMTiles][kNTiles][4],
                                               const float (&lse2)[2 * kMTiles], const float (&dsum)[2 * kMTiles],
                                               const float* shift,  // this thread's row 0 (smem); + 16 mt + 8 half
                                               const AttentionParams& p, const B* bias, float* dbias,
                                               const BlockInfo& info, bool needs_mask, int row0, int col0) {
  const float scale_over_cap = p.softcap > 0.f ? p.scale / p.softcap : 0.f;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 2 + half;
      const int row = row0 + mt * 16 + half * 8;
      int key_lo = 0, key_hi = 0;
      if (needs_mask) info.key_range(row, key_lo, key_hi);
      const float row_shift = kScoreMod ? shift[mt * 16 + half * 8] : 0.f;  // see bwd_row_stats_kernel
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = col0 + nt * 8 + e;
          const float qk = s[mt][nt][half * 2 + e];
          float prob, dcap = 1.f;
          if constexpr (kScoreMod) {
            // -- recompute the forward's score: scale, softcap, bias (natural-log units)
            float x;
            if (p.softcap > 0.f) {
              const float t = tanhf(qk * scale_over_cap);
              x = p.softcap * t;
              dcap = 1.f - t * t;
            } else {
              x = qk * p.scale;
            }
            if constexpr (!std::is_same_v<B, NoBias>) {
              if (row < p.seqlen_q && col < p.seqlen_k) {
                x += bias_at(bias, p.bias_row_stride, p.bias_col_stride, row, col);
              }
            }
            prob = exp2_ftz(fmaf(x - row_shift, kLog2e, -lse2[r]));
          } else {
            prob = exp2_ftz(fmaf(qk, p.scale_log2, -lse2[r]));
          }
          // -- invisible keys (sequence tail, causal diagonal, window edges) get P = 0; rows with lse = +inf
          //    (no visible key, or past seqlen_q) already have P = 0
          if (needs_mask && (col < key_lo || col > key_hi)) prob = 0.f;
          const float ds = prob * (dp[mt][nt][half * 2 + e] - dsum[r]);
          if (dbias != nullptr && row < p.seqlen_q && col < p.seqlen_k) {
            dbias[int64_t(row) * p.seqlen_k + col] = ds;
          }
          s[mt][nt][half * 2 + e] = prob;
          dp[mt][nt][half * 2 + e] = ds * dcap;
        }
      }
    }
  }
}

// Plain path, step 1: s (raw q.k) -> P = exp2(q.k scale log2e - lse log2e), masked when kMask, packed to f16/bf16
// pairs (dS then uses the same rounded P that dV sees). Fragment element as in scores_to_p_ds.
template <typename T, bool kMask, int kMTiles, int kNTiles>
__device__ __forceinline__ void scores_to_p_packed(const float (&s)[kMTiles][kNTiles][4],
                                                   uint32_t (&p_packed)[kMTiles][kNTiles][2],
                                                   const float (&lse2)[2 * kMTiles], float scale_log2,
                                                   const BlockInfo& info, int row0, int col0) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 2 + half;
      int key_lo = 0, key_hi = 0;
      if constexpr (kMask) info.key_range(row0 + mt * 16 + half * 8, key_lo, key_hi);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        float prob[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          prob[e] = exp2_ftz(fmaf(s[mt][nt][half * 2 + e], scale_log2, -lse2[r]));
          if constexpr (kMask) {
            const int col = col0 + nt * 8 + e;
            if (col < key_lo || col > key_hi) prob[e] = 0.f;
          }
        }
        p_packed[mt][nt][half] = ptx::pack2<T>(prob[0], prob[1]);
      }
    }
  }
}

// Key-row bias path, step 1 (a bias with one value per key: padding masks; no softcap, no dbias): as
// scores_to_p_packed, with the forward's score x = q.k scale + bias[col] taken against the score-mod path's row
// statistics, P = exp2((x - shift) log2e - lse log2e) (lse2 = row_lse log2e; see bwd_row_stats_kernel). key_bias:
// this thread's first column of the key block's bias (fp32, shared memory; 0 past seqlen_k). Rows past seqlen_q
// (zero Q and dO, lse and shift 0) take no bias: P = 1 there as on the plain path, where exp(bias) could overflow.
template <typename T, bool kMask, int kMTiles, int kNTiles>
__device__ __forceinline__ void key_bias_scores_to_p_packed(const float (&s)[kMTiles][kNTiles][4],
                                                            uint32_t (&p_packed)[kMTiles][kNTiles][2],
                                                            const float (&lse2)[2 * kMTiles], const float* shift,
                                                            const float* key_bias, float scale, const BlockInfo& info,
                                                            int seqlen_q, int row0, int col0) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 2 + half, row = row0 + mt * 16 + half * 8;
      const float row_shift = shift[mt * 16 + half * 8];
      const bool row_in = row < seqlen_q;
      int key_lo = 0, key_hi = 0;
      if constexpr (kMask) info.key_range(row, key_lo, key_hi);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const float2 b = *reinterpret_cast<const float2*>(key_bias + nt * 8);
        float prob[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = s[mt][nt][half * 2 + e] * scale + (row_in ? (e == 0 ? b.x : b.y) : 0.f);
          prob[e] = exp2_ftz(fmaf(x - row_shift, kLog2e, -lse2[r]));
          if constexpr (kMask) {
            const int col = col0 + nt * 8 + e;
            if (col < key_lo || col > key_hi) prob[e] = 0.f;
          }
        }
        p_packed[mt][nt][half] = ptx::pack2<T>(prob[0], prob[1]);
      }
    }
  }
}

// Plain path, step 2: dp -> dS = P (dP - D) in place.
template <typename T, int kMTiles, int kNTiles>
__device__ __forceinline__ void dp_to_ds(float (&dp)[kMTiles][kNTiles][4],
                                         const uint32_t (&p_packed)[kMTiles][kNTiles][2],
                                         const float (&dsum)[2 * kMTiles]) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const float2 prob = unpack2<T>(p_packed[mt][nt][half]);
        dp[mt][nt][half * 2] = prob.x * (dp[mt][nt][half * 2] - dsum[mt * 2 + half]);
        dp[mt][nt][half * 2 + 1] = prob.y * (dp[mt][nt][half * 2 + 1] - dsum[mt * 2 + half]);
      }
}

}  // namespace bwd
}  // namespace fa2
