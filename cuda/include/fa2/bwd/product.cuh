// The sm80-path products of bwd_kernel.cuh: a warp's mma.sync GEMM over swizzled shared memory (ldmatrix), or on
// sm_90a the same product as its warpgroup's wgmma.
#pragma once
#include <cstdint>
#include "fa2/ptx.cuh"
#include "fa2/sm90/wgmma.cuh"  // only instantiated by sm_90a instances

namespace fa2 {
namespace bwd {

template <typename Tile>
struct TileGeometry;
template <int kRows, int kCols, int kBlockCols>
struct TileGeometry<SwizzledTile<kRows, kCols, kBlockCols>> {
  static constexpr int kBlockBytes = kRows * kBlockCols * 2;  // one column block
};

// acc (kMTiles, kNTiles) += A B^T over kKSteps k16 steps, both operands by ldmatrix from swizzled smem:
//   A: rows a_m0.. of an (M, K) tile, or (kATrans) columns a_m0.. of a (K, M) tile;
//   B: rows b_n0.. of an (N, K) tile, or (kBTrans) columns b_n0.. of a (K, N) tile.
// Addresses: one swizzled base per thread (per m/n tile when the tile's runtime offset lands in the chunk index);
// every other step is base ^ (chunk bits, a constant) + (rows, column block: a constant), so the unrolled loops
// keep a handful of address registers instead of one per ldmatrix.
template <typename T, int kMTiles, int kNTiles, int kKSteps, bool kATrans, bool kBTrans, typename ATile,
          typename BTile>
__device__ __forceinline__ void warp_gemm(float (&acc)[kMTiles][kNTiles][4], uint32_t sA, int a_m0, uint32_t sB,
                                          int b_n0, int lane) {
  static_assert(kNTiles % 2 == 0, "B fragments are loaded for pairs of n8 tiles");
  constexpr int kALine = ATile::kChunksPerBlock * 16, kBLine = BTile::kChunksPerBlock * 16;  // bytes per row
  constexpr int kABlockBytes = TileGeometry<ATile>::kBlockBytes, kBBlockBytes = TileGeometry<BTile>::kBlockBytes;
  // Chunk c (even) of a row relative to chunk 0 (or 1): XOR inside the swizzle line, then whole column blocks.
  auto a_k = [](int c) { return (c % ATile::kChunksPerBlock) * 16; };
  auto b_k = [](int c) { return (c % BTile::kChunksPerBlock) * 16; };

  // Byte offsets inside the tiles (the XOR works on offsets, so the tile bases need no particular alignment).
  uint32_t a_off[kATrans ? kMTiles : 1], b_off[kBTrans ? kNTiles / 2 : 1];
  if constexpr (kATrans) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
      a_off[mt] = ATile::offset(((lane >> 4) << 3) + (lane & 7), (a_m0 + mt * 16) / 8 + ((lane >> 3) & 1)) * 2;
  } else {
    a_off[0] = ATile::offset(a_m0 + (lane & 15), lane >> 4) * 2;
  }
  if constexpr (kBTrans) {
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np)
      b_off[np] = BTile::offset((lane & 7) + (((lane >> 3) & 1) << 3), (b_n0 + np * 16) / 8 + (lane >> 4)) * 2;
  } else {
    b_off[0] = BTile::offset(b_n0 + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1) * 2;
  }

#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    uint32_t a[kMTiles][4];  // 16 rows x 16 k per m tile
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      if constexpr (kATrans) {  // k = rows of the stored tile
        ptx::ldmatrix_x4_trans(a[mt], sA + a_off[mt] + ks * 16 * kALine);
      } else {                  // k = chunks 2ks, 2ks + 1 of the stored tile
        const int c = 2 * ks;
        ptx::ldmatrix_x4(a[mt], sA + ((a_off[0] ^ a_k(c)) + (c / ATile::kChunksPerBlock) * kABlockBytes +
                                      mt * 16 * kALine));
      }
    }
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t b[4];  // {b0, b1} of n tile 2np, then of 2np+1
      if constexpr (kBTrans) {
        ptx::ldmatrix_x4_trans(b, sB + b_off[np] + ks * 16 * kBLine);
      } else {
        const int c = 2 * ks;
        ptx::ldmatrix_x4(b, sB + ((b_off[0] ^ b_k(c)) + (c / BTile::kChunksPerBlock) * kBBlockBytes +
                                  np * 16 * kBLine));
      }
      const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ptx::mma_m16n8k16<T>(acc[mt][2 * np], a[mt], b_lo);
        ptx::mma_m16n8k16<T>(acc[mt][2 * np + 1], a[mt], b_hi);
      }
    }
  }
}

// One of the backward's products, acc (kMTiles x kNTiles n8 tiles per warp) += A B^T with warp_gemm's operand
// conventions: by warp_gemm (mma.sync), or on sm_90a (kWgmma) by the warp's warpgroup with one m64 wgmma, whose
// 64 x (kNTiles * 8) result is exactly its four warps' tiles stacked along M (the tile config lines them up:
// bwd_tile_shape_wgmma). a_m0 & ~63 is then the warpgroup's first row (or, transposed, column) of A; b_n0 its first
// row (column) of B.
// kOverwrite: acc = A B (acc need not be initialized). kWait = false (wgmma only): issued as one committed group,
// completed later by sm90::wait_hold; acc is not touched in between. mma.sync products are complete on return.
template <typename T, bool kWgmma, int kMTiles, int kNTiles, int kKSteps, bool kATrans, bool kBTrans, typename ATile,
          typename BTile, bool kOverwrite, bool kWait = true>
__device__ __forceinline__ void product(float (&acc)[kMTiles][kNTiles][4], uint32_t sA, int a_m0, uint32_t sB, int b_n0,
                                        int lane) {
  if constexpr (kWgmma) {
    static_assert(kMTiles == 1, "wgmma: 16 rows per warp");
    sm90::gemm_ss<T, kNTiles * 8, kKSteps, kATrans, kBTrans, ATile, BTile, kWait, kOverwrite>(
        reinterpret_cast<float(&)[kNTiles * 4]>(acc), sA, a_m0 & ~63, sB, b_n0);
  } else {
    if constexpr (kOverwrite) ptx::zero(acc);
    warp_gemm<T, kMTiles, kNTiles, kKSteps, kATrans, kBTrans, ATile, BTile>(acc, sA, a_m0, sB, b_n0, lane);
  }
}

}  // namespace bwd
}  // namespace fa2
