// Backward tile sizes: the one place they are chosen (the forward's live in tile_config.h). Everything else
// (smem layout, warp tiles, fragment counts, grid, workspace) derives from BwdTileConfig. Plain constexpr C++,
// usable from host and device code.
#pragma once

#include <type_traits>

#include "fa2/tile_config.h"  // the warp-specialized kernels' register split (ws_consumer_regs)
#include "fa2/tile_order.h"   // TailSplitTuning

namespace fa2 {

struct BwdTileShape {
  int block_m;      // query rows per inner-loop step (Q, dO tiles streamed through smem)
  int block_n;      // keys per CTA (K, V resident in smem; dK, dV accumulated in registers)
  int warps;
  int warps_m_sdp;  // S = Q K^T and dP = dO V^T (block_m, block_n): warps along queries (the rest along keys)
  int warps_n_dkv;  // dV = P^T dO and dK = dS^T Q (block_n, d): warps along keys (the rest along headdim)
  int warps_m_dq;   // dQ = dS K (block_m, d): warps along queries (the rest along headdim)
  int stages;       // Q/dO buffers: 2 = the next block's Q/dO load while this one computes
  bool whole_block_mask;  // plain path: the S..dS block compiled twice (masked / not), or one block with a
                          // branch around P's mask only
};

// Starting points from FA-2's sm80 choices, 8 warps, one CTA per SM (fp32 accumulators use ~200 registers); d 64
// and d 128 chosen by measurement among the alternatives (docs/tuning.md, backward tiles).
// d32/96/192/256 keep the whole-block variant (the one their correctness sweep ran with; not timed).
// Shared memory per CTA (bytes, b16): (2 block_n d + stages 2 block_m d + 2 block_m block_n) * 2 (+ lse, D, shift;
// d 64 lands exactly on the A100's 163 KB)
//   d 32/64: 128x128 -> 114/162 KB;  d 96/128: 64x128 -> 129/161 KB;  d 192: 64x64 -> 161 KB;
//   d 256: 64x64 single-buffered -> 144 KB (two stages would be 208 KB, over the A100's 163 KB).
// Warp layouts keep every per-warp n8-tile count even (B fragments load in pairs) and prefer square-ish warp tiles
// (fewest ldmatrix per mma).
constexpr BwdTileShape bwd_tile_shape(int headdim) {
  return headdim <= 32    ? BwdTileShape{128, 128, 8, 4, 8, 8, 2, true}
         : headdim <= 64  ? BwdTileShape{128, 128, 8, 4, 4, 4, 2, true}
         : headdim <= 96  ? BwdTileShape{64, 128, 8, 2, 4, 4, 2, true}
         : headdim <= 128 ? BwdTileShape{64, 128, 8, 2, 4, 2, 2, false}
         : headdim <= 192 ? BwdTileShape{64, 64, 8, 2, 2, 2, 2, true}
                          : BwdTileShape{64, 64, 8, 2, 2, 2, 1, true};
}

// Small-shared-memory variant (sm80 path) for GPUs whose opt-in limit per block is below the shapes above: sm86 /
// sm87 / sm89 (RTX 30xx / 40xx, A10, A40, L4, L40S: 99 KB). Chosen at run time from the device's limit
// (bwd_launch_template.cuh), or forced with set_bwd_small_tiles / FA2_BWD_SMALL_TILES=1. Shared memory (bytes, b16,
// + 3 * block_m * 4 of row statistics per stage, + block_n * 4 of key-row bias):
//   d 32: 128x64 -> 72 KB;  d 64: 128x64 single-buffered -> 80 KB;  d 96: 64x64 -> 88 KB;  d 128: 64x64
//   single-buffered -> 80 KB;  d 192: 64x32 single-buffered -> 80 KB;  d 256: 32x32, 4 warps, single-buffered -> 68 KB.
// Validated by forcing them on an sm90 GPU (docs/tuning.md); not yet run on an sm86 / sm89 GPU.
constexpr BwdTileShape bwd_tile_shape_small(int headdim) {
  return headdim <= 32    ? BwdTileShape{128, 64, 8, 8, 4, 8, 2, true}
         : headdim <= 64  ? BwdTileShape{128, 64, 8, 8, 4, 8, 1, true}
         : headdim <= 96  ? BwdTileShape{64, 64, 8, 4, 4, 4, 2, true}
         : headdim <= 128 ? BwdTileShape{64, 64, 8, 4, 4, 4, 1, true}
         : headdim <= 192 ? BwdTileShape{64, 32, 8, 4, 2, 4, 1, true}
                          : BwdTileShape{32, 32, 4, 2, 2, 2, 1, true};
}
// The deterministic mode's counters are per query block: sized for the smaller block_m of the two sm80 shapes.
constexpr int bwd_min_block_m(int headdim) {
  const int regular = bwd_tile_shape(headdim).block_m, small = bwd_tile_shape_small(headdim).block_m;
  return regular < small ? regular : small;
}

// sm_90a (wgmma) variant, same tile sizes (block_m must match: bwd_workspace_ints sizes the deterministic mode's
// counters by bwd_tile_shape): each of the five products is a warpgroup's m64 wgmma, so every product's warp grid
// stacks the four warps of a warpgroup along M, 16 rows each (warps_m_sdp / warps_n_dkv / warps_m_dq multiples of 4),
// and a warpgroup's share of N starts at a column block of the operand it reads. d 96 and 192 cannot split their dQ
// (or dK/dV) columns that way between two warpgroups and keep the sm80 warp tiles (bwd_wgmma_headdim).
//   d 32/64: 128x128, S/dP and dQ 8 x 1 warps (each warpgroup 64 query rows), dK/dV 8 x 1 (64 keys each);
//   d 128: 64x128, S/dP and dQ 4 x 2 (the warpgroups split keys / headdim), dK/dV 8 x 1; the S..dS block compiled
//     masked and unmasked (faster than a branch around P's mask, most with a padding mask);
//   d 256: 64x64 single-buffered, everything 4 x 2 (double-buffered Q/dO, 210 KB, ran slower).
// The default on compute capability 9.0 (set_sm90_backward, bwd_launch.h): faster than the sm80 path at every
// instantiated headdim (docs/tuning.md).
constexpr bool bwd_wgmma_headdim(int headdim) {
  return headdim == 32 || headdim == 64 || headdim == 128 || headdim == 256;
}
constexpr BwdTileShape bwd_tile_shape_wgmma(int headdim) {
  return headdim <= 64    ? BwdTileShape{128, 128, 8, 8, 8, 8, 2, true}
         : headdim <= 128 ? BwdTileShape{64, 128, 8, 4, 8, 4, 2, true}
                          : BwdTileShape{64, 64, 8, 4, 4, 4, 1, true};
}

// The shape is spelled out as template arguments (defaulting to bwd_tile_shape) so that a benchmark can build a
// variant next to the chosen one.
template <int kHeadDim_, int kBlockM_ = bwd_tile_shape(kHeadDim_).block_m,
          int kBlockN_ = bwd_tile_shape(kHeadDim_).block_n, int kNWarps_ = bwd_tile_shape(kHeadDim_).warps,
          int kWarpsMSdP_ = bwd_tile_shape(kHeadDim_).warps_m_sdp,
          int kWarpsNdKV_ = bwd_tile_shape(kHeadDim_).warps_n_dkv,
          int kWarpsMdQ_ = bwd_tile_shape(kHeadDim_).warps_m_dq, int kStages_ = bwd_tile_shape(kHeadDim_).stages,
          bool kWholeBlockMask_ = bwd_tile_shape(kHeadDim_).whole_block_mask, bool kWgmma_ = false>
struct BwdTileConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kWgmma = kWgmma_;  // sm_90a: the products by wgmma (bwd_tile_shape_wgmma's warp grids)
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kStages = kStages_;
  // Plain path: the S..dS block compiled twice (masked / not) rather than branching around the mask alone.
  static constexpr bool kWholeBlockMask = kWholeBlockMask_;

