// Online softmax over key tiles, in registers (FA-2): running row max m, running row sum l (kept per thread and
// reduced across the quad once at the end), unnormalized O rescaled by exp2(m_old - m_new) when the max grows by
// more than 2^kStaleMaxLog2 (smaller rises keep the old max: see kStaleMaxLog2).
// Scores arrive in "score units" s with p = exp2(s * mult - m * mult): mult = scale * log2(e) on the plain path
// (raw q.k, the scale folded into the one FMA before exp2), log2(e) when scores were already scaled/modified.
#pragma once
#include <cmath>
#include "fa2/ptx.cuh"

namespace fa2 {

// exp2 written out explicitly (the build has no --use_fast_math): ex2.approx.ftz, max relative error 2^-22,
// subnormal results flushed to 0, exp2(-inf) = 0. Its inputs are s * mult - m * mult <= 0.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// A row whose scores are all huge and negative (every key biased by finfo.min or -1e9: a padded query under a
// Hugging Face mask) still sees its keys: its exact softmax is uniform over them (float32 cannot tell q.k apart next
// to -3e38), as eager PyTorch computes it. The plain recipe fails there: s * mult overflows, and
// fmaf(s, mult, -m * mult) leaves the rounding of m * mult (up to 2^101) instead of 0. So once a row's max is below
// -kHeavyRowLog2 (log2 units), its scores are shifted by the max first (s - m is exact where it matters) and the
// rescaling uses differences too. The backward cannot use lse for such rows either (see bwd_row_stats_kernel).
constexpr float kHeavyRowLog2 = 8192.f;

// How far (log2 units) a row's running max may fall behind before it is raised (FlashAttention-4's conditional
// rescaling): p <= 2^8 = 256, which bf16 / fp16 P and the fp32 O and l hold without loss. Most tiles then leave
// every row's max alone and skip O's rescaling (measured faster at d 128 and with padding masks: docs/tuning.md).
constexpr float kStaleMaxLog2 = 8.f;

template <int kMTiles>
struct OnlineSoftmax {
  static constexpr int kRows = 2 * kMTiles;  // this thread's rows: (mt, half) -> row 16 mt + 8 half + group
  float row_max[kRows];                      // in score units; -inf until a visible key is seen
  float row_sum[kRows];                      // this thread's partial sum of p (quad-reduced in finalize)

  __device__ __forceinline__ OnlineSoftmax() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // s[mt][nt][4]: one S tile (C fragments) -> overwritten with p = exp2(s * mult - m_new * mult), m_new the max the
  // row keeps; o[mt][dt][4]: the O accumulators, rescaled by exp2((m_old - m_new) * mult) when it changed (the warp
  // skips it when no row's did). mult must be > 0.
  // kHeavyRows: handle rows below -kHeavyRowLog2 (only a float bias makes scores that low); heavy_s =
  // -kHeavyRowLog2 / mult (score units, computed once by the caller).
  template <bool kHeavyRows, int kNTiles, int kDTiles>
  __device__ __forceinline__ void update(float (&s)[kMTiles][kNTiles][4], float (&o)[kMTiles][kDTiles][4],
                                         float mult, float heavy_s) {
    float correction[kRows];
    update_scores<kHeavyRows>(s, mult, heavy_s, correction);
    rescale(o, correction);
  }

