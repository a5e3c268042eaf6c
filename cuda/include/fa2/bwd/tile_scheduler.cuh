// The backward's tile scheduling: which (key block, head, batch) a CTA takes, and which of the key block's query blocks.
//   - bwd_kernel: the grid's blockIdx, or in deterministic mode the order in which CTAs start (a ticket counter);
//   - the ws kernels: blockIdx, a causal launch's tail sent rank-major (tile_order.h), or a tail split into pieces over
//     the query blocks (tile_order.h, tail_split); a CTA may take a whole GQA group of query heads.
// Varlen: a tile lies within its sequence (BwdTileSequence; the ws kernels' WsKeyBlock::seq). Split-KV schedules go
// here.
#pragma once
#include <cstdint>

#include "fa2/block_info.cuh"  // SequenceBounds
#include "fa2/bwd/block_range.cuh"
#include "fa2/params.h"
#include "fa2/tile_order.h"

namespace fa2 {
namespace bwd {

// bwd_kernel's tile: (key block, head, batch), and in deterministic mode its query blocks' dQ turn counters.
struct BwdTile {
  int n_block, head, batch;
  int* turns;  // deterministic mode: the turn counter of each of (batch, head)'s query blocks; else null
};

// The grid's tile, or in deterministic mode the order in which CTAs start: the CTA's ticket (thread 0 draws it into
// ticket_slot, a shared int every thread reads after the CTA barrier) numbers its tile, key block fastest.
__device__ __forceinline__ BwdTile bwd_tile(const AttentionParams& p, int* ticket_slot, int num_n_blocks,
                                            int num_m_blocks, int tid) {
  BwdTile tile{int(blockIdx.x), int(blockIdx.y), int(blockIdx.z), nullptr};
  if (p.deterministic) {
    int* counters = static_cast<int*>(p.workspace);  // [ticket counter] [turn counter per (batch, head, query block)]
    if (tid == 0) *ticket_slot = atomicAdd(counters, 1);
    __syncthreads();
    const int t = *ticket_slot;
    tile.n_block = t % num_n_blocks;
    tile.head = (t / num_n_blocks) % p.nheads;
    tile.batch = t / (num_n_blocks * p.nheads);
    tile.turns = counters + 1 + (int64_t(tile.batch) * p.nheads + tile.head) * num_m_blocks;
  }
  return tile;
}

// bwd_kernel's tile within its sequence (block_info.cuh): a varlen call's sequence, whose key blocks past its end have
// nothing to do (their keys are the next sequence's), read once from cu_seqlens; a dense call's batch element, whose
// lengths and strides the kernel reads from the params where it uses them (as it did before varlen: moving those reads
// changed its register allocation).
template <bool kVarlen>
struct BwdTileSequence {
  SequenceBounds seq{};  // (varlen only)
  int batch;

