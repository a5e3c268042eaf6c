// bwd_ws_dsplit_kernel's mainloop (d 256): both consumer warpgroups own the CTA's 64 keys and split the headdim
// (warpgroup w: dK, dV columns kDCols w ..); the products over the whole headdim are split by role instead. Per query
// block:
//   warpgroup 0: S^T = K Q^T -> P^T (registers) -> shared memory          | warpgroup 1: dP^T = V dO^T
//                dV_0 += P^T dO[:, 0:128]   (P^T from registers)        |   waits for P^T; dS^T = P^T (dP^T - D)
//                                                                       |   -> shared memory
//                                                                       |   dK_1 += dS^T Q[:, 128:256] (registers)
//                                                                       |   dV_1 += P^T dO[:, 128:256] (P^T smem)
//                waits for dS^T; dK_0 += dS^T Q[:, 0:128] (dS^T smem)   |
//   warpgroup 0, at the end of its part: dQ[:, 0:128] = dS K[:, 0:128]; warpgroup 1 the same for columns 128:256 a
//   query block late (its first pass behind its next dP^T, where it would wait idle for warpgroup 0's P^T; the
//   second behind that block's dS^T); each in two passes of 64 columns, added into dq_accum from the registers with
//   red.global.add.v4.f32 in dq_accum's fragment order (DqFragmentOrder: each warp's reduction 512 contiguous bytes;
//   a partial last query block row-major with red.v2), which bwd_convert_dq_kernel reads back.
// P^T and dS^T have two buffers each (alternating query blocks), so that one warpgroup may write the next while the
// other's products still read the last; the handshakes are two named barriers (1: P^T ready, 2: dS^T ready), each
// arrived at by its writer and waited on by its reader.
#pragma once
#include <cstdint>

#include "fa2/block_info.cuh"
#include "fa2/bwd/dq_fragment_order.h"
#include "fa2/bwd/fragments.cuh"  // pack_k16_fragments, ld_shared_pair, unpack2
#include "fa2/bwd/shared_storage.cuh"
#include "fa2/bwd/tile_scheduler.cuh"  // WsKeyBlock
#include "fa2/bwd/ws_dq.cuh"  // ws_red_dq
#include "fa2/bwd/ws_producer.cuh"  // ws_stats_offset
#include "fa2/bwd/ws_prologue.cuh"  // WsConsumerThread
#include "fa2/bwd/ws_scores.cuh"
#include "fa2/bwd_ptx.cuh"  // red_add_f32x4
#include "fa2/params.h"
#include "fa2/ptx.cuh"
#include "fa2/sm90/tma.cuh"
#include "fa2/sm90/wgmma.cuh"

namespace fa2 {
namespace bwd {

template <typename T, typename Cfg, bool kKeyBias>
struct WsDsplitMainloop {
  static constexpr int kHeadDim = Cfg::kHeadDim, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  static constexpr int kBlockCols = Cfg::kBlockCols, kDCols = Cfg::kDCols;
  using QTile = SwizzledTile<kBlockM, kHeadDim, kBlockCols>;  // Q, dO: (queries, d)
  using KTile = SwizzledTile<kBlockN, kHeadDim, kBlockCols>;  // K, V: (keys, d)
  using PTile = SwizzledTile<kBlockN, kBlockM, 64>;           // P^T, dS^T: (keys, queries)
  static constexpr int kSNTiles = kBlockM / 8;       // n8 tiles of S^T / dP^T per warp (its 16 keys x kBlockM queries)
  static constexpr int kKSteps = kBlockM / 16;       // k16 steps of dV, dK (queries)
  static constexpr int kQHalfBytes = Cfg::kSmemQBytes / 2;  // a warpgroup's kDCols columns of a Q / dO tile
  // dQ[:, col0:col0 + kDCols] = dS K[:, col0:] in two passes of kDCols / 2 columns (all kDCols beside dK, dV and the A
  // fragment made ptxas serialize the wgmmas). Fragment element (nt, 2 half + e): query 16 warp + group + 8 half,
  // column 8 nt + 2 tig + e of the pass.
  static constexpr int kDqPassCols = kDCols / 2, kDqPassTiles = kDqPassCols / 8;
  static_assert(kBlockN == 64 && kBlockM % 16 == 0 && Cfg::kConsumerWarpgroups == 2, "one m64 of keys, two halves");
  static_assert(kQHalfBytes == (kDCols / kBlockCols) * kBlockM * kBlockCols * 2, "a half is whole column blocks");
  static_assert(kStages >= 2, "the producer loads the next query block while the consumers work on this one");
  static_assert(ws_stat_box_elems<kBlockM>() * 4 <= Cfg::kSmemStatBytes, "a statistic's box fits its space");
  static_assert(kBlockM == DqFragmentOrder::kRows && kHeadDim == DqFragmentOrder::kCols && kDqPassTiles == 8,
                "the fragment order is of this kernel's tiles: 64 queries, two warpgroups' two passes of 8 n8 tiles");

