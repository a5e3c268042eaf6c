// The warp-specialized sm_90a forward's mainloop with the intra-warpgroup overlap (kOverlap; FA-3's d 128 and 256
// schedule with ping-pong too): P V of tile n-1 stays in flight while S of tile n becomes P, and O is rescaled once it
// completed: the same operations on O in the same order (x c(n-1), + P V(n-1), x c(n), ...). The persistent d 128
// kernels keep Q in registers (kQInRegisters).
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
struct FwdMainloopSm90Overlap {
  using T = typename Traits::T;
  static constexpr int kMTiles = Traits::kMTiles, kNTiles = Traits::kNTiles, kDTiles = Traits::kDTiles;
  static constexpr int kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  static constexpr bool kPingpong = Traits::kPingpong, kSkip = Traits::kSkipMaskedTiles;
  static constexpr int kWarpgroups = Traits::kConsumerWarpgroups, kLastWarpgroup = kWarpgroups - 1;
  static_assert(Traits::kWs && Traits::kOverlap && kMTiles == 1, "warp-specialized wgmma, P V behind the softmax");

  // P of the previous key tile, packed, in the object the consumers make per query tile (see p_prev in run)
  uint32_t carried_p[kNTiles / 2][4];

  // ping-pong: warpgroup 0 takes the tile's first turn (from the last warpgroup, here); one turn per key tile (run)
  __device__ __forceinline__ static void prologue(const FwdTile<Traits>& tile) {
    if constexpr (kPingpong) {
      if (tile.tid >> 7 == kLastWarpgroup) pingpong_signal_next<kWarpgroups>(kLastWarpgroup);
    }
  }

