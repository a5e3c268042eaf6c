// FlashAttention-2 backward, sm_90a warp-specialized main kernel for large headdims (d 256; BwdWsSplitTileConfig,
// bwd_tile_config.h): bwd_ws_kernel.cuh's structure (a producer thread streams Q, dO, lse, D by the TMA through a
// kStages ring; K, V loaded once; the transposed scores, keys as the wgmma M), with
// the headdim split between the two consumer warpgroups instead of the keys, because one warpgroup cannot hold dK and
// dV of 64 keys at d 256. Both own the CTA's 64 keys; per query block:
//   warpgroup 0: S^T = K Q^T -> P^T (registers) -> shared memory          | warpgroup 1: dP^T = V dO^T
//                dV_0 += P^T dO[:, 0:128]   (P^T from registers)        |   waits for P^T; dS^T = P^T (dP^T - D)
//                                                                       |   -> shared memory
//                                                                       |   dK_1 += dS^T Q[:, 128:256] (registers)
//                                                                       |   dV_1 += P^T dO[:, 128:256] (P^T smem)
//                waits for dS^T; dK_0 += dS^T Q[:, 0:128] (dS^T smem)   |
//   warpgroup 0, at the end of its part: dQ[:, 0:128] = dS K[:, 0:128]; warpgroup 1 the same for columns 128:256 a
//   query block late (its first pass behind its next dP^T, where it would wait idle for warpgroup 0's P^T; the
//   second behind that block's dS^T); each in two passes of 64 columns, added into dq_accum from the registers with
//   red.global.add.v4.f32 in dq_accum's fragment order (DqFragmentOrder, bwd/dq_fragment_order.h: each warp's
//   reduction 512 contiguous bytes; a partial last query block row-major with red.v2), which bwd_convert_dq_kernel
//   reads back (faster than dQ staged for the TMA's reduce-add, than no deferral, and than row-major red.v2:
//   docs/tuning.md).
// P^T and dS^T have two buffers each (alternating query blocks), so that one warpgroup may write the next while the
// other's products still read the last; the handshakes are two named barriers (P^T ready, dS^T ready), each
// arrived at by its writer and waited on by its reader. The plain path and its key-row bias variant (kKeyBias, padding
// masks: as bwd_ws_kernel.cuh's, the bias of warpgroup 0's keys in its registers, all-padded key blocks skipped); rows
// past seqlen_q are masked (P = 0) as there (their lse / D are another row's). With GQA where the launcher has a CTA
// sum its group (ws_groups_gqa) the query blocks come head after head of the group, as in bwd_ws_kernel.cuh
// (warpgroup 1's late dQ then that of the previous step: the previous head's last block where the head changed).
// The softmax scale multiplies dK here and dQ in bwd_convert_dq_kernel (dS is w.r.t. s = scale q.k).
// kVarlen (packed sequences): as bwd_ws_kernel.cuh's (the sequence's rows of the packed tensors; the rows of a box
// past its end masked as queries and as keys, not stored as keys), dQ added in the fragment order at the sequence's
// own blocks of dq_accum where the glue laid it out so, else row-major (WsDsplitDq).
//
// Parts: the schedule, the producer and the consumer prologue (ws_prologue.cuh, shared with bwd_ws_kernel.cuh),
// WsDsplitSharedStorage (shared_storage.cuh), the scores (ws_scores.cuh), the dK / dV stores (ws_dkv_store.cuh).
// (The per-block handshake stays in this function as one piece: split into functions, the compiler's output changed.)
#pragma once
#include <cstdint>