  // update() in two halves, for a kernel whose previous P V may still be accumulating into O while the scores of the
  // next tile are turned into P: update_scores (m, l, S -> P, and per row the factor O must be scaled by), then
  // rescale(o) once O is free. The same operations on the same values as update().
  template <bool kHeavyRows, int kNTiles>
  __device__ __forceinline__ void update_scores(float (&s)[kMTiles][kNTiles][4], float mult, float heavy_s,
                                                float (&correction)[kRows]) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) correction[r] = update_row<kHeavyRows>(s, r, mult, heavy_s);
  }
  template <int kDTiles>
  __device__ __forceinline__ static void rescale(float (&o)[kMTiles][kDTiles][4], const float (&correction)[kRows]) {
    bool unchanged = true;
#pragma unroll
    for (int r = 0; r < kRows; ++r) unchanged &= correction[r] == 1.f;
    if (__all_sync(0xffffffffu, unchanged)) return;
#pragma unroll
    for (int r = 0; r < kRows; ++r) rescale_row(o, r, correction[r]);
  }

 private:
  // v[0] = max(v[0 .. kWidth)), pairwise (compile-time indices: a runtime-bounded loop put v in local memory)
  template <int kWidth, int kN>
  __device__ __forceinline__ static void max_tree(float (&v)[kN]) {
    if constexpr (kWidth > 1) {
#pragma unroll
      for (int i = 0; i < kWidth / 2; ++i) v[i] = fmaxf(v[i], v[i + (kWidth + 1) / 2]);
      max_tree<(kWidth + 1) / 2>(v);
    }
  }
  // Row r = (mt, half) of the tile: new max, l rescaled, S -> P, l += sum P; returns the factor for O's row.
  template <bool kHeavyRows, int kNTiles>
  __device__ __forceinline__ float update_row(float (&s)[kMTiles][kNTiles][4], int r, float mult, float heavy_s) {
    const int mt = r >> 1, half = r & 1;
    // -- new row max over this tile (quad-reduced: the 4 lanes of a group hold one row)
    //    as a tree (depth log2 of the row's values, not one chain through all of them; exact in any order)
    float tile_max[kNTiles];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) tile_max[nt] = fmaxf(s[mt][nt][half * 2], s[mt][nt][half * 2 + 1]);
    max_tree<kNTiles>(tile_max);
    float m_new = ptx::quad_max(fmaxf(row_max[r], tile_max[0]));
    // -- a max that grew by at most kStaleMaxLog2 is not taken: p may then reach 2^kStaleMaxLog2 (O, l and lse all
    //    use the max the row keeps, so the result is the same up to rounding), and O needs no rescaling (the factor is
    //    exactly 1), which the warp skips when all its rows agree (rescale). A row's decisions depend on its own
    //    scores only, so every schedule still computes it bitwise alike. NaN (a row that has seen no key yet:
    //    -inf - -inf) takes the new max.
    if ((m_new - row_max[r]) * mult <= kStaleMaxLog2) m_new = row_max[r];
    float m_scaled, correction;
    if (kHeavyRows && m_new < heavy_s && m_new != -INFINITY) {
      // -- a heavy row (rare; quad-uniform): p = exp2((s - m) * mult), rescale by exp2((m_old - m) * mult)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) s[mt][nt][half * 2 + e] -= m_new;  // -inf stays -inf
      correction = exp2_ftz((row_max[r] - m_new) * mult);             // -inf (first tile): 0
      m_scaled = 0.f;
    } else {
      // A row that has seen only masked keys keeps m = -inf: subtract 0 instead, so exp2(-inf - -inf) = NaN
      // never happens and its p stay 0.
      m_scaled = m_new == -INFINITY ? 0.f : m_new * mult;
      // -- rescale what was accumulated under the old max (exp2(-inf) = 0 on the first visible tile). When the max
      //    did not move the factor is exactly 1: computed, row_max * mult - m_scaled is the rounding error of
      //    m * mult (ptxas fuses it into one FFMA), about 1e-6 from 0, and O and l would drift by that much per tile
      //    (lse with them), differently for kernels that visit different numbers of masked tiles.
      correction = m_new == row_max[r] ? 1.f : exp2_ftz(row_max[r] * mult - m_scaled);
    }
    row_max[r] = m_new;
    row_sum[r] *= correction;
    // -- p = exp2(s * mult - m * mult): one FFMA + one MUFU.EX2 per score
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = exp2_ftz(fmaf(s[mt][nt][half * 2 + e], mult, -m_scaled));
        s[mt][nt][half * 2 + e] = p;
        sum += p;
      }
    }
    row_sum[r] += sum;
    return correction;
  }
  template <int kDTiles>
  __device__ __forceinline__ static void rescale_row(float (&o)[kMTiles][kDTiles][4], int r, float correction) {
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      o[r >> 1][dt][(r & 1) * 2] *= correction;
      o[r >> 1][dt][(r & 1) * 2 + 1] *= correction;
    }
  }

 public:
  // After the last tile: the factor that normalizes O (0 for a row that saw no key: its output is 0, not NaN)
  // and lse = m * mult * ln(2) + ln(l) (+inf for such a row).
  __device__ __forceinline__ void finalize(float mult, float (&inv_sum)[kRows], float (&lse)[kRows]) const {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float l = ptx::quad_sum(row_sum[r]);
      const bool seen = l > 0.f;
      inv_sum[r] = seen ? 1.f / l : 0.f;
      // (mult * ln 2) first: row_max * mult alone overflows for a heavy row whose lse itself fits in float. One
      // explicit fma: left to contraction, kernels that differ only in their schedule rounded it differently
      lse[r] = seen ? __fmaf_rn(row_max[r], mult * 0.69314718055994531f, logf(l)) : INFINITY;
    }
  }
};

// An attention sink (natural-log units) folded into a finalized row: one more term e^sink in its denominator (a key
// with a zero value): lse' = log(e^lse + e^sink), O's factor scaled by e^(lse - lse'). Taken relative to the larger
// of the two (no overflow); a row that saw no key (lse = +inf, factor 0) stays as it is. Applied after finalize() so
// that the key loop's code does not depend on it. On the SFU (ex2, rcp, lg2 approx): e lies in [0, 1], so 1 + e in
// [1, 2] where each is accurate to a few ulp; the libm calls took ~150 instructions a row, this ~20.
__device__ __forceinline__ void add_sink(float sink, float& inv_sum, float& lse) {
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.69314718055994531f;
  const float d = sink - lse;  // (-inf for a row that saw no key: e = 0, the factor 1)
  const float e = exp2_ftz(-fabsf(d) * kLog2e);
  float rcp, log2_1pe;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(rcp) : "f"(1.f + e));
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(log2_1pe) : "f"(1.f + e));
  inv_sum *= (d > 0.f ? e : 1.f) * rcp;
  lse = fmaf(log2_1pe, kLn2, d > 0.f ? sink : lse);
}

}  // namespace fa2
