// CUDA decode attention: torch tensors -> DecodeParams -> fa2::run_decode (fa2/decode/). try_decode_attention is
// what the KV-cache op calls (it falls back where the kernel declines); fa2::_decode_attention exposes the kernel alone
// for tests and benchmarks. No host synchronization; the split-KV scratch comes from torch's caching allocator, sized
// from shapes only (capture-safe).
#include "cuda/decode_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "fa2/decode/launch.h"

namespace fa2::cuda_glue {
namespace {

// The strides of dims 0..2 of a 4-D tensor, 0 where a dim has size 1 (index 0 reads the same with any stride).
void outer_strides(const at::Tensor& t, int64_t& s0, int64_t& s1, int64_t& s2) {
  s0 = t.size(0) > 1 ? t.stride(0) : 0;
  s1 = t.size(1) > 1 ? t.stride(1) : 0;
  s2 = t.size(2) > 1 ? t.stride(2) : 0;
}

bool int32_on(const at::Tensor& t, const at::Tensor& q, int64_t dims) {
  return t.scalar_type() == at::kInt && t.device() == q.device() && t.dim() == dims && t.stride(dims - 1) == 1;
}

// What the kernel needs beyond the caller's checks (layouts, index tensors); nullptr when all holds.
const char* tensors_decline(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const DecodeKeys& keys, const at::Tensor& out, const at::Tensor& lse) {
  const auto& [seqlens_k, block_table, cache_batch_idx, key_mask, seqlens_k_add] = keys;
  if (!q.is_cuda() || (q.scalar_type() != at::kHalf && q.scalar_type() != at::kBFloat16)) return "q not fp16/bf16 CUDA";
  if (k_cache.scalar_type() != q.scalar_type() || v_cache.scalar_type() != q.scalar_type()) return "dtypes differ";
  if (q.dim() != 4 || k_cache.dim() != 4 || v_cache.dim() != 4) return "q or a cache is not 4-D";
  if (k_cache.sizes() != v_cache.sizes() || k_cache.size(3) != q.size(3)) {
    return "the caches' shapes differ, or their headdim is not q's";
  }
  if (q.stride(3) != 1 || k_cache.stride(3) != 1 || v_cache.stride(3) != 1 || out.stride(3) != 1) {
    return "a last dim is not contiguous";
  }
  if (out.sizes() != q.sizes() || out.scalar_type() != q.scalar_type()) return "out is not shaped like q";
  if (lse.scalar_type() != at::kFloat || !lse.is_contiguous() ||
      lse.sizes() != at::IntArrayRef({q.size(0), q.size(2), q.size(1)})) {
    return "lse is not a contiguous float32 (batch, nheads, seqlen_q)";
  }
  if (seqlens_k && (!int32_on(*seqlens_k, q, 1) || seqlens_k->size(0) != q.size(0))) {
    return "seqlens_k is not int32 (batch,)";
  }
  if (block_table && (!int32_on(*block_table, q, 2) || block_table->size(0) != q.size(0))) {
    return "block_table is not int32 (batch, max_blocks) with unit column stride";
  }
  if (cache_batch_idx && (!int32_on(*cache_batch_idx, q, 1) || cache_batch_idx->size(0) != q.size(0))) {
    return "cache_batch_idx is not int32 (batch,)";
  }
  if (key_mask) {
    const int64_t capacity = block_table ? block_table->size(1) * k_cache.size(1) : k_cache.size(1);
    if (key_mask->scalar_type() != at::kBool || key_mask->device() != q.device() || key_mask->dim() != 2 ||
        key_mask->size(0) != q.size(0) || key_mask->size(1) != capacity ||
        (key_mask->size(1) > 1 && key_mask->stride(1) != 1)) {
      return "key_mask is not bool (batch, capacity) with unit key stride";
    }
  }
  return nullptr;
}

// Launches the decode kernel: nullptr, or why it does not take the call (then nothing was written). A launch that
// fails after the plan accepted the call raises.
const char* decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const DecodeKeys& keys, float scale, bool causal, int window_left, int window_right,
                             float softcap, int num_splits, at::Tensor& out, at::Tensor& lse) {
  if (const char* why = tensors_decline(q, k_cache, v_cache, keys, out, lse)) return why;
  const auto& [seqlens_k, block_table, cache_batch_idx, key_mask, seqlens_k_add] = keys;
  if (!(softcap > 0.f) && !(scale > 0.f)) return "a scale <= 0 without softcap";
  DecodeParams p;
  p.q = q.data_ptr();
  outer_strides(q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  outer_strides(k_cache, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  outer_strides(v_cache, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  if (seqlens_k) p.seqlens_k = seqlens_k->data_ptr<int>();
  if (seqlens_k_add < 0 || seqlens_k_add > std::numeric_limits<int32_t>::max()) return "seqlens_k_add out of range";
  p.seqlens_k_add = static_cast<int>(seqlens_k_add);
  if (block_table) {
    p.block_table = block_table->data_ptr<int>();
    p.block_table_batch_stride = block_table->stride(0);
    p.block_size = static_cast<int>(k_cache.size(1));
    p.capacity = static_cast<int>(block_table->size(1) * k_cache.size(1));
  } else {
    p.capacity = static_cast<int>(k_cache.size(1));
  }
  if (cache_batch_idx) p.cache_batch_idx = cache_batch_idx->data_ptr<int>();
  if (key_mask) {
    p.key_mask = key_mask->data_ptr<bool>();
    p.key_mask_batch_stride = key_mask->size(0) > 1 ? key_mask->stride(0) : 0;
  }
  p.cache_entries = static_cast<int>(k_cache.size(0));
  p.out = out.data_ptr();
  outer_strides(out, p.out_batch_stride, p.out_row_stride, p.out_head_stride);
  p.lse = lse.data_ptr<float>();
  p.batch = static_cast<int>(q.size(0));
  p.seqlen_q = static_cast<int>(q.size(1));
  p.nheads = static_cast<int>(q.size(2));
  p.nheads_k = static_cast<int>(k_cache.size(2));
  p.headdim = static_cast<int>(q.size(3));
  p.headdim_rounded = decode_headdim_rounded(p.headdim);
  if (p.headdim_rounded < 0) return "no decode instance for this headdim in this build";
  p.scale = scale;
  p.scale_log2 = scale * 1.4426950408889634f;
  p.softcap = softcap > 0.f ? softcap : 0.f;
  p.window_left = window_left;
  p.window_right = causal ? 0 : window_right;
  p.dtype = q.scalar_type() == at::kBFloat16 ? DType::kBFloat16 : DType::kFloat16;

  const c10::cuda::CUDAGuard device_guard(q.device());
  const DecodePlan plan = plan_decode_call(p, num_splits);
  if (plan.decline != nullptr) return plan.decline;
  at::Tensor workspace;
  if (plan.workspace_floats > 0) {
    workspace = at::empty({plan.workspace_floats}, q.options().dtype(at::kFloat));
    p.workspace = workspace.data_ptr<float>();
  }
  const char* err = run_decode(plan, p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == nullptr, "fa2 decode attention (CUDA) failed: ", err);
  return nullptr;
}

}  // namespace

bool try_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const DecodeKeys& keys, float scale, bool causal, int window_left, int window_right,
                          float softcap, int num_splits, at::Tensor& out, at::Tensor& lse) {
  return decode_attention(q, k_cache, v_cache, keys, scale, causal, window_left, window_right, softcap, num_splits,
                          out, lse) == nullptr;
}

namespace {

// fa2::_decode_attention (internal: tests and benchmarks of the kernel alone): raises where the kernel declines.
std::tuple<at::Tensor, at::Tensor> decode_attention_op(const at::Tensor& q, const at::Tensor& k_cache,
                                                       const at::Tensor& v_cache, const at::Tensor& seqlens_k,
                                                       const std::optional<at::Tensor>& block_table,
                                                       const std::optional<at::Tensor>& cache_batch_idx,
                                                       std::optional<double> scale, bool causal, int64_t window_left,
                                                       int64_t window_right, double softcap, int64_t num_splits) {
  TORCH_CHECK(q.dim() == 4 && k_cache.dim() == 4 && v_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(),
              "fa2._decode_attention: expected q (batch, seqlen_q, nheads, d) and caches of one 4-D shape, got q ",
              q.sizes(), ", k_cache ", k_cache.sizes(), ", v_cache ", v_cache.sizes());
  TORCH_CHECK(k_cache.size(3) == q.size(3) && k_cache.size(2) > 0 && q.size(2) % k_cache.size(2) == 0,
              "fa2._decode_attention: expected the caches' (nheads_k, d) to divide q's heads and match its d, got q ",
              q.sizes(), ", k_cache ", k_cache.sizes());
  const at::Tensor qc = q.contiguous();
  at::Tensor out = at::empty_like(qc);
  at::Tensor lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
  const float s = scale ? static_cast<float>(*scale) : 1.f / std::sqrt(static_cast<float>(q.size(3)));
  const DecodeKeys keys{seqlens_k, block_table, cache_batch_idx, std::nullopt, 0};
  const char* why = decode_attention(qc, k_cache, v_cache, keys, s, causal, static_cast<int>(window_left),
                                     static_cast<int>(window_right), static_cast<float>(softcap),
                                     static_cast<int>(num_splits), out, lse);
  TORCH_CHECK(why == nullptr, "fa2._decode_attention: the decode kernel does not take this call: ", why);
  return {out, lse};
}

}  // namespace
}  // namespace fa2::cuda_glue

TORCH_LIBRARY_IMPL(fa2, CUDA, m) { m.impl("_decode_attention", &fa2::cuda_glue::decode_attention_op); }
