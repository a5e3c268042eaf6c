// The forward's epilogue (FA-3's CollectiveEpilogue): O / l to the output and lse = m + log l per row, for a tile
// whose queries saw keys, and zeros / +inf for one whose queries saw none. O leaves through shared memory (each warp's
// own rows of Q's tile, then 16-byte rows) or, in a persistent CTA whose Q's tile may already hold the next Q, from
// the registers. Split-KV's partial outputs go here.
#pragma once
#include <cmath>
#include <cstdint>

#include "fa2/fwd/tile_context.cuh"
#include "fa2/fwd/tile_scheduler.cuh"
#include "fa2/ptx.cuh"
#include "fa2/sm90/tma.cuh"
#include "fa2/sm90/wgmma.cuh"  // fence_proxy_async
#include "fa2/softmax.cuh"

namespace fa2 {
namespace fwd {

template <class Traits>
struct FwdEpilogue {
  using T = typename Traits::T;
  using QTile = typename Traits::QTile;
  static constexpr int kMTiles = Traits::kMTiles, kDTiles = Traits::kDTiles, kBlockM = Traits::kBlockM;
  static constexpr int kNThreads = Traits::kNThreads, kRowsPerWarp = Traits::kRowsPerWarp;
  static_assert(kDTiles % 4 == 0, "the n8 tiles of a row go in groups of four, one per lane of a quad");
  static_assert(!Traits::kStagedO || Traits::kQInRegisters, "staged O reuses Q's rows once Q is in registers");

  // -- no query of this block sees any key: out = 0, lse = +inf
  __device__ __forceinline__ static void store_empty(const AttentionParams& p, const FwdPipeline<Traits>& pipe,
                                                     int& q_loads, T* out, float* lse, int rows_q, int headdim,
                                                     int tid) {
    for (int idx = tid; idx < kBlockM * kDTiles; idx += kNThreads) {
      const int row = idx / kDTiles, chunk = idx % kDTiles;
      if (row < rows_q && chunk * 8 < headdim) {
        *reinterpret_cast<uint4*>(out + row * p.out_row_stride + chunk * 8) = make_uint4(0, 0, 0, 0);
      }
    }
    for (int row = tid; row < rows_q; row += kNThreads) lse[row] = INFINITY;
    if constexpr (Traits::kTileCounter) {
      // Its announcement counts as a Q load: waited for here too, because a CTA's first tile is not announced to the
      // consumers (announced_tile) yet its phase is completed; without this wait, the next tile's wait for parity 1
      // would return at once while phase 0 is still open (a parity wait counts the phase before the current one as
      // complete) and read the slot before the producer wrote it. For an announced tile the phase has completed
      // already (its next cannot complete before this warp's arrival below).
      pipe.wait_loaded(pipe.smem.bar_q(), q_loads & 1);
      __syncwarp();
      if (pipe.lane == 0) sm90::mbarrier_arrive(pipe.smem.bar_q_empty());
      ++q_loads;
    }
  }

