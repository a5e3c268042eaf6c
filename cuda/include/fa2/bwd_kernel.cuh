// FlashAttention-2 backward, sm80 instruction path (mma.sync m16n8k16, ldmatrix, cp.async); runs on sm80..sm90.
//
// Three kernels, all on one stream:
//   1. bwd_preprocess_kernel:  D = rowsum(dO * O) (fp32, (batch, nheads, seqlen_q)); zeroes dq_accum (and the ws
//      kernel's counts and scratch: params.h, key_blocks_done, bwd_tail_counts).
//      Score-mod path also bwd_row_stats_kernel: the per-row (shift, lse) P is taken against (see there).
//   2. bwd_kernel: one CTA = one block of kBlockN keys of one (batch, query head). K, V stay in shared memory and
//      dK, dV in registers; Q, dO (and lse, D) of the query blocks the causal/window range allows stream through
//      swizzled shared memory, double-buffered with cp.async. Per query block:
//        S = Q K^T  ->  P = exp2(q.k scale log2e - lse log2e) (boundary mask), to f16/bf16, to smem
//        ->  dP = dO V^T  ->  dS = P (dP - D), to smem                  (plain path: P's exp2 overlaps dP's MMAs)
//        [score-mod path: S and dP first, then the forward's score (scale, softcap, bias), P, dS = P (dP - D)
//         (x (1 - tanh^2) under softcap) and dbias = P (dP - D) together]
//        ->  dV += P^T dO,  dK += dS^T Q  ->  dQ_partial = dS K, reduced into fp32 dq_accum (red.global.add).
//      sm_90a (wgmma) instances keep products in flight while the CUDA cores work: dP is issued right behind S (P's
//      exp2 runs meanwhile), and dQ first, then dV and dK, so that dQ's reduction overlaps them (measured faster:
//      docs/tuning.md).
//      The softmax scale multiplies dK here and dQ in kernel 3 (dS is w.r.t. s = scale q.k).
//   3. bwd_convert_dq_kernel: dq = scale * dq_accum, to f16/bf16 (behind the sm_90a warp-specialized kernel, started
//      while that one's last CTAs run: bwd_launch_template.cuh).
//
// deterministic: the CTAs take their (key block, head) in the order they start (a ticket counter), and each query
// block's dQ reductions happen in increasing key-block order: CTA n waits until the per-(batch, head, query block)
// turn counter equals the number of key blocks below n that touch that query block, adds, and passes the turn
// on. A CTA only ever waits for one that started before it, so there is no deadlock; the order of every fp32
// addition is fixed, so the gradients are bitwise reproducible (dK, dV, dbias never need atomics).
//
// GQA/MQA (h_h_k_ratio > 1): each CTA handles one query head and writes fp32 dK/dV partials to params.dk/.dv
// laid out per *query* head (batch, seqlen_k, nheads, d); the caller sums each group (a fixed-order reduction).
//
// Buffers the caller provides (cpp/cuda/bwd_cuda.cpp): softmax_d (batch, nheads, seqlen_q) fp32; dq_accum
// (batch, nheads, seqlen_q, headdim_rounded) fp32; in deterministic mode workspace = bwd_workspace_ints(params)
// zeroed int32s: [ticket counter] [turn counter per (batch, head, query block)] (bwd_launch.h); otherwise a
// finished-CTA count per (batch, head) for the warp-specialized kernel (params.h, key_blocks_done), then, where that
// kernel splits its last wave, the split's counts and fp32 dK / dV rows (bwd_tail_split_plan).
//
// Parts (bwd/): SharedStorage (shared_storage.cuh), the tile (tile_scheduler.cuh), the producer (sm80_producer.cuh:
// cp.async of K, V, and per query block Q, dO, lse, D), S / P / dP / dS (sm80_scores.cuh), dV and dK (sm80_dv_dk.cuh),
// dQ into dq_accum and the deterministic turns (sm80_dq.cuh), the products (product.cuh: mma.sync or wgmma), the
// epilogue (sm80_epilogue.cuh); kernels 1 and 3 and the row statistics kernel in their own headers. The loop and its
// barriers stay in the kernel (a part boundary the code did not have changed the compiler's output: docs/tuning.md).
#pragma once
#include <cstdint>
#include <type_traits>

