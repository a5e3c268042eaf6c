// bwd_kernel's epilogue: dK = scale dS^T Q and dV from each warp's fragments to global memory; keys past seqlen_k and
// dims past headdim are not stored (a key block no query sees stores zeros). GQA: fp32 partials per query head, which
// the caller sums over each group; else T like k.
#pragma once
#include <cstdint>

#include "fa2/params.h"
#include "fa2/ptx.cuh"

namespace fa2 {
namespace bwd {

// acc_dk, acc_dv: (kKVM m16 x kKVN n8 tiles) of this warp's keys kv_n0.. (of the block's rows_k from n0) and dims
// kv_d0..; fragment element (mt, nt, 2 half + e): key kv_n0 + 16 mt + 8 half + group, dim kv_d0 + 8 nt + 2 tig + e.
template <typename T, int kKVM, int kKVN>
__device__ __forceinline__ void store_dk_dv(const AttentionParams& p, const float (&acc_dk)[kKVM][kKVN][4],
                                            const float (&acc_dv)[kKVM][kKVN][4], int batch, int head, int n0,
                                            int rows_k, int headdim, int kv_n0, int kv_d0, int group, int tig) {
  static_assert(kKVM >= 1 && kKVN >= 1, "whole m16 / n8 tiles per warp");
#pragma unroll
  for (int mt = 0; mt < kKVM; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = kv_n0 + mt * 16 + half * 8 + group;
      if (key < rows_k) {
#pragma unroll
        for (int nt = 0; nt < kKVN; ++nt) {
          const int col = kv_d0 + nt * 8 + tig * 2;
          if (col < headdim) {
            const float dk0 = acc_dk[mt][nt][half * 2] * p.scale, dk1 = acc_dk[mt][nt][half * 2 + 1] * p.scale;
            const float dv0 = acc_dv[mt][nt][half * 2], dv1 = acc_dv[mt][nt][half * 2 + 1];
            if (p.h_h_k_ratio > 1) {  // fp32 partials per query head, summed over the group by the caller
              float* dk = static_cast<float*>(p.dk) + batch * p.dk_batch_stride + head * p.dk_head_stride +
                          int64_t(n0 + key) * p.dk_row_stride + col;
              float* dv = static_cast<float*>(p.dv) + batch * p.dv_batch_stride + head * p.dv_head_stride +
                          int64_t(n0 + key) * p.dv_row_stride + col;
              *reinterpret_cast<float2*>(dk) = make_float2(dk0, dk1);
              *reinterpret_cast<float2*>(dv) = make_float2(dv0, dv1);
            } else {
              T* dk = static_cast<T*>(p.dk) + batch * p.dk_batch_stride + head * p.dk_head_stride +
                      int64_t(n0 + key) * p.dk_row_stride + col;
              T* dv = static_cast<T*>(p.dv) + batch * p.dv_batch_stride + head * p.dv_head_stride +
                      int64_t(n0 + key) * p.dv_row_stride + col;
              *reinterpret_cast<uint32_t*>(dk) = ptx::pack2<T>(dk0, dk1);
              *reinterpret_cast<uint32_t*>(dv) = ptx::pack2<T>(dv0, dv1);
            }
          }
        }
      }
    }
  }
}

}  // namespace bwd
}  // namespace fa2
