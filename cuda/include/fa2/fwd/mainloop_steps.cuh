// The steps of one key tile that every forward mainloop shares: S's starting value (a bias folded from global
// memory), the wait for a TMA stage with its staged key bias, the score modification and mask, and the online
// softmax. Each schedule's mainloop (fwd/mainloop_*.cuh) puts them around its own products.
#pragma once
#include <cmath>

#include "fa2/dropout.cuh"
#include "fa2/fwd/score_bias.cuh"
#include "fa2/fwd/score_mod.cuh"
#include "fa2/fwd/tile_context.cuh"
#include "fa2/softmax.cuh"
#include "fa2/sm90/wgmma.cuh"

namespace fa2 {
namespace fwd {

// -- S's starting value. Bias-fold (not staged): bias / scale, loaded before the tile's wait so that the loads'
// latency overlaps it; a staged bias: nothing yet (S starts from the stage's bias once it has landed); else zeros.
template <class Traits, int kMTiles, int kNTiles>
__device__ __forceinline__ void start_scores(float (&acc_s)[kMTiles][kNTiles][4], const FwdTile<Traits>& tile,
                                             const FwdThreadRows<Traits>& rows, int n, int col0) {
  constexpr int kBlockN = Traits::kBlockN;
  if constexpr (Traits::kStagedBias) {
  } else if constexpr (Traits::kBiasFold) {
    using B = typename Traits::BiasElem;
    constexpr bool kKeyRow = Traits::kMode == ScoreMode::kKeyBiasFold;
    const AttentionParams& p = tile.p;
    // (divided here rather than read from p.inv_scale, the same value: ptxas spilled 0 -> 88 B in sm80 d 128)
    const float inv_scale = 1.f / p.scale;
    const B* bias_b = static_cast<const B*>(tile.bias_bh);
    if (n * kBlockN + kBlockN > p.seqlen_k) {
      init_from_bias<kKeyRow, /*kCheckCols=*/true>(acc_s, bias_b, p.bias_row_stride, p.bias_col_stride, rows.row0,
                                                   col0, p.seqlen_q, p.seqlen_k, inv_scale);
    } else {
      init_from_bias<kKeyRow, /*kCheckCols=*/false>(acc_s, bias_b, p.bias_row_stride, p.bias_col_stride, rows.row0,
                                                    col0, p.seqlen_q, p.seqlen_k, inv_scale);
    }
  } else {
    ptx::zero(acc_s);
  }
}

// -- TMA: tile n's stage (use number `use`) has landed, and Q with the tile's first (it == 0; not where Q is read into
// registers before the loop). Returns what a staged key bias tile holds (kMixed without one): a tile of zeros is no
// bias, one of -infs is skipped (kSkipMaskedTiles); only the others are read. Padding masks are mostly such tiles.
template <class Traits>
__device__ __forceinline__ KeyTileKind wait_stage(const FwdTile<Traits>& tile, const int& q_loads, int it, int buf, int use,
                                                  int n) {
  const FwdSmem<Traits>& smem = tile.smem;
  if (!Traits::kQInRegisters && it == 0) tile.pipe.wait_loaded(smem.bar_q(), q_loads & 1);
  tile.pipe.wait_loaded(smem.bar_kv(buf), (use / Traits::kRing) & 1);
  KeyTileKind bias_kind = KeyTileKind::kMixed;
  if constexpr (Traits::kStagedBias) {
    bias_kind = classify_key_bias_tile<typename Traits::BiasElem, Traits::kBiasTileBytes, Traits::kSkipMaskedTiles>(
        smem.ptr(smem.bias(buf)), tile.lane, tile.p.seqlen_k - n * Traits::kBlockN);
  }
  return bias_kind;
}

// -- varlen (TMA): V's rows past the sequence's keys in the first key tile visited (the sequence's last), zeroed
// before any P V reads them. P is 0 there, but 0 * NaN is NaN, and the TMA loads those rows as they are: a KV cache's
// rows past seqused_k (torch.empty's bytes), the next sequence's values, the rest of a page. (The dense maps end at
// seqlen_k, where the TMA writes zeros itself; the cp.async loads write zeros.) Each consumer warpgroup waits for the
// stage, zeroes the rows (the same zeros as the others), fences them for the tensor cores and syncs on its own named
// barrier; the key loop's wait for that stage then returns at once. Called before the key loop.
constexpr int kZeroTailBarrier = 5;  // 5 + w for warpgroup w (1: the epilogue's, 2..4: ping-pong's)
template <class Traits>
__device__ __forceinline__ void zero_v_past_sequence(const FwdTile<Traits>& tile, int use0) {
  if constexpr (Traits::kVarlen && Traits::kTma) {
    constexpr int kBlockN = Traits::kBlockN;
    const int keys_in_tile = tile.seq.seqlen_k - (tile.range.hi - 1) * kBlockN;
    if (keys_in_tile >= kBlockN) return;
    const int buf = use0 % Traits::kRing, warpgroup = tile.tid >> 7;
    if constexpr (Traits::kSplitKV) {
      tile.pipe.wait_v(buf, use0);
    } else {
      tile.pipe.wait_loaded(tile.smem.bar_kv(buf), (use0 / Traits::kRing) & 1);
    }
    sm90::zero_tile_rows_from<kBlockN, Traits::kHeadDim, Traits::kBlockCols>(tile.smem.v(buf), keys_in_tile,
                                                                            tile.tid & 127, 128);
    sm90::fence_proxy_async();
    if constexpr (!Traits::kWs) {
      __syncthreads();
    } else {
      static_assert(Traits::kNThreads / 128 <= 3, "named barriers 5..7");
      ptx::named_barrier_of<kZeroTailBarrier, 3, 128>(warpgroup);
    }
  }
}

// Whether stage buf's key block may need the mask: with params.varlen_stage_masks (the warp-specialized varlen
// kernel), the producer's mark (FwdBarriers::masked_stages), read after the stage's wait and before its release;
// otherwise true (the mask's own test decides). The mainloops read it behind the tile's Q K^T issue: read before,
// its load's latency (and the shared window's base) stood between the wait and the issue of every key block.
template <class Traits>
__device__ __forceinline__ bool stage_may_need_mask(const FwdTile<Traits>& tile, int buf) {
  if constexpr (Traits::kVarlen && Traits::kWs) {
    if (tile.p.varlen_stage_masks) return (ptx::ld_volatile_shared_b32(tile.smem.masked_stages()) >> buf) & 1;
  }
  return true;
}

// -- S (kGeneral: scale, softcap, + bias), then -inf where a key is out of sight: only the tiles that cross a boundary
// (sequence tail, causal diagonal, window edge). may_need_mask: false skips the test (stage_may_need_mask).
template <class Traits, int kMTiles, int kNTiles>
__device__ __forceinline__ void mod_and_mask_scores(float (&acc_s)[kMTiles][kNTiles][4], const FwdTile<Traits>& tile,
                                                    const FwdThreadRows<Traits>& rows, int n, int col0,
                                                    bool may_need_mask = true) {
  if constexpr (Traits::kMode == ScoreMode::kGeneral) {
    score_mod<typename Traits::T, Traits::kBias>(acc_s, tile.p, tile.bias_bh, rows.row0, col0);
  }
  if constexpr (Traits::kVarlen && Traits::kWs) {
    // the sequence's lengths loaded here (L1 hits): held in registers over the warp-specialized key loop, they cost
    // the consumers spills in it; loaded for every key block they drew ~6% of the d 128 kernel's stall samples (ncu),
    // hence the producer's stage marks where params.varlen_stage_masks is set
    if (may_need_mask) {
      const BlockInfo info = sequence_block_info<true, Traits::kWgmma>(tile.p, tile.coord.batch);
      if (info.needs_mask(n, Traits::kBlockN, tile.m0, Traits::kBlockM)) info.apply_mask(acc_s, rows.row0, col0);
    }
  } else {
    if (tile.info.needs_mask(n, Traits::kBlockN, tile.m0, Traits::kBlockM)) {
      tile.info.apply_mask(acc_s, rows.row0, col0);
    }
  }
}

// -- online softmax: m, l updated, O rescaled, S -> P. heavy_rows_possible: whether a tile visited so far held a bias
// below heavy_s (the only way a row becomes heavy). (A row can still end up below heavy_s without a bias that low,
// through q.k alone: as on the plain path, it then takes the ordinary update, whose error there is about
// |m * mult| 2^-24, small until |m| is huge.)
template <class Traits, int kMTiles, int kNTiles, int kDTiles>
__device__ __forceinline__ void softmax_step(OnlineSoftmax<kMTiles>& softmax, float (&acc_s)[kMTiles][kNTiles][4],
                                             float (&acc_o)[kMTiles][kDTiles][4], const FwdThreadRows<Traits>& rows,
                                             bool heavy_rows_possible) {
  constexpr bool kHeavyRows = Traits::kHeavyRows;
  if (kHeavyRows && heavy_rows_possible) {
    softmax.template update<kHeavyRows>(acc_s, acc_o, rows.mult, rows.heavy_s);
  } else {
    softmax.template update<false>(acc_s, acc_o, rows.mult, rows.heavy_s);
  }
}

// -- dropout: this thread's keep bits of key tile n (fa2/dropout.cuh). The mma.sync C fragments and a warp's part of a
// wgmma m64 accumulator map elements to threads alike (rows group, group + 8 of the warp's 16, keys 2 tig, 2 tig + 1
// of each n8 tile), so both paths draw the same groups: rows.row0 - group is the warp's first row, a multiple of 16.
template <class Traits>
__device__ __forceinline__ FragmentKeep<Traits::kMTiles, Traits::kNTiles> dropout_keep(const DropoutHead& dropout,
                                                                                      const FwdThreadRows<Traits>& rows,
                                                                                      int n, int lane) {
  return FragmentKeep<Traits::kMTiles, Traits::kNTiles>(dropout, rows.row0 - (lane >> 2), n * Traits::kBlockN,
                                                        lane >> 2, lane & 3);
}

}  // namespace fwd
}  // namespace fa2
