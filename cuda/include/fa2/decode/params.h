// The decode kernel's parameter struct (attention of a few query rows over a KV cache): plain C++, no torch.
// Strides are in elements. The caller (cpp/cuda/decode_cuda.cpp) fills it; the plan (decode/plan.h) adds the split.
#pragma once
#include <cstdint>

#include "fa2/params.h"  // DType

namespace fa2 {

struct DecodeParams {
  const void* q = nullptr;  // (batch, seqlen_q, nheads, headdim)
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  // Contiguous cache (batch_cache, seqlen_cache, nheads_k, headdim), or paged (num_blocks, block_size, nheads_k,
  // headdim): then *_batch_stride steps one block.
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  const int* seqlens_k = nullptr;        // (batch,) device: the keys batch element b attends to (clamped to capacity);
                                         // nullptr = every element attends to its whole capacity
  int seqlens_k_add = 0;                 // added to seqlens_k[b] before the clamp (the KV cache's appended rows)
  const int* block_table = nullptr;      // paged: (batch, max_blocks) device, row stride block_table_batch_stride
  int64_t block_table_batch_stride = 0;
  int block_size = 0;                    // paged: keys per block
  const int* cache_batch_idx = nullptr;  // contiguous: (batch,) cache row of batch element b; nullptr = b
  // a key mask (fa2.attention's bool key-row bias): key j of element b is seen iff key_mask[b * stride + j] != 0
  // (on top of seqlens_k / causal / windows); nullptr = none
  const bool* key_mask = nullptr;
  int64_t key_mask_batch_stride = 0;

  void* out = nullptr;  // like q
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;
  float* lse = nullptr;  // (batch, nheads, seqlen_q) contiguous; natural log; +inf for a row that sees no key

  int batch = 0, seqlen_q = 0, nheads = 0, nheads_k = 0;
  int headdim = 0;        // a multiple of 8; loads and stores are predicated on it
  int headdim_rounded = 0;  // the instance's headdim (>= headdim)
  int capacity = 0;       // keys a batch element can hold: seqlen_cache, or max_blocks * block_size (sizes the plan)
  // cache rows (batch_cache) or blocks (num_blocks): cache_batch_idx / block_table values are clamped into them, so a
  // bad index (not checked on the host: that would sync) never reads outside the cache
  int cache_entries = 0;

  float scale = 0.f;       // applied to q.k
  float scale_log2 = 0.f;  // scale * log2(e) (no softcap)
  float softcap = 0.f;     // 0 = off; else s = softcap * tanh(scale q.k / softcap)
  // bottom-right over seqlens_k[b]: query i sees keys [i + sk - sq - left, i + sk - sq + right] (causal: right 0);
  // -1 unbounded
  int window_left = -1;
  int window_right = -1;
  DType dtype = DType::kFloat16;

  // Split-KV scratch (the plan's workspace_floats, any content): fp32 partial outputs (num_splits, batch, nheads,
  // seqlen_q, headdim) then partial lse (num_splits, batch, nheads, seqlen_q). Unused with one split.
  float* workspace = nullptr;
};

}  // namespace fa2