  // S, dP: (kBlockM, kBlockN) over kWarpsMSdP x kWarpsNSdP warps.
  static constexpr int kWarpsMSdP = kWarpsMSdP_, kWarpsNSdP = kNWarps / kWarpsMSdP;
  static constexpr int kSdPMTiles = kBlockM / kWarpsMSdP / 16, kSdPNTiles = kBlockN / kWarpsNSdP / 8;
  // dK, dV: (kBlockN, d) over kWarpsNdKV x kWarpsDdKV warps.
  static constexpr int kWarpsNdKV = kWarpsNdKV_, kWarpsDdKV = kNWarps / kWarpsNdKV;
  static constexpr int kdKVMTiles = kBlockN / kWarpsNdKV / 16, kdKVNTiles = kHeadDim / kWarpsDdKV / 8;
  // dQ: (kBlockM, d) over kWarpsMdQ x kWarpsDdQ warps.
  static constexpr int kWarpsMdQ = kWarpsMdQ_, kWarpsDdQ = kNWarps / kWarpsMdQ;
  static constexpr int kdQMTiles = kBlockM / kWarpsMdQ / 16, kdQNTiles = kHeadDim / kWarpsDdQ / 8;

  // Column blocks of 64 b16 (128-byte swizzle) when the width allows, else 32 (d = 32, 96): see SwizzledTile.
  static constexpr int kSmemBlockColsD = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSmemBlockColsN = kBlockN % 64 == 0 ? 64 : 32;

