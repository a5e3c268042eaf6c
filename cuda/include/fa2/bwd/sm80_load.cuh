// cp.async loads of the sm80 path (bwd_kernel.cuh): a (rows, d) tile of Q, dO, K or V into swizzled shared memory.
#pragma once
#include <cstdint>
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

}  // namespace bwd
}  // namespace fa2
