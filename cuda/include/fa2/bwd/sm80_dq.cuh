// bwd_kernel's dQ out of the registers: a warp's (partial over the key block) dQ fragments added into the fp32
// dq_accum with red.global.add (the deterministic mode orders the CTAs' turns around this: bwd_kernel.cuh).
#pragma once
#include <cstdint>

#include "fa2/bwd/block_range.cuh"
#include "fa2/bwd_ptx.cuh"  // red_add_f32x2, ld_acquire_gpu
#include "fa2/params.h"

namespace fa2 {
namespace bwd {

// acc_dq: this warp's (kQM m16, kQN n8) tiles of a query block's dQ, rows dq_m0.. of the block at m0 (of the
// (batch, head) at dq_accum), columns d0..; fragment element (mt, nt, 2 half + e): row dq_m0 + 16 mt + 8 half + group,
// column d0 + 8 nt + 2 tig + e. Rows past seqlen_q (p's, or with kVarlen the sequence's varlen_seqlen_q) and columns
// past headdim are not added.
template <int kHeadDim, int kBlockM, bool kVarlen, int kQM, int kQN>
__device__ __forceinline__ void reduce_dq(const AttentionParams& p, int varlen_seqlen_q,
                                          const float (&acc_dq)[kQM][kQN][4],
                                          float* dq_accum, int m0, int dq_m0, int d0, int group, int tig,
                                          int headdim) {
  static_assert(kBlockM % 16 == 0 && kHeadDim % 8 == 0, "whole m16 rows, n8 columns");
  float* dq_row0 = dq_accum + int64_t(m0 + dq_m0 + group) * kHeadDim + d0 + tig * 2;
  // the common case: no predicates
  if (m0 + kBlockM <= (kVarlen ? varlen_seqlen_q : p.seqlen_q) && headdim == kHeadDim) {
#pragma unroll
    for (int mt = 0; mt < kQM; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int nt = 0; nt < kQN; ++nt)
          ptx::red_add_f32x2(dq_row0 + (mt * 16 + half * 8) * kHeadDim + nt * 8, acc_dq[mt][nt][half * 2],
                             acc_dq[mt][nt][half * 2 + 1]);
  } else {
#pragma unroll
    for (int mt = 0; mt < kQM; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if (m0 + dq_m0 + mt * 16 + half * 8 + group < (kVarlen ? varlen_seqlen_q : p.seqlen_q)) {
#pragma unroll
          for (int nt = 0; nt < kQN; ++nt) {
            if (d0 + nt * 8 + tig * 2 < headdim) {
              ptx::red_add_f32x2(dq_row0 + (mt * 16 + half * 8) * kHeadDim + nt * 8, acc_dq[mt][nt][half * 2],
                                 acc_dq[mt][nt][half * 2 + 1]);
            }
          }
        }
      }
  }
}


// The deterministic mode's turns (bwd_kernel.cuh): query block m's dQ reductions happen in increasing key-block order;
// this CTA's turn at m is the number of key blocks below it that touch m, which thread 0 waits for (the caller
// passes the turn on after its reduction).
struct DqTurns {
  // (references to the kernel's values, as a lambda's captures)
  const QueryBlockRange& range;
  int* const& turns;
  const int &n_block, &num_n_blocks, &tid;
  __device__ __forceinline__ int operator()(int m) const {
    const int turn = n_block - range.first_key_block(m, num_n_blocks);
    if (tid == 0) {
      while (ptx::ld_acquire_gpu(turns + m) != turn) {
      }
    }
    return turn;
  }
};

}  // namespace bwd
}  // namespace fa2
