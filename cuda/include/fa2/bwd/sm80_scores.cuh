// bwd_kernel's first half of a query block: S = Q K^T and dP = dO V^T over the warps' (kBlockM, kBlockN) tiles, then
// P (to shared memory, rounded to T) and dS = P (dP - D) (to shared memory) for dV, dK and dQ:
//   - plain path: P = exp2(q.k scale log2e - lse log2e) (wgmma: dP issued right behind S, running while P is
//     computed); with a key-row bias (kKeyBias) against bwd_row_stats_kernel's (shift, lse);
//   - score-mod path: S and dP first, then the forward's score (scale, softcap, bias), P, dS and dbias together.
#pragma once
#include <cstdint>
#include <type_traits>

#include "fa2/block_info.cuh"
#include "fa2/dropout.cuh"
#include "fa2/bwd/fragments.cuh"
#include "fa2/bwd/product.cuh"
#include "fa2/bwd/scores.cuh"
#include "fa2/bwd/shared_storage.cuh"
#include "fa2/params.h"
#include "fa2/sm90/wgmma.cuh"

namespace fa2 {
namespace bwd {

// Sm80Scores' dropout state for (batch, head): with the mma.sync tiles its DropoutHead; with the wgmma tiles the
// coordinates it is read again from per query block (L1 hits: kept over the query blocks, its registers cost spills).
struct DropoutCoords {
  int batch, head;
};
template <bool kDropout, bool kWgmma>
__device__ __forceinline__ std::conditional_t<kWgmma, DropoutCoords, DropoutHead> dropout_of(
    const AttentionParams& p, int batch, int head) {
  if constexpr (kWgmma) {
    return DropoutCoords{batch, head};
  } else {
    return dropout_head<kDropout>(p, batch, head);
  }
}

// kDropout: the forward's dropout mask Z replayed (fa2/dropout.cuh): P ∘ Z / (1 - p) to shared memory for dV, and
// dS = P (dP ∘ Z / (1 - p) - D) (the gradient reaching the undropped P), on the plain and the score-mod paths. With
// the wgmma tiles a warp's part of the m64 accumulator maps elements to threads as mma.sync's C fragments do (rows
// group, group + 8 of its 16 at sdp_m0, keys 2 tig, 2 tig + 1 of each n8 tile from sdp_n0), so the same groups.
template <typename T, typename Cfg, bool kScoreMod, bool kKeyBias, bool kDropout = false>
struct Sm80Scores {
  static constexpr int kHeadDim = Cfg::kHeadDim, kSdPM = Cfg::kSdPMTiles, kSdPN = Cfg::kSdPNTiles;
  static constexpr bool kWgmma = Cfg::kWgmma;
  using QTile = SwizzledTile<Cfg::kBlockM, kHeadDim, Cfg::kSmemBlockColsD>;      // Q, dO: (kBlockM, d)
  using KTile = SwizzledTile<Cfg::kBlockN, kHeadDim, Cfg::kSmemBlockColsD>;      // K, V: (kBlockN, d)
  using PTile = SwizzledTile<Cfg::kBlockM, Cfg::kBlockN, Cfg::kSmemBlockColsN>;  // P, dS: (kBlockM, kBlockN)
  using kWaitSync = std::bool_constant<!kWgmma>;  // issued without waiting where that is possible (wgmma)
  using Acc = float[kSdPM][kSdPN][4];             // S or dP: this warp's (kSdPM m16, kSdPN n8) tiles
  static_assert(!(kScoreMod && kKeyBias), "the key-row bias variant is one of the plain path");
  static_assert(!(kDropout && kKeyBias), "dropout: the plain and score-mod paths");
  using Keep = FragmentKeep<kSdPM, kSdPN>;

  const AttentionParams& p;
  const SharedStorageView<Cfg>& shared;
  const BlockInfo& info;
  const void* bias_bh;  // the score-mod path's bias of this (batch, head)
  float* dbias;         // the score-mod path's dbias of this (batch, head), or null
  int sdp_m0, sdp_n0;   // this warp's S / dP tile: rows sdp_m0.., keys sdp_n0..
  int lane, group, tig;
  // kDropout: this (batch, head)'s (dropout_of; else unused)
  std::conditional_t<kWgmma, DropoutCoords, DropoutHead> dropout;