  static constexpr int kSmemKVBytes = kBlockN * kHeadDim * 2;   // one of K, V
  static constexpr int kSmemQBytes = kBlockM * kHeadDim * 2;    // one of Q, dO (per stage)
  static constexpr int kSmemPBytes = kBlockM * kBlockN * 2;     // one of P, dS
  static constexpr int kSmemStatsBytes = 3 * kBlockM * 4;        // lse, D, shift of one query block (per stage)
  static constexpr int kSmemBytes =
      2 * kSmemKVBytes + kStages * 2 * kSmemQBytes + 2 * kSmemPBytes + kStages * kSmemStatsBytes;

  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "instantiated headdims are multiples of 32, <= 256");
  static_assert(kNWarps % kWarpsMSdP == 0 && kNWarps % kWarpsNdKV == 0 && kNWarps % kWarpsMdQ == 0, "warp grids");
  static_assert(kSdPMTiles >= 1 && kdKVMTiles >= 1 && kdQMTiles >= 1, "whole m16 tiles per warp");
  static_assert(kBlockM % (kWarpsMSdP * 16) == 0 && kBlockN % (kWarpsNdKV * 16) == 0 &&
                kBlockM % (kWarpsMdQ * 16) == 0, "warp tiles are whole m16 tiles");
  static_assert(kSdPNTiles % 2 == 0 && kdKVNTiles % 2 == 0 && kdQNTiles % 2 == 0,
                "B fragments are loaded for pairs of n8 tiles");
  static_assert(kBlockN % (kWarpsNSdP * 16) == 0 && kHeadDim % (kWarpsDdKV * 16) == 0 &&
                kHeadDim % (kWarpsDdQ * 16) == 0, "n extents per warp are whole n16 pairs");
  static_assert(kBlockM % 16 == 0 && kBlockN % 16 == 0, "k16 steps over queries (dV, dK) and keys (dQ)");
  static_assert((kBlockM * kHeadDim / 8) % kNThreads == 0 && (kBlockN * kHeadDim / 8) % kNThreads == 0,
                "tiles split evenly into 16-byte cp.async");
  static_assert(kStages == 1 || kStages == 2, "single- or double-buffered Q/dO");
  static_assert(kSmemBytes <= 163 * 1024, "fits the A100's opt-in shared memory (H100/H200: 227 KB)");
  static_assert(!kWgmma || (kSdPMTiles == 1 && kdKVMTiles == 1 && kdQMTiles == 1 && kWarpsMSdP % 4 == 0 &&
                            kWarpsNdKV % 4 == 0 && kWarpsMdQ % 4 == 0),
                "wgmma: each warpgroup's four warps stacked along M, 16 rows each");
  static_assert(!kWgmma || (kSmemKVBytes % 1024 == 0 && kSmemQBytes % 1024 == 0 && kSmemPBytes % 1024 == 0),
                "wgmma: every tile starts at a 1024-byte swizzle period");
  // an M-major / N-major operand is addressed from a column block (TileDescriptors::mn_major): a warpgroup's share
  // of d (dK/dV, dQ) and of the keys (P^T, dS^T as dK/dV's A) must start at one
  static_assert(!kWgmma || ((kHeadDim / kWarpsDdKV) % kSmemBlockColsD == 0 &&
                            (kHeadDim / kWarpsDdQ) % kSmemBlockColsD == 0 &&
                            (kBlockN * 4 / kWarpsNdKV) % kSmemBlockColsN == 0),
                "wgmma: each warpgroup's columns of an MN-major operand start at a column block");
  // fp32 accumulators live across the loop (dK, dV) plus S and dP inside it; beyond ~200 the kernel spills.
  static_assert(2 * kdKVMTiles * kdKVNTiles * 4 + 2 * kSdPMTiles * kSdPNTiles * 4 <= 192,
                "accumulators must stay in registers");
};

