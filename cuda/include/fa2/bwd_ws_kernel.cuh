// FlashAttention-2 backward, sm_90a warp-specialized main kernel (FA-3's structure; the step 2 of bwd_kernel.cuh's
// three for the plain path and its key-row bias variant: no softcap, no dbias, not deterministic). One CTA = kBlockN
// keys of one (batch, query head), as there, or with GQA where the launcher has a CTA sum its group (ws_groups_gqa) of
// one (batch, kv head): its query blocks then come head after head of the group through the same ring and loop, and
// dK, dV, summed in the registers, are stored once like k. What differs is how a query block is processed
// (BwdWsTileConfig, bwd_tile_config.h):
//   - a producer thread loads K, V once and streams each query block's Q, dO, lse and D (all by the TMA) into a
//     kStages ring of shared memory, on full / empty mbarriers: the consumers never wait for a CTA barrier;
//   - consumer warpgroup w owns keys 64 w .. 64 w + 63 and computes the transposed scores, keys as the wgmma M:
//       S^T = K_w Q^T, dP^T = V_w dO^T                    (both from shared memory; S^T issued during the block
//                                                          before, behind its dQ)
//       P^T = exp2(S^T scale log2e - lse log2e)           (lse, D per query: per accumulator column)
//       dV_w += P^T dO                                    (P^T from registers: the accumulator layout of two n8
//                                                          tiles is the register-A layout of a k16 step)
//       dS^T = P^T (dP^T - D) -> shared memory (two buffers); dK_w += dS^T Q (dS^T from registers; no A-operand
//                                                          register is read while its wgmma runs), the consumers'
//                                                          named barrier, then
//       dQ_w = dS K: 64 of the block's queries (kBlockM 128)  (both operands MN-major from shared memory; every key
//       or half of d (kBlockM 64)                          of the block), staged in shared memory and added to
//                                                          dq_accum by one TMA reduce-add per 32 columns
//     and releases the stage once its products have completed.
// Query rows past seqlen_q: Q and dO read as zeros, but their lse and D (a flat view) are the next head's, so P is
// masked to 0 there (then dS = 0 and their dQ rows, added to the next head's rows by the reduce-add, are exact zeros).
// kKeyBias (a bias with one value per key: padding masks): the score is x = q.k scale + bias[key], P taken against
// bwd_row_stats_kernel's (shift, lse) per query, as bwd_kernel.cuh's key-row variant; each thread's two keys' bias
// values live in registers for the whole CTA, and a key block whose every key is padded skips its query blocks.
// The softmax scale multiplies dK here and dQ in bwd_convert_dq_kernel (dS is w.r.t. s = scale q.k).
// kVarlen (packed sequences, params.h; plain path only): the grid's key blocks count max_seqlen_k's and its batch the
// sequences; the TMA reads the packed tensors as a batch of one from the sequence's first rows, and lse, D, dq_accum
// as (nheads, total_q) rows. A key block past its sequence's end has no query blocks and stores nothing (it runs
// through: ws_start). A box past the sequence's end reads the next sequence's rows: as queries their P is masked to
// 0 (so dK, dV get nothing from them and the dQ rows added into the next sequence's are exact zeros), as keys their
// S is masked, and their dK, dV rows are not stored (another CTA's).
// kDropout (option sm90_ws_dropout; plain path): the forward's keep mask on P^T for dV and on dP^T for dS
// (ws_mainloop.cuh, TransposedKeep), drawn per query block while dP^T runs.
// No tail split or GQA accumulators (the plan's; GQA as fp32 partials or summed in the CTA); an overlapping dQ
// conversion counts each CTA in its head's count over every sequence (ws_epilogue.cuh, finish).
//
// Parts: the schedule and the producer (ws_prologue.cuh, shared with bwd_ws_dsplit_kernel.cuh), WsSharedStorage
// (shared_storage.cuh), the mainloop (ws_mainloop.cuh), the epilogue (ws_epilogue.cuh).
#pragma once
#include <cstdint>

#include "fa2/block_info.cuh"
#include "fa2/bwd/bias_value.cuh"
#include "fa2/bwd/shared_storage.cuh"
#include "fa2/bwd/tile_scheduler.cuh"  // ws_groups_gqa (the launcher's)
#include "fa2/bwd/ws_epilogue.cuh"
#include "fa2/bwd/ws_mainloop.cuh"
#include "fa2/bwd/ws_producer.cuh"  // ws_stat_box_elems (the launcher's)
#include "fa2/bwd/ws_prologue.cuh"
#include "fa2/bwd_tile_config.h"
#include "fa2/cta_trace.cuh"
#include "fa2/params.h"
#include "fa2/ptx.cuh"
#include "fa2/sm90/tma.cuh"

