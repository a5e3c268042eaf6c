// Host side of one forward instance (dtype, headdim, arch): picks the kernel variant, sizes the grid, launches.
// Included only by the generated instance files (build/.../generated/fwd_*.cu).
#pragma once
#include <cuda_runtime_api.h>

#include <type_traits>

#include "fa2/fwd_kernel.cuh"
#include "fa2/launch.h"  // sm90_warp_specialized
#include "fa2/params.h"
#include "fa2/tile_config.h"

namespace fa2 {

using FwdKernel = void (*)(const AttentionParams, const sm90::FwdTensorMaps);

// The kernel of one score path for the bias element type (nullptr for a combination that does not exist).
template <typename T, int kHeadDim, int kArch, fwd::ScoreMode kMode>
FwdKernel fwd_kernel_for_bias(BiasType bias_type) {
  switch (bias_type) {
    case BiasType::kNone:
      if constexpr (kMode == fwd::ScoreMode::kPlain || kMode == fwd::ScoreMode::kGeneral) {
        return &fwd::fwd_kernel<T, kHeadDim, kArch, kMode, BiasType::kNone>;
      }
      return nullptr;
    case BiasType::kSameAsInput:
    case BiasType::kFloat32:
    case BiasType::kBool:
      if constexpr (kMode != fwd::ScoreMode::kPlain) {
        if (bias_type == BiasType::kSameAsInput) return &fwd::fwd_kernel<T, kHeadDim, kArch, kMode, BiasType::kSameAsInput>;
        if (bias_type == BiasType::kFloat32) return &fwd::fwd_kernel<T, kHeadDim, kArch, kMode, BiasType::kFloat32>;
        return &fwd::fwd_kernel<T, kHeadDim, kArch, kMode, BiasType::kBool>;
      }
      return nullptr;
  }
  return nullptr;
}

template <typename T, int kHeadDim, int kArch>
const char* run_fwd_instance(const AttentionParams& p, cudaStream_t stream) {
  using Cfg = FwdTileConfig<kHeadDim, /*kWgmma=*/kArch == 901>;  // the kernel's own choice (fwd_kernel.cuh)
  // Score path (fwd_kernel.cuh, ScoreMode): plain / bias folded into the S accumulator (a key-row bias or one that
  // varies along queries) / general (softcap, scale <= 0), times the bias element type. Eleven variants per instance.
  using fwd::ScoreMode;
  FwdKernel kernel = nullptr;
  int threads = Cfg::kNThreads, smem = Cfg::kSmemBytes;
  // sm_90a: the warp-specialized pipeline (fwd_kernel.cuh), so far for the plain path only and when switched on
  // (set_sm90_warp_specialized / FA2_SM90_WARP_SPECIALIZED=1) while it is being measured against the default.
  constexpr bool kCanWs = kArch == 901 && FA2_SM90_TMA;
  const bool general = p.softcap > 0.f || !(p.scale > 0.f);  // ScoreMode::kGeneral
  const bool plain = !general && p.bias_type == BiasType::kNone;
  if (kCanWs && plain && sm90_warp_specialized()) {
    if constexpr (kCanWs) {
      constexpr ScoreMode kPlain = ScoreMode::kPlain;
      // schedules (fwd_kernel.cuh): ping-pong, or the intra-warpgroup overlap, or neither; ping-pong wins when both
      // are switched on (they do not combine yet)
      if (sm90_pingpong()) {
        kernel = &fwd::fwd_kernel<T, kHeadDim, kArch, kPlain, BiasType::kNone, true, /*kPingpong=*/true>;
      } else if (sm90_overlap()) {
        kernel = &fwd::fwd_kernel<T, kHeadDim, kArch, kPlain, BiasType::kNone, true, false, /*kOverlap=*/true>;
      } else {
        kernel = &fwd::fwd_kernel<T, kHeadDim, kArch, kPlain, BiasType::kNone, true, false, false>;
      }
      threads = fwd::fwd_kernel_threads<kHeadDim, kArch, true>();
      smem = Cfg::kSmemBytesWs;  // its deeper K/V ring
    }
  } else if (general) {
    kernel = fwd_kernel_for_bias<T, kHeadDim, kArch, ScoreMode::kGeneral>(p.bias_type);
  } else if (plain) {
    kernel = fwd_kernel_for_bias<T, kHeadDim, kArch, ScoreMode::kPlain>(p.bias_type);
  } else if (p.bias_row_stride == 0) {  // one bias value per key (padding masks)
    kernel = fwd_kernel_for_bias<T, kHeadDim, kArch, ScoreMode::kKeyBiasFold>(p.bias_type);
  } else {
    kernel = fwd_kernel_for_bias<T, kHeadDim, kArch, ScoreMode::kBiasFold>(p.bias_type);
  }
  if (kernel == nullptr) return "fa2: unknown bias type";
  const int num_m_blocks = (p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  if (p.nheads > 65535 || p.batch > 65535) return "fa2: the CUDA forward supports at most 65535 heads and batch 65535";
  const dim3 grid(num_m_blocks, p.nheads, p.batch);
  cudaError_t err = cudaSuccess;
  if (smem > 48 * 1024) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  sm90::FwdTensorMaps maps{};  // the TMA's view of q, k, v (sm_90a instances that load with it)
  if constexpr (kArch == 901 && FA2_SM90_TMA) {
    const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
    const char* e = sm90::make_bshd_tensor_map(&maps.q, p.q, bf16, p.batch, p.seqlen_q, p.nheads, p.headdim,
                                               p.q_batch_stride, p.q_row_stride, p.q_head_stride, Cfg::kBlockM,
                                               Cfg::kSmemBlockCols);
    if (e == nullptr) {
      e = sm90::make_bshd_tensor_map(&maps.k, p.k, bf16, p.batch, p.seqlen_k, p.nheads_k, p.headdim, p.k_batch_stride,
                                     p.k_row_stride, p.k_head_stride, Cfg::kBlockN, Cfg::kSmemBlockCols);
    }
    if (e == nullptr) {
      e = sm90::make_bshd_tensor_map(&maps.v, p.v, bf16, p.batch, p.seqlen_k, p.nheads_k, p.headdim, p.v_batch_stride,
                                     p.v_row_stride, p.v_head_stride, Cfg::kBlockN, Cfg::kSmemBlockCols);
    }
    if (e != nullptr) return e;
  }
  kernel<<<grid, threads, smem, stream>>>(p, maps);
  err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace fa2
