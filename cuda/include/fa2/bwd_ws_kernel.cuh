// FlashAttention-2 backward, sm_90a warp-specialized main kernel (FA-3's structure; the step 2 of bwd_kernel.cuh's
// three for the plain path and its key-row bias variant: no softcap, no dbias, not deterministic). One CTA = kBlockN
// keys of one (batch, query head), as there, or with GQA where the launcher has a CTA sum its group (ws_groups_gqa) of
// one (batch, kv head): its query blocks then come head after head of the group through the same ring and loop, and
// dK, dV, summed in the registers, are stored once like k. What differs is how a query block is processed
// (BwdWsTileConfig, bwd_tile_config.h):
//   - a producer thread loads K, V once and streams each query block's Q, dO, lse and D (all by the TMA) into a
//     kStages ring of shared memory, on full / empty mbarriers: the consumers never wait for a CTA barrier;
//   - consumer warpgroup w owns keys 64 w .. 64 w + 63 and computes the transposed scores, keys as the wgmma M:
//       S^T = K_w Q^T, dP^T = V_w dO^T                    (both from shared memory; S^T issued during the block
//                                                          before, behind its dQ: FA2_BWD_PREFETCH_SCORES)
//       P^T = exp2(S^T scale log2e - lse log2e)           (lse, D per query: per accumulator column)
//       dV_w += P^T dO                                    (P^T from registers: the accumulator layout of two n8
//                                                          tiles is the register-A layout of a k16 step)
//       dS^T = P^T (dP^T - D) -> shared memory (two buffers); dK_w += dS^T Q (dS^T from registers; no A-operand
//                                                          register is read while its wgmma runs), the consumers'
//                                                          named barrier, then
//       dQ_w = dS K: 64 of the block's queries (kBlockM 128)  (both operands MN-major from shared memory; every key
//       or half of d (kBlockM 64)                          of the block), staged in shared memory and added to
//                                                          dq_accum by one TMA reduce-add per 32 columns
//     and releases the stage once its products have completed.
// Query rows past seqlen_q: Q and dO read as zeros, but their lse and D (a flat view) are the next head's, so P is
// masked to 0 there (then dS = 0 and their dQ rows, added to the next head's rows by the reduce-add, are exact zeros).
// kKeyBias (a bias with one value per key: padding masks): the score is x = q.k scale + bias[key], P taken against
// bwd_row_stats_kernel's (shift, lse) per query, as bwd_kernel.cuh's key-row variant; each thread's two keys' bias
// values live in registers for the whole CTA, and a key block whose every key is padded skips its query blocks.
// The softmax scale multiplies dK here and dQ in bwd_convert_dq_kernel (dS is w.r.t. s = scale q.k).
#pragma once
#include <cstdint>
#include <type_traits>

#include "fa2/block_info.cuh"
#include "fa2/bwd_kernel.cuh"  // QueryBlockRange, st_shared_pair, unpack2, kLog2e
#include "fa2/bwd_tile_config.h"
#include "fa2/cta_trace.cuh"
#include "fa2/params.h"
#include "fa2/ptx.cuh"
#include "fa2/sm90/tma.cuh"
#include "fa2/sm90/wgmma.cuh"
#include "fa2/softmax.cuh"  // exp2_ftz
#include "fa2/tile_order.h"

// Knobs kept for A/Bs (scripts/fwd_variant_bench.cu), the defaults measured faster on the H200:
// FA2_BWD_STMATRIX: P^T / dS^T stored to shared memory by stmatrix (1) or 32-bit stores (0) (ws_store_a_fragments,
//   both ws kernels; variants_h200-20261130-bwd-stmatrix.json); FA2_BWD_PREFETCH_SCORES (bwd_ws_kernel only, d 64 /
//   128): the next query block's S^T issued behind this one's dQ (1) or at the block's top with dP^T (0)
//   (variants_h200-20261130-bwd-prefetch.json); FA2_BWD_STAGED_DKV (bwd_ws_kernel only, without GQA, whose fp32
//   partials keep the fragment stores): dK, dV through shared memory to 16-byte global stores (1) or stored from the
//   fragments (0) (variants_h200-20261201-bwd-staged-dkv.json).
//   CI's compile check builds the harness's backward with all three at 0.
#ifndef FA2_BWD_STMATRIX
#define FA2_BWD_STMATRIX 1
#endif
#ifndef FA2_BWD_PREFETCH_SCORES
#define FA2_BWD_PREFETCH_SCORES 1
#endif
#ifndef FA2_BWD_QUAD_STORES
#define FA2_BWD_QUAD_STORES 1
#endif
#ifndef FA2_BWD_STAGED_DKV
#define FA2_BWD_STAGED_DKV 1
#endif

