// The CPU forward: tasks (batch, head, query block), or for short query runs a kv head's query heads, over a split of
// the keys where that gives the threads tasks (fwd_short_runs); each loops over the key blocks its window reaches with
// the online softmax (running max m, running sum l, unnormalized O in fp32/fp64; after a row's first key block, one
// pass over each score tile) and stores O / l and lse = m + log l (l with the head's sink term exp(sink - m), if any).
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

// A paged key / value cache read in place (the KV-cache op's block_table): k and v are the block pools (blocks,
// block_size, nheads_k, headdim), and key j of batch element b lies in row j % block_size of block
// table[b * max_blocks + j / block_size]. table nullptr: k and v are (batch, seqlen_k, nheads_k, headdim).
struct PagedKeys {
  const int32_t* table = nullptr;
  int64_t max_blocks = 0, block_size = 0;
};

// The forward's inputs, outputs and tile sizes, as every task reads them.
template <typename scalar_t>
struct FwdProblem {
  using acc_t = acc_type<scalar_t>;
  int64_t seqlen_q, nheads, headdim, headdim_v, group;  // headdim: q's and k's; headdim_v: v's and out's
  CpuTiles tiles;
  ScoreMods<acc_t> mods;
  acc_t scale;
  HeadRows<const scalar_t> q_rows, k_rows, v_rows;
  PagedKeys paged;              // k_rows / v_rows: the block pools where paged.table is set
  HeadRows<scalar_t> out_rows;  // (batch, seqlen_q, nheads, headdim_v)
  float* lse_data;              // (batch, nheads, seqlen_q), contiguous
  const acc_t* sinks;           // (nheads,) each head's extra logit in the softmax denominator; nullptr: none
  // bf16 with bf16_gemm_available() (full tiles: where bf16_products_for_full_tiles(); short query runs always): both
  // products on bf16 operands (no conversion of Q, K, V; P rounded to bf16 for P V, as the GPU kernels do; fp32
  // accumulation, softmax and O as for the other dtypes). Else every tile converted to acc_t for sgemm / dgemm.
  bool bf16_products;

  FwdProblem(const AttentionProblem& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             at::Tensor& out, at::Tensor& lse, const at::Tensor& sinks_acc, const PagedKeys& paged_keys)
      : seqlen_q(p.seqlen_q),
        nheads(p.nheads),
        headdim(p.headdim),
        headdim_v(p.headdim_v),
        group(p.nheads / p.nheads_k),
        tiles(fwd_tiles(p.batch * p.nheads, p.seqlen_q, at::get_num_threads())),
        mods(ScoreMods<acc_t>::from(p)),
        scale(static_cast<acc_t>(p.scale)),
        q_rows(q),
        k_rows(k),
        v_rows(v),
        paged(paged_keys),
        out_rows(out),
        lse_data(lse.data_ptr<float>()),
        sinks(sinks_acc.defined() ? sinks_acc.const_data_ptr<acc_t>() : nullptr),
        bf16_products(std::is_same_v<scalar_t, at::BFloat16> && bf16_gemm_available() &&
                      (bf16_products_for_full_tiles() || p.seqlen_q < tiles.block_q)) {}
};

