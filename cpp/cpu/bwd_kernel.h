// The CPU backward: recomputes P = exp(S - lse) tile by tile. Tasks own (batch, kv head, key-block range): dK and dV
// of their key blocks (summed over the GQA group) stay in per-task accumulators; dQ goes to an fp32 (fp64) buffer
// per key-range split, summed in a fixed order at the end, so gradients are bitwise reproducible.
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "cpu/blas.h"
#include "cpu/dropout.h"
#include "cpu/operand_tiles.h"
#include "cpu/parallel.h"
#include "cpu/row_ops.h"
#include "cpu/score_mods.h"
#include "cpu/tile_config.h"

namespace fa2::cpu {
namespace {

// The backward's inputs, outputs and tile sizes, as every task reads them.
template <typename scalar_t>
struct BwdProblem {
  using acc_t = acc_type<scalar_t>;
  int64_t batch, seqlen_q, seqlen_k, nheads, nheads_k, group;
  int64_t headdim, headdim_v;  // q's and k's (dq, dk); v's (out, dout, dv)
  CpuTiles tiles;
  ScoreMods<acc_t> mods;
  acc_t scale;
  CpuDropout dropout;
  HeadRows<const scalar_t> q_rows, k_rows, v_rows, out_rows, dout_rows;
  HeadRows<scalar_t> dk_rows, dv_rows;  // (batch, seqlen_k, nheads_k, headdim | headdim_v)
  const float* lse_data;
  int64_t lse_stride_b, lse_stride_h, lse_stride_q;
  acc_t* dbias_data;  // (batch, nheads, seqlen_q, seqlen_k), or null when dbias is not asked for
  // bf16 with bf16_gemm_available() and bf16_products_for_full_tiles(): the five tile products on bf16 operands, as
  // the forward's (Q, K, V, dO as their bits; P and dS rounded to bf16 for the products that take them, as the GPU
  // kernels do; fp32 accumulation, softmax gradient and dQ / dK / dV as for the other dtypes). Else every tile
  // converted to acc_t for sgemm / dgemm.
  bool bf16_products;

  BwdProblem(const AttentionProblem& p, const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
             const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, at::Tensor& dk, at::Tensor& dv,
             at::Tensor& dbias_full, int64_t dropout_batch0)
      : batch(p.batch),
        seqlen_q(p.seqlen_q),
        seqlen_k(p.seqlen_k),
        nheads(p.nheads),
        nheads_k(p.nheads_k),
        group(p.nheads_k == 0 ? 0 : p.nheads / p.nheads_k),
        headdim(p.headdim),
        headdim_v(p.headdim_v),
        tiles(bwd_tiles()),
        mods(ScoreMods<acc_t>::from(p)),
        scale(static_cast<acc_t>(p.scale)),
        dropout(CpuDropout::from(p, dropout_batch0)),
        q_rows(q),
        k_rows(k),
        v_rows(v),
        out_rows(out),
        dout_rows(dout),
        dk_rows(dk),
        dv_rows(dv),
        lse_data(lse.const_data_ptr<float>()),
        lse_stride_b(lse.stride(0)),
        lse_stride_h(lse.stride(1)),
        lse_stride_q(lse.stride(2)),
        dbias_data(dbias_full.defined() ? dbias_full.data_ptr<acc_t>() : nullptr),
        bf16_products(std::is_same_v<scalar_t, at::BFloat16> && bf16_gemm_available() &&
                      bf16_products_for_full_tiles()) {}

