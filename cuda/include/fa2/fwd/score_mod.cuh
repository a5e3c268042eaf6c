// How the forward turns q.k into exp2 arguments: the score modes and the general path's score modification.
#pragma once
#include "fa2/fwd/score_bias.cuh"
#include "fa2/params.h"

namespace fa2 {
namespace fwd {

constexpr float kLog2e = 1.4426950408889634f;

// How scores become exp2 arguments (chosen per call by the launcher):
//   kPlain     scale > 0, no softcap, no bias: S stays raw q.k, scale*log2(e) folded into the exp2's one FMA.
//   kBiasFold  scale > 0, no softcap, a bias: S starts from bias / scale (loaded while the tile's barrier waits)
//              and Q K^T accumulates on top; from there exactly the plain path (one FMA before exp2).
//   kKeyBiasFold  the same for a bias with row stride 0 (one value per key: padding masks), in fewer registers.
//   kGeneral   softcap > 0 or scale <= 0: S = scale q.k, soft-capped, + bias in fp32, in log2(e) units.
enum class ScoreMode : int { kPlain = 0, kBiasFold = 1, kGeneral = 2, kKeyBiasFold = 3 };

// s = scale * q.k (or softcap * tanh(scale * q.k / softcap)), then + bias: everything before the mask.
template <typename T, BiasType kBias, int kMTiles, int kNTiles>
__device__ __forceinline__ void score_mod(float (&s)[kMTiles][kNTiles][4], const AttentionParams& p,
                                          const void* bias_bh, int row0, int col0) {
  if (p.softcap > 0.f) {
    const float scale_over_cap = p.scale / p.softcap;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) s[mt][nt][r] = p.softcap * tanhf(s[mt][nt][r] * scale_over_cap);
  } else {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) s[mt][nt][r] *= p.scale;
  }
  if constexpr (kBias != BiasType::kNone) {
    using B = typename BiasElement<T, kBias>::type;
    add_bias(s, static_cast<const B*>(bias_bh), p.bias_row_stride, p.bias_col_stride, row0, col0, p.seqlen_q,
             p.seqlen_k);
  }
}

}  // namespace fwd
}  // namespace fa2
