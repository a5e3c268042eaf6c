// bwd_ws_kernel's mainloop (d 64 / 128): consumer warpgroup w owns keys 64 w .. 64 w + 63 of the CTA's kBlockN and,
// per query block of the ring, computes the transposed scores (keys as the wgmma M):
//   S^T = K_w Q^T, dP^T = V_w dO^T      (both from shared memory; S^T issued during the block before, behind its dQ)
//   P^T = exp2(S^T scale log2e - lse log2e)            (lse, D per query: per accumulator column; ws_scores.cuh)
//   dV_w += P^T dO                       (P^T from registers: the accumulator layout of two n8 tiles is the register-A
//                                         layout of a k16 step)
//   dS^T = P^T (dP^T - D) -> shared memory (two buffers); dK_w += dS^T Q (dS^T from registers)
//   dQ_w = dS K: 64 of the block's queries (kBlockM 128) or half of d (kBlockM 64), both operands MN-major from shared
//        memory (every key of the block), staged in shared memory and added to dq_accum by one TMA reduce-add per
//        32 columns (ws_dq.cuh)
// and releases the stage once its products have completed.
#pragma once
#include <cstdint>
#include <type_traits>

#include "fa2/block_info.cuh"
#include "fa2/bwd/fragments.cuh"  // pack_k16_fragments, unpack2
#include "fa2/bwd/shared_storage.cuh"
#include "fa2/bwd/tile_scheduler.cuh"  // WsKeyBlock
#include "fa2/bwd/ws_dq.cuh"
#include "fa2/bwd/ws_producer.cuh"  // ws_stats_offset
#include "fa2/bwd/ws_prologue.cuh"  // WsConsumerThread
#include "fa2/bwd/ws_scores.cuh"
#include "fa2/cta_trace.cuh"
#include "fa2/dropout.cuh"
#include "fa2/params.h"
#include "fa2/ptx.cuh"
#include "fa2/sm90/tma.cuh"
#include "fa2/sm90/wgmma.cuh"

namespace fa2 {
namespace bwd {

// What bwd_ws_kernel's consumer parts (the mainloop, the epilogue) share: the CTA's shared memory and key block, and
// this thread's place (rows, its warpgroup's dQ part). (The launch's parameters and tensor maps are passed to each
// part's functions, never kept in a part: so every access stays a plain load of the kernel's parameters.)
template <typename Cfg>
struct WsConsumer {
  static constexpr int kDqRows = Cfg::kDqRows, kDqCols = Cfg::kDqCols;
  // (FA2_CTA_TRACE: entry; K/V and the first stage landed; the end of each of the first 60 query blocks; the loop's
  // end; the kernel's end)
  static constexpr int kTraceLanded = trace::kFirstEvent, kTraceBlock0 = kTraceLanded + 1, kTraceBlocks = 60;
  static constexpr int kTraceLoopEnd = kTraceBlock0 + kTraceBlocks, kTraceEnd = kTraceLoopEnd + 1;
  static_assert(kTraceEnd < trace::kSlots, "the events fit a CTA's slots");

  WsSmem<Cfg> smem;
  WsKeyBlock blk;
  WsConsumerThread th;
  int steps;  // the loop's (WsKeyBlock::steps)
  int key0;   // this thread's first fragment row (key in the block)
  // this warpgroup's dQ reduce-adds: issued (and their shared memory's reads waited for) by its first thread; its part
  // of a query block's dQ: rows dq_row0 .. + 63, columns dq_col0 .. + kDqCols - 1
  bool dq_issuer;
  int dq_row0, dq_col0;

