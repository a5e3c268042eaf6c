// Which query blocks ("tiles": kBlockM queries of one (batch, head)) a forward CTA runs, and in which order (FA-3's
// tile scheduler): one tile per CTA from a (query blocks, heads, batch) grid, one from a 1-D grid of tiles, or a
// persistent CTA's tiles one after another (every gridDim.x-th, or the next unclaimed one from a tile counter).
// Varlen and split-KV change what a tile is: here (varlen: a tile's rows and lengths are its sequence's, sequence();
// the grid is sized by max_seqlen_q, and a tile past its sequence's end is skipped by every part of the kernel:
// runs_block).
#pragma once
#include "fa2/block_info.cuh"
#include "fa2/fwd/pipeline.cuh"
#include "fa2/params.h"
#include "fa2/tile_order.h"

namespace fa2 {
namespace fwd {

// One tile: its query block and (batch, head).
struct FwdTileCoord {
  int m_block, head, batch;
};

// The warp-specialized kernels take a 1-D grid of tiles (fwd_launch_template.cuh): at the persistent headdims
// (tile_config.h, fwd_persistent_headdim) at most one CTA per SM, CTA b taking tiles b, b + grid, b + 2 grid, ...
// (with a tile counter: b, then the next unclaimed), so that its producer loads the next tile's K/V and Q while the
// consumers finish the current one (no CTA launch, prologue and epilogue between tiles); elsewhere one tile per CTA,
// in a loop the compiler sees run once (a real loop slowed the d 256 kernels: docs/tuning-fwd.md). Tile t is query block
// num_m_blocks - 1 - rank of (batch, head) bh, (bh, rank) from TileOrder (tile_order.h): the blocks of one head
// together (their K/V shared in L2), the longest (causal) rows first, with causal lengths the last heads' blocks
// longest first across those heads (p.tile_order_tail). The other kernels: one tile per CTA, the same order from a
// (query blocks, heads, batch) grid.
// kCluster: CTAs in pairs (a cluster of two: ranks 0 and 1 are blockIdx.x 2c and 2c + 1) whose tiles t, t + 1 are two
// query blocks of one (batch, head) with the same key range, so that each K/V tile is read from L2 once for both
// (fwd/producer.cuh). The launcher sends only calls where that holds for every pair: an even grid, an even number of
// query blocks per head, no causal mask or window, the head-major tile order. (Dense only: a varlen pair's two
// query blocks could lie in different sequences.)
template <class Traits>
struct FwdTileScheduler {
  static_assert(!Traits::kTileCounter || Traits::kPersistent, "the tile counter serves persistent CTAs");
  const AttentionParams& p;
  int num_m_blocks;  // query blocks per (batch, head)
  int num_tiles;     // tiles below num_tiles run (a one-tile CTA: its own index + 1)
  int first_tile;    // this CTA's first
  int tile_stride;   // the persistent CTA's next tile without a counter: t + tile_stride

