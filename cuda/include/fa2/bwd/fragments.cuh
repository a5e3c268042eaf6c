// Register fragments to and from swizzled shared-memory tiles, and f16/bf16 packing, for the backward kernels.
#pragma once
#include <cstdint>
#include <type_traits>
#include "fa2/ptx.cuh"

namespace fa2 {
namespace bwd {

// One f16/bf16 pair (columns col, col + 1 of row) into a swizzled shared-memory tile.
template <typename Tile>
__device__ __forceinline__ void st_shared_pair(uint32_t sTile, int row, int col, uint32_t packed) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sTile + (Tile::offset(row, col / 8) + col % 8) * 2), "r"(packed)
               : "memory");
}

// Stores a warp's fp32 C fragments (rows row0 + 16 mt + 8 half, columns col0 + 8 nt + e of a tile) as f16/bf16 pairs.
template <typename T, typename Tile, int kMTiles, int kNTiles>
__device__ __forceinline__ void store_fragments(uint32_t sTile, const float (&acc)[kMTiles][kNTiles][4], int row0,
                                                int col0) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const int row = row0 + mt * 16 + half * 8, col = col0 + nt * 8;
        const uint32_t packed = ptx::pack2<T>(acc[mt][nt][half * 2], acc[mt][nt][half * 2 + 1]);
        st_shared_pair<Tile>(sTile, row, col, packed);
      }
}

// Stores packed f16/bf16 pairs in the C-fragment layout (as store_fragments).
template <typename Tile, int kMTiles, int kNTiles>
__device__ __forceinline__ void store_packed(uint32_t sTile, const uint32_t (&v)[kMTiles][kNTiles][2], int row0,
                                             int col0) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const int row = row0 + mt * 16 + half * 8, col = col0 + nt * 8;
        st_shared_pair<Tile>(sTile, row, col, v[mt][nt][half]);
      }
}

// One f16/bf16 pair (columns col, col + 1 of row) from a swizzled shared-memory tile (st_shared_pair's counterpart).
template <typename Tile>
__device__ __forceinline__ uint32_t ld_shared_pair(uint32_t sTile, int row, int col) {
  uint32_t packed;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(packed) : "r"(sTile + (Tile::offset(row, col / 8) + col % 8) * 2)
               : "memory");
  return packed;
}

template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
  }
}

// Every k16 step's register-A fragment of fp32 C fragments acc (ptx::pack_k16).
template <typename T, int kNTiles>
__device__ __forceinline__ void pack_k16_fragments(const float (&acc)[kNTiles][4], uint32_t (&a)[kNTiles / 2][4]) {
#pragma unroll
  for (int kt = 0; kt < kNTiles / 2; ++kt) ptx::pack_k16<T>(acc, kt, a[kt]);
}

}  // namespace bwd
}  // namespace fa2