  // kDropout: this thread's keep bits of the (query block m0, key block n0) tile (row0 - group, col0 - 2 tig: the warp
  // tile's first query and key)
  __device__ __forceinline__ Keep keep_bits(int row0, int col0) const {
    if constexpr (kWgmma) {
      return Keep(DropoutHead(p, dropout.batch, dropout.head), row0 - group, col0 - tig * 2, group, tig);
    } else {
      return Keep(dropout, row0 - group, col0 - tig * 2, group, tig);
    }
  }
  __device__ __forceinline__ float keep_scale() const {
    if constexpr (kWgmma) {
      return p.dropout_keep_scale;
    } else {
      return dropout.keep_scale;
    }
  }

  // S = Q K^T or dP = dO V^T (acc overwritten): (kBlockM, kBlockN) over the warps. wait: complete on return (always
  // with mma.sync), or, wgmma with std::false_type, only issued (completed by sm90::wait_hold).
  template <class Wait>
  __device__ __forceinline__ void product_sdp(Acc& acc, uint32_t sA, uint32_t sB, Wait) const {
    product<T, kWgmma, kSdPM, kSdPN, kHeadDim / 16, false, false, QTile, KTile, true, Wait::value>(acc, sA, sdp_m0, sB,
                                                                                                  sdp_n0, lane);
  }

  // This thread's S rows' statistics from stage buf (copied with Q and dO): lse log2e (+inf: P = 0) and D; returns
  // where its first row's shift is (the score-mod path reads the shifts from shared memory where used: registers are
  // scarce there).
  __device__ __forceinline__ const float* row_stats(int buf, float (&lse2)[2 * kSdPM], float (&dsum)[2 * kSdPM]) const {
    const float* stats = shared.template at<const float>(shared.stats(buf));  // [lse] [D] [shift]
#pragma unroll
    for (int r = 0; r < 2 * kSdPM; ++r) {
      const int row = sdp_m0 + group + (r >> 1) * 16 + (r & 1) * 8;
      lse2[r] = stats[row] * kLog2e;
      dsum[r] = stats[Cfg::kBlockM + row];
    }
    return stats + 2 * Cfg::kBlockM + sdp_m0 + group;
  }

  // The plain path's block (mask: bool decided inside, or std::true_type / std::false_type: the block compiled per
  // case). lse2, dsum: this thread's rows' lse log2e and D; shift: its first row's shift (kKeyBias); row0, col0: its
  // first fragment row (global query) and column (global key).
  template <class Mask>
  __device__ __forceinline__ void plain(Acc& acc_s, Acc& acc_dp, int buf, const float (&lse2)[2 * kSdPM],
                                        const float (&dsum)[2 * kSdPM], const float* shift, int row0, int col0,
                                        Mask mask) const {
    const float* key_bias = shared.template at<const float>(shared.key_bias()) + sdp_n0 + tig * 2;
    // (dropout's keep bits: mma.sync first, while few registers are live: drawn after S, ptxas spilled 464 B, not 368,
    // at d 64; wgmma once P is packed, S's registers free, while dP runs on the tensor cores)
    [[maybe_unused]] Keep keep;
    if constexpr (kDropout && !kWgmma) keep = keep_bits(row0, col0);
    // -- S = Q K^T;  P = exp2(q.k scale log2e - lse log2e), masked on boundary blocks, rounded to T
    //    (wgmma: dP = dO V^T is issued right behind S and runs on the tensor cores while P is computed)
    product_sdp(acc_s, shared.q(buf), shared.k(), kWaitSync{});
    if constexpr (kWgmma) {
      product_sdp(acc_dp, shared.dout(buf), shared.v(), std::false_type{});
      sm90::wait_hold<1>(acc_s);  // one group per product, completing in issue order: <1> leaves dP running
    }
    uint32_t p_packed[kSdPM][kSdPN][2];
    auto to_p = [&](auto masked) {
      if constexpr (kKeyBias) {
        key_bias_scores_to_p_packed<T, decltype(masked)::value>(acc_s, p_packed, lse2, shift, key_bias, p.scale, info,
                                                                p.seqlen_q, row0, col0);
      } else {
        scores_to_p_packed<T, decltype(masked)::value>(acc_s, p_packed, lse2, p.scale_log2, info, row0, col0);
      }
    };
    if constexpr (std::is_same_v<Mask, bool>) {  // the mask decided inside the block
      if (mask) {
        to_p(std::true_type{});
      } else {
        to_p(std::false_type{});
      }
    } else {
      to_p(mask);
    }
    if constexpr (kDropout) {
      // -- P ∘ Z / (1 - p) for dV; dP = dO V^T, then dP ∘ Z / (1 - p);  dS = P (dP - D)
      if constexpr (kWgmma) keep = keep_bits(row0, col0);
      store_dropped_p(p_packed, keep);
      if constexpr (kWgmma) {
        sm90::wait_hold<0>(acc_dp);
      } else {
        product_sdp(acc_dp, shared.dout(buf), shared.v(), std::true_type{});
      }
      keep.apply(acc_dp, keep_scale());
      dp_to_ds<T>(acc_dp, p_packed, dsum);
      store_fragments<T, PTile>(shared.ds(), acc_dp, sdp_m0 + group, sdp_n0 + tig * 2);
      return;
    }
    store_packed<PTile>(shared.p(), p_packed, sdp_m0 + group, sdp_n0 + tig * 2);
    // -- dP = dO V^T;  dS = P (dP - D)
    if constexpr (kWgmma) {
      sm90::wait_hold<0>(acc_dp);
    } else {
      product_sdp(acc_dp, shared.dout(buf), shared.v(), std::true_type{});
    }
    dp_to_ds<T>(acc_dp, p_packed, dsum);
    store_fragments<T, PTile>(shared.ds(), acc_dp, sdp_m0 + group, sdp_n0 + tig * 2);
  }

