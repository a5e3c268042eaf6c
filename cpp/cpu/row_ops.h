// Element-wise row operations of the CPU kernel's softmax: the O(Bq·Bk) work between the two tile products.
//
// The build has no -march flag (the library must run on any x86-64), so each entry point is compiled three times
// with GCC's target_clones (AVX-512, AVX2+FMA, baseline SSE2) and picked at load time. The bodies are templates
// on float/double written so that -O3 vectorizes them: reductions keep kLanes independent partial results (no
// reassociation needed, and the final combine has a fixed order, so results are deterministic), and exp is a
// branch-free polynomial (libm's exp does not vectorize, and it dominated the fp64 forward). The float exp loop, the
// hottest one, also has an AVX-512 intrinsics version (below), picked at run time.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define FA2_CPU_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define FA2_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define FA2_CPU_MULTIVERSION
#define FA2_ALWAYS_INLINE inline
#endif

namespace fa2::cpu {
namespace {

// Independent accumulators per reduction: one 512-bit register of floats (two of doubles).
constexpr int kLanes = 16;

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// exp(x) for x <= 88 (float) / 709 (double); callers guarantee it (softmax arguments are <= 0).
// n = round(x·log2 e) by the 1.5·2^mantissa trick (vectorizes on every target), r = x - n·ln2, exp(r) by a Taylor
// polynomial in Horner form, 2^n written straight into the exponent bits (the low mantissa bits of the rounded
// sum hold n; the offset bits shift out). Below the smallest normal result (this includes -inf, and the NaN that
// -inf produces on the way) the result is exactly 0: masked scores must give p == 0.
// float: one-FMA reduction (its error |n|·2e-9 stays below float precision), degree 6: max rel. error 4e-7.
// double: two-constant reduction, degree 12: max rel. error 3e-16.
FA2_ALWAYS_INLINE float exp_poly(float x) {
  constexpr float kMinArg = -87.33654f;  // exp(kMinArg) = smallest normal float
  constexpr float kRound = 12582912.0f;  // 1.5 · 2^23
  const float shifted = x * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const float r = x - n * 0.693147180559945309f;
  float y = 1.0f / 720;
  y = y * r + 1.0f / 120;
  y = y * r + 1.0f / 24;
  y = y * r + 1.0f / 6;
  y = y * r + 0.5f;
  y = y * r + 1.0f;
  y = y * r + 1.0f;
  uint32_t bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  bits = (bits << 23) + (127u << 23);
  float two_to_n;
  std::memcpy(&two_to_n, &bits, sizeof(bits));
  return x < kMinArg ? 0.0f : y * two_to_n;
}

FA2_ALWAYS_INLINE double exp_poly(double x) {
  constexpr double kMinArg = -708.3964185322641;  // exp(kMinArg) = smallest normal double
  constexpr double kRound = 6755399441055744.0;   // 1.5 · 2^52
  const double shifted = x * 1.4426950408889634074 + kRound;
  const double n = shifted - kRound;
  const double r = (x - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;  // ln 2 = hi + lo
  double y = 1.0 / 479001600;
  y = y * r + 1.0 / 39916800;
  y = y * r + 1.0 / 3628800;
  y = y * r + 1.0 / 362880;
  y = y * r + 1.0 / 40320;
  y = y * r + 1.0 / 5040;
  y = y * r + 1.0 / 720;
  y = y * r + 1.0 / 120;
  y = y * r + 1.0 / 24;
  y = y * r + 1.0 / 6;
  y = y * r + 0.5;
  y = y * r + 1.0;
  y = y * r + 1.0;
  uint64_t bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  bits = (bits << 52) + (uint64_t{1023} << 52);
  double two_to_n;
  std::memcpy(&two_to_n, &bits, sizeof(bits));
  return x < kMinArg ? 0.0 : y * two_to_n;
}

// tanh(u) for float: odd Taylor series near 0 (where 1 - 2/(e^2u + 1) would cancel), exp_poly elsewhere.
FA2_ALWAYS_INLINE float tanh_poly(float u) {
  const float a = u < 0.0f ? -u : u;
  const float a2 = a * a;
  const float small = a * (1.0f + a2 * (-1.0f / 3 + a2 * (2.0f / 15 + a2 * (-17.0f / 315 + a2 * (62.0f / 2835)))));
  const float large = 1.0f - 2.0f / (exp_poly(2.0f * (a > 20.0f ? 20.0f : a)) + 1.0f);
  const float t = a < 0.25f ? small : large;
  return u < 0.0f ? -t : t;
}

// fp64 is the reference-accuracy path: libm's tanh (softcap only).
FA2_ALWAYS_INLINE double tanh_poly(double u) { return std::tanh(u); }

// ---- bodies --------------------------------------------------------------------------------------------------

// Max of a row, NaNs ignored (the select compiles to vmaxps; tracking NaNs in the same loop stopped GCC from
// vectorizing it, 3-5x slower per element). Rows that come out -inf are checked
// with any_nan, so a row of NaN scores still gives NaN instead of looking like a row that sees no key.
template <typename T>
FA2_ALWAYS_INLINE T row_max_impl(const T* x, int64_t n) {
  T lanes[kLanes];
  for (int k = 0; k < kLanes; ++k) lanes[k] = kNegInf<T>;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) lanes[k] = x[j + k] > lanes[k] ? x[j + k] : lanes[k];
  T result = kNegInf<T>;
  for (; j < n; ++j) result = x[j] > result ? x[j] : result;
  for (int k = 0; k < kLanes; ++k) result = lanes[k] > result ? lanes[k] : result;
  return result;
}

template <typename T>
bool any_nan(const T* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    if (x[j] != x[j]) return true;
  }
  return false;
}

// x = exp(x - shift) in place; returns the row sum of the new x and, when kWithMax, the max of the old x.
template <bool kWithMax, typename T>
FA2_ALWAYS_INLINE T exp_sub_sum_impl(T* x, int64_t n, T shift, T* input_max) {
  T sum_lanes[kLanes] = {}, max_lanes[kLanes];
  for (int k = 0; k < kLanes; ++k) max_lanes[k] = kNegInf<T>;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const T s = x[j + k];
      if constexpr (kWithMax) max_lanes[k] = s > max_lanes[k] ? s : max_lanes[k];
      const T p = exp_poly(s - shift);
      x[j + k] = p;
      sum_lanes[k] += p;
    }
  }
  T tail_sum = 0, result_max = kNegInf<T>;
  for (; j < n; ++j) {
    if constexpr (kWithMax) result_max = x[j] > result_max ? x[j] : result_max;
    x[j] = exp_poly(x[j] - shift);
    tail_sum += x[j];
  }
  T result = 0;
  for (int k = 0; k < kLanes; ++k) {
    result += sum_lanes[k];
    if constexpr (kWithMax) result_max = max_lanes[k] > result_max ? max_lanes[k] : result_max;
  }
  if constexpr (kWithMax) *input_max = result_max;
  return result + tail_sum;
}