// One row's step of the online softmax over its next score tile row s_row (cols keys): s_row becomes P = exp(S - m),
// and the running reference max m, the row sum l and the row's unnormalized O follow. m is a reference point, not
// necessarily the exact max: lse = m + log l is exact either way (natural-log units). recompute_row() writes the
// row's S again, for the rare step where exp(S - m_old) overflowed.
template <typename acc_t, typename RecomputeRow>
void online_softmax_row(acc_t* s_row, int64_t cols, acc_t& m, acc_t& l, acc_t* o_row, int64_t headdim_v,
                        const RecomputeRow& recompute_row) {
  constexpr acc_t kRescaleThreshold = 8;  // P <= e^8 ~ 3e3 between rescales
  constexpr acc_t kOverflowGuard = 80;    // float exp overflows past 88
  constexpr acc_t kNegInfinity = -std::numeric_limits<acc_t>::infinity();
  const acc_t m_old = m;
  acc_t m_new, p_sum;
  if (m_old == kNegInfinity) {
    // first keys this row sees: exact max, then exp (two passes)
    m_new = row_max(s_row, cols);
    if (m_new == kNegInfinity) {
      if (!any_nan(s_row, cols)) {
        std::fill(s_row, s_row + cols, acc_t(0));  // nothing visible yet: P = 0, O and l stay 0
        return;
      }
      m_new = std::numeric_limits<acc_t>::quiet_NaN();  // NaN in, NaN out (not "sees no key")
    }
    p_sum = exp_sub_sum(s_row, cols, m_new);
  } else {
    // One pass: P = exp(S - m_old) and the tile's max together; m only moves when that max exceeds it by more than
    // kRescaleThreshold (P stays <= e^threshold, far from overflow, precision unchanged). Saves the max pass.
    acc_t tile_max;
    p_sum = exp_sub_sum_max(s_row, cols, m_old, &tile_max);
    m_new = m_old;
    if (tile_max > m_old + kRescaleThreshold) {
      m_new = tile_max;
      if (tile_max - m_old <= kOverflowGuard) {
        const acc_t shift_p = std::exp(m_old - m_new);
        scale_row(s_row, cols, shift_p);
        p_sum *= shift_p;
      } else {
        // exp(S - m_old) overflowed: recompute this row of S (rare: a jump of > 80 in the logits)
        recompute_row();
        p_sum = exp_sub_sum(s_row, cols, m_new);
      }
      const acc_t alpha = std::exp(m_old - m_new);
      l *= alpha;
      scale_row(o_row, headdim_v, alpha);
    }
  }
  l += p_sum;
  m = m_new;
}

// The query rows of one tile: `rows` queries of head h from q_begin (heads == 0), or, for short query runs under GQA,
// queries from q_begin each in heads h .. h + heads - 1, which share a kv head (row r: query q_begin + r / heads of
// head h + r % heads), so that each K / V tile is read once for them all.
struct TileRows {
  int64_t b, h, q_begin, rows, heads;
  int64_t head(int64_t r) const { return heads > 0 ? h + r % heads : h; }
  int64_t query(int64_t r) const { return heads > 0 ? q_begin + r / heads : q_begin + r; }
};

// Keys [lo, hi) of a key split (fwd_key_splits): a tile's rows see only those.
struct KeySpan {
  int64_t lo = 0, hi = std::numeric_limits<int64_t>::max();
};

// One thread's forward: its tiles, and the steps of one tile of query rows (a query block, or a decode step's heads).
template <typename scalar_t>
class FwdWorker {
  using acc_t = acc_type<scalar_t>;
  static constexpr bool kBf16 = std::is_same_v<scalar_t, at::BFloat16>;

 public:
  FwdWorker(const FwdProblem<scalar_t>& problem, const CpuDropout& dropout)
      : fp_(problem),
        dropout_(dropout),
        block_q_(problem.tiles.block_q),
        block_k_(problem.tiles.block_k),
        headdim_(problem.headdim),
        headdim_v_(problem.headdim_v) {
    const bool bf16 = fp_.bf16_products;
    // converted rows when the tiles are acc_t, copied bf16 rows (where their leading dim is not BLAS's) and P
    // rounded when they are bf16
    q_pack_.resize((bf16 ? 0 : block_q_) * headdim_);
    k_pack_.resize((bf16 ? 0 : block_k_) * headdim_);
    v_pack_.resize((bf16 ? 0 : block_k_) * headdim_v_);
    q_bits_pack_.resize((bf16 ? block_q_ : 0) * headdim_);
    k_bits_pack_.resize((bf16 ? block_k_ : 0) * headdim_);
    v_bits_pack_.resize((bf16 ? block_k_ : 0) * headdim_v_);
    p_bits_.resize((bf16 ? block_q_ : 0) * block_k_);
    scores_.resize(block_q_ * block_k_);
    o_acc_.resize(block_q_ * headdim_v_);
    m_.resize(block_q_);
    l_.resize(block_q_);
    keep_.resize(dropout_.enabled ? block_q_ * block_k_ : 0);
  }