// The BwdTileConfig of the shape kShapeOf(kHeadDim) (a BwdTileShape cannot itself be a template argument in C++17).
template <int kHeadDim, BwdTileShape (*kShapeOf)(int), bool kWgmma = false>
struct BwdTileConfigOf {
  static constexpr BwdTileShape kShape = kShapeOf(kHeadDim);
  using type = BwdTileConfig<kHeadDim, kShape.block_m, kShape.block_n, kShape.warps, kShape.warps_m_sdp,
                             kShape.warps_n_dkv, kShape.warps_m_dq, kShape.stages, kShape.whole_block_mask, kWgmma>;
};

template <int kHeadDim>
using BwdTileConfigSmall = typename BwdTileConfigOf<kHeadDim, bwd_tile_shape_small>::type;

// The sm_90a instances' configuration (wgmma where bwd_wgmma_headdim, else the sm80 warp tiles).
template <int kHeadDim, bool kWgmma = bwd_wgmma_headdim(kHeadDim)>
struct BwdTileConfigSm90a {
  using type = BwdTileConfig<kHeadDim>;
};
template <int kHeadDim>
struct BwdTileConfigSm90a<kHeadDim, true> {
  static_assert(bwd_tile_shape_wgmma(kHeadDim).block_m == bwd_tile_shape(kHeadDim).block_m,
                "bwd_workspace_ints counts bwd_tile_shape's blocks");
  using type = typename BwdTileConfigOf<kHeadDim, bwd_tile_shape_wgmma, true>::type;
};

