// Decode attention over a KV cache (FlashDecoding-style): one CTA per (split, kv head, batch element) takes every
// query row of its kv head at once (seqlen_q x nheads / nheads_k rows, GQA packing), so each cache byte is read once
// per call (above 64 rows: row blocks of 64, a CTA each). K/V tiles stream through a cp.async ring from a contiguous
// or paged cache; the four warps split the rows (16 each, mma.sync m16n8k16, rows padded to 16) and each key tile
// between them, each with its own online softmax, merged through shared memory at the end. With several splits of
// the KV length each CTA writes fp32 partials (out, lse) and decode_combine_kernel merges them.
#pragma once
#include <cmath>
#include <cstdint>

#include "fa2/decode/params.h"
#include "fa2/decode/tile_config.h"
#include "fa2/fwd/gemm.cuh"
#include "fa2/ptx.cuh"
#include "fa2/softmax.cuh"

namespace fa2 {
namespace decode {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.69314718055994531f;

template <typename T_, int kHeadDim_, int kWarpsM_>
struct DecodeTraits {
  using T = T_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = 4 / kWarpsM;
  static constexpr int kBlockM = 16 * kWarpsM;  // query rows per CTA
  static constexpr int kBlockN = decode_tile_config(kHeadDim).block_n;
  static constexpr int kStages = decode_tile_config(kHeadDim).stages;
  static constexpr int kKeysPerWarp = kBlockN / kWarpsN;
  static constexpr int kNTiles = kKeysPerWarp / 8;  // n8 tiles of S per warp
  static constexpr int kDTiles = kHeadDim / 8;      // n8 tiles of O per warp
  static constexpr int kChunks = kHeadDim / 8;      // 16-byte chunks per row
  using QTile = SwizzledTile<kBlockM, kHeadDim, smem_block_cols(kHeadDim)>;   // (kBlockM, d)
  using KVTile = SwizzledTile<kBlockN, kHeadDim, smem_block_cols(kHeadDim)>;  // (kBlockN, d)
  static constexpr int kQBytes = (QTile::kBytes + 1023) / 1024 * 1024;
  static constexpr int kStageBytes = 2 * KVTile::kBytes;  // K tile, then V tile
  static constexpr int kMergeRow = merge_row_floats(kHeadDim);
  static constexpr int kSmemBytes = decode_smem_bytes(kHeadDim, kWarpsM);
  static constexpr int kLoadsPerThread = kBlockN * kChunks / kThreads;  // 16-byte copies of K (and of V) per tile

  static_assert(kWarpsM == 1 || kWarpsM == 2 || kWarpsM == 4, "four warps split over rows and keys");
  static_assert(kKeysPerWarp % 16 == 0, "P of a warp covers whole k16 steps");
  static_assert(kHeadDim % 16 == 0, "V fragments come in pairs of n8 tiles");
  static_assert(KVTile::kBytes % 1024 == 0, "stage bases stay 1024-byte aligned (SwizzledTile::fragment_address)");
  static_assert(kBlockN * kChunks % kThreads == 0, "whole copies per thread");
  static_assert(kQBytes + kStages * kStageBytes <= kSmemBytes, "decode_smem_bytes covers the ring");
};

// Keys [lo, hi) that query row i sees: below seqlen_k, and within the window aligned bottom-right over seqlen_k
// (causal: window_right 0). hi <= lo: none.
struct RowKeys {
  int lo, hi;
};
__device__ __forceinline__ RowKeys row_keys(const DecodeParams& p, int i, int seqlen_k) {
  const int diag = i + seqlen_k - p.seqlen_q;
  RowKeys r;
  r.lo = p.window_left >= 0 ? max(0, diag - p.window_left) : 0;
  r.hi = p.window_right >= 0 ? min(seqlen_k, diag + p.window_right + 1) : seqlen_k;
  return r;
}

// Where batch element b's keys live: a contiguous cache row (cache_batch_idx) or the pages of its block_table row.
template <typename T>
struct CacheRows {
  const T* k;  // the kv head's first element in the cache (block 0 / cache row 0)
  const T* v;
  const int* block_table;  // this batch element's row; nullptr: contiguous
  int64_t cache_row;       // contiguous: the cache row (in units of k_batch_stride)
  int block_size;

