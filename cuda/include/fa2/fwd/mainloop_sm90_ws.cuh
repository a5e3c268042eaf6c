// The warp-specialized sm_90a forward's mainloop without the overlap: the consumer warpgroups wait for each stage the
// producer (fwd/producer.cuh) loaded, multiply, and release it; no CTA barrier inside the key loop. With ping-pong
// (kPingpong) the consumer warpgroups take turns in a ring issuing their products, one "slot" each (P V of tile n,
// then Q K^T of tile n + 1), so that the others' softmax runs while one's products occupy the tensor cores.
#pragma once
#include "fa2/fwd/gemm.cuh"
#include "fa2/fwd/mainloop_steps.cuh"
#include "fa2/fwd/pingpong.cuh"
#include "fa2/fwd/score_bias.cuh"
#include "fa2/fwd/tile_context.cuh"
#include "fa2/ptx.cuh"
#include "fa2/sm90/wgmma.cuh"

namespace fa2 {
namespace fwd {

template <class Traits>
struct FwdMainloopSm90Ws {
  using T = typename Traits::T;
  static constexpr int kMTiles = Traits::kMTiles, kNTiles = Traits::kNTiles, kDTiles = Traits::kDTiles;
  static constexpr int kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  static constexpr bool kPingpong = Traits::kPingpong;
  static constexpr int kWarpgroups = Traits::kConsumerWarpgroups, kLastWarpgroup = kWarpgroups - 1;
  static_assert(Traits::kWs && !Traits::kOverlap, "warp-specialized, products in order");

  // ping-pong: warpgroup 0 takes the tile's first slot. Each warpgroup waits for its own barrier once per key tile plus
  // once, and gets as many arrivals from the one before it in the ring: warpgroup 0 this one from the last, then one
  // per key tile; the others one per key tile and that warpgroup's last one after the loop (the last warpgroup's last
  // slot ends with nobody waiting). The count is per tile, so tiles do not mix.
  __device__ __forceinline__ static void prologue(const FwdTile<Traits>& tile) {
    if constexpr (kPingpong) {
      if (tile.tid >> 7 == kLastWarpgroup) pingpong_signal_next<kWarpgroups>(kLastWarpgroup);
    }
  }

  __device__ __forceinline__ static void run(const FwdTile<Traits>& tile, const FwdThreadRows<Traits>& rows,
                                             FwdConsumerState<Traits>& state, const int& use0, const int& q_loads,
                                             float (&acc_o)[kMTiles][kDTiles][4], OnlineSoftmax<kMTiles>& softmax) {
    using QTile = typename Traits::QTile;
    using KVTile = typename Traits::KVTile;
    const KeyBlockRange range = tile.range;
    const int lane = tile.lane, warpgroup = tile.tid >> 7;  // (tid, not warp: the same shifts folded)
    for (int n = range.hi - 1, it = 0; n >= range.lo; --n, ++it) {
      const int use = use0 + it;
      FA2_CTA_MARK(tile.trace_base + 1 + it, tile.trace_base >= 0 && it < FwdTrace::kIters);
      const int buf = use % Traits::kRing;
      const int col0 = n * kBlockN + (lane & 3) * 2;  // this thread's first fragment column (global key)
      float acc_s[kMTiles][kNTiles][4];               // S (kRowsPerWarp, kBlockN) of this warp
      // A staged key tile of zero bias: S = Q K^T as on the plain path, whose wgmma ptxas issues without reading the
      // accumulator, dropping the zeroing (where the compiler sees the zeros, below). Clear: S += Q K^T.
      bool overwrite_s = false;
      start_scores(acc_s, tile, rows, n, col0);

      // -- tile n has landed (the producer refills a stage once its empty barrier completes)
      const KeyTileKind bias_kind = wait_stage(tile, q_loads, it, buf, use, n);
      bool stage_masked = true;  // (read behind the Q K^T issue: stage_may_need_mask)
      if constexpr (Traits::kStagedBias) {
        if (Traits::kSkipMaskedTiles && bias_kind == KeyTileKind::kMasked) {  // (the same decision in every warp)
          tile.pipe.release_stage(buf);
          continue;
        }
        if (bias_kind == KeyTileKind::kZero) {
          if constexpr (kPingpong) {
            ptx::zero(acc_s);
          } else {
            overwrite_s = true;
          }
        } else {
          init_from_staged_key_bias(
              acc_s, reinterpret_cast<const typename Traits::BiasElem*>(tile.smem.ptr(tile.smem.bias(buf))) + (lane & 3) * 2,
              tile.p.inv_scale);
        }
      }

      // -- S (+)= Q K^T
      if constexpr (kPingpong) {
        // this warpgroup's slot: opened here for the first tile, else before the previous tile's P V; closed once
        // Q K^T is issued, so the other warpgroup issues its products while this one waits for S and runs the softmax
        if (it == 0) pingpong_wait<kWarpgroups>(warpgroup);
        gemm_qk_wgmma<T, QTile, KVTile, kNTiles, kHeadDim, /*kWait=*/false>(acc_s, tile.smem.q(), rows.wg_row0,
                                                                             tile.smem.k(buf));
        stage_masked = stage_may_need_mask(tile, buf);
        pingpong_signal_next<kWarpgroups>(warpgroup);
        sm90::wait_hold<0>(acc_s);
      } else if (Traits::kStagedBias && overwrite_s) {
        // its own copy of the issue, after zeros the compiler sees (a runtime scale-d would keep the zeroing)
        ptx::zero(acc_s);
        gemm_qk_wgmma<T, QTile, KVTile, kNTiles, kHeadDim>(acc_s, tile.smem.q(), rows.wg_row0, tile.smem.k(buf));
      } else if constexpr (Traits::kVarlen) {
        gemm_qk_wgmma<T, QTile, KVTile, kNTiles, kHeadDim, /*kWait=*/false>(acc_s, tile.smem.q(), rows.wg_row0,
                                                                             tile.smem.k(buf));
        stage_masked = stage_may_need_mask(tile, buf);
        sm90::wait_hold<0>(acc_s);
      } else {
        gemm_qk_wgmma<T, QTile, KVTile, kNTiles, kHeadDim>(acc_s, tile.smem.q(), rows.wg_row0, tile.smem.k(buf));
      }
      mod_and_mask_scores(acc_s, tile, rows, n, col0, stage_masked);
      softmax_step(softmax, acc_s, acc_o, rows, /*heavy_rows_possible=*/true);
      // -- O += P V
      if constexpr (kPingpong) pingpong_wait<kWarpgroups>(warpgroup);  // its next slot: P V, then the next Q K^T
      gemm_pv_wgmma<T, KVTile, kNTiles, kDTiles>(acc_o, acc_s, tile.smem.v(buf));
      // both products of this warp have completed (each waits for its wgmma group): its reads of stage buf are done
      tile.pipe.release_stage(buf);
    }
    if constexpr (kPingpong) {
      if (warpgroup != kLastWarpgroup) pingpong_signal_next<kWarpgroups>(warpgroup);  // its last slot ends
    }
  }
};

}  // namespace fwd
}  // namespace fa2