// sm_90a warp-specialized backward (bwd_ws_kernel.cuh, FA-3's structure): a producer thread streams Q, dO and their
// rows' lse, D by TMA through a kStages ring; two consumer warpgroups each own 64 of the CTA's kBlockN keys and compute
// S^T = K Q^T and dP^T = V dO^T (keys as the wgmma M), so that P^T and dS^T come out of the accumulators already in
// the register-A layout of dV += P^T dO and dK += dS^T Q (no P round trip through shared memory). dS^T goes to
// shared memory once for dQ = dS K over all kBlockN keys, each warpgroup taking 64 of its query rows (kBlockM 128) or
// half of its headdim columns (kBlockM 64; each half starts at a swizzle column block).
// Registers per consumer thread (fp32): d 128 (64 x 128): dK, dV 2 x 64 + S^T, dP^T 2 x 32, then dQ 32 (after S^T and
// dP^T are packed) beside the next block's S^T 32 (issued behind dQ); d 64 (128 x 128): dK, dV 2 x 32 + S^T,
// dP^T 2 x 64, then dQ 32 beside the next S^T 64.
// Shared memory (bytes): K, V 2 x kBlockN d 2 + kStages (Q, dO: 2 x kBlockM d 2 + lse, D, shift: 3 x (kBlockM + 4) 4
//   rounded up to 128)
//   + dS^T 2 buffers x kBlockN kBlockM 2 (a warpgroup may still read one while the other writes the next)
//   + dQ staging 2 x 64 x kDqCols 4 (each warpgroup's part, added to dq_accum by the TMA's reduce-add)
//   d 128, 64 x 128, 2 stages: 64 + 64 + 2.25 + 32 + 32 KB = 194.3 KB;  d 64, 128 x 128: 32 + 64 + 3.75 + 64 + 32
//   = 195.8 KB.
// (d 256: BwdWsSplitTileConfig, below)
constexpr bool bwd_ws_headdim(int headdim) { return headdim == 64 || headdim == 128 || headdim == 256; }

