// FlashAttention-2 backward, sm80 instruction path (mma.sync m16n8k16, ldmatrix, cp.async); runs on sm80..sm90.
//
// Three kernels, all on one stream:
//   1. bwd_preprocess_kernel:  D = rowsum(dO * O) (fp32, (batch, nheads, seqlen_q)); zeroes dq_accum (and the ws
//      kernel's counts and scratch: params.h, key_blocks_done, bwd_tail_counts).
//      Score-mod path also bwd_row_stats_kernel: the per-row (shift, lse) P is taken against (see there).
//   2. bwd_kernel: one CTA = one block of kBlockN keys of one (batch, query head). K, V stay in shared memory and
//      dK, dV in registers; Q, dO (and lse, D) of the query blocks the causal/window range allows stream through
//      swizzled shared memory, double-buffered with cp.async. Per query block:
//        S = Q K^T  ->  P = exp2(q.k scale log2e - lse log2e) (boundary mask), to f16/bf16, to smem
//        ->  dP = dO V^T  ->  dS = P (dP - D), to smem                  (plain path: P's exp2 overlaps dP's MMAs)
//        [score-mod path: S and dP first, then the forward's score (scale, softcap, bias), P, dS = P (dP - D)
//         (x (1 - tanh^2) under softcap) and dbias = P (dP - D) together]
//        ->  dV += P^T dO,  dK += dS^T Q  ->  dQ_partial = dS K, reduced into fp32 dq_accum (red.global.add).
//      sm_90a (wgmma) instances keep products in flight while the CUDA cores work: dP is issued right behind S (P's
//      exp2 runs meanwhile), and dQ first, then dV and dK, so that dQ's reduction overlaps them (H200, bf16, bwd
//      alone, S 1k/4k/16k: +5-8% at d 64 and 128, +2% at d 256; padding masks unchanged).
//      The softmax scale multiplies dK here and dQ in kernel 3 (dS is w.r.t. s = scale q.k).
//   3. bwd_convert_dq_kernel: dq = scale * dq_accum, to f16/bf16 (behind the sm_90a warp-specialized kernel, started
//      while that one's last CTAs run: bwd_launch_template.cuh).
//
// deterministic: the CTAs take their (key block, head) in the order they start (a ticket counter), and each query
// block's dQ reductions happen in increasing key-block order: CTA n waits until the per-(batch, head, query block)
// turn counter equals the number of key blocks below n that touch that query block, adds, and passes the turn
// on. A CTA only ever waits for one that started before it, so there is no deadlock; the order of every fp32
// addition is fixed, so the gradients are bitwise reproducible (dK, dV, dbias never need atomics).
//
// GQA/MQA (h_h_k_ratio > 1): each CTA handles one query head and writes fp32 dK/dV partials to params.dk/.dv
// laid out per *query* head (batch, seqlen_k, nheads, d); the caller sums each group (a fixed-order reduction).
//
// Buffers the caller provides (cpp/cuda/bwd_cuda.cpp): softmax_d (batch, nheads, seqlen_q) fp32; dq_accum
// (batch, nheads, seqlen_q, headdim_rounded) fp32; in deterministic mode workspace = bwd_workspace_ints(params)
// zeroed int32s: [ticket counter] [turn counter per (batch, head, query block)] (bwd_launch.h); otherwise a
// finished-CTA count per (batch, head) for the warp-specialized kernel (params.h, key_blocks_done), then, where that
// kernel splits its last wave, the split's counts and fp32 dK / dV rows (bwd_tail_split_plan).
#pragma once
#include <cstdint>
#include <type_traits>

#include "fa2/bias.cuh"  // load_bias
#include "fa2/block_info.cuh"
#include "fa2/bwd_ptx.cuh"
#include "fa2/bwd_tile_config.h"
#include "fa2/params.h"
#include "fa2/ptx.cuh"
#include "fa2/softmax.cuh"  // exp2_ftz
#include "fa2/sm90/wgmma.cuh"  // only instantiated by sm_90a instances (BwdTileConfig::kWgmma)

namespace fa2 {
namespace bwd {

constexpr float kLog2e = 1.4426950408889634f;

// floor(a / b) for b > 0 and any sign of a.
__host__ __device__ __forceinline__ int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// Which query blocks a key block meets (the transpose of BlockInfo::key_blocks), bottom-right aligned:
//   query i sees key j  iff  i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right.
// Both ends are non-decreasing in the key block, so the key blocks that meet a query block are contiguous too.
struct QueryBlockRange {
  int seqlen_q, seqlen_k, window_left, window_right, block_m, block_n, num_m_blocks;

  // First query block that sees a key of key block n.
  __device__ __forceinline__ int lo(int n) const {
    if (window_right < 0) return 0;
    const int64_t first_row = int64_t(n) * block_n - (seqlen_k - seqlen_q) - window_right;
    return int(max(int64_t(0), floor_div(first_row, block_m)));
  }
  // Last query block that sees a key of key block n (may be < lo(n): the key block is seen by no query).
  __device__ __forceinline__ int hi(int n) const {
    if (window_left < 0) return num_m_blocks - 1;
    const int64_t last_key = min(int64_t(seqlen_k), int64_t(n + 1) * block_n) - 1;
    const int64_t last_row = last_key - (seqlen_k - seqlen_q) + window_left;
    return int(min(int64_t(num_m_blocks - 1), floor_div(last_row, block_m)));
  }
  // First key block that meets query block m (given that some key block does): the smallest n with hi(n) >= m.
  __device__ __forceinline__ int first_key_block(int m, int num_n_blocks) const {
    int a = 0, b = num_n_blocks - 1;
    while (a < b) {
      const int mid = (a + b) / 2;
      if (hi(mid) >= m) b = mid; else a = mid + 1;
    }
    return a;
  }
};

// Starts the cp.async copy of a (kRows, kHeadDim) tile; rows >= rows_valid and columns >= headdim become zeros.
// Each thread copies chunk (tid % per-row, + whole column blocks) of rows tid / per-row + whole passes, so every
// copy is one base plus constants (passes move by whole 8-row groups, which keeps the swizzle).
template <typename Tile, int kRows, int kHeadDim, int kNThreads, typename T>
__device__ __forceinline__ void load_tile(uint32_t smem, const T* gmem, int64_t row_stride, int rows_valid,
                                          int headdim, int tid) {
  constexpr int kThreadsPerRow = Tile::kChunksPerBlock;  // one swizzle line (column block row) per pass
  constexpr int kRowsPerPass = kNThreads / kThreadsPerRow;
  constexpr int kLineBytes = Tile::kChunksPerBlock * 16;
  static_assert(kHeadDim / 8 % kThreadsPerRow == 0 && kRows % kRowsPerPass == 0 && kRowsPerPass % 8 == 0,
                "whole column blocks per thread; passes of whole swizzle periods");
  const int row = tid / kThreadsPerRow, chunk = tid % kThreadsPerRow;
  const uint32_t dst = smem + Tile::offset(row, chunk) * 2;
  const T* src = gmem + row * row_stride + chunk * 8;
#pragma unroll
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
#pragma unroll
    for (int j = 0; j < kHeadDim / 8 / kThreadsPerRow; ++j) {
      const bool pred = row + i * kRowsPerPass < rows_valid && (chunk + j * kThreadsPerRow) * 8 < headdim;
      ptx::cp_async_16(dst + i * kRowsPerPass * kLineBytes + j * (kRows * kLineBytes),
                       pred ? src + i * kRowsPerPass * row_stride + j * kThreadsPerRow * 8 : gmem, pred);
    }
  }
}

template <typename Tile>
struct TileGeometry;
template <int kRows, int kCols, int kBlockCols>
struct TileGeometry<SwizzledTile<kRows, kCols, kBlockCols>> {
  static constexpr int kBlockBytes = kRows * kBlockCols * 2;  // one column block
};

// acc (kMTiles, kNTiles) += A B^T over kKSteps k16 steps, both operands by ldmatrix from swizzled smem:
//   A: rows a_m0.. of an (M, K) tile, or (kATrans) columns a_m0.. of a (K, M) tile;
//   B: rows b_n0.. of an (N, K) tile, or (kBTrans) columns b_n0.. of a (K, N) tile.
// Addresses: one swizzled base per thread (per m/n tile when the tile's runtime offset lands in the chunk index);
// every other step is base ^ (chunk bits, a constant) + (rows, column block: a constant), so the unrolled loops
// keep a handful of address registers instead of one per ldmatrix.
template <typename T, int kMTiles, int kNTiles, int kKSteps, bool kATrans, bool kBTrans, typename ATile,
          typename BTile>
__device__ __forceinline__ void warp_gemm(float (&acc)[kMTiles][kNTiles][4], uint32_t sA, int a_m0, uint32_t sB,
                                          int b_n0, int lane) {
  static_assert(kNTiles % 2 == 0, "B fragments are loaded for pairs of n8 tiles");
  constexpr int kALine = ATile::kChunksPerBlock * 16, kBLine = BTile::kChunksPerBlock * 16;  // bytes per row
  constexpr int kABlockBytes = TileGeometry<ATile>::kBlockBytes, kBBlockBytes = TileGeometry<BTile>::kBlockBytes;
  // Chunk c (even) of a row relative to chunk 0 (or 1): XOR inside the swizzle line, then whole column blocks.
  auto a_k = [](int c) { return (c % ATile::kChunksPerBlock) * 16; };
  auto b_k = [](int c) { return (c % BTile::kChunksPerBlock) * 16; };

  // Byte offsets inside the tiles (the XOR works on offsets, so the tile bases need no particular alignment).
  uint32_t a_off[kATrans ? kMTiles : 1], b_off[kBTrans ? kNTiles / 2 : 1];
  if constexpr (kATrans) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
      a_off[mt] = ATile::offset(((lane >> 4) << 3) + (lane & 7), (a_m0 + mt * 16) / 8 + ((lane >> 3) & 1)) * 2;
  } else {
    a_off[0] = ATile::offset(a_m0 + (lane & 15), lane >> 4) * 2;
  }
  if constexpr (kBTrans) {
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np)
      b_off[np] = BTile::offset((lane & 7) + (((lane >> 3) & 1) << 3), (b_n0 + np * 16) / 8 + (lane >> 4)) * 2;
  } else {
    b_off[0] = BTile::offset(b_n0 + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1) * 2;
  }