  // O and lse of query rows [q_begin, q_begin + block_q) of head (b, h).
  void query_block(int64_t b, int64_t h, int64_t q_begin) {
    tile_rows(TileRows{b, h, q_begin, std::min(block_q_, fp_.seqlen_q - q_begin), /*heads=*/0});
  }
  // O and lse of a tile's rows (t.rows <= block_q; no dropout where t.heads > 0) over the keys they see; or, given
  // `partial`, over keys.lo .. keys.hi - 1 only, left unnormalized there for merge_splits: (t.rows, headdim_v + 2),
  // a row's O, then its m and l.
  void tile_rows(const TileRows& t, KeySpan keys = {}, acc_t* partial = nullptr) {
    const int64_t b = t.b, h = t.h, q_begin = t.q_begin, rows = t.rows;
    // (one stride reaches the rows but where several queries of several heads are packed)
    const bool gathered = t.heads > 0 && rows > t.heads;
    auto q_row = [&](int64_t r) { return fp_.q_rows.row(b, t.query(r), t.head(r)); };
    const int64_t q_stride = t.heads > 0 ? fp_.q_rows.stride_h : fp_.q_rows.stride_s;
    const ProductTile<acc_t> q_tile =
        gathered ? gathered_tile<scalar_t>(q_row, rows, headdim_, fp_.bf16_products, q_pack_.data(),
                                           q_bits_pack_.data())
                 : product_tile(q_row(0), q_stride, rows, headdim_, fp_.bf16_products, q_pack_.data(),
                                q_bits_pack_.data());
    acc_t* s = scores_.data();
    acc_t* o = o_acc_.data();
    std::fill(o, o + rows * headdim_v_, acc_t(0));
    std::fill(m_.begin(), m_.begin() + rows, -std::numeric_limits<acc_t>::infinity());
    std::fill(l_.begin(), l_.begin() + rows, acc_t(0));

    // Keys outside [k_first, k_last] are masked for every row of the block: never loaded.
    const WindowMask& window = fp_.mods.window;
    const int64_t h_k = h / fp_.group;
    const int64_t k_first = std::max(window.first_key(t.query(0)), keys.lo);
    const int64_t k_last = std::min(window.last_key(t.query(rows - 1)), keys.hi - 1);
    for (int64_t k_begin = k_first; k_begin <= k_last; k_begin += block_k_) {
      const int64_t cols = std::min(block_k_, k_last + 1 - k_begin);
      const ProductTile<acc_t> k_tile =
          key_tile(fp_.k_rows, b, k_begin, cols, h_k, headdim_, k_pack_.data(), k_bits_pack_.data());
      const ProductTile<acc_t> v_tile =
          key_tile(fp_.v_rows, b, k_begin, cols, h_k, headdim_v_, v_pack_.data(), v_bits_pack_.data());
      // S rows [r0, r0 + n) = scale · Q Kᵀ, then softcap, bias, mask           (n, cols), row stride block_k
      auto scores = [&](int64_t r0, int64_t n) {
        product_abt(n, cols, headdim_, fp_.scale, q_tile, r0, k_tile, s + r0 * block_k_, block_k_);
        if (t.heads == 0) {
          fp_.mods.apply(s + r0 * block_k_, block_k_, b, h, q_begin + r0, n, k_begin, cols, /*dtanh=*/nullptr);
          return;
        }
        for (int64_t r = r0; r < r0 + n; ++r) {  // (each row its own head and query)
          fp_.mods.apply(s + r * block_k_, block_k_, b, t.head(r), t.query(r), 1, k_begin, cols, /*dtanh=*/nullptr);
        }
      };

      // -- S                                                                  (rows, cols)
      scores(0, rows);
      // -- P = exp(S - m), update m and l, rescale O by exp(m_old - m_new) when m moves
      for (int64_t r = 0; r < rows; ++r) {
        online_softmax_row(s + r * block_k_, cols, m_[r], l_[r], o + r * headdim_v_, headdim_v_,
                           [&] { scores(r, 1); });
      }
      // -- dropout: P ∘ Z / (1 - p), after l took P's sum and before P V
      if (dropout_.enabled) drop_weights(b, h, q_begin, rows, k_begin, cols);  // (never with t.heads: fwd_kernel)
      // -- O += P V                                                           (rows, headdim_v)
      add_pv(rows, cols, v_tile);
    }
    if (partial == nullptr) {
      store_o_and_lse(t);
      return;
    }
    for (int64_t r = 0; r < rows; ++r) {
      acc_t* row = partial + r * (headdim_v_ + 2);
      std::copy(o + r * headdim_v_, o + (r + 1) * headdim_v_, row);
      row[headdim_v_] = m_[r];
      row[headdim_v_ + 1] = l_[r];
    }
  }