  float lse(int64_t b, int64_t h, int64_t i) const {
    return lse_data[b * lse_stride_b + h * lse_stride_h + i * lse_stride_q];
  }
  // Index of query row (b, h, i) in the (batch, nheads, seqlen_q) per-row arrays.
  int64_t row_index(int64_t b, int64_t h, int64_t i) const { return (b * nheads + h) * seqlen_q + i; }
  int64_t num_rows() const { return batch * nheads * seqlen_q; }
};

// -- D = rowsum(dO ∘ O)                                                     (batch, nheads, seqlen_q)
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
std::vector<acc_t> rowsum_dout_out(const BwdProblem<scalar_t>& bp) {
  std::vector<acc_t> dout_dot_out(bp.num_rows());
  parallel_for(0, bp.num_rows(), /*grain_size=*/256, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (bp.nheads * bp.seqlen_q), h = row / bp.seqlen_q % bp.nheads, i = row % bp.seqlen_q;
      const scalar_t* o_row = bp.out_rows.row(b, i, h);
      const scalar_t* do_row = bp.dout_rows.row(b, i, h);
      acc_t sum = 0;
      for (int64_t d = 0; d < bp.headdim_v; ++d) sum += static_cast<acc_t>(do_row[d]) * static_cast<acc_t>(o_row[d]);
      dout_dot_out[row] = sum;
    }
  });
  return dout_dot_out;
}

// A float32 lse = m + log l whose rounding (half a float spacing, 6e-5 at |lse| = 1024) is too coarse for
// P = exp(S - lse), or that overflowed float's range to -inf (fp64 scores): see ExactRowStats.
constexpr float kLseExactLimit = 1024.f;
inline bool lse_is_inexact(float lse) {
  return lse == -std::numeric_limits<float>::infinity() || (std::isfinite(lse) && std::abs(lse) > kLseExactLimit);
}

// Whether a finite float32 lse is this call's own: own - lse, the row's own statistics from this call's keys
// (own = m + log l) less the given lse, within `spacings` float spacings of max(1, |lse|). Beyond that, lse was taken
// with more in its denominator (a sink's share, ring attention's other chunks), which P = exp(S - lse) must keep.
inline bool lse_is_own(double own_minus_given, float lse, double spacings) {
  return std::isfinite(lse) && std::abs(own_minus_given) <= spacings * std::numeric_limits<float>::epsilon() *
                                                                std::max(1.0, std::abs(static_cast<double>(lse)));
}

// Rows whose float32 lse cannot carry log l: P = exp(S - lse) needs lse = m + log l to ~1e-4, but a row whose scores
// are all huge (every key biased by finfo.min or -1e9: a "masked" row that still sees its keys equally) has |m| so
// large that m + log l rounds to m, and P would come out 1 instead of 1/l (l times too large gradients); an fp64 row
// below float's range stores lse = -inf (NaN gradients). Such rows get their statistics recomputed, exactly, in
// acc_t, and P = exp(S - m) / l. Rare: one pass over the keys each.
// For fp64 every row takes this path: a float32 lse would cap its gradients at float's precision (~1e-7 relative)
// and fp64 is the precision users check against; and an fp64 row above float's range stores lse = +inf, which reads
// as "sees no key" (the recomputation tells the two apart: no key gives l = 0).
template <typename acc_t>
struct ExactRowStats {
  // (batch, nheads, seqlen_q) when such rows exist, else empty; is_exact[row] != 0 for those rows
  std::vector<acc_t> max, inv_sum;
  std::vector<uint8_t> is_exact;

  bool has(int64_t row) const { return !is_exact.empty() && is_exact[row]; }
};