  // The score-mod path's block: S = Q K^T, dP = dO V^T (wgmma: both in flight together); then the forward's score
  // (scale, softcap, bias), P, dS and dbias together (the bias dtype a run-time switch, uniform over the CTA).
  __device__ __forceinline__ void score_mod(Acc& acc_s, Acc& acc_dp, int buf, const float (&lse2)[2 * kSdPM],
                                            const float (&dsum)[2 * kSdPM], const float* shift, int row0, int col0,
                                            bool needs_mask) const {
    [[maybe_unused]] Keep keep;
    if constexpr (kDropout) keep = keep_bits(row0, col0);  // (first: see plain)
    product_sdp(acc_s, shared.q(buf), shared.k(), kWaitSync{});
    product_sdp(acc_dp, shared.dout(buf), shared.v(), kWaitSync{});
    if constexpr (kWgmma) sm90::wait_hold<0>(acc_s, acc_dp);
    // -- dropout: dP ∘ Z / (1 - p) before dS = P (dP - D); P ∘ Z / (1 - p) after it (for dV)
    if constexpr (kDropout) keep.apply(acc_dp, keep_scale());
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
    if constexpr (kDropout) keep.apply(acc_s, keep_scale());
    store_fragments<T, PTile>(shared.p(), acc_s, sdp_m0 + group, sdp_n0 + tig * 2);
    store_fragments<T, PTile>(shared.ds(), acc_dp, sdp_m0 + group, sdp_n0 + tig * 2);
  }

 private:
  // The plain path's P (rounded pairs) as P ∘ Z / (1 - p) into P's shared-memory tile; p_packed itself stays P.
  __device__ __forceinline__ void store_dropped_p(const uint32_t (&p_packed)[kSdPM][kSdPN][2], const Keep& keep) const {
#pragma unroll
    for (int mt = 0; mt < kSdPM; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int nt = 0; nt < kSdPN; ++nt) {
          const float2 prob = unpack2<T>(p_packed[mt][nt][half]);
          const float scale = keep_scale();
          const uint32_t dropped = ptx::pack2<T>(keep.keep(mt, nt, 2 * half) ? prob.x * scale : 0.f,
                                                 keep.keep(mt, nt, 2 * half + 1) ? prob.y * scale : 0.f);
          st_shared_pair<PTile>(shared.p(), sdp_m0 + group + mt * 16 + half * 8, sdp_n0 + tig * 2 + nt * 8, dropped);
        }
  }
};

}  // namespace bwd
}  // namespace fa2
