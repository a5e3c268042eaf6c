// Tile sizes of the CPU kernel, the only place they are chosen. Kernels take them from here; output shapes never
// depend on them. The measured grid of tile shapes is in docs/tuning.md (CPU kernel).
// Why: the tile products run at MKL's peak from 64-row tiles up; what is left is the
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
// forward's parallelism is (batch, head, query block) and 64-row tiles lose little.
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