#include "fa2/block_info.cuh"
#include "fa2/bwd/dq_fragment_order.h"  // DqFragmentOrder::varlen_block_row0
#include "fa2/bwd/ws_dsplit_dq.cuh"
#include "fa2/bwd/fragments.cuh"  // pack_k16_fragments, ld_shared_pair, unpack2
#include "fa2/bwd/shared_storage.cuh"
#include "fa2/bwd/tile_scheduler.cuh"
#include "fa2/bwd/ws_dkv_store.cuh"
#include "fa2/bwd/ws_dq.cuh"  // ws_red_dq
#include "fa2/bwd/ws_producer.cuh"  // ws_stats_offset, ws_stats_row
#include "fa2/bwd/ws_prologue.cuh"
#include "fa2/bwd/ws_scores.cuh"
#include "fa2/bwd_ptx.cuh"  // red_add_f32x4
#include "fa2/bwd_tile_config.h"
#include "fa2/params.h"
#include "fa2/ptx.cuh"
#include "fa2/sm90/tma.cuh"
#include "fa2/sm90/wgmma.cuh"

namespace fa2 {
namespace bwd {

template <typename T, typename Cfg, bool kKeyBias, bool kVarlen = false>
__global__ void __launch_bounds__(Cfg::kNThreads, 1)
    bwd_ws_dsplit_kernel(const __grid_constant__ AttentionParams p, const __grid_constant__ sm90::BwdTensorMaps maps) {
  static_assert(!(kVarlen && kKeyBias), "varlen: no bias");
  constexpr int kHeadDim = Cfg::kHeadDim, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kBlockCols = Cfg::kBlockCols, kDCols = Cfg::kDCols;
  using QTile = SwizzledTile<kBlockM, kHeadDim, kBlockCols>;   // Q, dO: (queries, d)
  using KTile = SwizzledTile<kBlockN, kHeadDim, kBlockCols>;   // K, V: (keys, d)
  using PTile = SwizzledTile<kBlockN, kBlockM, 64>;            // P^T, dS^T: (keys, queries)
  constexpr int kSNTiles = kBlockM / 8;   // n8 tiles of S^T / dP^T per warp (its 16 keys x kBlockM queries)
  constexpr int kDTiles = kDCols / 8;     // n8 tiles of this warpgroup's dK / dV / dQ columns
  constexpr int kQHalfBytes = Cfg::kSmemQBytes / 2;  // a warpgroup's kDCols columns of a Q / dO tile
  static_assert(kBlockN == 64 && kBlockM % 16 == 0 && Cfg::kConsumerWarpgroups == 2, "one m64 of keys, two halves");
  static_assert(kQHalfBytes == (kDCols / kBlockCols) * kBlockM * kBlockCols * 2, "a half is whole column blocks");
  static_assert(kStages >= 2, "the producer loads the next query block while the consumers work on this one");

  extern __shared__ __align__(1024) unsigned char smem[];
  const WsDsplitSmem<Cfg> shared(smem);  // WsDsplitSharedStorage
  const uint32_t sK = shared.k(), sV = shared.v();
  if (sK % 1024 != 0) __trap();  // the descriptors and the TMA's swizzle assume 1024-byte aligned tiles

  // -- the key block and its query blocks, the ring's barriers; the producer warpgroup's whole part
  const WsKeyBlock blk = ws_start<T, Cfg, kKeyBias, kVarlen>(p, maps, shared);
  if (blk.producer) return;
  const int n_block = blk.n_block, head = blk.head, batch = blk.batch, n0 = blk.n0, m_lo = blk.m_lo, m_hi = blk.m_hi;
  const int64_t bh = kVarlen ? int64_t(head) : blk.bh;  // (varlen: the head of (nheads, total_q) rows)

  // -- the consumer warpgroups
  const WsConsumerThread th = ws_consumer_thread(blk);
  const int lane = th.lane, steps = th.steps, ctid = th.ctid, wg = th.wg;
  const int warp_in_wg = th.warp_in_wg, group = th.group, tig = th.tig;
  const int key0 = warp_in_wg * 16 + group;  // this thread's first fragment row (key in the block), both warpgroups
  const int col0 = wg * kDCols;              // this warpgroup's dK / dV / dQ columns
  // kKeyBias: the bias of this thread's keys key0, key0 + 8 (0 past seqlen_k: those keys are masked), for warpgroup
  // 0's P^T (the same for every head of a GQA group the CTA sums: ws_start)
  float key_bias[2] = {0.f, 0.f};
  if constexpr (kKeyBias) {
    if (wg == 0) ws_load_key_bias<T>(p, batch, head, n0 + key0, key_bias);
  }
  const BlockInfo info = kVarlen ? BlockInfo{blk.seq.seqlen_q, blk.seq.seqlen_k, p.window_left, p.window_right}
                                 : BlockInfo{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};

  float acc_dk[kDCols / 2], acc_dv[kDCols / 2];  // (this warp's 16 keys, the warpgroup's kDCols columns)
  ptx::zero(reinterpret_cast<float(&)[1][kDTiles][4]>(acc_dk));
  ptx::zero(reinterpret_cast<float(&)[1][kDTiles][4]>(acc_dv));

  // dQ of a warpgroup's columns, two passes per query block (WsDsplitDq)
  constexpr int kDqPassCols = kDCols / 2;  // (columns of a pass)
  const int64_t dq_block_row0 = kVarlen ? DqFragmentOrder::varlen_block_row0(blk.seq.q_row0, batch) : 0;
  const WsDsplitDq<T, Cfg, kVarlen> dq{shared, sK, wg, ctid, warp_in_wg, group, tig, col0, blk.seq, dq_block_row0};

  if (steps > 0) {
    sm90::mbarrier_wait_untimed(shared.kv_loaded(), /*phase=*/0);
    ws_zero_keys_past_sequence<Cfg, kVarlen>(blk, shared, ctid);
  }
  // this step's query block and (batch, head), and the previous step's (warpgroup 1 adds its dQ a step late)
  int m = m_lo, prev_m0 = 0;
  int64_t bh_q = bh, prev_bh = bh;
  for (int it = 0; it < steps; ++it) {
    const int s = it % kStages, b = it & 1, m0 = m * kBlockM;
    sm90::mbarrier_wait_untimed(shared.full(s), (it / kStages) & 1);
    const int stats_off = ws_stats_offset(kVarlen ? ws_stats_row(bh_q, p.total_q, blk.seq.q_row0 + m0)
                                                  : ws_stats_row(bh_q, p.seqlen_q, m0));
    const WsStats stats{shared.template at<const float>(shared.lse(s)) + stats_off,
                        shared.template at<const float>(shared.dsum(s)) + stats_off,
                        shared.template at<const float>(shared.shift(s)) + stats_off};
    float acc_sdp[kBlockM / 2];  // S^T (warpgroup 0) or dP^T (warpgroup 1)
    auto& sdp_frag = reinterpret_cast<float(&)[kSNTiles][4]>(acc_sdp);
    uint32_t a_frag[kBlockM / 16][4];  // P^T (warpgroup 0) or dS^T (warpgroup 1): register-A of dV_0 / dK_1
    if (wg == 0) {
      // -- S^T = K Q^T
      sm90::gemm_ss<T, kBlockM, kHeadDim / 16, false, false, KTile, QTile, /*kWait=*/false, /*kOverwrite=*/true>(
          acc_sdp, sK, 0, shared.q(s), 0);
      sm90::wait_hold<0>(acc_sdp);
      // -- P^T (ws_scores_to_p), rounded to T; masked (P = 0) on boundary blocks
      const int seqlen_q = kVarlen ? info.seqlen_q : p.seqlen_q;
      if (info.needs_mask(n_block, kBlockN, m0, kBlockM) || m0 + kBlockM > seqlen_q) {
        ws_scores_to_p<kKeyBias, true, kVarlen>(sdp_frag, stats, p, info, m0, n0 + key0, tig, key_bias);
        ws_zero_dsum_past_sequence<kSNTiles>(stats, seqlen_q - m0, tig);  // (read by warpgroup 1 after barrier 1)
      } else {
        ws_scores_to_p<kKeyBias, false, kVarlen>(sdp_frag, stats, p, info, m0, n0 + key0, tig, key_bias);
      }
      pack_k16_fragments<T>(sdp_frag, a_frag);
      // -- P^T to shared memory for warpgroup 1 (its dS^T and dV_1), then dV_0 += P^T dO[:, 0:kDCols]
      ws_store_a_fragments<PTile>(shared.p(b), a_frag, key0);
      sm90::fence_proxy_async();  // P^T, stored by threads, then read by warpgroup 1's wgmma
      ptx::named_barrier_arrive<1, 256>();
      sm90::gemm_rs<T, kDCols, kBlockM / 16, QTile, /*kWait=*/false>(acc_dv, a_frag, shared.dout(s));
      // -- dK_0 += dS^T Q[:, 0:kDCols], dS^T from warpgroup 1
      ptx::named_barrier_sync<2, 256>();
      sm90::gemm_ss<T, kDCols, kBlockM / 16, /*kAMnMajor=*/false, /*kBMnMajor=*/true, PTile, QTile, /*kWait=*/false>(
          acc_dk, shared.ds(b), 0, shared.q(s), 0);
      // -- this block's dQ[:, 0:kDCols] (dS^T of both warpgroups' keys: warpgroup 1 stored it all before the handshake)
      float acc_dq[kDqPassCols / 2];  // (this warp's 16 queries, one pass's columns)
#pragma unroll
      for (int pass = 0; pass < 2; ++pass) {
        dq.issue(acc_dq, b, pass);
        if (pass == 0) {
          sm90::wait_hold<0>(acc_dv, acc_dk, acc_dq);
          sm90::hold_fragments(a_frag);
        } else {
          sm90::wait_hold<0>(acc_dq);
        }
        dq.red(p, acc_dq, bh_q, m0, pass);
      }
    } else {
      float acc_dq_prev[kDqPassCols / 2];  // the previous query block's dQ[:, kDCols:], one pass
      // -- dP^T = V dO^T
      sm90::gemm_ss<T, kBlockM, kHeadDim / 16, false, false, KTile, QTile, /*kWait=*/false, /*kOverwrite=*/true>(
          acc_sdp, sV, 0, shared.dout(s), 0);
      // the previous query block's first dQ pass behind dP^T (issued unconditionally, as every wgmma here: in the
      // first iteration it reads a dS^T buffer nothing wrote and its result is dropped)
      dq.issue(acc_dq_prev, b ^ 1, /*pass=*/0);
      sm90::wait_hold<1>(acc_sdp);
      // -- dS^T = P^T (dP^T - D), P^T (as rounded for dV_0) from warpgroup 0
      ptx::named_barrier_sync<1, 256>();
#pragma unroll
      for (int j = 0; j < kSNTiles; ++j) {
        const float2 dsum = make_float2(stats.dsum[8 * j + 2 * tig], stats.dsum[8 * j + 2 * tig + 1]);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float2 prob = unpack2<T>(ld_shared_pair<PTile>(shared.p(b), key0 + 8 * half, 8 * j + 2 * tig));
          sdp_frag[j][half * 2] = prob.x * (sdp_frag[j][half * 2] - dsum.x);
          sdp_frag[j][half * 2 + 1] = prob.y * (sdp_frag[j][half * 2 + 1] - dsum.y);
        }
      }
      pack_k16_fragments<T>(sdp_frag, a_frag);
      // -- dS^T to shared memory for warpgroup 0 (its dK_0) and both dQ products
      ws_store_a_fragments<PTile>(shared.ds(b), a_frag, key0);
      sm90::fence_proxy_async();  // dS^T, stored by threads, then read by wgmma
      ptx::named_barrier_arrive<2, 256>();
      sm90::wait_hold<0>(acc_dq_prev);
      if (it > 0) dq.red(p, acc_dq_prev, prev_bh, prev_m0, /*pass=*/0);
      dq.issue(acc_dq_prev, b ^ 1, /*pass=*/1);
      // -- dK_1 += dS^T Q[:, kDCols:], dV_1 += P^T dO[:, kDCols:] (P^T from shared memory)
      sm90::gemm_rs<T, kDCols, kBlockM / 16, QTile, /*kWait=*/false>(acc_dk, a_frag, shared.q(s) + kQHalfBytes);
      sm90::gemm_ss<T, kDCols, kBlockM / 16, /*kAMnMajor=*/false, /*kBMnMajor=*/true, PTile, QTile, /*kWait=*/false>(
          acc_dv, shared.p(b), 0, shared.dout(s), kDCols);
      // (this block's dQ, in the next iteration, reads every key of dS^T for each warp's queries: all four warps'
      //  stores, not only this warp's; warpgroup 0 has them through the handshake)
      ptx::named_barrier_sync<5, 128>();
      sm90::wait_hold<2>(acc_dq_prev);  // (the second pass, committed before dK_1 and dV_1)
      if (it > 0) dq.red(p, acc_dq_prev, prev_bh, prev_m0, /*pass=*/1);
      sm90::wait_hold<0>(acc_dv, acc_dk);
      sm90::hold_fragments(a_frag);
    }
    // -- every product of this warpgroup that read the stage has completed (at its waits above: one warp's
    //    wait_group covers the warpgroup's whole wgmma, as the stage release of bwd_ws_kernel.cuh and CUTLASS's consumer
    //    release assume; the other warpgroup's S^T or dP^T, which read all columns, before the handshakes): release it
    __syncwarp();
    if (lane == 0) sm90::mbarrier_arrive(shared.empty(s));
    prev_m0 = m0, prev_bh = bh_q;
    if (++m > m_hi) m = m_lo, ++bh_q;  // (the group's next head)
  }
  // -- warpgroup 1's dQ of the last step's query block (none without query blocks: K was never waited for; the range
  //    is the CTA's, so the branch is uniform)
  if (wg == 1 && steps > 0) {
    const int last_b = (steps - 1) & 1;
    float acc_dq_last[kDqPassCols / 2];
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      dq.issue(acc_dq_last, last_b, pass);
      sm90::wait_hold<0>(acc_dq_last);
      dq.red(p, acc_dq_last, prev_bh, prev_m0, pass);
    }
  }