template <int kHeadDim_>
struct BwdWsTileConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kHeadDim <= 64 ? 128 : 64;  // queries per step (N of S^T, dP^T; K of dV, dK)
  static constexpr int kBlockN = 128;   // keys per CTA: 64 per consumer warpgroup
  static constexpr int kStages = 2;     // Q / dO / lse / D ring
  static constexpr int kConsumerWarpgroups = 2;
  // dQ (kBlockM, d) split between the warpgroups: by rows (64 each) when kBlockM is 128, else by columns
  static constexpr bool kDqSplitRows = kBlockM == 128;
  // dS^T from the rounded P before dV's wgmma is issued (it then does not overlap dS) rather than from the fp32 P
  // while dV runs: at 128-query blocks S^T and dP^T take 64 registers each, and keeping the fp32 P beside the packed
  // one spilled 48 B
  static constexpr bool kDsBeforeDv = kBlockM == 128;
  // Causal launches' tile order with a tail (tile_order.h) at d 128 only: at d 64 (128 queries a step) its causal
  // gain did not pay for what the code did to ptxas's schedule of the kernel without a causal mask (docs/tuning.md),
  // so the d 64 kernel is compiled without it
  static constexpr bool kTileOrderTail = kHeadDim > 64;
  // The dQ conversion launched to overlap the kernel's last CTAs (bwd_launch_template.cuh; each CTA counts itself
  // finished at its end, ws_key_block_done) at d 128 only: at d 64 it ran slower (docs/tuning.md). (d 256:
  // BwdWsSplitTileConfig)
  static constexpr bool kOverlapDqConversion = kHeadDim == 128;
  // (No clusters sharing Q / dO by multicast, as the d 128 forward's share K / V: a probe bounded the gain at a few
  // percent before any cluster synchronization, docs/tuning.md. Timing probes must keep real values in every
  // operand: zeros or NaN draw less power and raise the power-limited clocks.)
  // The grid's last partial wave split into CTAs over parts of a tile's query blocks (tile_order.h, tail_split;
  // kBwdTailSplitTuning) without a causal mask or window: their fp32 dK, dV added by the TMA into the workspace as
  // GQA's accumulators are, the last piece of a tile storing the sums (bwd_ws_kernel.cuh). (d 256: not written)
  static constexpr bool kTailSplit = true;
  // ... by default (bwd_tail_split -1) only with at least this many query blocks a tile (below it the split ran
  // slower: docs/tuning.md)
  static constexpr int kTailSplitMinQueryBlocks = kHeadDim <= 64 ? 32 : 128;
  static constexpr int kDqRows = 64, kDqCols = kDqSplitRows ? kHeadDim : kHeadDim / 2;
  // column blocks of Q, dO, K, V (SwizzledTile; the TMA boxes' width, 128-byte swizzle): a warpgroup's dQ columns
  // start at one (both shapes give kDqCols 64)
  static constexpr int kBlockCols = 64;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kNThreads = kWsProducerThreads + kConsumerThreads;  // the producer warpgroup first
  static constexpr int kProducerRegs = kWsProducerRegs;
  static constexpr int kConsumerRegs = ws_consumer_regs(kConsumerThreads);  // 240 (128 x 24 + 256 x 240 <= 384 x 168)
  static constexpr int kSmemKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kSmemQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kSmemDsBytes = kBlockN * kBlockM * 2;
  // lse, D (and a key-row bias's row shift) of a stage, each a box of kBlockM + 4 values (bwd_ws_kernel.cuh,
  // ws_stat_box_elems) at a 128-byte aligned start
  static constexpr int kSmemStatBytes = ((kBlockM + 4) * 4 + 127) / 128 * 128;
  static constexpr int kSmemStatsBytes = 3 * kSmemStatBytes;
  static constexpr int kSmemDqBytes = kDqRows * kDqCols * 4;  // one warpgroup's part of dQ
  static constexpr int kSmemBarrierBytes = 8 * (1 + 2 * kStages);  // K/V, then full and empty per stage
  static constexpr int kSmemBytes = 2 * kSmemKVBytes + kStages * 2 * kSmemQBytes + 2 * kSmemDsBytes +
                                    kConsumerWarpgroups * kSmemDqBytes + kStages * kSmemStatsBytes +
                                    kSmemBarrierBytes;
  static_assert(kHeadDim % 64 == 0 && kDqCols % kBlockCols == 0 && kDqCols % 32 == 0,
                "a warpgroup's dQ columns start at a column block and are whole 32-column reduce-add boxes");
  static_assert(kBlockN == 64 * kConsumerWarpgroups && kBlockM == kDqRows * (kDqSplitRows ? 2 : 1),
                "64 keys per warpgroup; dQ's rows one m64 per warpgroup (split) or shared");
  static_assert(kSmemBytes <= 227 * 1024, "the H100 / H200's opt-in shared memory per block");
  static_assert(kProducerRegs * kWsProducerThreads + kConsumerRegs * kConsumerThreads <=
                    kNThreads * ((64 * 1024 / kNThreads) & ~7), "setmaxnreg within the CTA's register pool");
  static_assert(kConsumerRegs == 240, "the accumulator budget above (dK, dV, S^T, dP^T, dQ) assumes 240 registers");
};