namespace fa2 {
namespace bwd {

// Every k16 step's register-A fragment of fp32 C fragments acc (ptx::pack_k16).
template <typename T, int kNTiles>
__device__ __forceinline__ void pack_k16_fragments(const float (&acc)[kNTiles][4], uint32_t (&a)[kNTiles / 2][4]) {
#pragma unroll
  for (int kt = 0; kt < kNTiles / 2; ++kt) ptx::pack_k16<T>(acc, kt, a[kt]);
}

// ---- shared by the warp-specialized backward kernels (this one and bwd_ws_dsplit_kernel.cuh)

// A query block's row statistics (lse, D, shift) are loaded by the 1-D TMA from the flat (batch, heads, seqlen_q)
// fp32 buffers, whose boxes must start at a multiple of 4 values (16 bytes; an odd start raised an illegal instruction
// on the H200): each box starts at the block's first row rounded down to a multiple of 4 and holds kBlockM + 4 values;
// the block's rows start ws_stats_offset values into it.
template <int kBlockM>
constexpr int ws_stat_box_elems() { return kBlockM + 4; }
__device__ __forceinline__ int ws_stats_row(int64_t bh, int64_t seqlen_q, int m0) { return int(bh * seqlen_q + m0); }
__device__ __forceinline__ int ws_stats_offset(int row) { return row & 3; }

// The query-block ring in shared memory: per stage [Q (kQBytes)] [dO] from q0 and its rows' statistics
// [lse] [D] [shift] (kStatBytes each, from stats0); mbarriers from bar_kv: K/V, full per stage (the producer's
// expect_tx arrival), empty per stage (one arrival per consumer warp).
template <int kStages, int kQBytes, int kStatBytes>
struct WsRing {
  static constexpr int kNumStages = kStages;
  uint32_t q0, stats0, bar_kv;
  __device__ __forceinline__ uint32_t q(int s) const { return q0 + s * 2 * kQBytes; }
  __device__ __forceinline__ uint32_t dout(int s) const { return q(s) + kQBytes; }
  // statistic i (0 lse, 1 D, 2 shift) of stage s
  __device__ __forceinline__ uint32_t stat(int s, int i) const { return stats0 + (3 * s + i) * kStatBytes; }
  __device__ __forceinline__ uint32_t full(int s) const { return bar_kv + 8 + 8 * s; }
  __device__ __forceinline__ uint32_t empty(int s) const { return bar_kv + 8 + 8 * kStages + 8 * s; }
  // (one thread, before the CTA's barrier)
  __device__ __forceinline__ void init_barriers(int consumer_warps) const {
    sm90::mbarrier_init(bar_kv, 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      sm90::mbarrier_init(full(s), 1);
      sm90::mbarrier_init(empty(s), consumer_warps);
    }
    sm90::fence_barrier_init();
  }
};

// The CTA's only barrier (the producer warpgroup leaves after it). With kKeyBias it also tells whether every key of
// the block (kBlockN from n0) is padded (-inf / False, or past seqlen_k): then the block's query range is emptied
// (returns m_lo - 1: dK = dV = 0 and nothing is added to dQ); else it returns m_hi. (A CTA that sums a GQA group
// has one bias for all its heads: ws_start.)
template <typename T, bool kKeyBias, int kBlockN>
__device__ __forceinline__ int ws_cta_barrier(const AttentionParams& p, int n0, int batch, int head, int m_lo,
                                              int m_hi) {
  if constexpr (kKeyBias) {
    bool padded = true;
    if (threadIdx.x < kBlockN) {
      const int key = n0 + int(threadIdx.x);
      padded = key >= p.seqlen_k || bias_value<T>(p, bias_of_head(p, batch, head), 0, key) == -INFINITY;
    }
    if (__syncthreads_and(padded)) return m_lo - 1;
  } else {
    __syncthreads();
  }
  return m_hi;
}

// A key-row bias's values at one thread's keys key_first, key_first + 8 (0 past seqlen_k: those keys are masked).
template <typename T>
__device__ __forceinline__ void ws_load_key_bias(const AttentionParams& p, int batch, int head, int key_first,
                                                 float (&key_bias)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = key_first + 8 * half;
    if (key < p.seqlen_k) key_bias[half] = bias_value<T>(p, bias_of_head(p, batch, head), 0, key);
  }
}

// The producer thread: K, V of the key block (kBlockN rows from n0, kv head head_k) once, then for each of the CTA's
// query heads head .. head + heads - 1 (bh: the first's batch * nheads + head) and its query blocks m_lo .. m_hi
// their Q, dO and row statistics (lse, D, and with kShift the row shift: bwd_row_stats_kernel's) into stage
// it % kStages (it counting over heads and blocks), each once every consumer warp has released the stage's previous
// block (it - kStages). lse / D / shift come from the flat (batch, heads, seqlen_q) views in ws_stat_box_elems boxes,
// which start up to 3 values before the block (never read; rows past seqlen_q read the next head's, past the buffers'
// end zeros).
template <int kBlockM, int kBlockN, int kHeadDim, int kBlockCols, bool kShift, class Ring>
__device__ __forceinline__ void ws_produce(const sm90::BwdTensorMaps& maps, const Ring& ring, uint32_t sK, uint32_t sV,
                                           int64_t seqlen_q, int m_lo, int m_hi, int n0, int head, int heads,
                                           int head_k, int batch, int64_t bh) {
  constexpr int kKVBytes = kBlockN * kHeadDim * 2, kQBytes = kBlockM * kHeadDim * 2;
  constexpr int kBoxElems = ws_stat_box_elems<kBlockM>();
  constexpr int kStatsBytes = (kShift ? 3 : 2) * kBoxElems * 4;
  static_assert(kBoxElems * 4 % 16 == 0 && kBoxElems <= 256, "a block's lse / D is one 1-D TMA box");
  sm90::mbarrier_arrive_expect_tx(ring.bar_kv, 2 * kKVBytes);
  sm90::tma_load_tile<kBlockN, kHeadDim, kBlockCols>(sK, &maps.k, ring.bar_kv, n0, head_k, batch);
  sm90::tma_load_tile<kBlockN, kHeadDim, kBlockCols>(sV, &maps.v, ring.bar_kv, n0, head_k, batch);
  int it = 0;
  for (int g = 0; g < heads; ++g) {
    for (int m = m_lo; m <= m_hi; ++m, ++it) {
      const int s = it % Ring::kNumStages, m0 = m * kBlockM;
      if (it >= Ring::kNumStages) sm90::mbarrier_wait(ring.empty(s), ((it / Ring::kNumStages) - 1) & 1);
      sm90::mbarrier_arrive_expect_tx(ring.full(s), 2 * kQBytes + kStatsBytes);
      sm90::tma_load_tile<kBlockM, kHeadDim, kBlockCols>(ring.q(s), &maps.q, ring.full(s), m0, head + g, batch);
      sm90::tma_load_tile<kBlockM, kHeadDim, kBlockCols>(ring.dout(s), &maps.dout, ring.full(s), m0, head + g,
                                                         batch);
      // (the launcher checks that batch * nheads * seqlen_q fits an int)
      const int at = ws_stats_row(bh + g, seqlen_q, m0) & ~3;
      sm90::tma_load_1d(ring.stat(s, 0), &maps.lse, ring.full(s), at);
      sm90::tma_load_1d(ring.stat(s, 1), &maps.dsum, ring.full(s), at);
      if constexpr (kShift) sm90::tma_load_1d(ring.stat(s, 2), &maps.shift, ring.full(s), at);
    }
  }
}

// The (key block, head, batch) of this CTA of a (key blocks, heads, batch) grid (heads: nheads, or nheads_k where a
// CTA takes a whole GQA group): blockIdx, except for the CTAs of the last p.tile_order_tail (batch, head) pairs, which
// tile_order.h's order (the grid's CTAs start in linear blockIdx order) sends rank-major: a head's longest block,
// rank 0, is its first key block (causal lengths: key block n is seen by the query blocks from its diagonal on). (The
// launcher sets a tail only where the grid's CTAs fit an int.) The head-major CTAs keep blockIdx as it is: the order's
// division runs only in the tail's branch. At d 128 / 256 only (bwd_tile_config.h, kTileOrderTail); bwd_kernel.cuh's
// kernel keeps blockIdx (not timed with the tail).
__device__ __forceinline__ void bwd_tile_of_cta(const AttentionParams& p, int& n_block, int& head, int& batch) {
  n_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  if (p.tile_order_tail == 0) return;
  const int heads = int(gridDim.y * gridDim.z), bh = int(blockIdx.y + gridDim.y * blockIdx.z);
  if (bh >= heads - p.tile_order_tail) {
    int tail_bh, rank;
    TileOrder{int(gridDim.x), heads, p.tile_order_tail}.at(int(blockIdx.x + gridDim.x * bh), tail_bh, rank);
    n_block = rank;
    head = tail_bh % int(gridDim.y);
    batch = tail_bh / int(gridDim.y);
  }
}

// Whether dK, dV are the GQA group's sums, stored like k (the launch's CTAs each take a whole group: its grid has
// nheads_k heads), rather than one query head's fp32 partials or (without GQA) that head's.
// (AttentionParams::gqa_dkv, GqaDkv::kInKernel; host: the launcher's grid and kernel choice)
__host__ __device__ __forceinline__ bool ws_groups_gqa(const AttentionParams& p) {
  return p.h_h_k_ratio > 1 && p.gqa_dkv == GqaDkv::kInKernel;
}

// The CTA's key block (blockIdx.x of (key blocks, heads, batch), or with a tail tile_order.h's order) and the query
// blocks that see it, in both ws kernels.
// Its query heads: head (the first) .. head + heads - 1, of kv head head_k: one (heads 1), or where the CTA takes a
// whole GQA group (ws_groups_gqa) its h_h_k_ratio heads.
struct WsKeyBlock {
  int n_block, head, heads, head_k, batch, n0, m_lo, m_hi;
  int64_t bh;    // batch * nheads + head
  bool producer;  // this thread is in the producer warpgroup, whose part is done: the kernel returns
};

// The tile (linear index t: key block fastest, then head, then batch, the order a (key blocks, heads, batch) grid's
// CTAs start in) and piece of this CTA of a tail-split launch (p.bwd_tail_pieces > 1: a 1-D grid of the
// p.bwd_tail_grid_tiles - p.bwd_tail_tiles whole tiles, then each of the last p.bwd_tail_tiles tiles' pieces in turn,
// bwd_tail_split_plan): piece -1 for a whole tile. (bwd_ws_kernel calls it again in its epilogue rather than keep the
// piece in registers through the loop.)
struct WsTailTile {
  int t;           // the tile
  int piece;       // this CTA's piece of it, or -1: the whole tile
  int tail_index;  // which of the launch's last p.bwd_tail_tiles tiles it is, or -1
};
__device__ __forceinline__ WsTailTile ws_tail_tile(const AttentionParams& p) {
  const int whole = p.bwd_tail_grid_tiles - p.bwd_tail_tiles;
  WsTailTile tile{int(blockIdx.x), -1, -1};
  if (tile.t >= whole) {
    tile.tail_index = (tile.t - whole) / p.bwd_tail_pieces;
    tile.piece = tile.t - whole - tile.tail_index * p.bwd_tail_pieces;
    tile.t = whole + tile.tail_index;
  }
  return tile;
}

// The ws kernels' start once their shared memory is laid out: the key block and its query range, the ring's
// barriers, the CTA's only barrier (ws_cta_barrier: with kKeyBias an all-padded key block empties the range), then
// the producer warpgroup's whole part (its registers given back, one thread streaming the query blocks: ws_produce;
// a stage goes back to it once its consumers release it) and the consumers' registers taken.
template <typename T, typename Cfg, bool kKeyBias, class Ring>
__device__ __forceinline__ WsKeyBlock ws_start(const AttentionParams& p, const sm90::BwdTensorMaps& maps,
                                               const Ring& ring, uint32_t sK, uint32_t sV) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  // (the dQ conversion, launched behind this kernel, may take the SMs its last CTAs leave: ws_key_block_done)
  if constexpr (Cfg::kOverlapDqConversion) {
    if (threadIdx.x == 0) ptx::launch_dependent_grids();
  }
  WsKeyBlock blk;
  int grid_head;  // (a query head, or with ws_groups_gqa a kv head)
  const int num_n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  int piece = -1;  // (where the launch splits its last wave, this CTA's piece of a tail tile: ws_tail_tile)
  // (the tail split: no GQA, no causal lengths, no bias, bwd_tail_split_plan; compiled only where it may run)
  if (Cfg::kTailSplit && !kKeyBias && p.bwd_tail_pieces > 1) {
    const WsTailTile tile = ws_tail_tile(p);
    piece = tile.piece;
    const int bh = tile.t / num_n_blocks;
    blk.n_block = tile.t - bh * num_n_blocks, grid_head = bh % p.nheads, blk.batch = bh / p.nheads;
  } else if constexpr (Cfg::kTileOrderTail) {
    bwd_tile_of_cta(p, blk.n_block, grid_head, blk.batch);
  } else {
    blk.n_block = blockIdx.x, grid_head = blockIdx.y, blk.batch = blockIdx.z;
  }
  if (ws_groups_gqa(p)) {
    // (with kKeyBias the consumers keep one head's bias for the whole group: the launcher groups only a bias that is
    // the same for every head, bwd_ws_groups_gqa)
    if (kKeyBias && p.bias_head_stride != 0) __trap();
    blk.head_k = grid_head, blk.heads = p.h_h_k_ratio, blk.head = grid_head * p.h_h_k_ratio;
  } else {
    blk.head = grid_head, blk.heads = 1, blk.head_k = grid_head / p.h_h_k_ratio;
  }
  blk.n0 = blk.n_block * kBlockN;
  const int num_m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const QueryBlockRange range{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right, kBlockM, kBlockN, num_m_blocks};
  blk.m_lo = range.lo(blk.n_block);
  blk.m_hi = range.hi(blk.n_block);
  if (piece >= 0) {  // (its part of the tile's query blocks; the pieces cover them once, in order)
    const int len = blk.m_hi - blk.m_lo + 1, lo = blk.m_lo;
    blk.m_lo = lo + len * piece / p.bwd_tail_pieces;
    blk.m_hi = lo + len * (piece + 1) / p.bwd_tail_pieces - 1;
  }
  blk.bh = int64_t(blk.batch) * p.nheads + blk.head;

