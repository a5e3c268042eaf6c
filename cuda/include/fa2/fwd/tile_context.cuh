// What a forward consumer thread knows while it computes one tile: the tile (its queries, key blocks, heads and
// pointers), its own rows within it, and what carries over between a persistent CTA's tiles (barrier phases, Q in
// registers). Also the CTA trace's slots (FA2_CTA_TRACE, a development tool: cta_trace.cuh).
#pragma once
#include <cstdint>

#include "fa2/block_info.cuh"
#include "fa2/cta_trace.cuh"
#include "fa2/fwd/pipeline.cuh"
#include "fa2/fwd/producer.cuh"
#include "fa2/fwd/score_mod.cuh"
#include "fa2/fwd/tile_scheduler.cuh"
#include "fa2/params.h"
#include "fa2/ptx.cuh"
#include "fa2/softmax.cuh"

namespace fa2 {
namespace fwd {

// FA2_CTA_TRACE: for the CTA's first two tiles warpgroup 0's first thread marks the tile's start, the start of each of
// its first kIters key iterations, the loop's end and the epilogue's end; warpgroup 1's first thread the same for the
// second tile. (The consumers of the d 128 ping-pong-overlap kernel then spill ~90 B, outside the key loop.) With
// FA2_CTA_TRACE_TILES, each consumer warpgroup's first thread marks the start, the loop's end and the epilogue's end
// of each of the CTA's first kTiles tiles, no key iterations: both warpgroups' tile switches.
struct FwdTrace {
  static constexpr bool kEveryTile = FA2_CTA_TRACE_TILES;
  static constexpr int kIters = kEveryTile ? 0 : 17, kTileSlots = kIters + 3;
  static constexpr int kTiles = kEveryTile ? (trace::kSlots - trace::kFirstEvent) / (2 * kTileSlots) : 2;
  static_assert(trace::kFirstEvent + (kEveryTile ? 2 * kTiles : 3) * kTileSlots <= trace::kSlots,
                "the events fit a CTA's slots");
  // this thread's first slot for the CTA's tile number trace_tile, -1 if it marks none
  __device__ __forceinline__ static int base(int tid, int trace_tile) {
    return kEveryTile ? ((tid == 0 || tid == 128) && trace_tile < kTiles
                             ? trace::kFirstEvent + ((tid >> 7) * kTiles + trace_tile) * kTileSlots
                             : -1)
           : tid == 0 && trace_tile < 2    ? trace::kFirstEvent + trace_tile * kTileSlots
           : tid == 128 && trace_tile == 1 ? trace::kFirstEvent + 2 * kTileSlots
                                           : -1;
  }
};

// One tile as the consumer threads see it.
template <class Traits>
struct FwdTile {
  using T = typename Traits::T;
  const AttentionParams& p;
  const BlockInfo& info;
  FwdSmem<Traits> smem;
  FwdPipeline<Traits> pipe;
  FwdTmaLoads<Traits> tma;  // (the pipelined kernel's thread 0 issues the next stage)
  // tid: the thread's place among the consumer (computing) threads (the producer warpgroup of a warp-specialized
  // kernel comes first and has tid < 0)
  int tid, lane, headdim;
  FwdTileCoord coord;
  int m0, rows_q;
  KeyBlockRange range;
  int head_k;                 // (GQA) the K/V head
  int bias_head, bias_batch;  // the staged bias's TMA coordinates
  const T* q;                 // the block's first query row
  const T* k;                 // this (batch, kv head)'s first key row
  const T* v;
  const void* bias_bh;  // this (batch, head)'s bias (the launcher chose kBias by it)
  bool more_tiles;      // the CTA may run a next tile (FwdTileScheduler::more_tiles)
  int trace_base;       // FA2_CTA_TRACE: this thread's first slot for this tile, -1 if it marks none
  SequenceBounds seq;   // where the tile's rows lie (varlen: its sequence; the TMA loads address them from there)
};

// A consumer thread's rows of the tile: mma / wgmma fragment rows, ldmatrix lane bases, and the softmax's constants.
template <class Traits>
struct FwdThreadRows {
  float mult;     // scores to log2 units (the exp2's FMA)
  float heavy_s;  // scores below this are heavy (softmax.cuh)
  int q_row0;     // this warp's first row in the block
  // this warpgroup's first row (wgmma's Q operand), broadcast from lane 0: ptxas then treats it as warp-uniform and
  // builds the Q descriptors in uniform registers, not per thread with an R2UR before every wgmma
  int wg_row0;
  int row0;  // this thread's first fragment row (global)
  // ldmatrix lane bases (ptx.cuh): which row / chunk of a 16x16 fragment this lane addresses
  //   Q (A operand):       rows 0..15 by lane % 16, chunk + lane / 16
  //   K (B of Q K^T):      rows lane % 8 + 8 (lane / 16), chunk + (lane / 8) % 2
  //   V (B of P V, .trans): rows lane % 8 + 8 ((lane / 8) % 2), chunk + lane / 16
  uint32_t q_lane, k_lane, v_lane;

  __device__ __forceinline__ FwdThreadRows(const AttentionParams& p, uint32_t s_q, int m0, int warp, int lane) {
    using QTile = typename Traits::QTile;
    using KVTile = typename Traits::KVTile;
    mult = Traits::kMode == ScoreMode::kGeneral ? kLog2e : p.scale_log2;
    heavy_s = Traits::kMode == ScoreMode::kGeneral ? -kHeavyRowLog2 / kLog2e : p.heavy_score;
    q_row0 = warp * Traits::kRowsPerWarp;
    wg_row0 = __shfl_sync(0xffffffffu, q_row0 & ~63, 0);
    row0 = m0 + q_row0 + (lane >> 2);
    q_lane = s_q + QTile::const_bytes(q_row0, 0) + QTile::lane_bytes(lane & 15, lane >> 4);
    k_lane = KVTile::lane_bytes((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    v_lane = KVTile::lane_bytes((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);
  }
};

// What a consumer thread carries from one of its CTA's tiles to the next.
template <class Traits>
struct FwdConsumerState {
  bool q_in_registers = false;  // kStagedO: this tile's Q was read into q_frag at the end of the previous one
  // kQInRegisters: this warp's 16 rows of Q, as the A fragments of Q K^T (dims 16 kt .. 16 kt + 15)
  uint32_t q_frag[Traits::kHeadDim / 16][4];

  // kQInRegisters: this warp's rows of the Q in Q's tile (the Q load completing bar_q's phase of that parity)
  __device__ __forceinline__ void read_q_rows(const FwdPipeline<Traits>& pipe, uint32_t q_lane, uint32_t phase) {
    pipe.wait_loaded(pipe.smem.bar_q(), phase);
#pragma unroll
    for (int kt = 0; kt < Traits::kHeadDim / 16; ++kt) {
      ptx::ldmatrix_x4(q_frag[kt], Traits::QTile::fragment_address(q_lane, 0, kt * 2));
    }
  }
};

}  // namespace fwd
}  // namespace fa2
