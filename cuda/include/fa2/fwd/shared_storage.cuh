// The forward's shared memory as a struct (FA-3's SharedStorage): Q's tile, the K/V ring's stages, sm_90a's staged
// bias tiles and the mbarriers. FwdSmem hands out the 32-bit shared addresses that ldmatrix, wgmma descriptors and
// the TMA take, each at its member's offset.
#pragma once
#include <cstddef>
#include <cstdint>

#include "fa2/ptx.cuh"
#include "fa2/tile_config.h"  // kFwdMaxConsumerWarps

namespace fa2 {
namespace fwd {

// The mbarriers of a TMA kernel (and the tile counter's slot). A stage's barrier completes once per use: use number u
// (counted across the CTA's query blocks) has parity (u / kRing) % 2; Q's completes once per query block.
template <int kRing, bool kSplitKV>
struct FwdBarriers {
  uint64_t q_full;           // Q landed (the tile counter: also a tile announced)
  uint64_t kv_full[kRing];   // a stage's K and V (and bias tile) landed; kSplitKV: its K
  uint64_t kv_empty[kRing];  // warp-specialized: every consumer warp is done with the stage (kSplitKV: with its K)
  uint64_t q_empty;          // warp-specialized: every consumer warp is done with Q's tile
  // the persistent kernel's next tile, written by the producer before it completes q_full's phase for that tile
  // (num_tiles: no more tiles); with a tile counter only
  int next_tile;
  // kVarlen with params.varlen_stage_masks: bit s set while stage s holds a key block that needs the mask, written by
  // the producer before it arms the stage's barrier (the arrival's release orders it), read by the consumers after
  // their wait and before they release the stage (fwd/producer.cuh, fwd/mainloop_steps.cuh: stage_may_need_mask)
  int masked_stages;
  uint64_t v_full[kSplitKV ? kRing : 1];   // kSplitKV: a stage's V landed
  uint64_t v_empty[kSplitKV ? kRing : 1];  // kSplitKV: a stage's V released
  // with sinks: each consumer warp's current tile's head, written and read by the warp's lane 0 (the epilogue's sink
  // load then needs no second TileOrder::at, whose divisions cost the short causal tiles ~3% of their instructions)
  int tile_head[kFwdMaxConsumerWarps];
};

template <int kKVBytes>
struct FwdKVStage {
  unsigned char k[kKVBytes];  // (kBlockN, d) SwizzledTile
  unsigned char v[kKVBytes];
};

// sm80 instruction path: Q and the K/V stages. sm_90a adds a key tile of bias per stage (kStagedBias), the pipelined
// kernel the same folded to fp32 (kFoldedBias), and the mbarriers last (the allocation ends with them).
template <class Cfg, int kRing, bool kFoldedBias, bool kSplitKV, bool kWgmma = Cfg::kWgmma>
struct FwdSharedStorage {
  unsigned char q[Cfg::kSmemQBytes];  // (kBlockM, d) SwizzledTile; the staged O's rows too
  FwdKVStage<Cfg::kSmemKVBytes> kv[kRing];
};
template <class Cfg, int kRing, bool kSplitKV>
struct FwdSharedStorage<Cfg, kRing, /*kFoldedBias=*/true, kSplitKV, /*kWgmma=*/true> {
  unsigned char q[Cfg::kSmemQBytes];
  FwdKVStage<Cfg::kSmemKVBytes> kv[kRing];
  unsigned char bias[kRing][Cfg::kSmemBiasTileBytes];
  unsigned char bias_folded[kRing][Cfg::kSmemBiasFoldedBytes];  // fp32 bias / scale of the stage's keys
  FwdBarriers<kRing, kSplitKV> barriers;
};
template <class Cfg, int kRing, bool kSplitKV>
struct FwdSharedStorage<Cfg, kRing, /*kFoldedBias=*/false, kSplitKV, /*kWgmma=*/true> {
  unsigned char q[Cfg::kSmemQBytes];
  FwdKVStage<Cfg::kSmemKVBytes> kv[kRing];
  unsigned char bias[kRing][Cfg::kSmemBiasTileBytes];
  FwdBarriers<kRing, kSplitKV> barriers;
};

// Whether the storage's mbarriers (sm_90a) start at `offset`.
template <class Storage, bool kHasBarriers>
constexpr bool fwd_barriers_at(int offset) {
  if constexpr (kHasBarriers) {
    return int(offsetof(Storage, barriers)) == offset;
  } else {
    return true;
  }
}

// Shared addresses of Traits' storage at `smem` (the dynamic shared memory, 1024-byte aligned: see
// SwizzledTile::fragment_address).
template <class Traits>
struct FwdSmem {
  using Cfg = typename Traits::Cfg;
  // the pipelined sm_90a kernel folds each staged bias tile once for the CTA; a warp-specialized one reads it as is
  using Storage = FwdSharedStorage<Cfg, Traits::kRing, /*kFoldedBias=*/!Traits::kWs, Traits::kSplitKV>;
  using Stage = FwdKVStage<Cfg::kSmemKVBytes>;
  static_assert(sizeof(Storage) <= Traits::kSmemTotal, "the storage fits the launch's dynamic shared memory");
  static_assert(offsetof(Storage, q) == 0, "Q's tile first, at the 1024-byte aligned base");

