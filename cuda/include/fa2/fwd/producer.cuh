// The forward's loads (FA-3's producer): the TMA copies of Q and of K/V stages (one thread issues every copy, one per
// column block of a tile; the TMA writes the SwizzledTile layout itself and zero-fills rows past seqlen and columns
// past headdim), the warp-specialized producer's loop over a CTA's tiles, and the cp.async loads of the sm80 path.
// A paged key/value cache (params.h, block_table) changes where a K/V tile's rows come from: for_each_page_box.
#pragma once
#include <cstdint>

#include "fa2/block_info.cuh"
#include "fa2/fwd/load_tile.cuh"
#include "fa2/fwd/shared_storage.cuh"
#include "fa2/fwd/tile_scheduler.cuh"
#include "fa2/params.h"
#include "fa2/sm90/tma.cuh"

namespace fa2 {
namespace fwd {

// TMA copies into the storage, each on its barrier (issued by one thread).
template <class Traits>
struct FwdTmaLoads {
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  static constexpr int kBlockCols = Traits::kBlockCols, kColBlocks = Traits::kColBlocks;
  static constexpr int kKVBytes = Traits::Cfg::kSmemKVBytes;
  static_assert(!Traits::kCluster || kColBlocks % 2 == 0, "a cluster pair multicasts half the column blocks each");
  const sm90::FwdTensorMaps& maps;
  FwdSmem<Traits> smem;
  uint32_t cta_rank;  // kCluster: this CTA's rank in its pair

  // Where a tile's rows lie in the maps: (row, batch) of a dense call's 4-D maps; varlen (kVarlen), the packed
  // tensors are a batch of one whose rows the sequence's first row (seq.q_row0 / k_row0) offsets. Rows past the
  // sequence's end are loaded too (the next sequence's, or the TMA's zeros past the tensor's end): masked as keys
  // (BlockInfo over the sequence's lengths), never stored as queries (the epilogue's rows_q).
  __device__ __forceinline__ static int q_row(int m0, const SequenceBounds& seq) {
    return Traits::kVarlen ? seq.q_row0 + m0 : m0;
  }
  __device__ __forceinline__ static int k_row0(const SequenceBounds& seq) { return Traits::kVarlen ? seq.k_row0 : 0; }
  __device__ __forceinline__ static int map_batch(int batch) { return Traits::kVarlen ? 0 : batch; }

  // A paged cache (Traits::kPagedKV with params.block_table: params.h): load(r, row, page) for each box of key tile n's keys,
  // params.page_box_rows of them from the tile's row r on, at row `row` of page `page` (the map's batch is the page,
  // its rows a page's keys), the pages sequence `batch`'s table names. A slot past the table's row reads the TMA's
  // zeros (page num_pages), as does a bad page number: those keys are masked, or the caller's error.
  __device__ __forceinline__ static bool paged(const AttentionParams& params) {
    return Traits::kPagedKV && params.block_table != nullptr;
  }
  // (32-bit indices: the producer runs on kWsProducerRegs registers; the table's entries fit int, plan.h)
  __device__ __forceinline__ static int page_of(const AttentionParams& params, int batch, int slot) {
    return slot < params.pages_per_sequence
               ? __ldg(params.block_table + (batch * int(params.block_table_batch_stride) + slot))
               : params.num_pages;
  }
  // Key tile n's first box: its table slot, row in the page, and page. The warp-specialized producer looks it up
  // before it waits for the tile's stage, so that the table load's latency overlaps the wait instead of standing
  // between a stage's release and its copies (first_box below; the pipelined kernel's thread 0 passes none).
  struct PageBox {
    int slot, row, page;
  };
  __device__ __forceinline__ static PageBox first_page_box(const AttentionParams& params, int n, int batch) {
    const int first = n * kBlockN, slot = first / params.page_size;
    return {slot, first - slot * params.page_size, page_of(params, batch, slot)};
  }
  template <class Load>
  __device__ __forceinline__ static void for_each_page_box(const AttentionParams& params, int n, int batch,
                                                           const PageBox* first_box, Load&& load) {
    int slot, row;
    if (first_box != nullptr) {
      slot = first_box->slot, row = first_box->row;
    } else {
      const int first = n * kBlockN;
      slot = first / params.page_size, row = first - slot * params.page_size;  // (one division a tile)
    }
    for (int r = 0; r < kBlockN; r += params.page_box_rows) {
      load(r, row, first_box != nullptr && r == 0 ? first_box->page : page_of(params, batch, slot));
      row += params.page_box_rows;
      if (row == params.page_size) row = 0, ++slot;
    }
  }

