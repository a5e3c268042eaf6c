// FlashAttention-2 forward. One kernel body, three ways to run it (template arguments):
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
#pragma once
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "fa2/bias.cuh"  // load_bias
#include "fa2/block_info.cuh"
#include "fa2/cta_trace.cuh"
#include "fa2/fwd/epilogue.cuh"
#include "fa2/fwd/gemm.cuh"
#include "fa2/fwd/kernel_config.cuh"
#include "fa2/fwd/kernel_traits.cuh"
#include "fa2/fwd/shared_storage.cuh"
#include "fa2/fwd/tile_context.cuh"
#include "fa2/fwd/tile_scheduler.cuh"
#include "fa2/fwd/load_tile.cuh"
#include "fa2/fwd/mainloop_cp_async.cuh"
#include "fa2/fwd/mainloop_sm90_overlap.cuh"
#include "fa2/fwd/mainloop_sm90_pipelined.cuh"
#include "fa2/fwd/mainloop_sm90_ws.cuh"
#include "fa2/fwd/pingpong.cuh"
#include "fa2/fwd/pipeline.cuh"
#include "fa2/fwd/producer.cuh"
#include "fa2/fwd/score_mod.cuh"
#include "fa2/params.h"
#include "fa2/ptx.cuh"
#include "fa2/sm90/tma.cuh"    // only used by sm_90a instances
#include "fa2/sm90/wgmma.cuh"  // only instantiated by sm_90a instances

#include "fa2/softmax.cuh"
#include "fa2/tile_config.h"  // (and FA2_SM90_TMA's default)
#include "fa2/tile_order.h"