#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    uint32_t a[kMTiles][4];  // 16 rows x 16 k per m tile
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      if constexpr (kATrans) {  // k = rows of the stored tile
        ptx::ldmatrix_x4_trans(a[mt], sA + a_off[mt] + ks * 16 * kALine);
      } else {                  // k = chunks 2ks, 2ks + 1 of the stored tile
        const int c = 2 * ks;
        ptx::ldmatrix_x4(a[mt], sA + ((a_off[0] ^ a_k(c)) + (c / ATile::kChunksPerBlock) * kABlockBytes +
                                      mt * 16 * kALine));
      }
    }
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t b[4];  // {b0, b1} of n tile 2np, then of 2np+1
      if constexpr (kBTrans) {
        ptx::ldmatrix_x4_trans(b, sB + b_off[np] + ks * 16 * kBLine);
      } else {
        const int c = 2 * ks;
        ptx::ldmatrix_x4(b, sB + ((b_off[0] ^ b_k(c)) + (c / BTile::kChunksPerBlock) * kBBlockBytes +
                                  np * 16 * kBLine));
      }
      const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ptx::mma_m16n8k16<T>(acc[mt][2 * np], a[mt], b_lo);
        ptx::mma_m16n8k16<T>(acc[mt][2 * np + 1], a[mt], b_hi);
      }
    }
  }
}

// One of the backward's products, acc (kMTiles x kNTiles n8 tiles per warp) += A B^T with warp_gemm's operand
// conventions: by warp_gemm (mma.sync), or on sm_90a (kWgmma) by the warp's warpgroup with one m64 wgmma, whose
// 64 x (kNTiles * 8) result is exactly its four warps' tiles stacked along M (the tile config lines them up:
// bwd_tile_shape_wgmma). a_m0 & ~63 is then the warpgroup's first row (or, transposed, column) of A; b_n0 its first
// row (column) of B.
// kOverwrite: acc = A B (acc need not be initialized). kWait = false (wgmma only): issued as one committed group,
// completed later by sm90::wait_hold; acc is not touched in between. mma.sync products are complete on return.
template <typename T, bool kWgmma, int kMTiles, int kNTiles, int kKSteps, bool kATrans, bool kBTrans, typename ATile,
          typename BTile, bool kOverwrite, bool kWait = true>
__device__ __forceinline__ void product(float (&acc)[kMTiles][kNTiles][4], uint32_t sA, int a_m0, uint32_t sB, int b_n0,
                                        int lane) {
  if constexpr (kWgmma) {
    static_assert(kMTiles == 1, "wgmma: 16 rows per warp");
    sm90::gemm_ss<T, kNTiles * 8, kKSteps, kATrans, kBTrans, ATile, BTile, kWait, kOverwrite>(
        reinterpret_cast<float(&)[kNTiles * 4]>(acc), sA, a_m0 & ~63, sB, b_n0);
  } else {
    if constexpr (kOverwrite) ptx::zero(acc);
    warp_gemm<T, kMTiles, kNTiles, kKSteps, kATrans, kBTrans, ATile, BTile>(acc, sA, a_m0, sB, b_n0, lane);
  }
}

// One f16/bf16 pair (columns col, col + 1 of row) into a swizzled shared-memory tile.
template <typename Tile>
__device__ __forceinline__ void st_shared_pair(uint32_t sTile, int row, int col, uint32_t packed) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sTile + (Tile::offset(row, col / 8) + col % 8) * 2), "r"(packed)
               : "memory");
}

// Stores a warp's fp32 C fragments (rows row0 + 16 mt + 8 half, columns col0 + 8 nt + e of a tile) as f16/bf16 pairs.
template <typename T, typename Tile, int kMTiles, int kNTiles>
__device__ __forceinline__ void store_fragments(uint32_t sTile, const float (&acc)[kMTiles][kNTiles][4], int row0,
                                                int col0) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const int row = row0 + mt * 16 + half * 8, col = col0 + nt * 8;
        const uint32_t packed = ptx::pack2<T>(acc[mt][nt][half * 2], acc[mt][nt][half * 2 + 1]);
        st_shared_pair<Tile>(sTile, row, col, packed);
      }
}

struct NoBias {};

template <typename B>
__device__ __forceinline__ float bias_at(const B* bias, int64_t row_stride, int64_t col_stride, int row, int col) {
  if constexpr (std::is_same_v<B, NoBias>) {
    return 0.f;
  } else {
    return load_bias(bias + row * row_stride + col * col_stride);
  }
}

// One element (row, col) of this (batch, head)'s bias as fp32, of the element type p.bias_type names.
template <typename T>
__device__ __forceinline__ float bias_value(const AttentionParams& p, const void* bias_bh, int row, int col) {
  const int64_t offset = row * p.bias_row_stride + col * p.bias_col_stride;
  switch (p.bias_type) {
    case BiasType::kSameAsInput: return load_bias(static_cast<const T*>(bias_bh) + offset);
    case BiasType::kFloat32: return load_bias(static_cast<const float*>(bias_bh) + offset);
    case BiasType::kBool: return load_bias(static_cast<const bool*>(bias_bh) + offset);
    default: return 0.f;
  }
}