// The exact softmax statistics of query row (b, h, i) from one pass over its keys: max m and 1 / l, both 0 when the
// row sees no key (then P = exp(-inf - 0) * 0 = 0, never exp(-inf + inf)).
template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
void exact_row_statistics(const BwdProblem<scalar_t>& bp, int64_t b, int64_t h, int64_t i, acc_t* q_pack,
                          acc_t* k_pack, acc_t* s_row, acc_t* dtanh_row, acc_t& max, acc_t& inv_sum) {
  const int64_t block_k = bp.tiles.block_k, headdim = bp.headdim;
  int64_t ldq, ldk;
  const acc_t* q_row = rows_for_blas(bp.q_rows.row(b, i, h), bp.q_rows.stride_s, 1, headdim, q_pack, ldq);
  acc_t m = -std::numeric_limits<acc_t>::infinity(), l = 0;
  for (int64_t k_begin = 0; k_begin < bp.seqlen_k; k_begin += block_k) {
    const int64_t cols = std::min(block_k, bp.seqlen_k - k_begin);
    const acc_t* k_tile = rows_for_blas(bp.k_rows.row(b, k_begin, h / bp.group), bp.k_rows.stride_s, cols, headdim,
                                        k_pack, ldk);
    gemm_abt<acc_t>(1, cols, headdim, bp.scale, q_row, ldq, k_tile, ldk, acc_t(0), s_row, block_k);
    bp.mods.apply(s_row, block_k, b, h, i, 1, k_begin, cols, dtanh_row);
    const acc_t tile_max = *std::max_element(s_row, s_row + cols);
    if (!(tile_max > -std::numeric_limits<acc_t>::infinity())) continue;  // nothing visible here
    if (tile_max > m) {
      l *= std::exp(m - tile_max);
      m = tile_max;
    }
    for (int64_t j = 0; j < cols; ++j) l += std::exp(s_row[j] - m);
  }
  max = l > 0 ? m : acc_t(0);
  inv_sum = l > 0 ? acc_t(1) / l : acc_t(0);
}

template <typename scalar_t, typename acc_t = acc_type<scalar_t>>
ExactRowStats<acc_t> exact_row_stats(const BwdProblem<scalar_t>& bp) {
  constexpr bool kExactEveryRow = std::is_same_v<acc_t, double>;
  const int64_t num_rows = bp.num_rows();
  std::vector<int64_t> inexact_rows;
  for (int64_t row = 0; row < num_rows; ++row) {
    const int64_t b = row / (bp.nheads * bp.seqlen_q), h = row / bp.seqlen_q % bp.nheads, i = row % bp.seqlen_q;
    const float value = bp.lse(b, h, i);
    if (kExactEveryRow ? !std::isnan(value) : lse_is_inexact(value)) inexact_rows.push_back(row);
  }
  ExactRowStats<acc_t> stats;
  if (inexact_rows.empty()) return stats;
  stats.max.assign(num_rows, acc_t(0));
  stats.inv_sum.assign(num_rows, acc_t(0));
  stats.is_exact.assign(num_rows, 0);
  for (const int64_t row : inexact_rows) stats.is_exact[row] = 1;
  const int64_t block_k = bp.tiles.block_k, headdim = bp.headdim;
  const bool softcap = bp.mods.softcap > 0;
  parallel_for(0, static_cast<int64_t>(inexact_rows.size()), /*grain_size=*/1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> q_pack(headdim), k_pack(block_k * headdim), s_row(block_k), dtanh_row(softcap ? block_k : 0);
    for (int64_t n = begin; n < end; ++n) {
      const int64_t row = inexact_rows[n];
      const int64_t b = row / (bp.nheads * bp.seqlen_q), h = row / bp.seqlen_q % bp.nheads, i = row % bp.seqlen_q;
      exact_row_statistics(bp, b, h, i, q_pack.data(), k_pack.data(), s_row.data(),
                           softcap ? dtanh_row.data() : nullptr, stats.max[row], stats.inv_sum[row]);
      // A finite lse that is not this call's own (beyond float rounding) was taken over more keys (ring attention's
      // chunks): P = exp(S - lse) from it, not this call's statistics.
      const float given = bp.lse(b, h, i);
      const double own = stats.max[row] - std::log(static_cast<double>(stats.inv_sum[row]));
      if (std::isfinite(given) && stats.inv_sum[row] > 0 && !lse_is_own(own - given, given, /*spacings=*/8)) {
        stats.is_exact[row] = 0;
      }
    }
  });
  return stats;
}

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