// d 256 (bwd_ws_dsplit_kernel.cuh): dK and dV of 64 keys take 2 x 128 registers per thread of one warpgroup, more than
// it has, so both consumer warpgroups own the same kBlockN = 64 keys and split the headdim: warpgroup w accumulates
// dK, dV columns 128 w .. 128 w + 127 (2 x 64 registers). The two products over the whole headdim are split instead:
// warpgroup 0 computes S^T = K Q^T (then P^T), warpgroup 1 dP^T = V dO^T (then dS^T, with P^T from shared memory);
// each passes its result to the other through shared memory (P^T, dS^T: the other's dV / dK take it as a shared-memory
// operand). dQ = dS K: each warpgroup half of the columns (64 registers, two passes), added into dq_accum from the
// registers with red.global.add.v4.f32 in its fragment order (DqFragmentOrder, bwd/dq_fragment_order.h), warpgroup 1's a
// query block late (bwd_ws_dsplit_kernel.cuh).
// Shared memory: K, V 2 x 32 KB + 2 stages x (Q, dO 2 x 32 KB + lse, D, shift 3 x 384 B) + P^T, dS^T 2 x 2 buffers x
//   8 KB = 226.3 KB (of 227).
template <int kHeadDim_>
struct BwdWsSplitTileConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 64;   // queries per step (N of S^T, dP^T; K of dV, dK; M of dQ)
  static constexpr int kBlockN = 64;   // keys per CTA (M of S^T, dP^T, dV, dK), both consumer warpgroups
  static constexpr int kStages = 2;    // Q / dO / lse / D ring
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kDCols = kHeadDim / kConsumerWarpgroups;  // dK, dV, dQ columns per warpgroup
  static constexpr bool kTileOrderTail = true;  // (tile_order.h; see BwdWsTileConfig)
  // (see BwdWsTileConfig) not here: slower at S 1k-2k, no gain from 4k (the CTA's end waits for its last
  // red.global.add of dQ before it counts itself finished)
  static constexpr bool kOverlapDqConversion = false;
  static constexpr bool kTailSplit = false;  // (see BwdWsTileConfig: its epilogue has no pieces)
  static constexpr int kBlockCols = 64;  // column blocks of Q, dO, K, V (128-byte swizzle)
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kNThreads = kWsProducerThreads + kConsumerThreads;
  static constexpr int kProducerRegs = kWsProducerRegs;
  static constexpr int kConsumerRegs = ws_consumer_regs(kConsumerThreads);
  static constexpr int kSmemKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kSmemQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kSmemPBytes = kBlockN * kBlockM * 2;        // P^T or dS^T (keys, queries)
  // lse, D (and a key-row bias's shift) of a stage: boxes of kBlockM + 4 values at 128-byte aligned starts
  static constexpr int kSmemStatBytes = ((kBlockM + 4) * 4 + 127) / 128 * 128;
  static constexpr int kSmemStatsBytes = 3 * kSmemStatBytes;
  static constexpr int kSmemBarrierBytes = 8 * (1 + 2 * kStages);  // K/V, then full and empty per stage
  static constexpr int kSmemBytes = 2 * kSmemKVBytes + kStages * 2 * kSmemQBytes + 4 * kSmemPBytes +
                                    kStages * kSmemStatsBytes + kSmemBarrierBytes;
  static_assert(kDCols % kBlockCols == 0, "a warpgroup's columns start at a column block");
  static_assert(kSmemBytes <= 227 * 1024, "the H100 / H200's opt-in shared memory per block");
  static_assert(kProducerRegs * kWsProducerThreads + kConsumerRegs * kConsumerThreads <=
                    kNThreads * ((64 * 1024 / kNThreads) & ~7), "setmaxnreg within the CTA's register pool");
};
// The warp-specialized backward's tile config of a headdim (bwd_ws_headdim).
template <int kHeadDim>
using BwdWsConfig = std::conditional_t<(kHeadDim > 128), BwdWsSplitTileConfig<kHeadDim>, BwdWsTileConfig<kHeadDim>>;
// Whether a headdim's warp-specialized backward is the headdim-split kernel (bwd_ws_dsplit_kernel.cuh).
template <int kHeadDim>
constexpr bool kBwdWsSplit = std::is_same_v<BwdWsConfig<kHeadDim>, BwdWsSplitTileConfig<kHeadDim>>;
// GQA / MQA with the warp-specialized backward (d 64 / 128 / 256, ws_groups_gqa): each CTA takes a
// (key block, kv head) and loops over the group's query heads, so that dK and dV are summed in its registers and
// stored once like k, instead of fp32 partials per query head (the caller's (batch, seqlen_k, nheads, d) buffers,
// read back and summed by torch). Its grid has h_h_k_ratio times fewer, longer CTAs, so by default
// (bwd_gqa_grouping, bwd_launch.h) a call groups only where that grid still fills the GPU:
//   - key blocks of equal lengths (no causal mask; windows): its waves at least kBwdGqaGroupMinWaveFill full
//     (CTAs / (waves x SMs));
//   - causal lengths (key block n seen by the queries from its diagonal on; ws CTAs longest first only in the grid's
//     tail): at least kBwdGqaGroupMinWavesCausal CTAs per SM, the longest CTA being ratio x the partials' longest.
// (The thresholds: grouped against partials over kv-head counts, causal and not, d 64 / 128 / 256: docs/tuning.md.)
constexpr double kBwdGqaGroupMinWaveFill = 0.95;
constexpr int kBwdGqaGroupMinWavesCausal = 6;
// Whether a headdim's warp-specialized backward has its dQ conversion overlap it (kOverlapDqConversion).
template <int kHeadDim>
constexpr bool bwd_ws_overlaps_dq_conversion() {
  if constexpr (bwd_ws_headdim(kHeadDim)) {
    return BwdWsConfig<kHeadDim>::kOverlapDqConversion;
  } else {
    return false;
  }
}
// The same for an instantiated headdim given at run time (bwd_workspace_ints, the Python module's list).
constexpr bool bwd_ws_overlaps_dq_conversion_at(int headdim) {
  return headdim == 64    ? bwd_ws_overlaps_dq_conversion<64>()
         : headdim == 128 ? bwd_ws_overlaps_dq_conversion<128>()
         : headdim == 256 ? bwd_ws_overlaps_dq_conversion<256>()
                          : false;
}
static_assert(!bwd_ws_headdim(32) && !bwd_ws_headdim(96) && !bwd_ws_headdim(192),
              "bwd_ws_overlaps_dq_conversion_at lists every headdim with a warp-specialized backward");