// In place: s (raw q.k) -> P, dp -> dS (w.r.t. q.k / scale, i.e. with the softcap chain rule applied).
// Fragment element (mt, nt, 2 half + e) is query row0 + 16 mt + 8 half, key col0 + 8 nt + e (global indices).
// dbias (when given) receives P (dP - D), the gradient w.r.t. the biased (post-softcap) score.
template <bool kScoreMod, typename B, int kMTiles, int kNTiles>
__device__ __forceinline__ void scores_to_p_ds(float (&s)[kMTiles][kNTiles][4], float (&dp)[kMTiles][kNTiles][4],
                                               const float (&lse2)[2 * kMTiles], const float (&dsum)[2 * kMTiles],
                                               const float* shift,  // this thread's row 0 (smem); + 16 mt + 8 half
                                               const AttentionParams& p, const B* bias, float* dbias,
                                               const BlockInfo& info, bool needs_mask, int row0, int col0) {
  const float scale_over_cap = p.softcap > 0.f ? p.scale / p.softcap : 0.f;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 2 + half;
      const int row = row0 + mt * 16 + half * 8;
      int key_lo = 0, key_hi = 0;
      if (needs_mask) info.key_range(row, key_lo, key_hi);
      const float row_shift = kScoreMod ? shift[mt * 16 + half * 8] : 0.f;  // see bwd_row_stats_kernel
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = col0 + nt * 8 + e;
          const float qk = s[mt][nt][half * 2 + e];
          float prob, dcap = 1.f;
          if constexpr (kScoreMod) {
            // -- recompute the forward's score: scale, softcap, bias (natural-log units)
            float x;
            if (p.softcap > 0.f) {
              const float t = tanhf(qk * scale_over_cap);
              x = p.softcap * t;
              dcap = 1.f - t * t;
            } else {
              x = qk * p.scale;
            }
            if constexpr (!std::is_same_v<B, NoBias>) {
              if (row < p.seqlen_q && col < p.seqlen_k) {
                x += bias_at(bias, p.bias_row_stride, p.bias_col_stride, row, col);
              }
            }
            prob = exp2_ftz(fmaf(x - row_shift, kLog2e, -lse2[r]));
          } else {
            prob = exp2_ftz(fmaf(qk, p.scale_log2, -lse2[r]));
          }
          // -- invisible keys (sequence tail, causal diagonal, window edges) get P = 0; rows with lse = +inf
          //    (no visible key, or past seqlen_q) already have P = 0
          if (needs_mask && (col < key_lo || col > key_hi)) prob = 0.f;
          const float ds = prob * (dp[mt][nt][half * 2 + e] - dsum[r]);
          if (dbias != nullptr && row < p.seqlen_q && col < p.seqlen_k) {
            dbias[int64_t(row) * p.seqlen_k + col] = ds;
          }
          s[mt][nt][half * 2 + e] = prob;
          dp[mt][nt][half * 2 + e] = ds * dcap;
        }
      }
    }
  }
}

// Plain path, step 1: s (raw q.k) -> P = exp2(q.k scale log2e - lse log2e), masked when kMask, packed to f16/bf16
// pairs (dS then uses the same rounded P that dV sees). Fragment element as in scores_to_p_ds.
template <typename T, bool kMask, int kMTiles, int kNTiles>
__device__ __forceinline__ void scores_to_p_packed(const float (&s)[kMTiles][kNTiles][4],
                                                   uint32_t (&p_packed)[kMTiles][kNTiles][2],
                                                   const float (&lse2)[2 * kMTiles], float scale_log2,
                                                   const BlockInfo& info, int row0, int col0) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 2 + half;
      int key_lo = 0, key_hi = 0;
      if constexpr (kMask) info.key_range(row0 + mt * 16 + half * 8, key_lo, key_hi);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        float prob[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          prob[e] = exp2_ftz(fmaf(s[mt][nt][half * 2 + e], scale_log2, -lse2[r]));
          if constexpr (kMask) {
            const int col = col0 + nt * 8 + e;
            if (col < key_lo || col > key_hi) prob[e] = 0.f;
          }
        }
        p_packed[mt][nt][half] = ptx::pack2<T>(prob[0], prob[1]);
      }
    }
  }
}

// Key-row bias path, step 1 (a bias with one value per key: padding masks; no softcap, no dbias): as
// scores_to_p_packed, with the forward's score x = q.k scale + bias[col] taken against the score-mod path's row
// statistics, P = exp2((x - shift) log2e - lse log2e) (lse2 = row_lse log2e; see bwd_row_stats_kernel). key_bias:
// this thread's first column of the key block's bias (fp32, shared memory; 0 past seqlen_k). Rows past seqlen_q
// (zero Q and dO, lse and shift 0) take no bias: P = 1 there as on the plain path, where exp(bias) could overflow.
template <typename T, bool kMask, int kMTiles, int kNTiles>
__device__ __forceinline__ void key_bias_scores_to_p_packed(const float (&s)[kMTiles][kNTiles][4],
                                                            uint32_t (&p_packed)[kMTiles][kNTiles][2],
                                                            const float (&lse2)[2 * kMTiles], const float* shift,
                                                            const float* key_bias, float scale, const BlockInfo& info,
                                                            int seqlen_q, int row0, int col0) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 2 + half, row = row0 + mt * 16 + half * 8;
      const float row_shift = shift[mt * 16 + half * 8];
      const bool row_in = row < seqlen_q;
      int key_lo = 0, key_hi = 0;
      if constexpr (kMask) info.key_range(row, key_lo, key_hi);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const float2 b = *reinterpret_cast<const float2*>(key_bias + nt * 8);
        float prob[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = s[mt][nt][half * 2 + e] * scale + (row_in ? (e == 0 ? b.x : b.y) : 0.f);
          prob[e] = exp2_ftz(fmaf(x - row_shift, kLog2e, -lse2[r]));
          if constexpr (kMask) {
            const int col = col0 + nt * 8 + e;
            if (col < key_lo || col > key_hi) prob[e] = 0.f;
          }
        }
        p_packed[mt][nt][half] = ptx::pack2<T>(prob[0], prob[1]);
      }
    }
  }
}

template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
  }
}

// Plain path, step 2: dp -> dS = P (dP - D) in place.
template <typename T, int kMTiles, int kNTiles>
__device__ __forceinline__ void dp_to_ds(float (&dp)[kMTiles][kNTiles][4],
                                         const uint32_t (&p_packed)[kMTiles][kNTiles][2],
                                         const float (&dsum)[2 * kMTiles]) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const float2 prob = unpack2<T>(p_packed[mt][nt][half]);
        dp[mt][nt][half * 2] = prob.x * (dp[mt][nt][half * 2] - dsum[mt * 2 + half]);
        dp[mt][nt][half * 2 + 1] = prob.y * (dp[mt][nt][half * 2 + 1] - dsum[mt * 2 + half]);
      }
}

// Stores packed f16/bf16 pairs in the C-fragment layout (as store_fragments).
template <typename Tile, int kMTiles, int kNTiles>
__device__ __forceinline__ void store_packed(uint32_t sTile, const uint32_t (&v)[kMTiles][kNTiles][2], int row0,
                                             int col0) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const int row = row0 + mt * 16 + half * 8, col = col0 + nt * 8;
        st_shared_pair<Tile>(sTile, row, col, v[mt][nt][half]);
      }
}

