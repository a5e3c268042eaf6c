// attn_bias in the forward's scores: added in fp32 (the general path), folded into the S accumulator (bias / scale,
// from global memory or from a key tile staged in shared memory), and the classification of staged key tiles.
#pragma once
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "fa2/bias.cuh"  // load_bias, bias_to_float
#include "fa2/params.h"

namespace fa2 {
namespace fwd {

// ---- score modification (the general path): s = scale * q.k; softcap; + bias --------------------------------
// s += bias[row, col] for the fragment elements (row0 + 16 mt + 8 half, col0 + 8 nt + e); out-of-range
// elements are not read (they are masked anyway). A bias broadcast along queries (row stride 0, e.g. a
// (batch, 1, 1, seqlen_k) key padding mask) is read once per column rather than once per element.
// Pointers advance by running sums (not base + i * stride) so the compiler has no per-element offsets to hoist
// out of the key loop.
template <typename B, int kMTiles, int kNTiles>
__device__ __forceinline__ void add_bias(float (&s)[kMTiles][kNTiles][4], const B* bias, int64_t row_stride,
                                         int64_t col_stride, int row0, int col0, int seqlen_q, int seqlen_k) {
  const int64_t step8 = 8 * col_stride;
  if (row_stride == 0) {
    const B* ptr = bias + col0 * col_stride;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int col = col0 + nt * 8;
      const float b0 = col < seqlen_k ? load_bias(ptr) : 0.f;
      const float b1 = col + 1 < seqlen_k ? load_bias(ptr + col_stride) : 0.f;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        s[mt][nt][0] += b0;
        s[mt][nt][1] += b1;
        s[mt][nt][2] += b0;
        s[mt][nt][3] += b1;
      }
      ptr += step8;
    }
  } else {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = row0 + mt * 16 + half * 8;
        const B* ptr = bias + row * row_stride + col0 * col_stride;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          const int col = col0 + nt * 8;
          if (row < seqlen_q && col < seqlen_k) s[mt][nt][half * 2] += load_bias(ptr);
          if (row < seqlen_q && col + 1 < seqlen_k) s[mt][nt][half * 2 + 1] += load_bias(ptr + col_stride);
          ptr += step8;
        }
      }
    }
  }
}

// acc[.][nt] = (b0, b1) in both rows of every m16 tile: a key-row bias's columns 8 nt + (lane % 4) * 2, + 1, the same
// for every query row.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void fill_key_pair(float (&acc)[kMTiles][kNTiles][4], int nt, float b0, float b1) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    acc[mt][nt][0] = b0;
    acc[mt][nt][1] = b1;
    acc[mt][nt][2] = b0;
    acc[mt][nt][3] = b1;
  }
}

// bias / scale for the bias-fold path, kept finite when the bias is: finfo.min / scale would overflow to -inf and
// read as a masked key (the row would output 0 instead of its uniform average; see kHeavyRowLog2).
__device__ __forceinline__ float fold_bias(float bias, float inv_scale) {
  const float v = bias * inv_scale;
  return v == -INFINITY && bias != -INFINITY ? -FLT_MAX : v;
}