  const WsDsplitSmem<Cfg>& smem;
  const WsKeyBlock& blk;
  WsConsumerThread th;
  int steps;  // the loop's (WsKeyBlock::steps)
  int key0;   // this thread's first fragment row (key in the block), both warpgroups
  int col0;   // this warpgroup's dK / dV / dQ columns
  const float (&key_bias)[2];  // kKeyBias: warpgroup 0's, of keys key0, key0 + 8
  BlockInfo info;

  // (The launch's parameters are passed to each function, never kept: so every access stays a plain load of the
  // kernel's parameters.)
  __device__ __forceinline__ WsDsplitMainloop(const WsDsplitSmem<Cfg>& smem_, const WsKeyBlock& blk_,
                                              const WsConsumerThread& th_, int key0_, const BlockInfo& info_,
                                              const float (&key_bias_)[2])
      : smem(smem_), blk(blk_), th(th_), steps(th_.steps), key0(key0_), col0(th_.wg * kDCols), key_bias(key_bias_),
        info(info_) {}

  // This thread's dQ fragments of pass `pass` of the query block at m0_of of (batch, head) bh_of added into dq_accum:
  // in its fragment order where the block is whole (the launcher tells the conversion), else row-major (ws_red_dq).
  __device__ __forceinline__ void red_dq(const AttentionParams& p, const float (&acc)[kDqPassCols / 2], int64_t bh_of, int m0_of,
                                         int pass) const {
    if (m0_of + kBlockM <= p.seqlen_q) {
      // (n8 tile 0's place, then each tile's distance from it: one base register for the eight)
      float* const base = p.dq_accum + (bh_of * p.seqlen_q + m0_of) * int64_t(kHeadDim) +
                          DqFragmentOrder::fragment_offset(th.wg, pass, 0, th.ctid & 127);
#pragma unroll
      for (int nt = 0; nt < kDqPassTiles; ++nt) {
        ptx::red_add_f32x4(base + DqFragmentOrder::fragment_offset(0, 0, nt, 0),
                           make_float4(acc[4 * nt], acc[4 * nt + 1], acc[4 * nt + 2], acc[4 * nt + 3]));
      }
    } else {
      ws_red_dq<kHeadDim>(p, reinterpret_cast<const float(&)[kDqPassTiles][4]>(acc), bh_of,
                          m0_of + th.warp_in_wg * 16 + th.group, col0 + pass * kDqPassCols + 2 * th.tig);
    }
  }
  // The dQ product of pass `pass`: dS^T (keys, queries) of buffer `ds_buffer` as the MN-major A (queries = M).
  __device__ __forceinline__ void issue_dq(float (&acc_dq)[kDqPassCols / 2], int ds_buffer, int pass) const {
    sm90::gemm_ss<T, kDqPassCols, kBlockN / 16, /*kAMnMajor=*/true, /*kBMnMajor=*/true, PTile, KTile,
                  /*kWait=*/false, /*kOverwrite=*/true>(acc_dq, smem.ds(ds_buffer), 0, smem.k(), col0 + pass * kDqPassCols);
  }

