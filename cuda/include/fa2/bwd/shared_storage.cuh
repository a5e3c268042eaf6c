// The backward kernels' shared memory, one struct per kernel: named members in the order and sizes the tile configs'
// kSmemBytes count (checked below), and a view per struct that gives a member's 32-bit shared-space address (what
// ldmatrix, wgmma descriptors, the TMA and mbarriers take) or its generic pointer from the CTA's dynamic shared memory.
// Every member's size is a multiple of 128 bytes (8 for the mbarriers), so the structs have no padding.
#pragma once
#include <cstddef>
#include <cstdint>

#include "fa2/ptx.cuh"
#include "fa2/sm90/tma.cuh"  // mbarrier_init

namespace fa2 {
namespace bwd {

// bwd_kernel (the sm80 path and its sm_90a wgmma instances).
template <class Cfg>
struct SharedStorage {
  struct Stage {                           // one query block's tiles, cp.async'd together
    unsigned char q[Cfg::kSmemQBytes];     // Q: (kBlockM, d), swizzled
    unsigned char dout[Cfg::kSmemQBytes];  // dO: (kBlockM, d)
  };
  struct Stats {  // the block's rows' statistics (shift: the score-mod and key-row bias paths)
    float lse[Cfg::kBlockM], dsum[Cfg::kBlockM], shift[Cfg::kBlockM];
  };
  unsigned char k[Cfg::kSmemKVBytes];  // K: (kBlockN, d), resident
  unsigned char v[Cfg::kSmemKVBytes];  // V: (kBlockN, d), resident
  Stage stages[Cfg::kStages];          // double-buffered where kStages is 2
  unsigned char p[Cfg::kSmemPBytes];   // P: (kBlockM, kBlockN); the deterministic mode's ticket before the first block
  unsigned char ds[Cfg::kSmemPBytes];  // dS: (kBlockM, kBlockN)
  Stats stats[Cfg::kStages];
  float key_bias[Cfg::kBlockN];  // the key-row bias variant only (its launch adds these bytes)
};

template <class Cfg>
struct SharedStorageView {
  using Storage = SharedStorage<Cfg>;
  static_assert(offsetof(Storage, key_bias) == Cfg::kSmemBytes, "the layout Cfg::kSmemBytes counts");
  unsigned char* smem;
  uint32_t base;  // smem's shared-space address
  __device__ __forceinline__ explicit SharedStorageView(unsigned char* smem_) : smem(smem_), base(ptx::smem_u32(smem_)) {}
  __device__ __forceinline__ uint32_t k() const { return base + offsetof(Storage, k); }
  __device__ __forceinline__ uint32_t v() const { return base + offsetof(Storage, v); }
  __device__ __forceinline__ uint32_t q(int stage) const {
    return base + offsetof(Storage, stages) + stage * sizeof(typename Storage::Stage);
  }
  __device__ __forceinline__ uint32_t dout(int stage) const { return q(stage) + offsetof(typename Storage::Stage, dout); }
  __device__ __forceinline__ uint32_t p() const { return base + offsetof(Storage, p); }
  __device__ __forceinline__ uint32_t ds() const { return base + offsetof(Storage, ds); }
  __device__ __forceinline__ uint32_t stats(int stage) const {
    return base + offsetof(Storage, stats) + stage * sizeof(typename Storage::Stats);
  }
  __device__ __forceinline__ uint32_t key_bias() const { return base + offsetof(Storage, key_bias); }
  template <typename E = unsigned char>
  __device__ __forceinline__ E* at(uint32_t addr) const { return reinterpret_cast<E*>(smem + (addr - base)); }
};

// The query-block ring of the warp-specialized kernels, the same in both: per stage Q, dO and the block's row
// statistics, each a 1-D TMA box (ws_stat_box_elems values) at a 128-byte aligned start; the mbarriers (K/V landed;
// full: the producer's expect_tx arrival; empty: one arrival per consumer warp).
template <class Cfg>
struct WsStage {
  unsigned char q[Cfg::kSmemQBytes];     // Q: (kBlockM, d), swizzled as the TMA writes it
  unsigned char dout[Cfg::kSmemQBytes];  // dO: (kBlockM, d)
};
template <class Cfg>
struct WsStageStats {
  unsigned char lse[Cfg::kSmemStatBytes], dsum[Cfg::kSmemStatBytes];
  unsigned char shift[Cfg::kSmemStatBytes];  // (a key-row bias's row shift; reserved without one too)
};
template <class Cfg>
struct WsBarriers {
  uint64_t kv_loaded;
  uint64_t full[Cfg::kStages];
  uint64_t empty[Cfg::kStages];
};

// bwd_ws_kernel (d 64 / 128: each consumer warpgroup owns 64 of the keys).
template <class Cfg>
struct WsSharedStorage {
  unsigned char k[Cfg::kSmemKVBytes];  // K: (kBlockN, d), loaded once
  unsigned char v[Cfg::kSmemKVBytes];  // V
  WsStage<Cfg> ring[Cfg::kStages];
  unsigned char ds[2][Cfg::kSmemDsBytes];  // dS^T: (kBlockN, kBlockM), alternating query blocks
  unsigned char dq[Cfg::kConsumerWarpgroups][Cfg::kSmemDqBytes];  // each warpgroup's dQ part, staged for the TMA
  WsStageStats<Cfg> stats[Cfg::kStages];
  WsBarriers<Cfg> barriers;
};

// bwd_ws_dsplit_kernel (d 256: both consumer warpgroups own the 64 keys and split the headdim).
template <class Cfg>
struct WsDsplitSharedStorage {
  unsigned char k[Cfg::kSmemKVBytes];  // K: (kBlockN, d), loaded once
  unsigned char v[Cfg::kSmemKVBytes];  // V
  WsStage<Cfg> ring[Cfg::kStages];
  unsigned char p[2][Cfg::kSmemPBytes];   // P^T: (kBlockN, kBlockM), warpgroup 0's, alternating query blocks
  unsigned char ds[2][Cfg::kSmemPBytes];  // dS^T: (kBlockN, kBlockM), warpgroup 1's
  WsStageStats<Cfg> stats[Cfg::kStages];
  WsBarriers<Cfg> barriers;
};

// A view of either ws storage (the members both have: K, V, the ring, its statistics and barriers; and the kernel's own
// buffers through member()).
template <class Cfg, class Storage>
struct WsStorageView {
  static constexpr int kNumStages = Cfg::kStages;
  static_assert(sizeof(Storage) == Cfg::kSmemBytes, "the layout Cfg::kSmemBytes counts");
  unsigned char* smem;
  uint32_t base;  // smem's shared-space address
  __device__ __forceinline__ explicit WsStorageView(unsigned char* smem_) : smem(smem_), base(ptx::smem_u32(smem_)) {}
  __device__ __forceinline__ uint32_t k() const { return base + offsetof(Storage, k); }
  __device__ __forceinline__ uint32_t v() const { return base + offsetof(Storage, v); }
  __device__ __forceinline__ uint32_t q(int s) const { return base + offsetof(Storage, ring) + s * sizeof(WsStage<Cfg>); }
  __device__ __forceinline__ uint32_t dout(int s) const { return q(s) + offsetof(WsStage<Cfg>, dout); }
  __device__ __forceinline__ uint32_t stats(int s) const {
    return base + offsetof(Storage, stats) + s * sizeof(WsStageStats<Cfg>);
  }
  __device__ __forceinline__ uint32_t lse(int s) const { return stats(s) + offsetof(WsStageStats<Cfg>, lse); }
  __device__ __forceinline__ uint32_t dsum(int s) const { return stats(s) + offsetof(WsStageStats<Cfg>, dsum); }
  __device__ __forceinline__ uint32_t shift(int s) const { return stats(s) + offsetof(WsStageStats<Cfg>, shift); }
  __device__ __forceinline__ uint32_t kv_loaded() const {
    return base + offsetof(Storage, barriers) + offsetof(WsBarriers<Cfg>, kv_loaded);
  }
  __device__ __forceinline__ uint32_t full(int s) const {
    return base + offsetof(Storage, barriers) + offsetof(WsBarriers<Cfg>, full) + s * sizeof(uint64_t);
  }
  __device__ __forceinline__ uint32_t empty(int s) const {
    return base + offsetof(Storage, barriers) + offsetof(WsBarriers<Cfg>, empty) + s * sizeof(uint64_t);
  }
  template <typename E = unsigned char>
  __device__ __forceinline__ E* at(uint32_t addr) const { return reinterpret_cast<E*>(smem + (addr - base)); }
  // (one thread, before the CTA's barrier)
  __device__ __forceinline__ void init_barriers(int consumer_warps) const {
    sm90::mbarrier_init(kv_loaded(), 1);
#pragma unroll
    for (int s = 0; s < kNumStages; ++s) {
      sm90::mbarrier_init(full(s), 1);
      sm90::mbarrier_init(empty(s), consumer_warps);
    }
    sm90::fence_barrier_init();
  }
};

// bwd_ws_kernel's view: the ring's, and its dS^T buffers and dQ staging.
template <class Cfg>
struct WsSmem : WsStorageView<Cfg, WsSharedStorage<Cfg>> {
  using Storage = WsSharedStorage<Cfg>;
  using WsStorageView<Cfg, Storage>::WsStorageView;
  __device__ __forceinline__ uint32_t ds(int b) const { return this->base + offsetof(Storage, ds) + b * Cfg::kSmemDsBytes; }
  __device__ __forceinline__ uint32_t dq(int w) const { return this->base + offsetof(Storage, dq) + w * Cfg::kSmemDqBytes; }
};

// bwd_ws_dsplit_kernel's view: the ring's, and its P^T and dS^T buffers.
template <class Cfg>
struct WsDsplitSmem : WsStorageView<Cfg, WsDsplitSharedStorage<Cfg>> {
  using Storage = WsDsplitSharedStorage<Cfg>;
  using WsStorageView<Cfg, Storage>::WsStorageView;
  __device__ __forceinline__ uint32_t p(int b) const { return this->base + offsetof(Storage, p) + b * Cfg::kSmemPBytes; }
  __device__ __forceinline__ uint32_t ds(int b) const { return this->base + offsetof(Storage, ds) + b * Cfg::kSmemPBytes; }
};

}  // namespace bwd
}  // namespace fa2