// One thread's backward: its tiles, and the steps of one key block and of one (query block, key block) tile.
template <typename scalar_t>
class BwdWorker {
  using acc_t = acc_type<scalar_t>;
  static constexpr bool kBf16 = std::is_same_v<scalar_t, at::BFloat16>;

 public:
  BwdWorker(const BwdProblem<scalar_t>& problem, const ExactRowStats<acc_t>& exact, const acc_t* dout_dot_out)
      : bp_(problem),
        exact_(exact),
        dout_dot_out_(dout_dot_out),
        block_q_(problem.tiles.block_q),
        block_k_(problem.tiles.block_k),
        headdim_(problem.headdim),
        headdim_v_(problem.headdim_v) {
    const bool bf16 = bp_.bf16_products;
    // converted rows when the tiles are acc_t; copied bf16 rows (where their leading dim is not BLAS's), P and dS
    // rounded (rows, cols) and their transposes (cols, rows) when they are bf16
    q_pack_.resize((bf16 ? 0 : block_q_) * headdim_);
    dout_pack_.resize((bf16 ? 0 : block_q_) * headdim_v_);
    k_pack_.resize((bf16 ? 0 : block_k_) * headdim_);
    v_pack_.resize((bf16 ? 0 : block_k_) * headdim_v_);
    q_bits_pack_.resize((bf16 ? block_q_ : 0) * headdim_);
    dout_bits_pack_.resize((bf16 ? block_q_ : 0) * headdim_v_);
    k_bits_pack_.resize((bf16 ? block_k_ : 0) * headdim_);
    v_bits_pack_.resize((bf16 ? block_k_ : 0) * headdim_v_);
    scores_bits_.resize((bf16 ? block_q_ : 0) * block_k_);
    scores_bits_t_.resize((bf16 ? block_k_ : 0) * block_q_);
    dk_acc_.resize(block_k_ * headdim_);
    dv_acc_.resize(block_k_ * headdim_v_);
    p_tile_.resize(block_q_ * block_k_);
    ds_tile_.resize(block_q_ * block_k_);
    dtanh_tile_.resize(bp_.mods.softcap > 0 ? block_q_ * block_k_ : 0);
    keep_.resize(bp_.dropout.enabled ? block_q_ * block_k_ : 0);
    dropped_p_tile_.resize(bp_.dropout.enabled ? block_q_ * block_k_ : 0);
  }

  // dK, dV of keys [k_begin, k_begin + block_k) of kv head (b, h_k), summed over the group's query heads; their
  // share of dQ added into dq_split (group, seqlen_q, headdim).
  void key_block(int64_t b, int64_t h_k, int64_t k_begin, acc_t* dq_split) {
    const int64_t cols = std::min(block_k_, bp_.seqlen_k - k_begin);
    const ProductTile<acc_t> k_tile = product_tile(bp_.k_rows.row(b, k_begin, h_k), bp_.k_rows.stride_s, cols,
                                                   headdim_, bp_.bf16_products, k_pack_.data(), k_bits_pack_.data());
    const ProductTile<acc_t> v_tile = product_tile(bp_.v_rows.row(b, k_begin, h_k), bp_.v_rows.stride_s, cols,
                                                   headdim_v_, bp_.bf16_products, v_pack_.data(), v_bits_pack_.data());
    std::fill(dk_acc_.begin(), dk_acc_.begin() + cols * headdim_, acc_t(0));
    std::fill(dv_acc_.begin(), dv_acc_.begin() + cols * headdim_v_, acc_t(0));

    // Queries outside [q_first, q_last] see none of these keys: skipped.
    const WindowMask& window = bp_.mods.window;
    const int64_t q_first = window.first_query(k_begin), q_last = window.last_query(k_begin + cols - 1);
    for (int64_t g = 0; g < bp_.group; ++g) {
      const int64_t h = h_k * bp_.group + g;
      for (int64_t q_begin = q_first; q_begin <= q_last; q_begin += block_q_) {
        const Tile tile{b, h, q_begin, std::min(block_q_, q_last + 1 - q_begin), k_begin, cols};
        query_block(tile, k_tile, v_tile, dq_split + (g * bp_.seqlen_q + q_begin) * headdim_);
      }
    }

    // -- store dK, dV of this key block
    for (int64_t r = 0; r < cols; ++r) {
      store_row(bp_.dk_rows.row(b, k_begin + r, h_k), dk_acc_.data() + r * headdim_, headdim_, acc_t(1));
      store_row(bp_.dv_rows.row(b, k_begin + r, h_k), dv_acc_.data() + r * headdim_v_, headdim_v_, acc_t(1));
    }
  }

