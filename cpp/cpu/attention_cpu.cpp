// CPU implementation of fa2::fwd and fa2::bwd: the FlashAttention-2 algorithm on tiles, with the tile products on
// BLAS (cpu/blas.h; bf16's on bf16 operands where the CPU has bf16 products: cpu/bf16_dot.h or MKL), the softmax
// in vectorized row loops (cpu/row_ops.h), tile sizes from cpu/tile_config.h.
//
// Forward:  tasks (batch, head, query block); each loops over the key blocks its window reaches with the online
//           softmax (running max m, running sum l, unnormalized O in fp32/fp64; after a row's first key block, one
//           pass over each score tile) and stores lse = m + log l.
// Backward: recomputes P = exp(S - lse) tile by tile. Tasks own (batch, kv head, key-block range): dK and dV of
//           their key blocks (summed over the GQA group) stay in per-task accumulators; dQ goes to an fp32 (fp64)
//           buffer per key-range split, summed in a fixed order at the end, so gradients are bitwise reproducible.
// Memory is O(N): per-thread tiles, plus one (batch, nheads, seqlen_q, seqlen_k) buffer only when dbias is asked for.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "cpu/blas.h"
#include "cpu/parallel.h"
#include "cpu/row_ops.h"
#include "cpu/score_mods.h"
#include "cpu/tile_config.h"

namespace fa2::cpu {
namespace {

// fp32 accumulation for float, bfloat16 and float16; fp64 for double.
template <typename scalar_t>
using acc_type = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A (batch, seqlen, heads, headdim) tensor read through its strides (last dim contiguous, checked).
template <typename scalar_t>
struct HeadRows {
  const scalar_t* data;
  int64_t stride_b, stride_s, stride_h;

