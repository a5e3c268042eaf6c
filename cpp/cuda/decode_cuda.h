// The CUDA decode kernel's entry point for the KV-cache op (fa2/decode/: one CTA per kv head reads the cache once).
#pragma once
#include <ATen/ATen.h>
#include <optional>
namespace fa2::cuda_glue {
// Where each batch element's keys are, and which of them it attends to.
struct DecodeKeys {
  std::optional<at::Tensor> seqlens_k;        // int32 (batch,): the first seqlens_k[b] keys; none: all of them
  std::optional<at::Tensor> block_table;      // int32 (batch, max_blocks): a paged cache's pages
  std::optional<at::Tensor> cache_batch_idx;  // int32 (batch,): a contiguous cache's row of element b; none: b
  std::optional<at::Tensor> key_mask;         // bool (batch, capacity), unit key stride: keys hidden where false
  int64_t seqlens_k_add = 0;                  // added to seqlens_k[b] in the kernel (then clamped to the capacity)
};

// Attention of q (batch, seqlen_q, nheads, d), contiguous, over the keys (DecodeKeys) of a contiguous
// (batch_cache, seqlen_cache, nheads_k, d) or paged (num_blocks, block_size, nheads_k, d) cache; causal / windows
// bottom-right over seqlens_k[b]. Writes out (like q) and lse (float32 (batch, nheads, seqlen_q), +inf for a row that
// sees no key). Returns false, doing nothing, when the decode kernel does not take this problem (the caller falls
// back).
bool try_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const DecodeKeys& keys, float scale, bool causal, int window_left, int window_right,
                          float softcap, int num_splits, at::Tensor& out, at::Tensor& lse);
}