  // Element offsets of key `key` in K and in V.
  __device__ __forceinline__ void offsets(const DecodeParams& p, int key, int64_t& k_off, int64_t& v_off) const {
    int64_t block = cache_row, row = key;
    if (block_table != nullptr) {
      block = min(max(block_table[key / block_size], 0), p.cache_entries - 1);
      row = key % block_size;
    }
    k_off = block * p.k_batch_stride + row * p.k_row_stride;
    v_off = block * p.v_batch_stride + row * p.v_row_stride;
  }
};

// Starts the cp.async copies of key tile `tile` (kBlockN keys) into K and V at s_k / s_v; keys >= seqlen_k and
// columns >= headdim become zeros (0 * V never meets stale bytes).
template <class Traits, typename T>
__device__ __forceinline__ void load_kv_tile(const DecodeParams& p, const CacheRows<T>& rows, int tile, int seqlen_k,
                                             uint32_t s_k, uint32_t s_v, int tid) {
  using KVTile = typename Traits::KVTile;
#pragma unroll
  for (int it = 0; it < Traits::kLoadsPerThread; ++it) {
    const int idx = tid + it * kThreads;
    const int r = idx / Traits::kChunks, c = idx % Traits::kChunks;
    const int key = tile * Traits::kBlockN + r;
    const bool pred = key < seqlen_k && c * 8 < p.headdim;
    int64_t k_off = 0, v_off = 0;
    if (pred) rows.offsets(p, key, k_off, v_off);
    const uint32_t dst = KVTile::offset(r, c) * 2;
    ptx::cp_async_16(s_k + dst, rows.k + (pred ? k_off + c * 8 : 0), pred);
    ptx::cp_async_16(s_v + dst, rows.v + (pred ? v_off + c * 8 : 0), pred);
  }
}

// The merged result of one CTA row: written as the final out / lse (one split) or as fp32 partials.
template <class Traits>
__device__ __forceinline__ void store_row(const DecodeParams& p, int num_splits, int split, int b, int h, int i,
                                          int c, const float (&o)[4], float inv_sum, float lse, bool write_lse) {
  using T = typename Traits::T;
  const int64_t row_id = (int64_t(b) * p.nheads + h) * p.seqlen_q + i;  // lse's (batch, nheads, seqlen_q) order
  if (num_splits == 1) {
    T* out = static_cast<T*>(p.out) + b * p.out_batch_stride + i * p.out_row_stride + h * p.out_head_stride + c;
    uint2 packed;
    packed.x = ptx::pack2<T>(o[0] * inv_sum, o[1] * inv_sum);
    packed.y = ptx::pack2<T>(o[2] * inv_sum, o[3] * inv_sum);
    *reinterpret_cast<uint2*>(out) = packed;
    if (write_lse) p.lse[row_id] = lse;
  } else {
    const int64_t total_rows = int64_t(p.batch) * p.nheads * p.seqlen_q;
    const int64_t part_row = split * total_rows + row_id;
    float* part_out = p.workspace + part_row * p.headdim + c;
    *reinterpret_cast<float4*>(part_out) = make_float4(o[0] * inv_sum, o[1] * inv_sum, o[2] * inv_sum, o[3] * inv_sum);
    if (write_lse) p.workspace[num_splits * total_rows * p.headdim + part_row] = lse;
  }
}

// After the key loop (every copy landed, the ring free): the warps that split the keys of the same rows merge their
// (m, l, O) through shared memory, and the CTA writes each row normalized. A row that saw no key gets out 0 and lse
// +inf (-inf in a partial, which the combine then skips).
template <class Traits>
__device__ __forceinline__ void merge_and_store(const DecodeParams& p, unsigned char* smem_merge,
                                                const OnlineSoftmax<1>& softmax, float (&acc_o)[1][Traits::kDTiles][4],
                                                float mult, int num_splits, int split, int b, int kvh, int row0,
                                                int rows_here, int group, int warp_m, int warp_n, int lane, int tid) {
  constexpr int kBlockM = Traits::kBlockM, kWarpsN = Traits::kWarpsN, kMergeRow = Traits::kMergeRow;
  float* s_o = reinterpret_cast<float*>(smem_merge);  // (kWarpsN, kBlockM, kMergeRow): each warp's scaled O
  float* s_m = s_o + kWarpsN * kBlockM * kMergeRow;   // (kWarpsN, kBlockM): each warp's row max (score units)
  float* s_l = s_m + kWarpsN * kBlockM;               // (kWarpsN, kBlockM): each warp's row sum under that max

  // -- each warp's row max and row sum
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = warp_m * 16 + lane / 4 + 8 * half;
    const float l = ptx::quad_sum(softmax.row_sum[half]);
    if (lane % 4 == 0) {
      s_m[warp_n * kBlockM + r] = softmax.row_max[half];
      s_l[warp_n * kBlockM + r] = l;
    }
  }
  __syncthreads();
  // -- each warp's O, rescaled to the rows' common max
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = warp_m * 16 + lane / 4 + 8 * half;
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarpsN; ++w) m_all = fmaxf(m_all, s_m[w * kBlockM + r]);
    const float m_own = softmax.row_max[half];
    const float factor = m_own == -INFINITY ? 0.f : exp2f((m_own - m_all) * mult);
    float* dst = s_o + (warp_n * kBlockM + r) * kMergeRow + (lane % 4) * 2;
#pragma unroll
    for (int dt = 0; dt < Traits::kDTiles; ++dt) {
      *reinterpret_cast<float2*>(dst + dt * 8) =
          make_float2(acc_o[0][dt][2 * half] * factor, acc_o[0][dt][2 * half + 1] * factor);
    }
  }
  __syncthreads();
  // -- sum over the warps, normalize, store: a thread per (row, 4 columns)
  constexpr int kQuads = Traits::kHeadDim / 4;
  for (int idx = tid; idx < kBlockM * kQuads; idx += kThreads) {
    const int r = idx / kQuads, c = (idx % kQuads) * 4;
    if (r >= rows_here || c >= p.headdim) continue;
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarpsN; ++w) m_all = fmaxf(m_all, s_m[w * kBlockM + r]);
    float l_all = 0.f;
    float o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < kWarpsN; ++w) {
      const float m_w = s_m[w * kBlockM + r];
      if (m_w != -INFINITY) l_all += s_l[w * kBlockM + r] * exp2f((m_w - m_all) * mult);
      const float4 part = *reinterpret_cast<const float4*>(s_o + (w * kBlockM + r) * kMergeRow + c);
      o[0] += part.x;
      o[1] += part.y;
      o[2] += part.z;
      o[3] += part.w;
    }
    const bool seen = l_all > 0.f;
    const float inv_sum = seen ? 1.f / l_all : 0.f;
    const float lse = seen ? __fmaf_rn(m_all, mult * kLn2, logf(l_all)) : (num_splits > 1 ? -INFINITY : INFINITY);
    const int row = row0 + r;  // the kv head's row: query row / group of head kvh * group + row % group
    store_row<Traits>(p, num_splits, split, b, kvh * group + row % group, row / group, c, o, inv_sum, lse, c == 0);
  }
}