  if (threadIdx.x == 0) ring.init_barriers(4 * Cfg::kConsumerWarpgroups);
  static_assert(kBlockN <= Cfg::kNThreads, "one key per thread");
  blk.m_hi = ws_cta_barrier<T, kKeyBias, kBlockN>(p, blk.n0, blk.batch, blk.head, blk.m_lo, blk.m_hi);

  blk.producer = threadIdx.x < kWsProducerThreads;
  if (blk.producer) {
    sm90::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x == 0 && blk.m_lo <= blk.m_hi) {
      ws_produce<kBlockM, kBlockN, Cfg::kHeadDim, Cfg::kBlockCols, kKeyBias>(
          maps, ring, sK, sV, p.seqlen_q, blk.m_lo, blk.m_hi, blk.n0, blk.head, blk.heads, blk.head_k, blk.batch,
          blk.bh);
    }
  } else {
    sm90::setmaxnreg_inc<Cfg::kConsumerRegs>();
  }
  return blk;
}

// A consumer CTA's last step where the dQ conversion overlaps the kernel (p.key_blocks_done, bwd_launch_template.cuh):
// once every consumer's global writes are performed (dK, dV; the dQ reduce-adds, which their issuers waited for in
// full, bulk_wait_group<0, false>, or red.global's), the count of finished key blocks of each of its (batch, query
// head)s (bh .. bh + heads - 1) goes up by one, with release semantics: a conversion CTA that acquires a head's count
// at key_blocks_per_head reads the head's whole dQ. Every CTA counts, those without query blocks too. kBarrier: a
// named barrier of the consumers only. (Compiled only where the tile config overlaps the conversion,
// Cfg::kOverlapDqConversion.)
template <class Cfg, int kBarrier>
__device__ __forceinline__ void ws_key_block_done(const AttentionParams& p, int64_t bh, int heads, int ctid) {
  if constexpr (!Cfg::kOverlapDqConversion) return;
  if (p.key_blocks_done == nullptr) return;
  sm90::fence_proxy_async_global();  // (the TMA's reduce-adds before the generic release)
  ptx::named_barrier_sync<kBarrier, Cfg::kConsumerThreads>();
  for (int h = ctid; h < heads; h += Cfg::kConsumerThreads) ptx::red_add_release_gpu(p.key_blocks_done + bh + h, 1);
}

// A stage's row statistics as the consumers read them: the query block's row r at lse[r], dsum[r], shift[r]
// (ws_stats_offset values into each box, so read as single floats).
struct WsStats {
  const float* lse;
  const float* dsum;
  const float* shift;
};

