// bwd_ws_kernel's epilogue: dK = scale dS^T Q and dV of the warpgroup's 64 keys out of the registers, one of
//   - through shared memory to 16-byte global stores, T like k (the default);
//   - fp32 partials per query head (GQA, p.gqa_dkv kPartials) from the fragments (ws_dkv_store.cuh);
//   - added by the TMA's reduce-add into fp32 rows: GQA's accumulators per kv head (kAccumulate), or a tail piece's
//     rows of its tile, whose last piece then reads the tile's sums back and stores them as a whole tile's CTA does.
// Keys past seqlen_k and dims past headdim are not stored; a key block no query sees stores zeros. Split-KV partials
// go here.
#pragma once
#include <cstdint>

#include "fa2/bwd/tile_scheduler.cuh"  // ws_tail_tile
#include "fa2/bwd/ws_dkv_store.cuh"
#include "fa2/bwd/ws_dq.cuh"  // ws_stage_dq
#include "fa2/bwd/ws_mainloop.cuh"  // WsConsumer
#include "fa2/bwd_ptx.cuh"
#include "fa2/params.h"
#include "fa2/ptx.cuh"
#include "fa2/sm90/tma.cuh"

namespace fa2 {
namespace bwd {

// kVarlen: dK, dV rows in the packed (total_k, nheads_k, headdim) tensors from the key block's sequence's first row,
// only the sequence's keys stored (the rows past its end are the next sequence's: another CTA's).
template <typename T, typename Cfg, bool kKeyBias, bool kVarlen = false>
struct WsEpilogue : WsConsumer<Cfg> {
  static constexpr int kHeadDim = Cfg::kHeadDim, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  static constexpr int kDTiles = kHeadDim / 8;  // n8 tiles of dK / dV (16 keys x d)
  using Base = WsConsumer<Cfg>;
  using Base::blk, Base::dq_issuer, Base::key0, Base::smem, Base::steps, Base::th;

  __device__ __forceinline__ explicit WsEpilogue(const Base& base) : Base(base) {}

  // dK (times dk_scale) and dV added into fp32 rows (row .. row + 63 of each warpgroup's 64 keys, in dk_map's and
  // dv_map's) by the TMA's reduce-add, as dQ is. Each warpgroup's (64 keys, d) staged as 32-column boxes of 64 rows
  // (ws_stage_dq's layout) in its ring stage's Q and dO buffers (free once every consumer is past its last products:
  // the barrier; see store_staged), dK and dV at once where both fit (d 64), else dK, then dV once the TMA has read it
  // (d 128). (Added from the fragments by red.global.add.v2.f32 instead, GQA's accumulators ran far behind the
  // grouped kernel: docs.) A key block no query sees adds nothing (the accumulators start at zero). The reduce-adds
  // are committed, not waited for.
  __device__ __forceinline__ void reduce_add_dkv(float (&dk_frag)[kDTiles][4], float (&dv_frag)[kDTiles][4],
                                                 const CUtensorMap* dk_map, const CUtensorMap* dv_map, int row,
                                                 float dk_scale) const {
    constexpr int kPartBytes = 64 * kHeadDim * 4;  // one warpgroup's dK (or dV)
    constexpr bool kBothAtOnce = 2 * kPartBytes <= 2 * Cfg::kSmemQBytes;
    static_assert(kPartBytes <= 2 * Cfg::kSmemQBytes && kStages >= Cfg::kConsumerWarpgroups && kDTiles % 4 == 0,
                  "a warpgroup's dK (or dV) in fp32 fits its stage's Q and dO buffers, as whole 32-column boxes");
    ptx::named_barrier_sync<1, 128 * Cfg::kConsumerWarpgroups>();
    if (steps == 0) return;  // (uniform over the CTA)
    const uint32_t s_part = smem.q(th.wg);
    auto reduce_add = [&](const CUtensorMap* map, uint32_t part) {
#pragma unroll
      for (int box = 0; box < kHeadDim / 32; ++box) {
        sm90::tma_reduce_add_2d(map, part + box * (64 * 128), 32 * box, row);
      }
    };
#pragma unroll
    for (int nt = 0; nt < kDTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) dk_frag[nt][i] *= dk_scale;
    }
    ws_stage_dq(dk_frag, s_part, th.warp_in_wg * 16 + th.group, th.tig);
    if constexpr (kBothAtOnce) ws_stage_dq(dv_frag, s_part + kPartBytes, th.warp_in_wg * 16 + th.group, th.tig);
    sm90::fence_proxy_async();  // the staging, stored by threads, then read by the TMA
    th.warpgroup_sync();
    if (dq_issuer) {
      reduce_add(dk_map, s_part);
      if constexpr (kBothAtOnce) reduce_add(dv_map, s_part + kPartBytes);
      sm90::bulk_commit_group();
    }
    if constexpr (!kBothAtOnce) {
      if (dq_issuer) sm90::bulk_wait_group<0, /*kRead=*/true>();
      th.warpgroup_sync();
      ws_stage_dq(dv_frag, s_part, th.warp_in_wg * 16 + th.group, th.tig);
      sm90::fence_proxy_async();
      th.warpgroup_sync();
      if (dq_issuer) {
        reduce_add(dv_map, s_part);
        sm90::bulk_commit_group();
      }
    }
  }