namespace fa2 {
namespace bwd {

template <typename T, typename Cfg, bool kKeyBias, bool kVarlen = false, bool kDropout = false>
__global__ void __launch_bounds__(Cfg::kNThreads, 1)
    bwd_ws_kernel(const __grid_constant__ AttentionParams p, const __grid_constant__ sm90::BwdTensorMaps maps) {
  static_assert(!(kVarlen && kKeyBias), "varlen: no bias");
  static_assert(!kDropout || (!kVarlen && !kKeyBias), "dropout: the plain path");
  constexpr int kHeadDim = Cfg::kHeadDim, kDTiles = kHeadDim / 8;  // (n8 tiles of dK / dV: 16 keys x d)
  extern __shared__ __align__(1024) unsigned char smem[];
  const WsSmem<Cfg> shared(smem);  // WsSharedStorage
  if (shared.base % 1024 != 0) __trap();  // the descriptors and the TMA's swizzle assume 1024-byte aligned tiles
  FA2_CTA_MARK(trace::kEntry, threadIdx.x == 0);
  FA2_CTA_MARK(trace::kEntryNs, threadIdx.x == 0);
  FA2_CTA_MARK(trace::kSm, threadIdx.x == 0);

  // -- the key block and its query blocks, the ring's barriers; the producer warpgroup's whole part
  const WsKeyBlock blk = ws_start<T, Cfg, kKeyBias, kVarlen>(p, maps, shared);
  if (blk.producer) return;

  // -- the consumer warpgroups: kKeyBias: the bias of this thread's keys key0, key0 + 8 (0 past seqlen_k: those keys
  //    are masked), the same for every head of a GQA group the CTA sums (ws_start)
  const WsConsumer<Cfg> consumer(shared, blk, ws_consumer_thread(blk));
  float key_bias[2] = {0.f, 0.f};
  if constexpr (kKeyBias) ws_load_key_bias<T>(p, blk.batch, blk.head, blk.n0 + consumer.key0, key_bias);
  float acc_dk[kHeadDim / 2], acc_dv[kHeadDim / 2];  // (this warp's 16 keys, d)
  ptx::zero(reinterpret_cast<float(&)[1][kDTiles][4]>(acc_dk));
  ptx::zero(reinterpret_cast<float(&)[1][kDTiles][4]>(acc_dv));
  // -- dK_w, dV_w over the query blocks; dQ added per block
  const BlockInfo info = kVarlen ? BlockInfo{blk.seq.seqlen_q, blk.seq.seqlen_k, p.window_left, p.window_right}
                                 : BlockInfo{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};
  const WsMainloop<T, Cfg, kKeyBias, kVarlen, kDropout> mainloop(consumer, info, key_bias);
  float acc_s[Cfg::kBlockM / 2], acc_dp[Cfg::kBlockM / 2];  // S^T, dP^T: (this warp's 16 keys, kBlockM queries)
  mainloop.first_scores(acc_s);
  // this step's query block, and the flat row (batch, head, query) of its head's first query (varlen: (head, query)
  // of the sequence's first query; the plan checks that batch * nheads * seqlen_q, or nheads * total_q, fits an int)
  const int head_rows = kVarlen ? p.total_q : p.seqlen_q;
  int m = blk.m_lo, head_row0 = kVarlen ? blk.head * p.total_q + blk.seq.q_row0 : int(blk.bh * p.seqlen_q);
  int head = blk.head;
  for (int it = 0; it < consumer.steps; ++it) {
    mainloop.step(p, maps, acc_s, acc_dp, acc_dk, acc_dv, it, m, head_row0, head);
    FA2_CTA_MARK(consumer.kTraceBlock0 + it, consumer.th.ctid == 0 && it < consumer.kTraceBlocks);
    if (++m > blk.m_hi) m = blk.m_lo, head_row0 += head_rows, ++head;  // (the group's next head)
  }
  FA2_CTA_MARK(consumer.kTraceLoopEnd, consumer.th.ctid == 0);
  // -- dK = scale dS^T Q, dV out: a tail piece's sums first (the last piece to count stores the tile's); then GQA's
  //    accumulators, GQA's fp32 partials, or (the default) staged to 16-byte stores like k
  const WsEpilogue<T, Cfg, kKeyBias, kVarlen> epilogue(consumer);
  auto& dk_frag = reinterpret_cast<float(&)[kDTiles][4]>(acc_dk);
  auto& dv_frag = reinterpret_cast<float(&)[kDTiles][4]>(acc_dv);
  const bool fp32_dkv = p.h_h_k_ratio > 1 && p.gqa_dkv != GqaDkv::kInKernel;
  WsTailTile tail{0, -1, -1};
  if (Cfg::kTailSplit && !kKeyBias && !kVarlen && p.bwd_tail_pieces > 1) tail = ws_tail_tile(p);
  const int piece = tail.piece, tail_index = tail.tail_index;
  if (piece >= 0) {
    volatile int* const last_piece = epilogue.count_tail_piece(p, maps, dk_frag, dv_frag, tail_index);
    if (*last_piece == 0) return;
    epilogue.load_tail_sums(p, dk_frag, dv_frag, tail_index);
  }
  if (!kVarlen && p.h_h_k_ratio > 1 && p.gqa_dkv == GqaDkv::kAccumulate) {
    epilogue.add_gqa_accumulators(p, maps, dk_frag, dv_frag);
  } else if (kVarlen && fp32_dkv) {  // (the plan's varlen GQA: fp32 partials per query head, (total_k, nheads, d))
    ws_store_dk_dv<T, kDTiles, /*kVarlen=*/true>(p, dk_frag, dv_frag, /*batch=*/0, blk.head,
                                                 blk.seq.k_row0 + blk.n0 + consumer.key0, 0, consumer.th.tig,
                                                 blk.seq.k_row0 + blk.seq.seqlen_k);
  } else if (fp32_dkv) {
    ws_store_dk_dv<T>(p, dk_frag, dv_frag, blk.batch, p.gqa_dkv == GqaDkv::kPartials ? blk.head : blk.head_k,
                      blk.n0 + consumer.key0, 0, consumer.th.tig);
  } else {
    epilogue.store_staged(p, dk_frag, dv_frag);
  }
  epilogue.finish(p);
}

}  // namespace bwd
}  // namespace fa2