// P^T from S^T in place, for one thread's fragments of the transposed scores (element (j, 2 half + e): key
// key_first + 8 half, query m0 + 8 j + 2 tig + e), rounded later: P = exp2(q.k scale log2e - lse log2e), or with a
// key-row bias (kKeyBias) exp2((q.k scale + bias[key] - shift) log2e - lse log2e) against bwd_row_stats_kernel's
// (shift, lse). kMasked: P = 0 for keys outside each query's range and for queries past seqlen_q (their lse and D are
// another row's). stats: the stage's (WsStats).
template <bool kKeyBias, bool kMasked, int kSNTiles>
__device__ __forceinline__ void ws_scores_to_p(float (&s_frag)[kSNTiles][4], const WsStats& stats,
                                               const AttentionParams& p, const BlockInfo& info, int m0, int key_first,
                                               int tig, const float (&key_bias)[2]) {
#pragma unroll
  for (int j = 0; j < kSNTiles; ++j) {
    const int r = 8 * j + 2 * tig;
    const float lse2[2] = {stats.lse[r] * kLog2e, stats.lse[r + 1] * kLog2e};
    float2 shift = make_float2(0.f, 0.f);
    if constexpr (kKeyBias) shift = make_float2(stats.shift[r], stats.shift[r + 1]);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      int key_lo = 0, key_hi = 0;
      if constexpr (kMasked) {
        const int query = m0 + 8 * j + 2 * tig + e;
        info.key_range(query, key_lo, key_hi);
        if (query >= p.seqlen_q) key_hi = -1;  // (its lse and D are another row's: P = 0)
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float prob;
        if constexpr (kKeyBias) {
          const float x = fmaf(s_frag[j][half * 2 + e], p.scale, key_bias[half]);
          prob = exp2_ftz(fmaf(x - (e == 0 ? shift.x : shift.y), kLog2e, -lse2[e]));
        } else {
          prob = exp2_ftz(fmaf(s_frag[j][half * 2 + e], p.scale_log2, -lse2[e]));
        }
        if constexpr (kMasked) {
          const int key = key_first + 8 * half;
          if (key < key_lo || key > key_hi) prob = 0.f;
        }
        s_frag[j][half * 2 + e] = prob;
      }
    }
  }
}

// One thread's register-A fragments of P^T or dS^T (k16 step kt: keys key_first + 8 half, queries 16 kt + 8 e +
// 2 tig, + 1) into a (keys, queries) swizzled tile, for wgmma operands that read it from shared memory.
// FA2_BWD_STMATRIX (default): one stmatrix .x4 per k16 step (its four 8x8 matrices are exactly the fragment's four
// registers: keys +0 / +8, queries +0 / +8; lanes 8 i .. 8 i + 7 give matrix i's row addresses), a quarter of the
// instructions of the 32-bit stores (st_shared_pair) that it replaces on the shared-memory pipe; 0: those stores.
// (It takes the lane from threadIdx: key_first must be the warp's first row + lane / 4, as both kernels' key0 is.)
template <typename Tile, int kKSteps>
__device__ __forceinline__ void ws_store_a_fragments(uint32_t sTile, const uint32_t (&a)[kKSteps][4], int key_first,
                                                     int tig) {
#if FA2_BWD_STMATRIX
  const int lane = int(threadIdx.x) & 31, i = lane >> 3;
  const int row = key_first - (lane >> 2) + 8 * (i & 1) + (lane & 7);  // (key_first - group: the warp's 16 rows)
  const uint32_t lane_base = sTile + Tile::lane_bytes(row, i >> 1);
#pragma unroll
  for (int kt = 0; kt < kKSteps; ++kt) {
    const uint32_t addr = Tile::fragment_address(lane_base, 0, 2 * kt);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a[kt][0]),
                 "r"(a[kt][1]), "r"(a[kt][2]), "r"(a[kt][3])
                 : "memory");
  }
#else
#pragma unroll
  for (int j = 0; j < 2 * kKSteps; ++j) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      st_shared_pair<Tile>(sTile, key_first + 8 * half, 8 * j + 2 * tig, a[j / 2][(j % 2) * 2 + half]);
    }
  }
#endif
}

// One warp's dQ fragments (rows row_first + 8 half, columns 8 nt + 2 tig + e) into the TMA reduce-add's staging:
// 32-column boxes (n8 tiles 4 box .. 4 box + 3), box b at box_at(b), rows of 128 bytes with the 128-byte swizzle
// (row r's 16-byte chunk c at c ^ r % 8).
// Bank conflicts: a 64-bit store is served per half-warp (4 rows r % 8 = 4 h .. 4 h + 3, all four tig). Were every lane
// to store tile nt, tig 0-1 (chunk 2 (nt % 4)) and tig 2-3 (chunk 2 (nt % 4) + 1) would land, after the swizzle, in
// the same four chunks: two wavefronts per half-warp (ncu: 4 per instruction, 2 ideal; ~20% of the d 128 backward's
// issue stalls were MIO throttle on these stores). So tig 2-3 store tile nt ^ 2 where tig 0-1 store nt: the two
// halves of the half-warp fill different aligned groups of four chunks (the swizzle's r % 4 part stays inside one),
// 128 bytes over 32 banks, one wavefront. (Two selects per store: the tile is a per-lane choice.)
template <int kNTiles, class BoxAt>
__device__ __forceinline__ void ws_stage_dq(const float (&dq_frag)[kNTiles][4], BoxAt box_at, int row_first, int tig) {
  static_assert(kNTiles % 4 == 0, "the dQ staging pairs n8 tiles nt and nt ^ 2 of one 32-column box");
  const bool swapped = tig >= 2;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row_first + 8 * half;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int lane_nt = swapped ? nt ^ 2 : nt;
      const int box = nt / 4, chunk = 2 * (lane_nt % 4) + tig / 2;
      const uint32_t addr = box_at(box) + r * 128 + ((chunk ^ (r % 8)) << 4) + (tig % 2) * 8;
      const float x = swapped ? dq_frag[nt ^ 2][half * 2] : dq_frag[nt][half * 2];
      const float y = swapped ? dq_frag[nt ^ 2][half * 2 + 1] : dq_frag[nt][half * 2 + 1];
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
    }
  }
}

// The epilogue: one thread's dK = scale dS^T Q and dV fragments (keys key_first + 8 half, columns
// col_first + 8 nt + 2 tig + e)
// to global memory; keys past seqlen_k and dims past headdim are not stored. GQA without the group summed in the
// CTA (p.gqa_dkv): fp32, stored as the partials of query head `head` (kPartials: summed over the group by the
// caller) or added into kv head `head`'s accumulators (kAccumulate, bwd_ws_dsplit_kernel.cuh: red.global.add, as the
// group's other heads' CTAs do; bwd_ws_kernel.cuh adds them by the TMA); else T at kv head `head`, with FA2_BWD_QUAD_STORES each quad's fragments transposed (ptx::quad_transpose) into
// whole n8 tiles per lane, stored 16 bytes at a time (every lane of the warp calls this).
template <typename T, int kDTiles>
__device__ __forceinline__ void ws_store_dk_dv(const AttentionParams& p, const float (&dk_frag)[kDTiles][4],
                                               const float (&dv_frag)[kDTiles][4], int batch, int head, int key_first,
                                               int col_first, int tig) {
  const bool fp32_dkv = p.h_h_k_ratio > 1 && p.gqa_dkv != GqaDkv::kInKernel;
  if (FA2_BWD_QUAD_STORES && kDTiles % 4 == 0 && !fp32_dkv) {
    T* dk_bh = static_cast<T*>(p.dk) + batch * p.dk_batch_stride + head * p.dk_head_stride;
    T* dv_bh = static_cast<T*>(p.dv) + batch * p.dv_batch_stride + head * p.dv_head_stride;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = key_first + 8 * half;
#pragma unroll
      for (int g = 0; g < kDTiles / 4; ++g) {
        uint32_t xk[4], xv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float* k_el = dk_frag[4 * g + i] + half * 2;
          const float* v_el = dv_frag[4 * g + i] + half * 2;
          xk[i] = ptx::pack2<T>(k_el[0] * p.scale, k_el[1] * p.scale);
          xv[i] = ptx::pack2<T>(v_el[0], v_el[1]);
        }
        ptx::quad_transpose(xk, tig);  // this lane: n8 tile 4 g + tig
        ptx::quad_transpose(xv, tig);
        const int col = col_first + 8 * (4 * g + tig);
        if (key < p.seqlen_k && col < p.headdim) {
          *reinterpret_cast<uint4*>(dk_bh + int64_t(key) * p.dk_row_stride + col) =
              make_uint4(xk[0], xk[1], xk[2], xk[3]);
          *reinterpret_cast<uint4*>(dv_bh + int64_t(key) * p.dv_row_stride + col) =
              make_uint4(xv[0], xv[1], xv[2], xv[3]);
        }
      }
    }
    return;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = key_first + 8 * half;
    if (key >= p.seqlen_k) continue;