// kScoreMod = false: no softcap, no bias (P = exp2(q.k scale log2e - lse log2e), one FMA). kScoreMod = true: the
// forward's score is recomputed in fp32 (scale, softcap, bias); softcap and the bias dtype are run-time switches
// (block-uniform), as in the forward. kKeyBias (with kScoreMod = false): a bias with one value per key (padding
// masks; no softcap, no dbias) on the plain path's schedule, its values for the CTA's key block read once into
// shared memory (Cfg::kSmemBytes + kBlockN * 4 bytes), P taken against the score-mod path's row statistics.
template <typename T, typename Cfg, int kArch, bool kScoreMod, bool kKeyBias>
__global__ void __launch_bounds__(Cfg::kNThreads, 1) bwd_kernel(const __grid_constant__ AttentionParams p) {
  static_assert(!(kScoreMod && kKeyBias), "the key-row bias variant is one of the plain path");
  constexpr bool kRowStats = kScoreMod || kKeyBias;  // P against bwd_row_stats_kernel's (shift, lse)
  constexpr int kHeadDim = Cfg::kHeadDim;
  using QTile = SwizzledTile<Cfg::kBlockM, kHeadDim, Cfg::kSmemBlockColsD>;         // Q, dO: (kBlockM, d)
  using KTile = SwizzledTile<Cfg::kBlockN, kHeadDim, Cfg::kSmemBlockColsD>;         // K, V: (kBlockN, d)
  using PTile = SwizzledTile<Cfg::kBlockM, Cfg::kBlockN, Cfg::kSmemBlockColsN>;     // P, dS: (kBlockM, kBlockN)
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kNThreads = Cfg::kNThreads;
  constexpr int kSdPM = Cfg::kSdPMTiles, kSdPN = Cfg::kSdPNTiles;
  constexpr int kKVM = Cfg::kdKVMTiles, kKVN = Cfg::kdKVNTiles;
  constexpr int kQM = Cfg::kdQMTiles, kQN = Cfg::kdQNTiles;
  // sm_90a instances with a wgmma tile config multiply with wgmma (product); the rest, with mma.sync
  constexpr bool kWgmma = Cfg::kWgmma;
  static_assert(!kWgmma || kArch == 901, "wgmma needs an sm_90a instance");

  // smem: [K (kBlockN, d)] [V] [Q0 (kBlockM, d)] [dO0] ([Q1] [dO1]) [P (kBlockM, kBlockN)] [dS] [lse, D]0 ([..]1)
  extern __shared__ __align__(1024) unsigned char smem[];  // 1024: wgmma's 128-byte swizzle period (sm90/wgmma.cuh)
  const uint32_t sK = ptx::smem_u32(smem);
  if constexpr (kWgmma) {
    if (sK % 1024 != 0) __trap();  // the descriptors assume every tile starts at a swizzle period
  }
  const uint32_t sV = sK + Cfg::kSmemKVBytes;
  auto sQ = [&](int buf) { return sV + Cfg::kSmemKVBytes + buf * 2 * Cfg::kSmemQBytes; };
  auto sdO = [&](int buf) { return sQ(buf) + Cfg::kSmemQBytes; };
  const uint32_t sP = sV + Cfg::kSmemKVBytes + Cfg::kStages * 2 * Cfg::kSmemQBytes;
  const uint32_t sdS = sP + Cfg::kSmemPBytes;
  // [lse (kBlockM)] [D (kBlockM)] [shift (kBlockM), score-mod path] fp32 per stage, copied with Q, dO
  auto sStats = [&](int buf) { return sdS + Cfg::kSmemPBytes + buf * Cfg::kSmemStatsBytes; };
  // kKeyBias: [the key block's bias (kBlockN fp32)] after the last stage's statistics
  const uint32_t sKeyBias = sStats(Cfg::kStages);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int num_n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  const int num_m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;

  // -- which (key block, head, batch): the grid's, or in deterministic mode the order in which CTAs start
  int n_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  int* turns = nullptr;
  if (p.deterministic) {
    int* ticket = reinterpret_cast<int*>(smem + (sP - sK));  // P's buffer is free until the first iteration
    int* counters = static_cast<int*>(p.workspace);
    if (tid == 0) *ticket = atomicAdd(counters, 1);
    __syncthreads();
    const int t = *ticket;
    n_block = t % num_n_blocks;
    head = (t / num_n_blocks) % p.nheads;
    batch = t / (num_n_blocks * p.nheads);
    turns = counters + 1 + (int64_t(batch) * p.nheads + head) * num_m_blocks;
  }
  const int head_k = head / p.h_h_k_ratio;
  const int n0 = n_block * kBlockN;
  const int rows_k = min(kBlockN, p.seqlen_k - n0);
  const int headdim = p.headdim;
  const int64_t bh = int64_t(batch) * p.nheads + head;

  const QueryBlockRange range{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right, kBlockM, kBlockN, num_m_blocks};
  const int m_lo = range.lo(n_block), m_hi = range.hi(n_block);
  const BlockInfo info{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};

  const T* q = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const T* dout = static_cast<const T*>(p.dout) + batch * p.dout_batch_stride + head * p.dout_head_stride;
  const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride + head_k * p.k_head_stride + n0 * p.k_row_stride;
  const T* v = static_cast<const T*>(p.v) + batch * p.v_batch_stride + head_k * p.v_head_stride + n0 * p.v_row_stride;
  // score-mod path: the statistics bwd_row_stats_kernel prepared (lse, or log l next to a shift, per row)
  const float* lse = (kRowStats ? p.row_lse : p.lse) + bh * p.seqlen_q;
  const float* shift_g = kRowStats ? p.row_shift + bh * p.seqlen_q : lse;
  const float* dsum_g = p.softmax_d + bh * p.seqlen_q;
  float* dq_accum = p.dq_accum + bh * p.seqlen_q * kHeadDim;
  float* dbias = p.dbias != nullptr ? p.dbias + bh * p.seqlen_q * p.seqlen_k : nullptr;
  const void* bias_bh = bias_of_head(p, batch, head);

  auto load_q_do = [&](int m, int buf) {
    const int m0 = m * kBlockM, rows = p.seqlen_q - m0;
    load_tile<QTile, kBlockM, kHeadDim, kNThreads>(sQ(buf), q + int64_t(m0) * p.q_row_stride,
                                                              p.q_row_stride, rows, headdim, tid);
    load_tile<QTile, kBlockM, kHeadDim, kNThreads>(sdO(buf), dout + int64_t(m0) * p.dout_row_stride,
                                                              p.dout_row_stride, rows, headdim, tid);
    // lse, D (and the score-mod path's shift) of the block's rows (4-byte copies: lse rows need not be 16-byte
    // aligned). Rows past seqlen_q read 0: their Q and dO are zero-filled, so P there is 1 against dO = 0 and
    // dS = 1 * (0 - 0): no contribution.
    static_assert(2 * kBlockM <= kNThreads, "one 4-byte copy per thread (two for the score-mod path's shift)");
    if (tid < 2 * kBlockM) {
      const int row = tid % kBlockM;
      const float* src = (tid < kBlockM ? lse : dsum_g) + m0 + row;
      ptx::cp_async_4(sStats(buf) + tid * 4, m0 + row < p.seqlen_q ? src : lse, m0 + row < p.seqlen_q);
    }
    if (kRowStats && tid < kBlockM) {
      ptx::cp_async_4(sStats(buf) + (2 * kBlockM + tid) * 4, m0 + tid < p.seqlen_q ? shift_g + m0 + tid : lse,
                      m0 + tid < p.seqlen_q);
    }
  };

  // deterministic mode: this CTA's turn at query block m's dQ (the number of key blocks below it that touch m), which
  // thread 0 waits for
  auto wait_dq_turn = [&](int m) {
    const int turn = n_block - range.first_key_block(m, num_n_blocks);
    if (tid == 0) {
      while (ptx::ld_acquire_gpu(turns + m) != turn) {
      }
    }
    return turn;
  };

  // kKeyBias: the key block's bias into shared memory (read by every iteration after its block barrier). A block
  // whose every key is padded (-inf / False, or past seqlen_k) gets dK = dV = 0 and adds nothing to dQ: its CTA
  // skips the query blocks, in deterministic mode still passing each one's dQ turn on.
  int m_last = m_hi;
  if constexpr (kKeyBias) {
    static_assert(kBlockN <= kNThreads, "one key per thread");
    bool padded = true;
    if (tid < kBlockN) {
      const bool in_range = n0 + tid < p.seqlen_k;
      const float b = in_range ? bias_value<T>(p, bias_bh, 0, n0 + tid) : 0.f;
      reinterpret_cast<float*>(smem + (sKeyBias - sK))[tid] = b;
      padded = !in_range || b == -INFINITY;
    }
    if (__syncthreads_and(padded)) {
      if (p.deterministic && tid == 0) {
        for (int m = m_lo; m <= m_hi; ++m) ptx::st_release_gpu(turns + m, wait_dq_turn(m) + 1);
      }
      m_last = m_lo - 1;
    }
  }

  // -- prologue: K, V (resident) and the first query block in flight
  if (m_lo <= m_last) {
    load_tile<KTile, kBlockN, kHeadDim, kNThreads>(sK, k, p.k_row_stride, rows_k, headdim, tid);
    load_tile<KTile, kBlockN, kHeadDim, kNThreads>(sV, v, p.v_row_stride, rows_k, headdim, tid);
    load_q_do(m_lo, 0);
  }
  ptx::cp_async_commit();

  float acc_dk[kKVM][kKVN][4], acc_dv[kKVM][kKVN][4];  // (keys of this warp, d of this warp)
  ptx::zero(acc_dk);
  ptx::zero(acc_dv);

  // Warp tiles: S/dP rows sdp_m0.. keys sdp_n0..; dK/dV keys kv_n0.. dims kv_d0..; dQ rows dq_m0.. dims dq_d0..
  const int sdp_m0 = (warp % Cfg::kWarpsMSdP) * (kBlockM / Cfg::kWarpsMSdP);
  const int sdp_n0 = (warp / Cfg::kWarpsMSdP) * (kBlockN / Cfg::kWarpsNSdP);
  const int kv_n0 = (warp % Cfg::kWarpsNdKV) * (kBlockN / Cfg::kWarpsNdKV);
  const int kv_d0 = (warp / Cfg::kWarpsNdKV) * (kHeadDim / Cfg::kWarpsDdKV);
  const int dq_m0 = (warp % Cfg::kWarpsMdQ) * (kBlockM / Cfg::kWarpsMdQ);
  const int dq_d0 = (warp / Cfg::kWarpsMdQ) * (kHeadDim / Cfg::kWarpsDdQ);
  const int group = lane >> 2, tig = lane & 3;
  // S = Q K^T or dP = dO V^T (acc overwritten): (kBlockM, kBlockN) over the warps. wait: complete on return (always
  // with mma.sync), or, wgmma with std::false_type, only issued (completed by sm90::wait_hold).
  using kWaitSync = std::bool_constant<!kWgmma>;  // issued without waiting where that is possible (wgmma)
  auto product_sdp = [&](auto& acc, uint32_t sA, uint32_t sB, auto wait) {
    product<T, kWgmma, kSdPM, kSdPN, kHeadDim / 16, false, false, QTile, KTile, true, decltype(wait)::value>(
        acc, sA, sdp_m0, sB, sdp_n0, lane);
  };

  for (int m = m_lo, it = 0; m <= m_last; ++m, ++it) {
    const int buf = Cfg::kStages == 2 ? (it & 1) : 0;
    const int m0 = m * kBlockM;
    // -- Q, dO of block m have landed (this thread's copies), and every warp is done with iteration m-1's
    //    buffers (the Q/dO buffer about to be refilled, P, dS)
    ptx::cp_async_wait<0>();
    if constexpr (kWgmma) sm90::fence_proxy_async();  // cp.async's writes, then read by wgmma (async proxy)
    __syncthreads();
    if constexpr (Cfg::kStages == 2) {
      if (m < m_last) load_q_do(m + 1, buf ^ 1);  // overlaps this whole iteration
      ptx::cp_async_commit();
    }

    // -- row statistics of this thread's S rows (smem, copied with Q and dO): lse * log2(e) (+inf: P = 0) and D
    const int row0 = m0 + sdp_m0 + group;  // this thread's first fragment row (global query)
    float lse2[2 * kSdPM], dsum[2 * kSdPM];
    const float* stats = reinterpret_cast<const float*>(smem + (sStats(buf) - sK));
#pragma unroll
    for (int r = 0; r < 2 * kSdPM; ++r) {
      const int row = sdp_m0 + group + (r >> 1) * 16 + (r & 1) * 8;
      lse2[r] = stats[row] * kLog2e;
      dsum[r] = stats[kBlockM + row];
    }
    // score-mod path: the rows' shifts, read from shared memory where used (registers are scarce there)
    const float* shift = stats + 2 * kBlockM + sdp_m0 + group;

    const int col0 = n0 + sdp_n0 + tig * 2;  // this thread's first fragment column (global key)
    const bool needs_mask = info.needs_mask(n_block, kBlockN, m0, kBlockM);
    float acc_s[kSdPM][kSdPN][4], acc_dp[kSdPM][kSdPN][4];  // (kBlockM, kBlockN) split over warps
    if constexpr (!kScoreMod) {
      // One straight-line block per case (masked or not), so that P's exp2 can overlap dP's loads and MMAs.
      const float* key_bias = reinterpret_cast<const float*>(smem + (sKeyBias - sK)) + sdp_n0 + tig * 2;
      auto s_p_dp_ds = [&](auto mask) {
        // -- S = Q K^T;  P = exp2(q.k scale log2e - lse log2e), masked on boundary blocks, rounded to T
        //    (wgmma: dP = dO V^T is issued right behind S and runs on the tensor cores while P is computed)
        product_sdp(acc_s, sQ(buf), sK, kWaitSync{});
        if constexpr (kWgmma) {
          product_sdp(acc_dp, sdO(buf), sV, std::false_type{});
          sm90::wait_hold<1>(acc_s);  // one group per product, completing in issue order: <1> leaves dP running
        }
        uint32_t p_packed[kSdPM][kSdPN][2];
        auto to_p = [&](auto masked) {
          if constexpr (kKeyBias) {
            key_bias_scores_to_p_packed<T, decltype(masked)::value>(acc_s, p_packed, lse2, shift, key_bias, p.scale,
                                                                    info, p.seqlen_q, row0, col0);
          } else {
            scores_to_p_packed<T, decltype(masked)::value>(acc_s, p_packed, lse2, p.scale_log2, info, row0, col0);
          }
        };
        if constexpr (std::is_same_v<decltype(mask), bool>) {  // the mask decided inside the block
          if (mask) {
            to_p(std::true_type{});
          } else {
            to_p(std::false_type{});
          }
        } else {
          to_p(mask);
        }
        store_packed<PTile>(sP, p_packed, sdp_m0 + group, sdp_n0 + tig * 2);
        // -- dP = dO V^T;  dS = P (dP - D)
        if constexpr (kWgmma) {
          sm90::wait_hold<0>(acc_dp);
        } else {
          product_sdp(acc_dp, sdO(buf), sV, std::true_type{});
        }
        dp_to_ds<T>(acc_dp, p_packed, dsum);
        store_fragments<T, PTile>(sdS, acc_dp, sdp_m0 + group, sdp_n0 + tig * 2);
      };
      if constexpr (!Cfg::kWholeBlockMask) {
        s_p_dp_ds(needs_mask);
      } else if (needs_mask) {
        s_p_dp_ds(std::true_type{});
      } else {
        s_p_dp_ds(std::false_type{});
      }
    } else {
      // -- S = Q K^T, dP = dO V^T (wgmma: both in flight together);  then the forward's score (scale, softcap,
      //    bias), P, dS and dbias together
      product_sdp(acc_s, sQ(buf), sK, kWaitSync{});
      product_sdp(acc_dp, sdO(buf), sV, kWaitSync{});
      if constexpr (kWgmma) sm90::wait_hold<0>(acc_s, acc_dp);
      switch (p.bias_type) {
        case BiasType::kSameAsInput:
          scores_to_p_ds<true>(acc_s, acc_dp, lse2, dsum, shift, p, static_cast<const T*>(bias_bh), dbias, info,
                               needs_mask, row0, col0);
          break;
        case BiasType::kFloat32:
          scores_to_p_ds<true>(acc_s, acc_dp, lse2, dsum, shift, p, static_cast<const float*>(bias_bh), dbias, info,
                               needs_mask, row0, col0);
          break;
        case BiasType::kBool:
          scores_to_p_ds<true>(acc_s, acc_dp, lse2, dsum, shift, p, static_cast<const bool*>(bias_bh), dbias, info,
                               needs_mask, row0, col0);
          break;
        case BiasType::kNone:
          scores_to_p_ds<true>(acc_s, acc_dp, lse2, dsum, shift, p, static_cast<const NoBias*>(nullptr), dbias, info,
                               needs_mask, row0, col0);
          break;
      }
      store_fragments<T, PTile>(sP, acc_s, sdp_m0 + group, sdp_n0 + tig * 2);
      store_fragments<T, PTile>(sdS, acc_dp, sdp_m0 + group, sdp_n0 + tig * 2);
    }
    if constexpr (kWgmma) sm90::fence_proxy_async();  // P and dS, stored by threads, then read by wgmma
    __syncthreads();

    // -- dV += P^T dO, dK += dS^T Q                                       // (kBlockN, d) split over warps
    // -- dQ (partial over this key block) = dS K, reduced into dq_accum   // (kBlockM, d) split over warps
    // mma.sync: dV, dK, then dQ (dQ last was 2-8% faster on the sm80 path). wgmma: dQ issued first, then dV and dK
    // behind it, so that dQ's reduction into global memory runs while the tensor cores do dV and dK.
    auto dv_dk = [&](auto wait) {
      product<T, kWgmma, kKVM, kKVN, kBlockM / 16, true, true, PTile, QTile, false, decltype(wait)::value>(
          acc_dv, sP, kv_n0, sdO(buf), kv_d0, lane);
      product<T, kWgmma, kKVM, kKVN, kBlockM / 16, true, true, PTile, QTile, false, decltype(wait)::value>(
          acc_dk, sdS, kv_n0, sQ(buf), kv_d0, lane);
    };
    if constexpr (!kWgmma) dv_dk(std::true_type{});
    {
      // dQ in column parts: two with wgmma at d 256 (64 floats a thread in one go, beside dK's and dV's 128, spilled),
      // else one. The second part is issued once the first has been reduced.
      constexpr int kDqParts = kWgmma && kQN >= 16 ? 2 : 1;
      constexpr int kQNPart = kQN / kDqParts;
      float acc_dq[kQM][kQNPart][4];
      product<T, kWgmma, kQM, kQNPart, kBlockN / 16, false, true, PTile, KTile, true, kWaitSync::value>(
          acc_dq, sdS, dq_m0, sK, dq_d0, lane);
      if constexpr (kWgmma) {
        dv_dk(std::false_type{});
        sm90::wait_hold<2>(acc_dq);  // <2>: dV and dK, committed after dQ, keep running (the counts follow this order)
      }
      int turn = 0;
      if (p.deterministic) {
        turn = wait_dq_turn(m);
        __syncthreads();
      }
      // acc_dq (columns dq_d0 + part * kQNPart * 8 ..) into dq_accum
      auto reduce_dq = [&](auto part) {
        const int d0 = dq_d0 + decltype(part)::value * kQNPart * 8;
        float* dq_row0 = dq_accum + int64_t(m0 + dq_m0 + group) * kHeadDim + d0 + tig * 2;
        if (m0 + kBlockM <= p.seqlen_q && headdim == kHeadDim) {  // the common case: no predicates
#pragma unroll
          for (int mt = 0; mt < kQM; ++mt)
#pragma unroll
            for (int half = 0; half < 2; ++half)
#pragma unroll
              for (int nt = 0; nt < kQNPart; ++nt)
                ptx::red_add_f32x2(dq_row0 + (mt * 16 + half * 8) * kHeadDim + nt * 8, acc_dq[mt][nt][half * 2],
                                   acc_dq[mt][nt][half * 2 + 1]);
        } else {
#pragma unroll
          for (int mt = 0; mt < kQM; ++mt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              if (m0 + dq_m0 + mt * 16 + half * 8 + group < p.seqlen_q) {
#pragma unroll
                for (int nt = 0; nt < kQNPart; ++nt) {
                  if (d0 + nt * 8 + tig * 2 < headdim) {
                    ptx::red_add_f32x2(dq_row0 + (mt * 16 + half * 8) * kHeadDim + nt * 8, acc_dq[mt][nt][half * 2],
                                       acc_dq[mt][nt][half * 2 + 1]);
                  }
                }
              }
            }
        }
      };
      reduce_dq(std::integral_constant<int, 0>{});
      if constexpr (kDqParts == 2) {
        product<T, kWgmma, kQM, kQNPart, kBlockN / 16, false, true, PTile, KTile, true, false>(
            acc_dq, sdS, dq_m0, sK, dq_d0 + kQNPart * 8, lane);
        sm90::wait_hold<0>(acc_dq);  // (dV and dK, issued before it, complete too)
        reduce_dq(std::integral_constant<int, 1>{});
      }
      if (p.deterministic) {
        __threadfence();
        __syncthreads();
        if (tid == 0) ptx::st_release_gpu(turns + m, turn + 1);
      }
    }
    // dV, dK complete before the next iteration's barrier lets P, dS and this Q/dO buffer be overwritten
    if constexpr (kWgmma) sm90::wait_hold<0>(acc_dv, acc_dk);

    if constexpr (Cfg::kStages == 1) {
      __syncthreads();  // every warp is done with Q, dO of block m
      if (m < m_last) load_q_do(m + 1, 0);
      ptx::cp_async_commit();
    }
  }

  // -- epilogue: dK = scale * dS^T Q, dV; keys past seqlen_k and dims past headdim are not stored. A key block no
  //    query sees stores zeros.
#pragma unroll
  for (int mt = 0; mt < kKVM; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = kv_n0 + mt * 16 + half * 8 + group;
      if (key < rows_k) {
#pragma unroll
        for (int nt = 0; nt < kKVN; ++nt) {
          const int col = kv_d0 + nt * 8 + tig * 2;
          if (col < headdim) {
            const float dk0 = acc_dk[mt][nt][half * 2] * p.scale, dk1 = acc_dk[mt][nt][half * 2 + 1] * p.scale;
            const float dv0 = acc_dv[mt][nt][half * 2], dv1 = acc_dv[mt][nt][half * 2 + 1];
            if (p.h_h_k_ratio > 1) {  // fp32 partials per query head, summed over the group by the caller
              float* dk = static_cast<float*>(p.dk) + batch * p.dk_batch_stride + head * p.dk_head_stride +
                          int64_t(n0 + key) * p.dk_row_stride + col;
              float* dv = static_cast<float*>(p.dv) + batch * p.dv_batch_stride + head * p.dv_head_stride +
                          int64_t(n0 + key) * p.dv_row_stride + col;
              *reinterpret_cast<float2*>(dk) = make_float2(dk0, dk1);
              *reinterpret_cast<float2*>(dv) = make_float2(dv0, dv1);
            } else {
              T* dk = static_cast<T*>(p.dk) + batch * p.dk_batch_stride + head * p.dk_head_stride +
                      int64_t(n0 + key) * p.dk_row_stride + col;
              T* dv = static_cast<T*>(p.dv) + batch * p.dv_batch_stride + head * p.dv_head_stride +
                      int64_t(n0 + key) * p.dv_row_stride + col;
              *reinterpret_cast<uint32_t*>(dk) = ptx::pack2<T>(dk0, dk1);
              *reinterpret_cast<uint32_t*>(dv) = ptx::pack2<T>(dv0, dv1);
            }
          }
        }
      }
    }
  }
}

