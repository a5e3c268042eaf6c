// The warp-specialized backward kernels' prologue, shared by both: the schedule (tile_scheduler.cuh), the ring's
// barriers, the CTA's only barrier, the producer warpgroup's whole part (ws_producer.cuh), and each consumer thread's
// place in the consumer warpgroups.
#pragma once
#include <cstdint>

#include "fa2/bwd/bias_value.cuh"
#include "fa2/bwd/tile_scheduler.cuh"
#include "fa2/bwd/ws_producer.cuh"
#include "fa2/params.h"
#include "fa2/ptx.cuh"  // launch_dependent_grids, wait_for_prior_grids
#include "fa2/sm90/tma.cuh"
#include "fa2/sm90/wgmma.cuh"
#include "fa2/tile_config.h"  // kWsProducerThreads

namespace fa2 {
namespace bwd {

// The CTA's only barrier (the producer warpgroup leaves after it). With kKeyBias it also tells whether every key of
// the block (kBlockN from n0) is padded (-inf / False, or past seqlen_k): then the block's query range is emptied
// (returns m_lo - 1: dK = dV = 0 and nothing is added to dQ); else it returns m_hi. (A CTA that sums a GQA group
// has one bias for all its heads: ws_start.)
template <typename T, bool kKeyBias, int kBlockN>
__device__ __forceinline__ int ws_cta_barrier(const AttentionParams& p, int n0, int batch, int head, int m_lo,
                                              int m_hi) {
  if constexpr (kKeyBias) {
    bool padded = true;
    if (threadIdx.x < kBlockN) {
      const int key = n0 + int(threadIdx.x);
      padded = key >= p.seqlen_k || bias_value<T>(p, bias_of_head(p, batch, head), 0, key) == -INFINITY;
    }
    if (__syncthreads_and(padded)) return m_lo - 1;
  } else {
    __syncthreads();
  }
  return m_hi;
}

// A key-row bias's values at one thread's keys key_first, key_first + 8 (0 past seqlen_k: those keys are masked).
template <typename T>
__device__ __forceinline__ void ws_load_key_bias(const AttentionParams& p, int batch, int head, int key_first,
                                                 float (&key_bias)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = key_first + 8 * half;
    if (key < p.seqlen_k) key_bias[half] = bias_value<T>(p, bias_of_head(p, batch, head), 0, key);
  }
}

// The ws kernels' start once their shared memory is laid out: the key block and its query range (ws_schedule), the
// ring's barriers, the CTA's only barrier (ws_cta_barrier: with kKeyBias an all-padded key block empties the range),
// then the producer warpgroup's whole part (its registers given back, one thread streaming the query blocks:
// ws_produce; a stage goes back to it once its consumers release it) and the consumers' registers taken.
// kVarlen: the producer loads the sequence's rows of the packed tensors. (A key block past its sequence's end has no
// query blocks: ws_schedule. Leaving the kernel before setmaxnreg instead made ptxas ignore every setmaxnreg, C7507,
// and spill the consumers' accumulators.)
// Launched as the preprocess's programmatic dependent (BwdPlan::programmatic_main), every thread that touches its
// results waits for it first (ptx::wait_for_prior_grids; at once otherwise): the producer after issuing K / V (D comes
// with each stage), the consumers before their first stage (dq_accum, zeroed there, takes their reduce-adds), and a
// producer thread (32) before the dQ conversion may launch (it spins on the counts the preprocess zeroes).
template <typename T, typename Cfg, bool kKeyBias, bool kVarlen = false, class Smem>
__device__ __forceinline__ WsKeyBlock ws_start(const AttentionParams& p, const sm90::BwdTensorMaps& maps,
                                               const Smem& smem) {
  static_assert(Cfg::kBlockN <= Cfg::kNThreads, "one key per thread");
  WsKeyBlock blk = ws_schedule<Cfg, kKeyBias, kVarlen>(p);

  if (threadIdx.x == 0) smem.init_barriers(4 * Cfg::kConsumerWarpgroups);
  blk.m_hi = ws_cta_barrier<T, kKeyBias, Cfg::kBlockN>(p, blk.n0, blk.batch, blk.head, blk.m_lo, blk.m_hi);

  blk.producer = threadIdx.x < kWsProducerThreads;
  if (blk.producer) {
    sm90::setmaxnreg_dec<Cfg::kProducerRegs>();
    // (the dQ conversion, launched behind this kernel, may take the SMs its last CTAs leave: ws_key_block_done)
    if (Cfg::kOverlapDqConversion && threadIdx.x == 32) {
      ptx::wait_for_prior_grids();
      ptx::launch_dependent_grids();
    }
    if (threadIdx.x == 0 && blk.m_lo <= blk.m_hi) {
      if constexpr (kVarlen) {  // (the packed tensors as a batch of one; statistics (nheads, total_q))
        ws_produce<Cfg::kBlockM, Cfg::kBlockN, Cfg::kHeadDim, Cfg::kBlockCols, kKeyBias>(
            maps, smem, p.total_q, blk.m_lo, blk.m_hi, blk.n0, blk.head, blk.heads, blk.head_k, /*batch=*/0,
            /*bh=*/blk.head, blk.seq.q_row0, blk.seq.k_row0);
      } else {
        ws_produce<Cfg::kBlockM, Cfg::kBlockN, Cfg::kHeadDim, Cfg::kBlockCols, kKeyBias>(
            maps, smem, p.seqlen_q, blk.m_lo, blk.m_hi, blk.n0, blk.head, blk.heads, blk.head_k, blk.batch, blk.bh,
            /*q_row0=*/0, /*k_row0=*/0);
      }
    }
  } else {
    sm90::setmaxnreg_inc<Cfg::kConsumerRegs>();
    ptx::wait_for_prior_grids();
  }
  return blk;
}

// kVarlen, once K and V have landed (steps > 0): their rows past the sequence's keys set to zero before any product
// reads them. Those keys are masked (P = 0, dS = 0), but 0 * NaN is NaN in dS = P (dP - D) (dP from V) and in
// dQ = dS K, and the TMA loads those rows as they are: the next sequence's, a cache's past seqused_k. Every consumer
// thread shares the stores; the consumers' barrier 1 (the same count as their other uses of it) then orders them
// before every warpgroup's products.
template <class Cfg, bool kVarlen, class Smem>
__device__ __forceinline__ void ws_zero_keys_past_sequence(const WsKeyBlock& blk, const Smem& smem, int ctid) {
  if constexpr (kVarlen) {
    const int keys_in_block = blk.seq.seqlen_k - blk.n0;
    if (keys_in_block >= Cfg::kBlockN) return;  // (the same in every thread of the CTA)
    sm90::zero_tile_rows_from<Cfg::kBlockN, Cfg::kHeadDim, Cfg::kBlockCols>(smem.k(), keys_in_block, ctid,
                                                                           Cfg::kConsumerThreads);
    sm90::zero_tile_rows_from<Cfg::kBlockN, Cfg::kHeadDim, Cfg::kBlockCols>(smem.v(), keys_in_block, ctid,
                                                                           Cfg::kConsumerThreads);
    sm90::fence_proxy_async();
    ptx::named_barrier_sync<1, Cfg::kConsumerThreads>();
  }
}

// A consumer thread's place: its index among the consumers, its warpgroup (wg), warp in it, and fragment row / column
// (group = lane / 4, tig = lane % 4); and the consumers' loop steps (WsKeyBlock::steps).
struct WsConsumerThread {
  int lane, steps, ctid, wg, warp_in_wg, group, tig;
  // this warpgroup's own named barrier (2 + wg: bwd_ws_kernel's dQ staging and dK / dV staging)
  __device__ __forceinline__ void warpgroup_sync() const { ptx::named_barrier_of<2, 2, 128>(wg); }
};
__device__ __forceinline__ WsConsumerThread ws_consumer_thread(const WsKeyBlock& blk) {
  WsConsumerThread th;
  th.lane = threadIdx.x & 31;
  th.steps = blk.steps();
  th.ctid = int(threadIdx.x) - kWsProducerThreads;
  // (wg broadcast from lane 0: ptxas then treats it as warp-uniform and builds the descriptors of this warpgroup's
  // K / V rows in uniform registers, not per thread with two R2UR before every wgmma)
  th.wg = __shfl_sync(0xffffffffu, th.ctid >> 7, 0);
  th.warp_in_wg = (th.ctid >> 5) & 3, th.group = th.lane >> 2, th.tig = th.lane & 3;
  return th;
}

}  // namespace bwd
}  // namespace fa2