#pragma unroll
    for (int nt = 0; nt < kDTiles; ++nt) {
      const int col = col_first + 8 * nt + 2 * tig;
      if (col >= p.headdim) continue;
      const float dk0 = dk_frag[nt][half * 2] * p.scale, dk1 = dk_frag[nt][half * 2 + 1] * p.scale;
      const float dv0 = dv_frag[nt][half * 2], dv1 = dv_frag[nt][half * 2 + 1];
      if (fp32_dkv) {
        float* dk = static_cast<float*>(p.dk) + batch * p.dk_batch_stride + head * p.dk_head_stride +
                    int64_t(key) * p.dk_row_stride + col;
        float* dv = static_cast<float*>(p.dv) + batch * p.dv_batch_stride + head * p.dv_head_stride +
                    int64_t(key) * p.dv_row_stride + col;
        if (p.gqa_dkv == GqaDkv::kAccumulate) {
          ptx::red_add_f32x2(dk, dk0, dk1);
          ptx::red_add_f32x2(dv, dv0, dv1);
        } else {
          *reinterpret_cast<float2*>(dk) = make_float2(dk0, dk1);
          *reinterpret_cast<float2*>(dv) = make_float2(dv0, dv1);
        }
      } else {
        T* dk = static_cast<T*>(p.dk) + batch * p.dk_batch_stride + head * p.dk_head_stride +
                int64_t(key) * p.dk_row_stride + col;
        T* dv = static_cast<T*>(p.dv) + batch * p.dv_batch_stride + head * p.dv_head_stride +
                int64_t(key) * p.dv_row_stride + col;
        *reinterpret_cast<uint32_t*>(dk) = ptx::pack2<T>(dk0, dk1);
        *reinterpret_cast<uint32_t*>(dv) = ptx::pack2<T>(dv0, dv1);
      }
    }
  }
}