// Threads per (batch, query, head) row in the row-wise kernels: one per 16-byte chunk, rounded up to a power of 2.
template <int kHeadDim>
constexpr int row_group_threads() {
  constexpr int chunks = kHeadDim / 8;
  return chunks <= 4 ? 4 : chunks <= 8 ? 8 : chunks <= 16 ? 16 : 32;
}

// The score-mod path's row statistics (softcap or bias). P = exp(s - lse) needs lse to ~1e-4, but a float32
// lse = m + log l of a row whose scores are huge (every key biased by finfo.min or -1e9: a padded query under a
// Hugging Face mask, uniform over its keys) rounds to m, and P would be 1 instead of 1/l; past float's range it is
// -inf. Such rows (|lse| > kLseExactLimit, or -inf) get m and l recomputed here, exactly, from q, K, the bias and
// the mask: row_shift = m, row_lse = log l, and the kernel takes P = exp(s - m - log l). Every other row:
// (row_shift, row_lse) = (0, lse). One warp per row; only heavy rows loop over their keys (O(seqlen_k * d) each,
// CUDA cores: fine for padded queries, slow if most rows of a long sequence are heavy).
constexpr float kLseExactLimit = 4096.f;  // float's spacing there is 5e-4: P keeps ~2^-11

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(256) bwd_row_stats_kernel(const __grid_constant__ AttentionParams p) {
  constexpr int kWarps = 8;
  static_assert(kHeadDim <= 32 * 8, "a lane holds 8 of the row's q elements");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh_row = int64_t(blockIdx.x) * kWarps + warp;  // (batch, head, query), query fastest
  if (bh_row >= int64_t(p.batch) * p.nheads * p.seqlen_q) return;  // no block barrier below
  const float lse = p.lse[bh_row];
  const bool inexact = lse == -INFINITY || (isfinite(lse) && fabsf(lse) > kLseExactLimit);
  if (!inexact) {
    if (lane == 0) {
      p.row_lse[bh_row] = lse;
      p.row_shift[bh_row] = 0.f;
    }
    return;
  }
  const int row = int(bh_row % p.seqlen_q);
  const int64_t bh = bh_row / p.seqlen_q;
  const int head = int(bh % p.nheads), batch = int(bh / p.nheads);
  // The warp walks the row's keys one at a time, each lane holding 8 consecutive dims of q and reading the same
  // 8 dims of the key (16-byte loads: the whole warp reads one key row at once).
  const bool lane_dims = lane * 8 < p.headdim;  // headdim is a multiple of 8 here (the glue pads)
  float q8[8];
  {
    const T* q = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
                 int64_t(row) * p.q_row_stride + lane * 8;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (lane_dims) raw = *reinterpret_cast<const uint4*>(q);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) q8[i] = ptx::to_float(e[i]);
  }
  const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride + (head / p.h_h_k_ratio) * p.k_head_stride +
               lane * 8;
  const void* bias_bh = bias_of_head(p, batch, head);
  const BlockInfo info{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};
  int key_lo = 0, key_hi = -1;
  info.key_range(row, key_lo, key_hi);
  key_lo = max(key_lo, 0);
  key_hi = min(key_hi, p.seqlen_k - 1);
  // -- the forward's score of each visible key (scale, softcap, bias; natural units), online max and sum. Every
  //    lane ends with the same values (the dot product is reduced over the warp).
  float m = -INFINITY, l = 0.f;
  for (int col = key_lo; col <= key_hi; ++col) {
    float qk = 0.f;
    if (lane_dims) {
      const uint4 raw = *reinterpret_cast<const uint4*>(k + int64_t(col) * p.k_row_stride);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < 8; ++i) qk += q8[i] * ptx::to_float(e[i]);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) qk += __shfl_xor_sync(0xffffffffu, qk, offset);
    float x = p.softcap > 0.f ? p.softcap * tanhf(qk * (p.scale / p.softcap)) : qk * p.scale;
    if (bias_bh != nullptr) x += bias_value<T>(p, bias_bh, row, col);
    if (x == -INFINITY) continue;
    if (x > m) {
      l *= expf(m - x);  // m = -inf: l is 0 and stays 0
      m = x;
    }
    l += expf(x - m);
  }
  if (lane == 0) {
    const bool seen = m != -INFINITY && l > 0.f;
    p.row_shift[bh_row] = seen ? m : 0.f;
    p.row_lse[bh_row] = seen ? logf(l) : INFINITY;
  }
}

