// FlashAttention-2 backward, sm_90a warp-specialized main kernel for large headdims (d 256; BwdWsSplitTileConfig,
// bwd_tile_config.h): bwd_ws_kernel.cuh's structure (a producer thread streams Q, dO, lse, D by the TMA through a
// kStages ring; K, V loaded once; the transposed scores, keys as the wgmma M; dQ added by the TMA's reduce-add), with
// the headdim split between the two consumer warpgroups instead of the keys, because one warpgroup cannot hold dK and
// dV of 64 keys at d 256. Both own the CTA's 64 keys; per query block:
//   warpgroup 0: S^T = K Q^T -> P^T (registers) -> shared memory          | warpgroup 1: dP^T = V dO^T
//                dV_0 += P^T dO[:, 0:128]   (P^T from registers)        |   waits for P^T; dS^T = P^T (dP^T - D)
//                                                                       |   -> shared memory
//                                                                       |   dK_1 += dS^T Q[:, 128:256] (registers)
//                                                                       |   dV_1 += P^T dO[:, 128:256] (P^T smem)
//                waits for dS^T; dK_0 += dS^T Q[:, 0:128] (dS^T smem)   |
//   both: dQ[:, 128 w:128 w + 128] = dS K[:, 128 w:] (two passes of 64 columns), staged in the stage's Q / dO column blocks this warpgroup's
//   products read (Q[:, 128 w:], dO[:, 128 w:]: every other product that reads them has completed by then) and added
//   to dq_accum by the TMA; the stage goes back to the producer once the reduce-add has read the staging.
// P^T and dS^T have two buffers each (alternating query blocks), so that one warpgroup may write the next while the
// other's products still read the last; the handshakes are two named barriers (P^T ready, dS^T ready), each
// arrived at by its writer and waited on by its reader. Plain path only (no softcap, no bias); rows past seqlen_q are
// masked (P = 0) as in bwd_ws_kernel.cuh (their lse / D are another row's).
// The softmax scale multiplies dK here and dQ in bwd_convert_dq_kernel (dS is w.r.t. s = scale q.k).
#pragma once
#include <cstdint>

#include "fa2/block_info.cuh"
#include "fa2/bwd_kernel.cuh"  // QueryBlockRange, st_shared_pair, unpack2, kLog2e
#include "fa2/bwd_tile_config.h"
#include "fa2/bwd_ws_kernel.cuh"  // pack_k16_fragments
#include "fa2/params.h"
#include "fa2/ptx.cuh"
#include "fa2/sm90/tma.cuh"
#include "fa2/sm90/wgmma.cuh"
#include "fa2/softmax.cuh"  // exp2_ftz