// Masks S (this thread's keys from key0, as mask_scores) where the key mask hides the key: keys past seqlen_k are
// masked already and not read.
template <int kNTiles>
__device__ __forceinline__ void mask_hidden_keys(float (&s)[1][kNTiles][4], const bool* key_mask, int seqlen_k,
                                                 int key0) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = key0 + nt * 8 + e;
      if (key < seqlen_k && !key_mask[key]) s[0][nt][e] = s[0][nt][e + 2] = -INFINITY;
    }
}

// Masks S (this warp's 16 rows x kKeysPerWarp keys of the tile from key n0) outside each row's visible keys.
template <int kNTiles>
__device__ __forceinline__ void mask_scores(float (&s)[1][kNTiles][4], const RowKeys (&keys)[2], int key0) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + nt * 8 + (e & 1);
      const RowKeys& rk = keys[e >> 1];
      if (key < rk.lo || key >= rk.hi) s[0][nt][e] = -INFINITY;
    }
}

template <class Traits>
__global__ void __launch_bounds__(kThreads) decode_kernel(const DecodeParams p, int num_splits) {
  using T = typename Traits::T;
  using QTile = typename Traits::QTile;
  using KVTile = typename Traits::KVTile;
  constexpr int kBlockN = Traits::kBlockN, kStages = Traits::kStages, kChunks = Traits::kChunks;
  constexpr int kNTiles = Traits::kNTiles, kDTiles = Traits::kDTiles;
  extern __shared__ __align__(1024) unsigned char smem[];  // 1024: see SwizzledTile::fragment_address

  const int split = blockIdx.x % num_splits, row_block = blockIdx.x / num_splits, kvh = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int warp_m = warp / Traits::kWarpsN, warp_n = warp % Traits::kWarpsN;
  const int group = p.nheads / p.nheads_k;
  // the kv head's row r: query r / group of head kvh * group + r % group; this CTA's: row0 + 0 .. rows_here - 1
  const int row0 = row_block * Traits::kBlockM;
  const int rows_here = min(p.seqlen_q * group - row0, Traits::kBlockM);
  // (in 64 bits: a bad cache_seqlens near INT_MAX plus the appended rows must clamp, not wrap)
  const int seqlen_k = p.seqlens_k != nullptr
                           ? static_cast<int>(min(max(static_cast<int64_t>(p.seqlens_k[b]) + p.seqlens_k_add,
                                                      int64_t{0}), static_cast<int64_t>(p.capacity)))
                           : p.capacity;

  // -- this split's key tiles: an equal share of the tiles any row of the CTA sees (rows' ranges move right with i)
  const RowKeys first_row = row_keys(p, row0 / group, seqlen_k);
  const RowKeys last_row = row_keys(p, (row0 + rows_here - 1) / group, seqlen_k);
  const int tile_lo = first_row.lo / kBlockN;
  const int tile_hi = last_row.hi > first_row.lo ? (last_row.hi + kBlockN - 1) / kBlockN : tile_lo;
  const int per_split = (tile_hi - tile_lo + num_splits - 1) / num_splits;
  const int t_begin = tile_lo + split * per_split, t_end = min(tile_hi, t_begin + per_split);
  // keys every row sees: a tile inside them needs no mask
  const int all_lo = last_row.lo, all_hi = first_row.hi;

  const uint32_t s_q = ptx::smem_u32(smem);
  const uint32_t s_ring = s_q + Traits::kQBytes;

  // -- Q (kBlockM, d): rows past `rows` and columns past headdim are zeros
  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + int64_t(kvh) * group * p.q_head_stride;
  for (int idx = tid; idx < Traits::kBlockM * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks, row = row0 + r;
    const bool pred = r < rows_here && c * 8 < p.headdim;
    const T* src = pred ? q + (row / group) * p.q_row_stride + (row % group) * p.q_head_stride + c * 8 : q;
    ptx::cp_async_16(s_q + QTile::offset(r, c) * 2, src, pred);
  }

  CacheRows<T> cache;
  cache.k = static_cast<const T*>(p.k_cache) + kvh * p.k_head_stride;
  cache.v = static_cast<const T*>(p.v_cache) + kvh * p.v_head_stride;
  cache.block_table = p.block_table != nullptr ? p.block_table + b * p.block_table_batch_stride : nullptr;
  cache.cache_row = p.cache_batch_idx != nullptr ? min(max(p.cache_batch_idx[b], 0), p.cache_entries - 1) : b;
  cache.block_size = p.block_size;

  // -- prologue: kStages - 1 tiles in flight (Q joins the first group); one commit group per tile, empty past the end
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (t_begin + s < t_end) {
      const uint32_t s_k = s_ring + s * Traits::kStageBytes;
      load_kv_tile<Traits>(p, cache, t_begin + s, seqlen_k, s_k, s_k + KVTile::kBytes, tid);
    }
    ptx::cp_async_commit();
  }

  // ldmatrix lane bases (as the forward's, fwd/tile_context.cuh), this warp's rows of Q and keys of each tile
  const int warp_key0 = warp_n * Traits::kKeysPerWarp;
  const uint32_t q_lane = s_q + QTile::const_bytes(warp_m * 16, 0) + QTile::lane_bytes(lane & 15, lane >> 4);
  const uint32_t k_lane = KVTile::lane_bytes(warp_key0 + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const uint32_t v_lane = KVTile::lane_bytes(warp_key0 + (lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);
  // this thread's two fragment rows (lane / 4, + 8) and the keys each sees (padding rows: the last query's)
  RowKeys keys[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + warp_m * 16 + lane / 4 + 8 * half;
    keys[half] = row_keys(p, min(row / group, p.seqlen_q - 1), seqlen_k);
  }
  const bool* const key_mask = p.key_mask != nullptr ? p.key_mask + b * p.key_mask_batch_stride : nullptr;
  const bool softcap = p.softcap > 0.f;
  const float mult = softcap ? kLog2e : p.scale_log2;  // scores -> log2 units (the exp2's FMA)
  const float scale_over_cap = softcap ? p.scale / p.softcap : 0.f;

  OnlineSoftmax<1> softmax;
  float acc_o[1][kDTiles][4];  // O (16 rows, d) of this warp's rows over its keys, unnormalized
  ptx::zero(acc_o);

  for (int t = t_begin, it = 0; t < t_end; ++t, ++it) {
    // -- tile t landed (this thread's copies, then the barrier); every warp is done with the stage refilled next
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();
    if (t + kStages - 1 < t_end) {
      const uint32_t s_k = s_ring + ((it + kStages - 1) % kStages) * Traits::kStageBytes;
      load_kv_tile<Traits>(p, cache, t + kStages - 1, seqlen_k, s_k, s_k + KVTile::kBytes, tid);
    }
    ptx::cp_async_commit();
    const uint32_t s_k = s_ring + (it % kStages) * Traits::kStageBytes, s_v = s_k + KVTile::kBytes;

    // -- S = Q K^T (16 rows, kKeysPerWarp keys)
    float acc_s[1][kNTiles][4];
    ptx::zero(acc_s);
    fwd::gemm_qk<T, QTile, KVTile, 1, kNTiles, Traits::kHeadDim>(acc_s, q_lane, s_k + k_lane);
    if (softcap) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[0][nt][e] = p.softcap * tanhf(acc_s[0][nt][e] * scale_over_cap);
    }
    const int n0 = t * kBlockN;
    if (n0 < all_lo || n0 + kBlockN > all_hi) mask_scores(acc_s, keys, n0 + warp_key0 + (lane % 4) * 2);
    if (key_mask != nullptr) mask_hidden_keys(acc_s, key_mask, seqlen_k, n0 + warp_key0 + (lane % 4) * 2);

    // -- online softmax, then O += P V
    softmax.update</*kHeavyRows=*/false>(acc_s, acc_o, mult, 0.f);
    fwd::gemm_pv<T, KVTile, 1, kNTiles, kDTiles>(acc_o, acc_s, s_v + v_lane);
  }
  ptx::cp_async_wait<0>();
  // (the combine kernel, a programmatic dependent where the plan says so, may be scheduled from here: it waits for
  // this grid's partials itself)
  if (num_splits > 1 && tid == 0) ptx::launch_dependent_grids();
  __syncthreads();  // the ring becomes the merge's scratch
  merge_and_store<Traits>(p, smem + Traits::kQBytes, softmax, acc_o, mult, num_splits, split, b, kvh, row0,
                          rows_here, group, warp_m, warp_n, lane, tid);
}