 private:
  // Query rows [q_begin, + rows) of head (b, h) against keys [k_begin, + cols).
  struct Tile {
    int64_t b, h, q_begin, rows, k_begin, cols;
    // (query i's visible keys all lie in this key block)
    bool holds_every_key_of(const WindowMask& window, int64_t i) const {
      return window.first_key(i) >= k_begin && window.last_key(i) < k_begin + cols;
    }
  };

  // One tile's share of dV, dK (into dv_acc, dk_acc) and of dQ (into dq_rows, (rows, headdim)).
  void query_block(const Tile& t, const ProductTile<acc_t>& k_tile, const ProductTile<acc_t>& v_tile, acc_t* dq_rows) {
    const int64_t b = t.b, h = t.h, q_begin = t.q_begin, rows = t.rows, cols = t.cols;
    const ProductTile<acc_t> q_tile = product_tile(bp_.q_rows.row(b, q_begin, h), bp_.q_rows.stride_s, rows,
                                                   headdim_, bp_.bf16_products, q_pack_.data(), q_bits_pack_.data());
    const ProductTile<acc_t> do_tile = product_tile(bp_.dout_rows.row(b, q_begin, h), bp_.dout_rows.stride_s, rows,
                                                    headdim_v_, bp_.bf16_products, dout_pack_.data(),
                                                    dout_bits_pack_.data());
    acc_t* p = p_tile_.data();
    acc_t* ds = ds_tile_.data();
    acc_t* dtanh = bp_.mods.softcap > 0 ? dtanh_tile_.data() : nullptr;

    // -- recompute S = scale · Q Kᵀ (softcap, bias, mask) and P = exp(S - lse)   (rows, cols)
    product_abt(rows, cols, headdim_, bp_.scale, q_tile, 0, k_tile, p, block_k_);
    bp_.mods.apply(p, block_k_, b, h, q_begin, rows, t.k_begin, cols, dtanh);
    for (int64_t r = 0; r < rows; ++r) probabilities_row(t, r, p + r * block_k_);
    // -- dropout: the forward's mask Z (from the coordinates); dV takes P ∘ Z / (1 - p)
    const acc_t* p_dv = p;
    const acc_t keep_scale = static_cast<acc_t>(bp_.dropout.keep_scale);
    if (bp_.dropout.enabled) {
      bp_.dropout.keep_tile(b, h, q_begin, rows, t.k_begin, cols, keep_.data(), block_k_);
      for (int64_t r = 0; r < rows; ++r) {
        apply_keep_row(p + r * block_k_, keep_.data() + r * block_k_, cols, keep_scale,
                       dropped_p_tile_.data() + r * block_k_);
      }
      p_dv = dropped_p_tile_.data();
    }

    // -- dV += (P ∘ Z / (1 - p))ᵀ dO                                         (cols, headdim_v)
    if (bp_.bf16_products) {
      if constexpr (kBf16) {  // (acc_t is float)
        round_to_bf16(p_dv, rows, cols);
        gemm_ab_bf16(cols, headdim_v_, rows, 1.f, scores_bits_t_.data(), block_q_, do_tile.bits, do_tile.ld, 1.f,
                     dv_acc_.data(), headdim_v_);
      }
    } else {
      gemm_atb<acc_t>(cols, headdim_v_, rows, acc_t(1), p_dv, block_k_, do_tile.values, do_tile.ld, acc_t(1),
                      dv_acc_.data(), headdim_v_);
    }

    // -- dP = dO Vᵀ (∘ Z / (1 - p) with dropout: the gradient reaching P), dS = P ∘ (dP - D)     (rows, cols)
    product_abt(rows, cols, headdim_v_, acc_t(1), do_tile, 0, v_tile, ds, block_k_);
    if (bp_.dropout.enabled) {
      for (int64_t r = 0; r < rows; ++r) {
        apply_keep_row(ds + r * block_k_, keep_.data() + r * block_k_, cols, keep_scale, ds + r * block_k_);
      }
    }
    const acc_t* row_d = dout_dot_out_ + bp_.row_index(b, h, q_begin);
    for (int64_t r = 0; r < rows; ++r) {
      acc_t* ds_row = ds + r * block_k_;
      const acc_t* p_row = p + r * block_k_;
      // D_i = rowsum(dO ∘ O) = Σ_j P_ij dP_ij. When all keys row i sees lie in this block, take the second form from
      // this tile: it carries dP's own rounding, so dS is exactly 0 where P is one-hot (a row that sees a single
      // key), as in exact arithmetic, instead of the difference of two roundings.
      // (only where this call's keys carry the row's whole softmax: out and lse may come from more keys, as in ring
      // attention's chunks, and then only rowsum(dO ∘ O) is D)
      const bool own_sum = t.holds_every_key_of(bp_.mods.window, q_begin + r) && sums_to_one(p_row, cols);
      softmax_grad_row(ds_row, p_row, cols, own_sum ? dot_row(p_row, ds_row, cols) : row_d[r]);
    }
    if (bp_.dbias_data != nullptr) {  // the bias enters after softcap: its gradient is dS itself
      for (int64_t r = 0; r < rows; ++r) {
        acc_t* dst = bp_.dbias_data + bp_.row_index(b, h, q_begin + r) * bp_.seqlen_k + t.k_begin;
        std::copy(ds + r * block_k_, ds + r * block_k_ + cols, dst);
      }
    }
    // -- back through softcap: d(cap · tanh(x / cap))/dx = 1 - tanh²
    if (dtanh != nullptr) {
      for (int64_t r = 0; r < rows; ++r) mul_row(ds + r * block_k_, dtanh + r * block_k_, cols);
    }

    // -- dK += scale · dSᵀ Q                                                  (cols, headdim)
    // -- dQ += scale · dS K                                                   (rows, headdim)
    if (bp_.bf16_products) {
      if constexpr (kBf16) {
        round_to_bf16(ds, rows, cols);
        gemm_ab_bf16(cols, headdim_, rows, bp_.scale, scores_bits_t_.data(), block_q_, q_tile.bits, q_tile.ld, 1.f,
                     dk_acc_.data(), headdim_);
        gemm_ab_bf16(rows, headdim_, cols, bp_.scale, scores_bits_.data(), block_k_, k_tile.bits, k_tile.ld, 1.f,
                     dq_rows, headdim_);
      }
    } else {
      gemm_atb<acc_t>(cols, headdim_, rows, bp_.scale, ds, block_k_, q_tile.values, q_tile.ld, acc_t(1),
                      dk_acc_.data(), headdim_);
      gemm_ab<acc_t>(rows, headdim_, cols, bp_.scale, ds, block_k_, k_tile.values, k_tile.ld, acc_t(1), dq_rows,
                     headdim_);
    }
  }

