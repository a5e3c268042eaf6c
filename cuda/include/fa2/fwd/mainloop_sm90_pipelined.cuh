// The pipelined sm_90a forward's mainloop: two warpgroups multiply with wgmma, TMA loads on mbarriers, and thread 0
// issues the next K/V tile's copies after a CTA barrier per tile (the default at d <= 96: tile_config.h). A key-row
// bias's tile (kStagedBias) is folded to fp32 once for the CTA there. With kDropout, P ∘ Z / (1 - p) before P V, the
// same keep bits as the cp.async mainloop's (fwd/mainloop_steps.cuh, dropout_keep).
#pragma once
#include <cmath>

#include "fa2/fwd/gemm.cuh"
#include "fa2/fwd/mainloop_steps.cuh"
#include "fa2/fwd/score_bias.cuh"
#include "fa2/fwd/tile_context.cuh"
#include "fa2/ptx.cuh"

namespace fa2 {
namespace fwd {

template <class Traits>
struct FwdMainloopSm90Pipelined {
  using T = typename Traits::T;
  using BiasElem = typename Traits::BiasElem;
  static constexpr int kMTiles = Traits::kMTiles, kNTiles = Traits::kNTiles, kDTiles = Traits::kDTiles;
  static constexpr int kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim, kNThreads = Traits::kNThreads;
  static_assert(Traits::kTma && !Traits::kWs, "TMA loads issued by thread 0 between CTA barriers");
  // dropout's keep bits drawn before S takes its registers (at most 8 groups a thread: kBlockN <= 128 keys; the Philox
  // work overlaps the tile's wait), else after the softmax: drawn there, the 128-register d 64 plain kernel spilled
  // 200 B (ptxas), none drawn first
  static constexpr bool kDrawKeepFirst = true;

  // -- prologue: the barriers (after the tile's empty-range check, as this one-tile kernel always had them: run
  //    first, ptxas spilled 20 -> 44-68 B more in the 128-register d 64 key-row kernel), Q and the first key tile
  __device__ __forceinline__ static void prologue(const FwdTile<Traits>& tile) {
    tile.pipe.init(tile.p);
    if (tile.tid == 0) {
      if constexpr (Traits::kVarlen) {  // (the sequence's rows of the packed tensors: FwdTmaLoads::q_row)
        tile.tma.q(tile.tma.q_row(tile.m0, tile.seq), tile.coord.head, /*batch=*/0);
        tile.tma.kv(tile.p, tile.range.hi - 1, /*buf=*/0, tile.head_k, tile.coord.batch, 0, 0, tile.tma.k_row0(tile.seq));
      } else {
        tile.tma.q(tile.m0, tile.coord.head, tile.coord.batch);
        tile.tma.kv(tile.p, tile.range.hi - 1, /*buf=*/0, tile.head_k, tile.coord.batch, tile.bias_head, tile.bias_batch);
      }
    }
  }

  // The staged bias tile of stage buf folded (bias / scale, finite when the bias is) to fp32 once for the CTA, one
  // key per thread, before the CTA barrier; every warp then reads its columns' values as they are (faster than every
  // thread converting the columns it holds). Returns whether a key of the tile is heavy (below heavy_s, finite), which
  // the barrier tells every thread (nonzero: an int, as __syncthreads_or gives it; a bool returned here made nvcc
  // combine it with heavy_rows_possible in 16-bit registers, not predicates): the tiles of a padding mask (0 / -inf)
  // then run the softmax without the heavy-row branch. (Measurements: docs/tuning-fwd.md.)
  __device__ __forceinline__ static int fold_staged_bias(const FwdTile<Traits>& tile, const FwdThreadRows<Traits>& rows,
                                                         int buf) {
    const BiasElem* raw = reinterpret_cast<const BiasElem*>(tile.smem.ptr(tile.smem.bias(buf)));
    float* folded = reinterpret_cast<float*>(tile.smem.ptr(tile.smem.bias_folded(buf)));
    // one key per thread: a loop here cost the 128-register d 64 kernel spills in its key loop (ptxas)
    static_assert(kBlockN <= kNThreads, "a key tile's bias is folded one key per thread");
    bool heavy_key = false;
    if (tile.tid < kBlockN) {
      const float folded_key = fold_bias(staged_bias_value(raw, tile.tid), tile.p.inv_scale);
      folded[tile.tid] = folded_key;
      heavy_key = folded_key < rows.heavy_s && folded_key != -INFINITY;
    }
    return __syncthreads_or(heavy_key);
  }

