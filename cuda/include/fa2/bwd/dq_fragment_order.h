// The d 256 ws backward's order of dq_accum within whole query blocks (written by bwd_ws_dsplit_kernel.cuh,
// read back by bwd_convert_dq_kernel).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FA2_DQ_ORDER_FN __host__ __device__ static constexpr
#else
#define FA2_DQ_ORDER_FN static constexpr  // (the host library's plain C++: bwd_dispatch.cpp)
#endif

namespace fa2 {
namespace bwd {

// dq_accum's fragment order (the d 256 ws backward's, bwd_ws_dsplit_kernel.cuh: FA-3's layout there): within each
// whole block of kRows queries (kCols fp32 columns, the block's kRows x kCols floats where row-major has them),
// warpgroup w's dQ pass `pass` (columns 128 w + 64 pass ..), n8 tile nt, is 512 floats, thread t's (of 128) four at
// 4 t: fragment element (nt, 2 half + e) of warp t / 32, lane 4 group + tig, which holds query 16 warp + group +
// 8 half, column 128 w + 64 pass + 8 nt + 2 tig + e. One warp's red.v4 covers 512 contiguous bytes.
struct DqFragmentOrder {
  static constexpr int kRows = 64, kCols = 256;
  // where thread `thread` (of 128) of warpgroup w puts its four floats of pass `pass`, n8 tile nt
  FA2_DQ_ORDER_FN int fragment_offset(int w, int pass, int nt, int thread) {
    return ((w * 2 + pass) * 8 + nt) * 512 + thread * 4;
  }
  FA2_DQ_ORDER_FN int offset(int row, int col) {
    const int w = col / 128, pass = (col / 64) % 2, nt = (col / 8) % 8, tig = (col / 2) % 4, e = col % 2;
    const int warp = row / 16, group = row % 8, half = (row / 8) % 2;
    return fragment_offset(w, pass, nt, warp * 32 + group * 4 + tig) + 2 * half + e;
  }
  // A varlen call's dq_accum in whole blocks (params.h, varlen_dq_head_rows): sequence `sequence`, whose first query
  // is packed row q_row0, has its query block j at rows block_row0 + kRows j of its head. Sequence b + 1 starts at or
  // after the end of b's last block (floor((q0 + len) / kRows) + 1 >= floor(q0 / kRows) + ceil(len / kRows)).
  FA2_DQ_ORDER_FN int64_t varlen_block_row0(int q_row0, int sequence) {
    return (int64_t(q_row0 / kRows) + sequence) * kRows;
  }
  // The rows per head that every sequence's blocks fit in (the last one ends by kRows (ceil(total_q / kRows) +
  // sequences - 1)).
  FA2_DQ_ORDER_FN int64_t varlen_rows(int64_t total_q, int64_t sequences) {
    return ((total_q + kRows - 1) / kRows + sequences) * kRows;
  }
};
// (compile-time check: every (row, column) of a block at its own place in the block)
constexpr bool dq_fragment_order_is_a_permutation() {
  bool seen[DqFragmentOrder::kRows * DqFragmentOrder::kCols] = {};
  for (int r = 0; r < DqFragmentOrder::kRows; ++r) {
    for (int c = 0; c < DqFragmentOrder::kCols; ++c) {
      const int o = DqFragmentOrder::offset(r, c);
      if (o < 0 || o >= DqFragmentOrder::kRows * DqFragmentOrder::kCols || seen[o]) return false;
      seen[o] = true;
    }
  }
  return true;
}
static_assert(dq_fragment_order_is_a_permutation(), "DqFragmentOrder::offset is a permutation of a block");

// (compile-time check of the varlen blocks: for every run of `sequences` lengths drawn from a cycle of awkward ones,
// each sequence's blocks start after the previous one's end and the last ends within varlen_rows)
constexpr bool varlen_blocks_are_disjoint_and_fit(int sequences, int start) {
  constexpr int kLengths[] = {0, 1, 63, 64, 65, 127, 128, 129, 300, 2, 700, 191};
  constexpr int kCount = sizeof(kLengths) / sizeof(kLengths[0]);
  int64_t q_row0 = 0, previous_end = 0;
  for (int b = 0; b < sequences; ++b) {
    const int length = kLengths[(start + b) % kCount];
    const int64_t first = DqFragmentOrder::varlen_block_row0(int(q_row0), b);
    if (first % DqFragmentOrder::kRows != 0 || first < previous_end) return false;
    previous_end = first + (length + DqFragmentOrder::kRows - 1) / DqFragmentOrder::kRows * DqFragmentOrder::kRows;
    q_row0 += length;
  }
  return previous_end <= DqFragmentOrder::varlen_rows(q_row0, sequences);
}
constexpr bool varlen_blocks_check() {
  for (int sequences = 1; sequences <= 30; ++sequences) {
    for (int start = 0; start < 12; ++start) {
      if (!varlen_blocks_are_disjoint_and_fit(sequences, start)) return false;
    }
  }
  return true;
}
static_assert(varlen_blocks_check(), "DqFragmentOrder::varlen_block_row0: disjoint blocks within varlen_rows");

}  // namespace bwd
}  // namespace fa2