  __device__ __forceinline__ BwdTileSequence(const AttentionParams& p, int batch_) : batch(batch_) {
    if constexpr (kVarlen) seq = indexed_sequence_bounds(p, batch_);
  }
  __device__ __forceinline__ int seqlen_q(const AttentionParams& p) const {
    return kVarlen ? seq.seqlen_q : p.seqlen_q;
  }
  __device__ __forceinline__ int seqlen_k(const AttentionParams& p) const {
    return kVarlen ? seq.seqlen_k : p.seqlen_k;
  }
  // offsets of the batch element's first query / key row in a tensor of these strides
  __device__ __forceinline__ int64_t q_rows(int64_t batch_stride, int64_t row_stride) const {
    return kVarlen ? int64_t(seq.q_row0) * row_stride : batch * batch_stride;
  }
  __device__ __forceinline__ int64_t k_rows(int64_t batch_stride, int64_t row_stride) const {
    return kVarlen ? int64_t(seq.k_row0) * row_stride : batch * batch_stride;
  }
  // the first row of (batch, head) bh in the row-wise buffers (lse, D, dq_accum): (batch, nheads, seqlen_q), or a
  // varlen call's (nheads, total_q)
  __device__ __forceinline__ int64_t stats_row0(const AttentionParams& p, int64_t bh, int head) const {
    return kVarlen ? int64_t(head) * p.total_q + seq.q_row0 : bh * p.seqlen_q;
  }
};

// The (key block, head, batch) of this CTA of a (key blocks, heads, batch) grid (heads: nheads, or nheads_k where a
// CTA takes a whole GQA group): blockIdx, except for the CTAs of the last p.tile_order_tail (batch, head) pairs, which
// tile_order.h's order (the grid's CTAs start in linear blockIdx order) sends rank-major: a head's longest block,
// rank 0, is its first key block (causal lengths: key block n is seen by the query blocks from its diagonal on). (The
// launcher sets a tail only where the grid's CTAs fit an int.) The head-major CTAs keep blockIdx as it is: the order's
// division runs only in the tail's branch. The ws kernels at d 128 / 256 only (bwd_tile_config.h, kTileOrderTail).
__device__ __forceinline__ void bwd_tile_of_cta(const AttentionParams& p, int& n_block, int& head, int& batch) {
  n_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  if (p.tile_order_tail == 0) return;
  const int heads = int(gridDim.y * gridDim.z), bh = int(blockIdx.y + gridDim.y * blockIdx.z);
  if (bh >= heads - p.tile_order_tail) {
    int tail_bh, rank;
    TileOrder{int(gridDim.x), heads, p.tile_order_tail}.at(int(blockIdx.x + gridDim.x * bh), tail_bh, rank);
    n_block = rank;
    head = tail_bh % int(gridDim.y);
    batch = tail_bh / int(gridDim.y);
  }
}

// Whether dK, dV are the GQA group's sums, stored like k (the launch's CTAs each take a whole group: its grid has
// nheads_k heads), rather than one query head's fp32 partials or (without GQA) that head's.
// (AttentionParams::gqa_dkv, GqaDkv::kInKernel; host: the launcher's grid and kernel choice)
__host__ __device__ __forceinline__ bool ws_groups_gqa(const AttentionParams& p) {
  return p.h_h_k_ratio > 1 && p.gqa_dkv == GqaDkv::kInKernel;
}

// The tile (linear index t: key block fastest, then head, then batch, the order a (key blocks, heads, batch) grid's
// CTAs start in) and piece of this CTA of a tail-split launch (p.bwd_tail_pieces > 1: a 1-D grid of the
// p.bwd_tail_grid_tiles - p.bwd_tail_tiles whole tiles, then each of the last p.bwd_tail_tiles tiles' pieces in turn,
// bwd_tail_split_plan): piece -1 for a whole tile. (bwd_ws_kernel's epilogue calls it again rather than keep the
// piece in registers through the loop.)
struct WsTailTile {
  int t;           // the tile
  int piece;       // this CTA's piece of it, or -1: the whole tile
  int tail_index;  // which of the launch's last p.bwd_tail_tiles tiles it is, or -1
};
__device__ __forceinline__ WsTailTile ws_tail_tile(const AttentionParams& p) {
  const int whole = p.bwd_tail_grid_tiles - p.bwd_tail_tiles;
  WsTailTile tile{int(blockIdx.x), -1, -1};
  if (tile.t >= whole) {
    tile.tail_index = (tile.t - whole) / p.bwd_tail_pieces;
    tile.piece = tile.t - whole - tile.tail_index * p.bwd_tail_pieces;
    tile.t = whole + tile.tail_index;
  }
  return tile;
}

// The CTA's key block and the query blocks that see it, in both ws kernels. Its query heads: head (the first) ..
// head + heads - 1, of kv head head_k: one (heads 1), or where the CTA takes a whole GQA group (ws_groups_gqa) its
// h_h_k_ratio heads.
struct WsKeyBlock {
  int n_block, head, heads, head_k, batch, n0, m_lo, m_hi;
  int64_t bh;     // batch * nheads + head
  bool producer;  // this thread is in the producer warpgroup, whose part is done: the kernel returns
  SequenceBounds seq;  // varlen (bwd_ws_kernel's kVarlen) only: the key block's sequence
  // the consumers' loop steps: query blocks m_lo .. m_hi of query head head, then (a CTA that sums a GQA group) of each
  // next head of the group in turn
  __device__ __forceinline__ int steps() const { return m_hi >= m_lo ? (m_hi - m_lo + 1) * heads : 0; }
};

// The ws kernels' schedule: the key block (blockIdx.x of (key blocks, heads, batch), with a tail tile_order.h's order,
// or a tail split's tile), its query heads, and its query range (a tail piece's part of it). kVarlen: batch is the
// sequence, whose lengths (blk.seq) bound the query range, bottom-right aligned over them; a key block at or past
// the sequence's end has an empty one (the grid's key blocks count max_seqlen_k's).
template <typename Cfg, bool kKeyBias, bool kVarlen = false>
__device__ __forceinline__ WsKeyBlock ws_schedule(const AttentionParams& p) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  WsKeyBlock blk;
  int grid_head;  // (a query head, or with ws_groups_gqa a kv head)
  const int num_n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  int piece = -1;  // (where the launch splits its last wave, this CTA's piece of a tail tile: ws_tail_tile)
  // (the tail split: no GQA, no causal lengths, no bias, bwd_tail_split_plan; compiled only where it may run)
  if (Cfg::kTailSplit && !kKeyBias && !kVarlen && p.bwd_tail_pieces > 1) {
    const WsTailTile tile = ws_tail_tile(p);
    piece = tile.piece;
    const int bh = tile.t / num_n_blocks;
    blk.n_block = tile.t - bh * num_n_blocks, grid_head = bh % p.nheads, blk.batch = bh / p.nheads;
  } else if constexpr (Cfg::kTileOrderTail) {
    bwd_tile_of_cta(p, blk.n_block, grid_head, blk.batch);
  } else {
    blk.n_block = blockIdx.x, grid_head = blockIdx.y, blk.batch = blockIdx.z;
  }
  if (ws_groups_gqa(p)) {
    // (with kKeyBias the consumers keep one head's bias for the whole group: the launcher groups only a bias that is
    // the same for every head, bwd_ws_groups_gqa)
    if (kKeyBias && p.bias_head_stride != 0) __trap();
    blk.head_k = grid_head, blk.heads = p.h_h_k_ratio, blk.head = grid_head * p.h_h_k_ratio;
  } else {
    blk.head = grid_head, blk.heads = 1, blk.head_k = grid_head / p.h_h_k_ratio;
  }
  blk.n0 = blk.n_block * kBlockN;
  if constexpr (kVarlen) {
    blk.seq = indexed_sequence_bounds(p, blk.batch);
    const int num_m_blocks = (blk.seq.seqlen_q + kBlockM - 1) / kBlockM;
    const QueryBlockRange range{blk.seq.seqlen_q, blk.seq.seqlen_k, p.window_left, p.window_right,
                                kBlockM,          kBlockN,          num_m_blocks};
    blk.m_lo = range.lo(blk.n_block);
    blk.m_hi = blk.n0 < blk.seq.seqlen_k ? range.hi(blk.n_block) : blk.m_lo - 1;
  } else {
    const int num_m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
    const QueryBlockRange range{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right, kBlockM, kBlockN, num_m_blocks};
    blk.m_lo = range.lo(blk.n_block);
    blk.m_hi = range.hi(blk.n_block);
  }
  if (piece >= 0) {  // (its part of the tile's query blocks; the pieces cover them once, in order)
    const int len = blk.m_hi - blk.m_lo + 1, lo = blk.m_lo;
    blk.m_lo = lo + len * piece / p.bwd_tail_pieces;
    blk.m_hi = lo + len * (piece + 1) / p.bwd_tail_pieces - 1;
  }
  blk.bh = int64_t(blk.batch) * p.nheads + blk.head;
  return blk;
}

}  // namespace bwd
}  // namespace fa2
