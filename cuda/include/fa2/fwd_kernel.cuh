// FlashAttention-2 forward. One kernel, three ways to run it (template arguments):
//   sm80 instruction path (mma.sync m16n8k16, ldmatrix, cp.async): runs on sm80..sm90;
//   sm_90a (kArchTag 901): the same per-warp work with wgmma products (a warpgroup per 64 query rows) and TMA loads;
//   sm_90a warp-specialized (the default at d >= 128: tile_config.h): a producer warpgroup streams K/V into a ring of
//   mbarrier-guarded stages, the consumer warpgroups compute, optionally taking turns issuing products (ping-pong),
//   and where it runs persistent (d 128; with a causal mask or window given a tile counter) one CTA per SM streams
//   query blocks.
//
// One CTA = one block of kBlockM queries of one (batch, head) at a time (a persistent CTA: one after another, below).
// Q stays on chip (in shared memory; the persistent d 128 kernels load it into registers once); K/V tiles of kBlockN
// keys stream through swizzled shared memory; each warp owns kRowsPerWarp query rows (m16 tiles), so row statistics
// never leave a quad of lanes. Per key tile:
//   S = Q K^T (fp32, registers)  ->  [score mod: scale, softcap, bias]  ->  [mask, boundary tiles only]
//   ->  online softmax (exp2, scale*log2e folded into one FMA)  ->  P to f16/bf16 in registers  ->  O += P V
// Key tiles are visited from the last visible one down to the first, only those the causal/window range allows.
//
// The kernel is a composition of parts along FlashAttention-3's seams: fwd/kernel_traits.cuh (what an instance
// decides at compile time), fwd/shared_storage.cuh (shared memory as a struct), fwd/tile_scheduler.cuh (which tiles a
// CTA runs: varlen and split-KV go there), block_info.cuh (which keys a tile sees), fwd/producer.cuh and
// fwd/pipeline.cuh (the loads and their mbarriers: paged KV goes there), fwd/mainloop_*.cuh (one key loop per
// schedule, over fwd/mainloop_steps.cuh), fwd/epilogue.cuh (O and lse: split-KV's partials go there).
#pragma once
#include <cstdint>
#include <type_traits>

#include "fa2/block_info.cuh"
#include "fa2/cta_trace.cuh"
#include "fa2/fwd/epilogue.cuh"
#include "fa2/fwd/kernel_config.cuh"  // FwdKernelConfig, fwd_kernel_threads (the launchers')
#include "fa2/fwd/kernel_traits.cuh"
#include "fa2/fwd/mainloop_cp_async.cuh"
#include "fa2/fwd/mainloop_sm90_overlap.cuh"
#include "fa2/fwd/mainloop_sm90_pipelined.cuh"
#include "fa2/fwd/mainloop_sm90_ws.cuh"
#include "fa2/fwd/mainloop_steps.cuh"  // zero_v_past_sequence
#include "fa2/fwd/pipeline.cuh"
#include "fa2/fwd/producer.cuh"
#include "fa2/fwd/score_mod.cuh"  // ScoreMode (the launchers')
#include "fa2/fwd/shared_storage.cuh"
#include "fa2/fwd/tile_context.cuh"
#include "fa2/fwd/tile_scheduler.cuh"
#include "fa2/params.h"
#include "fa2/sm90/tma.cuh"  // FwdTensorMaps
#include "fa2/softmax.cuh"
#include "fa2/tile_config.h"  // (and FA2_SM90_TMA's default)