  __device__ __forceinline__ WsConsumer(const WsSmem<Cfg>& smem_, const WsKeyBlock& blk_, const WsConsumerThread& th_)
      : smem(smem_), blk(blk_), th(th_), steps(th_.steps),
        key0(th_.wg * 64 + th_.warp_in_wg * 16 + th_.group),
        dq_issuer((th_.ctid & 127) == 0),
        dq_row0(Cfg::kDqSplitRows ? th_.wg * kDqRows : 0),
        dq_col0(Cfg::kDqSplitRows ? 0 : th_.wg * kDqCols) {}
};

// kVarlen: info holds the key block's sequence's lengths (its query rows past them are the next sequence's).
// kDropout (plain path, not varlen): dV += (P^T ∘ Z / (1 - p)) dO and dS^T = P^T ∘ (dP^T ∘ Z / (1 - p) - D), Z the
// forward's keep mask (TransposedKeep).
template <typename T, typename Cfg, bool kKeyBias, bool kVarlen = false, bool kDropout = false>
struct WsMainloop : WsConsumer<Cfg> {
  static_assert(!kDropout || (!kKeyBias && !kVarlen), "dropout: the plain path");
  static constexpr int kHeadDim = Cfg::kHeadDim, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  static constexpr int kBlockCols = Cfg::kBlockCols, kColBlocks = kHeadDim / kBlockCols;
  using QTile = SwizzledTile<kBlockM, kHeadDim, kBlockCols>;  // Q, dO: (queries, d)
  using KTile = SwizzledTile<kBlockN, kHeadDim, kBlockCols>;  // K, V: (keys, d)
  using DsTile = SwizzledTile<kBlockN, kBlockM, 64>;          // dS^T: (keys, queries)
  static constexpr int kSNTiles = kBlockM / 8;  // n8 tiles of S^T / dP^T per warp (its 16 keys x kBlockM queries)
  static constexpr int kKSteps = kBlockM / 16;  // k16 steps of dV, dK (queries)
  static constexpr int kDqRows = Cfg::kDqRows, kDqCols = Cfg::kDqCols;
  static constexpr int kDqNTiles = kDqCols / 8;  // n8 tiles of this warpgroup's dQ part (16 queries x kDqCols)
  using Keep = TransposedKeep<kKSteps>;
  static_assert(kColBlocks * kBlockCols * kBlockN * 2 == Cfg::kSmemKVBytes, "K/V boxes cover the tile exactly");
  static_assert(kColBlocks * kBlockCols * kBlockM * 2 == Cfg::kSmemQBytes, "Q/dO boxes cover the tile exactly");
  static_assert(ws_stat_box_elems<kBlockM>() * 4 <= Cfg::kSmemStatBytes, "a statistic's box fits its space");
  using Base = WsConsumer<Cfg>;
  using Base::blk, Base::dq_col0, Base::dq_issuer, Base::dq_row0, Base::key0, Base::smem, Base::steps, Base::th;

  const float (&key_bias)[2];  // kKeyBias: the bias of this thread's keys key0, key0 + 8
  BlockInfo info;

  __device__ __forceinline__ WsMainloop(const Base& base, const BlockInfo& info_, const float (&key_bias_)[2])
      : Base(base), key_bias(key_bias_), info(info_) {}

  // S^T = K_w Q^T: (64 keys, kBlockM queries) of the query block in stage s, issued (wait_hold completes it)
  __device__ __forceinline__ void issue_s(float (&acc_s)[kBlockM / 2], int s) const {
    sm90::gemm_ss<T, kBlockM, kHeadDim / 16, false, false, KTile, QTile, /*kWait=*/false, /*kOverwrite=*/true>(
        acc_s, smem.k(), th.wg * 64, smem.q(s), 0);
  }
  // dP^T = V_w dO^T: (64 keys, kBlockM queries), issued
  __device__ __forceinline__ void issue_dp(float (&acc_dp)[kBlockM / 2], int s) const {
    sm90::gemm_ss<T, kBlockM, kHeadDim / 16, false, false, KTile, QTile, /*kWait=*/false, /*kOverwrite=*/true>(
        acc_dp, smem.v(), th.wg * 64, smem.dout(s), 0);
  }

  // The stage's row statistics from row (the flat (batch, head, query) row of the block's first query) on.
  __device__ __forceinline__ WsStats stats_of(int s, int row) const {
    const int stats_off = ws_stats_offset(row);
    return WsStats{smem.template at<const float>(smem.lse(s)) + stats_off,
                   smem.template at<const float>(smem.dsum(s)) + stats_off,
                   smem.template at<const float>(smem.shift(s)) + stats_off};
  }

  // kDropout: p_frag = P^T ∘ Z / (1 - p) rounded to T, prob(j, half) giving S^T's elements (n8 tile j, 2 half + 0 / 1)
  // (read before p_frag's entry is written: it may be that entry)
  template <class Prob>
  __device__ __forceinline__ void pack_dropped(uint32_t (&p_frag)[kKSteps][4], const Keep& keep, float scale,
                                               Prob prob) const {
#pragma unroll
    for (int kt = 0; kt < kKSteps; ++kt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int j = 2 * kt + r / 2, half = r % 2;
        const float2 x = prob(j, half);
        p_frag[kt][r] = ptx::pack2<T>(keep.dropped(j, half, 0, x.x, scale), keep.dropped(j, half, 1, x.y, scale));
      }
  }