template <typename T, typename Cfg, bool kKeyBias>
__global__ void __launch_bounds__(Cfg::kNThreads, 1)
    bwd_ws_kernel(const __grid_constant__ AttentionParams p, const __grid_constant__ sm90::BwdTensorMaps maps) {
  constexpr int kHeadDim = Cfg::kHeadDim, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kBlockCols = Cfg::kBlockCols, kColBlocks = kHeadDim / kBlockCols;
  using QTile = SwizzledTile<kBlockM, kHeadDim, kBlockCols>;   // Q, dO: (queries, d)
  using KTile = SwizzledTile<kBlockN, kHeadDim, kBlockCols>;   // K, V: (keys, d)
  using DsTile = SwizzledTile<kBlockN, kBlockM, 64>;           // dS^T: (keys, queries)
  constexpr int kSNTiles = kBlockM / 8;        // n8 tiles of S^T / dP^T per warp (its 16 keys x kBlockM queries)
  constexpr int kDTiles = kHeadDim / 8;        // n8 tiles of dK / dV (16 keys x d)
  constexpr int kDqRows = Cfg::kDqRows, kDqCols = Cfg::kDqCols;
  constexpr int kDqNTiles = kDqCols / 8;     // n8 tiles of this warpgroup's dQ part (16 queries x kDqCols)
  constexpr bool kPrefetchScores = FA2_BWD_PREFETCH_SCORES;
  static_assert(kColBlocks * kBlockCols * kBlockN * 2 == Cfg::kSmemKVBytes, "K/V boxes cover the tile exactly");
  static_assert(kColBlocks * kBlockCols * kBlockM * 2 == Cfg::kSmemQBytes, "Q/dO boxes cover the tile exactly");

  // smem: [K (kBlockN, d)] [V] [Q0 (kBlockM, d)] [dO0] [Q1] [dO1].. [dS^T 0 (kBlockN, kBlockM)] [dS^T 1]
  //       [dQ part of warpgroup 0 (64, kDqCols) fp32] [of warpgroup 1] [lse, D (, shift)]0 [lse, D (, shift)]1..
  //       [mbarriers: K/V, full per stage, empty per stage]
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t sK = ptx::smem_u32(smem);
  if (sK % 1024 != 0) __trap();  // the descriptors and the TMA's swizzle assume 1024-byte aligned tiles
  const uint32_t sV = sK + Cfg::kSmemKVBytes;
  const uint32_t sRing = sV + Cfg::kSmemKVBytes;
  auto sDs = [&](int b) { return sRing + kStages * 2 * Cfg::kSmemQBytes + b * Cfg::kSmemDsBytes; };
  auto sDq = [&](int w) { return sDs(2) + w * Cfg::kSmemDqBytes; };
  // per stage: lse, D, and with kKeyBias the row shift (bwd_row_stats_kernel's; lse is its too), each a box of
  // kBlockM + 4 values in a kSmemStatBytes slot (the shift's slot is reserved without kKeyBias too)
  static_assert(ws_stat_box_elems<kBlockM>() * 4 <= Cfg::kSmemStatBytes, "a statistic's box fits its space");
  const uint32_t sStats0 = sDq(Cfg::kConsumerWarpgroups);
  const WsRing<kStages, Cfg::kSmemQBytes, Cfg::kSmemStatBytes> ring{sRing, sStats0,
                                                                   sStats0 + kStages * 3 * Cfg::kSmemStatBytes};
  auto smem_at = [&](uint32_t addr) { return smem + (addr - sK); };

  // (FA2_CTA_TRACE: entry; K/V and the first stage landed; the end of each of the first 60 query blocks; the loop's
  // end; the kernel's end)
  constexpr int kTraceLanded = trace::kFirstEvent, kTraceBlock0 = kTraceLanded + 1, kTraceBlocks = 60;
  constexpr int kTraceLoopEnd = kTraceBlock0 + kTraceBlocks, kTraceEnd = kTraceLoopEnd + 1;
  static_assert(kTraceEnd < trace::kSlots, "the events fit a CTA's slots");
  FA2_CTA_MARK(trace::kEntry, threadIdx.x == 0);
  FA2_CTA_MARK(trace::kEntryNs, threadIdx.x == 0);
  FA2_CTA_MARK(trace::kSm, threadIdx.x == 0);
  const WsKeyBlock blk = ws_start<T, Cfg, kKeyBias>(p, maps, ring, sK, sV);
  if (blk.producer) return;
  const int n_block = blk.n_block, head = blk.head, batch = blk.batch, n0 = blk.n0, m_lo = blk.m_lo, m_hi = blk.m_hi;
  const int64_t bh = blk.bh;
  const int lane = threadIdx.x & 31;
  // the loop's steps: query blocks m_lo .. m_hi of query head head, then (a CTA that sums a GQA group) of each next
  // head of the group in turn
  const int steps = m_hi >= m_lo ? (m_hi - m_lo + 1) * blk.heads : 0;

  // -- the consumer warpgroups
  const int ctid = int(threadIdx.x) - kWsProducerThreads;
  // (wg broadcast from lane 0: ptxas then treats it as warp-uniform and builds the descriptors of this warpgroup's
  // K / V rows in uniform registers, not per thread with two R2UR before every wgmma)
  const int wg = __shfl_sync(0xffffffffu, ctid >> 7, 0);
  const int warp_in_wg = (ctid >> 5) & 3, group = lane >> 2, tig = lane & 3;
  const int key0 = wg * 64 + warp_in_wg * 16 + group;  // this thread's first fragment row (key in the block)
  // kKeyBias: the bias of this thread's keys key0, key0 + 8 (0 past seqlen_k: those keys are masked), the same for
  // every head of a GQA group the CTA sums (ws_start)
  float key_bias[2] = {0.f, 0.f};
  if constexpr (kKeyBias) ws_load_key_bias<T>(p, batch, head, n0 + key0, key_bias);
  const BlockInfo info{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};
  // this warpgroup's dQ reduce-adds: issued (and their shared memory's reads waited for) by its first thread; its part
  // of a query block's dQ: rows dq_row0 .. + 63, columns dq_col0 .. + kDqCols - 1
  const bool dq_issuer = (ctid & 127) == 0;
  const int dq_row0 = Cfg::kDqSplitRows ? wg * kDqRows : 0, dq_col0 = Cfg::kDqSplitRows ? 0 : wg * kDqCols;
  // this warpgroup's own named barrier (2 + wg: the dQ staging, the staged dK / dV)
  auto warpgroup_sync = [&] {
    if (wg == 0) {
      ptx::named_barrier_sync<2, 128>();
    } else {
      ptx::named_barrier_sync<3, 128>();
    }
  };

  float acc_dk[kHeadDim / 2], acc_dv[kHeadDim / 2];  // (this warp's 16 keys, d)
  ptx::zero(reinterpret_cast<float(&)[1][kDTiles][4]>(acc_dk));
  ptx::zero(reinterpret_cast<float(&)[1][kDTiles][4]>(acc_dv));

  // -- S^T = K_w Q^T, dP^T = V_w dO^T (64 keys x kBlockM queries each) of the query block in stage s
  //    (kPrefetchScores: the next block's S^T is issued in this one's dQ step, so that it runs while the dQ is
  //    staged; dP^T too would need 64 more registers there than the 240 hold)
  float acc_s[kBlockM / 2], acc_dp[kBlockM / 2];
  auto issue_s = [&](int s) {
    sm90::gemm_ss<T, kBlockM, kHeadDim / 16, false, false, KTile, QTile, /*kWait=*/false, /*kOverwrite=*/true>(
        acc_s, sK, wg * 64, ring.q(s), 0);
  };
  auto issue_dp = [&](int s) {
    sm90::gemm_ss<T, kBlockM, kHeadDim / 16, false, false, KTile, QTile, /*kWait=*/false, /*kOverwrite=*/true>(
        acc_dp, sV, wg * 64, ring.dout(s), 0);
  };
  // (kPrefetchScores: every S^T issue is unconditional, only the waits for its stage are not: issued under a
  //  condition, ptxas saw accumulators in flight on a divergent path and serialized every wgmma (C7515 / C7518). A key
  //  block no query sees, and the last query block, issue one S^T of an idle stage whose result is never read. And
  //  each is waited for within the iteration that issued it: in flight across the loop's back edge, ptxas serialized
  //  them again (C7514).)
  if (steps > 0) {
    sm90::mbarrier_wait_untimed(ring.bar_kv, 0);
    if constexpr (kPrefetchScores) sm90::mbarrier_wait_untimed(ring.full(0), 0);
  }
  FA2_CTA_MARK(kTraceLanded, ctid == 0);
  if constexpr (kPrefetchScores) {
    issue_s(0);
    sm90::wait_hold<0>(acc_s);
  }
  // this step's query block, and the flat row (batch, head, query) of its head's first query (the launcher checks that
  // batch * nheads * seqlen_q fits an int)
  int m = m_lo, head_row0 = int(bh * p.seqlen_q);
  for (int it = 0; it < steps; ++it) {
    const int s = it % kStages, m0 = m * kBlockM;
    if constexpr (!kPrefetchScores) {
      sm90::mbarrier_wait_untimed(ring.full(s), (it / kStages) & 1);
      issue_s(s);
    }
    issue_dp(s);
    const int stats_off = ws_stats_offset(head_row0 + m0);
    auto stat_at = [&](int i) { return reinterpret_cast<const float*>(smem_at(ring.stat(s, i))) + stats_off; };
    const WsStats stats{stat_at(0), stat_at(1), stat_at(2)};
    sm90::wait_hold<1>(acc_s);  // (one group per product, completing in issue order: dP^T keeps running)

    // -- P^T (ws_scores_to_p), rounded to T; masked (P = 0) on boundary blocks
    auto& s_frag = reinterpret_cast<float(&)[kSNTiles][4]>(acc_s);
    if (info.needs_mask(n_block, kBlockN, m0, kBlockM) || m0 + kBlockM > p.seqlen_q) {
      ws_scores_to_p<kKeyBias, true>(s_frag, stats, p, info, m0, n0 + key0, tig, key_bias);
    } else {
      ws_scores_to_p<kKeyBias, false>(s_frag, stats, p, info, m0, n0 + key0, tig, key_bias);
    }
    uint32_t p_frag[kBlockM / 16][4];
    pack_k16_fragments<T>(s_frag, p_frag);

    // -- dV_w += P^T dO and dS^T = P^T (dP^T - D). No register that an in-flight wgmma reads as its A operand (p_frag
    //    for dV, ds_frag for dK) is read before that wgmma's wait (the PTX ISA leaves such reads undefined): dS comes
    //    from the fp32 P while dV runs, or, where that P would not fit beside dP^T (Cfg::kDsBeforeDv), from the rounded
    //    P before dV is issued.
    auto& dp_frag = reinterpret_cast<float(&)[kSNTiles][4]>(acc_dp);
    auto to_ds = [&](auto from_rounded_p) {
#pragma unroll
      for (int j = 0; j < kSNTiles; ++j) {
        const float2 dsum = make_float2(stats.dsum[8 * j + 2 * tig], stats.dsum[8 * j + 2 * tig + 1]);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float2 prob = make_float2(s_frag[j][half * 2], s_frag[j][half * 2 + 1]);
          if constexpr (decltype(from_rounded_p)::value) prob = unpack2<T>(p_frag[j / 2][(j % 2) * 2 + half]);
          dp_frag[j][half * 2] = prob.x * (dp_frag[j][half * 2] - dsum.x);
          dp_frag[j][half * 2 + 1] = prob.y * (dp_frag[j][half * 2 + 1] - dsum.y);
        }
      }
    };
    uint32_t ds_frag[kBlockM / 16][4];
    if constexpr (Cfg::kDsBeforeDv) {
      // (dS^T packed before dV's issue: its fp32 values are dead by then, which kept fp16 at d 64 from spilling)
      sm90::wait_hold<0>(acc_dp);
      to_ds(std::true_type{});
      pack_k16_fragments<T>(dp_frag, ds_frag);
      sm90::gemm_rs<T, kHeadDim, kBlockM / 16, QTile, /*kWait=*/false>(acc_dv, p_frag, ring.dout(s));
    } else {
      sm90::gemm_rs<T, kHeadDim, kBlockM / 16, QTile, /*kWait=*/false>(acc_dv, p_frag, ring.dout(s));
      sm90::wait_hold<1>(acc_dp);  // (dV keeps running)
      to_ds(std::false_type{});
      pack_k16_fragments<T>(dp_frag, ds_frag);
    }

    // -- dS^T to shared memory (buffer it % 2: the other warpgroup may still be reading the previous one in its dQ;
    //    the one before that every consumer finished before the barrier of the last iteration), stored before dK's
    //    wgmma reads ds_frag; then dK_w += dS^T Q, and dQ = dS K once both warpgroups' dS^T are there.
    //    The barrier also tells every thread that the dQ staging is free again: its issuer waited, before it, for the
    //    reads of the last iteration's reduce-adds.
    const uint32_t s_ds = sDs(it & 1);
    ws_store_a_fragments<DsTile>(s_ds, ds_frag, key0, tig);
    sm90::gemm_rs<T, kHeadDim, kBlockM / 16, QTile, /*kWait=*/false>(acc_dk, ds_frag, ring.q(s));
    sm90::fence_proxy_async();  // dS^T, stored by threads, then read by wgmma
    if (dq_issuer) sm90::bulk_wait_group<0, /*kRead=*/true>();
    ptx::named_barrier_sync<1, 128 * Cfg::kConsumerWarpgroups>();
    float acc_dq[kDqCols / 2];  // (this warp's 16 queries, this warpgroup's kDqCols columns)
    sm90::gemm_ss<T, kDqCols, kBlockN / 16, /*kAMnMajor=*/true, /*kBMnMajor=*/true, DsTile, KTile,
                  /*kWait=*/false, /*kOverwrite=*/true>(acc_dq, s_ds, dq_row0, sK, dq_col0);
    // -- every product that read the stage (S^T, dP^T, dV, dK) has completed: release it to the producer, and P^T /
    //    dS^T's registers are free. kPrefetchScores: dQ may still be running; the next block's S^T goes out behind it,
    //    and dQ alone is waited for before its staging (S^T at the end of the iteration)
    if constexpr (kPrefetchScores) {
      sm90::wait_hold<1>(acc_dv, acc_dk);
    } else {
      sm90::wait_hold<0>(acc_dv, acc_dk, acc_dq);
    }
    sm90::hold_fragments(p_frag);
    sm90::hold_fragments(ds_frag);
    __syncwarp();
    if (lane == 0) sm90::mbarrier_arrive(ring.empty(s));
    if constexpr (kPrefetchScores) {
      const int next = (it + 1) % kStages;
      if (it + 1 < steps) sm90::mbarrier_wait_untimed(ring.full(next), ((it + 1) / kStages) & 1);
      issue_s(next);
      sm90::wait_hold<1>(acc_dq);
    }

    // -- dQ (partial over this key block) into dq_accum: the warpgroup's (64, kDqCols) staged in shared memory as the
    //    reduce-add's boxes of 32 columns (128-byte swizzle: row r's 16-byte chunk c at c ^ r % 8), then added by the
    //    TMA. Fragment element (nt, 2 half + e): row 16 warp + group + 8 half, column 8 nt + 2 tig + e of the part.
    //    (The accumulator has kHeadDim columns; those past headdim receive zeros: K is zero there.)
    auto& dq_frag = reinterpret_cast<float(&)[kDqNTiles][4]>(acc_dq);
    const uint32_t s_dq = sDq(wg);
    ws_stage_dq(dq_frag, [&](int box) { return s_dq + box * (kDqRows * 128); }, warp_in_wg * 16 + group, tig);
    sm90::fence_proxy_async();  // the staging, stored by threads, then read by the TMA
    warpgroup_sync();
    if (dq_issuer) {
      const int row = head_row0 + m0 + dq_row0;
#pragma unroll
      for (int box = 0; box < kDqCols / 32; ++box) {
        sm90::tma_reduce_add_2d(&maps.dq_accum, s_dq + box * (kDqRows * 128), dq_col0 + 32 * box, row);
      }
      sm90::bulk_commit_group();
    }
    if constexpr (kPrefetchScores) sm90::wait_hold<0>(acc_s);  // the next block's S^T (the last block's: unread)
    FA2_CTA_MARK(kTraceBlock0 + it, ctid == 0 && it < kTraceBlocks);
    if (++m > m_hi) m = m_lo, head_row0 += p.seqlen_q;  // (the group's next head)
  }
  FA2_CTA_MARK(kTraceLoopEnd, ctid == 0);
  // -- epilogue: dK = scale dS^T Q, dV; keys past seqlen_k and dims past headdim are not stored. A key block no query
  //    sees stores zeros.
  auto& dk_frag = reinterpret_cast<float(&)[kDTiles][4]>(acc_dk);
  auto& dv_frag = reinterpret_cast<float(&)[kDTiles][4]>(acc_dv);
  // (GQA's fp32 partials per query head, or its accumulators per kv head; else stored like k)
  const bool fp32_dkv = p.h_h_k_ratio > 1 && p.gqa_dkv != GqaDkv::kInKernel;
  // dK (times dk_scale) and dV added into fp32 rows (row .. row + 63 of each warpgroup's 64 keys, in dk_map's and
  // dv_map's) by the TMA's reduce-add, as dQ is: GQA's accumulators per kv head where one CTA per query head runs, or
  // a tail piece's rows (below). Each warpgroup's (64 keys, d) staged as 32-column boxes of 64 rows (ws_stage_dq's
  // layout) in its ring stage's Q and dO buffers (free once every consumer is past its last products: the barrier;
  // see the staged stores below), dK and dV at once where both fit (d 64), else dK, then dV once the TMA has read it
  // (d 128). (Added from the fragments by red.global.add.v2.f32 instead, one CTA per query head ran 1.03-1.04x the
  // fp32 partials at S 1k, against the grouped kernel's 1.3x: H200, d 128, 32 / 4 heads.) A key block no query sees
  // adds nothing (the accumulators start at zero). The reduce-adds are committed, not waited for.
  auto add_dkv = [&](const CUtensorMap* dk_map, const CUtensorMap* dv_map, int row, float dk_scale) {
    constexpr int kPartBytes = 64 * kHeadDim * 4;  // one warpgroup's dK (or dV)
    constexpr bool kBothAtOnce = 2 * kPartBytes <= 2 * Cfg::kSmemQBytes;
    static_assert(kPartBytes <= 2 * Cfg::kSmemQBytes && kStages >= Cfg::kConsumerWarpgroups && kDTiles % 4 == 0,
                  "a warpgroup's dK (or dV) in fp32 fits its stage's Q and dO buffers, as whole 32-column boxes");
    ptx::named_barrier_sync<1, 128 * Cfg::kConsumerWarpgroups>();
    if (steps == 0) return;  // (uniform over the CTA)
    const uint32_t s_part = ring.q(wg);
    auto box_at = [](uint32_t part) { return [part](int box) { return part + box * (64 * 128); }; };
    auto reduce_add = [&](const CUtensorMap* map, uint32_t part) {
#pragma unroll
      for (int box = 0; box < kHeadDim / 32; ++box) {
        sm90::tma_reduce_add_2d(map, part + box * (64 * 128), 32 * box, row);
      }
    };
#pragma unroll
    for (int nt = 0; nt < kDTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) dk_frag[nt][i] *= dk_scale;
    }
    ws_stage_dq(dk_frag, box_at(s_part), warp_in_wg * 16 + group, tig);
    if constexpr (kBothAtOnce) ws_stage_dq(dv_frag, box_at(s_part + kPartBytes), warp_in_wg * 16 + group, tig);
    sm90::fence_proxy_async();  // the staging, stored by threads, then read by the TMA
    warpgroup_sync();
    if (dq_issuer) {
      reduce_add(dk_map, s_part);
      if constexpr (kBothAtOnce) reduce_add(dv_map, s_part + kPartBytes);
      sm90::bulk_commit_group();
    }
    if constexpr (!kBothAtOnce) {
      if (dq_issuer) sm90::bulk_wait_group<0, /*kRead=*/true>();
      warpgroup_sync();
      ws_stage_dq(dv_frag, box_at(s_part), warp_in_wg * 16 + group, tig);
      sm90::fence_proxy_async();
      warpgroup_sync();
      if (dq_issuer) {
        reduce_add(dv_map, s_part);
        sm90::bulk_commit_group();
      }
    }
  };
  WsTailTile tail{0, -1, -1};
  if (Cfg::kTailSplit && !kKeyBias && p.bwd_tail_pieces > 1) tail = ws_tail_tile(p);
  const int piece = tail.piece, tail_index = tail.tail_index;
  if (piece >= 0) {
    // A piece of a tail tile (the launch's last wave split, p.bwd_tail_pieces > 1): its dK, dV (unscaled) added into
    // the tile's fp32 rows of p.bwd_tail_dkv (maps.dk_accum / dv_accum over them; rows past seqlen_k get zeros), then,
    // once this CTA's reduce-adds (dQ's too) have completed, counted in the tile's count with release semantics
    // (ws_key_block_done's order). The piece that counts last acquires the others' sums, reads the whole tile's
    // (through the L2) into its fragments, and stores them as a whole tile's CTA does (and counts the key block
    // finished for the dQ conversion); the others are done.
    add_dkv(&maps.dk_accum, &maps.dv_accum, tail_index * kBlockN + wg * 64, 1.f);
    if (dq_issuer) sm90::bulk_wait_group<0, /*kRead=*/false>();
    sm90::fence_proxy_async_global();
    ptx::named_barrier_sync<1, 128 * Cfg::kConsumerWarpgroups>();
    // (the flag in dS^T's first buffer, which no product reads any more)
    volatile int* const last_piece = reinterpret_cast<volatile int*>(smem_at(sDs(0)));
    if (ctid == 0) {
      *last_piece = ptx::atom_add_acq_rel_gpu(p.bwd_tail_counts + tail_index, 1) == p.bwd_tail_pieces - 1;
    }
    ptx::named_barrier_sync<1, 128 * Cfg::kConsumerWarpgroups>();
    if (*last_piece == 0) return;
    __threadfence();  // (each thread's reads of the sums after ctid 0's acquire, which the barrier passed on)
    const int64_t tile_floats = int64_t(kBlockN) * kHeadDim;
    const float* dk_sum = p.bwd_tail_dkv + tail_index * tile_floats;
    const float* dv_sum = dk_sum + p.bwd_tail_tiles * tile_floats;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int nt = 0; nt < kDTiles; ++nt) {
        const int64_t at = int64_t(key0 + 8 * half) * kHeadDim + 8 * nt + 2 * tig;
        const float2 k2 = __ldcg(reinterpret_cast<const float2*>(dk_sum + at));
        const float2 v2 = __ldcg(reinterpret_cast<const float2*>(dv_sum + at));
        dk_frag[nt][half * 2] = k2.x, dk_frag[nt][half * 2 + 1] = k2.y;
        dv_frag[nt][half * 2] = v2.x, dv_frag[nt][half * 2 + 1] = v2.y;
      }
    }
  }
  if (p.h_h_k_ratio > 1 && p.gqa_dkv == GqaDkv::kAccumulate) {
    // GQA with one CTA per query head: dK = scale dS^T Q and dV added into the kv head's fp32 accumulators (the
    // first of this warpgroup's 64 keys as a row of the (batch, nheads_k, seqlen_k) accumulators; the keys past
    // seqlen_k add exact zeros into the next head's first rows, as dQ's rows past seqlen_q do: P is 0 there)
    add_dkv(&maps.dk_accum, &maps.dv_accum, (batch * p.nheads_k + blk.head_k) * p.seqlen_k + n0 + wg * 64, p.scale);
  } else if (!FA2_BWD_STAGED_DKV || fp32_dkv) {
    ws_store_dk_dv<T>(p, dk_frag, dv_frag, batch, p.gqa_dkv == GqaDkv::kPartials ? head : blk.head_k, n0 + key0, 0,
                      tig);
  } else {
    // FA2_BWD_STAGED_DKV: through shared memory to 16-byte global stores. Straight from the fragments (each warp's
    // 32-bit stores writing 16-byte pieces of 8 rows) a CTA's epilogue took ~11k cycles, 14% of a key block's time at
    // S 1k (d 128, H200: a clock64 trace of the harness's backward, benchmarks/results/patches/
    // 20261201-bwd-trace.patch); staged, the backward runs +5-10% at S 1k, +1-3% at 4k (d 64 / 128). Warpgroup w's
    // dK and dV (64 keys x d) go to stage w's Q and dO buffers, free once every consumer is past its last products
    // (the barrier): every TMA load into the ring was waited for (each loaded stage is consumed), and a wgmma's
    // completion carries an implicit generic-async proxy fence (PTX ISA, wgmma.mma_async), so the generic stores
    // need no fence.proxy.async. (bwd_ws_applies checked dk / dv for the 16-byte stores.)
    using OutTile = SwizzledTile<64, kHeadDim, kBlockCols>;
    static_assert(OutTile::kBytes <= Cfg::kSmemQBytes && kStages >= Cfg::kConsumerWarpgroups,
                  "a warpgroup's dK (and dV) fit a stage's Q (and dO) buffer");
    ptx::named_barrier_sync<1, 128 * Cfg::kConsumerWarpgroups>();
    unsigned char* s_dk = smem_at(ring.q(wg));
    unsigned char* s_dv = smem_at(ring.dout(wg));
    const int row_w = warp_in_wg * 16 + group;  // this thread's first row in the warpgroup's 64 keys
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int nt = 0; nt < kDTiles; ++nt) {
        const int at = (OutTile::offset(row_w + 8 * half, nt) + 2 * tig) * 2;
        *reinterpret_cast<uint32_t*>(s_dk + at) =
            ptx::pack2<T>(dk_frag[nt][half * 2] * p.scale, dk_frag[nt][half * 2 + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(s_dv + at) = ptx::pack2<T>(dv_frag[nt][half * 2], dv_frag[nt][half * 2 + 1]);
      }
    }
    warpgroup_sync();
    // this warpgroup's 64 keys from n0 + 64 wg (copy_out_rows: its reads first, then predicated 16-byte stores)
    const int key0 = n0 + wg * 64;
    T* dk = static_cast<T*>(p.dk) + batch * p.dk_batch_stride + blk.head_k * p.dk_head_stride + key0 * p.dk_row_stride;
    T* dv = static_cast<T*>(p.dv) + batch * p.dv_batch_stride + blk.head_k * p.dv_head_stride + key0 * p.dv_row_stride;
    constexpr int kIters = 64 * kDTiles / 128;
    static_assert(64 * kDTiles % 128 == 0, "the 16-byte chunks split evenly over the warpgroup");
    copy_out_rows<OutTile, kDTiles, kIters, 128>(s_dk, dk, p.dk_row_stride, 0, ctid & 127, p.seqlen_k - key0,
                                                 p.headdim, [] {});
    copy_out_rows<OutTile, kDTiles, kIters, 128>(s_dv, dv, p.dv_row_stride, 0, ctid & 127, p.seqlen_k - key0,
                                                 p.headdim, [] {});
  }
  if (dq_issuer) sm90::bulk_wait_group<0, /*kRead=*/false>();  // (the staging must outlive the reads)
  ws_key_block_done<Cfg, 1>(p, bh, blk.heads, ctid);
  FA2_CTA_MARK(kTraceEnd, ctid == 0);
  FA2_CTA_MARK(trace::kExitNs, ctid == 0);
}

}  // namespace bwd
}  // namespace fa2