namespace fa2 {
namespace fwd {

// The key loop of an instance's schedule.
template <class Traits>
using FwdMainloop = std::conditional_t<
    !Traits::kTma, FwdMainloopCpAsync<Traits>,
    std::conditional_t<!Traits::kWs, FwdMainloopSm90Pipelined<Traits>,
                       std::conditional_t<Traits::kOverlap, FwdMainloopSm90Overlap<Traits>, FwdMainloopSm90Ws<Traits>>>>;

// kArchTag: 10 x the compute capability the instance is built for, + 1 for an arch-specific build
// (cmake/Kernels.cmake):
// 901 (sm_90a) multiplies with wgmma, everything else with mma.sync.
// maps: the TMA descriptors of q, k, v (sm_90a instances with FA2_SM90_TMA; unused otherwise).
template <typename T, int kHeadDim, int kArchTag, ScoreMode kMode, BiasType kBias, bool kWarpSpecialized = false,
          bool kPingpong = false, bool kOverlap = false, bool kTileCounter = false, bool kCluster = false>
__global__ void __launch_bounds__(fwd_kernel_threads<kHeadDim, kArchTag, kWarpSpecialized, kPingpong>(),
                                  kWarpSpecialized ? 1
                                                   : FwdTileConfig<kHeadDim, kArchTag == 901>::min_blocks_per_sm(
                                                         kMode == ScoreMode::kKeyBiasFold ||
                                                         kMode == ScoreMode::kPlain))
    fwd_kernel(const __grid_constant__ AttentionParams p, const __grid_constant__ sm90::FwdTensorMaps maps) {
  using Traits = FwdKernelTraits<T, kHeadDim, kArchTag, kMode, kBias, kWarpSpecialized, kPingpong, kOverlap,
                                 kTileCounter, kCluster>;
  using Mainloop = FwdMainloop<Traits>;
  using Cfg = typename Traits::Cfg;
  constexpr bool kWgmma = Traits::kWgmma, kTma = Traits::kTma, kWs = Traits::kWs;
  constexpr int kRing = Traits::kRing, kWsConsumerRegs = Traits::kWsConsumerRegs;
  using QTile = typename Traits::QTile;
  using KVTile = typename Traits::KVTile;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kNThreads = Cfg::kNThreads;
  constexpr int kMTiles = Cfg::kMTiles, kNTiles = Cfg::kNTiles, kDTiles = Cfg::kDTiles;
  constexpr bool kBiasFold = Traits::kBiasFold, kStagedBias = Traits::kStagedBias;
  constexpr bool kSkipMaskedTiles = Traits::kSkipMaskedTiles, kSplitKV = Traits::kSplitKV;
  constexpr bool kPersistent = Traits::kPersistent, kQInRegisters = Traits::kQInRegisters;
  constexpr bool kStagedO = Traits::kStagedO;
  constexpr int kBlockCols = Traits::kBlockCols, kColBlocks = Traits::kColBlocks;
  using BiasElem = typename Traits::BiasElem;
  constexpr uint32_t kBiasTileBytes = Traits::kBiasTileBytes;

  extern __shared__ __align__(1024) unsigned char smem[];  // 1024: see SwizzledTile::fragment_address
  const FwdSmem<Traits> shared(smem);
  const uint32_t sQ = shared.q();
  // The swizzled fragment addressing (SwizzledTile::fragment_address) relies on this alignment.
  if (sQ % 1024 != 0) __trap();

  // tid / warp: the thread's place among the consumer (computing) threads; the producer warpgroup of a
  // warp-specialized kernel comes first and has tid < 0
  const int tid = int(threadIdx.x) - (kWs ? kWsProducerThreads : 0), warp = tid >> 5, lane = threadIdx.x & 31;
  const int headdim = p.headdim;
  using CheckRows = std::true_type;
  using NoCheckRows = std::false_type;

  // the loads' barriers (fwd/pipeline.cuh) and the TMA copies (fwd/producer.cuh)
  const FwdPipeline<Traits> pipe{shared, lane, /*cta_rank=*/kCluster ? sm90::cluster_cta_rank() : 0};
  const FwdTmaLoads<Traits> tma{maps, shared, pipe.cta_rank};

  // which keys a tile's queries see (block_info.cuh) and which tiles this CTA runs (fwd/tile_scheduler.cuh)
  const BlockInfo info{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};
  const FwdTileScheduler<Traits> scheduler(p);
  const int num_tiles = scheduler.num_tiles, first_tile = scheduler.first_tile, tile_stride = scheduler.tile_stride;
  auto tile_at = [&](int t, int& m_block, int& head, int& batch) { scheduler.at(t, m_block, head, batch); };

  // TMA path: the mbarriers' initialization, then a CTA barrier. A warp-specialized kernel runs it once, before its
  // tiles; the pipelined one after its (one) tile's empty-range check, as before the tile loop existed: run first,
  // ptxas spilled 20 -> 44-68 B more in the 128-register d 64 key-row kernel.
  auto init_barriers = [&]() {
    if constexpr (kTma) pipe.init(p);
  };
  if constexpr (kWs) {  // (kWs implies kTma)
    init_barriers();
    if (tid < 0) {  // -- the producer warpgroup: one thread streams every tile's K/V tiles and Q into the ring
      sm90::setmaxnreg_dec<kWsProducerRegs>();
      if (threadIdx.x == 0) run_producer(p, tma, scheduler, info);
      return;
    }
    sm90::setmaxnreg_inc<kWsConsumerRegs>();
  }
  // (FA2_CTA_TRACE: for the CTA's first two tiles warpgroup 0's first thread marks the tile's start, the start of
  // each of its first kTraceIters key iterations, the loop's end and the epilogue's end; warpgroup 1's first thread
  // the same for the second tile. The consumers of the d 128 ping-pong-overlap kernel then spill ~90 B, outside the
  // key loop. With FA2_CTA_TRACE_TILES, each consumer warpgroup's first thread marks the start, the loop's end and the
  // epilogue's end of each of the CTA's first kTraceTiles tiles, no key iterations: both warpgroups' tile switches.)
  constexpr bool kTraceEveryTile = FA2_CTA_TRACE_TILES;
  constexpr int kTraceIters = kTraceEveryTile ? 0 : 17, kTraceTileSlots = kTraceIters + 3;
  constexpr int kTraceTiles = kTraceEveryTile ? (trace::kSlots - trace::kFirstEvent) / (2 * kTraceTileSlots) : 2;
  static_assert(trace::kFirstEvent + (kTraceEveryTile ? 2 * kTraceTiles : 3) * kTraceTileSlots <= trace::kSlots,
                "the events fit a CTA's slots");
  FA2_CTA_MARK(trace::kEntry, tid == 0);
  FA2_CTA_MARK(trace::kEntryNs, tid == 0);
  FA2_CTA_MARK(trace::kSm, tid == 0);
  [[maybe_unused]] int trace_tile = 0;

  // A persistent CTA's next Q loads into Q's shared memory once every consumer warp has released it (shared.bar_q_empty()):
  // after the key loop, or, in the persistent d 128 overlap kernels without a staged bias, as soon as it is loaded
  // into registers (kQInRegisters: 32 a thread, ldmatrix'd once per query block, Q K^T then a register-A wgmma), so
  // that its load (about a microsecond) runs behind the tile's whole key loop. (Before, those kernels released Q after
  // the tile's last Q K^T: +2.6 / +1.0 / +0.7% at S 1k / 2k / 4k over releasing it after the loop,
  // variants_h200-20261130-early-q.json; the staged-bias kernels, which may skip the last key tile, never could.)
  // Q K^T then reads only K from shared memory (with both operands from there an m64n128k16 reads 6 KB in its ~64
  // cycles, by our count, beside the TMA's K/V writes; not measured directly). Against Q K^T from shared memory (H200,
  // bf16, scripts/fwd_variant_bench.cu, 2 rounds, bitwise-equal outputs, variants_h200-20261201-fwd-q-registers.json):
  // +0.5 / +1.4 / +0.9 / +1.6% at S 2k / 4k / 8k / 16k non-causal (-1.4% at 1k), causal +1.3..+2.0%. (ptxas: 8 B
  // spilled, reloaded once per tile in the epilogue.) With the P V wait below, against d2e0cc8
  // (variants_h200-20261201-fwd-pv-wait-q-registers.json): +1.0 / +1.8 / +2.6 / +1.9% at S 2k / 4k / 8k / 16k
  // (-0.4% at 1k), causal +0.7 / +1.2 / +1.2 / +2.6 / +3.3% at S 1k..16k.
  // A CTA that may run a next tile: its consumers release Q once it is in registers or after each tile's key loop (the
  // producer's next Q, or announcement, waits for that) and store O from the registers. With the tile counter they
  // learn each next tile from the producer's announcement (its loop), its Q landed with it. (A kernel template of its
  // own: as a run-time choice in the one kernel, the consumers spilled ~80 B and the forward ran 2-3.5% slower without
  // a causal mask, 3-8% with one, H200 d 128.)
  const bool more_tiles = kPersistent && (kTileCounter || tile_stride < num_tiles);
  // kStagedO: a persistent CTA's epilogue stages O in shared memory, in each warp's own rows of Q's tile, and copies it
  // out 16 bytes a lane with no shuffles (the direct stores below take ~500 instructions a warp for a tile's O, the
  // 4 x 4 quad transposes most of them: ~2k cycles of a ~46k-cycle tile at S 2k, H200 trace and ncu). Q's tile holds
  // the next tile's Q by then, so each warp first reads its rows of that into its registers (kQInRegisters: they are
  // the next tile's Q K^T operand), and releases Q's tile to the producer only once its O has left: the Q after next
  // then loads during the next tile, as before. Not with the tile counter, whose next tile the producer announces.
  // Measured (H200, bf16, d 128 non-causal, harness, 3 rounds ABAB against the direct stores in one call,
  // variants_h200-20261204e-fwd-d128-staged-o.json): +1.2 / +0.7 / +1.6 / +1.1% at S 2k / 4k / 8k / 16k, -0.4% at
  // 1k; out and lse bitwise the same.
  FwdConsumerState<Traits> state;
  int use0 = 0, q_loads = 0;  // the K/V stage uses and Q loads of the CTA's earlier tiles (warp-specialized)
  for (int t = first_tile; t < num_tiles; t = scheduler.consumers_next(t, pipe, q_loads)) {
    int m_block, head, batch;
    tile_at(t, m_block, head, batch);
    const int m0 = m_block * kBlockM;
    const int rows_q = min(kBlockM, p.seqlen_q - m0);
    T* out = static_cast<T*>(p.out) + batch * p.out_batch_stride + head * p.out_head_stride + m0 * p.out_row_stride;
    float* lse = p.lse + (int64_t(batch) * p.nheads + head) * p.seqlen_q + m0;
    const KeyBlockRange range = info.key_blocks(m0, kBlockM, kBlockN);
    // (FA2_CTA_TRACE: this thread's first slot for this tile, -1 if it marks none)
    [[maybe_unused]] const int trace_base =
        kTraceEveryTile ? ((tid == 0 || tid == 128) && trace_tile < kTraceTiles
                               ? trace::kFirstEvent + ((tid >> 7) * kTraceTiles + trace_tile) * kTraceTileSlots
                               : -1)
        : tid == 0 && trace_tile < 2    ? trace::kFirstEvent + trace_tile * kTraceTileSlots
        : tid == 128 && trace_tile == 1 ? trace::kFirstEvent + 2 * kTraceTileSlots
                                        : -1;
    FA2_CTA_MARK(trace_base, trace_base >= 0);
    if (range.empty()) {
      FwdEpilogue<Traits>::store_empty(p, pipe, q_loads, out, lse, rows_q, headdim, tid);
      continue;
    }

    const int head_k = head / p.h_h_k_ratio;
    const T* q = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride + m0 * p.q_row_stride;
    const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride + head_k * p.k_head_stride;
    const T* v = static_cast<const T*>(p.v) + batch * p.v_batch_stride + head_k * p.v_head_stride;
    const void* bias_bh = bias_of_head(p, batch, head);  // this (batch, head)'s bias (the launcher chose kBias by it)
    const int bias_head = p.bias_head_stride == 0 ? 0 : head, bias_batch = p.bias_batch_stride == 0 ? 0 : batch;
    const FwdTile<Traits> tile{p,    info,         shared,    pipe, tma,     tid,  warp, lane, headdim, {m_block, head, batch},
                               m0,   rows_q,       range,     head_k, bias_head, bias_batch, q, k, v, bias_bh,
                               more_tiles, trace_base};
    // -- prologue: Q and the first (highest) key tile in flight
    Mainloop::prologue(tile);
    float acc_o[kMTiles][kDTiles][4];  // (rows of this warp, d) unnormalized O
    ptx::zero(acc_o);
    OnlineSoftmax<kMTiles> softmax;
    const FwdThreadRows<Traits> rows(p, sQ, m0, warp, lane);
    // -- the key tiles: S = Q K^T, softmax, O += P V
    Mainloop::run(tile, rows, state, use0, q_loads, acc_o, softmax);
    FA2_CTA_MARK(trace_base + kTraceIters + 1, trace_base >= 0);
    // -- epilogue: O / l, lse
    FwdEpilogue<Traits>::store(p, shared, pipe, rows, state, acc_o, softmax, out, lse, rows_q, headdim, tid, lane,
                               more_tiles, q_loads, scheduler, info, t);
    FA2_CTA_MARK(trace_base + kTraceIters + 2, trace_base >= 0);
    use0 += range.hi - range.lo;
    ++q_loads;
#if FA2_CTA_TRACE
    ++trace_tile;
#endif
  }  // tiles
  FA2_CTA_MARK(trace::kExitNs, tid == 0);
}

}  // namespace fwd
}  // namespace fa2
