// Ping-pong between the two consumer warpgroups of a warp-specialized sm_90a forward (named barriers).
#pragma once
#include "fa2/ptx.cuh"

namespace fa2 {
namespace fwd {

// Warp specialization (sm_90a with TMA loads; kWarpSpecialized): one more warpgroup, the producer, runs ahead
// issuing the K/V copies into the ring (waiting on "empty" barriers the consumer warps arrive on once their products
// have read a stage) with its registers given back (kWsProducerRegs); the kNWarps consumer warps take what is left of
// the CTA's pool (ws_consumer_regs, tile_config.h: 240 with two consumer warpgroups, 160 with three) and never sync
// the whole CTA inside the key loop. Without it, thread 0 issues the next copy after a __syncthreads per tile.
// Ping-pong (with warp specialization, kPingpong): the two consumer warpgroups take turns issuing their products, one
// "slot" each (P V of tile n, then Q K^T of tile n + 1), so that one's softmax runs while the other's products
// occupy the tensor cores. Named barriers 2 + w: warpgroup w waits on its own to start a slot, the other arrives on
// it when its slot ends (1: the consumers' epilogue barrier). Named barriers count arrivals without phases, so this
// relies on strict alternation: both warpgroups visit the same key tiles, every iteration opens and closes exactly
// one slot each (no per-warpgroup skipping, no break/continue in the loop), or the pairing shifts and the CTA hangs.
constexpr int kPingpongBarrier = 2;
// Warpgroup wg (0 or 1) of the two consumer warpgroups waits for its own ping-pong barrier / arrives on the other's.
__device__ __forceinline__ void pingpong_wait(int wg) {
  if (wg == 0) {
    ptx::named_barrier_sync<kPingpongBarrier, 256>();
  } else {
    ptx::named_barrier_sync<kPingpongBarrier + 1, 256>();
  }
}
__device__ __forceinline__ void pingpong_signal_other(int wg) {
  if (wg == 0) {
    ptx::named_barrier_arrive<kPingpongBarrier + 1, 256>();
  } else {
    ptx::named_barrier_arrive<kPingpongBarrier, 256>();
  }
}

}  // namespace fwd
}  // namespace fa2
