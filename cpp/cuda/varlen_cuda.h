// The CUDA varlen forward over a key/value cache's evenly spaced sequences, contiguous or paged, for the KV-cache op's
// chunked prefill (cpp/cuda/kvcache_cuda.cpp).
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "checks.h"

namespace fa2::cuda_glue {

// The KV-cache op's sequences, evenly spaced: sequence b is q's rows [b * seqlen_q, (b + 1) * seqlen_q) and keys from
// row b * rows_apart of the packed keys, clamp(seqused_k[b] + seqused_k_added, 0, seqlen_k) of them (seqlen_k: the
// capacity; all of them without seqused_k). The sm_90a kernels compute each sequence's bounds (params.h,
// varlen_q_rows_each): no index tensor is built, so no tensor op runs before the attention (for the sm80 path's kernels
// the glue builds them).
struct EvenlySpacedKeys {
  int64_t rows_apart = 0;
  std::optional<at::Tensor> seqused_k;  // int32 (batch,), on q's device
  int64_t seqused_k_added = 0;
};

// Each sequence's key count as a tensor (int32 (batch,), i32: its options), clamp(seqused_k[b] + seqused_k_added, 0,
// max_keys), or max_keys without seqused_k: what the sm_90a kernels compute, for the kernels that read index tensors.
at::Tensor key_counts(const EvenlySpacedKeys& even, int64_t batch, int64_t max_keys, const at::TensorOptions& i32);

// fa2::varlen_fwd's kernels (out (batch * seqlen_q, nheads, headdim), lse (nheads, batch * seqlen_q)) over such
// sequences. problem: the KV-cache op's checked sizes and flags (batch, seqlen_q, seqlen_k = the capacity); q
// (batch * seqlen_q, nheads, headdim); keys / values packed (total_k, nheads_k, headdim).
std::tuple<at::Tensor, at::Tensor> evenly_spaced_varlen_fwd(const AttentionProblem& problem, const at::Tensor& q,
                                                            const at::Tensor& keys, const at::Tensor& values,
                                                            const EvenlySpacedKeys& even);

// The same with sequence b's keys and values in a paged (num_pages, page_size, nheads_k, headdim) cache: key j in page
// block_table[b, j / page_size] (int32 (batch, pages_per_sequence)); even.rows_apart is not read. Returns nullopt,
// launching nothing, where the kernels cannot read the pages in place (the sm80 path, a layout the TMA does not
// take): the caller gathers them.
std::optional<std::tuple<at::Tensor, at::Tensor>> paged_varlen_fwd(const AttentionProblem& problem,
                                                                   const at::Tensor& q, const at::Tensor& k_cache,
                                                                   const at::Tensor& v_cache,
                                                                   const at::Tensor& block_table,
                                                                   const EvenlySpacedKeys& even);

}  // namespace fa2::cuda_glue
