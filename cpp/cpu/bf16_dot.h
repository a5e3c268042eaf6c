// bf16 tile products of our own on AVX512-BF16 (vdpbf16ps: fp32 += bf16 pair · bf16 pair), for CPUs that have it
// without AMX: there MKL's gemm_bf16bf16f32 runs no faster than sgemm on converted tiles, while these run about twice
// as fast (packing included; docs/tuning.md, CPU kernel). On AMX CPUs MKL's product is used (cpu/blas.h).
// Row-major operands given as bf16 bits with leading dimensions; fp32 C = alpha A B + beta C. B is packed per call
// into VNNI pairs (word (p, n) = B's elements k = 2p, 2p + 1 of column n); A's pairs are read in place.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define FA2_BF16_DOT 1
#define FA2_BF16_DOT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define FA2_BF16_DOT 0
#endif

namespace fa2::cpu {

inline bool bf16_dot_supported() {
#if FA2_BF16_DOT
  static const bool supported = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl");
  return supported;
#else
  return false;
#endif
}

#if FA2_BF16_DOT
namespace bf16_dot_detail {

// The micro tile: up to kRows rows of C by kCols columns (2 zmm of fp32 each: 16 of the 32 registers at 8 rows).
constexpr int kRows = 8, kCols = 32;

inline uint32_t pair_word(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

// The mask of a 16-lane vector's first `count` lanes (count <= 0: none; >= 16: all).
inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? __mmask16(0xffff) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}

// A's pair p of row r as a word; the last pair of an odd k holds one element (the other 0, never read past the row:
// a NaN there would turn 0 · NaN into NaN).
inline uint32_t a_word(const uint16_t* a_row, int64_t p, int64_t k) {
  if (2 * p + 1 < k) {
    uint32_t w;
    std::memcpy(&w, a_row + 2 * p, 4);
    return w;
  }
  return a_row[2 * p];
}

// C rows [0, rows) x columns [0, cols) of one micro tile (cols <= kCols) = alpha A Bp + beta C, over pairs [0, pairs).
template <int kR>
FA2_BF16_DOT_TARGET void micro_tile(const uint16_t* a, int64_t lda, int64_t k, const uint32_t* bp, int64_t ldbp,
                                    float* c, int64_t ldc, int cols, float alpha, float beta) {
  const int64_t pairs = (k + 1) / 2;
  __m512 acc[kR][2];
  for (int r = 0; r < kR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * ldbp);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * ldbp + 16);
#pragma GCC unroll 8
    for (int r = 0; r < kR; ++r) {
      const __m512bh w = (__m512bh)_mm512_set1_epi32(int(a_word(a + r * lda, p, k)));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], w, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], w, b1);
    }
  }
  const __mmask16 m0 = first_lanes(cols), m1 = first_lanes(cols - 16);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int r = 0; r < kR; ++r) {
    float* row = c + r * ldc;
    __m512 out0 = _mm512_mul_ps(acc[r][0], va), out1 = _mm512_mul_ps(acc[r][1], va);
    if (beta != 0.f) {  // (beta 0: C is not read, as BLAS)
      out0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, row), vb, out0);
      out1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, row + 16), vb, out1);
    }
    _mm512_mask_storeu_ps(row, m0, out0);
    _mm512_mask_storeu_ps(row + 16, m1, out1);
  }
}

// C (m x n) = alpha A (m x k) Bp + beta C, Bp packed (pairs x n_padded words, n_padded a multiple of kCols).
FA2_BF16_DOT_TARGET inline void product(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                                        const uint32_t* bp, int64_t ldbp, float beta, float* c, int64_t ldc) {
  for (int64_t n0 = 0; n0 < n; n0 += kCols) {
    const int cols = int(n - n0 < kCols ? n - n0 : kCols);
    int64_t r0 = 0;
    for (; r0 + kRows <= m; r0 += kRows) {
      micro_tile<kRows>(a + r0 * lda, lda, k, bp + n0, ldbp, c + r0 * ldc + n0, ldc, cols, alpha, beta);
    }
    const uint16_t* a_rest = a + r0 * lda;
    float* c_rest = c + r0 * ldc + n0;
    switch (m - r0) {  // (the rows left: fewer than kRows)
      case 7: micro_tile<7>(a_rest, lda, k, bp + n0, ldbp, c_rest, ldc, cols, alpha, beta); break;
      case 6: micro_tile<6>(a_rest, lda, k, bp + n0, ldbp, c_rest, ldc, cols, alpha, beta); break;
      case 5: micro_tile<5>(a_rest, lda, k, bp + n0, ldbp, c_rest, ldc, cols, alpha, beta); break;
      case 4: micro_tile<4>(a_rest, lda, k, bp + n0, ldbp, c_rest, ldc, cols, alpha, beta); break;
      case 3: micro_tile<3>(a_rest, lda, k, bp + n0, ldbp, c_rest, ldc, cols, alpha, beta); break;
      case 2: micro_tile<2>(a_rest, lda, k, bp + n0, ldbp, c_rest, ldc, cols, alpha, beta); break;
      case 1: micro_tile<1>(a_rest, lda, k, bp + n0, ldbp, c_rest, ldc, cols, alpha, beta); break;
      default: break;
    }
  }
}

