// Ping-pong between the consumer warpgroups (two, or a ring of three) of a warp-specialized sm_90a forward (named
// barriers).
#pragma once

#include "fa2/ptx.cuh"

namespace fa2 {
namespace fwd {

// Warp specialization (sm_90a with TMA loads; kWarpSpecialized): one more warpgroup, the producer, runs ahead
// issuing the K/V copies into the ring (waiting on "empty" barriers the consumer warps arrive on once their products
// have read a stage) with its registers given back (kWsProducerRegs); the kNWarps consumer warps take what is left of
// the CTA's pool (ws_consumer_regs, tile_config.h: 240 with two consumer warpgroups, 160 with three) and never sync
// the whole CTA inside the key loop. Without it, thread 0 issues the next copy after a __syncthreads per tile.
// Ping-pong (with warp specialization, kPingpong): the consumer warpgroups take turns issuing their products, one
// "slot" each, in a ring (0, 1, ..., N - 1, 0, ...: two warpgroups, or the wide tiles' three), so that the others'
// softmax runs while one's products occupy the tensor cores. Named barriers 2 + w: warpgroup w waits on its own to
// start a slot, the one before it in the ring arrives on it when its slot ends (1: the consumers' epilogue barrier).
// Named barriers count arrivals without phases, so this relies on strict turns: every warpgroup visits the same key
// tiles, every iteration opens and closes exactly one slot each (no per-warpgroup skipping, no break/continue in the
// loop), or the pairing shifts and the CTA hangs. A warpgroup cannot arrive twice on the next one's barrier before
// that one waited: its own next turn needs the whole ring to have passed.
constexpr int kPingpongBarrier = 2;

// Named barrier 2 + w of warpgroup w's turn: synced on (kArrive false) or arrived on. (kWarpgroups == 2 folds the third
// case away: the two-warpgroup kernels' code is as before the ring.)
template <int kWarpgroups, bool kArrive>
__device__ __forceinline__ void pingpong_barrier(int w) {
  static_assert(kWarpgroups == 2 || kWarpgroups == 3, "a ring of two or three consumer warpgroups");
  ptx::named_barrier_of<kPingpongBarrier, kWarpgroups, 256, kArrive>(w);
}

// Warpgroup wg of the kWarpgroups consumer warpgroups waits for its turn / gives the turn to the next in the ring.
template <int kWarpgroups>
__device__ __forceinline__ void pingpong_wait(int wg) {
  pingpong_barrier<kWarpgroups, false>(wg);
}
template <int kWarpgroups>
__device__ __forceinline__ void pingpong_signal_next(int wg) {
  pingpong_barrier<kWarpgroups, true>(wg + 1 == kWarpgroups ? 0 : wg + 1);
}

}  // namespace fwd
}  // namespace fa2
