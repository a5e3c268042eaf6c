// The backward's step 1: D = rowsum(dO * O) and the zeroed accumulators (bwd_kernel.cuh's overview).
#pragma once
#include <cstdint>
#include "fa2/params.h"
#include "fa2/ptx.cuh"

namespace fa2 {
namespace bwd {

// Threads per (batch, query, head) row in the row-wise kernels: one per 16-byte chunk, rounded up to a power of 2.
template <int kHeadDim>
constexpr int row_group_threads() {
  constexpr int chunks = kHeadDim / 8;
  return chunks <= 4 ? 4 : chunks <= 8 ? 8 : chunks <= 16 ? 16 : 32;
}

// Zeroes `quads` 16-byte units from `base`, over the grid's threads.
__device__ __forceinline__ void zero_over_grid(void* base, int64_t quads, int threads) {
  const int64_t stride = int64_t(gridDim.x) * threads;
  for (int64_t i = int64_t(blockIdx.x) * threads + threadIdx.x; i < quads; i += stride) {
    reinterpret_cast<int4*>(base)[i] = make_int4(0, 0, 0, 0);
  }
}

// D = rowsum(dO * O) in fp32 over the headdim; zeroes the row's dq_accum (a varlen call's in whole blocks,
// p.varlen_dq_head_rows: the whole buffer, padding too, over the grid's threads). Rows are (batch, query, head), head
// fastest (the (b, s, h, d) layout's order).
// (a main kernel launched as its programmatic dependent may start once every CTA has begun: it waits for this grid's
// completion before it reads D or adds into dq_accum)
template <typename T, int kHeadDim, int kNThreads>
__global__ void __launch_bounds__(kNThreads) bwd_preprocess_kernel(const __grid_constant__ AttentionParams p) {
  ptx::launch_dependent_grids();
  constexpr int kGroup = row_group_threads<kHeadDim>(), kRowsPerCta = kNThreads / kGroup;
  const int64_t row_id = int64_t(blockIdx.x) * kRowsPerCta + threadIdx.x / kGroup;
  const int chunk = threadIdx.x % kGroup;
  const int64_t num_rows = int64_t(p.batch) * p.seqlen_q * p.nheads;
  // (the warp-specialized kernel's tail split's counts and fp32 dK, dV rows, params.h: bwd_tail_zero_ints ints, a
  // multiple of 4, 16-byte aligned, over the grid's threads)
  if (p.bwd_tail_counts != nullptr) zero_over_grid(p.bwd_tail_counts, p.bwd_tail_zero_ints / 4, kNThreads);
  if (p.varlen_dq_head_rows != 0) {
    zero_over_grid(p.dq_accum, int64_t(p.nheads) * p.varlen_dq_head_rows * (kHeadDim / 4), kNThreads);
  }
  float sum = 0.f;
  int64_t batch = 0, row = 0, head = 0;
  if (row_id < num_rows) {
    head = row_id % p.nheads;
    row = (row_id / p.nheads) % p.seqlen_q;
    batch = row_id / (int64_t(p.nheads) * p.seqlen_q);
    if (chunk * 8 < p.headdim) {
      const T* dout = static_cast<const T*>(p.dout) + batch * p.dout_batch_stride + row * p.dout_row_stride +
                      head * p.dout_head_stride + chunk * 8;
      const T* out = static_cast<const T*>(p.out) + batch * p.out_batch_stride + row * p.out_row_stride +
                     head * p.out_head_stride + chunk * 8;
      const uint4 a = *reinterpret_cast<const uint4*>(dout), b = *reinterpret_cast<const uint4*>(out);
      const T* ea = reinterpret_cast<const T*>(&a);
      const T* eb = reinterpret_cast<const T*>(&b);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += ptx::to_float(ea[i]) * ptx::to_float(eb[i]);
    }
  }
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (row_id < num_rows) {
    const int64_t bh_row = (batch * p.nheads + head) * p.seqlen_q + row;
    // (the main kernel's finished-CTA counts where the dQ conversion overlaps it: batch * nheads ints, fewer than
    // the grid's threads)
    if (p.key_blocks_done != nullptr && row_id < int64_t(p.batch) * p.nheads && chunk == 0) {
      p.key_blocks_done[row_id] = 0;
    }
    if (chunk == 0) p.softmax_d[bh_row] = sum;
    if (chunk < kHeadDim / 8 && p.varlen_dq_head_rows == 0) {
      float4* acc = reinterpret_cast<float4*>(p.dq_accum + bh_row * kHeadDim + chunk * 8);
      acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
      acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

}  // namespace bwd
}  // namespace fa2