  // P^T from S^T (ws_scores_to_p), rounded to T: p_frag (kKSteps k16 register-A fragments); masked (P = 0) on
  // boundary blocks. kDropout (dS after dV): p_frag holds P^T ∘ Z / (1 - p), acc_s keeps P^T (dS needs it where
  // Z = 0); with dS before dV, dv_and_ds drops p_frag once dS has read it.
  __device__ __forceinline__ void scores_to_p(const AttentionParams& p, float (&acc_s)[kBlockM / 2], const WsStats& stats, int m0,
                                              uint32_t (&p_frag)[kKSteps][4], const Keep& keep) const {
    auto& s_frag = reinterpret_cast<float(&)[kSNTiles][4]>(acc_s);  // (16 keys, kBlockM queries)
    const int seqlen_q = kVarlen ? info.seqlen_q : p.seqlen_q;
    if (info.needs_mask(blk.n_block, kBlockN, m0, kBlockM) || m0 + kBlockM > seqlen_q) {
      ws_scores_to_p<kKeyBias, true, kVarlen>(s_frag, stats, p, info, m0, blk.n0 + key0, th.tig, key_bias);
      ws_zero_dsum_past_sequence<kSNTiles>(stats, seqlen_q - m0, th.tig);
    } else {
      ws_scores_to_p<kKeyBias, false, kVarlen>(s_frag, stats, p, info, m0, blk.n0 + key0, th.tig, key_bias);
    }
    if constexpr (kDropout && !Cfg::kDsBeforeDv) {
      pack_dropped(p_frag, keep, p.dropout_keep_scale,
                   [&](int j, int half) { return make_float2(s_frag[j][2 * half], s_frag[j][2 * half + 1]); });
    } else {
      pack_k16_fragments<T>(s_frag, p_frag);
    }
  }

  // dV_w += P^T dO (issued) and dS^T = P^T (dP^T - D): ds_frag. No register that an in-flight wgmma reads as its A
  // operand (p_frag for dV, ds_frag for dK) is read before that wgmma's wait (the PTX ISA leaves such reads undefined):
  // dS comes from the fp32 P while dV runs, or, where that P would not fit beside dP^T (Cfg::kDsBeforeDv), from the
  // rounded P before dV is issued.
  // kDropout: dS from P (fp32, or rounded before dV), dV from the rounded P ∘ Z / (1 - p).
  __device__ __forceinline__ void dv_and_ds(const AttentionParams& p, float (&acc_s)[kBlockM / 2],
                                            float (&acc_dp)[kBlockM / 2], float (&acc_dv)[kHeadDim / 2],
                                            const WsStats& stats, uint32_t (&p_frag)[kKSteps][4],
                                            uint32_t (&ds_frag)[kKSteps][4], const Keep& keep, int s) const {
    auto& s_frag = reinterpret_cast<float(&)[kSNTiles][4]>(acc_s);    // P^T in fp32
    auto& dp_frag = reinterpret_cast<float(&)[kSNTiles][4]>(acc_dp);  // (16 keys, kBlockM queries)
    const int tig = th.tig;
    auto to_ds = [&](auto from_rounded_p) {
#pragma unroll
      for (int j = 0; j < kSNTiles; ++j) {
        const float2 dsum = make_float2(stats.dsum[8 * j + 2 * tig], stats.dsum[8 * j + 2 * tig + 1]);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float2 prob = make_float2(s_frag[j][half * 2], s_frag[j][half * 2 + 1]);
          if constexpr (decltype(from_rounded_p)::value) prob = unpack2<T>(p_frag[j / 2][(j % 2) * 2 + half]);
          float2 dp = make_float2(dp_frag[j][half * 2], dp_frag[j][half * 2 + 1]);
          if constexpr (kDropout) {  // dP ∘ Z / (1 - p): the gradient of the dropped P
            dp.x = keep.dropped(j, half, 0, dp.x, p.dropout_keep_scale);
            dp.y = keep.dropped(j, half, 1, dp.y, p.dropout_keep_scale);
          }
          dp_frag[j][half * 2] = prob.x * (dp.x - dsum.x);
          dp_frag[j][half * 2 + 1] = prob.y * (dp.y - dsum.y);
        }
      }
    };
    if constexpr (Cfg::kDsBeforeDv) {
      // (dS^T packed before dV's issue: its fp32 values are dead by then, which kept fp16 at d 64 from spilling)
      sm90::wait_hold<0>(acc_dp);
      to_ds(std::true_type{});
      pack_k16_fragments<T>(dp_frag, ds_frag);
      if constexpr (kDropout) {  // P^T (rounded) -> P^T ∘ Z / (1 - p), rounded again, for dV
        pack_dropped(p_frag, keep, p.dropout_keep_scale,
                     [&](int j, int half) { return unpack2<T>(p_frag[j / 2][(j % 2) * 2 + half]); });
      }
      sm90::gemm_rs<T, kHeadDim, kKSteps, QTile, /*kWait=*/false>(acc_dv, p_frag, smem.dout(s));
    } else {
      sm90::gemm_rs<T, kHeadDim, kKSteps, QTile, /*kWait=*/false>(acc_dv, p_frag, smem.dout(s));
      sm90::wait_hold<1>(acc_dp);  // (dV keeps running)
      to_ds(std::false_type{});
      pack_k16_fragments<T>(dp_frag, ds_frag);
    }
  }