  // Whether a row of P sums to 1 up to the rounding of its sum: its keys hold all of its softmax.
  static bool sums_to_one(const acc_t* p_row, int64_t cols) {
    acc_t sum = 0;
    for (int64_t j = 0; j < cols; ++j) sum += p_row[j];
    return std::abs(sum - acc_t(1)) <= acc_t(4) * static_cast<acc_t>(cols) * std::numeric_limits<acc_t>::epsilon();
  }

  // Row r of the tile's S (p_row, after the score mods) into P. lse = +inf (the row sees no key) gives P = 0, hence
  // zero gradients for the row.
  void probabilities_row(const Tile& t, int64_t r, acc_t* p_row) const {
    const int64_t i = t.q_begin + r, row = bp_.row_index(t.b, t.h, i);
    if (!exact_.has(row)) {
      const float lse = bp_.lse(t.b, t.h, i);
      const acc_t sum = exp_sub_sum(p_row, t.cols, static_cast<acc_t>(lse));
      // All of the row's keys here and lse its own (Σ P = exp(own - lse)): P / Σ P, as the forward's O = Σ P v / l.
      // S recomputed here (other GEMM shapes) differs from the forward's by a few float spacings (~10 at headdim
      // 128), so a row that sees one key would get P = 1 - 1e-6 and dS = P dP (1 - P) = noise · |dP| where it is
      // exactly 0. (The margin, 16 spacings, also bounds the error of dropping a sink's share.)
      if (t.holds_every_key_of(bp_.mods.window, i) && lse_is_own(sum - acc_t(1), lse, /*spacings=*/16)) {
        normalize_row(p_row, t.cols, sum);
      }
    } else if (t.holds_every_key_of(bp_.mods.window, i)) {
      // (see ExactRowStats) the statistics from this tile's own S: the exact recomputation sums in another order,
      // and at |S| ~ 1e4 (a key padded by -1e4) one float spacing is 1e-3, so a row that sees a single key would get
      // P = 1 +- 1e-3 and dS = P dP (1 - P) != 0 where it is exactly 0
      const acc_t m = row_max(p_row, t.cols);
      if (m > -std::numeric_limits<acc_t>::infinity()) {
        scale_row(p_row, t.cols, acc_t(1) / exp_sub_sum(p_row, t.cols, m));
      } else {
        std::fill(p_row, p_row + t.cols, acc_t(0));  // sees no key
      }
    } else {
      exp_sub_sum(p_row, t.cols, exact_.max[row]);
      scale_row(p_row, t.cols, exact_.inv_sum[row]);
    }
  }

