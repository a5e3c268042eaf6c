// The forward's mainloop with cp.async loads: the sm80 instruction path (mma.sync m16n8k16 from ldmatrix fragments),
// and sm_90a's wgmma products in a build with FA2_SM90_TMA=0. Every thread loads its part of each tile; a CTA barrier
// per tile. Two stages: tile n-1 loads while tile n computes. One stage (FA-2's split): V[n] loads during
// S = Q K[n]^T, K[n-1] during the softmax and P V[n].
#pragma once
#include "fa2/dropout.cuh"
#include "fa2/fwd/gemm.cuh"
#include "fa2/fwd/mainloop_steps.cuh"
#include "fa2/fwd/producer.cuh"
#include "fa2/fwd/tile_context.cuh"
#include "fa2/ptx.cuh"
#include "fa2/sm90/wgmma.cuh"  // fence_proxy_async

namespace fa2 {
namespace fwd {

template <class Traits>
struct FwdMainloopCpAsync {
  using T = typename Traits::T;
  using Cfg = typename Traits::Cfg;
  static constexpr int kMTiles = Traits::kMTiles, kNTiles = Traits::kNTiles, kDTiles = Traits::kDTiles;
  static constexpr int kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  static_assert(!Traits::kTma && !Traits::kWs, "cp.async loads, one tile per CTA");
  static_assert(Cfg::kStages == 1 || Cfg::kStages == 2, "single- or double-buffered K/V");

  __device__ __forceinline__ static FwdCpAsyncLoads<Traits> loads(const FwdTile<Traits>& tile) {
    return {tile.p, tile.smem, tile.k, tile.v, tile.headdim, tile.tid, tile.info.seqlen_k};
  }

  // -- prologue: Q and the first (highest) key tile in flight
  __device__ __forceinline__ static void prologue(const FwdTile<Traits>& tile) {
    const FwdCpAsyncLoads<Traits> load = loads(tile);
    load.q(tile.q, tile.rows_q);
    load.template k_tile</*kCheckRows=*/true>(tile.range.hi - 1, /*buf=*/0);
    if constexpr (Cfg::kStages == 2) load.template v_tile</*kCheckRows=*/true>(tile.range.hi - 1, /*buf=*/0);
    ptx::cp_async_commit();
  }

  static constexpr bool kDrawKeepFirst = FragmentKeep<kMTiles, kNTiles>::kGroups <= 8;

  // S (kRowsPerWarp, kBlockN) of this warp for the current key tile. In the object the consumers make per query tile,
  // not a local of run: the same values, but nvcc numbers S's registers by where it is declared and ptxas allocates
  // by that numbering (as a local of run, the key-row bias-fold kernels with a float bias got another allocation).
  float acc_s[kMTiles][kNTiles][4];

  __device__ __forceinline__ void run(const FwdTile<Traits>& tile, const FwdThreadRows<Traits>& rows,
                                      FwdConsumerState<Traits>& state, const int& use0, const int& q_loads,
                                      float (&acc_o)[kMTiles][kDTiles][4], OnlineSoftmax<kMTiles>& softmax) {
    const FwdCpAsyncLoads<Traits> load = loads(tile);
    const KeyBlockRange range = tile.range;
    const int lane = tile.lane;
    [[maybe_unused]] const DropoutHead dropout =
        dropout_head<Traits::kDropout>(tile.p, tile.coord.batch, tile.coord.head);
    for (int n = range.hi - 1, it = 0; n >= range.lo; --n, ++it) {
      const int use = use0 + it;  // (it: one tile per CTA)
      FA2_CTA_MARK(tile.trace_base + 1 + it, tile.trace_base >= 0 && it < FwdTrace::kIters);
      const int buf = Traits::kRing == 1 ? 0 : use % Traits::kRing;
      const int col0 = n * kBlockN + (lane & 3) * 2;  // this thread's first fragment column (global key)
      // dropout's keep bits of tile n: drawn before S takes its registers where a thread has at most 8 groups (d >= 96;
      // ptxas spilled 24 B at d 128, 60 B drawn after the softmax), else after the softmax (d 64, 16 groups: 36-72 B,
      // up to 584 B drawn first)
      [[maybe_unused]] FragmentKeep<kMTiles, kNTiles> keep;
      if constexpr (Traits::kDropout && kDrawKeepFirst) keep = dropout_keep(dropout, rows, n, lane);
      start_scores(acc_s, tile, rows, n, col0);

      // -- tile n has landed (this thread's copies, then the barrier), and every warp is done with the buffers about
      //    to be refilled
      ptx::cp_async_wait<0>();
      if constexpr (Traits::kWgmma) sm90::fence_proxy_async();  // cp.async's writes, then read by wgmma (async proxy)
      __syncthreads();
      if constexpr (Cfg::kStages == 2) {
        if (n > range.lo) {  // prefetch tile n-1 into the other buffer: overlaps this whole iteration
          load.template k_tile</*kCheckRows=*/false>(n - 1, buf ^ 1);
          load.template v_tile</*kCheckRows=*/false>(n - 1, buf ^ 1);
        }
      } else {
        if (n == range.hi - 1) {
          load.template v_tile</*kCheckRows=*/true>(n, /*buf=*/0);  // overlaps S = Q K^T
        } else {
          load.template v_tile</*kCheckRows=*/false>(n, /*buf=*/0);
        }
      }
      ptx::cp_async_commit();

      // -- S (+)= Q K^T
      if constexpr (Traits::kWgmma) {
        gemm_qk_wgmma<T, typename Traits::QTile, typename Traits::KVTile, kNTiles, kHeadDim>(
            acc_s, tile.smem.q(), rows.wg_row0, tile.smem.k(buf));
      } else {
        gemm_qk<T, typename Traits::QTile, typename Traits::KVTile, kMTiles, kNTiles, kHeadDim>(
            acc_s, rows.q_lane, tile.smem.k(buf) + rows.k_lane);
      }
      mod_and_mask_scores(acc_s, tile, rows, n, col0);

      if constexpr (Cfg::kStages == 1) {
        ptx::cp_async_wait<0>();  // V[n] landed; every warp is done reading K[n]
        if constexpr (Traits::kWgmma) sm90::fence_proxy_async();
        __syncthreads();
        if (n > range.lo) load.template k_tile</*kCheckRows=*/false>(n - 1, /*buf=*/0);  // overlaps softmax, P V
        ptx::cp_async_commit();
      }

      softmax_step(softmax, acc_s, acc_o, rows, /*heavy_rows_possible=*/true);
      // -- dropout: P ∘ Z / (1 - p) (l took P's sum)
      if constexpr (Traits::kDropout) {
        if constexpr (!kDrawKeepFirst) keep = dropout_keep(dropout, rows, n, lane);
        keep.apply(acc_s, dropout.keep_scale);
      }
      // -- O += P V
      if constexpr (Traits::kWgmma) {
        gemm_pv_wgmma<T, typename Traits::KVTile, kNTiles, kDTiles>(acc_o, acc_s, tile.smem.v(buf));
      } else {
        gemm_pv<T, typename Traits::KVTile, kMTiles, kNTiles, kDTiles>(acc_o, acc_s, tile.smem.v(buf) + rows.v_lane);
      }
    }
  }
};

}  // namespace fwd
}  // namespace fa2