  // dS^T to shared memory (buffer it % 2: the other warpgroup may still be reading the previous one in its dQ; the one
  // before that every consumer finished before the barrier of the last iteration), stored before dK's wgmma reads
  // ds_frag; then dK_w += dS^T Q, and dQ = dS K (issued into acc_dq) once both warpgroups' dS^T are there.
  // The barrier also tells every thread that the dQ staging is free again: its issuer waited, before it, for the reads
  // of the last iteration's reduce-adds.
  __device__ __forceinline__ void dk_and_dq(float (&acc_dk)[kHeadDim / 2], uint32_t (&ds_frag)[kKSteps][4],
                                            float (&acc_dq)[kDqCols / 2], int it, int s) const {
    const uint32_t s_ds = smem.ds(it & 1);
    ws_store_a_fragments<DsTile>(s_ds, ds_frag, key0);
    sm90::gemm_rs<T, kHeadDim, kKSteps, QTile, /*kWait=*/false>(acc_dk, ds_frag, smem.q(s));
    sm90::fence_proxy_async();  // dS^T, stored by threads, then read by wgmma
    if (dq_issuer) sm90::bulk_wait_group<0, /*kRead=*/true>();
    ptx::named_barrier_sync<1, 128 * Cfg::kConsumerWarpgroups>();
    sm90::gemm_ss<T, kDqCols, kBlockN / 16, /*kAMnMajor=*/true, /*kBMnMajor=*/true, DsTile, KTile,
                  /*kWait=*/false, /*kOverwrite=*/true>(acc_dq, s_ds, dq_row0, smem.k(), dq_col0);
  }

  // dQ (partial over this key block) into dq_accum: the warpgroup's (64, kDqCols) staged in shared memory as the
  // reduce-add's boxes of 32 columns (128-byte swizzle: row r's 16-byte chunk c at c ^ r % 8), then added by the TMA.
  // Fragment element (nt, 2 half + e): row 16 warp + group + 8 half, column 8 nt + 2 tig + e of the part. (The
  // accumulator has kHeadDim columns; those past headdim receive zeros: K is zero there.) row: the flat (batch, head,
  // query) row of the block's first query.
  __device__ __forceinline__ void add_dq(const sm90::BwdTensorMaps& maps, float (&acc_dq)[kDqCols / 2], int row) const {
    auto& dq_frag = reinterpret_cast<float(&)[kDqNTiles][4]>(acc_dq);  // (16 queries, kDqCols)
    const uint32_t s_dq = smem.dq(th.wg);
    static_assert(kDqRows == 64, "ws_stage_dq's boxes are 64 rows");
    ws_stage_dq(dq_frag, s_dq, th.warp_in_wg * 16 + th.group, th.tig);
    sm90::fence_proxy_async();  // the staging, stored by threads, then read by the TMA
    th.warpgroup_sync();
    if (dq_issuer) {
      const int dq_row = row + dq_row0;
#pragma unroll
      for (int box = 0; box < kDqCols / 32; ++box) {
        sm90::tma_reduce_add_2d(&maps.dq_accum, s_dq + box * (kDqRows * 128), dq_col0 + 32 * box, dq_row);
      }
      sm90::bulk_commit_group();
    }
  }

