// cp.async loads of a swizzled (rows, headdim) tile: the sm80 path's producer (and sm_90a's with FA2_SM90_TMA=0).
#pragma once
#include <cstdint>

#include "fa2/ptx.cuh"

namespace fa2 {
namespace fwd {

// Starts the cp.async copy of a (kRows, kHeadDim) tile; rows >= rows_valid (when kCheckRows) and columns >= headdim
// become zeros. Threads form a (kNThreads / kThreadsPerRow, kThreadsPerRow) grid over (rows, 16-byte chunks) with
// kThreadsPerRow = the chunks of one swizzle block, so 8 consecutive lanes cover one 128-byte line (or two
// 64-byte rows): coalesced reads, conflict-free swizzled writes, and a thread's copies sit at compile-time smem
// offsets from one base (passes move by whole 8-row groups, which keeps the swizzle).
// The global pointer advances by a running sum so that no per-pass offset is hoisted out of the key loop.
template <typename Tile, int kRows, int kHeadDim, int kNThreads, bool kCheckRows, typename T>
__device__ __forceinline__ void load_tile_async(uint32_t smem, const T* gmem, int64_t row_stride, int rows_valid,
                                                int headdim, int tid) {
  constexpr int kThreadsPerRow = Tile::kChunksPerBlock;
  constexpr int kChunksPerRow = kHeadDim / 8;
  constexpr int kRowsPerPass = kNThreads / kThreadsPerRow;
  static_assert(kChunksPerRow % kThreadsPerRow == 0 && kRows % kRowsPerPass == 0 && kRowsPerPass % 8 == 0,
                "whole chunks per thread; passes of whole swizzle periods");
  const int row = tid / kThreadsPerRow, chunk = tid % kThreadsPerRow;
  const uint32_t dst = smem + Tile::offset(row, chunk) * 2;
  const T* src = gmem + row * row_stride + chunk * 8;
  const int64_t pass_stride = kRowsPerPass * row_stride;
#pragma unroll
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
#pragma unroll
    for (int j = 0; j < kChunksPerRow / kThreadsPerRow; ++j) {
      const bool pred =
          (!kCheckRows || row + i * kRowsPerPass < rows_valid) && (chunk + j * kThreadsPerRow) * 8 < headdim;
      ptx::cp_async_16(dst + Tile::const_bytes(i * kRowsPerPass, j * kThreadsPerRow),
                       pred ? src + j * kThreadsPerRow * 8 : gmem, pred);
    }
    src += pass_stride;
  }
}

}  // namespace fwd
}  // namespace fa2
