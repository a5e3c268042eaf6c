// The warp-specialized backward kernels' dK / dV stores from the fragments (GQA's fp32 partials or accumulators, or
// T like k), and a CTA's end where the dQ conversion overlaps the kernel (its finished key block counted).
#pragma once
#include <cstdint>

#include "fa2/bwd_ptx.cuh"  // red_add_f32x2, red_add_release_gpu
#include "fa2/params.h"
#include "fa2/ptx.cuh"
#include "fa2/sm90/tma.cuh"

namespace fa2 {
namespace bwd {

// A consumer CTA's last step where the dQ conversion overlaps the kernel (p.key_blocks_done, bwd_launch_template.cuh):
// once every consumer's global writes are performed (dK, dV; the dQ reduce-adds, which their issuers waited for in
// full, bulk_wait_group<0, false>, or red.global's), the count of finished key blocks of each of its (batch, query
// head)s (bh .. bh + heads - 1) goes up by one, with release semantics: a conversion CTA that acquires a head's count
// at key_blocks_per_head reads the head's whole dQ. Every CTA counts, those without query blocks too. kBarrier: a
// named barrier of the consumers only. (Compiled only where the tile config overlaps the conversion,
// Cfg::kOverlapDqConversion.)
template <class Cfg, int kBarrier>
__device__ __forceinline__ void ws_key_block_done(const AttentionParams& p, int64_t bh, int heads, int ctid) {
  if constexpr (!Cfg::kOverlapDqConversion) return;
  if (p.key_blocks_done == nullptr) return;
  sm90::fence_proxy_async_global();  // (the TMA's reduce-adds before the generic release)
  ptx::named_barrier_sync<kBarrier, Cfg::kConsumerThreads>();
  for (int h = ctid; h < heads; h += Cfg::kConsumerThreads) ptx::red_add_release_gpu(p.key_blocks_done + bh + h, 1);
}

// One thread's dK = scale dS^T Q and dV fragments (keys key_first + 8 half, columns col_first + 8 nt + 2 tig + e) to
// global memory; keys past seqlen_k and dims past headdim are not stored. GQA without the group summed in the CTA
// (p.gqa_dkv): fp32, stored as the partials of query head `head` (kPartials: summed over the group by the caller) or
// added into kv head `head`'s accumulators (kAccumulate, bwd_ws_dsplit_kernel.cuh: red.global.add, as the group's
// other heads' CTAs do; bwd_ws_kernel.cuh adds them by the TMA); else T at kv head `head`, each quad's fragments
// transposed (ptx::quad_transpose) into whole n8 tiles per lane, stored 16 bytes at a time (every lane of the warp
// calls this). kVarlen: batch 0 and keys as rows of the packed tensors, key_end (else unused) the sequence's end there.
template <typename T, int kDTiles, bool kVarlen = false>
__device__ __forceinline__ void ws_store_dk_dv(const AttentionParams& p, const float (&dk_frag)[kDTiles][4],
                                               const float (&dv_frag)[kDTiles][4], int batch, int head, int key_first,
                                               int col_first, int tig, int key_end = 0) {
  static_assert(kDTiles >= 1, "whole n8 tiles");
  const bool fp32_dkv = p.h_h_k_ratio > 1 && p.gqa_dkv != GqaDkv::kInKernel;
  if (kDTiles % 4 == 0 && !fp32_dkv) {
    T* dk_bh = static_cast<T*>(p.dk) + batch * p.dk_batch_stride + head * p.dk_head_stride;
    T* dv_bh = static_cast<T*>(p.dv) + batch * p.dv_batch_stride + head * p.dv_head_stride;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = key_first + 8 * half;
#pragma unroll
      for (int g = 0; g < kDTiles / 4; ++g) {
        uint32_t xk[4], xv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float* k_el = dk_frag[4 * g + i] + half * 2;
          const float* v_el = dv_frag[4 * g + i] + half * 2;
          xk[i] = ptx::pack2<T>(k_el[0] * p.scale, k_el[1] * p.scale);
          xv[i] = ptx::pack2<T>(v_el[0], v_el[1]);
        }
        ptx::quad_transpose(xk, tig);  // this lane: n8 tile 4 g + tig
        ptx::quad_transpose(xv, tig);
        const int col = col_first + 8 * (4 * g + tig);
        if (key < (kVarlen ? key_end : p.seqlen_k) && col < p.headdim) {
          *reinterpret_cast<uint4*>(dk_bh + int64_t(key) * p.dk_row_stride + col) =
              make_uint4(xk[0], xk[1], xk[2], xk[3]);
          *reinterpret_cast<uint4*>(dv_bh + int64_t(key) * p.dv_row_stride + col) =
              make_uint4(xv[0], xv[1], xv[2], xv[3]);
        }
      }
    }
    return;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = key_first + 8 * half;
    if (key >= (kVarlen ? key_end : p.seqlen_k)) continue;
#pragma unroll
    for (int nt = 0; nt < kDTiles; ++nt) {
      const int col = col_first + 8 * nt + 2 * tig;
      if (col >= p.headdim) continue;
      const float dk0 = dk_frag[nt][half * 2] * p.scale, dk1 = dk_frag[nt][half * 2 + 1] * p.scale;
      const float dv0 = dv_frag[nt][half * 2], dv1 = dv_frag[nt][half * 2 + 1];
      if (fp32_dkv) {
        float* dk = static_cast<float*>(p.dk) + batch * p.dk_batch_stride + head * p.dk_head_stride +
                    int64_t(key) * p.dk_row_stride + col;
        float* dv = static_cast<float*>(p.dv) + batch * p.dv_batch_stride + head * p.dv_head_stride +
                    int64_t(key) * p.dv_row_stride + col;
        if (p.gqa_dkv == GqaDkv::kAccumulate) {
          ptx::red_add_f32x2(dk, dk0, dk1);
          ptx::red_add_f32x2(dv, dv0, dv1);
        } else {
          *reinterpret_cast<float2*>(dk) = make_float2(dk0, dk1);
          *reinterpret_cast<float2*>(dv) = make_float2(dv0, dv1);
        }
      } else {
        T* dk = static_cast<T*>(p.dk) + batch * p.dk_batch_stride + head * p.dk_head_stride +
                int64_t(key) * p.dk_row_stride + col;
        T* dv = static_cast<T*>(p.dv) + batch * p.dv_batch_stride + head * p.dv_head_stride +
                int64_t(key) * p.dv_row_stride + col;
        *reinterpret_cast<uint32_t*>(dk) = ptx::pack2<T>(dk0, dk1);
        *reinterpret_cast<uint32_t*>(dv) = ptx::pack2<T>(dv0, dv1);
      }
    }
  }
}

}  // namespace bwd
}  // namespace fa2