  // -- O / l (0 for a row that saw nothing), lse = m + log l (+inf for such a row), for tile t (out, lse: its first
  // row's; rows_q of its rows below seqlen_q; l includes the tile's head's sink, p.sinks). more_tiles: the CTA may
  // run a next tile (FwdTileScheduler::more_tiles), whose Q kStagedO reads into registers here.
  __device__ __forceinline__ static void store(const AttentionParams& p, const FwdSmem<Traits>& smem,
                                               const FwdPipeline<Traits>& pipe, const FwdThreadRows<Traits>& rows,
                                               FwdConsumerState<Traits>& state, float (&acc_o)[kMTiles][kDTiles][4],
                                               OnlineSoftmax<kMTiles>& softmax, T* out, float* lse, int rows_q,
                                               int headdim, int tid, int lane, bool more_tiles, int q_loads,
                                               const FwdTileScheduler<Traits>& scheduler, const BlockInfo& info,
                                               int t) {
    const int q_row0 = rows.q_row0;
    // the sink's load issued before finalize's shuffles, which hide its latency. The tile's head is not kept live
    // through the key loop (that code is the same with and without sinks): sm_90a, lane 0 reads it back from the
    // warp's slot (fwd_kernel.cuh wrote it there) and broadcasts the sink; the sm80 path's blockIdx gives it cheaply.
    float sink = 0.f;
    if (p.sinks != nullptr) {
      if constexpr (Traits::Cfg::kWgmma) {
        if (lane == 0) sink = p.sinks[*reinterpret_cast<const int*>(smem.ptr(smem.tile_head(tid >> 5)))];
        sink = __shfl_sync(0xffffffffu, sink, 0);
      } else {
        int m_block, head, batch;
        scheduler.at(t, m_block, head, batch);
        sink = p.sinks[head];
      }
    }
    float inv_sum[2 * kMTiles], row_lse[2 * kMTiles];
    softmax.finalize(rows.mult, inv_sum, row_lse);
    if (p.sinks != nullptr) {
#pragma unroll
      for (int r = 0; r < 2 * kMTiles; ++r) add_sink(sink, inv_sum[r], row_lse[r]);
    }
    // O / l as T pairs, per row of this thread (row in the block): store_row(row, its pairs, one per n8 tile)
    auto store_o = [&](auto&& store_row) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = q_row0 + mt * 16 + half * 8 + (lane >> 2);
          const float inv = inv_sum[mt * 2 + half];
          uint32_t pairs[kDTiles];
#pragma unroll
          for (int dt = 0; dt < kDTiles; ++dt) {
            pairs[dt] = ptx::pack2<T>(acc_o[mt][dt][half * 2] * inv, acc_o[mt][dt][half * 2 + 1] * inv);
          }
          store_row(row, pairs);
        }
      }
    };
    // O / l into this warp's own rows of Q's tile (QTile's layout), a thread's 4-byte pairs: the staged copy below
    // reads them back 16 bytes a lane (copy_out_rows)
    unsigned char* const sO = smem.smem;
    auto stage_o = [&]() {
      store_o([&](int row, uint32_t (&pairs)[kDTiles]) {
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          *reinterpret_cast<uint32_t*>(sO + (QTile::offset(row, dt) + (lane & 3) * 2) * 2) = pairs[dt];
        }
      });
    };
    if (Traits::kStagedO && more_tiles) {
      // kStagedO: O staged in the warp's rows of Q's tile and copied out 16 bytes a lane with no shuffles (the direct
      // stores below take ~500 instructions a warp for a tile's O, the 4 x 4 quad transposes most of them). Q's tile
      // holds the next tile's Q by then, so each warp first reads its rows of that into its registers (they are the
      // next tile's Q K^T operand), and releases Q's tile to the producer only once its O has left: the Q after next
      // then loads during the next tile. The next tile with keys, if any, is the one whose Q the producer loads.
      const int t_next = scheduler.next_with_keys(scheduler.next_static(t), info);
      state.q_in_registers = t_next < scheduler.num_tiles;
      if (state.q_in_registers) state.read_q_rows(pipe, rows.q_lane, (q_loads + 1) & 1);
      // every lane's reads of this warp's rows (the ldmatrix above) before any lane's O lands there
      __syncwarp();
      stage_o();
      __syncwarp();
      // this warp's kRowsPerWarp rows, 16 bytes a lane: whole 256-byte rows per 16 lanes (coalesced)
      constexpr int kWarpOutIters = kRowsPerWarp * kDTiles / 32;
      static_assert(kRowsPerWarp * kDTiles % 32 == 0, "a warp's 16-byte chunks split evenly over its lanes");
      // (release: the warp's shared-memory reads of O, then lane 0's arrival; the Q after next may then land here,
      // written by the TMA: the async proxy, ordered after this warp's generic writes of O by the proxy fence. Before
      // the global stores: the fence is a MEMBAR.ALL.CTA, which would also wait for them)
      copy_out_rows<QTile, kDTiles, kWarpOutIters, /*kThreads=*/32>(sO, out, p.out_row_stride, q_row0, lane, rows_q,
                                                                    headdim, [&] {
                                                                      if (state.q_in_registers) {
                                                                        sm90::fence_proxy_async();
                                                                        pipe.release(pipe.smem.bar_q_empty());
                                                                      }
                                                                    });
    } else if (more_tiles) {
      // Persistent, warp-specialized: Q's shared memory may already hold the next tile's Q (or be on its way there),
      // so O goes from the registers straight to global memory. A quad's four lanes hold 4 bytes each of every n8 tile
      // of their row; 4 x 4 transposes within the quad (ptx::quad_transpose) give each lane whole n8 tiles, stored 16
      // bytes at a time: a quarter of the store instructions, which had stalled the warps on the LSU queue (one-tile
      // CTAs keep the staged stores below). Without kQInRegisters Q is released once the key loop is done: the next
      // tile's Q loads behind the last P V and these stores.
      if constexpr (!Traits::kQInRegisters) pipe.release(pipe.smem.bar_q_empty());
      store_o([&](int row, uint32_t (&pairs)[kDTiles]) {
#pragma unroll
        for (int g = 0; g < kDTiles / 4; ++g) {
          uint32_t x[4] = {pairs[4 * g], pairs[4 * g + 1], pairs[4 * g + 2], pairs[4 * g + 3]};
          ptx::quad_transpose(x, lane);  // this lane: n8 tile 4 g + lane % 4
          const int col = (4 * g + (lane & 3)) * 8;
          if (row < rows_q && col < headdim) {
            *reinterpret_cast<uint4*>(out + row * p.out_row_stride + col) = make_uint4(x[0], x[1], x[2], x[3]);
          }
        }
      });
    } else {
      // O -> smem (this warp's own Q rows: no block barrier before overwriting them) -> 16-byte global stores.
      // __syncwarp: one lane's O store may hit Q bytes another lane of this warp read with ldmatrix in the last
      // Q K^T; lanes are not ordered without it (racecheck reported these hazards on the H200).
      __syncwarp();
      stage_o();
      if constexpr (Traits::kWs) {
        ptx::named_barrier_sync</*id=*/1, kNThreads>();  // the consumer warps only (the producer has left)
      } else {
        __syncthreads();
      }
      constexpr int kOutIters = kBlockM * kDTiles / kNThreads;
      static_assert(kBlockM * kDTiles % kNThreads == 0, "the output's 16-byte chunks split evenly over the threads");
      copy_out_rows<QTile, kDTiles, kOutIters, kNThreads>(sO, out, p.out_row_stride, /*row0=*/0, tid, rows_q,
                                                          headdim, [] {});
    }
    // (lse after O: in the staged path behind the release of Q's tile, whose fence would otherwise wait for them too)
    if ((lane & 3) == 0) {
#pragma unroll
      for (int r = 0; r < 2 * kMTiles; ++r) {
        const int row = q_row0 + (r >> 1) * 16 + (r & 1) * 8 + (lane >> 2);
        if (row < rows_q) lse[row] = row_lse[r];
      }
    }
  }
};

}  // namespace fwd
}  // namespace fa2