  explicit HeadRows(const at::Tensor& t)
      : data(t.const_data_ptr<scalar_t>()), stride_b(t.stride(0)), stride_s(t.stride(1)), stride_h(t.stride(2)) {}
  const scalar_t* row(int64_t b, int64_t s, int64_t h) const { return data + b * stride_b + s * stride_s + h * stride_h; }
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

// The same rows as bf16 bits for the bf16 tile products (cpu/blas.h, gemm_*_bf16): rows_for_blas without a conversion.
inline const uint16_t* bf16_bits_for_blas(const at::BFloat16* first, int64_t row_stride, int64_t rows, int64_t headdim,
                                          at::BFloat16* scratch, int64_t& ld) {
  return reinterpret_cast<const uint16_t*>(rows_for_blas(first, row_stride, rows, headdim, scratch, ld));
}

// One operand tile of the tile products, with BLAS's leading dimension: bf16 bits for the bf16 products
// (cpu/blas.h, gemm_*_bf16), else acc_t values. Exactly one of values / bits is set.
template <typename acc_t>
struct ProductTile {
  const acc_t* values = nullptr;
  const uint16_t* bits = nullptr;
  int64_t ld = 0;
};

// Rows [first, + rows) of q, k or v as a product tile: their bf16 bits when bf16_products (bf16_bits_for_blas, into
// bits_scratch where needed), else converted (rows_for_blas, into scratch).
template <typename scalar_t, typename acc_t>
ProductTile<acc_t> product_tile(const scalar_t* first, int64_t row_stride, int64_t rows, int64_t headdim,
                                bool bf16_products, acc_t* scratch, at::BFloat16* bits_scratch) {
  ProductTile<acc_t> tile;
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    if (bf16_products) {
      tile.bits = bf16_bits_for_blas(first, row_stride, rows, headdim, bits_scratch, tile.ld);
      return tile;
    }
  }
  tile.values = rows_for_blas(first, row_stride, rows, headdim, scratch, tile.ld);
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

// Query block visited by the t-th task of a head: 0, n-1, 1, n-2, ... at::parallel_for hands each thread a
// contiguous task range, and with a causal mask the block cost grows with its index; pairing cheap and costly
// blocks keeps the threads' shares equal.
int64_t balanced_block_order(int64_t t, int64_t n) { return t % 2 == 0 ? t / 2 : n - 1 - t / 2; }

// dst (cols x rows, row stride ld_dst) = src (rows x cols, row stride ld_src)ᵀ: bf16 bits, for the backward's products
// that take Pᵀ or dSᵀ as their left operand.
void transpose_bits(const uint16_t* src, int64_t ld_src, int64_t rows, int64_t cols, uint16_t* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------------------------

template <typename scalar_t>
void fwd_kernel(const AttentionProblem& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                at::Tensor& out, at::Tensor& lse) {
  using acc_t = acc_type<scalar_t>;
  const int64_t seqlen_q = p.seqlen_q, nheads = p.nheads, headdim = p.headdim;
  if (p.batch * nheads * seqlen_q == 0) return;  // nothing to write
  const int64_t group = nheads / p.nheads_k;
  const CpuTiles tiles = fwd_tiles(p.batch * nheads, seqlen_q, at::get_num_threads());
  const int64_t block_q = tiles.block_q, block_k = tiles.block_k;
  const int64_t num_q_blocks = ceil_div(seqlen_q, block_q);
  // The running max m is a reference point, not necessarily the exact max (see the one-pass softmax below):
  // lse = m + log l is exact either way. Natural-log units.
  constexpr acc_t kRescaleThreshold = 8;  // P <= e^8 ~ 3e3 between rescales
  constexpr acc_t kOverflowGuard = 80;    // float exp overflows past 88
  constexpr acc_t kNegInfinity = -std::numeric_limits<acc_t>::infinity();
  const auto mods = ScoreMods<acc_t>::from(p);
  const WindowMask& window = mods.window;
  const acc_t scale = static_cast<acc_t>(p.scale);
  const HeadRows<scalar_t> q_rows(q), k_rows(k), v_rows(v);
  scalar_t* out_data = out.data_ptr<scalar_t>();  // (batch, seqlen_q, nheads, headdim), contiguous
  float* lse_data = lse.data_ptr<float>();        // (batch, nheads, seqlen_q), contiguous
  // bf16 with bf16_gemm_available(): both products on bf16 operands (no conversion of Q, K, V; P rounded to bf16 for
  // P V, as the GPU kernels do; fp32 accumulation, softmax and O as before). Else every tile converted to acc_t for
  // sgemm / dgemm.
  constexpr bool kBf16 = std::is_same_v<scalar_t, at::BFloat16>;
  const bool bf16_products = kBf16 && bf16_gemm_available();

  parallel_for(0, p.batch * nheads * num_q_blocks, /*grain_size=*/1, [&](int64_t task_begin, int64_t task_end) {
    const int64_t pack_rows_q = bf16_products ? 0 : block_q, pack_rows_k = bf16_products ? 0 : block_k;
    std::vector<acc_t> q_pack(pack_rows_q * headdim);  // (block_q, headdim) when q needs converting
    std::vector<acc_t> k_pack(pack_rows_k * headdim);  // (block_k, headdim)
    std::vector<acc_t> v_pack(pack_rows_k * headdim);  // (block_k, headdim)
    // bf16_products: Q, K, V rows copied where their leading dim is not BLAS's, and P rounded
    const int64_t bits_rows_q = bf16_products ? block_q : 0, bits_rows_k = bf16_products ? block_k : 0;
    std::vector<at::BFloat16> q_bits_pack(bits_rows_q * headdim), k_bits_pack(bits_rows_k * headdim);
    std::vector<at::BFloat16> v_bits_pack(bits_rows_k * headdim);
    std::vector<uint16_t> p_bits(bits_rows_q * block_k);
    std::vector<acc_t> scores(block_q * block_k);      // (block_q, block_k): S, then P in place
    std::vector<acc_t> o_acc(block_q * headdim);       // (block_q, headdim): unnormalized O
    std::vector<acc_t> m(block_q), l(block_q);         // running reference max, row sum of exp(S - m)
    acc_t* s = scores.data();
    acc_t* o = o_acc.data();

    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t bh = task / num_q_blocks;
      const int64_t b = bh / nheads, h = bh % nheads, h_k = h / group;
      const int64_t q_begin = balanced_block_order(task % num_q_blocks, num_q_blocks) * block_q;
      const int64_t rows = std::min(block_q, seqlen_q - q_begin);
      const ProductTile<acc_t> q_tile = product_tile(q_rows.row(b, q_begin, h), q_rows.stride_s, rows, headdim,
                                                     bf16_products, q_pack.data(), q_bits_pack.data());
      std::fill(o, o + rows * headdim, acc_t(0));
      std::fill(m.begin(), m.begin() + rows, kNegInfinity);
      std::fill(l.begin(), l.begin() + rows, acc_t(0));

      // Keys outside [k_first, k_last] are masked for every row of the block: never loaded.
      const int64_t k_first = window.first_key(q_begin), k_last = window.last_key(q_begin + rows - 1);
      for (int64_t k_begin = k_first; k_begin <= k_last; k_begin += block_k) {
        const int64_t cols = std::min(block_k, k_last + 1 - k_begin);
        const ProductTile<acc_t> k_tile = product_tile(k_rows.row(b, k_begin, h_k), k_rows.stride_s, cols, headdim,
                                                       bf16_products, k_pack.data(), k_bits_pack.data());
        const ProductTile<acc_t> v_tile = product_tile(v_rows.row(b, k_begin, h_k), v_rows.stride_s, cols, headdim,
                                                       bf16_products, v_pack.data(), v_bits_pack.data());
        // S rows [r0, r0 + n) = scale · Q Kᵀ                                  (n, cols), row stride block_k
        auto scores = [&](int64_t r0, int64_t n) {
          product_abt(n, cols, headdim, scale, q_tile, r0, k_tile, s + r0 * block_k, block_k);
        };

        // -- S = scale · Q Kᵀ, then softcap, bias, mask                     (rows, cols)
        scores(0, rows);
        mods.apply(s, block_k, b, h, q_begin, rows, k_begin, cols, /*dtanh=*/nullptr);

        // -- P = exp(S - m), update m and l, rescale O by exp(m_old - m_new) when m moves
        for (int64_t r = 0; r < rows; ++r) {
          acc_t* s_row = s + r * block_k;
          const acc_t m_old = m[r];
          acc_t m_new, p_sum;
          if (m_old == kNegInfinity) {
            // first keys this row sees: exact max, then exp (two passes)
            m_new = row_max(s_row, cols);
            if (m_new == kNegInfinity) {
              if (any_nan(s_row, cols)) {
                m_new = std::numeric_limits<acc_t>::quiet_NaN();  // NaN in, NaN out (not "sees no key")
              } else {
                std::fill(s_row, s_row + cols, acc_t(0));  // nothing visible yet: P = 0, O and l stay 0
                continue;
              }
            }
            p_sum = exp_sub_sum(s_row, cols, m_new);
          } else {
            // One pass: P = exp(S - m_old) and the block max together; m only moves when the block max exceeds it
            // by more than kRescaleThreshold (P stays <= e^threshold, far from overflow, precision unchanged).
            // Dropping the separate max pass took the fp32 forward (1x8x2048x64, 1 thread) from 109 to 103 ms.
            acc_t block_max;
            p_sum = exp_sub_sum_max(s_row, cols, m_old, &block_max);
            m_new = m_old;
            if (block_max > m_old + kRescaleThreshold) {
              m_new = block_max;
              if (block_max - m_old <= kOverflowGuard) {
                const acc_t shift_p = std::exp(m_old - m_new);
                scale_row(s_row, cols, shift_p);
                p_sum *= shift_p;
              } else {
                // exp(S - m_old) overflowed: recompute this row of S (rare: a jump of > 80 in the logits)
                scores(r, 1);
                mods.apply(s_row, block_k, b, h, q_begin + r, 1, k_begin, cols, /*dtanh=*/nullptr);
                p_sum = exp_sub_sum(s_row, cols, m_new);
              }
              const acc_t alpha = std::exp(m_old - m_new);
              l[r] *= alpha;
              scale_row(o + r * headdim, headdim, alpha);
            }
          }
          l[r] += p_sum;
          m[r] = m_new;
        }

        // -- O += P V                                                          (rows, headdim)
        if (v_tile.bits != nullptr) {
          if constexpr (kBf16) {  // (P rounded to bf16, as the GPU kernels do)
            for (int64_t r = 0; r < rows; ++r) float_to_bf16_bits(s + r * block_k, p_bits.data() + r * block_k, cols);
            gemm_ab_bf16(rows, headdim, cols, 1.f, p_bits.data(), block_k, v_tile.bits, v_tile.ld, 1.f, o, headdim);
          }
        } else {
          gemm_ab<acc_t>(rows, headdim, cols, acc_t(1), s, block_k, v_tile.values, v_tile.ld, acc_t(1), o, headdim);
        }
      }

      // -- O /= l once; lse = m + log l. A row that saw no key (l == 0): O = 0, lse = +inf. NaN stays NaN.
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = q_begin + r;
        scalar_t* out_row = out_data + ((b * seqlen_q + i) * nheads + h) * headdim;
        float& lse_value = lse_data[(b * nheads + h) * seqlen_q + i];
        if (l[r] != acc_t(0)) {
          store_row(out_row, o + r * headdim, headdim, acc_t(1) / l[r]);
          lse_value = static_cast<float>(m[r] + std::log(l[r]));
        } else {
          std::fill(out_row, out_row + headdim, scalar_t(0));
          lse_value = std::numeric_limits<float>::infinity();
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------------------------

// How the backward's work is shared out: tasks are (batch, kv head) groups, each cut into `splits` ranges of key
// blocks of equal estimated cost. Every split owns an fp32 dQ accumulator, summed in split order at the end, so the
// result depends on the split count (a function of the shapes and the thread count), never on scheduling.
// Splits are added only while the group count alone leaves threads idle or unevenly loaded (at::parallel_for hands
// each thread a contiguous run of tasks), and at most kMaxSplits: each costs one more fp32 copy of dQ.
struct BwdPartition {
  static constexpr int64_t kMaxSplits = 8;
  int64_t splits = 1;
  std::vector<int64_t> split_begin;  // key-block index where split s starts; split_begin[splits] = num_k_blocks

  static BwdPartition make(int64_t num_groups, int64_t num_k_blocks, int64_t block_k, int64_t block_q, int64_t seqlen_k,
                           const WindowMask& window) {
    BwdPartition part;
    const int64_t threads = at::get_num_threads();
    while (part.splits < std::min(num_k_blocks, kMaxSplits) && (num_groups * part.splits) % threads != 0 &&
           num_groups * part.splits < 4 * threads) {
      ++part.splits;
    }
    // cost of a key block ~ query rows that see it, plus the fixed load/store of its dK, dV
    std::vector<int64_t> cumulative_cost(num_k_blocks + 1, 0);
    for (int64_t kb = 0; kb < num_k_blocks; ++kb) {
      const int64_t k_begin = kb * block_k, k_end = std::min(seqlen_k, k_begin + block_k);
      const int64_t query_rows = std::max<int64_t>(0, window.last_query(k_end - 1) - window.first_query(k_begin) + 1);
      cumulative_cost[kb + 1] = cumulative_cost[kb] + query_rows + block_q;
    }
    part.split_begin.assign(part.splits + 1, num_k_blocks);
    part.split_begin[0] = 0;
    int64_t kb = 0;
    for (int64_t s = 1; s < part.splits; ++s) {
      const int64_t target = cumulative_cost[num_k_blocks] * s / part.splits;
      while (kb < num_k_blocks && cumulative_cost[kb] < target) ++kb;
      part.split_begin[s] = kb;
    }
    return part;
  }
};

// A float32 lse = m + log l whose rounding (half a float spacing, 6e-5 at |lse| = 1024) is too coarse for
// P = exp(S - lse), or that overflowed float's range to -inf (fp64 scores): see inexact_rows in bwd_kernel.
constexpr float kLseExactLimit = 1024.f;
inline bool lse_is_inexact(float lse) {
  return lse == -std::numeric_limits<float>::infinity() || (std::isfinite(lse) && std::abs(lse) > kLseExactLimit);
}

template <typename scalar_t>
void bwd_kernel(const AttentionProblem& p, const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk,
                at::Tensor& dv, at::Tensor& dbias_full) {
  using acc_t = acc_type<scalar_t>;
  const int64_t batch = p.batch, seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k, nheads = p.nheads;
  const int64_t nheads_k = p.nheads_k, headdim = p.headdim;
  if (batch * nheads_k * seqlen_k == 0 && batch * nheads * seqlen_q == 0) return;
  const int64_t group = nheads_k == 0 ? 0 : nheads / nheads_k;
  const CpuTiles tiles = bwd_tiles();
  const int64_t block_q = tiles.block_q, block_k = tiles.block_k;
  const auto mods = ScoreMods<acc_t>::from(p);
  const WindowMask& window = mods.window;
  const acc_t scale = static_cast<acc_t>(p.scale);
  const HeadRows<scalar_t> q_rows(q), k_rows(k), v_rows(v), out_rows(out), dout_rows(dout);
  const float* lse_data = lse.const_data_ptr<float>();
  // bf16 with bf16_gemm_available(): the five tile products on bf16 operands, as the forward's (Q, K, V, dO as their
  // bits; P and dS rounded to bf16 for the products that take them, as the GPU kernels do; fp32 accumulation, softmax
  // gradient and dQ / dK / dV as before). Else every tile converted to acc_t for sgemm / dgemm.
  constexpr bool kBf16 = std::is_same_v<scalar_t, at::BFloat16>;
  const bool bf16_products = kBf16 && bf16_gemm_available();
  const int64_t lse_stride_b = lse.stride(0), lse_stride_h = lse.stride(1), lse_stride_q = lse.stride(2);
  acc_t* dbias_data = dbias_full.defined() ? dbias_full.data_ptr<acc_t>() : nullptr;  // (batch, nheads, sq, sk)

  // -- D = rowsum(dO ∘ O)                                                   (batch, nheads, seqlen_q)
  std::vector<acc_t> dout_dot_out(batch * nheads * seqlen_q);
  parallel_for(0, batch * nheads * seqlen_q, /*grain_size=*/256, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (nheads * seqlen_q), h = row / seqlen_q % nheads, i = row % seqlen_q;
      const scalar_t* o_row = out_rows.row(b, i, h);
      const scalar_t* do_row = dout_rows.row(b, i, h);
      acc_t sum = 0;
      for (int64_t d = 0; d < headdim; ++d) sum += static_cast<acc_t>(do_row[d]) * static_cast<acc_t>(o_row[d]);
      dout_dot_out[row] = sum;
    }
  });

  // -- Rows whose float32 lse cannot carry log l: P = exp(S - lse) needs lse = m + log l to ~1e-4, but a row whose
  //    scores are all huge (every key biased by finfo.min or -1e9: a "masked" row that still sees its keys
  //    equally) has |m| so large that m + log l rounds to m, and P would come out 1 instead of 1/l (l times too
  //    large gradients); an fp64 row below float's range stores lse = -inf (NaN gradients). Such rows get their
  //    statistics recomputed here, exactly, in acc_t, and P = exp(S - m) / l. Rare: one pass over the keys each.
  //    For fp64 every row takes this path: a float32 lse would cap its gradients at float's precision (~1e-7
  //    relative) and fp64 is the precision users check against; and an fp64 row above float's range stores
  //    lse = +inf, which reads as "sees no key" (the recomputation tells the two apart: no key gives l = 0).
  constexpr bool kExactEveryRow = std::is_same_v<acc_t, double>;
  const int64_t num_rows = batch * nheads * seqlen_q;
  std::vector<int64_t> inexact_rows;
  for (int64_t row = 0; row < num_rows; ++row) {
    const int64_t b = row / (nheads * seqlen_q), h = row / seqlen_q % nheads, i = row % seqlen_q;
    const float value = lse_data[b * lse_stride_b + h * lse_stride_h + i * lse_stride_q];
    if (kExactEveryRow ? !std::isnan(value) : lse_is_inexact(value)) inexact_rows.push_back(row);
  }
  // (batch, nheads, seqlen_q) when inexact rows exist, else empty; exact_row[row] != 0 for those rows
  std::vector<acc_t> exact_max, exact_inv_sum;
  std::vector<uint8_t> exact_row;
  if (!inexact_rows.empty()) {
    exact_max.assign(num_rows, acc_t(0));
    exact_inv_sum.assign(num_rows, acc_t(0));
    exact_row.assign(num_rows, 0);
    for (const int64_t row : inexact_rows) exact_row[row] = 1;
    parallel_for(0, static_cast<int64_t>(inexact_rows.size()), /*grain_size=*/1, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> q_pack(headdim), k_pack(block_k * headdim), s_row(block_k);
      std::vector<acc_t> dtanh_row(mods.softcap > 0 ? block_k : 0);
      for (int64_t n = begin; n < end; ++n) {
        const int64_t row = inexact_rows[n];
        const int64_t b = row / (nheads * seqlen_q), h = row / seqlen_q % nheads, i = row % seqlen_q;
        int64_t ldq, ldk;
        const acc_t* q_row = rows_for_blas(q_rows.row(b, i, h), q_rows.stride_s, 1, headdim, q_pack.data(), ldq);
        acc_t m = -std::numeric_limits<acc_t>::infinity(), l = 0;
        for (int64_t k_begin = 0; k_begin < seqlen_k; k_begin += block_k) {
          const int64_t cols = std::min(block_k, seqlen_k - k_begin);
          const acc_t* k_tile = rows_for_blas(k_rows.row(b, k_begin, h / group), k_rows.stride_s, cols, headdim,
                                              k_pack.data(), ldk);
          gemm_abt<acc_t>(1, cols, headdim, scale, q_row, ldq, k_tile, ldk, acc_t(0), s_row.data(), block_k);
          mods.apply(s_row.data(), block_k, b, h, i, 1, k_begin, cols, mods.softcap > 0 ? dtanh_row.data() : nullptr);
          const acc_t tile_max = *std::max_element(s_row.begin(), s_row.begin() + cols);
          if (!(tile_max > -std::numeric_limits<acc_t>::infinity())) continue;  // nothing visible here
          if (tile_max > m) {
            l *= std::exp(m - tile_max);
            m = tile_max;
          }
          for (int64_t j = 0; j < cols; ++j) l += std::exp(s_row[j] - m);
        }
        // (a row that sees no key: P = exp(-inf - 0) * 0 = 0, never exp(-inf + inf))
        exact_max[row] = l > 0 ? m : acc_t(0);
        exact_inv_sum[row] = l > 0 ? acc_t(1) / l : acc_t(0);
      }
    });
  }

  // -- dK, dV per key block; dQ into per-split accumulators                (splits, groups, group, seqlen_q, headdim)
  const int64_t num_groups = batch * nheads_k, num_k_blocks = ceil_div(seqlen_k, block_k);
  const BwdPartition part = BwdPartition::make(num_groups, num_k_blocks, block_k, block_q, seqlen_k, window);
  const int64_t group_dq_size = group * seqlen_q * headdim;
  std::vector<acc_t> dq_acc(part.splits * num_groups * group_dq_size, acc_t(0));
  scalar_t* dk_data = dk.data_ptr<scalar_t>();  // (batch, seqlen_k, nheads_k, headdim), each by its strides
  scalar_t* dv_data = dv.data_ptr<scalar_t>();

  parallel_for(0, num_groups * part.splits, /*grain_size=*/1, [&](int64_t task_begin, int64_t task_end) {
    const int64_t pack_q = bf16_products ? 0 : block_q, pack_k = bf16_products ? 0 : block_k;
    std::vector<acc_t> q_pack(pack_q * headdim), dout_pack(pack_q * headdim);  // (block_q, headdim) to convert
    std::vector<acc_t> k_pack(pack_k * headdim), v_pack(pack_k * headdim);     // (block_k, headdim)
    // bf16_products: Q, dO, K, V rows copied where their leading dim is not BLAS's; P, dS rounded (rows, cols) and
    // their transposes (cols, rows)
    const int64_t bits_q = bf16_products ? block_q : 0, bits_k = bf16_products ? block_k : 0;
    std::vector<at::BFloat16> q_bits_pack(bits_q * headdim), dout_bits_pack(bits_q * headdim);
    std::vector<at::BFloat16> k_bits_pack(bits_k * headdim), v_bits_pack(bits_k * headdim);
    std::vector<uint16_t> scores_bits(bits_q * block_k), scores_bits_t(bits_k * block_q);
    std::vector<acc_t> dk_acc(block_k * headdim), dv_acc(block_k * headdim);     // (block_k, headdim)
    std::vector<acc_t> p_tile(block_q * block_k);                                // (block_q, block_k): S, then P
    std::vector<acc_t> ds_tile(block_q * block_k);                               // (block_q, block_k): dP, then dS
    std::vector<acc_t> dtanh_tile(mods.softcap > 0 ? block_q * block_k : 0);    // (block_q, block_k)
    acc_t* pt = p_tile.data();
    acc_t* ds = ds_tile.data();
    acc_t* dtanh = mods.softcap > 0 ? dtanh_tile.data() : nullptr;

    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t group_index = task / part.splits, split = task % part.splits;
      const int64_t b = group_index / nheads_k, h_k = group_index % nheads_k;
      acc_t* dq_split = dq_acc.data() + (split * num_groups + group_index) * group_dq_size;  // (group, sq, headdim)

      for (int64_t kb = part.split_begin[split]; kb < part.split_begin[split + 1]; ++kb) {
        const int64_t k_begin = kb * block_k, cols = std::min(block_k, seqlen_k - k_begin);
        const ProductTile<acc_t> k_tile = product_tile(k_rows.row(b, k_begin, h_k), k_rows.stride_s, cols, headdim,
                                                       bf16_products, k_pack.data(), k_bits_pack.data());
        const ProductTile<acc_t> v_tile = product_tile(v_rows.row(b, k_begin, h_k), v_rows.stride_s, cols, headdim,
                                                       bf16_products, v_pack.data(), v_bits_pack.data());
        std::fill(dk_acc.begin(), dk_acc.begin() + cols * headdim, acc_t(0));
        std::fill(dv_acc.begin(), dv_acc.begin() + cols * headdim, acc_t(0));

        // Queries outside [q_first, q_last] see none of these keys: skipped.
        const int64_t q_first = window.first_query(k_begin), q_last = window.last_query(k_begin + cols - 1);
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = h_k * group + g;
          for (int64_t q_begin = q_first; q_begin <= q_last; q_begin += block_q) {
            const int64_t rows = std::min(block_q, q_last + 1 - q_begin);
            const ProductTile<acc_t> q_tile = product_tile(q_rows.row(b, q_begin, h), q_rows.stride_s, rows, headdim,
                                                           bf16_products, q_pack.data(), q_bits_pack.data());
            const ProductTile<acc_t> do_tile = product_tile(dout_rows.row(b, q_begin, h), dout_rows.stride_s, rows,
                                                            headdim, bf16_products, dout_pack.data(),
                                                            dout_bits_pack.data());
            // (bf16_products) x (rows, cols; row stride block_k) rounded to bf16 into scores_bits, and its transpose
            // (cols, rows; row stride block_q) into scores_bits_t
            auto round_to_bits = [&](const acc_t* x, bool transposed) {
              if constexpr (kBf16) {
                for (int64_t r = 0; r < rows; ++r) {
                  float_to_bf16_bits(x + r * block_k, scores_bits.data() + r * block_k, cols);
                }
                if (transposed) transpose_bits(scores_bits.data(), block_k, rows, cols, scores_bits_t.data(), block_q);
              }
            };

            // (query i's visible keys all lie in this key block)
            auto sees_only_this_block = [&](int64_t i) {
              return window.first_key(i) >= k_begin && window.last_key(i) < k_begin + cols;
            };
            // -- recompute S = scale · Q Kᵀ (softcap, bias, mask) and P = exp(S - lse)   (rows, cols)
            product_abt(rows, cols, headdim, scale, q_tile, 0, k_tile, pt, block_k);
            mods.apply(pt, block_k, b, h, q_begin, rows, k_begin, cols, dtanh);
            for (int64_t r = 0; r < rows; ++r) {
              // lse = +inf (row sees no key) gives P = 0, hence zero gradients for the row
              const int64_t row = (b * nheads + h) * seqlen_q + q_begin + r;
              acc_t* p_row = pt + r * block_k;
              if (exact_row.empty() || !exact_row[row]) {
                const float row_lse = lse_data[b * lse_stride_b + h * lse_stride_h + (q_begin + r) * lse_stride_q];
                exp_sub_sum(p_row, cols, static_cast<acc_t>(row_lse));
              } else if (sees_only_this_block(q_begin + r)) {
                // (see inexact_rows above) the statistics from this tile's own S: inexact_rows' recomputation sums
                // in another order, and at |S| ~ 1e4 (a key padded by -1e4) one float spacing is 1e-3, so a row that
                // sees a single key got P = 1 +- 1e-3 and dS = P dP (1 - P) != 0 (CI: dq 2.5e-4-8.9e-4 where it is 0)
                const acc_t m = row_max(p_row, cols);
                if (m > -std::numeric_limits<acc_t>::infinity()) {
                  scale_row(p_row, cols, acc_t(1) / exp_sub_sum(p_row, cols, m));
                } else {
                  std::fill(p_row, p_row + cols, acc_t(0));  // sees no key
                }
              } else {
                exp_sub_sum(p_row, cols, exact_max[row]);
                scale_row(p_row, cols, exact_inv_sum[row]);
              }
            }

            // -- dV += Pᵀ dO                                                       (cols, headdim)
            if (bf16_products) {
              if constexpr (kBf16) {  // (acc_t is float)
                round_to_bits(pt, /*transposed=*/true);
                gemm_ab_bf16(cols, headdim, rows, 1.f, scores_bits_t.data(), block_q, do_tile.bits, do_tile.ld, 1.f,
                             dv_acc.data(), headdim);
              }
            } else {
              gemm_atb<acc_t>(cols, headdim, rows, acc_t(1), pt, block_k, do_tile.values, do_tile.ld, acc_t(1),
                              dv_acc.data(), headdim);
            }

            // -- dP = dO Vᵀ, dS = P ∘ (dP - D)                                      (rows, cols)
            product_abt(rows, cols, headdim, acc_t(1), do_tile, 0, v_tile, ds, block_k);
            const acc_t* row_d = dout_dot_out.data() + (b * nheads + h) * seqlen_q + q_begin;
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t i = q_begin + r;
              acc_t* ds_row = ds + r * block_k;
              const acc_t* p_row = pt + r * block_k;
              // D_i = rowsum(dO ∘ O) = Σ_j P_ij dP_ij. When all keys row i sees lie in this block, take the second
              // form from this tile: it carries dP's own rounding, so dS is exactly 0 where P is one-hot (a row that
              // sees a single key), as in exact arithmetic, instead of the difference of two roundings.
              softmax_grad_row(ds_row, p_row, cols, sees_only_this_block(i) ? dot_row(p_row, ds_row, cols) : row_d[r]);
            }
            if (dbias_data != nullptr) {  // the bias enters after softcap: its gradient is dS itself
              for (int64_t r = 0; r < rows; ++r) {
                acc_t* dst = dbias_data + ((b * nheads + h) * seqlen_q + q_begin + r) * seqlen_k + k_begin;
                std::copy(ds + r * block_k, ds + r * block_k + cols, dst);
              }
            }
            // -- back through softcap: d(cap · tanh(x / cap))/dx = 1 - tanh²
            if (dtanh != nullptr) {
              for (int64_t r = 0; r < rows; ++r) mul_row(ds + r * block_k, dtanh + r * block_k, cols);
            }

            // -- dK += scale · dSᵀ Q                                                (cols, headdim)
            // -- dQ += scale · dS K                                                 (rows, headdim)
            acc_t* dq_rows = dq_split + (g * seqlen_q + q_begin) * headdim;
            if (bf16_products) {
              if constexpr (kBf16) {
                round_to_bits(ds, /*transposed=*/true);
                gemm_ab_bf16(cols, headdim, rows, scale, scores_bits_t.data(), block_q, q_tile.bits, q_tile.ld, 1.f,
                             dk_acc.data(), headdim);
                gemm_ab_bf16(rows, headdim, cols, scale, scores_bits.data(), block_k, k_tile.bits, k_tile.ld, 1.f,
                             dq_rows, headdim);
              }
            } else {
              gemm_atb<acc_t>(cols, headdim, rows, scale, ds, block_k, q_tile.values, q_tile.ld, acc_t(1),
                              dk_acc.data(), headdim);
              gemm_ab<acc_t>(rows, headdim, cols, scale, ds, block_k, k_tile.values, k_tile.ld, acc_t(1), dq_rows,
                             headdim);
            }
          }
        }

        // -- store dK, dV of this key block (summed over the group's query heads)
        for (int64_t r = 0; r < cols; ++r) {
          const int64_t key = k_begin + r;
          store_row(dk_data + b * dk.stride(0) + key * dk.stride(1) + h_k * dk.stride(2), dk_acc.data() + r * headdim,
                    headdim, acc_t(1));
          store_row(dv_data + b * dv.stride(0) + key * dv.stride(1) + h_k * dv.stride(2), dv_acc.data() + r * headdim,
                    headdim, acc_t(1));
        }
      }
    }
  });