namespace fa2 {
namespace fwd {

// The key loop of an instance's schedule.
template <class Traits>
using FwdMainloop = std::conditional_t<
    !Traits::kTma, FwdMainloopCpAsync<Traits>,
    std::conditional_t<!Traits::kWs, FwdMainloopSm90Pipelined<Traits>,
                       std::conditional_t<Traits::kOverlap, FwdMainloopSm90Overlap<Traits>, FwdMainloopSm90Ws<Traits>>>>;

// The consumer (computing) threads of a CTA: tile after tile, its loads in flight, the key loop, the epilogue.
// (headdim: p.headdim, read once at the kernel's start.)
template <class Traits>
__device__ __forceinline__ void run_consumers(const AttentionParams& p, const FwdSmem<Traits>& shared,
                                              const FwdPipeline<Traits>& pipe, const FwdTmaLoads<Traits>& tma,
                                              const BlockInfo& info, const FwdTileScheduler<Traits>& scheduler,
                                              int tid, int warp, int lane, int headdim) {
  using T = typename Traits::T;
  using Mainloop = FwdMainloop<Traits>;
  using Epilogue = FwdEpilogue<Traits>;
  constexpr int kMTiles = Traits::kMTiles, kDTiles = Traits::kDTiles;
  FA2_CTA_MARK(trace::kEntry, tid == 0);
  FA2_CTA_MARK(trace::kEntryNs, tid == 0);
  FA2_CTA_MARK(trace::kSm, tid == 0);
  [[maybe_unused]] int trace_tile = 0;
  const bool more_tiles = scheduler.more_tiles();
  FwdConsumerState<Traits> state;
  int use0 = 0, q_loads = 0;  // the K/V stage uses and Q loads of the CTA's earlier tiles (the barriers' phases)
  for (int t = scheduler.first_tile; t < scheduler.num_tiles; t = scheduler.consumers_next(t, pipe, q_loads)) {
    int m_block, head, batch;
    scheduler.at(t, m_block, head, batch);
    // -- the tile: its queries, outputs and the key blocks they see. Varlen: within its sequence (rows from seq's
    //    q_row0 / k_row0 of the packed tensors, its own lengths); a block past the sequence's end has nothing to do.
    const int m0 = m_block * Traits::kBlockM;
    const SequenceBounds seq = scheduler.sequence(batch);
    if (!scheduler.runs_block(m_block, seq.seqlen_q)) continue;  // (as the producer: FwdTileScheduler::in_sequence)
    const BlockInfo tile_info = scheduler.tile_info(seq, info);
    // the batch element's offset in a tensor: its batch stride, or a varlen sequence's first row
    auto at_batch = [&](int64_t batch_stride, int64_t row_stride, int row0) {
      return Traits::kVarlen ? int64_t(row0) * row_stride : batch * batch_stride;
    };
    const int rows_q = min(Traits::kBlockM, seq.seqlen_q - m0);
    // the tile's first row of out and of lse (varlen: of the sequence's rows from q_row0)
    auto out_rows = [&](const SequenceBounds& s) {
      return static_cast<T*>(p.out) + at_batch(p.out_batch_stride, p.out_row_stride, s.q_row0) +
             head * p.out_head_stride + m0 * p.out_row_stride;
    };
    auto lse_rows = [&](const SequenceBounds& s) {
      return Traits::kVarlen ? p.lse + int64_t(head) * p.total_q + s.q_row0 + m0  // (nheads, total_q)
                             : p.lse + (int64_t(batch) * p.nheads + head) * p.seqlen_q + m0;
    };
    T* out = out_rows(seq);
    float* lse = lse_rows(seq);
    const KeyBlockRange range = tile_info.key_blocks(m0, Traits::kBlockM, Traits::kBlockN);
    [[maybe_unused]] const int trace_base = FwdTrace::base(tid, trace_tile);
    FA2_CTA_MARK(trace_base, trace_base >= 0);
    if (range.empty()) {  // -- no query sees a key: out = 0, lse = +inf
      Epilogue::store_empty(p, pipe, q_loads, out, lse, rows_q, headdim, tid);
      continue;
    }
    const int head_k = head / p.h_h_k_ratio;
    const T* q = static_cast<const T*>(p.q) + at_batch(p.q_batch_stride, p.q_row_stride, seq.q_row0) +
                 head * p.q_head_stride + m0 * p.q_row_stride;
    const T* k = static_cast<const T*>(p.k) + at_batch(p.k_batch_stride, p.k_row_stride, seq.k_row0) +
                 head_k * p.k_head_stride;
    const T* v = static_cast<const T*>(p.v) + at_batch(p.v_batch_stride, p.v_row_stride, seq.k_row0) +
                 head_k * p.v_head_stride;
    const void* bias_bh = bias_of_head(p, batch, head);  // this (batch, head)'s bias (the launcher chose kBias by it)
    const int bias_head = p.bias_head_stride == 0 ? 0 : head, bias_batch = p.bias_batch_stride == 0 ? 0 : batch;
    const FwdTile<Traits> tile{p,      tile_info, shared,  pipe,       tma, tid, lane, headdim, {m_block, head, batch},
                               m0,     rows_q,  range,     head_k,     bias_head,    bias_batch,   q,  k,  v,
                               bias_bh, more_tiles, trace_base, seq};
    // -- prologue: Q and the first (highest) key tile in flight; the head's sink into L1 for the epilogue (a prefetch:
    //    its load after the key loop then hits, and no register is kept through the loop)
    Mainloop::prologue(tile);
    zero_v_past_sequence(tile, use0);  // (varlen: rows past the sequence's keys are not the TMA's zeros)
    if (p.sinks != nullptr && lane == 0) {
      ptx::prefetch_l1(p.sinks + head);
      if constexpr (Traits::Cfg::kWgmma) *reinterpret_cast<int*>(shared.ptr(shared.tile_head(warp))) = head;
    }
    float acc_o[kMTiles][kDTiles][4];  // (rows of this warp, d) unnormalized O
    ptx::zero(acc_o);
    OnlineSoftmax<kMTiles> softmax;
    const FwdThreadRows<Traits> rows(p, shared.q(), m0, warp, lane);
    // -- the key tiles, last to first: S = Q K^T, softmax, O += P V
    Mainloop mainloop;  // per tile: what its key loop carries between key tiles (fwd/mainloop_sm90_overlap.cuh)
    mainloop.run(tile, rows, state, use0, q_loads, acc_o, softmax);
    FA2_CTA_MARK(trace_base + FwdTrace::kIters + 1, trace_base >= 0);
    int rows_out = rows_q;
    if constexpr (Traits::kVarlen && Traits::kWs) {
      // (from the sequence's bounds loaded again: kept over the key loop, they cost the consumers spills in it)
      const SequenceBounds again = scheduler.sequence(batch);
      out = out_rows(again), lse = lse_rows(again), rows_out = min(Traits::kBlockM, again.seqlen_q - m0);
    }
    // -- epilogue: O / l, lse
    Epilogue::store(p, shared, pipe, rows, state, acc_o, softmax, out, lse, rows_out, headdim, tid, lane, more_tiles,
                    q_loads, scheduler, tile_info, t);
    FA2_CTA_MARK(trace_base + FwdTrace::kIters + 2, trace_base >= 0);
    use0 += range.hi - range.lo;
    ++q_loads;
#if FA2_CTA_TRACE
    ++trace_tile;
#endif
  }
  FA2_CTA_MARK(trace::kExitNs, tid == 0);
}

// kArchTag: 10 x the compute capability the instance is built for, + 1 for an arch-specific build
// (cmake/Kernels.cmake): 901 (sm_90a) multiplies with wgmma, everything else with mma.sync.
// maps: the TMA descriptors of q, k, v and a staged key-row bias (sm_90a instances with FA2_SM90_TMA; unused
// otherwise).
// kVarlen: packed sequences (params.h), no bias, no clusters: the sm80 path's kernels and the sm_90a ones with TMA
// loads (maps over the packed tensors: fwd_launch_template.cuh).
// kDropout: dropout on P (params.h, rng_state): the sm80 path's kernels and the pipelined sm_90a ones (plain or general
// score path).
// kPagedKV: the warp-specialized varlen kernel's twin that reads a paged cache (FwdKernelTraits::kPagedKV).
template <typename T, int kHeadDim, int kArchTag, ScoreMode kMode, BiasType kBias, bool kWarpSpecialized = false,
          bool kPingpong = false, bool kOverlap = false, bool kTileCounter = false, bool kCluster = false,
          bool kVarlen = false, bool kDropout = false, bool kPagedKV = false>
__global__ void __launch_bounds__(fwd_kernel_threads<kHeadDim, kArchTag, kWarpSpecialized>(),
                                  kWarpSpecialized ? 1
                                                   : FwdTileConfig<kHeadDim, kArchTag == 901>::min_blocks_per_sm(
                                                         kMode == ScoreMode::kKeyBiasFold ||
                                                         kMode == ScoreMode::kPlain))
    fwd_kernel(const __grid_constant__ AttentionParams p, const __grid_constant__ sm90::FwdTensorMaps maps) {
  using Traits = FwdKernelTraits<T, kHeadDim, kArchTag, kMode, kBias, kWarpSpecialized, kPingpong, kOverlap,
                                 kTileCounter, kCluster, kVarlen, kDropout, kPagedKV>;
  extern __shared__ __align__(1024) unsigned char smem[];  // 1024: see SwizzledTile::fragment_address
  const FwdSmem<Traits> shared(smem);
  // The swizzled fragment addressing (SwizzledTile::fragment_address) relies on this alignment.
  if (shared.q() % 1024 != 0) __trap();
  // tid: the thread's place among the consumer (computing) threads; the producer warpgroup of a warp-specialized
  // kernel comes first and has tid < 0
  const int tid = int(threadIdx.x) - (kWarpSpecialized ? kWsProducerThreads : 0), warp = tid >> 5;
  const int lane = threadIdx.x & 31;
  const int headdim = p.headdim;
  // the loads' barriers (fwd/pipeline.cuh) and the TMA copies (fwd/producer.cuh)
  const FwdPipeline<Traits> pipe{shared, lane, /*cta_rank=*/kCluster ? sm90::cluster_cta_rank() : 0};
  const FwdTmaLoads<Traits> tma{maps, shared, pipe.cta_rank};
  // which keys a tile's queries see (block_info.cuh) and which tiles this CTA runs (fwd/tile_scheduler.cuh)
  const BlockInfo info{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};
  const FwdTileScheduler<Traits> scheduler(p);
  if constexpr (kWarpSpecialized) {
    // the barriers once, before the tiles (the pipelined kernel: in its prologue)
    pipe.init(p);
    if (tid < 0) {  // -- the producer warpgroup: one thread streams every tile's K/V tiles and Q into the ring
      sm90::setmaxnreg_dec<kWsProducerRegs>();
      if (threadIdx.x == 0) run_producer(p, tma, scheduler, info);
      return;
    }
    sm90::setmaxnreg_inc<Traits::kWsConsumerRegs>();
  }
  run_consumers(p, shared, pipe, tma, info, scheduler, tid, warp, lane, headdim);
}

}  // namespace fwd
}  // namespace fa2