  // a query block's Q (the block's first query m0; varlen: q_row's)
  __device__ __forceinline__ void q(int m0, int head, int batch) const {
    sm90::mbarrier_arrive_expect_tx(smem.bar_q(), Traits::Cfg::kSmemQBytes);
    sm90::tma_load_tile<kBlockM, kHeadDim, kBlockCols>(smem.q(), &maps.q, smem.bar_q(), m0, head, batch);
  }
  // kSplitKV: K, or V, of key tile n into dst on its own barrier (batch: the call's batch element, varlen the
  // sequence; row0: k_row0's)
  // (first_box: a paged tile's first box looked up by the caller, else looked up here)
  __device__ __forceinline__ void k_or_v(const AttentionParams& params, const CUtensorMap* map, uint32_t dst,
                                         uint32_t bar, int n, int head_k, int batch, int row0 = 0,
                                         const PageBox* first_box = nullptr) const {
    sm90::mbarrier_arrive_expect_tx(bar, kKVBytes);
    if (paged(params)) {
      for_each_page_box(params, n, batch, first_box, [&](int r, int row, int page) {
#pragma unroll
        for (int blk = 0; blk < kColBlocks; ++blk) {
          const uint32_t offset = (blk * kBlockN + r) * kBlockCols * 2;
          sm90::tma_load_4d(dst + offset, map, bar, blk * kBlockCols, row, head_k, page);
        }
      });
      return;
    }
#pragma unroll
    for (int blk = 0; blk < kColBlocks; ++blk) {
      const uint32_t offset = blk * kBlockN * kBlockCols * 2;
      sm90::tma_load_4d(dst + offset, map, bar, blk * kBlockCols, row0 + n * kBlockN, head_k, map_batch(batch));
    }
  }
  // K and V (and the staged bias) of key tile n into stage buf (batch, row0: k_or_v's). kCluster (never varlen): the
  // whole tile lands here too, half of it from the peer's producer (each multicasts half the column blocks into both
  // CTAs' stage).
  __device__ __forceinline__ void kv(const AttentionParams& params, int n, int buf, int head_k, int batch,
                                     int bias_head, int bias_batch, int row0 = 0,
                                     const PageBox* first_box = nullptr) const {
    const uint32_t bar = smem.bar_kv(buf);
    sm90::mbarrier_arrive_expect_tx(bar, 2 * kKVBytes + (Traits::kStagedBias ? Traits::kBiasTileBytes : 0));
    if constexpr (Traits::kCluster) {
      static_assert(!Traits::kVarlen, "the varlen kernels run without clusters (plan.h)");
#pragma unroll
      for (int i = 0; i < kColBlocks / 2; ++i) {  // column blocks rank, rank + 2, ... into both CTAs
        const int blk = 2 * i + int(cta_rank);
        const uint32_t offset = blk * kBlockN * kBlockCols * 2;
        sm90::tma_load_4d_multicast(smem.k(buf) + offset, &maps.k, bar, blk * kBlockCols, row0 + n * kBlockN,
                                    head_k, batch, /*cta_mask=*/0b11);
        sm90::tma_load_4d_multicast(smem.v(buf) + offset, &maps.v, bar, blk * kBlockCols, row0 + n * kBlockN,
                                    head_k, batch, /*cta_mask=*/0b11);
      }
    } else if (paged(params)) {
      for_each_page_box(params, n, batch, first_box, [&](int r, int row, int page) {
#pragma unroll
        for (int blk = 0; blk < kColBlocks; ++blk) {
          const uint32_t offset = (blk * kBlockN + r) * kBlockCols * 2;
          sm90::tma_load_4d(smem.k(buf) + offset, &maps.k, bar, blk * kBlockCols, row, head_k, page);
          sm90::tma_load_4d(smem.v(buf) + offset, &maps.v, bar, blk * kBlockCols, row, head_k, page);
        }
      });
    } else {
#pragma unroll
      for (int blk = 0; blk < kColBlocks; ++blk) {
        const uint32_t offset = blk * kBlockN * kBlockCols * 2;
        const int row = row0 + n * kBlockN, b = map_batch(batch);
        sm90::tma_load_4d(smem.k(buf) + offset, &maps.k, bar, blk * kBlockCols, row, head_k, b);
        sm90::tma_load_4d(smem.v(buf) + offset, &maps.v, bar, blk * kBlockCols, row, head_k, b);
      }
    }
    if constexpr (Traits::kStagedBias) {
      sm90::tma_load_3d(smem.bias(buf), &maps.bias, bar, n * kBlockN, bias_head, bias_batch);
    }
  }
};

// The warp-specialized kernel's producer: one thread streams every tile's K/V tiles and Q into the ring, running up
// to kRing stages ahead of the consumers (a stage is refilled once its empty barrier completes).
// With the tile counter (kTileCounter: p.workspace, zeroed, fwd_workspace_ints) the consumers cannot work out the
// next tile themselves, so the producer announces each tile after a CTA's first: its index in the tile slot, then
// bar_q's phase completed (by Q's load, or by an arrival alone for a tile without keys), once every consumer warp is
// done with the previous tile's Q (and so has read the slot); after the last tile, num_tiles.
template <class Traits>
__device__ __forceinline__ void run_producer(const AttentionParams& p, const FwdTmaLoads<Traits>& load,
                                             const FwdTileScheduler<Traits>& scheduler, const BlockInfo& info) {
  constexpr int kRing = Traits::kRing, kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  const FwdSmem<Traits>& smem = load.smem;
  int use = 0, q_loads = 0;  // stage uses and Q loads so far (the barriers' phases)
  auto announce = [&](int t) {
    if (q_loads > 0) sm90::mbarrier_wait(smem.bar_q_empty(), (q_loads - 1) & 1);
    if constexpr (Traits::kTileCounter) *reinterpret_cast<volatile int*>(smem.ptr(smem.tile_slot())) = t;
    ++q_loads;
  };
  for (int t = scheduler.first_tile; t < scheduler.num_tiles; t = scheduler.claim_next(t)) {
    const FwdTileCoord tile = scheduler.coord(t);
    // (varlen: the tile's sequence; one past its end is skipped as the consumers skip it: runs_block)
    const SequenceBounds seq = scheduler.sequence(tile.batch);
    if (!scheduler.in_sequence(tile)) continue;
    const BlockInfo tile_info = scheduler.tile_info(seq, info);
    const KeyBlockRange range = tile_info.key_blocks(tile.m_block * kBlockM, kBlockM, kBlockN);
    // (kVarlen with params.varlen_stage_masks: the blocks to mark, two integers through the loop)
    const MaskedKeyBlocks masked_blocks = tile_info.masked_blocks(tile.m_block * kBlockM, kBlockM, kBlockN);
    if (range.empty()) {  // (the consumers write its zeros)
      if constexpr (Traits::kTileCounter) {
        announce(t);
        sm90::mbarrier_arrive(smem.bar_q());
      }
      continue;
    }
    const int head_k = tile.head / p.h_h_k_ratio, row0 = load.k_row0(seq);
    const int bias_head = p.bias_head_stride == 0 ? 0 : tile.head, bias_batch = p.bias_batch_stride == 0 ? 0 : tile.batch;
    // kSplitKV: V of a tile goes out behind the next tile's K, the order the overlap schedules read them in
    // (Q K^T of tile n beside P V of tile n + 1); the last tile's V after the loop
    auto load_v_of = [&](int n, int v_use) {
      if (v_use >= kRing) sm90::mbarrier_wait(smem.bar_v_empty(v_use % kRing), ((v_use / kRing) - 1) & 1);
      load.k_or_v(p, &load.maps.v, smem.v(v_use % kRing), smem.bar_v(v_use % kRing), n, head_k, tile.batch, row0);
    };
    for (int n = range.hi - 1; n >= range.lo; --n, ++use) {
      // (a paged cache: the tile's first page looked up before the wait, FwdTmaLoads::first_page_box)
      typename FwdTmaLoads<Traits>::PageBox first_box{};
      if constexpr (Traits::kPagedKV) {
        if (load.paged(p)) first_box = load.first_page_box(p, n, tile.batch);
      }
      // the stage's previous tile (use - kRing) must have been read by every consumer warp
      if (use >= kRing) sm90::mbarrier_wait(smem.bar_empty(use % kRing), ((use / kRing) - 1) & 1);
      if constexpr (Traits::kVarlen && Traits::kWs) {
        // whether this key block needs the mask, marked before the stage's barrier is armed (its arrival releases the
        // write); the consumers then load the sequence's bounds only for marked stages (stage_may_need_mask)
        if (p.varlen_stage_masks) {
          // (read, modified and written by this thread alone: the consumers only read it)
          volatile int* const word = reinterpret_cast<volatile int*>(smem.ptr(smem.masked_stages()));
          const int bit = 1 << (use % kRing);
          *word = masked_blocks.contains(n) ? *word | bit : *word & ~bit;
        }
      }
      if constexpr (Traits::kSplitKV) {
        load.k_or_v(p, &load.maps.k, smem.k(use % kRing), smem.bar_kv(use % kRing), n, head_k, tile.batch, row0,
                    &first_box);
        if (n != range.hi - 1) load_v_of(n + 1, use - 1);
      } else {
        load.kv(p, n, use % kRing, head_k, tile.batch, bias_head, bias_batch, row0, &first_box);
      }
      if (n == range.hi - 1) {
        // Q once every consumer warp is done with the previous tile's (its key loop), after this tile's first K/V,
        // which need not wait for that
        announce(t);
        load.q(load.q_row(tile.m_block * kBlockM, seq), tile.head, load.map_batch(tile.batch));
      }
    }
    if constexpr (Traits::kSplitKV) load_v_of(range.lo, use - 1);
  }
  if constexpr (Traits::kTileCounter) {  // (no more tiles)
    announce(scheduler.num_tiles);
    sm90::mbarrier_arrive(smem.bar_q());
  }
  if constexpr (Traits::kCluster) {
    // The peer's consumer warps arrive on this CTA's empty barriers up to the last stage they read: this thread waits
    // for those arrivals (the releases of the last kRing uses, which no load waited for), so that the CTA, whose
    // shared memory they land in, cannot exit before them.
    for (int u = use; u < use + kRing; ++u) {
      if (u >= kRing) sm90::mbarrier_wait(smem.bar_empty(u % kRing), ((u / kRing) - 1) & 1);
    }
  }
}

// cp.async loads of one tile's Q and K/V tiles (every computing thread takes its part; sm80 path, and sm_90a with
// FA2_SM90_TMA=0). Only the first key tile visited (the highest) can run past seqlen_k: later ones skip the row
// predicate (kCheckRows false).
template <class Traits>
struct FwdCpAsyncLoads {
  using T = typename Traits::T;
  static constexpr int kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim, kNThreads = Traits::kNThreads;
  static_assert(!Traits::kTma, "cp.async loads: the sm80 path, or sm_90a with FA2_SM90_TMA=0");
  const AttentionParams& p;
  FwdSmem<Traits> smem;
  const T* k;  // this (batch, kv head)'s first key row
  const T* v;
  int headdim, tid;
  int varlen_seqlen_k = 0;  // kVarlen: the tile's sequence's keys (BlockInfo); dense calls read p.seqlen_k