  // x (rows, cols; row stride block_k) rounded to bf16 into scores_bits, and its transpose (cols, rows; row stride
  // block_q) into scores_bits_t: the bf16 operands P, Pᵀ, dS, dSᵀ of the bf16 products.
  void round_to_bf16(const acc_t* x, int64_t rows, int64_t cols) {
    if constexpr (kBf16) {
      for (int64_t r = 0; r < rows; ++r) float_to_bf16_bits(x + r * block_k_, scores_bits_.data() + r * block_k_, cols);
      transpose_bits(scores_bits_.data(), block_k_, rows, cols, scores_bits_t_.data(), block_q_);
    }
  }

  const BwdProblem<scalar_t>& bp_;
  const ExactRowStats<acc_t>& exact_;
  const acc_t* dout_dot_out_;  // D, (batch, nheads, seqlen_q)
  const int64_t block_q_, block_k_, headdim_, headdim_v_;  // headdim: q's and k's; headdim_v: v's, dout's
  // (block_q | block_k, headdim) for q, k; (block_q | block_k, headdim_v) for dout, v
  std::vector<acc_t> q_pack_, dout_pack_, k_pack_, v_pack_;
  std::vector<at::BFloat16> q_bits_pack_, dout_bits_pack_, k_bits_pack_, v_bits_pack_;
  std::vector<uint16_t> scores_bits_, scores_bits_t_;  // (block_q, block_k), (block_k, block_q)
  std::vector<acc_t> dk_acc_, dv_acc_;                 // (block_k, headdim), (block_k, headdim_v)
  std::vector<acc_t> p_tile_;                          // (block_q, block_k): S, then P
  std::vector<acc_t> ds_tile_;                         // (block_q, block_k): dP, then dS
  std::vector<acc_t> dtanh_tile_;                      // (block_q, block_k), with softcap
  std::vector<uint8_t> keep_;                          // (block_q, block_k): the dropout mask Z (dropout only)
  std::vector<acc_t> dropped_p_tile_;                  // (block_q, block_k): P ∘ Z / (1 - p) (dropout only)
};