  // -- epilogue: dK = scale dS^T Q, dV; keys past seqlen_k and dims past headdim are not stored. A key block no query
  //    sees stores zeros.
  // (GQA's fp32 partials per query head; else at the kv head: its accumulators, or stored like k)
  const int dkv_head = p.h_h_k_ratio > 1 && p.gqa_dkv == GqaDkv::kPartials ? head : blk.head_k;
  if constexpr (kVarlen) {  // (rows of the packed tensors from the sequence's first key; only its keys)
    ws_store_dk_dv<T, kDTiles, true>(p, reinterpret_cast<float(&)[kDTiles][4]>(acc_dk),
                                     reinterpret_cast<float(&)[kDTiles][4]>(acc_dv), 0, dkv_head,
                                     blk.seq.k_row0 + n0 + key0, col0, tig, blk.seq.k_row0 + blk.seq.seqlen_k);
  } else {
    ws_store_dk_dv<T>(p, reinterpret_cast<float(&)[kDTiles][4]>(acc_dk),
                      reinterpret_cast<float(&)[kDTiles][4]>(acc_dv), batch, dkv_head, n0 + key0, col0, tig);
  }
  // (barrier 6: 1, 2 and 5 are the handshakes' above)
  ws_key_block_done<Cfg, /*kBarrier=*/6>(p, bh, blk.heads, ctid);
}

}  // namespace bwd
}  // namespace fa2