  __device__ __forceinline__ int seqlen_k() const { return Traits::kVarlen ? varlen_seqlen_k : p.seqlen_k; }

  __device__ __forceinline__ void q(const T* q_rows, int rows_q) const {
    load_tile_async<typename Traits::QTile, Traits::kBlockM, kHeadDim, kNThreads, /*kCheckRows=*/true>(
        smem.q(), q_rows, p.q_row_stride, rows_q, headdim, tid);
  }
  template <bool kCheckRows>
  __device__ __forceinline__ void k_tile(int n, int buf) const {
    load_tile_async<typename Traits::KVTile, kBlockN, kHeadDim, kNThreads, kCheckRows>(
        smem.k(buf), k + int64_t(n) * kBlockN * p.k_row_stride, p.k_row_stride, seqlen_k() - n * kBlockN, headdim,
        tid);
  }
  template <bool kCheckRows>
  __device__ __forceinline__ void v_tile(int n, int buf) const {
    load_tile_async<typename Traits::KVTile, kBlockN, kHeadDim, kNThreads, kCheckRows>(
        smem.v(buf), v + int64_t(n) * kBlockN * p.v_row_stride, p.v_row_stride, seqlen_k() - n * kBlockN, headdim,
        tid);
  }
};

}  // namespace fwd
}  // namespace fa2