  // A piece of a tail tile (the launch's last wave split, p.bwd_tail_pieces > 1): its dK, dV (unscaled) added into the
  // tile's fp32 rows of p.bwd_tail_dkv (maps.dk_accum / dv_accum over them; rows past seqlen_k get zeros), then, once
  // this CTA's reduce-adds (dQ's too) have completed, counted in the tile's count with release semantics
  // (ws_key_block_done's order). Returns the shared flag (in dS^T's first buffer, which no product reads any more)
  // that tells whether this piece counted last: that one acquires the others' sums (load_tail_sums) and stores them
  // as a whole tile's CTA does (and counts the key block finished for the dQ conversion); the others are done.
  __device__ __forceinline__ volatile int* count_tail_piece(const AttentionParams& p, const sm90::BwdTensorMaps& maps,
                                                            float (&dk_frag)[kDTiles][4], float (&dv_frag)[kDTiles][4],
                                                            int tail_index) const {
    reduce_add_dkv(dk_frag, dv_frag, &maps.dk_accum, &maps.dv_accum, tail_index * kBlockN + th.wg * 64,
                   /*dk_scale=*/1.f);
    if (dq_issuer) sm90::bulk_wait_group<0, /*kRead=*/false>();
    sm90::fence_proxy_async_global();
    ptx::named_barrier_sync<1, 128 * Cfg::kConsumerWarpgroups>();
    volatile int* const last_piece = reinterpret_cast<volatile int*>(smem.at(smem.ds(0)));
    if (th.ctid == 0) {
      *last_piece = ptx::atom_add_acq_rel_gpu(p.bwd_tail_counts + tail_index, 1) == p.bwd_tail_pieces - 1;
    }
    ptx::named_barrier_sync<1, 128 * Cfg::kConsumerWarpgroups>();
    return last_piece;
  }
  // The last piece: the whole tile's sums (through the L2) into its fragments.
  __device__ __forceinline__ void load_tail_sums(const AttentionParams& p, float (&dk_frag)[kDTiles][4], float (&dv_frag)[kDTiles][4],
                                                 int tail_index) const {
    __threadfence();  // (each thread's reads of the sums after ctid 0's acquire, which the barrier passed on)
    const int64_t tile_floats = int64_t(kBlockN) * kHeadDim;
    const float* dk_sum = p.bwd_tail_dkv + tail_index * tile_floats;
    const float* dv_sum = dk_sum + p.bwd_tail_tiles * tile_floats;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int nt = 0; nt < kDTiles; ++nt) {
        const int64_t at = int64_t(key0 + 8 * half) * kHeadDim + 8 * nt + 2 * th.tig;
        const float2 k2 = __ldcg(reinterpret_cast<const float2*>(dk_sum + at));
        const float2 v2 = __ldcg(reinterpret_cast<const float2*>(dv_sum + at));
        dk_frag[nt][half * 2] = k2.x, dk_frag[nt][half * 2 + 1] = k2.y;
        dv_frag[nt][half * 2] = v2.x, dv_frag[nt][half * 2 + 1] = v2.y;
      }
    }
  }

  // Through shared memory to 16-byte global stores: straight from the fragments (each warp's 32-bit stores writing
  // 16-byte pieces of 8 rows) the epilogue took a large part of a short CTA's time (docs/tuning.md). Warpgroup w's dK
  // and dV (64 keys x d) go to stage w's Q and dO buffers, free once every consumer is past its last products (the
  // barrier): every TMA load into the ring was waited for (each loaded stage is consumed), and a wgmma's completion
  // carries an implicit generic-async proxy fence (PTX ISA, wgmma.mma_async), so the generic stores need no
  // fence.proxy.async. (bwd_ws_applies checked dk / dv for the 16-byte stores.)
  __device__ __forceinline__ void store_staged(const AttentionParams& p, const float (&dk_frag)[kDTiles][4],
                                               const float (&dv_frag)[kDTiles][4]) const {
    using OutTile = SwizzledTile<64, kHeadDim, Cfg::kBlockCols>;  // a warpgroup's dK or dV: (64 keys, d)
    static_assert(OutTile::kBytes <= Cfg::kSmemQBytes && kStages >= Cfg::kConsumerWarpgroups,
                  "a warpgroup's dK (and dV) fit a stage's Q (and dO) buffer");
    ptx::named_barrier_sync<1, 128 * Cfg::kConsumerWarpgroups>();
    unsigned char* s_dk = smem.at(smem.q(th.wg));
    unsigned char* s_dv = smem.at(smem.dout(th.wg));
    const int row_w = th.warp_in_wg * 16 + th.group;  // this thread's first row in the warpgroup's 64 keys
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int nt = 0; nt < kDTiles; ++nt) {
        const int at = (OutTile::offset(row_w + 8 * half, nt) + 2 * th.tig) * 2;
        *reinterpret_cast<uint32_t*>(s_dk + at) =
            ptx::pack2<T>(dk_frag[nt][half * 2] * p.scale, dk_frag[nt][half * 2 + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(s_dv + at) = ptx::pack2<T>(dv_frag[nt][half * 2], dv_frag[nt][half * 2 + 1]);
      }
    }
    th.warpgroup_sync();
    // this warpgroup's 64 keys from n0 + 64 wg (copy_out_rows: its reads first, then predicated 16-byte stores)
    const int key_w = blk.n0 + th.wg * 64;
    T* dk = static_cast<T*>(p.dk) + blk.batch * p.dk_batch_stride + blk.head_k * p.dk_head_stride +
            key_w * p.dk_row_stride;
    T* dv = static_cast<T*>(p.dv) + blk.batch * p.dv_batch_stride + blk.head_k * p.dv_head_stride +
            key_w * p.dv_row_stride;
    constexpr int kIters = 64 * kDTiles / 128;
    static_assert(64 * kDTiles % 128 == 0, "the 16-byte chunks split evenly over the warpgroup");
    if constexpr (kVarlen) {  // (rows of the packed tensors from the sequence's first key; only its keys)
      const int64_t row = blk.seq.k_row0 + key_w;
      dk = static_cast<T*>(p.dk) + blk.head_k * p.dk_head_stride + row * p.dk_row_stride;
      dv = static_cast<T*>(p.dv) + blk.head_k * p.dv_head_stride + row * p.dv_row_stride;
      const int rows = blk.seq.seqlen_k - key_w;
      copy_out_rows<OutTile, kDTiles, kIters, 128>(s_dk, dk, p.dk_row_stride, 0, th.ctid & 127, rows, p.headdim,
                                                   [] {});
      copy_out_rows<OutTile, kDTiles, kIters, 128>(s_dv, dv, p.dv_row_stride, 0, th.ctid & 127, rows, p.headdim,
                                                   [] {});
      return;
    }
    copy_out_rows<OutTile, kDTiles, kIters, 128>(s_dk, dk, p.dk_row_stride, 0, th.ctid & 127, p.seqlen_k - key_w,
                                                 p.headdim, [] {});
    copy_out_rows<OutTile, kDTiles, kIters, 128>(s_dv, dv, p.dv_row_stride, 0, th.ctid & 127, p.seqlen_k - key_w,
                                                 p.headdim, [] {});
  }

  // GQA with one CTA per query head: dK = scale dS^T Q and dV added into the kv head's fp32 accumulators (the first of
  // this warpgroup's 64 keys as a row of the (batch, nheads_k, seqlen_k) accumulators; the keys past seqlen_k add
  // exact zeros into the next head's first rows, as dQ's rows past seqlen_q do: P is 0 there)
  __device__ __forceinline__ void add_gqa_accumulators(const AttentionParams& p, const sm90::BwdTensorMaps& maps,
                                                       float (&dk_frag)[kDTiles][4],
                                                       float (&dv_frag)[kDTiles][4]) const {
    reduce_add_dkv(dk_frag, dv_frag, &maps.dk_accum, &maps.dv_accum,
                   (blk.batch * p.nheads_k + blk.head_k) * p.seqlen_k + blk.n0 + th.wg * 64, p.scale);
  }

  // The CTA's end: the reduce-adds' reads of the staging done; the key block counted finished for an overlapping dQ
  // conversion (varlen: in its head's count over every sequence, the conversion's rows being (nheads, total_q)).
  __device__ __forceinline__ void finish(const AttentionParams& p) const {
    if (dq_issuer) sm90::bulk_wait_group<0, /*kRead=*/false>();  // (the staging must outlive the reads)
    ws_key_block_done<Cfg, /*kBarrier=*/1>(p, kVarlen ? int64_t(blk.head) : blk.bh, blk.heads, th.ctid);
    FA2_CTA_MARK(Base::kTraceEnd, th.ctid == 0);
    FA2_CTA_MARK(trace::kExitNs, th.ctid == 0);
  }
};

}  // namespace bwd
}  // namespace fa2