// -- dQ = Σ over splits, in split order                                     (batch, seqlen_q, nheads, headdim)
template <typename scalar_t, typename acc_t>
void sum_dq_splits(const BwdProblem<scalar_t>& bp, const BwdPartition& part, const std::vector<acc_t>& dq_acc,
                   int64_t group_dq_size, at::Tensor& dq) {
  const HeadRows<scalar_t> dq_rows(dq);
  const int64_t nheads = bp.nheads, seqlen_q = bp.seqlen_q, headdim = bp.headdim;
  const int64_t num_groups = bp.batch * bp.nheads_k;
  parallel_for(0, bp.batch * seqlen_q * nheads, /*grain_size=*/64, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> sum(headdim);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (seqlen_q * nheads), i = row / nheads % seqlen_q, h = row % nheads;
      const int64_t group_index = b * bp.nheads_k + h / bp.group, g = h % bp.group;
      std::fill(sum.begin(), sum.end(), acc_t(0));
      for (int64_t split = 0; split < part.splits; ++split) {
        const acc_t* src =
            dq_acc.data() + (split * num_groups + group_index) * group_dq_size + (g * seqlen_q + i) * headdim;
        for (int64_t d = 0; d < headdim; ++d) sum[d] += src[d];
      }
      store_row(dq_rows.row(b, i, h), sum.data(), headdim, acc_t(1));
    }
  });
}

template <typename scalar_t>
void bwd_kernel(const AttentionProblem& p, const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk,
                at::Tensor& dv, at::Tensor& dbias_full, int64_t dropout_batch0 = 0) {
  using acc_t = acc_type<scalar_t>;
  if (p.batch * p.nheads_k * p.seqlen_k == 0 && p.batch * p.nheads * p.seqlen_q == 0) return;
  const BwdProblem<scalar_t> bp(p, dout, q, k, v, out, lse, dk, dv, dbias_full, dropout_batch0);
  const std::vector<acc_t> dout_dot_out = rowsum_dout_out(bp);
  const ExactRowStats<acc_t> exact = exact_row_stats(bp);

  // -- dK, dV per key block; dQ into per-split accumulators                  (splits, groups, group, seqlen_q, headdim)
  const int64_t block_k = bp.tiles.block_k;
  const int64_t num_groups = p.batch * p.nheads_k, num_k_blocks = ceil_div(p.seqlen_k, block_k);
  const BwdPartition part =
      BwdPartition::make(num_groups, num_k_blocks, block_k, bp.tiles.block_q, p.seqlen_k, bp.mods.window);
  const int64_t group_dq_size = bp.group * p.seqlen_q * p.headdim;
  std::vector<acc_t> dq_acc(part.splits * num_groups * group_dq_size, acc_t(0));
  parallel_for(0, num_groups * part.splits, /*grain_size=*/1, [&](int64_t task_begin, int64_t task_end) {
    BwdWorker<scalar_t> worker(bp, exact, dout_dot_out.data());
    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t group_index = task / part.splits, split = task % part.splits;
      acc_t* dq_split = dq_acc.data() + (split * num_groups + group_index) * group_dq_size;
      for (int64_t kb = part.split_begin[split]; kb < part.split_begin[split + 1]; ++kb) {
        worker.key_block(group_index / p.nheads_k, group_index % p.nheads_k, kb * block_k, dq_split);
      }
    }
  });

  sum_dq_splits(bp, part, dq_acc, group_dq_size, dq);
}

}  // namespace
}  // namespace fa2::cpu
