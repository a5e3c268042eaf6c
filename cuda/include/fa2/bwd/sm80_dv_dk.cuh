// bwd_kernel's dV += P^T dO and dK += dS^T Q: (kBlockN, d) over the warps, P and dS from shared memory (the block's
// (kBlockM, kBlockN) tiles, transposed), dO and Q from the stage. mma.sync: complete on return; wgmma with
// std::false_type: issued (dV, then dK: two committed groups), completed by sm90::wait_hold.
#pragma once
#include <cstdint>

#include "fa2/bwd/product.cuh"
#include "fa2/bwd/shared_storage.cuh"

namespace fa2 {
namespace bwd {

template <typename T, typename Cfg>
struct Sm80DvDk {
  static constexpr int kKVM = Cfg::kdKVMTiles, kKVN = Cfg::kdKVNTiles;
  using QTile = SwizzledTile<Cfg::kBlockM, Cfg::kHeadDim, Cfg::kSmemBlockColsD>;  // Q, dO: (kBlockM, d)
  using PTile = SwizzledTile<Cfg::kBlockM, Cfg::kBlockN, Cfg::kSmemBlockColsN>;   // P, dS: (kBlockM, kBlockN)
  using Acc = float[kKVM][kKVN][4];  // dV or dK: this warp's keys kv_n0.., dims kv_d0..
  static_assert(Cfg::kBlockM % 16 == 0, "k16 steps over the block's queries");
  // (references to the kernel's values, as a lambda's captures)
  Acc& acc_dv;
  Acc& acc_dk;
  const uint32_t &sP, &sdS;
  const SharedStorageView<Cfg>& shared;
  const int &buf, &kv_n0, &kv_d0, &lane;

  template <class Wait>
  __device__ __forceinline__ void operator()(Wait) const {
    product<T, Cfg::kWgmma, kKVM, kKVN, Cfg::kBlockM / 16, true, true, PTile, QTile, false, Wait::value>(
        acc_dv, sP, kv_n0, shared.dout(buf), kv_d0, lane);
    product<T, Cfg::kWgmma, kKVM, kKVN, Cfg::kBlockM / 16, true, true, PTile, QTile, false, Wait::value>(
        acc_dk, sdS, kv_n0, shared.q(buf), kv_d0, lane);
  }
};

}  // namespace bwd
}  // namespace fa2