  // O and lse of a tile's rows from its key splits' partials (tile_rows; `splits` of them, split_stride apart): the
  // largest m of the splits with keys (l != 0; NaN if any is NaN), l and O the splits' rescaled to it, then stored as
  // a tile's are.
  void merge_splits(const TileRows& t, const acc_t* partials, int64_t splits, int64_t split_stride) {
    const int64_t width = headdim_v_ + 2;
    for (int64_t r = 0; r < t.rows; ++r) {
      acc_t m = -std::numeric_limits<acc_t>::infinity(), l = 0;
      bool nan = false;
      for (int64_t s = 0; s < splits; ++s) {
        const acc_t* row = partials + s * split_stride + r * width;
        if (row[headdim_v_ + 1] == acc_t(0)) continue;  // (no key of this split)
        nan = nan || std::isnan(row[headdim_v_]);
        m = std::max(m, row[headdim_v_]);
      }
      if (nan) m = std::numeric_limits<acc_t>::quiet_NaN();
      acc_t* o_row = o_acc_.data() + r * headdim_v_;
      std::fill(o_row, o_row + headdim_v_, acc_t(0));
      for (int64_t s = 0; s < splits; ++s) {
        const acc_t* row = partials + s * split_stride + r * width;
        if (row[headdim_v_ + 1] == acc_t(0)) continue;
        const acc_t factor = std::exp(row[headdim_v_] - m);
        l += row[headdim_v_ + 1] * factor;
        for (int64_t d = 0; d < headdim_v_; ++d) o_row[d] += row[d] * factor;
      }
      m_[r] = m;
      l_[r] = l;
    }
    store_o_and_lse(t);
  }

 private:
  // Keys [k_begin, + cols) of kv head h_k of batch element b in k or v (rows) as a product tile: read through the
  // stride, or, in a paged cache where they span several blocks, each row from its block (copied into the scratch).
  ProductTile<acc_t> key_tile(const HeadRows<const scalar_t>& rows, int64_t b, int64_t k_begin, int64_t cols,
                              int64_t h_k, int64_t width, acc_t* scratch, at::BFloat16* bits_scratch) const {
    const PagedKeys& paged = fp_.paged;
    if (paged.table == nullptr) {
      return product_tile(rows.row(b, k_begin, h_k), rows.stride_s, cols, width, fp_.bf16_products, scratch,
                          bits_scratch);
    }
    const int32_t* blocks = paged.table + b * paged.max_blocks;
    auto row_of = [&](int64_t r) {
      const int64_t key = k_begin + r;
      return rows.row(blocks[key / paged.block_size], key % paged.block_size, h_k);
    };
    if (k_begin / paged.block_size == (k_begin + cols - 1) / paged.block_size) {  // one block's rows
      return product_tile(row_of(0), rows.stride_s, cols, width, fp_.bf16_products, scratch, bits_scratch);
    }
    return gathered_tile<scalar_t>(row_of, cols, width, fp_.bf16_products, scratch, bits_scratch);
  }