// Merges the splits' partials of each (batch, head, query) row: lse = log sum exp(lse_s), out = sum exp(lse_s - lse)
// out_s. A warp per row; a split that saw no key (lse_s = -inf) weighs 0 (its partial out is 0); a row no split saw:
// out 0, lse +inf. Each lane reads the partial lse of splits lane, lane + 32, ... once and keeps their weights; the
// out loop takes split s's weight from its lane by a shuffle, so its loads of the partials depend on nothing loaded
// before them and go out back to back (a load of lse_s and a branch on it before each partial's load serialized two
// L2 round trips per split).
template <typename T>
__global__ void __launch_bounds__(kThreads) decode_combine_kernel(const DecodeParams p, int num_splits) {
  constexpr int kSplitsPerLane = (kMaxSplits + 31) / 32;
  const int64_t total_rows = int64_t(p.batch) * p.nheads * p.seqlen_q;
  const int64_t row_id = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  ptx::wait_for_prior_grids();  // the split CTAs' partials (a no-op unless launched as their programmatic dependent)
  if (row_id >= total_rows) return;  // (the whole warp: one row per warp)
  const float* part_lse = p.workspace + num_splits * total_rows * p.headdim;

  float lse_s[kSplitsPerLane];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kSplitsPerLane; ++j) {
    const int s = lane + 32 * j;
    lse_s[j] = s < num_splits ? part_lse[s * total_rows + row_id] : -INFINITY;
    m = fmaxf(m, lse_s[j]);
  }
  m = ptx::warp_max(m);
  const bool seen = m != -INFINITY;
  float sum = 0.f;
  if (seen) {
#pragma unroll
    for (int j = 0; j < kSplitsPerLane; ++j) sum += expf(lse_s[j] - m);
  }
  sum = ptx::warp_sum(sum);
  const float lse = seen ? m + logf(sum) : INFINITY;
  float weight[kSplitsPerLane];  // exp(lse_s - lse): 0 for a split that saw no key, and for a row no split saw