  // Warpgroup 0's part of the query block m0 of (batch, head) bh_q in stage s (P^T, dS^T buffers b).
  __device__ __forceinline__ void warpgroup0_step(const AttentionParams& p, float (&acc_dk)[kDCols / 2], float (&acc_dv)[kDCols / 2],
                                                  const WsStats& stats, int s, int b, int m0, int64_t bh_q) const {
    float acc_sdp[kBlockM / 2];  // S^T: (this warp's 16 keys, kBlockM queries)
    auto& sdp_frag = reinterpret_cast<float(&)[kSNTiles][4]>(acc_sdp);
    uint32_t a_frag[kKSteps][4];  // P^T: register-A of dV_0
    // -- S^T = K Q^T
    sm90::gemm_ss<T, kBlockM, kHeadDim / 16, false, false, KTile, QTile, /*kWait=*/false, /*kOverwrite=*/true>(
        acc_sdp, smem.k(), 0, smem.q(s), 0);
    sm90::wait_hold<0>(acc_sdp);
    // -- P^T (ws_scores_to_p), rounded to T; masked (P = 0) on boundary blocks
    if (info.needs_mask(blk.n_block, kBlockN, m0, kBlockM) || m0 + kBlockM > p.seqlen_q) {
      ws_scores_to_p<kKeyBias, true>(sdp_frag, stats, p, info, m0, blk.n0 + key0, th.tig, key_bias);
    } else {
      ws_scores_to_p<kKeyBias, false>(sdp_frag, stats, p, info, m0, blk.n0 + key0, th.tig, key_bias);
    }
    pack_k16_fragments<T>(sdp_frag, a_frag);
    // -- P^T to shared memory for warpgroup 1 (its dS^T and dV_1), then dV_0 += P^T dO[:, 0:kDCols]
    ws_store_a_fragments<PTile>(smem.p(b), a_frag, key0);
    sm90::fence_proxy_async();  // P^T, stored by threads, then read by warpgroup 1's wgmma
    ptx::named_barrier_arrive<1, 256>();
    sm90::gemm_rs<T, kDCols, kKSteps, QTile, /*kWait=*/false>(acc_dv, a_frag, smem.dout(s));
    // -- dK_0 += dS^T Q[:, 0:kDCols], dS^T from warpgroup 1
    ptx::named_barrier_sync<2, 256>();
    sm90::gemm_ss<T, kDCols, kKSteps, /*kAMnMajor=*/false, /*kBMnMajor=*/true, PTile, QTile, /*kWait=*/false>(
        acc_dk, smem.ds(b), 0, smem.q(s), 0);
    // -- this block's dQ[:, 0:kDCols] (dS^T of both warpgroups' keys: warpgroup 1 stored it all before the handshake)
    float acc_dq[kDqPassCols / 2];  // (this warp's 16 queries, one pass's columns)
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      issue_dq(acc_dq, b, pass);
      if (pass == 0) {
        sm90::wait_hold<0>(acc_dv, acc_dk, acc_dq);
        sm90::hold_fragments(a_frag);
      } else {
        sm90::wait_hold<0>(acc_dq);
      }
      red_dq(p, acc_dq, bh_q, m0, pass);
    }
  }

  // Warpgroup 1's part of the query block in stage s (P^T, dS^T buffers b), and the previous step's dQ (prev_bh,
  // prev_m0; none in the first).
  __device__ __forceinline__ void warpgroup1_step(const AttentionParams& p, float (&acc_dk)[kDCols / 2], float (&acc_dv)[kDCols / 2],
                                                  const WsStats& stats, int s, int b, int it, int64_t prev_bh,
                                                  int prev_m0) const {
    float acc_sdp[kBlockM / 2];  // dP^T: (this warp's 16 keys, kBlockM queries)
    auto& sdp_frag = reinterpret_cast<float(&)[kSNTiles][4]>(acc_sdp);
    uint32_t a_frag[kKSteps][4];  // dS^T: register-A of dK_1
    float acc_dq_prev[kDqPassCols / 2];  // the previous query block's dQ[:, kDCols:], one pass
    // -- dP^T = V dO^T
    sm90::gemm_ss<T, kBlockM, kHeadDim / 16, false, false, KTile, QTile, /*kWait=*/false, /*kOverwrite=*/true>(
        acc_sdp, smem.v(), 0, smem.dout(s), 0);
    // the previous query block's first dQ pass behind dP^T (issued unconditionally, as every wgmma here: in the
    // first iteration it reads a dS^T buffer nothing wrote and its result is dropped)
    issue_dq(acc_dq_prev, b ^ 1, 0);
    sm90::wait_hold<1>(acc_sdp);
    // -- dS^T = P^T (dP^T - D), P^T (as rounded for dV_0) from warpgroup 0
    ptx::named_barrier_sync<1, 256>();
#pragma unroll
    for (int j = 0; j < kSNTiles; ++j) {
      const float2 dsum = make_float2(stats.dsum[8 * j + 2 * th.tig], stats.dsum[8 * j + 2 * th.tig + 1]);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float2 prob = unpack2<T>(ld_shared_pair<PTile>(smem.p(b), key0 + 8 * half, 8 * j + 2 * th.tig));
        sdp_frag[j][half * 2] = prob.x * (sdp_frag[j][half * 2] - dsum.x);
        sdp_frag[j][half * 2 + 1] = prob.y * (sdp_frag[j][half * 2 + 1] - dsum.y);
      }
    }
    pack_k16_fragments<T>(sdp_frag, a_frag);
    // -- dS^T to shared memory for warpgroup 0 (its dK_0) and both dQ products
    ws_store_a_fragments<PTile>(smem.ds(b), a_frag, key0);
    sm90::fence_proxy_async();  // dS^T, stored by threads, then read by wgmma
    ptx::named_barrier_arrive<2, 256>();
    sm90::wait_hold<0>(acc_dq_prev);
    if (it > 0) red_dq(p, acc_dq_prev, prev_bh, prev_m0, 0);
    issue_dq(acc_dq_prev, b ^ 1, 1);
    // -- dK_1 += dS^T Q[:, kDCols:], dV_1 += P^T dO[:, kDCols:] (P^T from shared memory)
    sm90::gemm_rs<T, kDCols, kKSteps, QTile, /*kWait=*/false>(acc_dk, a_frag, smem.q(s) + kQHalfBytes);
    sm90::gemm_ss<T, kDCols, kKSteps, /*kAMnMajor=*/false, /*kBMnMajor=*/true, PTile, QTile, /*kWait=*/false>(
        acc_dv, smem.p(b), 0, smem.dout(s), kDCols);
    // (this block's dQ, in the next iteration, reads every key of dS^T for each warp's queries: all four warps'
    //  stores, not only this warp's; warpgroup 0 has them through the handshake)
    ptx::named_barrier_sync<5, 128>();
    sm90::wait_hold<2>(acc_dq_prev);  // (the second pass, committed before dK_1 and dV_1)
    if (it > 0) red_dq(p, acc_dq_prev, prev_bh, prev_m0, 1);
    sm90::wait_hold<0>(acc_dv, acc_dk);
    sm90::hold_fragments(a_frag);
  }

