// The warp-specialized backward's dQ out of the registers: staged in shared memory for the TMA's reduce-add
// (bwd_ws_kernel; the same staging serves its fp32 dK / dV sums), or added into dq_accum with red.global
// (bwd_ws_dsplit_kernel's partial last query block).
#pragma once
#include <cstdint>

#include "fa2/bwd_ptx.cuh"  // red_add_f32x2
#include "fa2/params.h"

namespace fa2 {
namespace bwd {

// One warp's dQ fragments (rows row_first + 8 half, columns 8 nt + 2 tig + e) into the TMA reduce-add's staging:
// 32-column boxes (n8 tiles 4 box .. 4 box + 3) of 64 rows from box0, rows of 128 bytes with the 128-byte swizzle
// (row r's 16-byte chunk c at c ^ r % 8).
// Bank conflicts: a 64-bit store is served per half-warp (4 rows r % 8 = 4 h .. 4 h + 3, all four tig). Were every lane
// to store tile nt, tig 0-1 (chunk 2 (nt % 4)) and tig 2-3 (chunk 2 (nt % 4) + 1) would land, after the swizzle, in
// the same four chunks: two wavefronts per half-warp (ncu: 4 per instruction, 2 ideal; a large share of the d 128 backward's
// issue stalls were MIO throttle on these stores). So tig 2-3 store tile nt ^ 2 where tig 0-1 store nt: the two
// halves of the half-warp fill different aligned groups of four chunks (the swizzle's r % 4 part stays inside one),
// 128 bytes over 32 banks, one wavefront. (Two selects per store: the tile is a per-lane choice.)
// Addresses: lane nt's 16-byte chunk c = 2 (lane_nt % 4) + tig / 2 lands at chunk c ^ r % 8 of row r, and r % 8 is
// row_first % 8 in both halves, so the byte offset in the row is lane_bits ^ ((nt % 4) << 5): bits 5-6
// (swapped ? 2 : 0) ^ (r % 8) / 2 XOR nt % 4, bit 4 (tig / 2) ^ (r % 2), bit 3 tig % 2. A thread's stores are one base
// XOR a constant, plus the box's and the half's offsets (box0 is 128-byte aligned, as the swizzle's boxes are: the OR
// relies on it). (Written out per store, the addresses took ~35 instructions a call, recomputed in every step of the
// backward's loop; this form ~20: sm_90a SASS, d 128.)
template <int kNTiles>
__device__ __forceinline__ void ws_stage_dq(const float (&dq_frag)[kNTiles][4], uint32_t box0, int row_first, int tig) {
  static_assert(kNTiles % 4 == 0, "the dQ staging pairs n8 tiles nt and nt ^ 2 of one 32-column box");
  constexpr int kBoxBytes = 64 * 128;
  const bool swapped = tig >= 2;
  const int r8 = row_first % 8;
  const uint32_t lane_bits = (((swapped ? 2 : 0) ^ (r8 >> 1)) << 5) | ((((tig >> 1) ^ r8) & 1) << 4) | ((tig & 1) << 3);
  const uint32_t row_base = (box0 + row_first * 128) | lane_bits;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const uint32_t addr = (row_base ^ ((nt % 4) << 5)) + (nt / 4) * kBoxBytes + half * 8 * 128;
      const float x = swapped ? dq_frag[nt ^ 2][half * 2] : dq_frag[nt][half * 2];
      const float y = swapped ? dq_frag[nt ^ 2][half * 2 + 1] : dq_frag[nt][half * 2 + 1];
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
    }
  }
}

// A warp's dQ fragments of 16 queries added into dq_accum row-major (kHeadDim fp32 columns) with
// red.global.add.v2.f32 from the registers: element (nt, 2 half + e) at row row_base + q0 + 8 half, column col0 +
// 8 nt + e (col0 with the lane's 2 tig). Queries from seqlen_q on are not added (their dS^T is 0, and their rows are
// another head's or, varlen, another sequence's). (varlen: rows of the (nheads, total_q) layout)
template <int kHeadDim, int kNTiles>
__device__ __forceinline__ void ws_red_dq_rows(const AttentionParams& p, const float (&dq_frag)[kNTiles][4],
                                               int64_t row_base, int q0, int seqlen_q, int col0) {
  float* const row0 = p.dq_accum + (row_base + q0) * int64_t(kHeadDim) + col0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (q0 + 8 * half >= seqlen_q) continue;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      ptx::red_add_f32x2(row0 + 8 * half * int64_t(kHeadDim) + 8 * nt, dq_frag[nt][2 * half],
                         dq_frag[nt][2 * half + 1]);
    }
  }
}

// ws_red_dq_rows at query q0 of (batch, head) bh (rows bh seqlen_q + query). (A partial last query block's; whole
// blocks go in the fragment order.)
template <int kHeadDim, int kNTiles>
__device__ __forceinline__ void ws_red_dq(const AttentionParams& p, const float (&dq_frag)[kNTiles][4], int64_t bh,
                                          int q0, int col0) {
  ws_red_dq_rows<kHeadDim>(p, dq_frag, bh * p.seqlen_q, q0, p.seqlen_q, col0);
}

}  // namespace bwd
}  // namespace fa2