  __device__ __forceinline__ void run(const FwdTile<Traits>& tile, const FwdThreadRows<Traits>& rows,
                                      FwdConsumerState<Traits>& state, const int& use0, const int& q_loads,
                                      float (&acc_o)[kMTiles][kDTiles][4], OnlineSoftmax<kMTiles>& softmax) {
    using QTile = typename Traits::QTile;
    using KVTile = typename Traits::KVTile;
    const FwdPipeline<Traits>& pipe = tile.pipe;
    const FwdSmem<Traits>& smem = tile.smem;
    const KeyBlockRange range = tile.range;
    const int lane = tile.lane, warpgroup = tile.tid >> 7;  // (tid, not warp: the same shifts folded)
    // P of the previous tile, packed, and its stage. The same values wherever p_prev lives, but nvcc numbers the
    // registers by it and ptxas allocates by that numbering: a local of run gave the ping-pong tile-counter kernel
    // more instructions and another allocation throughout (key loop included), the object's array the staged-bias
    // kernels theirs. Each keeps the SASS it had with the loop written in the kernel.
    uint32_t local_p[kNTiles / 2][4];
    uint32_t (&p_prev)[kNTiles / 2][4] = Traits::kStagedBias ? local_p : carried_p;
    int buf_prev = 0;
    // whether p_prev holds a tile's P whose P V is still to be issued. When no tile is skipped (kSkipMaskedTiles)
    // that is `it > 0`, kept as that expression there (see the wait_hold<0>(acc_o) below).
    bool pv_pending = false;
    if (Traits::kQInRegisters && !state.q_in_registers) {
      state.read_q_rows(pipe, rows.q_lane, q_loads & 1);
      // (the arrive orders the warp's loads before it; the next Q's TMA waits for every warp's)
      if (tile.more_tiles) pipe.release(smem.bar_q_empty());
    }
    for (int n = range.hi - 1, it = 0; n >= range.lo; --n, ++it) {
      const int use = use0 + it;
      FA2_CTA_MARK(tile.trace_base + 1 + it, tile.trace_base >= 0 && it < FwdTrace::kIters);
      const int buf = use % Traits::kRing;
      const int col0 = n * kBlockN + (lane & 3) * 2;  // this thread's first fragment column (global key)
      float acc_s[kMTiles][kNTiles][4];               // S (kRowsPerWarp, kBlockN) of this warp
      start_scores(acc_s, tile, rows, n, col0);

      // -- tile n has landed
      const KeyTileKind bias_kind = wait_stage(tile, q_loads, it, buf, use, n);
      if constexpr (Traits::kStagedBias) {
        if (kSkip && bias_kind == KeyTileKind::kMasked) {  // (the same decision in every warp)
          // the previous tile's P V goes out now: its stage must not stay held while the ring moves on (the producer
          // would wait for it to be released, this warp for the producer). O gets the same operations in the same
          // order as if this tile were computed (x 1 exactly, + P V of zeros).
          if (pv_pending) {
            gemm_pv_wgmma_packed<T, KVTile, kNTiles, kDTiles>(acc_o, p_prev, smem.v(buf_prev));
            pipe.release_stage(buf_prev);
            pv_pending = false;
          }
          pipe.release_stage(buf);
          continue;
        }
        if (bias_kind == KeyTileKind::kZero) {
          ptx::zero(acc_s);
        } else {
          init_from_staged_key_bias(
              acc_s, reinterpret_cast<const typename Traits::BiasElem*>(smem.ptr(smem.bias(buf))) + (lane & 3) * 2,
              tile.p.inv_scale);
        }
      }

      // -- S (+)= Q K^T of this tile, then P V of the previous one behind it; wait for Q K^T only (groups complete in
      // order). With ping-pong, both go out in this warpgroup's turn: one turn per iteration, the next warpgroup's
      // opening once both are issued (the last warpgroup's last turn opens none: the after-loop P V takes no turn, and
      // warpgroup 0 got its first turn from the last before the loop, so each waits as often as it is signalled).
      if constexpr (kPingpong) pingpong_wait<kWarpgroups>(warpgroup);
      if constexpr (Traits::kQInRegisters) {
        gemm_qk_wgmma_rs<T, KVTile, kNTiles, kHeadDim>(acc_s, state.q_frag, smem.k(buf));
      } else {
        gemm_qk_wgmma<T, QTile, KVTile, kNTiles, kHeadDim, /*kWait=*/false>(acc_s, smem.q(), rows.wg_row0, smem.k(buf));
      }
      const bool stage_masked = stage_may_need_mask(tile, buf);  // (before the stage's release: kSplitKV's K below)
      const bool end_turn = kPingpong && (warpgroup != kLastWarpgroup || n > range.lo);
      if (kSkip ? pv_pending : it > 0) {
        pipe.wait_v(buf_prev, use - 1);
        gemm_pv_wgmma_packed<T, KVTile, kNTiles, kDTiles, /*kWait=*/false>(acc_o, p_prev, smem.v(buf_prev));
        if (end_turn) pingpong_signal_next<kWarpgroups>(warpgroup);
        sm90::wait_hold</*kPending=*/1>(acc_s);
      } else {
        if (end_turn) pingpong_signal_next<kWarpgroups>(warpgroup);
        sm90::wait_hold</*kPending=*/0>(acc_s);
      }
      if constexpr (Traits::kSplitKV) pipe.release_stage(buf);  // (K only: Q K^T has completed in this warp)
      mod_and_mask_scores(acc_s, tile, rows, n, col0, stage_masked);

      // -- online softmax on S; then the previous P V is done: O can be rescaled, the previous stage released, P_prev
      // rewritten. Every path waits, the first iteration's too (nothing is pending there): with the wait only where the
      // issue's condition holds, ptxas saw a path where O is rescaled with P V in flight and serialized every wgmma
      // (C7515). The wait goes in a basic block of its own, behind a branch that every warp of the warpgroup takes
      // alike (wait_group is .aligned): ptxas schedules a wait_group early in its block (it depends on no register),
      // and in the softmax's block it ran ahead of it, so that the softmax waited for the P V it was meant to overlap.
      // O is rescaled inside each arm: after the join, ptxas took the rescale for a write to the accumulators of a
      // wgmma in flight and serialized every wgmma (C7515). The staged-bias kernel (padding masks: overlap without
      // ping-pong at d 128) keeps the wait where ptxas puts it, which measured faster there (docs/tuning-fwd.md).
      float correction[2 * kMTiles];
      softmax.template update_scores<Traits::kHeavyRows>(acc_s, rows.mult, rows.heavy_s, correction);
      auto o_free_rescale = [&](bool release_prev) {
        sm90::wait_hold<0>(acc_o);
        sm90::hold_fragments(p_prev);
        if (release_prev) pipe.release_v(buf_prev);
        softmax.rescale(acc_o, correction);
      };
      const bool prev_pending = kSkip ? pv_pending : it > 0;  // (the same in every warp)
      if (Traits::kStagedBias) {
        o_free_rescale(prev_pending);  // (one block: the wait where ptxas puts it)
      } else if (prev_pending) {
        o_free_rescale(true);
      } else {
        o_free_rescale(false);
      }
#pragma unroll
      for (int kt = 0; kt < kNTiles / 2; ++kt) ptx::pack_k16<T>(acc_s[0], kt, p_prev[kt]);
      buf_prev = buf;
      pv_pending = true;
      // (this tile's P V goes out with the next tile's Q K^T, or after the loop)
    }
    // -- the last tile's P V (the key range is not empty, but its tiles may all be skipped)
    if (!kSkip || pv_pending) {
      pipe.wait_v(buf_prev, use0 + (range.hi - range.lo) - 1);
      gemm_pv_wgmma_packed<T, KVTile, kNTiles, kDTiles>(acc_o, p_prev, smem.v(buf_prev));
      pipe.release_v(buf_prev);
    }
  }
};

}  // namespace fwd
}  // namespace fa2