#pragma unroll
  for (int j = 0; j < kSplitsPerLane; ++j) weight[j] = seen ? expf(lse_s[j] - lse) : 0.f;

  const int i = row_id % p.seqlen_q, h = (row_id / p.seqlen_q) % p.nheads, b = row_id / (int64_t(p.seqlen_q) * p.nheads);
  T* out = static_cast<T*>(p.out) + b * p.out_batch_stride + i * p.out_row_stride + h * p.out_head_stride;
  const int64_t split_stride = total_rows * p.headdim;
  // (every lane runs every iteration, the shuffles' sources among them. The loads are unconditional, so that they
  // issue back to back: a lane past the head dim and a batch's slots past the last split read a valid partial and
  // weigh it 0. Predicated loads into zeroed registers were issued one at a time, each behind the previous one's use.)
  for (int c0 = 0; c0 < p.headdim; c0 += 128) {
    const int c = c0 + lane * 4;
    const bool active = c < p.headdim;
    const float* part = p.workspace + row_id * p.headdim + (active ? c : 0);
    float o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < kSplitsPerLane; ++j) {
      const int splits_here = min(32, num_splits - 32 * j);  // (the same in every lane)
      constexpr int kBatch = 8;  // partials loaded before any is used
      for (int t0 = 0; t0 < splits_here; t0 += kBatch) {
        float w[kBatch];
        float4 v[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const float w_lane = __shfl_sync(0xffffffffu, weight[j], (t0 + u) % 32);
          w[u] = active && t0 + u < splits_here ? w_lane : 0.f;
          const int split = 32 * j + min(t0 + u, splits_here - 1);
          v[u] = *reinterpret_cast<const float4*>(part + split * split_stride);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          o[0] += w[u] * v[u].x;
          o[1] += w[u] * v[u].y;
          o[2] += w[u] * v[u].z;
          o[3] += w[u] * v[u].w;
        }
      }
    }
    if (active) {
      uint2 packed;
      packed.x = ptx::pack2<T>(o[0], o[1]);
      packed.y = ptx::pack2<T>(o[2], o[3]);
      *reinterpret_cast<uint2*>(out + c) = packed;
    }
  }
  if (lane == 0) p.lse[row_id] = lse;
}

}  // namespace decode
}  // namespace fa2
