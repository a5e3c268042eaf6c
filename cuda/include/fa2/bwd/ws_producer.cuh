// The warp-specialized backward's producer: one thread loads K, V once and streams each query block's Q, dO and row
// statistics (lse, D, a key-row bias's shift) by the TMA into the kStages ring (WsStorageView), on its full / empty
// mbarriers. Paged loads go here.
#pragma once
#include <cstdint>

#include "fa2/ptx.cuh"  // wait_for_prior_grids
#include "fa2/sm90/tma.cuh"

namespace fa2 {
namespace bwd {

// A query block's row statistics (lse, D, shift) are loaded by the 1-D TMA from the flat (batch, heads, seqlen_q)
// fp32 buffers, whose boxes must start at a multiple of 4 values (16 bytes; an odd start raised an illegal instruction
// on the H200): each box starts at the block's first row rounded down to a multiple of 4 and holds kBlockM + 4 values;
// the block's rows start ws_stats_offset values into it.
template <int kBlockM>
constexpr int ws_stat_box_elems() { return kBlockM + 4; }
__device__ __forceinline__ int ws_stats_row(int64_t bh, int64_t seqlen_q, int m0) { return int(bh * seqlen_q + m0); }
__device__ __forceinline__ int ws_stats_offset(int row) { return row & 3; }

// The producer thread: K, V of the key block (kBlockN rows from n0, kv head head_k) once, then for each of the CTA's
// query heads head .. head + heads - 1 (bh: the first's batch * nheads + head) and its query blocks m_lo .. m_hi
// their Q, dO and row statistics (lse, D, and with kShift the row shift: bwd_row_stats_kernel's) into stage
// it % kStages (it counting over heads and blocks), each once every consumer warp has released the stage's previous
// block (it - kStages). lse / D / shift come from the flat (batch, heads, seqlen_q) views in ws_stat_box_elems boxes,
// which start up to 3 values before the block (never read; rows past seqlen_q read the next head's, past the buffers'
// end zeros). q_row0, k_row0: the first query / key row in the maps (varlen: the sequence's in the packed tensors, a
// batch of one, whose (nheads, total_q) statistics the caller passes as seqlen_q = total_q, bh = head; its rows past
// the sequence's end read the next sequence's, which the consumers mask; dense calls: 0).
template <int kBlockM, int kBlockN, int kHeadDim, int kBlockCols, bool kShift, class Smem>
__device__ __forceinline__ void ws_produce(const sm90::BwdTensorMaps& maps, const Smem& smem, int64_t seqlen_q,
                                           int m_lo, int m_hi, int n0, int head, int heads, int head_k, int batch,
                                           int64_t bh, int q_row0, int k_row0) {
  constexpr int kKVBytes = kBlockN * kHeadDim * 2, kQBytes = kBlockM * kHeadDim * 2;
  constexpr int kBoxElems = ws_stat_box_elems<kBlockM>();
  constexpr int kStatsBytes = (kShift ? 3 : 2) * kBoxElems * 4;
  constexpr int kStages = Smem::kNumStages;
  static_assert(kBoxElems * 4 % 16 == 0 && kBoxElems <= 256, "a block's lse / D is one 1-D TMA box");
  // -- K, V: (kBlockN, d) each, once
  sm90::mbarrier_arrive_expect_tx(smem.kv_loaded(), 2 * kKVBytes);
  sm90::tma_load_tile<kBlockN, kHeadDim, kBlockCols>(smem.k(), &maps.k, smem.kv_loaded(), k_row0 + n0, head_k, batch);
  sm90::tma_load_tile<kBlockN, kHeadDim, kBlockCols>(smem.v(), &maps.v, smem.kv_loaded(), k_row0 + n0, head_k, batch);
  // (D, in each stage, comes from the preprocess: a programmatic dependent launch waits for it here, K / V on their way;
  // they were written before the preprocess, a plain launch, began)
  ptx::wait_for_prior_grids();
  // -- per query block: Q, dO (kBlockM, d) and the rows' statistics into stage it % kStages, once it is free
  int it = 0;
  for (int g = 0; g < heads; ++g) {
    for (int m = m_lo; m <= m_hi; ++m, ++it) {
      const int s = it % kStages, m0 = q_row0 + m * kBlockM;
      if (it >= kStages) sm90::mbarrier_wait(smem.empty(s), ((it / kStages) - 1) & 1);
      sm90::mbarrier_arrive_expect_tx(smem.full(s), 2 * kQBytes + kStatsBytes);
      sm90::tma_load_tile<kBlockM, kHeadDim, kBlockCols>(smem.q(s), &maps.q, smem.full(s), m0, head + g, batch);
      sm90::tma_load_tile<kBlockM, kHeadDim, kBlockCols>(smem.dout(s), &maps.dout, smem.full(s), m0, head + g,
                                                         batch);
      // (the launcher checks that batch * nheads * seqlen_q fits an int)
      const int at = ws_stats_row(bh + g, seqlen_q, m0) & ~3;
      sm90::tma_load_1d(smem.lse(s), &maps.lse, smem.full(s), at);
      sm90::tma_load_1d(smem.dsum(s), &maps.dsum, smem.full(s), at);
      if constexpr (kShift) sm90::tma_load_1d(smem.shift(s), &maps.shift, smem.full(s), at);
    }
  }
}

}  // namespace bwd
}  // namespace fa2