// acc = bias[row, col] * inv_scale for the fragment elements (the bias-fold path: Q K^T then accumulates on
// top, and scale*log2(e) applied to the sum gives (scale q.k + bias) log2(e) with the plain path's one FMA).
// Elements past seqlen_k are 0 and not read (they are masked; kCheckCols only for the tile that crosses seqlen_k);
// rows past seqlen_q are 0 too, except with kKeyRow, where they get the (in-bounds) key row: they are never stored.
// kKeyRow: the bias is the same for every query row (row stride 0, e.g. a key padding mask): one load per column,
// shared by the thread's rows. A separate kernel variant because the per-element loads cost registers: at d 64 on
// sm_90a (bf16) the bias-fold variants take 156-192, the key-row ones 129-141 unbounded, which min_blocks_per_sm
// (tile_config.h) then holds to 128 for a second CTA per SM.
template <bool kKeyRow, bool kCheckCols, typename B, int kMTiles, int kNTiles>
__device__ __forceinline__ void init_from_bias(float (&acc)[kMTiles][kNTiles][4], const B* bias, int64_t row_stride,
                                               int64_t col_stride, int row0, int col0, int seqlen_q, int seqlen_k,
                                               float inv_scale) {
  const int64_t step8 = 8 * col_stride;
  if constexpr (kKeyRow) {  // the same for every query row: one load per column
    const B* ptr = bias + col0 * col_stride;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int col = col0 + nt * 8;
      const float b0 = !kCheckCols || col < seqlen_k ? fold_bias(load_bias(ptr), inv_scale) : 0.f;
      const float b1 = !kCheckCols || col + 1 < seqlen_k ? fold_bias(load_bias(ptr + col_stride), inv_scale) : 0.f;
      fill_key_pair(acc, nt, b0, b1);
      ptr += step8;
    }
  } else {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = row0 + mt * 16 + half * 8;
        const bool row_ok = row < seqlen_q;
        const B* ptr = bias + (row_ok ? row : 0) * row_stride + col0 * col_stride;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          const int col = col0 + nt * 8;
          acc[mt][nt][half * 2] =
              row_ok && (!kCheckCols || col < seqlen_k) ? fold_bias(load_bias(ptr), inv_scale) : 0.f;
          acc[mt][nt][half * 2 + 1] =
              row_ok && (!kCheckCols || col + 1 < seqlen_k) ? fold_bias(load_bias(ptr + col_stride), inv_scale) : 0.f;
          ptr += step8;
        }
      }
    }
  }
}

// Element i of a bias tile staged in shared memory, as fp32 (load_bias's meaning; a bool is read as its byte).
template <typename B>
__device__ __forceinline__ float staged_bias_value(const B* tile, int i) {
  using Raw = std::conditional_t<std::is_same_v<B, bool>, unsigned char, B>;
  return bias_to_float(reinterpret_cast<const Raw*>(tile)[i]);
}

// acc = bias / scale for the fragment elements, from one key tile of a key-row bias (the same for every query row)
// staged in shared memory; `tile` points at this thread's first column ((lane % 4) * 2) of it. Same values as
// init_from_bias<kKeyRow = true> reading them from global memory.
template <typename B, int kMTiles, int kNTiles>
__device__ __forceinline__ void init_from_staged_key_bias(float (&acc)[kMTiles][kNTiles][4], const B* tile,
                                                          float inv_scale) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const float b0 = fold_bias(staged_bias_value(tile, nt * 8), inv_scale);
    const float b1 = fold_bias(staged_bias_value(tile, nt * 8 + 1), inv_scale);
    fill_key_pair(acc, nt, b0, b1);
  }
}

// The same from the tile already folded (fp32 bias / scale per key); `pairs` points at this thread's first column
// pair ((lane % 4) * 2).
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void init_from_folded_key_bias(float (&acc)[kMTiles][kNTiles][4], const float2* pairs) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const float2 b = pairs[nt * 4];  // columns 8 nt + (lane % 4) * 2, + 1
    fill_key_pair(acc, nt, b.x, b.y);
  }
}

// What one staged key tile of a key-row bias holds, so that a padding mask costs only the tiles it cuts:
//   kZero    every key's bias is +0 (a kept key): S starts from 0, as without a bias;
//   kMasked  every key's bias is -inf (a padded key; a bool False): the tile adds nothing to any row (its scores are
//            -inf, so exp2 gives 0, and the running max, the sum and O keep their bits: the rescale is exactly 1,
//            softmax.cuh), so the kernel skips it;
//   kMixed   anything else (finfo.min included: a row that sees only such keys averages them): S starts from the bias.
enum class KeyTileKind : int { kZero, kMasked, kMixed };

