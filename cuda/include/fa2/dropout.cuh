// Dropout on the sm80 path's C fragments (forward: P before P V; backward: P for dV and dP for dS), from the Philox
// bits of fa2/philox.h. A thread's fragments of an m16 x (2 n8) block of S are exactly one Philox group (rows group,
// group + 8; keys 2 tig, 2 tig + 1 of both n8 tiles): one call per 8 weights, the same bits in the forward and the
// backward whatever their tiles, since only the element's coordinates enter.
#pragma once
#include <cstdint>

#include "fa2/params.h"
#include "fa2/philox.h"

namespace fa2 {

// A call's dropout for one (batch, head): the Philox key and the head's counter (params.rng_state read from device
// memory, so a captured CUDA graph replays with the state its caller wrote), the keep threshold and scale.
struct DropoutHead {
  uint32_t seed_lo, seed_hi, counter_lo, counter_hi;
  uint32_t keep_threshold;
  float keep_scale;

  DropoutHead() = default;  // (a kernel without dropout: never read)
  __device__ __forceinline__ DropoutHead(const AttentionParams& p, int batch, int head) {
    const uint64_t seed = static_cast<uint64_t>(__ldg(p.rng_state));
    const uint64_t offset = static_cast<uint64_t>(__ldg(p.rng_state + 1));
    const uint64_t counter = offset + static_cast<uint64_t>(int64_t(batch) * p.nheads + head);
    seed_lo = static_cast<uint32_t>(seed), seed_hi = static_cast<uint32_t>(seed >> 32);
    counter_lo = static_cast<uint32_t>(counter), counter_hi = static_cast<uint32_t>(counter >> 32);
    keep_threshold = p.dropout_keep_threshold;
    keep_scale = p.dropout_keep_scale;
  }

  // 8 keep bits of the group of key group kg, query group qg: bit 4 half + 2 (nt % 2) + e for fragment element
  // (half, e) of n8 tile nt (philox.h's slot order).
  __device__ __forceinline__ uint32_t keep_bits(uint32_t kg, uint32_t qg) const {
    const PhiloxBits b =
        philox4x32<kDropoutPhiloxRounds>(PhiloxBits{kg, qg, counter_lo, counter_hi}, seed_lo, seed_hi);
    const uint32_t words[4] = {b.x, b.y, b.z, b.w};
    uint32_t bits = 0;
#pragma unroll
    for (int slot = 0; slot < 8; ++slot) {
      const uint32_t draw = (words[slot >> 1] >> (16 * (slot & 1))) & 0xFFFFu;
      bits |= uint32_t(draw < keep_threshold) << slot;
    }
    return bits;
  }
};

// A kernel's DropoutHead for (batch, head): read from params where kDropout, else an unread placeholder.
template <bool kDropout>
__device__ __forceinline__ DropoutHead dropout_head(const AttentionParams& p, int batch, int head) {
  if constexpr (kDropout) return DropoutHead(p, batch, head);
  return DropoutHead{};
}

// Fragment element (mt, nt, 2 half + e)'s bit in its group's keep bits.
__device__ __forceinline__ constexpr int dropout_slot(int nt, int idx) {
  return 4 * (idx >> 1) + 2 * (nt & 1) + (idx & 1);
}

// The keep bits of a thread's C fragments (kMTiles m16 x kNTiles n8 tiles): 8 per group, group g = mt (kNTiles / 2)
// + nt / 2 in bits [8 g, 8 g + 8) of 128. row_base: the first row of the warp's tile (a multiple of 16; the thread's
// rows add group, + 8, + 16 mt), col_base its first key (a multiple of 16; the thread's keys add 2 tig, + 1, + 8 nt);
// both within the (batch, head)'s sequence. The groups' Philox calls run one after another (a loop, not unrolled):
// unrolled, ptxas interleaved them and spilled hundreds of bytes in kernels already at 255 registers.
template <int kMTiles, int kNTiles>
struct FragmentKeep {
  static_assert(kNTiles % 2 == 0, "whole 16-key blocks per thread");
  static constexpr int kGroups = kMTiles * kNTiles / 2;
  static_assert(kGroups <= 16, "up to 16 groups (128 bits) a thread");
  uint64_t lo = 0, hi = 0;  // groups 0..7, 8..15

