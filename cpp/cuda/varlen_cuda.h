// The CUDA varlen forward over a paged key/value cache, for the KV-cache op's chunked prefill (cpp/cuda/kvcache_cuda.cpp).
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace fa2::cuda_glue {

// fa2::varlen_fwd's kernels (out (total_q, nheads, headdim), lse (nheads, total_q)) with sequence b's keys and
// values in a paged (num_pages, page_size, nheads_k, headdim) cache: key j in page block_table[b, j / page_size]
// (int32 (batch, pages_per_sequence)), the first seqused_k[b] of them seen; cu_seqlens_k is not read for the keys.
// Returns nullopt, launching nothing, where the kernels cannot read the pages in place (the sm80 path, a layout the
// TMA does not take): the caller gathers them.
std::optional<std::tuple<at::Tensor, at::Tensor>> paged_varlen_fwd(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_table,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, const at::Tensor& seqused_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, double scale, bool causal, int64_t window_left,
    int64_t window_right, double softcap);

}  // namespace fa2::cuda_glue