template <typename T>
FA2_ALWAYS_INLINE T dot_row_impl(const T* x, const T* y, int64_t n) {
  T lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) lanes[k] += x[j + k] * y[j + k];
  T result = 0;
  for (; j < n; ++j) result += x[j] * y[j];
  for (int k = 0; k < kLanes; ++k) result += lanes[k];
  return result;
}

template <typename T>
FA2_ALWAYS_INLINE void softcap_row_impl(T* x, int64_t n, T cap, T* dtanh) {
  const T inv_cap = T(1) / cap;
  if (dtanh == nullptr) {
    for (int64_t j = 0; j < n; ++j) x[j] = cap * tanh_poly(x[j] * inv_cap);
  } else {
    for (int64_t j = 0; j < n; ++j) {
      const T t = tanh_poly(x[j] * inv_cap);
      x[j] = cap * t;
      dtanh[j] = T(1) - t * t;
    }
  }
}

// ---- entry points (multiversioned; float and double overloads) --------------------------------------------------

#define FA2_ROW_OPS(T)                                                                                           \
  FA2_CPU_MULTIVERSION T row_max(const T* x, int64_t n) { return row_max_impl(x, n); }                          \
  /* portable bodies of exp_sub_sum / exp_sub_sum_max (below) */                                                 \
  FA2_CPU_MULTIVERSION T exp_sub_sum_portable(T* x, int64_t n, T shift) {                                       \
    return exp_sub_sum_impl</*kWithMax=*/false>(x, n, shift, static_cast<T*>(nullptr));                         \
  }                                                                                                              \
  FA2_CPU_MULTIVERSION T exp_sub_sum_max_portable(T* x, int64_t n, T shift, T* input_max) {                     \
    return exp_sub_sum_impl</*kWithMax=*/true>(x, n, shift, input_max);                                         \
  }                                                                                                              \
  /* x = cap · tanh(x / cap); dtanh (optional) = 1 - tanh², the factor the backward needs. */                  \
  FA2_CPU_MULTIVERSION void softcap_row(T* x, int64_t n, T cap, T* dtanh) { softcap_row_impl(x, n, cap, dtanh); } \
  FA2_CPU_MULTIVERSION void scale_row(T* x, int64_t n, T factor) {                                               \
    for (int64_t j = 0; j < n; ++j) x[j] *= factor;                                                              \
  }                                                                                                              \
  /* x / sum, as a product with 1 / sum, for a row of sum ~1; an entry equal to the sum (the row's only nonzero   \
     one) becomes exactly 1, which x · (1 / x) need not be. */                                                   \
  FA2_CPU_MULTIVERSION void normalize_row(T* x, int64_t n, T sum) {                                              \
    const T inv_sum = T(1) / sum;                                                                                \
    for (int64_t j = 0; j < n; ++j) x[j] = x[j] == sum ? T(1) : x[j] * inv_sum;                                  \
  }                                                                                                              \
  /* dS = P ∘ (dP - D), written over dP. */                                                                      \
  FA2_CPU_MULTIVERSION void softmax_grad_row(T* dp, const T* p, int64_t n, T rowsum_dout_out) {                  \
    for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - rowsum_dout_out);                                   \
  }                                                                                                              \
  FA2_CPU_MULTIVERSION void mul_row(T* x, const T* y, int64_t n) {                                               \
    for (int64_t j = 0; j < n; ++j) x[j] *= y[j];                                                                \
  }                                                                                                              \
  FA2_CPU_MULTIVERSION T dot_row(const T* x, const T* y, int64_t n) { return dot_row_impl(x, y, n); }

