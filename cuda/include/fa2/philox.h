// Dropout's random bits: Philox4x32-7 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), a
// counter-based generator, so any thread can compute the bits of any attention weight from its coordinates alone:
// the forward never stores a mask and the backward (any tile shape) replays it. One header for the CPU kernel
// (cpp/cpu/) and the CUDA kernels: plain C++ plus __host__ __device__, no torch.
//
// The mapping (fixed: the CPU kernel, the CUDA kernels and the Python mirror python/fa2/_rng.py agree on it):
//   key     = (seed low 32 bits, seed high 32 bits)
//   counter = (key group, query group, low and high 32 bits of offset + batch * nheads + head)
//     key group   = (j / 16) * 4 + (j % 8) / 2     query group = (i / 16) * 8 + i % 8
//   One call gives 128 bits = eight 16-bit draws, for the eight weights of its group: queries {i0, i0 + 8} x keys
//   {j0, j0 + 1, j0 + 8, j0 + 9} of one 16 x 16 block (i0 % 16 < 8, j0 % 16 < 8, j0 even). Draw
//   slot = 4 * ((i / 8) % 2) + 2 * ((j / 8) % 2) + j % 2 is bits [16 (slot % 2), +16) of word slot / 2.
//   The weight is kept iff its draw < keep_threshold(p).
// Why these groups: a thread of an m16n8k16 MMA (and of wgmma) holds S's fragment rows group, group + 8 and columns
// 2 tig, 2 tig + 1 of every 8-wide column tile, so a thread that owns a 16 x 16 block's pair of 8-column tiles owns
// exactly whole groups, in the forward and in the sm80 backward alike (both hold S with queries as rows): one call
// per eight weights, no bits wasted and none shared between threads. 16 bits a draw: the keep probability is
// keep_threshold / 65536, within 2^-17 of 1 - p (8-bit draws, as flash-attn's, would be off by up to 2^-9).
// (batch, head) sit in the counter, not the key, so that each call's draws are one Philox stream keyed by the seed.
// Seven rounds: the fewest the paper found Crush-resistant (BigCrush passes), as flash-attn's dropout uses; the
// generator's instructions are most of dropout's cost, and ten rounds (curand's) would add 3/7 to them.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FA2_PHILOX_FN __host__ __device__ __forceinline__
#else
#define FA2_PHILOX_FN inline
#endif

namespace fa2 {

struct PhiloxBits {
  uint32_t x, y, z, w;
};

FA2_PHILOX_FN uint32_t mul_hi_u32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

// The rounds of dropout's generator (the CPU kernel, the CUDA kernels and python/fa2/_rng.py's DROPOUT_ROUNDS).
constexpr int kDropoutPhiloxRounds = 7;

// Philox4x32 with kRounds rounds: counter (x, y, z, w), key (k0, k1).
template <int kRounds>
FA2_PHILOX_FN PhiloxBits philox4x32(PhiloxBits c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule increments
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < kRounds; ++round) {
    const uint32_t hi0 = mul_hi_u32(kMul0, c.x), lo0 = kMul0 * c.x;
    const uint32_t hi1 = mul_hi_u32(kMul1, c.z), lo1 = kMul1 * c.z;
    c = PhiloxBits{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

// A call's dropout: the generator's (seed, offset) and the keep threshold of its 16-bit draws.
struct DropoutRng {
  uint64_t seed = 0, offset = 0;
  uint32_t keep_threshold = 0;  // a draw in [0, 65536) is kept iff it is below this (65536: keep all)
};

// round((1 - p) * 65536): p in [0, 1).
FA2_PHILOX_FN uint32_t dropout_keep_threshold(double p) {
  return static_cast<uint32_t>((1.0 - p) * 65536.0 + 0.5);
}

// The Philox counter's (z, w) for one (batch, head): offset + batch * nheads + head, 64 bits.
FA2_PHILOX_FN uint64_t dropout_head_counter(const DropoutRng& rng, int64_t batch, int64_t nheads, int64_t head) {
  return rng.offset + static_cast<uint64_t>(batch * nheads + head);
}

// The 128 bits of the group holding (query i, key j) of a head (head_counter: dropout_head_counter).
FA2_PHILOX_FN PhiloxBits dropout_group_bits(const DropoutRng& rng, uint64_t head_counter, int64_t i, int64_t j) {
  const uint32_t key_group = static_cast<uint32_t>((j >> 4) * 4 + ((j & 7) >> 1));
  const uint32_t query_group = static_cast<uint32_t>((i >> 4) * 8 + (i & 7));
  const PhiloxBits counter{key_group, query_group, static_cast<uint32_t>(head_counter),
                           static_cast<uint32_t>(head_counter >> 32)};
  return philox4x32<kDropoutPhiloxRounds>(counter, static_cast<uint32_t>(rng.seed),
                                          static_cast<uint32_t>(rng.seed >> 32));
}

// The 16-bit draw of (query i, key j) from its group's bits: slot 4 ((i / 8) % 2) + 2 ((j / 8) % 2) + j % 2.
FA2_PHILOX_FN uint32_t dropout_draw(const PhiloxBits& bits, int64_t i, int64_t j) {
  const int slot = static_cast<int>(((i >> 3) & 1) * 4 + ((j >> 3) & 1) * 2 + (j & 1));
  const uint32_t word = slot < 4 ? (slot < 2 ? bits.x : bits.y) : (slot < 6 ? bits.z : bits.w);
  return (word >> (16 * (slot & 1))) & 0xFFFFu;
}

// Whether (batch, head, query i, key j) is kept. (The kernels compute a group's bits once for its eight weights.)
FA2_PHILOX_FN bool dropout_keep(const DropoutRng& rng, int64_t batch, int64_t nheads, int64_t head, int64_t i,
                                int64_t j) {
  const PhiloxBits bits = dropout_group_bits(rng, dropout_head_counter(rng, batch, nheads, head), i, j);
  return dropout_draw(bits, i, j) < rng.keep_threshold;
}

}  // namespace fa2