  // Before the loop: K, V and the first stage landed, and the first block's S^T. The next block's S^T is issued in
  // each step's dQ part, so that it runs while the dQ is staged (dP^T too would need 64 more registers there than the
  // 240 hold). Every S^T issue is unconditional, only the waits for its stage are not: issued under a condition,
  // ptxas saw accumulators in flight on a divergent path and serialized every wgmma (C7515 / C7518). A key block no
  // query sees, and the last query block, issue one S^T of an idle stage whose result is never read. And each is
  // waited for within the iteration that issued it: in flight across the loop's back edge, ptxas serialized them
  // again (C7514).
  __device__ __forceinline__ void first_scores(float (&acc_s)[kBlockM / 2]) const {
    if (steps > 0) {
      sm90::mbarrier_wait_untimed(smem.kv_loaded(), /*phase=*/0);
      ws_zero_keys_past_sequence<Cfg, kVarlen>(blk, smem, th.ctid);
      sm90::mbarrier_wait_untimed(smem.full(/*s=*/0), /*phase=*/0);
    }
    FA2_CTA_MARK(Base::kTraceLanded, th.ctid == 0);
    issue_s(acc_s, /*s=*/0);
    sm90::wait_hold<0>(acc_s);
  }

  // One step: query block m in stage it % kStages (head_row0: the flat (batch, head, query) row of its head's first
  // query; varlen: the (head, query) row of its sequence's first query; head: its query head); dK_w, dV_w accumulated
  // (this warp's 16 keys, d), dQ added, the next block's S^T issued into acc_s.
  __device__ __forceinline__ void step(const AttentionParams& p, const sm90::BwdTensorMaps& maps,
                                       float (&acc_s)[kBlockM / 2], float (&acc_dp)[kBlockM / 2],
                                       float (&acc_dk)[kHeadDim / 2], float (&acc_dv)[kHeadDim / 2], int it, int m,
                                       int head_row0, int head) const {
    const int s = it % kStages, m0 = m * kBlockM;
    // -- dP^T behind the S^T issued in the last step; the keep bits drawn while it runs
    issue_dp(acc_dp, s);
    [[maybe_unused]] Keep keep;
    if constexpr (kDropout) keep = Keep(DropoutHead(p, blk.batch, head), m0, blk.n0 + key0, th.group, th.tig);
    const WsStats stats = stats_of(s, head_row0 + m0);
    sm90::wait_hold<1>(acc_s);  // (one group per product, completing in issue order: dP^T keeps running)
    // -- P^T, then dV_w += P^T dO and dS^T = P^T (dP^T - D)
    uint32_t p_frag[kKSteps][4];
    scores_to_p(p, acc_s, stats, m0, p_frag, keep);
    uint32_t ds_frag[kKSteps][4];
    dv_and_ds(p, acc_s, acc_dp, acc_dv, stats, p_frag, ds_frag, keep, s);
    // -- dK_w += dS^T Q, dQ = dS K
    float acc_dq[kDqCols / 2];  // (this warp's 16 queries, this warpgroup's kDqCols columns)
    dk_and_dq(acc_dk, ds_frag, acc_dq, it, s);
    // -- every product that read the stage (S^T, dP^T, dV, dK) has completed: release it to the producer, and P^T /
    //    dS^T's registers are free. dQ may still be running; the next block's S^T goes out behind it, and dQ alone
    //    is waited for before its staging (S^T at the end of the step)
    sm90::wait_hold<1>(acc_dv, acc_dk);
    sm90::hold_fragments(p_frag);
    sm90::hold_fragments(ds_frag);
    __syncwarp();
    if (th.lane == 0) sm90::mbarrier_arrive(smem.empty(s));
    const int next = (it + 1) % kStages;
    if (it + 1 < steps) sm90::mbarrier_wait_untimed(smem.full(next), ((it + 1) / kStages) & 1);
    issue_s(acc_s, next);
    sm90::wait_hold<1>(acc_dq);
    // -- dQ into dq_accum
    add_dq(maps, acc_dq, head_row0 + m0);
    sm90::wait_hold<0>(acc_s);  // the next block's S^T (the last block's: unread)
  }
};

}  // namespace bwd
}  // namespace fa2