FA2_ROW_OPS(float)
FA2_ROW_OPS(double)
#undef FA2_ROW_OPS

// ---- exp_sub_sum / exp_sub_sum_max ------------------------------------------------------------------------------
// float on AVX-512: the same computation in 11 instructions per 16 floats instead of 16, through the instructions
// GCC does not emit from portable code: vreduceps (f = t - round(t)) and vscalefps (p · 2^n, which also flushes
// n = -inf to exactly 0). 2^f by its degree-6 Taylor polynomial on |f| <= 1/2 (rel. error 1.2e-7). 0.156 vs 0.224
// ns/element.
#if defined(__GNUC__) && defined(__x86_64__)
#define FA2_AVX512 __attribute__((target("avx512f,avx512dq")))
// GCC 12 flags the intentionally undefined pass-through operand inside its own AVX-512 intrinsics (false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// exp(t · ln 2) for 16 floats
FA2_AVX512 inline __attribute__((always_inline)) __m512 exp2_avx512(__m512 t) {
  const __m512 f = _mm512_reduce_ps(t, /*round to nearest=*/0);
  __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);  // ln2^k / k!, k = 6 .. 0
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, _mm512_sub_ps(t, f));
}

template <bool kWithMax>
FA2_AVX512 float exp_sub_sum_avx512(float* x, int64_t n, float shift, float* input_max) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 shift_v = _mm512_set1_ps(shift), neg_inf = _mm512_set1_ps(kNegInf<float>);
  __m512 sum = _mm512_setzero_ps(), max = neg_inf;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 s = _mm512_loadu_ps(x + j);
    if constexpr (kWithMax) max = _mm512_max_ps(max, s);  // NaN-ignoring, like row_max
    const __m512 p = exp2_avx512(_mm512_mul_ps(_mm512_sub_ps(s, shift_v), log2e));
    _mm512_storeu_ps(x + j, p);
    sum = _mm512_add_ps(sum, p);
  }
  if (j < n) {  // tail: inactive lanes read -inf, which adds 0 to the sum and nothing to the max
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512 s = _mm512_mask_loadu_ps(neg_inf, tail, x + j);
    if constexpr (kWithMax) max = _mm512_max_ps(max, s);
    const __m512 p = exp2_avx512(_mm512_mul_ps(_mm512_sub_ps(s, shift_v), log2e));
    _mm512_mask_storeu_ps(x + j, tail, p);
    sum = _mm512_add_ps(sum, p);
  }
  if constexpr (kWithMax) *input_max = _mm512_reduce_max_ps(max);
  return _mm512_reduce_add_ps(sum);
}
#pragma GCC diagnostic pop
#undef FA2_AVX512

