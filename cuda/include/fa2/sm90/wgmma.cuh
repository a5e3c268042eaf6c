// Hopper (sm_90a) warpgroup MMA: shared-memory matrix descriptors for fa2's swizzled tiles, and the
// fence / commit / wait that order wgmma.mma_async with the registers and shared memory around it.
// First building block of the sm90 kernel family (issue: Hopper path); checked by scripts/dev/sm90_wgmma_probe.cu.
#pragma once
#include <cstdint>

#include "fa2/ptx.cuh"               // SwizzledTile: the smem layouts the sm80 kernels already fill with cp.async
#include "fa2/sm90/wgmma_ops.cuh"    // Wgmma<T, N>::ss / ::rs (generated)

namespace fa2::sm90 {

// Swizzle modes of the descriptor (bits 62-63). SwizzledTile's layouts are exactly the hardware's swizzles:
// 64-element (128-byte) column blocks with chunk ^= row % 8 are the 128B mode (Swizzle<3,4,3>), 32-element
// (64-byte) blocks with chunk ^= (row / 2) % 4 the 64B mode (Swizzle<2,4,3>), as long as each column block starts
// at a multiple of its swizzle period (1024 / 512 bytes), which leaves the descriptor's base offset at 0.
enum class Swizzle : uint64_t { k128B = 1, k64B = 2 };

__device__ __forceinline__ uint64_t make_descriptor(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes,
                                                    Swizzle swizzle) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t((leading_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t((stride_bytes >> 4) & 0x3FFF) << 32) | (uint64_t(swizzle) << 62);
}

// A descriptor moved by `bytes` (a multiple of 16) in shared memory: added to its address field, in the low word.
// Shared-memory addresses are below 2^18 (228 KB), so (addr & 0x3FFFF) >> 4 is addr >> 4 and the field (bits 0-13)
// cannot carry into the next. The k16 steps of one product are then one add each from a descriptor made once (at
// d 128 the forward's Q K^T re-masked and re-shifted the address on every step: 5 vector instructions and an R2UR
// per wgmma, on the warpgroup's critical path).
__device__ __forceinline__ uint64_t advance_descriptor(uint64_t desc, uint32_t bytes) {
  return (desc & 0xFFFFFFFF00000000ull) | (uint32_t(desc) + (bytes >> 4));
}

// Descriptors of a SwizzledTile<kRows, kCols, kBlockCols> (b16 elements, rows contiguous along kCols).
template <class Tile>
struct TileDescriptors;

template <int kRows, int kCols, int kBlockCols>
struct TileDescriptors<SwizzledTile<kRows, kCols, kBlockCols>> {
  static constexpr uint32_t kRowBytes = kBlockCols * 2;              // one row of one column block
  static constexpr uint32_t kBlockBytes = kRows * kRowBytes;         // one column block (all rows)
  static constexpr Swizzle kSwizzle = kBlockCols == 64 ? Swizzle::k128B : Swizzle::k64B;

  // As a K-major operand (rows = M or N, columns = K), the 16 columns k16 * 16 .. +15 and rows row0 .. row0 + 63 (A)
  // or all rows from row0 (B). Core matrices of 8 rows follow each other every 8 rows (stride = 8 rows); the
  // leading offset is unused in swizzled K-major layouts. A k16 step inside a column block moves the start by
  // 32 bytes: the hardware applies the swizzle to the final address.
  __device__ static __forceinline__ uint64_t k_major(uint32_t tile, int row0, int k16) {
    return k_major_step(k_major(tile, row0), k16);
  }
  // the same as k_major(tile, row0, 0), then moved to step k16 (k16 a compile-time constant: one add)
  __device__ static __forceinline__ uint64_t k_major(uint32_t tile, int row0) {
    return make_descriptor(tile + row0 * kRowBytes, 16, 8 * kRowBytes, kSwizzle);
  }
  __device__ static __forceinline__ uint64_t k_major_step(uint64_t desc0, int k16) {
    constexpr int kStepsPerBlock = kBlockCols / 16;
    return advance_descriptor(desc0, (k16 / kStepsPerBlock) * kBlockBytes + (k16 % kStepsPerBlock) * 32);
  }

  // As an MN-major operand (rows = K, columns = M or N; wgmma with trans_a / trans_b = 1): the 16 rows
  // k16 * 16 .. +15, the columns from col0 (a multiple of kBlockCols) on. Along M/N, column blocks follow each other
  // every kBlockBytes (leading offset); along K, groups of 8 rows every 8 rows (stride offset).
  __device__ static __forceinline__ uint64_t mn_major(uint32_t tile, int k16, int col0 = 0) {
    const uint64_t desc0 = make_descriptor(tile + (col0 / kBlockCols) * kBlockBytes, kBlockBytes, 8 * kRowBytes,
                                           kSwizzle);
    return advance_descriptor(desc0, k16 * 16 * kRowBytes);
  }
};

// Shared memory written by ordinary stores or cp.async (the generic proxy) becomes visible to wgmma's reads (the
// async proxy) only after this fence (then a barrier, for other threads' writes).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Orders register/shared-memory accesses before the next wgmma.mma_async reads them (accumulators written by
// ordinary instructions, A fragments in registers).
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit_group() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The compiler sees wgmma.mma_async as an ordinary asm statement that reads and writes its accumulators at once; the
// hardware reads them (and an A fragment from registers) asynchronously, between wgmma.fence and wait_group. So the
// operands are pinned with these empty volatile asm statements (volatile asm keeps its order with the fence, the
// MMAs and the wait): before fence(), so that every ordinary write to them is issued before the fence (writes
// between fence and MMA are undefined behaviour, and were seen in the PTX), and after wait_group, so that no read
// or reuse of those registers moves before the MMAs completed.
template <int N>
__device__ __forceinline__ void hold_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int M, int N, int K>
__device__ __forceinline__ void hold_registers(float (&d)[M][N][K]) {
  hold_registers(reinterpret_cast<float(&)[M * N * K]>(d));
}
template <int N>
__device__ __forceinline__ void hold_fragments(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(a[i][0]), "+r"(a[i][1]), "+r"(a[i][2]), "+r"(a[i][3])::"memory");
}