  // Warpgroup 1's dQ of the last step's query block (none without query blocks: K was never waited for; the range is
  // the CTA's, so the branch is uniform).
  __device__ __forceinline__ void warpgroup1_last_dq(const AttentionParams& p, int64_t prev_bh, int prev_m0) const {
    if (th.wg == 1 && steps > 0) {
      const int last_b = (steps - 1) & 1;
      float acc_dq_last[kDqPassCols / 2];
#pragma unroll
      for (int pass = 0; pass < 2; ++pass) {
        issue_dq(acc_dq_last, last_b, pass);
        sm90::wait_hold<0>(acc_dq_last);
        red_dq(p, acc_dq_last, prev_bh, prev_m0, pass);
      }
    }
  }

  // Every query block of the CTA's key block (and GQA group, head after head: warpgroup 1's late dQ is then that of
  // the previous step, the previous head's last block where the head changed): dK, dV accumulated (this warp's 16 keys,
  // the warpgroup's kDCols columns).
  __device__ __forceinline__ void run(const AttentionParams& p, float (&acc_dk)[kDCols / 2], float (&acc_dv)[kDCols / 2]) const {
    if (steps > 0) sm90::mbarrier_wait_untimed(smem.kv_loaded(), 0);
    // this step's query block and (batch, head), and the previous step's (warpgroup 1 adds its dQ a step late)
    int m = blk.m_lo, prev_m0 = 0;
    int64_t bh_q = blk.bh, prev_bh = blk.bh;
    for (int it = 0; it < steps; ++it) {
      const int s = it % kStages, b = it & 1, m0 = m * kBlockM;
      sm90::mbarrier_wait_untimed(smem.full(s), (it / kStages) & 1);
      const int stats_off = ws_stats_offset(ws_stats_row(bh_q, p.seqlen_q, m0));
      const WsStats stats{smem.template at<const float>(smem.lse(s)) + stats_off,
                          smem.template at<const float>(smem.dsum(s)) + stats_off,
                          smem.template at<const float>(smem.shift(s)) + stats_off};
      if (th.wg == 0) {
        warpgroup0_step(p, acc_dk, acc_dv, stats, s, b, m0, bh_q);
      } else {
        warpgroup1_step(p, acc_dk, acc_dv, stats, s, b, it, prev_bh, prev_m0);
      }
      // -- every product of this warpgroup that read the stage has completed (at its waits above: one warp's
      //    wait_group covers the warpgroup's whole wgmma, as the stage release of bwd_ws_kernel.cuh and CUTLASS's
      //    consumer release assume; the other warpgroup's S^T or dP^T, which read all columns, before the
      //    handshakes): release it
      __syncwarp();
      if (th.lane == 0) sm90::mbarrier_arrive(smem.empty(s));
      prev_m0 = m0, prev_bh = bh_q;
      if (++m > blk.m_hi) m = blk.m_lo, ++bh_q;  // (the group's next head)
    }
    warpgroup1_last_dq(p, prev_bh, prev_m0);
  }
};

}  // namespace bwd
}  // namespace fa2