// The kind of the kTileBytes-byte tile of B at `tile` (shared memory), decided by every warp on its own from the
// raw bits: each lane reads a chunk of it (below) and the warp votes (no block barrier; the same answer in every
// warp). Conservative: -0.0 or a bool byte other than 0/1 counts as kMixed. kValidKeysOnly: only the first
// valid_keys keys count (the TMA fills the rest of the tile that crosses seqlen_k with zeros, and those keys are
// masked anyway; a lane whose bytes straddle valid_keys votes kMixed), so that a padded tail there is skipped too;
// not in the 128-register d 64 kernel, which skips nothing and spilled 8-12 B more with it (ptxas).
// (A lane reads the smallest of 2, 4, 8 or 16 bytes with which the warp covers the tile; lanes past the tile vote
// either way. Tiles of 32 x that many bytes use every lane.)
template <typename B, int kTileBytes, bool kValidKeysOnly>
__device__ __forceinline__ KeyTileKind classify_key_bias_tile(const unsigned char* tile, int lane, int valid_keys) {
  constexpr int kLaneBytes = kTileBytes <= 64 ? 2 : kTileBytes <= 128 ? 4 : kTileBytes <= 256 ? 8 : 16;
  constexpr int kLanes = kTileBytes / kLaneBytes;
  static_assert(kTileBytes % kLaneBytes == 0 && kLanes <= 32, "the warp covers the tile in 2, 4, 8 or 16 bytes a lane");
  const bool in_tile = kLanes == 32 || lane < kLanes;
  const int chunk = in_tile ? lane : 0;  // (a lane past the tile reads the first chunk; its vote is either below)
  // each 32-bit word of an all-kept / all-padded tile (a bool's True is the byte 1 and keeps the key: bias 0)
  constexpr uint32_t kZeroWord = std::is_same_v<B, bool> ? 0x01010101u : 0u;
  constexpr uint32_t kMaskedWord = std::is_same_v<B, float>    ? 0xff800000u
                                   : std::is_same_v<B, __half> ? 0xfc00fc00u
                                   : std::is_same_v<B, bool>   ? 0u
                                                               : 0xff80ff80u;  // bf16
  bool zero = true, masked = true;
  if constexpr (kLaneBytes == 2) {
    const uint32_t w = reinterpret_cast<const uint16_t*>(tile)[chunk];
    zero = w == (kZeroWord & 0xffffu);
    masked = w == (kMaskedWord & 0xffffu);
  } else {
    constexpr int kWords = kLaneBytes / 4;
    uint32_t w[kWords];
    if constexpr (kWords == 4) {
      const uint4 v = reinterpret_cast<const uint4*>(tile)[chunk];
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (kWords == 2) {
      const uint2 v = reinterpret_cast<const uint2*>(tile)[chunk];
      w[0] = v.x, w[1] = v.y;
    } else {
      w[0] = reinterpret_cast<const uint32_t*>(tile)[chunk];
    }
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      zero &= w[i] == kZeroWord;
      masked &= w[i] == kMaskedWord;
    }
  }
  if constexpr (kValidKeysOnly) {
    constexpr int kLaneKeys = kLaneBytes / int(sizeof(B));
    const int keys_here = valid_keys - chunk * kLaneKeys;  // of this lane's keys, how many are below seqlen_k
    if (keys_here <= 0) {
      zero = masked = true;  // all past seqlen_k: either
    } else if (keys_here < kLaneKeys) {
      zero = masked = false;  // straddles it
    }
  }
  if (!in_tile) zero = masked = true;
  if (__all_sync(0xffffffffu, zero)) return KeyTileKind::kZero;
  return __all_sync(0xffffffffu, masked) ? KeyTileKind::kMasked : KeyTileKind::kMixed;
}

template <typename T, BiasType kBias>
struct BiasElement;  // the C++ type of a bias element
template <typename T>
struct BiasElement<T, BiasType::kNone> { using type = unsigned char; };  // (no bias: never read)
template <typename T>
struct BiasElement<T, BiasType::kSameAsInput> { using type = T; };
template <typename T>
struct BiasElement<T, BiasType::kFloat32> { using type = float; };
template <typename T>
struct BiasElement<T, BiasType::kBool> { using type = bool; };

}  // namespace fwd
}  // namespace fa2