  // O (rows, headdim_v) += P (rows, cols) V (cols, headdim_v); P rounded to bf16 for the bf16 product, as the GPU
  // kernels do.
  void add_pv(int64_t rows, int64_t cols, const ProductTile<acc_t>& v_tile) {
    const acc_t* p = scores_.data();
    if (v_tile.bits != nullptr) {
      if constexpr (kBf16) {
        for (int64_t r = 0; r < rows; ++r) float_to_bf16_bits(p + r * block_k_, p_bits_.data() + r * block_k_, cols);
        gemm_ab_bf16(rows, headdim_v_, cols, 1.f, p_bits_.data(), block_k_, v_tile.bits, v_tile.ld, 1.f,
                     o_acc_.data(), headdim_v_);
      }
    } else {
      gemm_ab<acc_t>(rows, headdim_v_, cols, acc_t(1), p, block_k_, v_tile.values, v_tile.ld, acc_t(1),
                     o_acc_.data(), headdim_v_);
    }
  }

  // P (rows, cols) ∘ Z / (1 - p): the mask of keys [k_begin, + cols) for these rows, from their coordinates.
  void drop_weights(int64_t b, int64_t h, int64_t q_begin, int64_t rows, int64_t k_begin, int64_t cols) {
    dropout_.keep_tile(b, h, q_begin, rows, k_begin, cols, keep_.data(), block_k_);
    const acc_t keep_scale = static_cast<acc_t>(dropout_.keep_scale);
    for (int64_t r = 0; r < rows; ++r) {
      acc_t* p_row = scores_.data() + r * block_k_;
      apply_keep_row(p_row, keep_.data() + r * block_k_, cols, keep_scale, p_row);
    }
  }

  // -- O /= l once; lse = m + log l. A row that saw no key (l == 0): O = 0, lse = +inf. NaN stays NaN. A sink adds
  // exp(sink - m) to l (a key with a zero value), taken relative to the sink where it exceeds m (no overflow).
  void store_o_and_lse(const TileRows& t) {
    const int64_t b = t.b;
    for (int64_t r = 0; r < t.rows; ++r) {
      const int64_t i = t.query(r), h = t.head(r);
      scalar_t* out_row = fp_.out_rows.row(b, i, h);
      float& lse_value = fp_.lse_data[(b * fp_.nheads + h) * fp_.seqlen_q + i];
      if (l_[r] != acc_t(0)) {
        acc_t m = m_[r], l = l_[r], o_factor = 1;
        if (fp_.sinks != nullptr) {
          const acc_t sink = fp_.sinks[h];
          if (sink <= m) {
            l += std::exp(sink - m);
          } else {
            o_factor = std::exp(m - sink);
            l = l * o_factor + 1;
            m = sink;
          }
        }
        store_row(out_row, o_acc_.data() + r * headdim_v_, headdim_v_, o_factor / l);
        lse_value = static_cast<float>(m + std::log(l));
      } else {
        std::fill(out_row, out_row + headdim_v_, scalar_t(0));
        lse_value = std::numeric_limits<float>::infinity();
      }
    }
  }