  __device__ __forceinline__ static void run(const FwdTile<Traits>& tile, const FwdThreadRows<Traits>& rows,
                                             FwdConsumerState<Traits>& state, const int& use0, const int& q_loads,
                                             float (&acc_o)[kMTiles][kDTiles][4], OnlineSoftmax<kMTiles>& softmax) {
    const KeyBlockRange range = tile.range;
    const int lane = tile.lane;
    // Whether a tile visited so far held a bias below heavy_s (finite): the only way a row becomes heavy (softmax.cuh),
    // learnt from each staged tile's fold (without a staged bias: assumed). Once set it stays set: a row made heavy by
    // one tile needs the heavy-row update on every later one too (the ordinary update's m * mult of a heavy max
    // overflows to -inf when mult > 1, and -inf - -inf is NaN).
    bool heavy_rows_possible = !Traits::kStagedBias;
    for (int n = range.hi - 1, it = 0; n >= range.lo; --n, ++it) {
      const int use = use0 + it;  // (it: one tile per CTA)
      FA2_CTA_MARK(tile.trace_base + 1 + it, tile.trace_base >= 0 && it < FwdTrace::kIters);
      const int buf = Traits::kRing == 1 ? 0 : use % Traits::kRing;
      const int col0 = n * kBlockN + (lane & 3) * 2;  // this thread's first fragment column (global key)
      float acc_s[kMTiles][kNTiles][4];               // S (kRowsPerWarp, kBlockN) of this warp
      // A staged key tile of zero bias: S = Q K^T as on the plain path, whose wgmma ptxas issues without reading the
      // accumulator, dropping the zeroing (where the compiler sees the zeros, below). Clear: S += Q K^T.
      bool overwrite_s = false;
      // (the Philox key and counter read again per tile, L1 hits: kept over the loop, they cost the 128-register plain
      // kernel spills)
      [[maybe_unused]] const DropoutHead dropout =
          dropout_head<Traits::kDropout>(tile.p, tile.coord.batch, tile.coord.head);
      [[maybe_unused]] FragmentKeep<kMTiles, kNTiles> keep;
      if constexpr (Traits::kDropout && kDrawKeepFirst) keep = dropout_keep(dropout, rows, n, lane);
      start_scores(acc_s, tile, rows, n, col0);

      // -- tile n has landed, and every warp is done with the stage about to be refilled
      const KeyTileKind bias_kind = wait_stage(tile, q_loads, it, buf, use, n);
      if constexpr (Traits::kStagedBias) {
        // (a -inf tile is read as a mixed one where it is not skipped)
        if (bias_kind == KeyTileKind::kMixed || (!Traits::kSkipMaskedTiles && bias_kind == KeyTileKind::kMasked)) {
          const bool heavy_tile = fold_staged_bias(tile, rows, buf) != 0;
          heavy_rows_possible = heavy_rows_possible || heavy_tile;
        } else {
          __syncthreads();  // (all +0)
        }
      } else {
        __syncthreads();
      }
      // overlaps this whole iteration
      if (tile.tid == 0 && n > range.lo) {
        if constexpr (Traits::kVarlen) {
          tile.tma.kv(tile.p, n - 1, buf ^ 1, tile.head_k, tile.coord.batch, 0, 0, tile.tma.k_row0(tile.seq));
        } else {
          tile.tma.kv(tile.p, n - 1, buf ^ 1, tile.head_k, tile.coord.batch, tile.bias_head, tile.bias_batch);
        }
      }
      if constexpr (Traits::kStagedBias) {
        if (Traits::kSkipMaskedTiles && bias_kind == KeyTileKind::kMasked) continue;  // (the same in every warp)
        if (bias_kind == KeyTileKind::kZero) {
          overwrite_s = true;
        } else {
          init_from_folded_key_bias(acc_s,
                                    reinterpret_cast<const float2*>(tile.smem.ptr(tile.smem.bias_folded(buf))) + (lane & 3));
        }
      }

      // -- S (+)= Q K^T
      using QTile = typename Traits::QTile;
      using KVTile = typename Traits::KVTile;
      if (Traits::kStagedBias && overwrite_s) {
        // its own copy of the issue, after zeros the compiler sees (a runtime scale-d would keep the zeroing, slower:
        // docs/tuning-fwd.md)
        ptx::zero(acc_s);
        gemm_qk_wgmma<T, QTile, KVTile, kNTiles, kHeadDim>(acc_s, tile.smem.q(), rows.wg_row0, tile.smem.k(buf));
      } else {
        gemm_qk_wgmma<T, QTile, KVTile, kNTiles, kHeadDim>(acc_s, tile.smem.q(), rows.wg_row0, tile.smem.k(buf));
      }
      mod_and_mask_scores(acc_s, tile, rows, n, col0);
      softmax_step(softmax, acc_s, acc_o, rows, heavy_rows_possible);
      // -- dropout: P ∘ Z / (1 - p) (l took P's sum)
      if constexpr (Traits::kDropout) {
        if constexpr (!kDrawKeepFirst) keep = dropout_keep(dropout, rows, n, lane);
        keep.apply(acc_s, dropout.keep_scale);
      }
      // -- O += P V
      gemm_pv_wgmma<T, KVTile, kNTiles, kDTiles>(acc_o, acc_s, tile.smem.v(buf));
    }
  }
};

}  // namespace fwd
}  // namespace fa2
