// The CUDA decode kernel's entry point for the KV-cache op (fa2/decode/: one CTA per kv head reads the cache once).
#pragma once
#include <ATen/ATen.h>
#include <optional>
namespace fa2::cuda_glue {
// Attention of q (batch, seqlen_q, nheads, d), contiguous, over the first seqlens_k[b] keys (none: all) of a contiguous
// (batch_cache, seqlen_cache, nheads_k, d) or paged (num_blocks, block_size, nheads_k, d) cache; block_table int32
// (batch, max_blocks) when paged; cache_batch_idx int32 (batch,) or none; causal / windows bottom-right over
// seqlens_k[b]. Writes out (like q) and lse (float32 (batch, nheads, seqlen_q), +inf for a row that sees no key).
// Returns false, doing nothing, when the decode kernel does not take this problem (the caller falls back).
bool try_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const std::optional<at::Tensor>& seqlens_k, const std::optional<at::Tensor>& block_table,
                          const std::optional<at::Tensor>& cache_batch_idx, float scale, bool causal,
                          int window_left, int window_right, float softcap, int num_splits,
                          at::Tensor& out, at::Tensor& lse);
}