  const FwdProblem<scalar_t>& fp_;
  const CpuDropout& dropout_;
  const int64_t block_q_, block_k_, headdim_, headdim_v_;  // headdim: q's and k's; headdim_v: v's and out's
  std::vector<acc_t> q_pack_, k_pack_, v_pack_;                     // (block_q | block_k, headdim | headdim_v)
  std::vector<at::BFloat16> q_bits_pack_, k_bits_pack_, v_bits_pack_;  // (block_q | block_k, headdim | headdim_v)
  std::vector<uint16_t> p_bits_;                                    // (block_q, block_k)
  std::vector<acc_t> scores_;                                       // (block_q, block_k): S, then P in place
  std::vector<acc_t> o_acc_;                                        // (block_q, headdim_v): unnormalized O
  std::vector<acc_t> m_, l_;  // (block_q): running reference max, row sum of exp(S - m)
  std::vector<uint8_t> keep_;  // (block_q, block_k): the dropout mask of the current tile (dropout only)
};

// Query block visited by the t-th task of a head: 0, n-1, 1, n-2, ... at::parallel_for hands each thread a
// contiguous task range, and with a causal mask the block cost grows with its index; pairing cheap and costly
// blocks keeps the threads' shares equal.
int64_t balanced_block_order(int64_t t, int64_t n) { return t % 2 == 0 ? t / 2 : n - 1 - t / 2; }

// The short query runs' tiles (fwd_kernel): `tasks` tiles of up to tile_heads query heads of one kv head (a query
// head's queries where 1) and as many queries as block_q rows hold, each over `splits` runs of whole key blocks of
// the visible keys, a task each, then merged.
template <typename scalar_t>
void fwd_short_runs(const FwdProblem<scalar_t>& problem, const CpuDropout& dropout, int64_t tile_heads, int64_t tasks,
                    int64_t splits, KeySpan visible) {
  using acc_t = acc_type<scalar_t>;
  const int64_t group = problem.group, queries = problem.tiles.block_q / tile_heads;
  const int64_t head_chunks = ceil_div(group, tile_heads), query_chunks = ceil_div(problem.seqlen_q, queries);
  const int64_t nheads_k = problem.nheads / group;
  auto tile_of = [&](int64_t task) {
    const int64_t head_chunk = task % head_chunks, query_chunk = task / head_chunks % query_chunks;
    const int64_t bk = task / (head_chunks * query_chunks), b = bk / nheads_k, h_k = bk % nheads_k;
    const int64_t h = h_k * group + head_chunk * tile_heads, q_begin = query_chunk * queries;
    const int64_t n_heads = std::min(tile_heads, group - head_chunk * tile_heads);
    const int64_t n_queries = std::min(queries, problem.seqlen_q - q_begin);
    return tile_heads > 1 ? TileRows{b, h, q_begin, n_queries * n_heads, n_heads}
                          : TileRows{b, h, q_begin, n_queries, /*heads=*/0};
  };
  if (splits == 1) {
    parallel_for(0, tasks, /*grain_size=*/1, [&](int64_t task_begin, int64_t task_end) {
      FwdWorker<scalar_t> worker(problem, dropout);
      for (int64_t task = task_begin; task < task_end; ++task) worker.tile_rows(tile_of(task));
    });
    return;
  }
  // split s: visible keys [lo + s * span, lo + (s + 1) * span), whole key blocks (the last split's may be fewer)
  const int64_t block_k = problem.tiles.block_k, blocks = ceil_div(visible.hi - visible.lo, block_k);
  const int64_t span = ceil_div(blocks, splits) * block_k;
  splits = ceil_div(blocks * block_k, span);
  const int64_t rows_per_tile = std::min(queries, problem.seqlen_q) * tile_heads;  // (at most)
  const int64_t split_stride = rows_per_tile * (problem.headdim_v + 2);
  std::vector<acc_t> partials(tasks * splits * split_stride);
  parallel_for(0, tasks * splits, /*grain_size=*/1, [&](int64_t begin, int64_t end) {
    FwdWorker<scalar_t> worker(problem, dropout);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t s = i % splits;
      const KeySpan keys{visible.lo + s * span, visible.lo + (s + 1) * span};
      worker.tile_rows(tile_of(i / splits), keys, partials.data() + i * split_stride);
    }
  });
  parallel_for(0, tasks, /*grain_size=*/1, [&](int64_t task_begin, int64_t task_end) {
    FwdWorker<scalar_t> worker(problem, dropout);
    for (int64_t task = task_begin; task < task_end; ++task) {
      worker.merge_splits(tile_of(task), partials.data() + task * splits * split_stride, splits, split_stride);
    }
  });
}

