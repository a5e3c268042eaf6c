// CUDA fa2::kvcache_fwd: checks -> the append kernel (new keys / values written into the caches, k and q rotated on
// the way: cuda/src/kvcache_append.cu) -> the attention: the decode kernel where it takes the problem
// (cuda_glue::try_decode_attention), else the varlen kernels over the cache seen as packed sequences (a paged cache's
// pages read in place by the sm_90a kernels, cuda_glue::paged_varlen_fwd; on the sm80 path its blocks gathered into a
// contiguous copy first: correct, slower, batch x capacity rows of memory). No host sync
// anywhere (lengths stay on the device, max_seqlen from shapes): a decode step can be captured in a CUDA graph.
// Index values are not checked on the host here (that would need a sync); the kernels clamp or skip what is out of
// range, so a bad value never touches memory outside the caches (checks.h, KvcacheProblem).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "checks.h"
#include "cuda/decode_cuda.h"
#include "cuda/params_from_tensors.h"
#include "cuda/varlen_cuda.h"
#include "fa2/kvcache_append.h"

namespace fa2 {
namespace {

using at::Tensor;

constexpr const char* kKvcacheCuda = "fa2.attention_with_kvcache (CUDA)";

// Writes k / v into the caches (k rotated) and returns q as the attention reads it: rotated into a contiguous copy
// when there is rotary, else q itself made contiguous (a no-op for the usual contiguous q).
Tensor append_and_rotate(const KvcacheProblem& kp, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const std::optional<Tensor>& k, const std::optional<Tensor>& v, const Tensor& first_positions,
                         cudaStream_t stream) {
  const AttentionProblem& p = kp.problem;
  const bool rotary = kp.rotary_dim > 0;
  if (kp.seqlen_new == 0 && !rotary) return q.contiguous();
  KvcacheAppendParams a;
  a.dtype = cuda_glue::dtype_of(q);
  a.batch = static_cast<int>(p.batch);
  a.nheads_k = static_cast<int>(p.nheads_k);
  a.headdim = static_cast<int>(p.headdim);
  a.headdim_v = static_cast<int>(p.headdim_v);
  a.seqlen_new = static_cast<int>(kp.seqlen_new);
  if (kp.seqlen_new > 0) {
    a.k_new = k->data_ptr(), a.v_new = v->data_ptr();
    a.k_new_batch_stride = k->stride(0), a.k_new_row_stride = k->stride(1), a.k_new_head_stride = k->stride(2);
    a.v_new_batch_stride = v->stride(0), a.v_new_row_stride = v->stride(1), a.v_new_head_stride = v->stride(2);
  }
  a.k_cache = k_cache.data_ptr(), a.v_cache = v_cache.data_ptr();
  a.k_cache_batch_stride = k_cache.stride(0), a.k_cache_row_stride = k_cache.stride(1);
  a.k_cache_head_stride = k_cache.stride(2);
  a.v_cache_batch_stride = v_cache.stride(0), a.v_cache_row_stride = v_cache.stride(1);
  a.v_cache_head_stride = v_cache.stride(2);
  a.cache_entries = static_cast<int>(kp.batch_cache);
  a.capacity = static_cast<int>(kp.capacity);
  a.cache_seqlens = first_positions.data_ptr<int>();
  a.cache_batch_idx = kp.cache_batch_idx ? kp.cache_batch_idx->data_ptr<int>() : nullptr;
  a.block_table = kp.block_table ? kp.block_table->data_ptr<int>() : nullptr;
  a.max_blocks = static_cast<int>(kp.max_blocks);
  a.block_size = static_cast<int>(kp.block_size);
  Tensor q_rot;
  if (rotary) {
    a.rotary_dim = static_cast<int>(kp.rotary_dim);
    a.rotary_interleaved = kp.rotary_interleaved;
    a.rotary_cos = kp.rotary_cos->data_ptr(), a.rotary_sin = kp.rotary_sin->data_ptr();
    a.rotary_cos_row_stride = kp.rotary_cos->stride(0), a.rotary_sin_row_stride = kp.rotary_sin->stride(0);
    a.seqlen_ro = static_cast<int>(kp.rotary_cos->size(0));
    q_rot = at::empty({p.batch, p.seqlen_q, p.nheads, p.headdim}, q.options());
    a.q = q.data_ptr(), a.q_rot = q_rot.data_ptr();
    a.seqlen_q = static_cast<int>(p.seqlen_q), a.nheads = static_cast<int>(p.nheads);
    a.q_batch_stride = q.stride(0), a.q_row_stride = q.stride(1), a.q_head_stride = q.stride(2);
    a.q_per_row = kp.rotary_q_per_row;
  }
  const char* err = run_kvcache_append(a, stream);
  TORCH_CHECK(err == nullptr, kKvcacheCuda, ": the append kernel failed: ", err,
              " (the CUDA kernels need compute capability 8.0 or newer)");
  return rotary ? q_rot : q.contiguous();
}

// fa2::varlen_fwd's CUDA kernel, called with the arguments named in `given` and every other one at its schema
// default (so arguments the schema gains later keep their defaults here).
std::tuple<Tensor, Tensor> varlen_fwd_on_cuda(const std::unordered_map<std::string, c10::IValue>& given) {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("fa2::varlen_fwd", "");
  torch::jit::Stack stack;
  for (const c10::Argument& argument : op.schema().arguments()) {
    const auto it = given.find(argument.name());
    TORCH_INTERNAL_ASSERT(it != given.end() || argument.default_value().has_value(),
                          "fa2.attention_with_kvcache: fa2::varlen_fwd's argument ", argument.name(),
                          " has no default");
    stack.push_back(it != given.end() ? it->second : *argument.default_value());
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CUDA), &stack);
  return {stack[0].toTensor(), stack[1].toTensor()};
}

// A contiguous cache (entries, seqlen_cache, nheads_k, headdim) as packed rows (total, nheads_k, headdim), and how many
// rows apart its entries start: a view where the entries are evenly spaced rows, else a contiguous copy.
std::pair<Tensor, int64_t> packed_cache(const Tensor& cache) {
  const int64_t entries = cache.size(0), seqlen = cache.size(1), row_stride = cache.stride(1);
  const bool rows_evenly_spaced = entries == 1 || (row_stride > 0 && cache.stride(0) % row_stride == 0 &&
                                                   cache.stride(0) >= seqlen * row_stride);
  if (!rows_evenly_spaced) return {cache.contiguous().flatten(0, 1), seqlen};
  const int64_t rows_apart = entries == 1 ? seqlen : cache.stride(0) / row_stride;
  return {cache.as_strided({(entries - 1) * rows_apart + seqlen, cache.size(2), cache.size(3)},
                           {row_stride, cache.stride(2), cache.stride(3)}, cache.storage_offset()),
          rows_apart};
}

// The attention through the varlen kernels with cache_batch_idx (each sequence's entry from a tensor): sequence b is
// q's rows of batch element b and the first seqlens_k[b] keys of cache entry cache_batch_idx[b]. Returns out and lse
// as the kernels write them ((batch * seqlen_q, nheads, headdim_v); (nheads, batch * seqlen_q)).
std::tuple<Tensor, Tensor> varlen_over_indexed_entries(const KvcacheProblem& kp, const Tensor& q,
                                                       const Tensor& keys, const Tensor& values,
                                                       int64_t rows_apart, const Tensor& seqlens_k) {
  const AttentionProblem& p = kp.problem;
  const auto i32 = q.options().dtype(at::kInt);
  const Tensor cu_seqlens_q = at::arange(0, (p.batch + 1) * p.seqlen_q, p.seqlen_q, i32);
  // (entry b at row cache_batch_idx[b] * rows_apart; the last entry, past the sequences, is not read: seqused_k gives
  // every length, block_info.cuh's sequence_bounds)
  const Tensor starts = kp.cache_batch_idx->clamp(0, kp.batch_cache - 1) * static_cast<int32_t>(rows_apart);
  const Tensor cu_seqlens_k = at::cat({starts.to(at::kInt), at::full({1}, keys.size(0), i32)});
  return varlen_fwd_on_cuda({
      {"q", q.flatten(0, 1)}, {"k", keys}, {"v", values}, {"cu_seqlens_q", cu_seqlens_q},
      {"cu_seqlens_k", cu_seqlens_k}, {"max_seqlen_q", c10::SymInt(p.seqlen_q)},
      {"max_seqlen_k", c10::SymInt(kp.capacity)}, {"seqused_k", seqlens_k}, {"scale", p.scale},
      {"causal", p.causal}, {"window_left", p.window_left}, {"window_right", p.window_right},
      {"softcap", p.softcap}});
}

// The attention through the varlen kernels: sequence b is q's rows of batch element b and its first
// clamp(cache_seqlens[b] + seqlen_new, 0, capacity) keys (all the capacity without cache_seqlens), from its cache entry
// or its pages. Returns out (batch, seqlen_q, nheads, headdim_v) and fills lse (batch 1: returns it as a view of the
// kernel's, whose (nheads, seqlen_q) rows are already in its order). A chunk of prefill is a few microseconds of
// attention: each small tensor op here would be a launch that adds to it, so the kernels compute every sequence's
// bounds themselves (cuda_glue::EvenlySpacedKeys) and cache_batch_idx alone builds index tensors.
Tensor varlen_attention_over_cache(const KvcacheProblem& kp, const Tensor& q, const Tensor& k_cache,
                                   const Tensor& v_cache, Tensor& lse) {
  const AttentionProblem& p = kp.problem;
  cuda_glue::EvenlySpacedKeys even{kp.capacity, kp.cache_seqlens, kp.seqlen_new};
  std::optional<std::tuple<Tensor, Tensor>> result;
  Tensor keys, values;
  if (kp.paged) {
    result = cuda_glue::paged_varlen_fwd(p, q.flatten(0, 1), k_cache, v_cache, *kp.block_table, even);
    if (!result) {  // each sequence's blocks in table order: sequence b at rows [b * capacity, (b + 1) * capacity)
      const Tensor ids = kp.block_table->clamp(0, kp.batch_cache - 1).flatten();
      keys = k_cache.index_select(0, ids).flatten(0, 1);
      values = v_cache.index_select(0, ids).flatten(0, 1);
    }
  } else {
    auto [packed_keys, rows_apart] = packed_cache(k_cache);
    auto [packed_values, value_rows_apart] = packed_cache(v_cache);
    if (value_rows_apart != rows_apart) {  // (one row spacing serves both: their entries must start alike)
      packed_keys = k_cache.contiguous().flatten(0, 1);
      packed_values = v_cache.contiguous().flatten(0, 1);
      rows_apart = kp.capacity;
    }
    keys = packed_keys, values = packed_values, even.rows_apart = rows_apart;
    if (kp.cache_batch_idx) {
      const Tensor seqlens_k = cuda_glue::key_counts(even, p.batch, kp.capacity, q.options().dtype(at::kInt));
      result = varlen_over_indexed_entries(kp, q, keys, values, rows_apart, seqlens_k);
    }
  }
  if (!result) result = cuda_glue::evenly_spaced_varlen_fwd(p, q.flatten(0, 1), keys, values, even);
  const auto& [out, packed_lse] = *result;
  // lse (nheads, batch * seqlen_q) -> (batch, nheads, seqlen_q)
  if (p.batch == 1) {
    lse = packed_lse.view({1, p.nheads, p.seqlen_q});
  } else {
    lse.copy_(packed_lse.view({p.nheads, p.batch, p.seqlen_q}).permute({1, 0, 2}));
  }
  return out.view({p.batch, p.seqlen_q, p.nheads, p.headdim_v});
}

std::tuple<Tensor, Tensor> kvcache_fwd_cuda(
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
  const AttentionProblem& p = kp.problem;
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max() / 2;  // int32 positions in the kernels
  TORCH_CHECK_VALUE(kp.capacity <= kMaxInt && kp.batch_cache <= kMaxInt && p.batch <= kMaxInt, kKvcacheCuda,
                    ": the cache's capacity, k_cache.size(0) and batch must be <= ", kMaxInt, ", got ", kp.capacity,
                    ", ", kp.batch_cache, " and ", p.batch);
  const c10::cuda::CUDAGuard device_guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const auto i32 = q.options().dtype(at::kInt);
  // where the append starts (cache_seqlens; the whole capacity when not given, when nothing is appended)
  auto whole_capacity = [&] { return at::full({p.batch}, kp.capacity, i32); };
  const bool appends = kp.seqlen_new > 0 || kp.rotary_dim > 0;
  const Tensor first_positions = kp.cache_seqlens ? *kp.cache_seqlens : appends ? whole_capacity() : Tensor();
  const Tensor q_attn = append_and_rotate(kp, q, k_cache, v_cache, k, v, first_positions, stream);

  Tensor out = at::empty({p.batch, p.seqlen_q, p.nheads, p.headdim_v}, q.options());
  Tensor lse = at::empty({p.batch, p.nheads, p.seqlen_q}, q.options().dtype(at::kFloat));
  if (out.numel() == 0 && lse.numel() == 0) return {out, lse};
  if (kp.capacity == 0 || kp.batch_cache == 0) {  // no key anywhere
    out.zero_();
    lse.fill_(std::numeric_limits<float>::infinity());
    return {out, lse};
  }
  // the keys each sequence has after the append: cache_seqlens + seqlen_new clamped to the capacity (the device-side
  // guard for bad cache_seqlens), done in the kernels
  const bool decoded = cuda_glue::try_decode_attention(
      q_attn, k_cache, v_cache,
      cuda_glue::DecodeKeys{kp.cache_seqlens, kp.block_table, kp.cache_batch_idx, std::nullopt, kp.seqlen_new},
      static_cast<float>(p.scale), p.causal, static_cast<int>(p.window_left), static_cast<int>(p.window_right),
      static_cast<float>(p.softcap), static_cast<int>(num_splits), out, lse);
  if (!decoded) out = varlen_attention_over_cache(kp, q_attn, k_cache, v_cache, lse);
  return {out, lse};
}

}  // namespace
}  // namespace fa2

TORCH_LIBRARY_IMPL(fa2, CUDA, m) { m.impl("kvcache_fwd", &fa2::kvcache_fwd_cuda); }
