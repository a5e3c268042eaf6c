// bwd_ws_dsplit_kernel's dQ: dQ[:, col0:col0 + kDCols] = dS K[:, col0:] of a warpgroup in two passes of kDCols / 2
// columns (all kDCols beside dK, dV and the A fragment made ptxas serialize the wgmmas), each pass's fragments added
// into dq_accum from the registers: in dq_accum's fragment order (DqFragmentOrder) where the query block is whole
// (the launcher tells the conversion) or a varlen call's blocks are (params.h, varlen_dq_head_rows), else row-major
// (ws_red_dq). Fragment element (nt, 2 half + e): query 16 warp +
// group + 8 half, column 8 nt + 2 tig + e of the pass.
#pragma once
#include <cstdint>

#include "fa2/block_info.cuh"  // SequenceBounds
#include "fa2/bwd/dq_fragment_order.h"
#include "fa2/bwd/shared_storage.cuh"
#include "fa2/bwd/ws_dq.cuh"  // ws_red_dq
#include "fa2/bwd_ptx.cuh"    // red_add_f32x4
#include "fa2/params.h"
#include "fa2/ptx.cuh"
#include "fa2/sm90/wgmma.cuh"

namespace fa2 {
namespace bwd {

// kVarlen: bh_of is the head. With p.varlen_dq_head_rows every block (a sequence's last, partial one too: its rows
// past the sequence are padding no one reads) goes in the fragment order at the sequence's own block rows
// (dq_block_row0, DqFragmentOrder::varlen_block_row0); without, row-major at the head's (nheads, total_q) rows from the
// sequence's first query, only the sequence's queries.
template <typename T, typename Cfg, bool kVarlen = false>
struct WsDsplitDq {
  static constexpr int kHeadDim = Cfg::kHeadDim, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  static constexpr int kDCols = Cfg::kDCols, kDqPassCols = kDCols / 2, kDqPassTiles = kDqPassCols / 8;
  using KTile = SwizzledTile<kBlockN, kHeadDim, Cfg::kBlockCols>;  // K: (keys, d)
  using PTile = SwizzledTile<kBlockN, kBlockM, 64>;                // dS^T: (keys, queries)
  using Acc = float[kDqPassCols / 2];  // one pass: (this warp's 16 queries, kDqPassCols columns)
  static_assert(kBlockM == DqFragmentOrder::kRows && kHeadDim == DqFragmentOrder::kCols && kDqPassTiles == 8,
                "the fragment order is of this kernel's tiles: 64 queries, two warpgroups' two passes of 8 n8 tiles");
  // (references to the kernel's values, as a lambda's captures)
  const WsDsplitSmem<Cfg>& shared;
  const uint32_t& sK;
  const int &wg, &ctid, &warp_in_wg, &group, &tig, &col0;
  const SequenceBounds& seq;  // (varlen only)
  const int64_t dq_block_row0;  // (varlen with p.varlen_dq_head_rows only)

  // This thread's fragments of pass `pass` of the query block at m0_of of (batch, head) bh_of into dq_accum.
  __device__ __forceinline__ void red(const AttentionParams& p, const Acc& acc, int64_t bh_of, int m0_of,
                                      int pass) const {
    if constexpr (kVarlen) {
      if (p.varlen_dq_head_rows != 0) {
        add_block(p.dq_accum + (bh_of * p.varlen_dq_head_rows + dq_block_row0 + m0_of) * int64_t(kHeadDim), acc, pass);
        return;
      }
      const int q0 = m0_of + warp_in_wg * 16 + group;
      ws_red_dq_rows<kHeadDim>(p, reinterpret_cast<const float(&)[kDqPassTiles][4]>(acc),
                               bh_of * p.total_q + seq.q_row0, q0, seq.seqlen_q, col0 + pass * kDqPassCols + 2 * tig);
      return;
    }
    if (m0_of + kBlockM <= p.seqlen_q) {
      add_block(p.dq_accum + (bh_of * p.seqlen_q + m0_of) * int64_t(kHeadDim), acc, pass);
    } else {
      ws_red_dq<kHeadDim>(p, reinterpret_cast<const float(&)[kDqPassTiles][4]>(acc), bh_of,
                          m0_of + warp_in_wg * 16 + group, col0 + pass * kDqPassCols + 2 * tig);
    }
  }
  // This thread's fragments of pass `pass` into the block of kBlockM queries at `block`, in the fragment order.
  __device__ __forceinline__ void add_block(float* block, const Acc& acc, int pass) const {
    // (n8 tile 0's place, then each tile's distance from it: one base register for the eight)
    float* const base = block + DqFragmentOrder::fragment_offset(wg, pass, 0, ctid & 127);
#pragma unroll
    for (int nt = 0; nt < kDqPassTiles; ++nt) {
      ptx::red_add_f32x4(base + DqFragmentOrder::fragment_offset(0, 0, nt, 0),
                         make_float4(acc[4 * nt], acc[4 * nt + 1], acc[4 * nt + 2], acc[4 * nt + 3]));
    }
  }
  // The product of pass `pass` (issued): dS^T (keys, queries) of buffer `ds_buffer` as the MN-major A (queries = M).
  __device__ __forceinline__ void issue(Acc& acc_dq, int ds_buffer, int pass) const {
    sm90::gemm_ss<T, kDqPassCols, kBlockN / 16, /*kAMnMajor=*/true, /*kBMnMajor=*/true, PTile, KTile,
                  /*kWait=*/false, /*kOverwrite=*/true>(acc_dq, shared.ds(ds_buffer), 0, sK, col0 + pass * kDqPassCols);
  }
};

}  // namespace bwd
}  // namespace fa2
