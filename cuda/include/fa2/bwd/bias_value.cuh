// Reading one element of an attention bias in the backward (its dtype named at compile time or by p.bias_type).
#pragma once
#include <type_traits>
#include "fa2/bias.cuh"  // load_bias
#include "fa2/params.h"

namespace fa2 {
namespace bwd {

struct NoBias {};

template <typename B>
__device__ __forceinline__ float bias_at(const B* bias, int64_t row_stride, int64_t col_stride, int row, int col) {
  if constexpr (std::is_same_v<B, NoBias>) {
    return 0.f;
  } else {
    return load_bias(bias + row * row_stride + col * col_stride);
  }
}

// One element (row, col) of this (batch, head)'s bias as fp32, of the element type p.bias_type names.
template <typename T>
__device__ __forceinline__ float bias_value(const AttentionParams& p, const void* bias_bh, int row, int col) {
  const int64_t offset = row * p.bias_row_stride + col * p.bias_col_stride;
  switch (p.bias_type) {
    case BiasType::kSameAsInput: return load_bias(static_cast<const T*>(bias_bh) + offset);
    case BiasType::kFloat32: return load_bias(static_cast<const float*>(bias_bh) + offset);
    case BiasType::kBool: return load_bias(static_cast<const bool*>(bias_bh) + offset);
    default: return 0.f;
  }
}

}  // namespace bwd
}  // namespace fa2