// dropout_batch0: the dropout mask's batch coordinate of batch element 0 (a varlen run's first sequence). paged: k and
// v are block pools (PagedKeys).
template <typename scalar_t>
void fwd_kernel(const AttentionProblem& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                at::Tensor& out, at::Tensor& lse, int64_t dropout_batch0 = 0, const PagedKeys& paged = {}) {
  if (p.batch * p.nheads * p.seqlen_q == 0) return;  // nothing to write
  // (the sinks in the accumulation dtype, which the epilogue reads)
  const at::Tensor sinks_acc =
      p.sinks.has_value() ? p.sinks->to(c10::CppTypeToScalarType<acc_type<scalar_t>>::value).contiguous()
                          : at::Tensor();
  const FwdProblem<scalar_t> problem(p, q, k, v, out, lse, sinks_acc, paged);
  const CpuDropout dropout = CpuDropout::from(p, dropout_batch0);
  // Short query runs (decode steps, speculative decoding, small chunks: fewer queries than a tile's rows; no dropout,
  // whose mask tiles take consecutive queries of one head): under GQA a tile's rows are queries of all the query heads
  // of a kv head (up to block_q rows), so that each K / V tile is read once for them rather than once per head; and
  // where the tiles give fewer tasks than threads, each tile's keys are split (fwd_key_splits) and merged after.
  // Without a split that fills the threads (a short cache), a tile a head gives more tasks instead.
  DevOptions options;
  dev_options(&options);  // (an error in FA2_DEV_OPTIONS is reported by the CUDA calls' plans)
  if (p.seqlen_q < problem.tiles.block_q && !dropout.enabled) {
    // (inside a parallel region, e.g. a varlen run's, this call runs on its thread alone)
    const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
    const int64_t block_q = problem.tiles.block_q, group = problem.group;
    // the keys any query sees (windows end at the last query's, start at the first's)
    const WindowMask& window = problem.mods.window;
    const KeySpan visible{window.first_key(0), std::max(window.first_key(0), window.last_key(p.seqlen_q - 1) + 1)};
    auto tasks_of = [&](int64_t tile_heads) {  // (batch, kv head, head chunk, query chunk)
      return p.batch * p.nheads_k * ceil_div(group, tile_heads) * ceil_div(p.seqlen_q, block_q / tile_heads);
    };
    auto splits_of = [&](int64_t tile_heads) {
      return fwd_key_splits(tasks_of(tile_heads), threads, visible.hi - visible.lo, problem.tiles.block_k,
                            options.cpu_key_splits);
    };
    int64_t tile_heads = options.cpu_head_tiles ? std::min(group, block_q) : 1;
    if (tile_heads > 1 && tasks_of(tile_heads) < threads && splits_of(tile_heads) == 1) tile_heads = 1;
    const int64_t splits = splits_of(tile_heads);
    if (tile_heads > 1 || splits > 1) {
      fwd_short_runs(problem, dropout, tile_heads, tasks_of(tile_heads), splits, visible);
      return;
    }
  }
  const int64_t num_q_blocks = ceil_div(p.seqlen_q, problem.tiles.block_q);
  parallel_for(0, p.batch * p.nheads * num_q_blocks, /*grain_size=*/1, [&](int64_t task_begin, int64_t task_end) {
    FwdWorker<scalar_t> worker(problem, dropout);
    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t bh = task / num_q_blocks;
      const int64_t q_block = balanced_block_order(task % num_q_blocks, num_q_blocks);
      worker.query_block(bh / p.nheads, bh % p.nheads, q_block * problem.tiles.block_q);
    }
  });
}

}  // namespace
}  // namespace fa2::cpu