  FragmentKeep() = default;
  __device__ __forceinline__ FragmentKeep(const DropoutHead& d, int row_base, int col_base, int group, int tig) {
#pragma unroll 1
    for (int g = 0; g < kGroups; ++g) {
      const int mt = g / (kNTiles / 2), c = g % (kNTiles / 2);
      const uint32_t qg = uint32_t((row_base >> 4) + mt) * 8 + group;
      const uint32_t kg = uint32_t((col_base >> 4) + c) * 4 + tig;
      const uint64_t bits = d.keep_bits(kg, qg);
      if (g < 8) {
        lo |= bits << (8 * g);
      } else {
        hi |= bits << (8 * (g - 8));
      }
    }
  }

  __device__ __forceinline__ bool keep(int mt, int nt, int idx) const {
    const int bit = 8 * (mt * (kNTiles / 2) + nt / 2) + dropout_slot(nt, idx);
    return ((bit < 64 ? lo >> bit : hi >> (bit - 64)) & 1u) != 0;
  }

  // acc = keep ? acc * scale : 0, element-wise
  __device__ __forceinline__ void apply(float (&acc)[kMTiles][kNTiles][4], float scale) const {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int idx = 0; idx < 4; ++idx) acc[mt][nt][idx] = keep(mt, nt, idx) ? acc[mt][nt][idx] * scale : 0.f;
  }
};

// The keep bits of a warp-specialized backward consumer's transposed fragments (bwd_ws_kernel: S^T with keys as rows),
// kKSteps k16 steps of queries from m0: step kt's 8 bits in bits [8 (kt % 4), + 8) of lo (kt < 4) or hi, bit
// 4 h + 2 half + e for S^T's element (n8 tile 2 kt + h, 2 half + e): key key_first + 8 half, query
// m0 + 16 kt + 8 h + 2 tig + e.
// Such a thread holds queries {2 tig, 2 tig + 1} x {+0, +8} of a 16 x 16 block and keys {group, group + 8}: half of
// two Philox groups (queries {2 tig + e, + 8} x keys {group & ~1, + 1, + 8, + 9}), whose other halves lane ^ 4 holds
// (group ^ 1). So each of the pair computes one group's call (e = group % 2) and they swap the bits with one shuffle:
// one call per eight weights, the forward's bits. Every lane of the warp must call it (the shuffle).
template <int kKSteps>
struct TransposedKeep {
  static_assert(kKSteps <= 8, "up to 8 k16 steps (64 bits) a thread");
  uint32_t lo = 0, hi = 0;  // steps 0..3, 4..7 (two registers, not an array: indexed by the loop's kt it went to local
                            // memory)

  TransposedKeep() = default;
  // m0, key_first: the block's first query and this thread's key within the (batch, head)'s sequence (m0 % 16 == 0,
  // key_first % 16 == group)
  __device__ __forceinline__ TransposedKeep(const DropoutHead& d, int m0, int key_first, int group, int tig) {
    const int parity = group & 1;
    const uint32_t kg = uint32_t(key_first >> 4) * 4 + uint32_t(group >> 1);
#pragma unroll 1
    for (int kt = 0; kt < kKSteps; ++kt) {
      const uint32_t qg = uint32_t((m0 >> 4) + kt) * 8 + uint32_t(2 * tig + parity);
      const uint32_t own = d.keep_bits(kg, qg);  // group (qg, kg): queries 2 tig + parity (+ 8)
      const uint32_t other = __shfl_xor_sync(0xffffffffu, own, 4);  // queries 2 tig + 1 - parity (+ 8)
      uint32_t bits = 0;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          // this thread's key has key parity `parity`: bit 4 h + 2 half + parity of either group
          const int slot = 4 * h + 2 * half + parity;
          bits |= ((own >> slot) & 1u) << (4 * h + 2 * half + parity);
          bits |= ((other >> slot) & 1u) << (4 * h + 2 * half + (1 - parity));
        }
      if (kt < 4) {
        lo |= bits << (8 * kt);
      } else {
        hi |= bits << (8 * (kt - 4));
      }
    }
  }

  // x * scale where element (n8 tile j, 2 half + e) of S^T is kept, else 0: a bit mask, not a predicate (ptxas
  // hoisted the predicates' bit tests and spilled them)
  __device__ __forceinline__ float dropped(int j, int half, int e, float x, float scale) const {
    const int kt = j / 2, bit = 8 * (kt % 4) + 4 * (j % 2) + 2 * half + e;
    const uint32_t mask = 0u - (((kt < 4 ? lo : hi) >> bit) & 1u);
    return __uint_as_float(__float_as_uint(x * scale) & mask);
  }
};

}  // namespace fa2
