// The forward's two products per key tile, S = Q K^T and O += P V: mma.sync m16n8k16 from ldmatrix fragments
// (sm80 instruction path) and wgmma (sm_90a), with the same per-warp accumulator layout.
#pragma once
#include <cstdint>

#include "fa2/ptx.cuh"
#include "fa2/sm90/wgmma.cuh"  // only instantiated by sm_90a instances

namespace fa2 {
namespace fwd {

// acc_s (kMTiles, kNTiles) += Q (this warp's rows) K^T; both operands by ldmatrix from swizzled smem.
// q_lane / k_lane: this lane's ldmatrix bases (SwizzledTile::lane_bytes), see fwd_kernel.
template <typename T, typename QTile, typename KTile, int kMTiles, int kNTiles, int kHeadDim>
__device__ __forceinline__ void gemm_qk(float (&acc_s)[kMTiles][kNTiles][4], uint32_t q_lane, uint32_t k_lane) {
  static_assert(kNTiles % 2 == 0, "K fragments are loaded for pairs of n8 tiles");
#pragma unroll
  for (int kt = 0; kt < kHeadDim / 16; ++kt) {
    uint32_t a[kMTiles][4];  // Q (16 rows, 16 dims) per m tile
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) ptx::ldmatrix_x4(a[mt], QTile::fragment_address(q_lane, mt * 16, kt * 2));
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t b[4];  // K rows 16 np.. +15, dims 16 kt.. +15: {b0, b1} of n tile 2np, then of 2np+1
      ptx::ldmatrix_x4(b, KTile::fragment_address(k_lane, np * 16, kt * 2));
      const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ptx::mma_m16n8k16<T>(acc_s[mt][2 * np], a[mt], b_lo);
        ptx::mma_m16n8k16<T>(acc_s[mt][2 * np + 1], a[mt], b_hi);
      }
    }
  }
}


// acc_o (kMTiles, kDTiles) += P V, P (= acc_s after the softmax, fp32) packed to T in registers as the A operand
// (ptx::pack_k16), V by ldmatrix.trans.
template <typename T, typename VTile, int kMTiles, int kNTiles, int kDTiles>
__device__ __forceinline__ void gemm_pv(float (&acc_o)[kMTiles][kDTiles][4], const float (&p)[kMTiles][kNTiles][4],
                                        uint32_t v_lane) {
  static_assert(kDTiles % 2 == 0, "V fragments are loaded for pairs of n8 tiles");
#pragma unroll
  for (int kt = 0; kt < kNTiles / 2; ++kt) {
    uint32_t a[kMTiles][4];  // P (16 rows, keys 16 kt.. +15)
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) ptx::pack_k16<T>(p[mt], kt, a[mt]);
#pragma unroll
    for (int dp = 0; dp < kDTiles / 2; ++dp) {
      uint32_t b[4];  // V keys 16 kt.. +15, dims 16 dp.. +15, transposed: {b0, b1} of d tile 2dp, then 2dp+1
      ptx::ldmatrix_x4_trans(b, VTile::fragment_address(v_lane, kt * 16, dp * 2));
      const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ptx::mma_m16n8k16<T>(acc_o[mt][2 * dp], a[mt], b_lo);
        ptx::mma_m16n8k16<T>(acc_o[mt][2 * dp + 1], a[mt], b_hi);
      }
    }
  }
}

// ---- the same two products with wgmma (sm_90a) --------------------------------------------------------------
// A warpgroup (4 warps) multiplies its 64 query rows at once; its m64nN accumulators are, per warp, exactly the
// (16 rows) x (N / 8 n8 tiles) x 4 fragments of the mma.sync path, so everything between the products is shared.
// Each product waits for its own completion (no overlap with the softmax yet: the next steps of the Hopper path).

// acc_s (this warp's 16 rows, kNTiles n8 tiles) += Q (the warpgroup's 64 rows from wg_row0) K^T, both K-major in
// shared memory (SwizzledTile layouts, see sm90/wgmma.cuh).
// kWait = false: only issued (and committed); sm90::wait_hold completes it.
template <typename T, typename QTile, typename KTile, int kNTiles, int kHeadDim, bool kWait = true>
__device__ __forceinline__ void gemm_qk_wgmma(float (&acc_s)[1][kNTiles][4], uint32_t s_q, int wg_row0, uint32_t s_k) {
  using QDesc = sm90::TileDescriptors<QTile>;
  using KDesc = sm90::TileDescriptors<KTile>;
  float(&d)[kNTiles * 4] = reinterpret_cast<float(&)[kNTiles * 4]>(acc_s);
  sm90::hold_registers(d);  // see sm90::hold_registers
  sm90::fence();
#pragma unroll
  for (int k16 = 0; k16 < kHeadDim / 16; ++k16) {
    sm90::Wgmma<T, kNTiles * 8>::template ss<0>(d, QDesc::k_major(s_q, wg_row0, k16), KDesc::k_major(s_k, 0, k16), 1);
  }
  sm90::commit_group();
  if constexpr (kWait) {
    sm90::wait_group<0>();
    sm90::hold_registers(d);
  }
}

// The same with Q from registers (q[k16]: the warp's A fragment of dims 16 k16 .. 16 k16 + 15, by ldmatrix once per
// query block): only K is read from shared memory (K-major). Issued only; q is never written.
template <typename T, typename KTile, int kNTiles, int kHeadDim>
__device__ __forceinline__ void gemm_qk_wgmma_rs(float (&acc_s)[1][kNTiles][4], uint32_t (&q)[kHeadDim / 16][4],
                                                 uint32_t s_k) {
  sm90::gemm_rs<T, kNTiles * 8, kHeadDim / 16, KTile, /*kWait=*/false, /*kBMnMajor=*/false>(
      reinterpret_cast<float(&)[kNTiles * 4]>(acc_s), q, s_k);
}

// acc_o (this warp's 16 rows, kDTiles n8 tiles) += P V: P from registers (ptx::pack_k16), V (keys x d) as
// an N-major B operand from shared memory.
// The same from P already packed (a[kt]: keys 16 kt .. 16 kt + 15). kWait = false: only issued; the caller waits
// (wait_group) and then pins acc_o and a (hold_registers / hold_fragments) before touching either.
template <typename T, typename VTile, int kNTiles, int kDTiles, bool kWait = true>
__device__ __forceinline__ void gemm_pv_wgmma_packed(float (&acc_o)[1][kDTiles][4], uint32_t (&a)[kNTiles / 2][4],
                                                     uint32_t s_v) {
  sm90::gemm_rs<T, kDTiles * 8, kNTiles / 2, VTile, kWait>(reinterpret_cast<float(&)[kDTiles * 4]>(acc_o), a, s_v);
}
template <typename T, typename VTile, int kNTiles, int kDTiles>
__device__ __forceinline__ void gemm_pv_wgmma(float (&acc_o)[1][kDTiles][4], const float (&p)[1][kNTiles][4],
                                              uint32_t s_v) {
  uint32_t a[kNTiles / 2][4];
#pragma unroll
  for (int kt = 0; kt < kNTiles / 2; ++kt) ptx::pack_k16<T>(p[0], kt, a[kt]);
  gemm_pv_wgmma_packed<T, VTile, kNTiles, kDTiles>(acc_o, a, s_v);
}

}  // namespace fwd
}  // namespace fa2
