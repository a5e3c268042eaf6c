// CPU implementation of fa2::kvcache_fwd (flash-attn's flash_attn_with_kvcache): the new keys are rotated (rotary_cos
// / rotary_sin) and written into the cache in place, q is rotated at the same positions, then each sequence's first
// cache_seqlens[b] + seqlen_new keys go through the padded forward kernel (cpu/fwd_kernel.h) as a problem of their own
// length, so causal and windows align bottom-right per sequence. Consecutive batch elements with the same length (and,
// in a contiguous cache, consecutive cache rows) make one call (a decode step over a full batch is one call); the
// kernel reads a paged cache's blocks in place through the block table (PagedKeys).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "checks.h"
#include "cpu/fwd_kernel.h"

namespace fa2::cpu {
namespace {

using at::Tensor;

// cache_seqlens[b] (the whole capacity when not given), read from a checked CPU tensor.
int64_t cached_keys(const KvcacheProblem& kp, int64_t b) {
  return kp.cache_seqlens ? kp.cache_seqlens->const_data_ptr<int32_t>()[b] : kp.capacity;
}

// The cache row of batch element b (contiguous caches).
int64_t cache_row(const KvcacheProblem& kp, int64_t b) {
  return kp.cache_batch_idx ? kp.cache_batch_idx->const_data_ptr<int32_t>()[b] : b;
}

int64_t cache_block(const KvcacheProblem& kp, int64_t b, int64_t position) {
  return kp.block_table->const_data_ptr<int32_t>()[b * kp.max_blocks + position / kp.block_size];
}

// x (batch, rows, heads, headdim) with its first rotary_dim columns rotated, row i of batch element b at position
// positions[b][i] (int64 (batch, rows)): pairs (j, j + rotary_dim / 2), or (2j, 2j + 1) when interleaved, turned by
// the angle whose cos / sin are rotary_cos / rotary_sin[position, j]. Computed in fp32 (fp64 for fp64), as flash-attn.
Tensor rotate(const Tensor& x, const Tensor& positions, const KvcacheProblem& kp) {
  const auto compute = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t half = kp.rotary_dim / 2;
  const Tensor index = positions.flatten().clamp(0, kp.rotary_cos->size(0) - 1);
  const std::vector<int64_t> angle_shape{x.size(0), x.size(1), 1, half};
  const Tensor cos = kp.rotary_cos->index_select(0, index).view(angle_shape).to(compute);
  const Tensor sin = kp.rotary_sin->index_select(0, index).view(angle_shape).to(compute);
  const Tensor rotated = x.narrow(3, 0, kp.rotary_dim).to(compute);
  const Tensor x1 = kp.rotary_interleaved ? rotated.slice(3, 0, kp.rotary_dim, 2) : rotated.narrow(3, 0, half);
  const Tensor x2 = kp.rotary_interleaved ? rotated.slice(3, 1, kp.rotary_dim, 2) : rotated.narrow(3, half, half);
  const Tensor out1 = x1 * cos - x2 * sin, out2 = x1 * sin + x2 * cos;
  Tensor result = x.contiguous().clone();
  result.narrow(3, 0, kp.rotary_dim)
      .copy_(kp.rotary_interleaved ? at::stack({out1, out2}, -1).flatten(-2) : at::cat({out1, out2}, -1));
  return result;
}

// Positions of `rows` rows per batch element: cache_seqlens[b] + i, or cache_seqlens[b] for every row (per_row false).
Tensor positions(const KvcacheProblem& kp, int64_t rows, bool per_row) {
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  const Tensor first = kp.cache_seqlens->to(at::kLong).unsqueeze(1);
  return per_row ? first + at::arange(rows, i64).unsqueeze(0) : first.expand({kp.problem.batch, rows}).contiguous();
}

// Writes rows (seqlen_new, nheads_k, headdim) of batch element b into the cache from position cache_seqlens[b].
void append_rows(const Tensor& cache, const Tensor& rows, const KvcacheProblem& kp, int64_t b) {
  const int64_t first = cached_keys(kp, b);
  if (!kp.paged) {
    cache.select(0, cache_row(kp, b)).narrow(0, first, rows.size(0)).copy_(rows);
    return;
  }
  for (int64_t done = 0; done < rows.size(0);) {  // block by block
    const int64_t position = first + done, offset = position % kp.block_size;
    const int64_t n = std::min(kp.block_size - offset, rows.size(0) - done);
    cache.select(0, cache_block(kp, b, position)).narrow(0, offset, n).copy_(rows.narrow(0, done, n));
    done += n;
  }
}

// count consecutive batch elements from b0 with `keys` keys each, in consecutive rows of a contiguous cache from
// row0 (paged: -1, each element's blocks from the block table): one call of the padded kernel.
struct CacheRun {
  int64_t b0, count, keys, row0;
};

std::vector<CacheRun> cache_runs(const KvcacheProblem& kp) {
  std::vector<CacheRun> runs;
  for (int64_t b = 0; b < kp.problem.batch; ++b) {
    const int64_t keys = cached_keys(kp, b) + kp.seqlen_new;
    const int64_t row = kp.paged ? -1 : cache_row(kp, b);
    if (!runs.empty()) {
      CacheRun& run = runs.back();
      if (run.keys == keys && (kp.paged || run.row0 + run.count == row)) {
        ++run.count;
        continue;
      }
    }
    runs.push_back({b, 1, keys, row});
  }
  return runs;
}

std::tuple<Tensor, Tensor> kvcache_fwd_cpu(
    const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const std::optional<Tensor>& k,
    const std::optional<Tensor>& v, const std::optional<Tensor>& cache_seqlens,
    const std::optional<Tensor>& block_table, const std::optional<Tensor>& cache_batch_idx,
    const std::optional<Tensor>& rotary_cos, const std::optional<Tensor>& rotary_sin, bool rotary_interleaved,
    std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    int64_t num_splits) {
  // (checked before anything is written: a bad input leaves the caches as they were)
  const KvcacheProblem kp =
      check_kvcache_inputs(q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, rotary_cos,
                           rotary_sin, rotary_interleaved, scale, causal, window_left, window_right, softcap,
                           num_splits);
  const AttentionProblem& shared = kp.problem;
  Tensor out = at::empty({shared.batch, shared.seqlen_q, shared.nheads, shared.headdim_v}, q.options());
  Tensor lse = at::empty({shared.batch, shared.nheads, shared.seqlen_q}, q.options().dtype(at::kFloat));

  if (kp.seqlen_new > 0) {
    const bool rotary = kp.rotary_dim > 0;
    const Tensor k_new = rotary ? rotate(*k, positions(kp, kp.seqlen_new, true), kp) : *k;
    for (int64_t b = 0; b < shared.batch; ++b) {
      append_rows(k_cache, k_new.select(0, b), kp, b);
      append_rows(v_cache, v->select(0, b), kp, b);
    }
  }
  const Tensor q_rot = kp.rotary_dim > 0 ? rotate(q, positions(kp, shared.seqlen_q, kp.rotary_q_per_row), kp) : q;

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "fa2_kvcache_fwd_cpu", [&] {
    for (const CacheRun& run : cache_runs(kp)) {
      AttentionProblem p = shared;
      p.batch = run.count;
      p.seqlen_k = run.keys;
      Tensor run_out = out.narrow(0, run.b0, run.count), run_lse = lse.narrow(0, run.b0, run.count);
      const Tensor run_q = q_rot.narrow(0, run.b0, run.count);
      if (kp.paged) {
        const PagedKeys paged{kp.block_table->const_data_ptr<int32_t>() + run.b0 * kp.max_blocks, kp.max_blocks,
                              kp.block_size};
        fwd_kernel<scalar_t>(p, run_q, k_cache, v_cache, run_out, run_lse, /*dropout_batch0=*/0, paged);
        continue;
      }
      fwd_kernel<scalar_t>(p, run_q, k_cache.narrow(0, run.row0, run.count).narrow(1, 0, run.keys),
                           v_cache.narrow(0, run.row0, run.count).narrow(1, 0, run.keys), run_out, run_lse);
    }
  });
  return {out, lse};
}

}  // namespace
}  // namespace fa2::cpu

TORCH_LIBRARY_IMPL(fa2, CPU, m) { m.impl("kvcache_fwd", &fa2::cpu::kvcache_fwd_cpu); }