  unsigned char* smem;
  uint32_t base;  // smem's shared address

  __device__ __forceinline__ explicit FwdSmem(unsigned char* smem_) : smem(smem_), base(ptx::smem_u32(smem_)) {}

  __device__ __forceinline__ uint32_t q() const { return base; }
  __device__ __forceinline__ uint32_t k(int stage) const {
    return base + int(offsetof(Storage, kv)) + stage * int(sizeof(Stage));
  }
  __device__ __forceinline__ uint32_t v(int stage) const { return k(stage) + int(offsetof(Stage, v)); }
  // (sm_90a) a stage's key tile of bias; the pipelined kernel's, folded
  __device__ __forceinline__ uint32_t bias(int stage) const {
    return base + int(offsetof(Storage, bias)) + stage * Cfg::kSmemBiasTileBytes;
  }
  __device__ __forceinline__ uint32_t bias_folded(int stage) const {
    return base + int(offsetof(Storage, bias_folded)) + stage * Cfg::kSmemBiasFoldedBytes;
  }
  // mbarriers (FwdBarriers), at the end of the allocation
  __device__ __forceinline__ uint32_t bar_q() const { return base + kBarriersOffset + int(offsetof(Barriers, q_full)); }
  __device__ __forceinline__ uint32_t bar_kv(int stage) const {
    return bar_q() + int(offsetof(Barriers, kv_full)) + 8 * stage;
  }
  __device__ __forceinline__ uint32_t bar_empty(int stage) const {
    return bar_q() + int(offsetof(Barriers, kv_empty)) + 8 * stage;
  }
  __device__ __forceinline__ uint32_t bar_q_empty() const { return bar_q() + int(offsetof(Barriers, q_empty)); }
  __device__ __forceinline__ uint32_t tile_slot() const { return bar_q() + int(offsetof(Barriers, next_tile)); }
  __device__ __forceinline__ uint32_t masked_stages() const {
    return bar_q() + int(offsetof(Barriers, masked_stages));
  }
  __device__ __forceinline__ uint32_t tile_head(int warp) const {
    return bar_q() + int(offsetof(Barriers, tile_head)) + 4 * warp;
  }
  __device__ __forceinline__ uint32_t bar_v(int stage) const {
    return bar_q() + int(offsetof(Barriers, v_full)) + 8 * stage;
  }
  __device__ __forceinline__ uint32_t bar_v_empty(int stage) const {
    return bar_q() + int(offsetof(Barriers, v_empty)) + 8 * stage;
  }

  // a shared address of this storage as a generic pointer
  __device__ __forceinline__ unsigned char* ptr(uint32_t addr) const { return smem + (addr - base); }

 private:
  using Barriers = FwdBarriers<Traits::kRing, Traits::kSplitKV>;
  static_assert(sizeof(uint64_t) == 8, "8-byte mbarriers");
  static constexpr int kBarriersOffset = Traits::kSmemTotal - Cfg::kSmemBarrierBytes;
  static_assert(fwd_barriers_at<Storage, Cfg::kWgmma>(kBarriersOffset), "the mbarriers end the allocation");
  static_assert(!Cfg::kWgmma || sizeof(Barriers) <= Cfg::kSmemBarrierBytes, "kFwdSmemBarrierBytes holds them");
  static_assert(Cfg::kNWarps <= kFwdMaxConsumerWarps, "a head slot per consumer warp");
};

}  // namespace fwd
}  // namespace fa2