namespace fa2 {
namespace bwd {

// One f16/bf16 pair (columns col, col + 1 of row) from a swizzled shared-memory tile (st_shared_pair's counterpart).
template <typename Tile>
__device__ __forceinline__ uint32_t ld_shared_pair(uint32_t sTile, int row, int col) {
  uint32_t packed;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(packed) : "r"(sTile + (Tile::offset(row, col / 8) + col % 8) * 2));
  return packed;
}

template <typename T, typename Cfg>
__global__ void __launch_bounds__(Cfg::kNThreads, 1)
    bwd_ws_dsplit_kernel(const __grid_constant__ AttentionParams p, const __grid_constant__ sm90::BwdTensorMaps maps) {
  constexpr int kHeadDim = Cfg::kHeadDim, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kBlockCols = Cfg::kBlockCols, kDCols = Cfg::kDCols;
  using QTile = SwizzledTile<kBlockM, kHeadDim, kBlockCols>;   // Q, dO: (queries, d)
  using KTile = SwizzledTile<kBlockN, kHeadDim, kBlockCols>;   // K, V: (keys, d)
  using PTile = SwizzledTile<kBlockN, kBlockM, 64>;            // P^T, dS^T: (keys, queries)
  constexpr int kSNTiles = kBlockM / 8;   // n8 tiles of S^T / dP^T per warp (its 16 keys x kBlockM queries)
  constexpr int kDTiles = kDCols / 8;     // n8 tiles of this warpgroup's dK / dV / dQ columns
  constexpr int kQHalfBytes = Cfg::kSmemQBytes / 2;  // a warpgroup's kDCols columns of a Q / dO tile
  static_assert(kBlockN == 64 && kBlockM % 16 == 0 && Cfg::kConsumerWarpgroups == 2, "one m64 of keys, two halves");
  static_assert(kQHalfBytes == (kDCols / kBlockCols) * kBlockM * kBlockCols * 2, "a half is whole column blocks");

  // smem: [K (kBlockN, d)] [V] [Q0 (kBlockM, d)] [dO0] [Q1] [dO1].. [P^T 0] [P^T 1] [dS^T 0] [dS^T 1]
  //       [lse, D]0 [lse, D]1.. [mbarriers: K/V, full per stage, empty per stage]
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t sK = ptx::smem_u32(smem);
  if (sK % 1024 != 0) __trap();  // the descriptors and the TMA's swizzle assume 1024-byte aligned tiles
  const uint32_t sV = sK + Cfg::kSmemKVBytes;
  auto sQ = [&](int s) { return sV + Cfg::kSmemKVBytes + s * 2 * Cfg::kSmemQBytes; };
  auto sdO = [&](int s) { return sQ(s) + Cfg::kSmemQBytes; };
  auto sP = [&](int b) { return sQ(kStages) + b * Cfg::kSmemPBytes; };
  auto sDs = [&](int b) { return sP(2) + b * Cfg::kSmemPBytes; };
  auto sStats = [&](int s) { return sDs(2) + s * Cfg::kSmemStatsBytes; };
  const uint32_t bar_kv = sStats(kStages);
  auto bar_full = [&](int s) { return bar_kv + 8 + 8 * s; };
  auto bar_empty = [&](int s) { return bar_kv + 8 + 8 * kStages + 8 * s; };
  auto smem_at = [&](uint32_t addr) { return smem + (addr - sK); };

  const int n_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int head_k = head / p.h_h_k_ratio;
  const int n0 = n_block * kBlockN;
  const int num_m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const QueryBlockRange range{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right, kBlockM, kBlockN, num_m_blocks};
  const int m_lo = range.lo(n_block), m_hi = range.hi(n_block);
  const int64_t bh = int64_t(batch) * p.nheads + head;
  const int lane = threadIdx.x & 31;

  // full: the producer's expect_tx arrival; empty: one arrival per consumer warp
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(bar_kv, 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      sm90::mbarrier_init(bar_full(s), 1);
      sm90::mbarrier_init(bar_empty(s), 4 * Cfg::kConsumerWarpgroups);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();  // the CTA's only barrier (the producer warpgroup leaves below)

  constexpr int kStatsBytes = 2 * kBlockM * 4;
  if (threadIdx.x < kWsProducerThreads) {
    // -- the producer warpgroup: one thread streams the query blocks; the others have nothing to do
    sm90::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x != 0 || m_lo > m_hi) return;
    sm90::mbarrier_arrive_expect_tx(bar_kv, 2 * Cfg::kSmemKVBytes);
    sm90::tma_load_tile<kBlockN, kHeadDim, kBlockCols>(sK, &maps.k, bar_kv, n0, head_k, batch);
    sm90::tma_load_tile<kBlockN, kHeadDim, kBlockCols>(sV, &maps.v, bar_kv, n0, head_k, batch);
    for (int m = m_lo, it = 0; m <= m_hi; ++m, ++it) {
      const int s = it % kStages, m0 = m * kBlockM;
      // the stage's previous query block (it - kStages) must have been released by every consumer warp (after the
      // reduce-add of its dQ read the staging inside it)
      if (it >= kStages) sm90::mbarrier_wait(bar_empty(s), ((it / kStages) - 1) & 1);
      sm90::mbarrier_arrive_expect_tx(bar_full(s), 2 * Cfg::kSmemQBytes + kStatsBytes);
      sm90::tma_load_tile<kBlockM, kHeadDim, kBlockCols>(sQ(s), &maps.q, bar_full(s), m0, head, batch);
      sm90::tma_load_tile<kBlockM, kHeadDim, kBlockCols>(sdO(s), &maps.dout, bar_full(s), m0, head, batch);
      const int row = int(bh * p.seqlen_q + m0);  // (the launcher checks that batch * nheads * seqlen_q fits an int)
      sm90::tma_load_1d(sStats(s), &maps.lse, bar_full(s), row);
      sm90::tma_load_1d(sStats(s) + kBlockM * 4, &maps.dsum, bar_full(s), row);
    }
    return;
  }

  // -- the consumer warpgroups
  sm90::setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int ctid = int(threadIdx.x) - kWsProducerThreads;
  const int wg = ctid >> 7, warp_in_wg = (ctid >> 5) & 3, group = lane >> 2, tig = lane & 3;
  const int key0 = warp_in_wg * 16 + group;  // this thread's first fragment row (key in the block), both warpgroups
  const int col0 = wg * kDCols;              // this warpgroup's dK / dV / dQ columns
  const BlockInfo info{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};
  // the dQ reduce-adds of this warpgroup: issued (and their shared memory's reads waited for) by its first thread,
  // whose warp releases the stage only after that wait
  const bool dq_issuer = (ctid & 127) == 0;

  float acc_dk[kDCols / 2], acc_dv[kDCols / 2];  // (this warp's 16 keys, the warpgroup's kDCols columns)
  ptx::zero(reinterpret_cast<float(&)[1][kDTiles][4]>(acc_dk));
  ptx::zero(reinterpret_cast<float(&)[1][kDTiles][4]>(acc_dv));

  if (m_lo <= m_hi) sm90::mbarrier_wait_untimed(bar_kv, 0);
  int stage_to_release = -1;  // the issuer warp's stage of the previous query block, released once its dQ was read
  for (int m = m_lo, it = 0; m <= m_hi; ++m, ++it) {
    const int s = it % kStages, b = it & 1, m0 = m * kBlockM;
    sm90::mbarrier_wait_untimed(bar_full(s), (it / kStages) & 1);
    // [lse (kBlockM)] [D (kBlockM)]
    const float* stats = reinterpret_cast<const float*>(smem_at(sStats(s)));
    // the stage's dQ staging of this warpgroup: boxes of 32 columns (kBlockM rows x 128 bytes), 0 and 1 in its Q
    // column blocks, 2 and 3 in its dO column blocks
    auto dq_box = [&](int box) {
      return (box < 2 ? sQ(s) : sdO(s)) + wg * kQHalfBytes + (box % 2) * (kBlockM * 128);
    };
    static_assert(kDCols == 128, "four 32-column boxes per warpgroup");

    float acc_sdp[kBlockM / 2];  // S^T (warpgroup 0) or dP^T (warpgroup 1)
    auto& sdp_frag = reinterpret_cast<float(&)[kSNTiles][4]>(acc_sdp);
    uint32_t a_frag[kBlockM / 16][4];  // P^T (warpgroup 0) or dS^T (warpgroup 1): register-A of dV_0 / dK_1
    if (wg == 0) {
      // -- S^T = K Q^T
      sm90::gemm_ss<T, kBlockM, kHeadDim / 16, false, false, KTile, QTile, /*kWait=*/false, /*kOverwrite=*/true>(
          acc_sdp, sK, 0, sQ(s), 0);
      if (dq_issuer && stage_to_release >= 0) sm90::bulk_wait_group<0, /*kRead=*/true>();
      if (stage_to_release >= 0 && warp_in_wg == 0) {
        __syncwarp();
        if (lane == 0) sm90::mbarrier_arrive(bar_empty(stage_to_release));
      }
      sm90::wait_hold<0>(acc_sdp);
      // -- P^T = exp2(q.k scale log2e - lse log2e), rounded to T; masked (P = 0) on boundary blocks. Element
      //    (j, 2 half + e): key key0 + 8 half, query m0 + 8 j + 2 tig + e.
      auto to_p = [&](auto masked) {
#pragma unroll
        for (int j = 0; j < kSNTiles; ++j) {
          const float2 l = *reinterpret_cast<const float2*>(stats + 8 * j + 2 * tig);
          const float lse2[2] = {l.x * kLog2e, l.y * kLog2e};
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            int key_lo = 0, key_hi = 0;
            if constexpr (decltype(masked)::value) {
              const int query = m0 + 8 * j + 2 * tig + e;
              info.key_range(query, key_lo, key_hi);
              if (query >= p.seqlen_q) key_hi = -1;  // (its lse and D are another row's: P = 0)
            }
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              float prob = exp2_ftz(fmaf(sdp_frag[j][half * 2 + e], p.scale_log2, -lse2[e]));
              if constexpr (decltype(masked)::value) {
                const int key = n0 + key0 + 8 * half;
                if (key < key_lo || key > key_hi) prob = 0.f;
              }
              sdp_frag[j][half * 2 + e] = prob;
            }
          }
        }
      };
      if (info.needs_mask(n_block, kBlockN, m0, kBlockM) || m0 + kBlockM > p.seqlen_q) {
        to_p(std::true_type{});
      } else {
        to_p(std::false_type{});
      }
      pack_k16_fragments<T>(sdp_frag, a_frag);
      // -- P^T to shared memory for warpgroup 1 (its dS^T and dV_1), then dV_0 += P^T dO[:, 0:kDCols]
#pragma unroll
      for (int j = 0; j < kSNTiles; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          st_shared_pair<PTile>(sP(b), key0 + 8 * half, 8 * j + 2 * tig, a_frag[j / 2][(j % 2) * 2 + half]);
        }
      }
      sm90::fence_proxy_async();  // P^T, stored by threads, then read by warpgroup 1's wgmma
      ptx::named_barrier_arrive<1, 256>();
      sm90::gemm_rs<T, kDCols, kBlockM / 16, QTile, /*kWait=*/false>(acc_dv, a_frag, sdO(s));
      // -- dK_0 += dS^T Q[:, 0:kDCols], dS^T from warpgroup 1
      ptx::named_barrier_sync<2, 256>();
      sm90::gemm_ss<T, kDCols, kBlockM / 16, /*kAMnMajor=*/false, /*kBMnMajor=*/true, PTile, QTile, /*kWait=*/false>(
          acc_dk, sDs(b), 0, sQ(s), 0);
    } else {
      // -- dP^T = V dO^T
      sm90::gemm_ss<T, kBlockM, kHeadDim / 16, false, false, KTile, QTile, /*kWait=*/false, /*kOverwrite=*/true>(
          acc_sdp, sV, 0, sdO(s), 0);
      if (dq_issuer && stage_to_release >= 0) sm90::bulk_wait_group<0, /*kRead=*/true>();
      if (stage_to_release >= 0 && warp_in_wg == 0) {
        __syncwarp();
        if (lane == 0) sm90::mbarrier_arrive(bar_empty(stage_to_release));
      }
      sm90::wait_hold<0>(acc_sdp);
      // -- dS^T = P^T (dP^T - D), P^T (as rounded for dV_0) from warpgroup 0
      ptx::named_barrier_sync<1, 256>();
#pragma unroll
      for (int j = 0; j < kSNTiles; ++j) {
        const float2 dsum = *reinterpret_cast<const float2*>(stats + kBlockM + 8 * j + 2 * tig);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float2 prob = unpack2<T>(ld_shared_pair<PTile>(sP(b), key0 + 8 * half, 8 * j + 2 * tig));
          sdp_frag[j][half * 2] = prob.x * (sdp_frag[j][half * 2] - dsum.x);
          sdp_frag[j][half * 2 + 1] = prob.y * (sdp_frag[j][half * 2 + 1] - dsum.y);
        }
      }
      pack_k16_fragments<T>(sdp_frag, a_frag);
      // -- dS^T to shared memory for warpgroup 0 (its dK_0) and both dQ products
