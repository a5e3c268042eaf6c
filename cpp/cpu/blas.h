// Row-major tile products for the CPU kernel, on the BLAS that torch itself links (MKL/OpenBLAS `sgemm_`/`dgemm_`).
// ATen's typed `cpublas::gemm` overloads for float/double are not exported from libtorch_cpu, so we call the same
// Fortran entry points it calls. They are declared weak: a torch built without BLAS leaves them null and the
// plain loops below take over (correct, slower). Inside at::parallel_for the BLAS runs single-threaded (it sees
// the OpenMP region), which is what we want: parallelism comes from our own tasks.
#pragma once
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cpu/bf16_dot.h"
#include "fa2/dev_options.h"

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc) __attribute__((weak));
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc) __attribute__((weak));
// MKL's bf16 x bf16 -> fp32 product (bf16 as its bits; fp32 accumulation), on AMX / AVX512-BF16 where the CPU has
// them. Absent from other BLAS: weak, and then the bf16 forward converts to fp32 for sgemm_ as before.
void gemm_bf16bf16f32_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const uint16_t* a, const int* lda, const uint16_t* b, const int* ldb,
                       const float* beta, float* c, const int* ldc) __attribute__((weak));
}

namespace fa2::cpu {

// Largest leading dimension BLAS takes (its ints are 32-bit); tiles with a longer row stride are packed first.
constexpr int64_t kMaxBlasLd = INT_MAX;

namespace blas_detail {

// Column-major BLAS call C = alpha * op(A) op(B) + beta * C, or the reference loops when no BLAS is linked.
template <typename T>
void gemm_colmajor(char transa, char transb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                   const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const int ldai = static_cast<int>(lda), ldbi = static_cast<int>(ldb), ldci = static_cast<int>(ldc);
  if constexpr (std::is_same_v<T, float>) {
    if (sgemm_ != nullptr) {
      sgemm_(&transa, &transb, &mi, &ni, &ki, &alpha, a, &ldai, b, &ldbi, &beta, c, &ldci);
      return;
    }
  } else {
    if (dgemm_ != nullptr) {
      dgemm_(&transa, &transb, &mi, &ni, &ki, &alpha, a, &ldai, b, &ldbi, &beta, c, &ldci);
      return;
    }
  }
  // No BLAS: element (r, s) of op(X) for column-major X with leading dimension ld.
  auto at = [](const T* x, int64_t ld, bool trans, int64_t r, int64_t s) { return trans ? x[s + r * ld] : x[r + s * ld]; };
  for (int64_t col = 0; col < n; ++col) {
    for (int64_t row = 0; row < m; ++row) {
      T acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += at(a, lda, transa == 'T', row, p) * at(b, ldb, transb == 'T', p, col);
      T& out = c[row + col * ldc];
      out = alpha * acc + (beta == T(0) ? T(0) : beta * out);
    }
  }
}

}  // namespace blas_detail

// The three products attention needs, all row-major with explicit leading dimensions (elements between rows).
// A row-major (r x c) matrix is the column-major (c x r) matrix of the same memory, so each is one BLAS call with
// the operands swapped. Every ld must be >= the row length (BLAS rule); callers pack tiles that break it.

// C (m x n) = alpha * A (m x k) · B (n x k)ᵀ + beta * C          e.g. S = Q Kᵀ, dP = dO Vᵀ
template <typename T>
void gemm_abt(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta,
              T* c, int64_t ldc) {
  blas_detail::gemm_colmajor<T>('T', 'N', n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
}

// C (m x n) = alpha * A (m x k) · B (k x n) + beta * C            e.g. O += P V, dQ += dS K
template <typename T>
void gemm_ab(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta,
             T* c, int64_t ldc) {
  blas_detail::gemm_colmajor<T>('N', 'N', n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
}

// C (m x n) = alpha * A (k x m)ᵀ · B (k x n) + beta * C           e.g. dV += Pᵀ dO, dK += dSᵀ Q
template <typename T>
void gemm_atb(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta,
              T* c, int64_t ldc) {
  blas_detail::gemm_colmajor<T>('N', 'T', n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
}

// bf16 tile products (bf16 given as bits, fp32 C), where bf16_gemm_available(): a CPU with bf16 dot-product
// instructions (AVX512-BF16 or AMX; without them MKL emulates bf16, slower than converting to fp32 for sgemm) and the
// development option cpu_bf16_gemm on (fa2/dev_options.h; off: fp32 products, for A/B timing and for the tests of
// both paths). On AMX CPUs with MKL, MKL's gemm_bf16bf16f32; with AVX512-BF16 alone our own (bf16_dot.h),
// since MKL's there ran no faster than sgemm.
inline bool bf16_products_are_ours() {
  static const bool ours = [] {
    if (!bf16_dot_supported()) return false;
#if defined(__GNUC__) && defined(__x86_64__)
    return !(gemm_bf16bf16f32_ != nullptr && __builtin_cpu_supports("amx-bf16"));
#else
    return true;
#endif
  }();
  return ours;
}
inline bool bf16_gemm_supported() {
  static const bool supported = [] {
    if (bf16_products_are_ours()) return true;
    if (gemm_bf16bf16f32_ == nullptr) return false;
#if defined(__GNUC__) && defined(__x86_64__)
    return __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
#else
    return false;
#endif
  }();
  return supported;
}
// Whether bf16 tile products beat converting the tiles for sgemm on full tiles (the forward's query blocks, every
// backward tile): with AMX (MKL's products), or ours on AMD cores, which run vdpbf16ps at twice the FMA's
// multiply-adds. Intel cores without AMX run it (and MKL's bf16 product) at the FMA's rate, so there converting is
// faster on full tiles, and bf16 products keep only the forward's short query runs, whose few rows make the
// conversion the larger cost (docs/tuning.md, CPU kernel).
inline bool bf16_products_for_full_tiles() {
#if defined(__GNUC__) && defined(__x86_64__)
  static const bool full = !bf16_products_are_ours() || __builtin_cpu_is("amd");
  return full;
#else
  return true;
#endif
}
// (read once per kernel call: the options' mutex stays out of the tile loops)
inline bool bf16_gemm_available() {
  if (!bf16_gemm_supported()) return false;
  DevOptions options;
  dev_options(&options);  // (an error in FA2_DEV_OPTIONS is reported by the calls that plan CUDA kernels)
  return options.cpu_bf16_gemm;
}

namespace blas_detail {
inline void gemm_bf16_colmajor(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha,
                               const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
                               int64_t ldc) {
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const int ldai = static_cast<int>(lda), ldbi = static_cast<int>(ldb), ldci = static_cast<int>(ldc);
  gemm_bf16bf16f32_(&transa, &transb, &mi, &ni, &ki, &alpha, a, &ldai, b, &ldbi, &beta, c, &ldci);
}
}  // namespace blas_detail

// C (m x n) = alpha * A (m x k) · B (n x k)ᵀ + beta * C          S = Q Kᵀ
inline void gemm_abt_bf16(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                          const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#if FA2_BF16_DOT
  if (bf16_products_are_ours()) return bf16_dot_abt(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
  blas_detail::gemm_bf16_colmajor('T', 'N', n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
}

// C (m x n) = alpha * A (m x k) · B (k x n) + beta * C            O += P V
inline void gemm_ab_bf16(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                         const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#if FA2_BF16_DOT
  if (bf16_products_are_ours()) return bf16_dot_ab(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
  blas_detail::gemm_bf16_colmajor('N', 'N', n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
}

}  // namespace fa2::cpu
