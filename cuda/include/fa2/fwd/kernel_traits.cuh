// Everything one forward kernel instance decides at compile time: its tile config, its schedule and which paths it
// takes (loads, bias, Q in registers, staged O). The parts under fwd/ read their choices from here (FA-3's
// tile_size.h and kernel traits in one place).
#pragma once
#include "fa2/fwd/kernel_config.cuh"
#include "fa2/fwd/score_mod.cuh"  // ScoreMode, BiasElement
#include "fa2/params.h"
#include "fa2/ptx.cuh"  // SwizzledTile
#include "fa2/tile_config.h"

namespace fa2 {
namespace fwd {

// kArchTag: 10 x the compute capability the instance is built for, + 1 for an arch-specific build
// (cmake/Kernels.cmake): 901 (sm_90a) multiplies with wgmma, everything else with mma.sync.
template <typename T_, int kHeadDim_, int kArchTag, ScoreMode kMode_, BiasType kBias_, bool kWarpSpecialized,
          bool kPingpong_, bool kOverlap_, bool kTileCounter_, bool kCluster_, bool kVarlen_ = false,
          bool kDropout_ = false, bool kPagedKV_ = false>
struct FwdKernelTraits {
  using T = T_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr ScoreMode kMode = kMode_;
  static constexpr BiasType kBias = kBias_;
  static constexpr bool kWgmma = kArchTag == 901;
  static constexpr bool kTma = kWgmma && FA2_SM90_TMA;
  static constexpr bool kWs = kWarpSpecialized;
  static constexpr bool kPingpong = kPingpong_;
  // kOverlap (warp-specialized): P V of tile n-1 stays in flight while S of tile n becomes P; O is rescaled once it
  // completed. The same operations on O in the same order (x c(n-1), + P V(n-1), x c(n), ...). With kPingpong too,
  // each warpgroup's turn issues both (Q K^T of tile n, P V of tile n-1).
  static constexpr bool kOverlap = kOverlap_;
  static constexpr bool kTileCounter = kTileCounter_;
  static constexpr bool kCluster = kCluster_;
  // kVarlen: packed sequences (params.h): each tile's rows, lengths and block info are its sequence's
  // (fwd/tile_scheduler.cuh), without a bias: the cp.async kernels, and the TMA ones, whose copies address the packed
  // tensors from the sequence's first row (rows past its end load but are masked as keys and never stored as queries).
  static constexpr bool kVarlen = kVarlen_;
  // kDropout: P ∘ Z / (1 - p) before P V (fa2/dropout.cuh; params.h, rng_state); the cp.async and the pipelined sm_90a
  // kernels (not the warp-specialized ones), plain or general score path.
  static constexpr bool kDropout = kDropout_;
  // Whether the K/V loads may read a paged cache (params.h, has_paged_kv; FwdTmaLoads::for_each_page_box): the
  // pipelined sm_90a varlen kernels without dropout (a runtime branch in thread 0's loads), and the warp-specialized
  // ones only as kPagedKV twins, whose producer (kWsProducerRegs registers) spills with the page lookups.
  static constexpr bool kPagedKV = kVarlen_ && kTma && !kDropout_ && (!kWarpSpecialized || kPagedKV_);

  using Cfg = FwdKernelConfig<kHeadDim, kArchTag, kWarpSpecialized>;
  static constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kNThreads = Cfg::kNThreads;
  static constexpr int kNWarps = Cfg::kNWarps, kRowsPerWarp = Cfg::kRowsPerWarp;
  static constexpr int kConsumerWarpgroups = kNThreads / 128;  // (the ping-pong ring's length)
  static constexpr int kMTiles = Cfg::kMTiles, kNTiles = Cfg::kNTiles, kDTiles = Cfg::kDTiles;
  using QTile = SwizzledTile<kBlockM, kHeadDim, Cfg::kSmemBlockCols>;   // (kBlockM, d)
  using KVTile = SwizzledTile<kBlockN, kHeadDim, Cfg::kSmemBlockCols>;  // (kBlockN, d)

  // K/V stages of the ring and the shared memory in all (warp-specialized: deeper where it fits, tile_config.h)
  static constexpr int kRing = kWs ? Cfg::kWsStages : Cfg::kStages;
  static constexpr int kSmemTotal = kWs ? Cfg::kSmemBytesWs : Cfg::kSmemBytes;
  // the consumers' registers after setmaxnreg (see ws_consumer_regs)
  static constexpr int kWsConsumerRegs = ws_consumer_regs(kNThreads);
  static constexpr int kWsThreads = kWsProducerThreads + kNThreads;

  // -- scores and bias
  static constexpr bool kBiasFold = kMode == ScoreMode::kBiasFold || kMode == ScoreMode::kKeyBiasFold;
  using BiasElem = typename BiasElement<T, kBias>::type;
  // sm_90a (TMA loads) with a key-row bias: the thread that issues a K/V tile's copies also loads that tile's bias
  // (kBlockN keys, by the TMA: maps.bias, zeros past seqlen_k) into the stage, on the same barrier, so that S starts
  // from it in shared memory instead of from global loads in flight at the wgmma (registers, and their latency, were
  // what a padding mask cost). The launcher sends only biases with unit key stride and 16-byte aligned rows here.
  static constexpr bool kStagedBias = kTma && kMode == ScoreMode::kKeyBiasFold;
  static constexpr uint32_t kBiasTileBytes = kBlockN * sizeof(BiasElem);
  // Staged key tiles whose bias is all -inf are skipped (KeyTileKind), except under ping-pong (its warpgroups' turns
  // count tiles) and in the 128-register key-row kernel at d <= 64 (two CTAs per SM): ptxas spilled 88-92 B a thread
  // there with the skip's path (52-56 B with only the all-zero one), so it reads them as mixed tiles.
  static constexpr bool kSkipMaskedTiles =
      kStagedBias && !kPingpong && (kWs || FwdTileConfig<kHeadDim, kWgmma>::min_blocks_per_sm(true) == 0);
  // heavy rows (softmax.cuh) only where a float bias can push every score of a row that low
  static constexpr bool kHeavyRows = kBias == BiasType::kSameAsInput || kBias == BiasType::kFloat32;

