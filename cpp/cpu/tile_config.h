// Tile sizes of the CPU kernel, the only place they are chosen. Kernels take them from here; output shapes never
// depend on them. Measured on a 2-core AMD EPYC (Zen 4, AVX-512) with torch's MKL sgemm, fp32, one thread
// (CPU time, median of 7; the machine is shared, so differences under ~3% are noise):
//   forward  (B=1, H=8, S=2048, D=64): block_q x block_k = 128x512 101 ms, 256x512 101, 256x256 102, 64x512 118,
//            32x512 123, 64x256 115, 128x1024 107 (SDPA: 103 ms). D=128/256 (S=1024): 128x512 ~ 256x512 ~ 128x256,
//            64x512 5-8% slower.
//   backward (same shape): 64x128 253 ms, 128x128 253, 256x128 251, 64x256 259, 128x256 262 (SDPA: 276 ms);
//            D=128, S=1024: 64x128 124 ms, 128x128 129, 64x256 125 (SDPA: 132 ms).
// Why: the tile products run at MKL's peak (~93 GFLOP/s/core) from 64-row tiles up; what is left is the
// per-call packing MKL does (relatively larger for short tiles) and the softmax passes over the score tile, which
// want the tile in L2 (128x512 fp32 = 256 KiB of Zen 4's 1 MiB).
#pragma once
#include <cstdint>

namespace fa2::cpu {

struct CpuTiles {
  int64_t block_q;  // query rows per tile (rows of S, O)
  int64_t block_k;  // key rows per tile (columns of S)
};

// Forward: 128 x 512; block_q halves (down to 32) while there would be fewer than 4 tasks per thread, since the
// forward's parallelism is (batch, head, query block) and 64-row tiles lose only ~10%.
inline CpuTiles fwd_tiles(int64_t batch_heads, int64_t seqlen_q, int64_t num_threads) {
  CpuTiles tiles{128, 512};
  while (tiles.block_q > 32 && batch_heads * ((seqlen_q + tiles.block_q - 1) / tiles.block_q) < 4 * num_threads) {
    tiles.block_q /= 2;
  }
  return tiles;
}

// Backward: 64 query rows x 128 keys per tile: dK and dV of a key block stay in L1/L2 across the whole query loop,
// and short key blocks give the backward's key-block partition (see BwdPartition) fine grain.
constexpr CpuTiles bwd_tiles() { return {64, 128}; }

}  // namespace fa2::cpu
