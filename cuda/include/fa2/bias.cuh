// Reading one attn_bias element as fp32 for the forward and backward kernels: float/half/bf16 values as they are,
// bool as a mask (True = keep -> 0, False -> -inf). Read-only path (__ldg): the bias is never written.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "fa2/params.h"

namespace fa2 {

// One bias element already in registers (e.g. read from shared memory) as fp32: float/half/bf16 values as they
// are, a bool's byte as a mask (nonzero = keep -> 0, 0 -> -inf).
__device__ __forceinline__ float bias_to_float(float b) { return b; }
__device__ __forceinline__ float bias_to_float(__half b) { return __half2float(b); }
__device__ __forceinline__ float bias_to_float(__nv_bfloat16 b) { return __bfloat162float(b); }
__device__ __forceinline__ float bias_to_float(unsigned char keep) { return keep ? 0.f : -INFINITY; }  // a bool's byte

// One attn_bias element from global memory as fp32 (bias_to_float's meaning).
template <typename B>
__device__ __forceinline__ float load_bias(const B* p) {
  return bias_to_float(__ldg(p));
}
template <>
__device__ __forceinline__ float load_bias<bool>(const bool* p) {  // read as its byte
  return bias_to_float(__ldg(reinterpret_cast<const unsigned char*>(p)));
}

__host__ __device__ inline int bias_element_bytes(BiasType t) {
  return t == BiasType::kFloat32 ? 4 : t == BiasType::kBool ? 1 : 2;
}

// The bias of one (batch, head), untyped (element type from p.bias_type); nullptr without a bias.
__host__ __device__ inline const void* bias_of_head(const AttentionParams& p, int64_t batch, int64_t head) {
  if (p.bias_type == BiasType::kNone) return nullptr;
  const int64_t offset = batch * p.bias_batch_stride + head * p.bias_head_stride;
  return static_cast<const char*>(p.bias) + offset * bias_element_bytes(p.bias_type);
}

// Whether every (batch, head) row of the bias starts 16-byte aligned and runs along keys with unit stride: what the
// sm_90a forward needs to load key tiles of a key-row bias by the TMA (fwd/kernel_traits.cuh, kStagedBias).
inline bool bias_rows_tma_loadable(const AttentionParams& p) {
  const int64_t elem = bias_element_bytes(p.bias_type);
  return p.bias_col_stride == 1 && reinterpret_cast<uintptr_t>(p.bias) % 16 == 0 &&
         (p.batch == 1 || (p.bias_batch_stride * elem) % 16 == 0) &&
         (p.nheads == 1 || (p.bias_head_stride * elem) % 16 == 0);
}

}  // namespace fa2
