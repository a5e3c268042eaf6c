// The score-mod path's per-row statistics kernel (a step before the backward's main kernel).
#pragma once
#include <cstdint>
#include "fa2/block_info.cuh"
#include "fa2/bwd/bias_value.cuh"
#include "fa2/params.h"
#include "fa2/ptx.cuh"

namespace fa2 {
namespace bwd {

// The score-mod path's row statistics (softcap or bias). P = exp(s - lse) needs lse to ~1e-4, but a float32
// lse = m + log l of a row whose scores are huge (every key biased by finfo.min or -1e9: a padded query under a
// Hugging Face mask, uniform over its keys) rounds to m, and P would be 1 instead of 1/l; past float's range it is
// -inf. Such rows (|lse| > kLseExactLimit, or -inf) get m and l recomputed here, exactly, from q, K, the bias and
// the mask: row_shift = m, row_lse = log l, and the kernel takes P = exp(s - m - log l). Every other row:
// (row_shift, row_lse) = (0, lse). One warp per row; only heavy rows loop over their keys (O(seqlen_k * d) each,
// CUDA cores: fine for padded queries, slow if most rows of a long sequence are heavy).
constexpr float kLseExactLimit = 4096.f;  // float's spacing there is 5e-4: P keeps ~2^-11

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(256) bwd_row_stats_kernel(const __grid_constant__ AttentionParams p) {
  constexpr int kWarps = 8;
  static_assert(kHeadDim <= 32 * 8, "a lane holds 8 of the row's q elements");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh_row = int64_t(blockIdx.x) * kWarps + warp;  // (batch, head, query), query fastest
  if (bh_row >= int64_t(p.batch) * p.nheads * p.seqlen_q) return;  // no block barrier below
  const float lse = p.lse[bh_row];
  const bool inexact = lse == -INFINITY || (isfinite(lse) && fabsf(lse) > kLseExactLimit);
  if (!inexact) {
    if (lane == 0) {
      p.row_lse[bh_row] = lse;
      p.row_shift[bh_row] = 0.f;
    }
    return;
  }
  const int row = int(bh_row % p.seqlen_q);
  const int64_t bh = bh_row / p.seqlen_q;
  const int head = int(bh % p.nheads), batch = int(bh / p.nheads);
  // The warp walks the row's keys one at a time, each lane holding 8 consecutive dims of q and reading the same
  // 8 dims of the key (16-byte loads: the whole warp reads one key row at once).
  const bool lane_dims = lane * 8 < p.headdim;  // headdim is a multiple of 8 here (the glue pads)
  float q8[8];
  {
    const T* q = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
                 int64_t(row) * p.q_row_stride + lane * 8;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (lane_dims) raw = *reinterpret_cast<const uint4*>(q);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) q8[i] = ptx::to_float(e[i]);
  }
  const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride + (head / p.h_h_k_ratio) * p.k_head_stride +
               lane * 8;
  const void* bias_bh = bias_of_head(p, batch, head);
  const BlockInfo info{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};
  int key_lo = 0, key_hi = -1;
  info.key_range(row, key_lo, key_hi);
  key_lo = max(key_lo, 0);
  key_hi = min(key_hi, p.seqlen_k - 1);
  // -- the forward's score of each visible key (scale, softcap, bias; natural units), online max and sum. Every
  //    lane ends with the same values (the dot product is reduced over the warp).
  float m = -INFINITY, l = 0.f;
  for (int col = key_lo; col <= key_hi; ++col) {
    float qk = 0.f;
    if (lane_dims) {
      const uint4 raw = *reinterpret_cast<const uint4*>(k + int64_t(col) * p.k_row_stride);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < 8; ++i) qk += q8[i] * ptx::to_float(e[i]);
    }
    qk = ptx::warp_sum(qk);
    float x = p.softcap > 0.f ? p.softcap * tanhf(qk * (p.scale / p.softcap)) : qk * p.scale;
    if (bias_bh != nullptr) x += bias_value<T>(p, bias_bh, row, col);
    if (x == -INFINITY) continue;
    if (x > m) {
      l *= expf(m - x);  // m = -inf: l is 0 and stays 0
      m = x;
    }
    l += expf(x - m);
  }
  if (lane == 0) {
    const bool seen = m != -INFINITY && l > 0.f;
    p.row_shift[bh_row] = seen ? m : 0.f;
    p.row_lse[bh_row] = seen ? logf(l) : INFINITY;
  }
}

}  // namespace bwd
}  // namespace fa2