#pragma unroll
      for (int j = 0; j < kSNTiles; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          st_shared_pair<PTile>(sDs(b), key0 + 8 * half, 8 * j + 2 * tig, a_frag[j / 2][(j % 2) * 2 + half]);
        }
      }
      sm90::fence_proxy_async();  // dS^T, stored by threads, then read by wgmma
      ptx::named_barrier_arrive<2, 256>();
      // -- dK_1 += dS^T Q[:, kDCols:], dV_1 += P^T dO[:, kDCols:] (P^T from shared memory)
      sm90::gemm_rs<T, kDCols, kBlockM / 16, QTile, /*kWait=*/false>(acc_dk, a_frag, sQ(s) + kQHalfBytes);
      sm90::gemm_ss<T, kDCols, kBlockM / 16, /*kAMnMajor=*/false, /*kBMnMajor=*/true, PTile, QTile, /*kWait=*/false>(
          acc_dv, sP(b), 0, sdO(s), kDCols);
    }
    // -- dQ[:, col0:col0 + kDCols] = dS K[:, col0:], dS^T (keys, queries) as the MN-major A (queries = M), in two
    //    passes of kDCols / 2 columns (all kDCols beside dK, dV and the A fragment made ptxas serialize the wgmmas),
    //    each into the staging (128-byte swizzle: row r's 16-byte chunk c at c ^ r % 8; boxes 2 pass, 2 pass + 1).
    //    Every product that reads this warpgroup's Q / dO columns has completed by then (its own at the first wait;
    //    the other warpgroup's S^T or dP^T, which read all columns, before the handshake above). Fragment element
    //    (nt, 2 half + e): row 16 warp + group + 8 half, column 8 nt + 2 tig + e of the pass.
    constexpr int kDqPassCols = kDCols / 2, kDqPassTiles = kDqPassCols / 8;
    float acc_dq[kDqPassCols / 2];  // (this warp's 16 queries, one pass's columns)
    auto& dq_frag = reinterpret_cast<float(&)[kDqPassTiles][4]>(acc_dq);
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      sm90::gemm_ss<T, kDqPassCols, kBlockN / 16, /*kAMnMajor=*/true, /*kBMnMajor=*/true, PTile, KTile,
                    /*kWait=*/false, /*kOverwrite=*/true>(acc_dq, sDs(b), 0, sK, col0 + pass * kDqPassCols);
      if (pass == 0) {
        sm90::wait_hold<0>(acc_dv, acc_dk, acc_dq);
        sm90::hold_fragments(a_frag);
      } else {
        sm90::wait_hold<0>(acc_dq);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = warp_in_wg * 16 + group + 8 * half;
#pragma unroll
        for (int nt = 0; nt < kDqPassTiles; ++nt) {
          const int box = 2 * pass + nt / 4, chunk = 2 * (nt % 4) + tig / 2;
          const uint32_t addr = dq_box(box) + r * 128 + ((chunk ^ (r % 8)) << 4) + (tig % 2) * 8;
          asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(dq_frag[nt][half * 2]),
                       "f"(dq_frag[nt][half * 2 + 1]) : "memory");
        }
      }
    }
    sm90::fence_proxy_async();  // the staging, stored by threads, then read by the TMA
    if (wg == 0) {
      ptx::named_barrier_sync<3, 128>();
    } else {
      ptx::named_barrier_sync<4, 128>();
    }
    if (dq_issuer) {
      const int row = int(bh * p.seqlen_q + m0);
#pragma unroll
      for (int box = 0; box < kDCols / 32; ++box) {
        sm90::tma_reduce_add_2d(&maps.dq_accum, dq_box(box), col0 + 32 * box, row);
      }
      sm90::bulk_commit_group();
    }
    // -- release the stage: warps other than the issuer's now (their stores are in the staging, their products have
    //    completed), the issuer's once the reduce-add has read the staging (at the next query block's first product,
    //    or below)
    if (warp_in_wg != 0) {
      __syncwarp();
      if (lane == 0) sm90::mbarrier_arrive(bar_empty(s));
    }
    stage_to_release = s;
  }
  if (dq_issuer) sm90::bulk_wait_group<0, /*kRead=*/false>();  // (the staging must outlive the reads)

  // -- epilogue: dK = scale dS^T Q, dV; keys past seqlen_k and dims past headdim are not stored. A key block no query
  //    sees stores zeros.
  auto& dk_frag = reinterpret_cast<float(&)[kDTiles][4]>(acc_dk);
  auto& dv_frag = reinterpret_cast<float(&)[kDTiles][4]>(acc_dv);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = n0 + key0 + 8 * half;
    if (key >= p.seqlen_k) continue;
#pragma unroll
    for (int nt = 0; nt < kDTiles; ++nt) {
      const int col = col0 + 8 * nt + 2 * tig;
      if (col >= p.headdim) continue;
      const float dk0 = dk_frag[nt][half * 2] * p.scale, dk1 = dk_frag[nt][half * 2 + 1] * p.scale;
      const float dv0 = dv_frag[nt][half * 2], dv1 = dv_frag[nt][half * 2 + 1];
      if (p.h_h_k_ratio > 1) {  // fp32 partials per query head, summed over the group by the caller
        float* dk = static_cast<float*>(p.dk) + batch * p.dk_batch_stride + head * p.dk_head_stride +
                    int64_t(key) * p.dk_row_stride + col;
        float* dv = static_cast<float*>(p.dv) + batch * p.dv_batch_stride + head * p.dv_head_stride +
                    int64_t(key) * p.dv_row_stride + col;
        *reinterpret_cast<float2*>(dk) = make_float2(dk0, dk1);
        *reinterpret_cast<float2*>(dv) = make_float2(dv0, dv1);
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

}  // namespace bwd
}  // namespace fa2
