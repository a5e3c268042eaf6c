// bwd_kernel's producer (cp.async, every thread): a (rows, d) tile of Q, dO, K or V into swizzled shared memory, and a
// query block's Q, dO and row statistics into a stage of SharedStorage. Paged loads go here.
#pragma once
#include <cstdint>
#include "fa2/bwd/bias_value.cuh"
#include "fa2/bwd/shared_storage.cuh"
#include "fa2/bwd_ptx.cuh"  // cp_async_4
#include "fa2/params.h"
#include "fa2/ptx.cuh"

namespace fa2 {
namespace bwd {

// Starts the cp.async copy of a (kRows, kHeadDim) tile; rows >= rows_valid and columns >= headdim become zeros.
// Each thread copies chunk (tid % per-row, + whole column blocks) of rows tid / per-row + whole passes, so every
// copy is one base plus constants (passes move by whole 8-row groups, which keeps the swizzle).
template <typename Tile, int kRows, int kHeadDim, int kNThreads, typename T>
__device__ __forceinline__ void load_tile(uint32_t smem, const T* gmem, int64_t row_stride, int rows_valid,
                                          int headdim, int tid) {
  constexpr int kThreadsPerRow = Tile::kChunksPerBlock;  // one swizzle line (column block row) per pass
  constexpr int kRowsPerPass = kNThreads / kThreadsPerRow;
  constexpr int kLineBytes = Tile::kChunksPerBlock * 16;
  static_assert(kHeadDim / 8 % kThreadsPerRow == 0 && kRows % kRowsPerPass == 0 && kRowsPerPass % 8 == 0,
                "whole column blocks per thread; passes of whole swizzle periods");
  const int row = tid / kThreadsPerRow, chunk = tid % kThreadsPerRow;
  const uint32_t dst = smem + Tile::offset(row, chunk) * 2;
  const T* src = gmem + row * row_stride + chunk * 8;
#pragma unroll
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
#pragma unroll
    for (int j = 0; j < kHeadDim / 8 / kThreadsPerRow; ++j) {
      const bool pred = row + i * kRowsPerPass < rows_valid && (chunk + j * kThreadsPerRow) * 8 < headdim;
      ptx::cp_async_16(dst + i * kRowsPerPass * kLineBytes + j * (kRows * kLineBytes),
                       pred ? src + i * kRowsPerPass * row_stride + j * kThreadsPerRow * 8 : gmem, pred);
    }
  }
}


// A query block's Q, dO (kBlockM, d) and its rows' lse, D (and with kRowStats the row shift) into stage buf: q, dout
// at the (batch, head)'s first query; lse, dsum_g, shift_g at its first row. kVarlen: rows past the sequence's
// varlen_seqlen_q read zeros (dense calls: past p.seqlen_q).
template <typename T, typename Cfg, bool kRowStats, bool kVarlen = false>
struct Sm80QueryBlockLoader {
  static constexpr int kBlockM = Cfg::kBlockM, kHeadDim = Cfg::kHeadDim, kNThreads = Cfg::kNThreads;
  using QTile = SwizzledTile<kBlockM, kHeadDim, Cfg::kSmemBlockColsD>;  // Q, dO: (kBlockM, d)
  static_assert(2 * kBlockM <= kNThreads, "one 4-byte copy per thread (two for the score-mod path's shift)");
  const AttentionParams& p;
  const SharedStorageView<Cfg>& shared;
  const T* q;
  const T* dout;
  const float* lse;
  const float* dsum_g;
  const float* shift_g;
  int headdim, tid;
  int varlen_seqlen_q = 0;

  // (read where used: a dense call's from the params each time, as before the varlen kernels existed)
  __device__ __forceinline__ int seqlen_q() const { return kVarlen ? varlen_seqlen_q : p.seqlen_q; }

  __device__ __forceinline__ void operator()(int m, int buf) const {
    const int m0 = m * kBlockM, rows = seqlen_q() - m0;
    load_tile<QTile, kBlockM, kHeadDim, kNThreads>(shared.q(buf), q + int64_t(m0) * p.q_row_stride, p.q_row_stride,
                                                   rows, headdim, tid);
    load_tile<QTile, kBlockM, kHeadDim, kNThreads>(shared.dout(buf), dout + int64_t(m0) * p.dout_row_stride,
                                                   p.dout_row_stride, rows, headdim, tid);
    // lse, D (and the score-mod path's shift) of the block's rows (4-byte copies: lse rows need not be 16-byte
    // aligned; threads 0 .. 2 kBlockM - 1 copy lse, then D: SharedStorage::Stats). Rows past seqlen_q read 0: their Q
    // and dO are zero-filled, so P there is 1 against dO = 0 and dS = 1 * (0 - 0): no contribution.
    if (tid < 2 * kBlockM) {
      const int row = tid % kBlockM;
      const float* src = (tid < kBlockM ? lse : dsum_g) + m0 + row;
      ptx::cp_async_4(shared.stats(buf) + tid * 4, m0 + row < seqlen_q() ? src : lse, m0 + row < seqlen_q());
    }
    if (kRowStats && tid < kBlockM) {
      ptx::cp_async_4(shared.stats(buf) + (2 * kBlockM + tid) * 4, m0 + tid < seqlen_q() ? shift_g + m0 + tid : lse,
                      m0 + tid < seqlen_q());
    }
  }
};


// The key-row bias variant's key block bias (kBlockN fp32, 0 past seqlen_k) into shared memory, read by every
// iteration after its block barrier; a CTA barrier. Returns whether every key of the block is padded (-inf / False, or
// past seqlen_k): its CTA then skips the query blocks (dK = dV = 0, nothing added to dQ).
template <typename T, typename Cfg>
__device__ __forceinline__ bool stage_key_bias(const AttentionParams& p, const SharedStorageView<Cfg>& shared,
                                               const void* bias_bh, int n0, int tid) {
  static_assert(Cfg::kBlockN <= Cfg::kNThreads, "one key per thread");
  bool padded = true;
  if (tid < Cfg::kBlockN) {
    const bool in_range = n0 + tid < p.seqlen_k;
    const float b = in_range ? bias_value<T>(p, bias_bh, 0, n0 + tid) : 0.f;
    shared.template at<float>(shared.key_bias())[tid] = b;
    padded = !in_range || b == -INFINITY;
  }
  return __syncthreads_and(padded);
}

}  // namespace bwd
}  // namespace fa2
