// Forward tile sizes: the one place they are chosen. Everything else (smem layout, fragment counts, grid)
// derives from FwdTileConfig. Plain constexpr C++, usable from host and device code.
#pragma once

namespace fa2 {

struct FwdTileShape {
  int block_m;  // query rows per CTA (split across warps, 16 rows per m16 tile)
  int block_n;  // keys per K/V tile
  int warps;
  int stages;   // 2: K/V tile n-1 loads (cp.async) while tile n computes, one barrier per tile;
                // 1: FA-2's split (V[n] loads during S = Q K[n]^T, K[n-1] during softmax and P V[n])
};

// Starting points from FA-2 (sm80 instruction path). Shared memory per CTA (bytes, b16):
//   (block_m + stages * 2 * block_n) * headdim * 2
// d <= 64: 128x128, d 96/128: 128x64, both double-buffered (<= 96 KB, two CTAs per SM on A100/H100/H200);
// d >= 192: 64x64 single-buffered (72 / 96 KB, 2-3 CTAs per SM; two stages would leave one).
// Measured on the H200 (2026-11-29, bf16, 16k tokens, hidden 2048, S 1k..16k): d 64 1.08-1.15x and d 128
// 1.00-1.06x torch's FA-2 forward, causal and not (scripts/cuda_fwd_bench.py).
constexpr FwdTileShape fwd_tile_shape(int headdim) {
  return headdim <= 64    ? FwdTileShape{128, 128, 4, 2}
         : headdim <= 128 ? FwdTileShape{128, 64, 4, 2}
                          : FwdTileShape{64, 64, 4, 1};
}

// sm_90a (wgmma) variant of the same kernel: two warpgroups of 4 warps, each multiplying its own 64 query rows
// (wgmma's M), so every warp still owns 16 whole rows. 8 warps leave one CTA per SM; the shared memory allows a
// 128-key tile up to d 128 and double-buffered K/V everywhere: (128 + 2 * 2 * block_n) * d * 2 bytes = 160 KB at
// d 128, 192 KB at d 256. Measured on the H200 (2026-11-30, bf16/fp16, 16k tokens, hidden 2048, S 1k..16k, with
// TMA loads): forward 1.35-2.1x torch's FA-2, 1.0-1.10x cuDNN at d 64, 0.72-0.96x at d 128 and 256
// (benchmarks/results/attention_h200-20261130-sm90a.json). At d 64 the plain variant takes 128 registers (two CTAs
// per SM), the bias-fold variants 155-192 (one CTA per SM: with a padding bias 0.55-0.6x of the plain speed). The
// registers went to the loads of a bias that varies along queries; a key-row bias (padding masks) now has its own
// variant, held to 128 registers (min_blocks_per_sm). Not yet measured.
constexpr FwdTileShape fwd_tile_shape_wgmma(int headdim) {
  return headdim <= 128 ? FwdTileShape{128, 128, 8, 2} : FwdTileShape{128, 64, 8, 2};
}

template <int kHeadDim_, bool kWgmma_ = false>
struct FwdTileConfig {
  static constexpr bool kWgmma = kWgmma_;  // sm_90a: S = Q K^T and O += P V by wgmma (one warpgroup per 64 rows)
  static constexpr FwdTileShape kShape = kWgmma ? fwd_tile_shape_wgmma(kHeadDim_) : fwd_tile_shape(kHeadDim_);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kShape.block_m;
  static constexpr int kBlockN = kShape.block_n;
  static constexpr int kNWarps = kShape.warps;
  static constexpr int kStages = kShape.stages;
  static constexpr int kNThreads = kNWarps * 32;
  // CTAs per SM the register allocation must allow (__launch_bounds__'s minimum), for the lean variants (a key-row
  // bias): sm_90a at d <= 64 asks for 2, i.e. <= 128 registers a thread, which two CTAs' 80 KB of shared memory
  // allow (ptxas, bf16: 128 registers, 0 bytes spilled for a bool bias, 48 for float ones; unbounded: 129-141).
  // 0 (everything else) leaves the compiler free: an explicit 1 is not the same (the plain variant then took 152).
  static constexpr int min_blocks_per_sm(bool lean) { return lean && kWgmma && kHeadDim_ <= 64 ? 2 : 0; }

  static constexpr int kRowsPerWarp = kBlockM / kNWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;   // m16 tiles per warp
  static constexpr int kNTiles = kBlockN / 8;         // n8 tiles of S per row tile
  static constexpr int kDTiles = kHeadDim / 8;        // n8 tiles of O per row tile
  // Shared-memory tiles are stored in column blocks of 64 b16 (128-byte swizzle) when the headdim allows,
  // else 32 (64-byte swizzle; d = 32, 96): see SwizzledTile.
  static constexpr int kSmemBlockCols = kHeadDim % 64 == 0 ? 64 : 32;

  static constexpr int kSmemQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kSmemKVBytes = kBlockN * kHeadDim * 2;  // one K (or V) tile
  // sm_90a with TMA loads: mbarriers for Q and each K/V stage, after the tiles
  static constexpr int kSmemBarrierBytes = kWgmma ? 64 : 0;
  static constexpr int kSmemBytes = kSmemQBytes + kStages * 2 * kSmemKVBytes + kSmemBarrierBytes;
  // The warp-specialized sm_90a kernel (fwd_kernel.cuh) keeps a deeper K/V ring where the shared memory allows: with
  // a producer running ahead, a third stage gives its loads a whole extra iteration (ping-pong releases a stage later
  // than the plain order). d 128: 32 + 3 x 64 KB = 224 KB.
  static constexpr int kWsStages = kWgmma && kSmemQBytes + 3 * 2 * kSmemKVBytes + kSmemBarrierBytes <= 227 * 1024
                                       ? 3 : 2;
  static constexpr int kSmemBytesWs = kSmemQBytes + kWsStages * 2 * kSmemKVBytes + kSmemBarrierBytes;

  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "instantiated headdims are multiples of 32, <= 256");
  static_assert(kBlockM % (16 * kNWarps) == 0, "each warp owns whole m16 tiles");
  static_assert(kBlockN % 16 == 0, "P V consumes keys 16 at a time; S is computed in pairs of n8 tiles");
  static_assert(!kWgmma || (kNWarps % 4 == 0 && kBlockM == 64 * (kNWarps / 4) && kMTiles == 1),
                "wgmma: one warpgroup per 64 query rows, 16 rows per warp");
  static_assert(kStages == 1 || kStages == 2, "single- or double-buffered K/V");
  static_assert((kBlockM * kHeadDim / 8) % kNThreads == 0, "Q tile splits evenly into 16-byte cp.async");
  static_assert((kBlockN * kHeadDim / 8) % kNThreads == 0, "K/V tile splits evenly into 16-byte cp.async");
  static_assert(kSmemBytes <= 227 * 1024, "fits the opt-in shared memory of sm80/sm90");
  // fp32 accumulator registers per thread: O and S; beyond ~200 the kernel spills.
  static_assert(kMTiles * (kDTiles + kNTiles) * 4 <= 192, "accumulators must stay in registers");
};

}  // namespace fa2
