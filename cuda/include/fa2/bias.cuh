// Reading one attn_bias element as fp32 for the forward and backward kernels: float/half/bf16 values as they are,
// bool as a mask (True = keep -> 0, False -> -inf). Read-only path (__ldg): the bias is never written.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

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

}  // namespace fa2