// d (+)= A B, the warpgroup's m64 x kN product over kKSteps k16 steps, issued and waited for (all 128 threads):
//   A (64 x K): rows a_at .. a_at + 63 of ATile as (M, K) (K-major), or (kAMnMajor) columns a_at .. of ATile as
//     (K, M) (a_at a multiple of its column blocks);
//   B (K x kN): rows b_at .. of BTile as (N, K) (K-major: B^T stored), or (kBMnMajor) columns b_at .. of BTile as
//     (K, N) (b_at a multiple of its column blocks).
// d is the warp's share of the accumulator (the m16n8 C fragments of its 16 rows, kN / 8 n8 tiles).
// kWait = false: only issued and committed as one group; wait_hold (or wait_group + hold_registers) completes it,
// and d must not be touched before. kOverwrite: d = A B (the first k step does not read d, which need not be
// initialized: no zeroing instructions, which ptxas would otherwise have to order against wgmmas still in flight).
template <typename T, int kN, int kKSteps, bool kAMnMajor, bool kBMnMajor, class ATile, class BTile, bool kWait = true,
          bool kOverwrite = false>
__device__ __forceinline__ void gemm_ss(float (&d)[kN / 2], uint32_t sA, int a_at, uint32_t sB, int b_at) {
  using ADesc = TileDescriptors<ATile>;
  using BDesc = TileDescriptors<BTile>;
  hold_registers(d);  // see hold_registers
  fence();
#pragma unroll
  for (int k16 = 0; k16 < kKSteps; ++k16) {
    const uint64_t desc_a = kAMnMajor ? ADesc::mn_major(sA, k16, a_at) : ADesc::k_major(sA, a_at, k16);
    const uint64_t desc_b = kBMnMajor ? BDesc::mn_major(sB, k16, b_at) : BDesc::k_major(sB, b_at, k16);
    Wgmma<T, kN>::template ss<kBMnMajor ? 1 : 0, kAMnMajor ? 1 : 0>(d, desc_a, desc_b, kOverwrite && k16 == 0 ? 0 : 1);
  }
  commit_group();
  if constexpr (kWait) {
    wait_group<0>();
    hold_registers(d);
  }
}

// d (+)= A B, the warpgroup's m64 x kN product over kKSteps k16 steps with A from registers: a[k16] is the
// register-A fragment of k16 step k16 (ptx::pack_k16 of C fragments or ldmatrix'd), B (K x kN) MN-major from BTile
// (its rows are K, its columns N from 0), or (kBMnMajor = false) K-major: BTile's rows from 0 are N, its columns K
// (B^T stored). kWait = false: only issued and committed; wait_hold completes it, and until then neither d nor a may
// be touched (hold_fragments(a) after the wait keeps a's registers from being reused early).
template <typename T, int kN, int kKSteps, class BTile, bool kWait = true, bool kBMnMajor = true>
__device__ __forceinline__ void gemm_rs(float (&d)[kN / 2], uint32_t (&a)[kKSteps][4], uint32_t sB) {
  using BDesc = TileDescriptors<BTile>;
  hold_registers(d);  // see hold_registers
  hold_fragments(a);
  fence();
#pragma unroll
  for (int k16 = 0; k16 < kKSteps; ++k16) {
    Wgmma<T, kN>::template rs<kBMnMajor ? 1 : 0>(d, a[k16], kBMnMajor ? BDesc::mn_major(sB, k16)
                                                                      : BDesc::k_major(sB, 0, k16), 1);
  }
  commit_group();
  if constexpr (kWait) {
    wait_group<0>();
    hold_registers(d);
    hold_fragments(a);
  }
}

// Completes all but the kPending most recently committed wgmma groups (they complete in order) and pins the
// accumulators d... of the completed ones (see hold_registers).
template <int kPending, typename... Acc>
__device__ __forceinline__ void wait_hold(Acc&... d) {
  wait_group<kPending>();
  (hold_registers(d), ...);
}

// Warp specialization: a warpgroup gives registers back (a producer that only issues copies) or takes more (the
// consumers that hold the accumulators). Every warp of the warpgroup executes the same one; counts are multiples of
// 8 in [24, 256], and the CTA's total must stay within the pool it was launched with, the per-thread count (64K /
// threads, a multiple of 8) times the threads: 128 x 24 + 256 x 240 = 64512 = 384 x 168. An .inc beyond it waits
// forever.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace fa2::sm90