inline int64_t padded_cols(int64_t n) { return (n + kCols - 1) / kCols * kCols; }

// This thread's packing buffer, grown as needed (products run inside at::parallel_for tasks).
inline uint32_t* pack_buffer(int64_t words) {
  thread_local std::vector<uint32_t> buffer;
  if (int64_t(buffer.size()) < words) buffer.resize(words);
  return buffer.data();
}

// Bp from B (n x k, row-major, ldb) read transposed (the product A Bᵀ): word (p, j) = B[j][2p], B[j][2p + 1].
// 16 rows' words at once by a gather (byte offsets: rows need not be 4-byte aligned).
FA2_BF16_DOT_TARGET inline void pack_transposed(const uint16_t* b, int64_t ldb, int64_t n, int64_t k, uint32_t* bp,
                                                int64_t ldbp) {
  const int64_t full_pairs = k / 2, pairs = (k + 1) / 2;
  const bool gather = 16 * ldb * 2 < (int64_t(1) << 31);
  const __m512i row_bytes = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32(int(gather ? ldb * 2 : 0)));
  for (int64_t j0 = 0; j0 < ldbp; j0 += 16) {
    const int64_t rows = j0 >= n ? 0 : (n - j0 < 16 ? n - j0 : 16);
    const __mmask16 valid = first_lanes(rows);
    for (int64_t p = 0; p < pairs; ++p) {
      uint32_t* dst = bp + p * ldbp + j0;
      if (rows > 0 && gather && p < full_pairs) {
        const void* base = b + j0 * ldb + 2 * p;
        _mm512_storeu_si512(dst, _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, row_bytes, base, 1));
      } else {
        for (int64_t j = 0; j < 16; ++j) {
          const uint16_t* row = b + (j0 + j) * ldb;
          dst[j] = j < rows ? (2 * p + 1 < k ? pair_word(row[2 * p], row[2 * p + 1]) : row[2 * p]) : 0u;
        }
      }
    }
  }
}

// Bp from B (k x n, row-major, ldb): word (p, j) = B[2p][j], B[2p + 1][j] (row 2p + 1 past k: 0).
FA2_BF16_DOT_TARGET inline void pack_rows(const uint16_t* b, int64_t ldb, int64_t n, int64_t k, uint32_t* bp,
                                          int64_t ldbp) {
  const int64_t pairs = (k + 1) / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    const uint16_t* lo = b + 2 * p * ldb;
    const uint16_t* hi = 2 * p + 1 < k ? lo + ldb : nullptr;
    for (int64_t j0 = 0; j0 < ldbp; j0 += 16) {
      const __mmask16 valid = first_lanes(n - j0);
      // (the maskz forms with every lane set: the plain intrinsics' undefined pass-through trips GCC 12's
      // -Wmaybe-uninitialized inside its own headers)
      const __mmask16 all = 0xffff;
      const __m512i w_lo = _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(valid, lo + j0));
      const __m512i w_hi = hi == nullptr ? _mm512_setzero_si512()
                                         : _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(valid, hi + j0));
      _mm512_storeu_si512(bp + p * ldbp + j0, _mm512_or_si512(w_lo, _mm512_maskz_slli_epi32(all, w_hi, 16)));
    }
  }
}

// C (m x n) = alpha A (m x k) B + beta C with B packed by pack_b(bp, ldbp) into this thread's buffer.
template <class PackB>
FA2_BF16_DOT_TARGET inline void packed_product(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
                                               int64_t lda, PackB pack_b, float beta, float* c, int64_t ldc) {
  const int64_t ldbp = padded_cols(n);
  uint32_t* bp = pack_buffer((k + 1) / 2 * ldbp);
  pack_b(bp, ldbp);
  product(m, n, k, alpha, a, lda, bp, ldbp, beta, c, ldc);
}

}  // namespace bf16_dot_detail

// C (m x n) = alpha * A (m x k) · B (n x k)ᵀ + beta * C          S = Q Kᵀ
inline void bf16_dot_abt(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                         const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  bf16_dot_detail::packed_product(
      m, n, k, alpha, a, lda,
      [&](uint32_t* bp, int64_t ldbp) { bf16_dot_detail::pack_transposed(b, ldb, n, k, bp, ldbp); }, beta, c, ldc);
}

// C (m x n) = alpha * A (m x k) · B (k x n) + beta * C            O += P V
inline void bf16_dot_ab(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                        const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  bf16_dot_detail::packed_product(
      m, n, k, alpha, a, lda,
      [&](uint32_t* bp, int64_t ldbp) { bf16_dot_detail::pack_rows(b, ldb, n, k, bp, ldbp); }, beta, c, ldc);
}
#endif

}  // namespace fa2::cpu
