// The KV cache's append (fa2::kvcache_fwd on CUDA): the new keys / values written into a contiguous or paged cache
// at cache_seqlens[b] + i (k rotated on the way when rotary_dim > 0), and q rotated into a buffer of its own, in one
// launch. Plain C++: nothing here includes torch. Strides are in elements.
//
// Device-side guard (the index VALUES are not checked on the host on CUDA: that would need a sync): a row whose
// position falls outside the sequence's capacity, whose cache row (cache_batch_idx) or block (block_table) is out of
// range, is not written; a rotary position past the cos / sin table reads its last row. Bad indices never write
// outside the caches.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "fa2/params.h"  // DType

namespace fa2 {

struct KvcacheAppendParams {
  DType dtype = DType::kFloat16;
  int batch = 0, nheads_k = 0, headdim = 0, headdim_v = 0;

  // new rows: k (batch, seqlen_new, nheads_k, headdim), v (..., headdim_v); seqlen_new 0 = nothing to append
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int seqlen_new = 0;
  int64_t k_new_batch_stride = 0, k_new_row_stride = 0, k_new_head_stride = 0;
  int64_t v_new_batch_stride = 0, v_new_row_stride = 0, v_new_head_stride = 0;

  // the caches: (batch_cache, seqlen_cache, ...) contiguous, or (num_blocks, block_size, ...) with block_table
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int64_t k_cache_batch_stride = 0, k_cache_row_stride = 0, k_cache_head_stride = 0;
  int64_t v_cache_batch_stride = 0, v_cache_row_stride = 0, v_cache_head_stride = 0;
  int cache_entries = 0;            // k_cache's dim 0: cache rows (contiguous) or blocks (paged)
  int capacity = 0;                 // keys one sequence can hold (seqlen_cache, or max_blocks * block_size)
  const int* cache_seqlens = nullptr;    // int32 (batch,): the append's first position
  const int* cache_batch_idx = nullptr;  // int32 (batch,) or null (row b); contiguous caches only
  const int* block_table = nullptr;      // int32 (batch, max_blocks) contiguous, or null (contiguous cache)
  int max_blocks = 0, block_size = 0;

  // rotary (rotary_dim > 0): cos / sin (seqlen_ro, rotary_dim / 2) in dtype, last dim contiguous
  int rotary_dim = 0;
  bool rotary_interleaved = false;  // pairs (2j, 2j + 1), else (j, j + rotary_dim / 2)
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int64_t rotary_cos_row_stride = 0, rotary_sin_row_stride = 0;
  int seqlen_ro = 0;

  // q rotated (rotary_dim > 0 and q_rot set): q (batch, seqlen_q, nheads, headdim) -> q_rot contiguous, row i at
  // cache_seqlens[b] + i when q_per_row (causal or windowed), else at cache_seqlens[b]
  const void* q = nullptr;
  void* q_rot = nullptr;
  int seqlen_q = 0, nheads = 0;
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  bool q_per_row = false;
};

// Launches the append (and q's rotation) on `stream`, asynchronously; nullptr on success, else a message.
const char* run_kvcache_append(const KvcacheAppendParams& params, cudaStream_t stream);

}  // namespace fa2