  __device__ __forceinline__ explicit FwdTileScheduler(const AttentionParams& p_)
      : p(p_),
        num_m_blocks((p_.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM),
        num_tiles(Traits::kPersistent ? num_m_blocks * p_.nheads * p_.batch
                  : Traits::kWs       ? int(blockIdx.x) + 1
                                      : 1),
        first_tile(Traits::kWs ? int(blockIdx.x) : 0),
        tile_stride(Traits::kPersistent ? int(gridDim.x) : 1) {}

  // Whether this CTA may run more than one tile: its consumers then release Q to the producer after each tile and
  // store O from registers or staged rows of Q's tile. (A kernel template of its own: as a run-time choice in the one
  // kernel, the consumers spilled ~80 B and the forward ran slower: docs/tuning-fwd.md.)
  __device__ __forceinline__ bool more_tiles() const {
    return Traits::kPersistent && (Traits::kTileCounter || tile_stride < num_tiles);
  }

  // The tile after t without a counter (and the producer's, with it: the next unclaimed one, tiles below gridDim.x
  // first; claimed once t's copies are all issued: the producer runs up to a ring ahead of the consumers, which hides
  // the atomic's latency, and claimed any earlier a CTA would hold tiles back from others)
  __device__ __forceinline__ int next_static(int t) const { return t + tile_stride; }
  __device__ __forceinline__ int claim_next(int t) const {
    if constexpr (Traits::kTileCounter && Traits::kVarlen) {
      // (a claimed tile past its sequence's end is never announced: the consumers skip only a CTA's first tile so)
      int next;
      do {
        next = int(gridDim.x) + atomicAdd(static_cast<int*>(p.workspace), 1);
      } while (next < num_tiles && !in_sequence(coord(next)));
      return next;
    }
    return Traits::kTileCounter ? int(gridDim.x) + atomicAdd(static_cast<int*>(p.workspace), 1) : t + tile_stride;
  }

  // The consumers' next tile after t: t + tile_stride, or, with the tile counter, the one the producer announced
  // (fwd/producer.cuh: its index in the tile slot, then bar_q's phase; read by lane 0 and broadcast, so that each
  // warp's release of Q, lane 0's, follows its read in program order). q_loads: the Q loads (announcements) so far.
  __device__ __forceinline__ int consumers_next(int t, const FwdPipeline<Traits>& pipe, const int& q_loads) const {
    if constexpr (Traits::kTileCounter) {
      pipe.wait_loaded(pipe.smem.bar_q(), q_loads & 1);
      int slot = 0;
      if (pipe.lane == 0) slot = *reinterpret_cast<volatile const int*>(pipe.smem.ptr(pipe.smem.tile_slot()));
      return __shfl_sync(0xffffffffu, slot, 0);
    } else {
      return t + tile_stride;
    }
  }

  // Tile t's coordinates. (The warp-specialized kernels' tiles number at most 2^30 - 1 (the launcher checks); a
  // (query blocks, heads, batch) grid's tiles start in linear blockIdx order, and with a tail, which the launcher sets
  // only where batch * nheads * blocks fits an int, go through the same order. The sm80-path kernels keep blockIdx:
  // the order's code cost the d 128 ones 50-110 B more spills; their launcher sets no tail.)
  __device__ __forceinline__ void at(int t, int& m_block, int& head, int& batch) const {
    int bh = 0, rank = 0;
    if constexpr (Traits::kWs) {
      TileOrder{num_m_blocks, p.nheads * p.batch, p.tile_order_tail}.at(t, bh, rank);
    } else {
      m_block = gridDim.x - 1 - blockIdx.x;
      head = blockIdx.y;
      batch = blockIdx.z;
      if (!Traits::kWgmma || p.tile_order_tail == 0) return;
      TileOrder{num_m_blocks, p.nheads * p.batch, p.tile_order_tail}.at(
          int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)), bh, rank);
    }
    m_block = num_m_blocks - 1 - rank;
    head = bh % p.nheads;
    batch = bh / p.nheads;
  }
  // Where tile (.., batch)'s rows lie and how long its sequence is (block_info.cuh): a dense call's batch element, or
  // a varlen call's sequence, whose blocks past its end have nothing to do (the grid is sized by max_seqlen_q).
  __device__ __forceinline__ SequenceBounds sequence(int batch) const {
    return sequence_bounds<Traits::kVarlen, Traits::kWgmma>(p, batch);
  }
  // Whether query block m_block of a sequence of seqlen_q queries runs: its queries start inside the sequence (dense:
  // always). The producer and the consumers skip the others alike, before any barrier: no Q load, no stage, no
  // announcement.
  __device__ __forceinline__ static bool runs_block(int m_block, int seqlen_q) {
    return !Traits::kVarlen || m_block * Traits::kBlockM < seqlen_q;
  }
  __device__ __forceinline__ bool in_sequence(const FwdTileCoord& c) const {
    return runs_block(c.m_block, sequence(c.batch).seqlen_q);
  }
  // Which keys a tile of sequence seq sees: dense, the call's BlockInfo; varlen, its sequence's (bottom-right aligned
  // over its own lengths).
  __device__ __forceinline__ BlockInfo tile_info(const SequenceBounds& seq, const BlockInfo& info) const {
    return Traits::kVarlen ? BlockInfo{seq.seqlen_q, seq.seqlen_k, p.window_left, p.window_right} : info;
  }

  __device__ __forceinline__ FwdTileCoord coord(int t) const {
    FwdTileCoord c;
    at(t, c.m_block, c.head, c.batch);
    return c;
  }

  // The first tile from t on (t, t + tile_stride, ...) whose queries see some key; num_tiles or more if none. Searched
  // only where a tile can be keyless (its two divisions and its loop were a chain of ~60 uniform-datapath instructions
  // at the end of every tile).
  // Varlen: each tile with its own sequence's bounds, tiles past a sequence's end skipped too.
  __device__ __forceinline__ int next_with_keys(int t, const BlockInfo& info) const {
    if constexpr (Traits::kVarlen) {
      for (; t < num_tiles; t += tile_stride) {
        const FwdTileCoord c = coord(t);
        const SequenceBounds seq = sequence(c.batch);
        const int m0 = c.m_block * Traits::kBlockM;
        if (runs_block(c.m_block, seq.seqlen_q) &&
            !tile_info(seq, info).key_blocks(m0, Traits::kBlockM, Traits::kBlockN).empty()) {
          break;
        }
      }
      return t;
    }
    if (!info.every_block_sees_keys()) {
      while (t < num_tiles) {
        const FwdTileCoord c = coord(t);
        if (!info.key_blocks(c.m_block * Traits::kBlockM, Traits::kBlockM, Traits::kBlockN).empty()) break;
        t += tile_stride;
      }
    }
    return t;
  }
};

}  // namespace fwd
}  // namespace fa2