// The warp-specialized backward's split of its last partial wave (tile_order.h, tail_split; BwdWsTileConfig::
// kTailSplit): at most 16 pieces of at least 2 query blocks, a piece's own cost taken as 2 query blocks', where it
// saves at least 0.5% of the launch (measured: BwdWsTileConfig::kTailSplitMinQueryBlocks).
constexpr TailSplitTuning kBwdTailSplitTuning{16, 2, 2.0, 0.005};
// The tiles (block_m queries a step, block_n keys a tile) of an instantiated headdim's warp-specialized backward
// where it splits its tail, and the query blocks a tile needs for the default (-1) to split
// (kTailSplitMinQueryBlocks), else {0, 0, 0} (bwd_tail_split_plan, at run time).
struct BwdTailSplitShape {
  int block_m, block_n, min_query_blocks;
};
template <int kHeadDim>
constexpr BwdTailSplitShape bwd_tail_split_shape() {
  if constexpr (bwd_ws_headdim(kHeadDim)) {
    using Cfg = BwdWsConfig<kHeadDim>;
    if constexpr (Cfg::kTailSplit) return BwdTailSplitShape{Cfg::kBlockM, Cfg::kBlockN, Cfg::kTailSplitMinQueryBlocks};
  }
  return BwdTailSplitShape{0, 0, 0};
}
constexpr BwdTailSplitShape bwd_tail_split_shape_at(int headdim) {
  return headdim == 64    ? bwd_tail_split_shape<64>()
         : headdim == 128 ? bwd_tail_split_shape<128>()
         : headdim == 256 ? bwd_tail_split_shape<256>()
                          : BwdTailSplitShape{0, 0, 0};
}
// d 128 at 16k tokens, S 4k (2048 tiles of 64 query blocks, 68 in the last wave on 132 SMs): 5 pieces (3 rounds of
// a fifth); d 64 at S 4k (4096 tiles of 32, 4 left): 16; a full last wave: none
static_assert(tail_split(2048, 64, 132, kBwdTailSplitTuning).pieces == 5 &&
                  tail_split(2048, 64, 132, kBwdTailSplitTuning).tiles == 68 &&
                  tail_split(4096, 32, 132, kBwdTailSplitTuning).pieces == 16 &&
                  tail_split(132 * 4, 64, 132, kBwdTailSplitTuning).pieces == 1,
              "tail_split");

}  // namespace fa2
