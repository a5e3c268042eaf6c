// The KV cache's append kernel (fa2/kvcache_append.h). One warp per (batch, row, head) row of k, v or q (blockIdx.y
// picks which), its lanes striding over the head dim. A decode step appends a few rows: this is a copy of a few KiB,
// launched once, with the rotary math in fp32 on the way.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fa2/kvcache_append.h"
#include "fa2/ptx.cuh"

namespace fa2 {
namespace {

using ptx::from_float;
using ptx::to_float;

constexpr int kRowsPerBlock = 8;  // warps per CTA, one row each

// Column c of a row rotated at table row `angle_row` (columns past rotary_dim copied): the pair partner of c, the
// angle j, and out = x_c cos_j -+ x_partner sin_j.
template <typename T>
__device__ __forceinline__ T rotated_column(const T* row, int c, const KvcacheAppendParams& p, int angle_row) {
  if (c >= p.rotary_dim) return row[c];
  const int half = p.rotary_dim / 2;
  const bool first = p.rotary_interleaved ? (c % 2 == 0) : (c < half);
  const int j = p.rotary_interleaved ? c / 2 : (first ? c : c - half);
  const int partner = p.rotary_interleaved ? (first ? c + 1 : c - 1) : (first ? c + half : c - half);
  const float cos_j = to_float(static_cast<const T*>(p.rotary_cos)[angle_row * p.rotary_cos_row_stride + j]);
  const float sin_j = to_float(static_cast<const T*>(p.rotary_sin)[angle_row * p.rotary_sin_row_stride + j]);
  const float x = to_float(row[c]), y = to_float(row[partner]);
  return from_float<T>(first ? x * cos_j - y * sin_j : x * cos_j + y * sin_j);
}

// Where position `position` of batch element b lives in a cache (element offset of its row of head 0), or -1 when
// the position, the cache row or the block is out of range (the row is then not written).
__device__ __forceinline__ int64_t cache_row_offset(const KvcacheAppendParams& p, int b, int position,
                                                    int64_t batch_stride, int64_t row_stride) {
  if (position < 0 || position >= p.capacity) return -1;
  if (p.block_table != nullptr) {
    const int block = p.block_table[static_cast<int64_t>(b) * p.max_blocks + position / p.block_size];
    if (block < 0 || block >= p.cache_entries) return -1;
    return block * batch_stride + (position % p.block_size) * row_stride;
  }
  const int entry = p.cache_batch_idx != nullptr ? p.cache_batch_idx[b] : b;
  if (entry < 0 || entry >= p.cache_entries) return -1;
  return entry * batch_stride + position * row_stride;
}

template <typename T>
__global__ void kvcache_append_kernel(const KvcacheAppendParams p) {
  const int job = blockIdx.y;  // 0: k, 1: v, 2: q
  const int64_t row_id = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  const int rows = job == 2 ? p.seqlen_q : p.seqlen_new;
  const int heads = job == 2 ? p.nheads : p.nheads_k;
  if (row_id >= static_cast<int64_t>(p.batch) * rows * heads) return;
  const int h = static_cast<int>(row_id % heads);
  const int i = static_cast<int>((row_id / heads) % rows);
  const int b = static_cast<int>(row_id / (static_cast<int64_t>(heads) * rows));
  const int first = p.cache_seqlens[b];
  const bool rotate = p.rotary_dim > 0 && job != 1;
  const int position = first + (job != 2 || p.q_per_row ? i : 0);
  // (a position past the table reads its last row: only reachable with bad cache_seqlens, whose rows are not written)
  const int angle_row = rotate ? max(0, min(position, p.seqlen_ro - 1)) : 0;
  if (job == 2) {
    const T* src = static_cast<const T*>(p.q) + b * p.q_batch_stride + i * p.q_row_stride + h * p.q_head_stride;
    T* dst = static_cast<T*>(p.q_rot) + ((static_cast<int64_t>(b) * p.seqlen_q + i) * p.nheads + h) * p.headdim;
    for (int c = threadIdx.x; c < p.headdim; c += warpSize) dst[c] = rotated_column(src, c, p, angle_row);
    return;
  }
  const bool is_k = job == 0;
  const int64_t offset = cache_row_offset(p, b, position, is_k ? p.k_cache_batch_stride : p.v_cache_batch_stride,
                                          is_k ? p.k_cache_row_stride : p.v_cache_row_stride);
  if (offset < 0) return;
  const int headdim = is_k ? p.headdim : p.headdim_v;
  const T* src = is_k ? static_cast<const T*>(p.k_new) + b * p.k_new_batch_stride + i * p.k_new_row_stride +
                            h * p.k_new_head_stride
                      : static_cast<const T*>(p.v_new) + b * p.v_new_batch_stride + i * p.v_new_row_stride +
                            h * p.v_new_head_stride;
  T* dst = static_cast<T*>(is_k ? p.k_cache : p.v_cache) + offset +
           h * (is_k ? p.k_cache_head_stride : p.v_cache_head_stride);
  for (int c = threadIdx.x; c < headdim; c += warpSize) dst[c] = rotate ? rotated_column(src, c, p, angle_row) : src[c];
}

template <typename T>
const char* launch(const KvcacheAppendParams& p, cudaStream_t stream) {
  const bool rotate_q = p.rotary_dim > 0 && p.q_rot != nullptr;
  const int64_t kv_rows = static_cast<int64_t>(p.batch) * p.seqlen_new * p.nheads_k;
  const int64_t q_rows = rotate_q ? static_cast<int64_t>(p.batch) * p.seqlen_q * p.nheads : 0;
  const int64_t rows = kv_rows > q_rows ? kv_rows : q_rows;
  if (rows == 0) return nullptr;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (blocks > 0x7fffffff) return "fa2 kvcache append: too many rows for one launch";
  // (jobs 0 and 1 exit at once when there is nothing to append; job 2 only when q is rotated)
  const dim3 grid(static_cast<unsigned>(blocks), rotate_q ? 3 : 2);
  kvcache_append_kernel<T><<<grid, dim3(32, kRowsPerBlock), 0, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace

const char* run_kvcache_append(const KvcacheAppendParams& params, cudaStream_t stream) {
  return params.dtype == DType::kBFloat16 ? launch<__nv_bfloat16>(params, stream) : launch<__half>(params, stream);
}

}  // namespace fa2
