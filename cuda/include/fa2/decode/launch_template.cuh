// Launches one decode instance (dtype, headdim) as its plan says: the kernel for the plan's rows per CTA, then the
// combine kernel when the KV length is split.
#pragma once
#include <cuda_runtime_api.h>

#include "fa2/decode/kernel.cuh"
#include "fa2/decode/plan.h"
#include "fa2/programmatic_launch.cuh"

namespace fa2 {
namespace decode {

template <class Traits>
const char* launch_decode(const DecodePlan& plan, const DecodeParams& params, cudaStream_t stream) {
  const auto kernel = decode_kernel<Traits>;
  constexpr int kSmem = Traits::kSmemBytes;
  if (kSmem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  const dim3 grid(plan.num_splits * plan.row_blocks, params.nheads_k, params.batch);
  kernel<<<grid, kThreads, kSmem, stream>>>(params, plan.num_splits);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return cudaGetErrorString(err);
  if (plan.num_splits > 1) {
    const int64_t rows = int64_t(params.batch) * params.nheads * params.seqlen_q;
    const int64_t blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
    err = launch_kernel(decode_combine_kernel<typename Traits::T>, dim3(unsigned(blocks)), dim3(kThreads), 0, stream,
                        plan.programmatic_combine, params, plan.num_splits);
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  return nullptr;
}

template <typename T, int kHeadDim>
const char* run_decode_instance(const DecodePlan& plan, const DecodeParams& params, cudaStream_t stream) {
  switch (plan.warps_m) {
    case 1:
      return launch_decode<DecodeTraits<T, kHeadDim, 1>>(plan, params, stream);
    case 2:
      return launch_decode<DecodeTraits<T, kHeadDim, 2>>(plan, params, stream);
    case 4:
      return launch_decode<DecodeTraits<T, kHeadDim, 4>>(plan, params, stream);
    default:
      return "fa2 decode: a plan with warps_m other than 1, 2, 4";
  }
}

}  // namespace decode
}  // namespace fa2