#include "fa2/block_info.cuh"
#include "fa2/bwd/bias_value.cuh"
#include "fa2/bwd/block_range.cuh"
#include "fa2/bwd/convert_dq_kernel.cuh"
#include "fa2/bwd/fragments.cuh"
#include "fa2/bwd/preprocess_kernel.cuh"
#include "fa2/bwd/product.cuh"
#include "fa2/bwd/row_stats_kernel.cuh"
#include "fa2/bwd/scores.cuh"
#include "fa2/bwd/shared_storage.cuh"
#include "fa2/bwd/sm80_dq.cuh"
#include "fa2/bwd/sm80_dv_dk.cuh"
#include "fa2/bwd/sm80_epilogue.cuh"
#include "fa2/bwd/sm80_producer.cuh"
#include "fa2/bwd/sm80_scores.cuh"
#include "fa2/bwd/tile_scheduler.cuh"
#include "fa2/bwd_ptx.cuh"
#include "fa2/bwd_tile_config.h"
#include "fa2/params.h"
#include "fa2/ptx.cuh"
#include "fa2/sm90/wgmma.cuh"  // only instantiated by sm_90a instances (BwdTileConfig::kWgmma)

namespace fa2 {
namespace bwd {

// kScoreMod = false: no softcap, no bias (P = exp2(q.k scale log2e - lse log2e), one FMA). kScoreMod = true: the
// forward's score is recomputed in fp32 (scale, softcap, bias); softcap and the bias dtype are run-time switches
// (block-uniform), as in the forward. kKeyBias (with kScoreMod = false): a bias with one value per key (padding
// masks; no softcap, no dbias) on the plain path's schedule, its values for the CTA's key block read once into
// shared memory (Cfg::kSmemBytes + kBlockN * 4 bytes), P taken against the score-mod path's row statistics.
// kVarlen: packed sequences (params.h): the grid's key blocks count max_seqlen_k's, and a CTA works within its
// sequence (rows from its first of the packed tensors, its own lengths); one whose key block lies past its sequence's
// end exits (no bias, no dbias).
// kDropout: the forward's dropout mask replayed from params.rng_state (Sm80Scores; mma.sync or wgmma tiles, no key-row
// bias).
template <typename T, typename Cfg, int kArch, bool kScoreMod, bool kKeyBias, bool kVarlen = false,
          bool kDropout = false>
__global__ void __launch_bounds__(Cfg::kNThreads, 1) bwd_kernel(const __grid_constant__ AttentionParams p) {
  static_assert(!(kScoreMod && kKeyBias), "the key-row bias variant is one of the plain path");
  static_assert(!(kVarlen && kKeyBias), "varlen: no bias");
  constexpr bool kRowStats = kScoreMod || kKeyBias;  // P against bwd_row_stats_kernel's (shift, lse)
  constexpr int kHeadDim = Cfg::kHeadDim;
  using QTile = SwizzledTile<Cfg::kBlockM, kHeadDim, Cfg::kSmemBlockColsD>;         // Q, dO: (kBlockM, d)
  using KTile = SwizzledTile<Cfg::kBlockN, kHeadDim, Cfg::kSmemBlockColsD>;         // K, V: (kBlockN, d)
  using PTile = SwizzledTile<Cfg::kBlockM, Cfg::kBlockN, Cfg::kSmemBlockColsN>;     // P, dS: (kBlockM, kBlockN)
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kNThreads = Cfg::kNThreads;
  constexpr int kSdPM = Cfg::kSdPMTiles, kSdPN = Cfg::kSdPNTiles;
  constexpr int kKVM = Cfg::kdKVMTiles, kKVN = Cfg::kdKVNTiles;
  constexpr int kQM = Cfg::kdQMTiles, kQN = Cfg::kdQNTiles;
  // sm_90a instances with a wgmma tile config multiply with wgmma (product); the rest, with mma.sync
  constexpr bool kWgmma = Cfg::kWgmma;
  static_assert(!kWgmma || kArch == 901, "wgmma needs an sm_90a instance");

  // 1024: wgmma's 128-byte swizzle period (sm90/wgmma.cuh)
  extern __shared__ __align__(1024) unsigned char smem[];
  const SharedStorageView<Cfg> shared(smem);  // SharedStorage
  const uint32_t sK = shared.k();
  if constexpr (kWgmma) {
    if (sK % 1024 != 0) __trap();  // the descriptors assume every tile starts at a swizzle period
  }
  const uint32_t sV = shared.v(), sP = shared.p(), sdS = shared.ds();

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int num_n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  const int num_m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;

  // -- which (key block, head, batch): the grid's, or in deterministic mode the order in which CTAs start (the ticket
  //    in P's buffer, free until the first iteration)
  const BwdTile tile = bwd_tile(p, shared.template at<int>(sP), num_n_blocks, num_m_blocks, tid);
  const int n_block = tile.n_block, head = tile.head, batch = tile.batch;
  int* const turns = tile.turns;
  const int head_k = head / p.h_h_k_ratio;
  const int n0 = n_block * kBlockN;
  // the tile within its sequence (a varlen call's: a key block past the sequence's end has nothing to do)
  const BwdTileSequence<kVarlen> in_seq(p, batch);
  if (kVarlen && n0 >= in_seq.seqlen_k(p)) return;
  const int rows_k = min(kBlockN, in_seq.seqlen_k(p) - n0);
  const int headdim = p.headdim;
  const int64_t bh = int64_t(batch) * p.nheads + head;
  const int seq_m_blocks = kVarlen ? (in_seq.seqlen_q(p) + kBlockM - 1) / kBlockM : num_m_blocks;
  const int seq_n_blocks = kVarlen ? (in_seq.seqlen_k(p) + kBlockN - 1) / kBlockN : num_n_blocks;

  const QueryBlockRange range{in_seq.seqlen_q(p), in_seq.seqlen_k(p), p.window_left, p.window_right, kBlockM, kBlockN,
                              seq_m_blocks};
  const int m_lo = range.lo(n_block), m_hi = range.hi(n_block);
  const BlockInfo info{in_seq.seqlen_q(p), in_seq.seqlen_k(p), p.window_left, p.window_right};

  const T* q = static_cast<const T*>(p.q) + in_seq.q_rows(p.q_batch_stride, p.q_row_stride) + head * p.q_head_stride;
  const T* dout = static_cast<const T*>(p.dout) + in_seq.q_rows(p.dout_batch_stride, p.dout_row_stride) +
                  head * p.dout_head_stride;
  const T* k = static_cast<const T*>(p.k) + in_seq.k_rows(p.k_batch_stride, p.k_row_stride) +
               head_k * p.k_head_stride + n0 * p.k_row_stride;
  const T* v = static_cast<const T*>(p.v) + in_seq.k_rows(p.v_batch_stride, p.v_row_stride) +
               head_k * p.v_head_stride + n0 * p.v_row_stride;
  // score-mod path: the statistics bwd_row_stats_kernel prepared (lse, or log l next to a shift, per row)
  const float* lse = (kRowStats ? p.row_lse : p.lse) + in_seq.stats_row0(p, bh, head);
  const float* shift_g = kRowStats ? p.row_shift + in_seq.stats_row0(p, bh, head) : lse;
  const float* dsum_g = p.softmax_d + in_seq.stats_row0(p, bh, head);
  float* dq_accum = p.dq_accum + in_seq.stats_row0(p, bh, head) * kHeadDim;
  float* dbias = p.dbias != nullptr ? p.dbias + bh * p.seqlen_q * p.seqlen_k : nullptr;
  const void* bias_bh = bias_of_head(p, batch, head);

  // the producer: Q, dO and the rows' statistics of a query block into a stage (cp.async)
  const Sm80QueryBlockLoader<T, Cfg, kRowStats, kVarlen> load_q_do{
      p, shared, q, dout, lse, dsum_g, shift_g, headdim, tid, in_seq.seqlen_q(p)};

  // deterministic mode: this CTA's turns at the query blocks' dQ
  const DqTurns wait_dq_turn{range, turns, n_block, kVarlen ? seq_n_blocks : num_n_blocks, tid};

  // kKeyBias: the key block's bias into shared memory (read by every iteration after its block barrier). A block
  // whose every key is padded (-inf / False, or past seqlen_k) gets dK = dV = 0 and adds nothing to dQ: its CTA
  // skips the query blocks, in deterministic mode still passing each one's dQ turn on.
  int m_last = m_hi;
  if constexpr (kKeyBias) {
    if (stage_key_bias<T>(p, shared, bias_bh, n0, tid)) {
      if (p.deterministic && tid == 0) {
        for (int m = m_lo; m <= m_hi; ++m) ptx::st_release_gpu(turns + m, wait_dq_turn(m) + 1);
      }
      m_last = m_lo - 1;
    }
  }

  // -- prologue: K, V (resident) and the first query block in flight
  if (m_lo <= m_last) {
    load_tile<KTile, kBlockN, kHeadDim, kNThreads>(sK, k, p.k_row_stride, rows_k, headdim, tid);
    load_tile<KTile, kBlockN, kHeadDim, kNThreads>(sV, v, p.v_row_stride, rows_k, headdim, tid);
    load_q_do(m_lo, /*buf=*/0);
  }
  ptx::cp_async_commit();

  float acc_dk[kKVM][kKVN][4], acc_dv[kKVM][kKVN][4];  // (keys of this warp, d of this warp)
  ptx::zero(acc_dk);
  ptx::zero(acc_dv);

  // Warp tiles: S/dP rows sdp_m0.. keys sdp_n0..; dK/dV keys kv_n0.. dims kv_d0..; dQ rows dq_m0.. dims dq_d0..
  const int sdp_m0 = (warp % Cfg::kWarpsMSdP) * (kBlockM / Cfg::kWarpsMSdP);
  const int sdp_n0 = (warp / Cfg::kWarpsMSdP) * (kBlockN / Cfg::kWarpsNSdP);
  const int kv_n0 = (warp % Cfg::kWarpsNdKV) * (kBlockN / Cfg::kWarpsNdKV);
  const int kv_d0 = (warp / Cfg::kWarpsNdKV) * (kHeadDim / Cfg::kWarpsDdKV);
  const int dq_m0 = (warp % Cfg::kWarpsMdQ) * (kBlockM / Cfg::kWarpsMdQ);
  const int dq_d0 = (warp / Cfg::kWarpsMdQ) * (kHeadDim / Cfg::kWarpsDdQ);
  const int group = lane >> 2, tig = lane & 3;
  // S, P, dP, dS of a query block (Sm80Scores: the plain path, its key-row bias variant, or the score-mod path)
  const Sm80Scores<T, Cfg, kScoreMod, kKeyBias, kDropout> scores{
      p, shared, info, bias_bh, dbias, sdp_m0, sdp_n0, lane, group, tig, dropout_of<kDropout, kWgmma>(p, batch, head)};

  using kWaitSync = std::bool_constant<!kWgmma>;  // issued without waiting where that is possible (wgmma)
  for (int m = m_lo, it = 0; m <= m_last; ++m, ++it) {
    const int buf = Cfg::kStages == 2 ? (it & 1) : 0;
    const int m0 = m * kBlockM;
    // -- Q, dO of block m have landed (this thread's copies), and every warp is done with iteration m-1's
    //    buffers (the Q/dO buffer about to be refilled, P, dS)
    ptx::cp_async_wait<0>();
    if constexpr (kWgmma) sm90::fence_proxy_async();  // cp.async's writes, then read by wgmma (async proxy)
    __syncthreads();
    if constexpr (Cfg::kStages == 2) {
      if (m < m_last) load_q_do(m + 1, buf ^ 1);  // overlaps this whole iteration
      ptx::cp_async_commit();
    }

    // -- row statistics of this thread's S rows: lse log2e (+inf: P = 0) and D; the rows' shifts stay in shared memory
    const int row0 = m0 + sdp_m0 + group;  // this thread's first fragment row (global query)
    float lse2[2 * kSdPM], dsum[2 * kSdPM];
    const float* shift = scores.row_stats(buf, lse2, dsum);

    const int col0 = n0 + sdp_n0 + tig * 2;  // this thread's first fragment column (global key)
    const bool needs_mask = info.needs_mask(n_block, kBlockN, m0, kBlockM);
    float acc_s[kSdPM][kSdPN][4], acc_dp[kSdPM][kSdPN][4];  // (kBlockM, kBlockN) split over warps
    if constexpr (!kScoreMod) {
      // One straight-line block per case (masked or not), so that P's exp2 can overlap dP's loads and MMAs.
      if constexpr (!Cfg::kWholeBlockMask) {
        scores.plain(acc_s, acc_dp, buf, lse2, dsum, shift, row0, col0, needs_mask);
      } else if (needs_mask) {
        scores.plain(acc_s, acc_dp, buf, lse2, dsum, shift, row0, col0, std::true_type{});
      } else {
        scores.plain(acc_s, acc_dp, buf, lse2, dsum, shift, row0, col0, std::false_type{});
      }
    } else {
      scores.score_mod(acc_s, acc_dp, buf, lse2, dsum, shift, row0, col0, needs_mask);
    }
    if constexpr (kWgmma) sm90::fence_proxy_async();  // P and dS, stored by threads, then read by wgmma
    __syncthreads();

    // -- dV += P^T dO, dK += dS^T Q                                       // (kBlockN, d) split over warps
    // -- dQ (partial over this key block) = dS K, reduced into dq_accum   // (kBlockM, d) split over warps
    // mma.sync: dV, dK, then dQ (dQ last measured faster on the sm80 path). wgmma: dQ issued first, then dV and dK
    // behind it, so that dQ's reduction into global memory runs while the tensor cores do dV and dK.
    const Sm80DvDk<T, Cfg> dv_dk{acc_dv, acc_dk, sP, sdS, shared, buf, kv_n0, kv_d0, lane};
    if constexpr (!kWgmma) dv_dk(std::true_type{});
    {
      // dQ in column parts: two with wgmma at d 256 (64 floats a thread in one go, beside dK's and dV's 128, spilled),
      // else one. The second part is issued once the first has been reduced.
      constexpr int kDqParts = kWgmma && kQN >= 16 ? 2 : 1;
      constexpr int kQNPart = kQN / kDqParts;
      float acc_dq[kQM][kQNPart][4];
      product<T, kWgmma, kQM, kQNPart, kBlockN / 16, false, true, PTile, KTile, true, kWaitSync::value>(
          acc_dq, sdS, dq_m0, sK, dq_d0, lane);
      if constexpr (kWgmma) {
        dv_dk(std::false_type{});
        sm90::wait_hold<2>(acc_dq);  // <2>: dV and dK, committed after dQ, keep running (the counts follow this order)
      }
      int turn = 0;
      if (p.deterministic) {
        turn = wait_dq_turn(m);
        __syncthreads();
      }
      // acc_dq (columns dq_d0 ..) into dq_accum
      reduce_dq<kHeadDim, kBlockM, kVarlen>(p, in_seq.seqlen_q(p), acc_dq, dq_accum, m0, dq_m0, dq_d0, group, tig,
                                            headdim);
      if constexpr (kDqParts == 2) {
        product<T, kWgmma, kQM, kQNPart, kBlockN / 16, false, true, PTile, KTile, true, false>(
            acc_dq, sdS, dq_m0, sK, dq_d0 + kQNPart * 8, lane);
        sm90::wait_hold<0>(acc_dq);  // (dV and dK, issued before it, complete too)
        reduce_dq<kHeadDim, kBlockM, kVarlen>(p, in_seq.seqlen_q(p), acc_dq, dq_accum, m0, dq_m0, dq_d0 + kQNPart * 8,
                                              group, tig, headdim);
      }
      if (p.deterministic) {
        __threadfence();
        __syncthreads();
        if (tid == 0) ptx::st_release_gpu(turns + m, turn + 1);
      }
    }
    // dV, dK complete before the next iteration's barrier lets P, dS and this Q/dO buffer be overwritten
    if constexpr (kWgmma) sm90::wait_hold<0>(acc_dv, acc_dk);

    if constexpr (Cfg::kStages == 1) {
      __syncthreads();  // every warp is done with Q, dO of block m
      if (m < m_last) load_q_do(m + 1, /*buf=*/0);
      ptx::cp_async_commit();
    }
  }

  // -- epilogue: dK = scale * dS^T Q, dV out
  // (varlen: the sequence's keys as rows k_row0 + n0 .. of a batch of one)
  store_dk_dv<T>(p, acc_dk, acc_dv, kVarlen ? 0 : batch, head, kVarlen ? in_seq.seq.k_row0 + n0 : n0, rows_k, headdim,
                 kv_n0, kv_d0, group, tig);
}

}  // namespace bwd
}  // namespace fa2