// D = rowsum(dO * O) in fp32 over the headdim; zeroes the row's dq_accum. Rows are (batch, query, head), head
// fastest (the (b, s, h, d) layout's order).
template <typename T, int kHeadDim, int kNThreads>
__global__ void __launch_bounds__(kNThreads) bwd_preprocess_kernel(const __grid_constant__ AttentionParams p) {
  constexpr int kGroup = row_group_threads<kHeadDim>(), kRowsPerCta = kNThreads / kGroup;
  const int64_t row_id = int64_t(blockIdx.x) * kRowsPerCta + threadIdx.x / kGroup;
  const int chunk = threadIdx.x % kGroup;
  const int64_t num_rows = int64_t(p.batch) * p.seqlen_q * p.nheads;
  // (the warp-specialized kernel's tail split's counts and fp32 dK, dV rows, params.h: bwd_tail_zero_ints ints, a
  // multiple of 4, 16-byte aligned, over the grid's threads)
  if (p.bwd_tail_counts != nullptr) {
    const int64_t quads = p.bwd_tail_zero_ints / 4, stride = int64_t(gridDim.x) * kNThreads;
    for (int64_t i = int64_t(blockIdx.x) * kNThreads + threadIdx.x; i < quads; i += stride) {
      reinterpret_cast<int4*>(p.bwd_tail_counts)[i] = make_int4(0, 0, 0, 0);
    }
  }
  float sum = 0.f;
  int64_t batch = 0, row = 0, head = 0;
  if (row_id < num_rows) {
    head = row_id % p.nheads;
    row = (row_id / p.nheads) % p.seqlen_q;
    batch = row_id / (int64_t(p.nheads) * p.seqlen_q);
    if (chunk * 8 < p.headdim) {
      const T* dout = static_cast<const T*>(p.dout) + batch * p.dout_batch_stride + row * p.dout_row_stride +
                      head * p.dout_head_stride + chunk * 8;
      const T* out = static_cast<const T*>(p.out) + batch * p.out_batch_stride + row * p.out_row_stride +
                     head * p.out_head_stride + chunk * 8;
      const uint4 a = *reinterpret_cast<const uint4*>(dout), b = *reinterpret_cast<const uint4*>(out);
      const T* ea = reinterpret_cast<const T*>(&a);
      const T* eb = reinterpret_cast<const T*>(&b);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += ptx::to_float(ea[i]) * ptx::to_float(eb[i]);
    }
  }
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (row_id < num_rows) {
    const int64_t bh_row = (batch * p.nheads + head) * p.seqlen_q + row;
    // (the main kernel's finished-CTA counts where the dQ conversion overlaps it: batch * nheads ints, fewer than
    // the grid's threads)
    if (p.key_blocks_done != nullptr && row_id < int64_t(p.batch) * p.nheads && chunk == 0) {
      p.key_blocks_done[row_id] = 0;
    }
    if (chunk == 0) p.softmax_d[bh_row] = sum;
    if (chunk < kHeadDim / 8) {
      float4* acc = reinterpret_cast<float4*>(p.dq_accum + bh_row * kHeadDim + chunk * 8);
      acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
      acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

// dq_accum's fragment order (the d 256 ws backward's, bwd_ws_dsplit_kernel.cuh: FA-3's layout there): within each
// whole block of kRows queries (kCols fp32 columns, the block's kRows x kCols floats where row-major has them),
// warpgroup w's dQ pass `pass` (columns 128 w + 64 pass ..), n8 tile nt, is 512 floats, thread t's (of 128) four at
// 4 t: fragment element (nt, 2 half + e) of warp t / 32, lane 4 group + tig, which holds query 16 warp + group +
// 8 half, column 128 w + 64 pass + 8 nt + 2 tig + e. One warp's red.v4 covers 512 contiguous bytes.
struct DqFragmentOrder {
  static constexpr int kRows = 64, kCols = 256;
  // where thread `thread` (of 128) of warpgroup w puts its four floats of pass `pass`, n8 tile nt
  __host__ __device__ static constexpr int fragment_offset(int w, int pass, int nt, int thread) {
    return ((w * 2 + pass) * 8 + nt) * 512 + thread * 4;
  }
  __host__ __device__ static constexpr int offset(int row, int col) {
    const int w = col / 128, pass = (col / 64) % 2, nt = (col / 8) % 8, tig = (col / 2) % 4, e = col % 2;
    const int warp = row / 16, group = row % 8, half = (row / 8) % 2;
    return fragment_offset(w, pass, nt, warp * 32 + group * 4 + tig) + 2 * half + e;
  }
};
// (compile-time check: every (row, column) of a block at its own place in the block)
constexpr bool dq_fragment_order_is_a_permutation() {
  bool seen[DqFragmentOrder::kRows * DqFragmentOrder::kCols] = {};
  for (int r = 0; r < DqFragmentOrder::kRows; ++r) {
    for (int c = 0; c < DqFragmentOrder::kCols; ++c) {
      const int o = DqFragmentOrder::offset(r, c);
      if (o < 0 || o >= DqFragmentOrder::kRows * DqFragmentOrder::kCols || seen[o]) return false;
      seen[o] = true;
    }
  }
  return true;
}
static_assert(dq_fragment_order_is_a_permutation(), "DqFragmentOrder::offset is a permutation of a block");

// dq = scale * dq_accum, to T; rows in the preprocessing's order. kAfterHeads (launched to overlap the
// warp-specialized main kernel's last CTAs, p.key_blocks_done: bwd_launch_template.cuh): rows in (batch, head, query)
// order instead, the order in which the main kernel's CTAs finish their heads, and a CTA first waits until every
// main-kernel CTA of its rows' heads has counted itself finished; dq_accum is then read through the L2
// (ld.global.cg). (p.dq_accum_fragment_order: whole blocks of DqFragmentOrder::kRows queries read in that order)
template <typename T, int kHeadDim, int kNThreads, bool kAfterHeads = false>
__global__ void __launch_bounds__(kNThreads) bwd_convert_dq_kernel(const __grid_constant__ AttentionParams p) {
  constexpr int kGroup = row_group_threads<kHeadDim>(), kRowsPerCta = kNThreads / kGroup;
  const int64_t num_rows = int64_t(p.batch) * p.seqlen_q * p.nheads;
  const int64_t first_row = int64_t(blockIdx.x) * kRowsPerCta;
  if constexpr (kAfterHeads) {
    if (threadIdx.x == 0) {
      const int64_t last_row = min(first_row + kRowsPerCta, num_rows) - 1;
      for (int64_t bh = first_row / p.seqlen_q; bh <= last_row / p.seqlen_q; ++bh) {
        while (ptx::ld_acquire_gpu(p.key_blocks_done + bh) < p.key_blocks_per_head) __nanosleep(256);
      }
    }
    __syncthreads();  // (the acquire above, then every thread's reads)
  }
  const int64_t row_id = first_row + threadIdx.x / kGroup;
  const int chunk = threadIdx.x % kGroup;
  if (row_id >= num_rows || chunk * 8 >= p.headdim) return;
  int64_t batch, head, row, acc_row;  // (acc_row: the row of dq_accum, (batch, head, query))
  if constexpr (kAfterHeads) {
    const int64_t bh = row_id / p.seqlen_q;
    row = row_id - bh * p.seqlen_q;
    head = bh % p.nheads;
    batch = bh / p.nheads;
    acc_row = row_id;
  } else {
    head = row_id % p.nheads;
    row = (row_id / p.nheads) % p.seqlen_q;
    batch = row_id / (int64_t(p.nheads) * p.seqlen_q);
    acc_row = (batch * p.nheads + head) * p.seqlen_q + row;
  }
  const float* const row_acc = p.dq_accum + acc_row * kHeadDim + chunk * 8;
  auto load2 = [](const float* at) {
    return kAfterHeads ? __ldcg(reinterpret_cast<const float2*>(at)) : *reinterpret_cast<const float2*>(at);
  };
  auto load4 = [](const float* at) {
    return kAfterHeads ? __ldcg(reinterpret_cast<const float4*>(at)) : *reinterpret_cast<const float4*>(at);
  };
  float4 a, b;
  bool row_major = true;
  if constexpr (kHeadDim == DqFragmentOrder::kCols) {
    using Order = DqFragmentOrder;
    const int64_t block_row0 = row / Order::kRows * Order::kRows;
    if (p.dq_accum_fragment_order && block_row0 + Order::kRows <= p.seqlen_q) {
      const float* block = row_acc - (row - block_row0) * kHeadDim - chunk * 8;
      const int r = int(row - block_row0), c = chunk * 8;
      // (columns c, c + 1 are adjacent in the order, as are c + 2 tig, c + 2 tig + 1)
      const float2 v0 = load2(block + Order::offset(r, c)), v1 = load2(block + Order::offset(r, c + 2));
      const float2 v2 = load2(block + Order::offset(r, c + 4)), v3 = load2(block + Order::offset(r, c + 6));
      a = make_float4(v0.x, v0.y, v1.x, v1.y);
      b = make_float4(v2.x, v2.y, v3.x, v3.y);
      row_major = false;
    }
  }
  if (row_major) {
    a = load4(row_acc);
    b = load4(row_acc + 4);
  }
  const float s = p.scale;
  uint4 packed;
  packed.x = ptx::pack2<T>(a.x * s, a.y * s);
  packed.y = ptx::pack2<T>(a.z * s, a.w * s);
  packed.z = ptx::pack2<T>(b.x * s, b.y * s);
  packed.w = ptx::pack2<T>(b.z * s, b.w * s);
  T* dq = static_cast<T*>(p.dq) + batch * p.dq_batch_stride + row * p.dq_row_stride + head * p.dq_head_stride +
          chunk * 8;
  *reinterpret_cast<uint4*>(dq) = packed;
}

}  // namespace bwd
}  // namespace fa2