  // -- the TMA ring: one copy per column block of a tile (the TMA writes the SwizzledTile layout itself)
  static constexpr int kBlockCols = Cfg::kSmemBlockCols, kColBlocks = kHeadDim / kBlockCols;
  // kSplitKV: K and V each on a full / empty barrier pair of their own (FA-3's two pipelines), in the overlap
  // schedules with a two-stage ring (d 256). K is released once Q K^T has completed, V once P V has. With one pair, a
  // stage stays held until its P V completes, which these schedules issue behind the next tile's Q K^T: with two
  // stages the producer then had nothing to load ahead (docs/tuning-fwd.md). Not with a staged bias, which travels
  // with K/V on one pair (a skipped tile releases both), nor in the persistent kernels (three stages).
  static constexpr bool kSplitKV = kWs && kOverlap && !kStagedBias && kRing == 2;

  // -- tiles of a CTA (fwd/tile_scheduler.cuh)
  static constexpr bool kPersistent = kWs && fwd_persistent_headdim(kHeadDim);
  // A persistent CTA's next Q loads into Q's shared memory once every consumer warp has released it: after the key
  // loop, or, in the persistent overlap kernels without a staged bias, as soon as it is loaded into registers
  // (kQInRegisters: 32 a thread, ldmatrix'd once per query block, Q K^T then a register-A wgmma), so that its load
  // (about a microsecond) runs behind the tile's whole key loop; Q K^T then reads only K from shared memory.
  static constexpr bool kQInRegisters = kPersistent && kOverlap && !kStagedBias;
  // kStagedO: a persistent CTA's epilogue stages O in shared memory, in each warp's own rows of Q's tile, and copies it
  // out 16 bytes a lane with no shuffles (fwd/epilogue.cuh). Not with the tile counter, whose next tile the producer
  // announces.
  static constexpr bool kStagedO = kQInRegisters && !kTileCounter;

  static_assert(!kTma || Cfg::kStages == 2, "the TMA pipeline double-buffers K/V");
  static_assert(!kWs || kTma, "warp specialization needs the TMA loads (sm_90a, FA2_SM90_TMA)");
  static_assert(!kPingpong || (kWs && (kNThreads == 256 || kNThreads == 384)),
                "ping-pong: a ring of two or three consumer warpgroups, warp-specialized");
  static_assert(!kOverlap || kWs, "intra-warpgroup overlap: warp-specialized");
  // one stage would deadlock a warp-specialized kernel: a consumer waits for tile it before releasing tile it - 1
  static_assert(!kWs || kRing >= 2, "warp specialization needs at least two K/V stages");
  static_assert(!kWs || kWsProducerThreads * kWsProducerRegs + kNThreads * kWsConsumerRegs <=
                            kWsThreads * ((64 * 1024 / kWsThreads) & ~7),
                "warp specialization: producer + consumer registers within the CTA's launch register pool");
  static_assert((kMode == ScoreMode::kPlain) == (kBias == BiasType::kNone) || kMode == ScoreMode::kGeneral,
                "plain means no bias; bias-fold needs one");
  static_assert(!kStagedBias || (kBiasTileBytes <= Cfg::kSmemBiasTileBytes && kBiasTileBytes % 16 == 0),
                "a key tile of bias fits its stage and is a whole number of 16-byte TMA units");
  // the bytes each barrier expects are the bytes its boxes write (a mismatch would hang the wait)
  static_assert(kColBlocks * kBlockCols * kBlockN * 2 == Cfg::kSmemKVBytes, "K/V boxes cover the tile exactly");
  static_assert(kColBlocks * kBlockCols * kBlockM * 2 == Cfg::kSmemQBytes, "Q boxes cover the tile exactly");
  static_assert(!kTileCounter || kPersistent, "the tile counter serves persistent CTAs");
  static_assert(!kSplitKV || !kPersistent, "split K/V barriers: one tile per CTA");
  static_assert(!kVarlen || (kBias == BiasType::kNone && !kCluster),
                "varlen: no bias, no clusters (a pair's two query blocks may lie in different sequences)");
  static_assert(!kPagedKV_ || (kVarlen && kWs && !kTileCounter), "kPagedKV: the warp-specialized varlen twins");
  static_assert(!kDropout || (!kWs && (kMode == ScoreMode::kPlain || kMode == ScoreMode::kGeneral)),
                "dropout: the cp.async and pipelined kernels, plain or general score path");
  static_assert(!kCluster || (kPersistent && !kTileCounter && !kStagedBias && !kSplitKV && kColBlocks % 2 == 0),
                "clusters of two: the persistent plain kernels whose K/V column blocks split between the CTAs");
};

}  // namespace fwd
}  // namespace fa2
