// The mbarriers of the forward's TMA kernels (FwdBarriers): their initialization and the consumers' side, waiting for
// a loaded Q or K/V stage and releasing a read one to the producer (fwd/producer.cuh issues the copies).
#pragma once
#include <cstdint>

#include "fa2/fwd/shared_storage.cuh"
#include "fa2/params.h"
#include "fa2/sm90/tma.cuh"

namespace fa2 {
namespace fwd {

template <class Traits>
struct FwdPipeline {
  static constexpr int kRing = Traits::kRing, kNWarps = Traits::kNWarps;
  static_assert(kRing >= 1 && (!Traits::kSplitKV || kRing == 2), "a ring of stages; split K/V barriers: two stages");
  FwdSmem<Traits> smem;
  int lane;
  // kCluster: this CTA's rank in its pair (a stage's K/V land in both CTAs, half from each producer)
  uint32_t cta_rank;

  // The barriers' initialization, then a CTA barrier (kCluster: cluster-wide, so that neither CTA arrives on or
  // copies into the other's barriers before they are initialized): the last CTA-wide barrier of a warp-specialized
  // kernel, whose producer leaves the consumers after it.
  __device__ __forceinline__ void init(const AttentionParams& p) const {
    if (threadIdx.x == 0) {
      // (kCluster: launched as the launcher must, in pairs sharing each tile's keys, an even number of query blocks a
      // head; otherwise the multicasts would go to a CTA that is not there, or the pairs' loads would differ)
      if (Traits::kCluster && (sm90::cluster_num_ctas() != 2 || p.tile_order_tail != 0 ||
                               (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM % 2 != 0)) {
        __trap();
      }
      sm90::mbarrier_init(smem.bar_q(), /*arrivals=*/1);
      if constexpr (Traits::kWs) sm90::mbarrier_init(smem.bar_q_empty(), kNWarps);  // one arrival per consumer warp
#pragma unroll
      for (int b = 0; b < kRing; ++b) {
        sm90::mbarrier_init(smem.bar_kv(b), /*arrivals=*/1);
        // one arrival per consumer warp (kCluster: of both CTAs)
        if constexpr (Traits::kWs) sm90::mbarrier_init(smem.bar_empty(b), kNWarps * (Traits::kCluster ? 2 : 1));
        if constexpr (Traits::kSplitKV) {
          sm90::mbarrier_init(smem.bar_v(b), /*arrivals=*/1);
          sm90::mbarrier_init(smem.bar_v_empty(b), kNWarps);
        }
      }
      sm90::fence_barrier_init();
    }
    if constexpr (Traits::kCluster) {
      sm90::cluster_sync();
    } else {
      __syncthreads();
    }
  }

  // The computing threads' wait for a Q / K+V barrier; untimed in a warp-specialized kernel (see
  // sm90::mbarrier_wait_untimed: its producer's waits keep the trap).
  __device__ __forceinline__ void wait_loaded(uint32_t bar, uint32_t phase) const {
    if constexpr (Traits::kWs) {
      sm90::mbarrier_wait_untimed(bar, phase);
    } else {
      sm90::mbarrier_wait(bar, phase);
    }
  }
  // kSplitKV: V of stage buf (use u) has landed (a tile's use is the previous one's + 1: no tile is skipped there)
  __device__ __forceinline__ void wait_v(int buf, int u) const {
    if constexpr (Traits::kSplitKV) wait_loaded(smem.bar_v(buf), (u / kRing) & 1);
  }

  // A consumer warp whose products have completed releases what it read (one arrival per warp).
  __device__ __forceinline__ void release(uint32_t bar) const {
    __syncwarp();
    if (lane == 0) sm90::mbarrier_arrive(bar);
  }
  // a K/V stage: to both CTAs of a cluster pair (its own CTA's empty barrier and the peer's)
  __device__ __forceinline__ void release_kv(uint32_t bar) const {
    release(bar);
    if constexpr (Traits::kCluster) {
      if (lane == 0) sm90::mbarrier_arrive_cluster(bar, cta_rank ^ 1);
    }
  }
  // stage buf (kSplitKV: its K), and its V
  __device__ __forceinline__ void release_stage(int buf) const { release_kv(smem.bar_empty(buf)); }
  __device__ __forceinline__ void release_v(int buf) const {
    release_kv(Traits::kSplitKV ? smem.bar_v_empty(buf) : smem.bar_empty(buf));
  }
};

}  // namespace fwd
}  // namespace fa2
