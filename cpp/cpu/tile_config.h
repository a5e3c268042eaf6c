// Tile sizes of the CPU kernel, the only place they are chosen. Kernels take them from here; output shapes never
// depend on them. The measured grid of tile shapes is in docs/tuning.md (CPU kernel).
// Why: the tile products run at MKL's peak from 64-row tiles up; what is left is the
// per-call packing MKL does (relatively larger for short tiles) and the softmax passes over the score tile, which
// want the tile in L2 (128x512 fp32 = 256 KiB of Zen 4's 1 MiB).
#pragma once
#include <algorithm>
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

// Key splits of the forward's short query runs (fewer queries than a tile's rows, no dropout) where their tiles give
// fewer tasks than threads (a decode step of one sequence, few kv heads, on a many-core machine): each tile's keys in
// `splits` runs of whole key blocks of the `keys` its queries see, a task each, merged after (cpu/fwd_kernel.h).
// requested: the option cpu_key_splits (-1: enough to give every thread a task; 0 / 1: none; n: n). At most one a key
// block.
inline int64_t fwd_key_splits(int64_t tasks, int64_t num_threads, int64_t keys, int64_t block_k, int requested) {
  const int64_t blocks = (keys + block_k - 1) / block_k;
  const int64_t wanted = requested >= 0 ? requested : tasks >= num_threads ? 1 : (num_threads + tasks - 1) / tasks;
  return std::max<int64_t>(1, std::min(wanted, blocks));
}

// Backward: 64 query rows x 128 keys per tile: dK and dV of a key block stay in L1/L2 across the whole query loop,
// and short key blocks give the backward's key-block partition (see BwdPartition) fine grain.
constexpr CpuTiles bwd_tiles() { return {64, 128}; }

}  // namespace fa2::cpu