const bool kHasAvx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
#else
const bool kHasAvx512 = false;
#endif

// x = exp(x - shift) in place; returns the row sum of the new x.
float exp_sub_sum(float* x, int64_t n, float shift) {
#if defined(__GNUC__) && defined(__x86_64__)
  if (kHasAvx512) return exp_sub_sum_avx512</*kWithMax=*/false>(x, n, shift, nullptr);
#endif
  return exp_sub_sum_portable(x, n, shift);
}
double exp_sub_sum(double* x, int64_t n, double shift) { return exp_sub_sum_portable(x, n, shift); }

// The same, plus the max of x before the update in *input_max: the forward's one-pass softmax.
float exp_sub_sum_max(float* x, int64_t n, float shift, float* input_max) {
#if defined(__GNUC__) && defined(__x86_64__)
  if (kHasAvx512) return exp_sub_sum_avx512</*kWithMax=*/true>(x, n, shift, input_max);
#endif
  return exp_sub_sum_max_portable(x, n, shift, input_max);
}
double exp_sub_sum_max(double* x, int64_t n, double shift, double* input_max) {
  return exp_sub_sum_max_portable(x, n, shift, input_max);
}

// ---- float16 -> float32 ----------------------------------------------------------------------------------------
// The fp16 path converts every K/V tile it reads; c10::Half's portable conversion is bit manipulation that does not
// vectorize (it made the fp16 forward much slower than the fp32 one). F16C's vcvtph2ps does 8 per instruction.
#if defined(__GNUC__) && defined(__x86_64__)
__attribute__((target("avx,f16c"))) void half_bits_to_float_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j))));
  }
  for (; j < n; ++j) dst[j] = _cvtsh_ss(src[j]);
}
#endif

// Returns false when the CPU (or compiler) has no F16C: the caller converts element by element.
bool half_bits_to_float(const uint16_t* src, float* dst, int64_t n) {
#if defined(__GNUC__) && defined(__x86_64__)
  static const bool has_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  if (has_f16c) {
    half_bits_to_float_f16c(src, dst, n);
    return true;
  }
#endif
  (void)src, (void)dst, (void)n;
  return false;
}

// ---- float32 -> bfloat16 ----------------------------------------------------------------------------------------
// P rounded for the bf16 P V product (the GPU kernels round it the same way): round to nearest even on the bits
// (the high half after adding 0x7fff plus the kept half's lowest bit), NaN kept a quiet NaN (the addition could
// carry a NaN's mantissa into the sign). Integer-only and branch-free, so -O3 vectorizes it on every target.
FA2_CPU_MULTIVERSION void float_to_bf16_bits(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    uint32_t bits;
    std::memcpy(&bits, src + j, sizeof(bits));
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    dst[j] = static_cast<uint16_t>(nan ? 0x7fc0u : rounded);
  }
}

}  // namespace
}  // namespace fa2::cpu