  // -- dQ = Σ over splits, in split order                                   (batch, seqlen_q, nheads, headdim)
  scalar_t* dq_data = dq.data_ptr<scalar_t>();
  parallel_for(0, batch * seqlen_q * nheads, /*grain_size=*/64, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> sum(headdim);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (seqlen_q * nheads), i = row / nheads % seqlen_q, h = row % nheads;
      const int64_t group_index = b * nheads_k + h / group, g = h % group;
      std::fill(sum.begin(), sum.end(), acc_t(0));
      for (int64_t split = 0; split < part.splits; ++split) {
        const acc_t* src = dq_acc.data() + (split * num_groups + group_index) * group_dq_size + (g * seqlen_q + i) * headdim;
        for (int64_t d = 0; d < headdim; ++d) sum[d] += src[d];
      }
      store_row(dq_data + b * dq.stride(0) + i * dq.stride(1) + h * dq.stride(2), sum.data(), headdim, acc_t(1));
    }
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Ops
// ---------------------------------------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const std::optional<at::Tensor>& attn_bias, std::optional<double> scale,
                                           bool causal, int64_t window_left, int64_t window_right, double softcap) {
  const AttentionProblem p = check_fwd_inputs(q, k, v, attn_bias, scale, causal, window_left, window_right, softcap);
  at::Tensor out = at::empty({p.batch, p.seqlen_q, p.nheads, p.headdim}, q.options());
  at::Tensor lse = at::empty({p.batch, p.nheads, p.seqlen_q}, q.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "fa2_fwd_cpu",
                                  [&] { fwd_kernel<scalar_t>(p, q, k, v, out, lse); });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bwd_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& attn_bias, std::optional<double> scale, bool causal,
    int64_t window_left, int64_t window_right, double softcap, bool bias_requires_grad, bool deterministic) {
  // Always deterministic on the CPU (see BwdPartition), so `deterministic` needs no separate path.
  (void)deterministic;
  const AttentionProblem p = check_bwd_inputs(dout, q, k, v, out, lse, attn_bias, scale, causal, window_left,
                                              window_right, softcap, bias_requires_grad);
  at::Tensor dq = empty_grad_like(q), dk = empty_grad_like(k), dv = empty_grad_like(v);  // (written by strides)
  // dS with respect to the bias, full size (the one O(N²) buffer), in the accumulation dtype; zero where masked.
  const auto acc_dtype = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor dbias_full;
  if (bias_requires_grad) {
    dbias_full = at::zeros({p.batch, p.nheads, p.seqlen_q, p.seqlen_k}, q.options().dtype(acc_dtype));
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "fa2_bwd_cpu", [&] {
    bwd_kernel<scalar_t>(p, dout, q, k, v, out, lse, dq, dk, dv, dbias_full);
  });
  at::Tensor dbias = bias_requires_grad ? reduce_dbias(dbias_full, *attn_bias) : at::empty({0}, q.options());
  return {dq, dk, dv, dbias};
}

}  // namespace
}  // namespace fa2::cpu

TORCH_LIBRARY_IMPL(fa2, CPU, m) {
  m.impl("fwd", &fa2::cpu::fwd_cpu);
  m.impl("bwd", &fa2::cpu::bwd_cpu);
}
