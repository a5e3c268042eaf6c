// Reading one attn_bias element as fp32 for the forward and backward kernels: float/half/bf16 values as they are,
// bool as a mask (True = keep -> 0, False -> -inf). Read-only path (__ldg): the bias is never written.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "fa2/params.h"

namespace fa2 {

template <typename B>
__device__ __forceinline__ float load_bias(const B* p) {
  return static_cast<float>(__ldg(p));
}
template <>
__device__ __forceinline__ float load_bias<__half>(const __half* p) {
  return __half2float(__ldg(p));
}
template <>
__device__ __forceinline__ float load_bias<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(__ldg(p));
}
template <>
__device__ __forceinline__ float load_bias<bool>(const bool* p) {  // True = keep
  return __ldg(reinterpret_cast<const unsigned char*>(p)) ? 0.f : -INFINITY;
}

// The bias of one (batch, head), untyped (element type from p.bias_type); nullptr without a bias.
__host__ __device__ inline const void* bias_of_head(const AttentionParams& p, int64_t batch, int64_t head) {
  if (p.bias_type == BiasType::kNone) return nullptr;
  const int64_t offset = batch * p.bias_batch_stride + head * p.bias_head_stride;
  const int elem_bytes = p.bias_type == BiasType::kFloat32 ? 4 : p.bias_type == BiasType::kBool ? 1 : 2;
  return static_cast<const char*>(p.bias) + offset * elem_bytes;
}

}  // namespace fa2
