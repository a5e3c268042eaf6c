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
    // Only the first key tile visited (the highest) can run past seqlen_k: later ones skip the row predicate.
    auto load_k = [&](int n, int buf, auto check_rows) {
      load_tile_async<KVTile, kBlockN, kHeadDim, kNThreads, decltype(check_rows)::value>(
          shared.k(buf), k + int64_t(n) * kBlockN * p.k_row_stride, p.k_row_stride, p.seqlen_k - n * kBlockN, headdim, tid);
    };
    auto load_v = [&](int n, int buf, auto check_rows) {
      load_tile_async<KVTile, kBlockN, kHeadDim, kNThreads, decltype(check_rows)::value>(
          shared.v(buf), v + int64_t(n) * kBlockN * p.v_row_stride, p.v_row_stride, p.seqlen_k - n * kBlockN, headdim, tid);
    };

    // -- prologue: Q and the first (highest) key tile in flight
    if constexpr (kTma) {
      if constexpr (kWs) {
        // ping-pong: warpgroup 0 takes the tile's first slot. Each warpgroup waits for its own barrier once per key
        // tile plus once, and gets as many arrivals: this one from warpgroup 1, one per key tile from each other
        // slot's end, and warpgroup 0's last one after the loop (warpgroup 1's last slot ends with nobody waiting).
        // (pingpong-overlap: one turn per key tile, see the loop.) The count is per tile, so tiles do not mix.
        if constexpr (kPingpong) {
          if (warp >> 2 == 1) pingpong_signal_other(1);
        }
      } else {
        init_barriers();
        if (tid == 0) {
          tma.q(m0, head, batch);
          tma.kv(range.hi - 1, 0, head_k, batch, bias_head, bias_batch);
        }
      }
    } else {
      load_tile_async<QTile, kBlockM, kHeadDim, kNThreads, /*kCheckRows=*/true>(sQ, q, p.q_row_stride, rows_q, headdim,
                                                                                tid);
      load_k(range.hi - 1, 0, CheckRows{});
      if constexpr (Cfg::kStages == 2) load_v(range.hi - 1, 0, CheckRows{});
      ptx::cp_async_commit();
    }

    float acc_o[kMTiles][kDTiles][4];  // (rows of this warp, d) unnormalized O
    ptx::zero(acc_o);
    OnlineSoftmax<kMTiles> softmax;
    const FwdThreadRows<Traits> rows(p, sQ, m0, warp, lane);
    const float mult = rows.mult, heavy_s = rows.heavy_s;
    const int q_row0 = rows.q_row0, wg_row0 = rows.wg_row0, row0 = rows.row0;
    const uint32_t q_lane = rows.q_lane, k_lane = rows.k_lane, v_lane = rows.v_lane;

    uint32_t p_prev[kNTiles / 2][4];  // kOverlap: P of the previous tile, packed, and its stage
    int buf_prev = 0;
    // kOverlap: whether p_prev holds a tile's P whose P V is still to be issued. When no tile is skipped
    // (kSkipMaskedTiles) that is `it > 0`, kept as that expression there (see the sm90::wait_hold<0>(acc_o) below).
    bool pv_pending = false;
    // kSplitKV: V of stage buf (use u) has landed (a tile's use is the previous one's + 1: no tile is skipped there)
    auto wait_v = [&](int buf, int u) {
      if constexpr (kSplitKV) pipe.wait_loaded(shared.bar_v(buf), (u / kRing) & 1);
    };
    // Whether a tile visited so far held a bias below heavy_s (finite): the only way a row becomes heavy (softmax.cuh).
    // The pipelined key-row kernel learns it from each tile's fold (below), every other kernel assumes it. Once set it
    // stays set: a row made heavy by one tile needs the heavy-row update on every later one too (the ordinary update's
    // m * mult of a heavy max overflows to -inf when mult > 1, and -inf - -inf is NaN).
    bool heavy_rows_possible = !kStagedBias || kWs;
    // kQInRegisters: this warp's rows of the Q in Q's tile (the Q load completing shared.bar_q()'s phase of that parity) into
    // state.q_frag
    if (kQInRegisters && !state.q_in_registers) {
      state.read_q_rows(pipe, q_lane, q_loads & 1);
      // (the arrive orders the warp's loads before it; the next Q's TMA waits for every warp's)
      if (more_tiles) pipe.release(shared.bar_q_empty());
    }
    for (int n = range.hi - 1, it = 0; n >= range.lo; --n, ++it) {
      const int use = use0 + it;  // (the same as it in a kernel that is not warp-specialized: one tile)
      FA2_CTA_MARK(trace_base + 1 + it, trace_base >= 0 && it < kTraceIters);
      const int buf = kRing == 1 ? 0 : use % kRing;
      const int col0 = n * kBlockN + (lane & 3) * 2;  // this thread's first fragment column (global key)
      float acc_s[kMTiles][kNTiles][4];               // S (kRowsPerWarp, kBlockN) of this warp
      // A staged key tile of zero bias: S = Q K^T as on the plain path, whose wgmma ptxas issues without reading the
      // accumulator, dropping the zeroing (kStagedBias; where the compiler sees the zeros, below). Clear: S += Q K^T.
      bool overwrite_s = false;
      if constexpr (kStagedBias) {
        // S starts from the stage's bias once it has landed (below)
      } else if constexpr (kBiasFold) {
        // issued before the barrier so that the loads' latency overlaps the wait
        using B = BiasElem;
        constexpr bool kKeyRow = kMode == ScoreMode::kKeyBiasFold;
        // (divided here rather than read from p.inv_scale, the same value: ptxas spilled 0 -> 88 B in sm80 d 128)
        const float inv_scale = 1.f / p.scale;
        const B* bias_b = static_cast<const B*>(bias_bh);
        if (n * kBlockN + kBlockN > p.seqlen_k) {
          init_from_bias<kKeyRow, /*kCheckCols=*/true>(acc_s, bias_b, p.bias_row_stride, p.bias_col_stride, row0,
                                                       col0, p.seqlen_q, p.seqlen_k, inv_scale);
        } else {
          init_from_bias<kKeyRow, /*kCheckCols=*/false>(acc_s, bias_b, p.bias_row_stride, p.bias_col_stride, row0,
                                                        col0, p.seqlen_q, p.seqlen_k, inv_scale);
        }
      } else {
        ptx::zero(acc_s);
      }
      // -- tile n has landed (cp.async: this thread's copies, then the barrier; TMA: the stage's mbarrier), and every
      //    warp is done with the buffers about to be refilled
      if constexpr (kTma) {
        if (!kQInRegisters && it == 0) pipe.wait_loaded(shared.bar_q(), q_loads & 1);
        pipe.wait_loaded(shared.bar_kv(buf), (use / kRing) & 1);
        // a staged bias tile of zeros is no bias; one of -infs is skipped (kSkipMaskedTiles); only the others are
        // read (KeyTileKind). Padding masks are mostly such tiles.
        KeyTileKind bias_kind = KeyTileKind::kMixed;
        if constexpr (kStagedBias) {
          bias_kind = classify_key_bias_tile<BiasElem, kBiasTileBytes, kSkipMaskedTiles>(shared.ptr(shared.bias(buf)), lane,
                                                                                       p.seqlen_k - n * kBlockN);
        }
        if constexpr (!kWs) {  // (warp-specialized: the producer refills a stage once its empty barrier completes)
          if constexpr (kStagedBias) {
            // the tile's bias folded (bias / scale, finite when the bias is) to fp32 once for the CTA, one key per
            // thread, before the barrier; every warp then reads its columns' values as they are. At d 64 (H200, bf16
            // padding mask, S 1k-16k) the forward went from 0.71-0.79x of its unmasked speed with every thread
            // converting the columns it holds to 0.80-0.89x.
            // (a -inf tile is read as a mixed one where it is not skipped)
            if (bias_kind == KeyTileKind::kMixed || (!kSkipMaskedTiles && bias_kind == KeyTileKind::kMasked)) {
              const BiasElem* raw = reinterpret_cast<const BiasElem*>(shared.ptr(shared.bias(buf)));
              float* folded = reinterpret_cast<float*>(shared.ptr(shared.bias_folded(buf)));
              // one key per thread: a loop here cost the 128-register d 64 kernel spills in its key loop (ptxas)
              static_assert(kBlockN <= kNThreads, "a key tile's bias is folded one key per thread");
              bool heavy_key = false;
              if (tid < kBlockN) {
                const float folded_key = fold_bias(staged_bias_value(raw, tid), p.inv_scale);
                folded[tid] = folded_key;
                heavy_key = folded_key < heavy_s && folded_key != -INFINITY;
              }
              // the block barrier, that also tells every thread whether a key of the tile is that low. Then the
              // tiles of a padding mask (0 / -inf) run the softmax without the heavy-row branch: at d 64 (H200, bf16
              // or fp32 mask) 0.92-0.94x of the unmasked speed, from 0.87-0.89x (scripts/fwd_variants.sh)
              const bool heavy_tile = __syncthreads_or(heavy_key) != 0;
              heavy_rows_possible = heavy_rows_possible || heavy_tile;
            } else {
              __syncthreads();  // (all +0)
            }
          } else {
            __syncthreads();
          }
          // overlaps this whole iteration
          if (tid == 0 && n > range.lo) tma.kv(n - 1, buf ^ 1, head_k, batch, bias_head, bias_batch);
        }
        if constexpr (kStagedBias) {
          if (kSkipMaskedTiles && bias_kind == KeyTileKind::kMasked) {  // (the same decision in every warp)
            if constexpr (kOverlap) {
              // the previous tile's P V goes out now: its stage must not stay held while the ring moves on (the
              // producer would wait for it to be released, this warp for the producer). O gets the same operations
              // in the same order as if this tile were computed (x 1 exactly, + P V of zeros).
              if (pv_pending) {
                gemm_pv_wgmma_packed<T, KVTile, kNTiles, kDTiles>(acc_o, p_prev, shared.v(buf_prev));
                pipe.release_stage(buf_prev);
                pv_pending = false;
              }
            }
            if constexpr (kWs) pipe.release_stage(buf);
            continue;
          }
          if (bias_kind == KeyTileKind::kZero) {
            if constexpr (kOverlap || kPingpong) {
              ptx::zero(acc_s);
            } else {
              overwrite_s = true;
            }
          } else if constexpr (kWs) {
            init_from_staged_key_bias(acc_s, reinterpret_cast<const BiasElem*>(shared.ptr(shared.bias(buf))) + (lane & 3) * 2,
                                      p.inv_scale);
          } else {
            init_from_folded_key_bias(acc_s, reinterpret_cast<const float2*>(shared.ptr(shared.bias_folded(buf))) + (lane & 3));
          }
        }
      } else {
        ptx::cp_async_wait<0>();
        if constexpr (kWgmma) sm90::fence_proxy_async();  // cp.async's writes, then read by wgmma (async proxy)
        __syncthreads();
        if constexpr (Cfg::kStages == 2) {
          if (n > range.lo) {  // prefetch tile n-1 into the other buffer: overlaps this whole iteration
            load_k(n - 1, buf ^ 1, NoCheckRows{});
            load_v(n - 1, buf ^ 1, NoCheckRows{});
          }
        } else {
          if (n == range.hi - 1) {
            load_v(n, 0, CheckRows{});  // overlaps S = Q K^T
          } else {
            load_v(n, 0, NoCheckRows{});
          }
        }
        ptx::cp_async_commit();
      }

      // -- S (+)= Q K^T
      if constexpr (kOverlap) {
        // Q K^T of this tile, then P V of the previous one behind it; wait for Q K^T only (groups complete in order).
        // With ping-pong, both go out in this warpgroup's turn: one turn per iteration, the other warpgroup's next one
        // opening once both are issued (warpgroup 1's last turn opens none: the after-loop P V takes no turn, and
        // warpgroup 0 got its first turn from warpgroup 1 before the loop, so each waits as often as it is signalled).
        if constexpr (kPingpong) pingpong_wait(warp >> 2);
        if constexpr (kQInRegisters) {
          gemm_qk_wgmma_rs<T, KVTile, kNTiles, kHeadDim>(acc_s, state.q_frag, shared.k(buf));
        } else {
          gemm_qk_wgmma<T, QTile, KVTile, kNTiles, kHeadDim, /*kWait=*/false>(acc_s, sQ, wg_row0, shared.k(buf));
        }
        const bool end_turn = kPingpong && (warp >> 2 == 0 || n > range.lo);
        if (kSkipMaskedTiles ? pv_pending : it > 0) {
          wait_v(buf_prev, use - 1);
          gemm_pv_wgmma_packed<T, KVTile, kNTiles, kDTiles, /*kWait=*/false>(acc_o, p_prev, shared.v(buf_prev));
          if (end_turn) pingpong_signal_other(warp >> 2);
          sm90::wait_hold</*kPending=*/1>(acc_s);
        } else {
          if (end_turn) pingpong_signal_other(warp >> 2);
          sm90::wait_hold<0>(acc_s);
        }
        if constexpr (kSplitKV) pipe.release_stage(buf);  // (K only: Q K^T has completed in this warp)
      } else if constexpr (kPingpong) {
        // this warpgroup's slot: opened here for the first tile, else before the previous tile's P V; closed once
        // Q K^T is issued, so the other warpgroup issues its products while this one waits for S and runs the softmax
        if (it == 0) pingpong_wait(warp >> 2);
        gemm_qk_wgmma<T, QTile, KVTile, kNTiles, kHeadDim, /*kWait=*/false>(acc_s, sQ, wg_row0, shared.k(buf));
        pingpong_signal_other(warp >> 2);
        sm90::wait_hold<0>(acc_s);
      } else if constexpr (kWgmma) {
        if (kStagedBias && overwrite_s) {
          // its own copy of the issue, after zeros the compiler sees (a runtime scale-d would keep the zeroing; at
          // d 64 with a bool padding mask 0.96-0.99x of the unmasked speed, from 0.91-0.94x)
          ptx::zero(acc_s);
          gemm_qk_wgmma<T, QTile, KVTile, kNTiles, kHeadDim>(acc_s, sQ, wg_row0, shared.k(buf));
        } else {
          gemm_qk_wgmma<T, QTile, KVTile, kNTiles, kHeadDim>(acc_s, sQ, wg_row0, shared.k(buf));
        }
      } else {
        gemm_qk<T, QTile, KVTile, kMTiles, kNTiles, kHeadDim>(acc_s, q_lane, shared.k(buf) + k_lane);
      }
      if constexpr (kMode == ScoreMode::kGeneral) score_mod<T, kBias>(acc_s, p, bias_bh, row0, col0);
      // -- mask only the tiles that cross a boundary (sequence tail, causal diagonal, window edge)
      if (info.needs_mask(n, kBlockN, m0, kBlockM)) info.apply_mask(acc_s, row0, col0);

      if constexpr (Cfg::kStages == 1) {
        ptx::cp_async_wait<0>();  // V[n] landed; every warp is done reading K[n]
        if constexpr (kWgmma) sm90::fence_proxy_async();
        __syncthreads();
        if (n > range.lo) load_k(n - 1, 0, NoCheckRows{});  // overlaps the softmax and P V
        ptx::cp_async_commit();
      }

      // -- online softmax: m, l updated, O rescaled, S -> P
      // heavy rows (softmax.cuh) only where a float bias can push every score of a row that low
      constexpr bool kHeavyRows = kBias == BiasType::kSameAsInput || kBias == BiasType::kFloat32;
      if constexpr (kOverlap) {
        float correction[2 * kMTiles];
        softmax.template update_scores<kHeavyRows>(acc_s, mult, heavy_s, correction);
        // the previous P V is done: O can be rescaled, the previous stage released, P_prev rewritten. Every path waits,
        // the first iteration's too (nothing is pending there): with the wait only where the issue's condition holds,
        // ptxas saw a path where O is rescaled with P V in flight and serialized every wgmma (C7515). The wait goes in
        // a basic block of its own, behind a branch that every warp of the warpgroup takes alike (wait_group is
        // .aligned): ptxas schedules a wait_group early in its block (it depends on no register), and written after the
        // softmax, in the softmax's block, it ran ahead of it, so that the softmax waited for the P V it was meant to
        // overlap (WARPGROUP.DEPBAR.LE gsb0, 0x0 before the first MUFU.EX2 in every overlap kernel's SASS). O is
        // rescaled inside each arm: after the join, ptxas took the rescale for a write to the accumulators of a wgmma
        // in flight and serialized every wgmma (C7515). Against d2e0cc8 (H200, bf16, scripts/fwd_variant_bench.cu, 2
        // rounds, bitwise-equal outputs, variants_h200-20261201-fwd-pv-wait-q-registers.json, d 128 with kQInRegisters
        // too): d 192 +3.7 / +5.0 / +4.7% at S 1k / 4k / 16k (causal +1.3 / +2.2 / +2.4%), d 256 +1.3 / +0.0 / +1.6%
        // (causal +0.1..+0.5%). A first version branched on the rescale's per-warp vote (warps of one warpgroup then
        // reached different wait_group instructions: synccheck's "mismatching warpgroup instruction pc") and measured
        // alike (variants_h200-20261201-fwd-pv-wait.json); there the staged-bias kernel (padding masks: overlap without
        // ping-pong at d 128) ran +0.1..-1.6% (causal -0.6..-2.9%), so it keeps the wait where ptxas puts it.
        auto o_free_rescale = [&](bool release_prev) {
          sm90::wait_hold<0>(acc_o);
          sm90::hold_fragments(p_prev);
          if (release_prev) pipe.release_v(buf_prev);
          softmax.rescale(acc_o, correction);
        };
        const bool prev_pending = kSkipMaskedTiles ? pv_pending : it > 0;  // (the same in every warp)
        if (kStagedBias) {
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
        continue;  // this tile's P V goes out with the next tile's Q K^T (or after the loop)
      } else {
        // (a row can still end up below heavy_s without a bias that low, through q.k alone: as on the plain path, it
        // then takes the ordinary update, whose error there is about |m * mult| 2^-24, small until |m| is huge)
        if (kHeavyRows && heavy_rows_possible) {
          softmax.template update<kHeavyRows>(acc_s, acc_o, mult, heavy_s);
        } else {
          softmax.template update<false>(acc_s, acc_o, mult, heavy_s);
        }
      }
      // -- O += P V
      if constexpr (kPingpong) pingpong_wait(warp >> 2);  // this warpgroup's next slot: P V, then the next Q K^T
      if constexpr (kWgmma) {
        gemm_pv_wgmma<T, KVTile, kNTiles, kDTiles>(acc_o, acc_s, shared.v(buf));
      } else {
        gemm_pv<T, KVTile, kMTiles, kNTiles, kDTiles>(acc_o, acc_s, shared.v(buf) + v_lane);
      }
      // both products of this warp have completed (each waits for its wgmma group): its reads of stage buf are done
      if constexpr (kWs) pipe.release_stage(buf);
    }

    if constexpr (kPingpong && !kOverlap) {
      if (warp >> 2 == 0) pingpong_signal_other(0);  // warpgroup 0's last slot ends
    }
    if constexpr (kOverlap) {  // the last tile's P V (the key range is not empty, but its tiles may all be skipped)
      if (!kSkipMaskedTiles || pv_pending) {
        wait_v(buf_prev, use0 + (range.hi - range.lo) - 1);
        gemm_pv_wgmma_packed<T, KVTile, kNTiles, kDTiles>(acc_o, p_prev, shared.v(buf_prev));
        pipe.release_v(buf_prev);
      }
    }

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
