// The CPU kernel's operand tiles: rows of q, k, v, out, dout read through their strides and handed to the tile
// products (cpu/blas.h) as acc_t matrices or as bf16 bits, converted only where the tensor's own memory cannot be
// read in place.
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cpu/blas.h"
#include "cpu/row_ops.h"

namespace fa2::cpu {
namespace {

// fp32 accumulation for float, bfloat16 and float16; fp64 for double.
template <typename scalar_t>
using acc_type = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A (batch, seqlen, heads, headdim) tensor's rows by its strides (last dim contiguous, checked): T = const scalar_t
// to read them, scalar_t to write them.
template <typename T>
struct HeadRows {
  T* data;
  int64_t stride_b, stride_s, stride_h;

  explicit HeadRows(const at::Tensor& t) : stride_b(t.stride(0)), stride_s(t.stride(1)), stride_h(t.stride(2)) {
    if constexpr (std::is_const_v<T>) {
      data = t.const_data_ptr<std::remove_const_t<T>>();
    } else {
      data = t.mutable_data_ptr<T>();
    }
  }
  T* row(int64_t b, int64_t s, int64_t h) const { return data + b * stride_b + s * stride_s + h * stride_h; }
};

// `rows` sequence positions from `first` (row stride `row_stride`) as an acc_t matrix BLAS can read: the tensor's
// own memory when it already is one (same dtype, legal leading dim: no copy), else converted into `scratch`.
template <typename acc_t, typename scalar_t>
const acc_t* rows_for_blas(const scalar_t* first, int64_t row_stride, int64_t rows, int64_t headdim, acc_t* scratch,
                           int64_t& ld) {
  if constexpr (std::is_same_v<acc_t, scalar_t>) {
    if (rows == 1 || (row_stride >= headdim && row_stride <= kMaxBlasLd)) {
      ld = rows == 1 ? headdim : row_stride;
      return first;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const scalar_t* src = first + r * row_stride;
    acc_t* dst = scratch + r * headdim;
    if constexpr (std::is_same_v<scalar_t, at::Half>) {
      if (half_bits_to_float(reinterpret_cast<const uint16_t*>(src), dst, headdim)) continue;
    }
    for (int64_t d = 0; d < headdim; ++d) dst[d] = static_cast<acc_t>(src[d]);
  }
  ld = headdim;
  return scratch;
}

// One operand tile of the tile products, with BLAS's leading dimension: bf16 bits for the bf16 products
// (cpu/blas.h, gemm_*_bf16), else acc_t values. Exactly one of values / bits is set.
template <typename acc_t>
struct ProductTile {
  const acc_t* values = nullptr;
  const uint16_t* bits = nullptr;
  int64_t ld = 0;
};

// Rows [first, + rows) of q, k, v or dout as a product tile: their bf16 bits when bf16_products (read in place, or
// copied into bits_scratch where their leading dim is not BLAS's), else converted to acc_t (into scratch).
template <typename scalar_t, typename acc_t>
ProductTile<acc_t> product_tile(const scalar_t* first, int64_t row_stride, int64_t rows, int64_t headdim,
                                bool bf16_products, acc_t* scratch, at::BFloat16* bits_scratch) {
  ProductTile<acc_t> tile;
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    if (bf16_products) {
      const at::BFloat16* bits = rows_for_blas(first, row_stride, rows, headdim, bits_scratch, tile.ld);
      tile.bits = reinterpret_cast<const uint16_t*>(bits);
      return tile;
    }
  }
  tile.values = rows_for_blas(first, row_stride, rows, headdim, scratch, tile.ld);
  return tile;
}

// Rows at their own addresses (row_of(r), r < rows) as a product tile, copied (bf16 bits for bf16_products) or
// converted (acc_t) into the scratch: a tile whose rows no single stride reaches (a decode step's query heads at
// several positions).
template <typename scalar_t, typename acc_t, typename RowOf>
ProductTile<acc_t> gathered_tile(const RowOf& row_of, int64_t rows, int64_t headdim, bool bf16_products,
                                 acc_t* scratch, at::BFloat16* bits_scratch) {
  ProductTile<acc_t> tile;
  tile.ld = headdim;
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    if (bf16_products) {
      for (int64_t r = 0; r < rows; ++r) {
        const scalar_t* row = row_of(r);
        std::copy(row, row + headdim, bits_scratch + r * headdim);
      }
      tile.bits = reinterpret_cast<const uint16_t*>(bits_scratch);
      return tile;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    int64_t ld;  // (one row: rows_for_blas converts it, or returns it in place when it is already acc_t)
    const acc_t* row = rows_for_blas(row_of(r), headdim, 1, headdim, scratch + r * headdim, ld);
    if (row != scratch + r * headdim) std::copy(row, row + headdim, scratch + r * headdim);
  }
  tile.values = scratch;
  return tile;
}

// c (m, n) = alpha a[r0 .. r0 + m) b^T on either kind of tile (both of one kind: product_tile with one flag).
template <typename acc_t>
void product_abt(int64_t m, int64_t n, int64_t k, acc_t alpha, const ProductTile<acc_t>& a, int64_t r0,
                 const ProductTile<acc_t>& b, acc_t* c, int64_t ldc) {
  if constexpr (std::is_same_v<acc_t, float>) {
    if (a.bits != nullptr) {
      gemm_abt_bf16(m, n, k, alpha, a.bits + r0 * a.ld, a.ld, b.bits, b.ld, 0.f, c, ldc);
      return;
    }
  }
  gemm_abt<acc_t>(m, n, k, alpha, a.values + r0 * a.ld, a.ld, b.values, b.ld, acc_t(0), c, ldc);
}

template <typename scalar_t, typename acc_t>
void store_row(scalar_t* dst, const acc_t* src, int64_t n, acc_t factor) {
  for (int64_t d = 0; d < n; ++d) dst[d] = static_cast<scalar_t>(src[d] * factor);
}

// dst (cols x rows, row stride ld_dst) = src (rows x cols, row stride ld_src)ᵀ: bf16 bits, for the backward's products
// that take Pᵀ or dSᵀ as their left operand.
void transpose_bits(const uint16_t* src, int64_t ld_src, int64_t rows, int64_t cols, uint16_t* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
  }
}

}  // namespace
}  // namespace fa2::cpu
