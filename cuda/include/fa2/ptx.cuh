// Thin wrappers over the sm80 instructions the fa2 kernels are built from (forward and backward share them):
// mma.sync m16n8k16 (f16/bf16 in, f32 accumulate), ldmatrix (.x4 / .x2, plain and .trans), cp.async 16-byte
// global->shared copies with zero-fill, fp32 -> f16x2/bf16x2 packing, quad (4-lane) reductions, and the
// XOR swizzle of shared-memory tiles. Framework-free: only CUDA's own headers.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = 4 * group + tig:
//   A (16x16, row-major): a0 = (group,   2tig..+1)  a1 = (group+8, 2tig..+1)
//                         a2 = (group,   2tig+8..)  a3 = (group+8, 2tig+8..)
//   B (16x8, "col"):      b0 = (k = 2tig..+1, n = group)   b1 = (k = 2tig+8..+9, n = group)
//   C/D (16x8, f32):      c0,c1 = (group, 2tig..+1)   c2,c3 = (group+8, 2tig..+1)
// ldmatrix .x4: lanes 8i..8i+7 give the 8 row addresses of matrix i; register i receives matrix i with lane
// holding (row = group, cols 2tig..+1); with .trans it holds (rows 2tig..+1, col = group) instead.
#pragma once
#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "fa2's sm80 kernels need compute capability 8.0 or newer (mma.sync bf16, cp.async)"
#endif

namespace fa2 {
namespace ptx {

// Shared-memory address of a generic pointer, as the 32-bit operand ldmatrix / cp.async take.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- tensor-core MMA: D = A * B + D, 16x8x16, fp32 accumulators -----------------------------------------
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                            const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- ldmatrix: four (or two) 8x8 b16 matrices from shared memory ----------------------------------------
// ("memory": they read shared memory other threads wrote, so no shared-memory access of this thread may be moved
// across them; without it only the barriers around them kept the order)
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr)
               : "memory");
}

// 16 bytes to global memory in one instruction, where pred: a predicated store, not a branch (through C++, a uint4
// store read from shared memory into an array first came out of ptxas as four 4-byte stores, and each `if` around
// one as a branch with its own address arithmetic: copy_out_rows below; sm_90a)
__device__ __forceinline__ void st_global_16(void* gmem, const uint4& v, bool pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n @p st.global.v4.b32 [%0], {%1, %2, %3, %4};\n}\n" ::"l"(gmem),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(int(pred))
      : "memory");
}

// ---- cp.async: 16-byte global -> shared copies, in commit groups ------------------------------------------
// When !pred nothing is read from global memory and the 16 shared bytes are zero-filled (src-size 0): that is
// how rows past the sequence end and columns past the headdim become zeros (so 0 * V never meets garbage).
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, bool pred) {
  const int src_size = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_size));
}
// Named barrier kId (1..15; 0 is __syncthreads'), complete once kThreads threads (a multiple of 32) have arrived:
// syncs a subset of the CTA, e.g. the consumer warps of a warp-specialized kernel. Compile-time ids: with a register
// id ptxas reserves all 16 barriers.
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_sync() {
  static_assert(kId >= 1 && kId < 16 && kThreads % 32 == 0, "barrier 1..15, whole warps");
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
// Arrives on named barrier kId without waiting (the signalling side of a named-barrier handshake).
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_arrive() {
  static_assert(kId >= 1 && kId < 16 && kThreads % 32 == 0, "barrier 1..15, whole warps");
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
// Named barrier kFirst + w of a warpgroup-indexed set of kCount (2 or 3; w a runtime index < kCount) synced on, or
// arrived on with kArrive: the compile-time id of each case, selected by branches.
template <int kFirst, int kCount, int kThreads, bool kArrive = false>
__device__ __forceinline__ void named_barrier_of(int w) {
  static_assert(kCount == 2 || kCount == 3, "two or three barriers");
  auto at = [](auto id) {
    if constexpr (kArrive) {
      named_barrier_arrive<decltype(id)::value, kThreads>();
    } else {
      named_barrier_sync<decltype(id)::value, kThreads>();
    }
  };
  if (w == 0) {
    at(std::integral_constant<int, kFirst>{});
  } else if (kCount == 2 || w == 1) {
    at(std::integral_constant<int, kFirst + 1>{});
  } else {
    at(std::integral_constant<int, kFirst + 2>{});
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// A volatile 32-bit load from a shared address (no generic-to-shared conversion of a pointer first).
__device__ __forceinline__ uint32_t ld_volatile_shared_b32(uint32_t smem_addr) {
  uint32_t v;
  asm volatile("ld.volatile.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(smem_addr));
  return v;
}
// Waits until at most n of this thread's committed groups are still in flight (n = 0: all landed).
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
}

// An accumulator fragment array (m16 tiles x n8 tiles x 4 fp32) set to 0.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void zero(float (&acc)[kMTiles][kNTiles][4]) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mt][nt][r] = 0.f;
}

// ---- conversions -------------------------------------------------------------------------------------------
// Packs two fp32 values (lo = lower address / lower column) into one f16x2 / bf16x2 register, round to nearest.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// A global line into L1 ahead of the load that reads it, with no register held until then.
__device__ __forceinline__ void prefetch_l1(const void* ptr) { asm volatile("prefetch.global.L1 [%0];\n" ::"l"(ptr)); }

// A 4 x 4 transpose of 32-bit words within each quad of lanes (lane & 3 = j): before, x[i] is word j of 16-byte
// chunk i; after, x[k] is word k of chunk j. For C fragments packed to T pairs (lane j: columns 2 j, 2 j + 1 of each
// n8 tile), four n8 tiles of a row become one whole n8 tile per lane, to store 16 bytes at a time. Two shuffle rounds
// (xor 1, then xor 2), each lane sending one word of each pair it swaps; selects, not lane-dependent indices (which
// would put x in local memory). Every lane of the warp takes part.
__device__ __forceinline__ void quad_transpose(uint32_t (&x)[4], int lane) {
  const bool odd = lane & 1, upper = lane & 2;
#pragma unroll
  for (int i = 0; i < 4; i += 2) {  // pairs (0, 1), (2, 3): x[i + 1] of the even lane <-> x[i] of the odd one
    const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? x[i] : x[i + 1], 1);
    x[i] = odd ? got : x[i];
    x[i + 1] = odd ? x[i + 1] : got;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // pairs (0, 2), (1, 3): x[i + 2] of the lower lane <-> x[i] of the upper one
    const uint32_t got = __shfl_xor_sync(0xffffffffu, upper ? x[i] : x[i + 2], 2);
    x[i] = upper ? got : x[i];
    x[i + 2] = upper ? x[i + 2] : got;
  }
}

// Columns 16 kt .. 16 kt + 15 of one m16 tile of fp32 C fragments (n8 tiles 2 kt, 2 kt + 1) packed to T as the A
// operand of one k16 step: the C layout of two n8 tiles is the A layout of mma.sync m16n8k16 and of wgmma's register
// A alike (the forward's P for P V; the backward's P^T, dS^T for dV, dK).
template <typename T, int kNTiles>
__device__ __forceinline__ void pack_k16(const float (&c)[kNTiles][4], int kt, uint32_t (&a)[4]) {
  a[0] = pack2<T>(c[2 * kt][0], c[2 * kt][1]);
  a[1] = pack2<T>(c[2 * kt][2], c[2 * kt][3]);
  a[2] = pack2<T>(c[2 * kt + 1][0], c[2 * kt + 1][1]);
  a[3] = pack2<T>(c[2 * kt + 1][2], c[2 * kt + 1][3]);
}

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// ---- quad reductions: the 4 lanes (tig = 0..3) that share one accumulator row ---------------------------
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
// ---- warp reductions: every lane gets the result (a butterfly, lanes 16 apart first: the same order in every lane)
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Programmatic dependent launch (sm90; nothing before): the grid launched next on the stream with
// cudaLaunchAttributeProgrammaticStreamSerialization may start once every CTA of this one has issued this (or
// exited). It orders no memory: the dependent grid waits for what it reads by its own means.
__device__ __forceinline__ void launch_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The other side: blocks until every grid this one depends on programmatically has completed and its memory is
// visible (returns at once for a grid launched without the attribute).
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace ptx

// ---- swizzled shared-memory tile ---------------------------------------------------------------------------
// A (kRows, kCols) b16 tile stored as kCols / kBlockCols column blocks of (kRows, kBlockCols), each row of a block
// kBlockCols * 2 bytes, its 16-byte chunks XOR-swizzled by the row so that 8 consecutive rows at one logical
// chunk (an ldmatrix phase, or 8 lanes of a cp.async) hit 8 distinct bank groups:
//   kBlockCols = 64 (128-byte rows): chunk ^ (row % 8)
//   kBlockCols = 32 ( 64-byte rows): chunk ^ ((row / 2) % 4)   (two rows share one 128-byte bank line)
template <int kRows, int kCols, int kBlockCols>
struct SwizzledTile {
  static_assert(kBlockCols == 64 || kBlockCols == 32, "column blocks of 64 or 32 b16 elements");
  static_assert(kCols % kBlockCols == 0, "kCols must be a multiple of the column block");
  static_assert(kRows % 8 == 0, "kRows must be a multiple of 8");
  static constexpr int kChunksPerBlock = kBlockCols / 8;
  static constexpr int kElems = kRows * kCols;
  static constexpr int kBytes = kElems * 2;

  __host__ __device__ static constexpr int swizzle_bits(int row) {
    return kBlockCols == 64 ? (row & 7) : ((row >> 1) & 3);
  }

  // Element offset of the 16-byte chunk `chunk` (= column / 8) of row `row`.
  __host__ __device__ static constexpr int offset(int row, int chunk) {
    const int block = chunk / kChunksPerBlock, c = chunk % kChunksPerBlock;
    return block * (kRows * kBlockCols) + row * kBlockCols + ((c ^ swizzle_bits(row)) << 3);
  }

  // Fragment addressing for ldmatrix: a lane reads row = row_c + row_l, chunk = chunk_c + chunk_l, with the
  // compile-time parts row_c a multiple of 8 and chunk_c even, the lane parts row_l >= 0 and chunk_l in {0, 1}.
  // Then, for a tile starting at a 1024-byte aligned shared address `tile`,
  //   byte address = ((tile + lane_bytes(row_l, chunk_l)) ^ xor_bytes(chunk_c)) + const_bytes(row_c, chunk_c)
  // i.e. one per-lane base, and per fragment one XOR and an immediate offset.
  __host__ __device__ static constexpr uint32_t lane_bytes(int row_l, int chunk_l) {
    return uint32_t(row_l * kBlockCols * 2 + ((chunk_l ^ swizzle_bits(row_l)) << 4));
  }
  __host__ __device__ static constexpr uint32_t xor_bytes(int chunk_c) {
    return uint32_t((chunk_c % kChunksPerBlock) << 4);
  }
  __host__ __device__ static constexpr uint32_t const_bytes(int row_c, int chunk_c) {
    return uint32_t((chunk_c / kChunksPerBlock) * (kRows * kBlockCols * 2) + row_c * kBlockCols * 2);
  }
  __device__ static __forceinline__ uint32_t fragment_address(uint32_t lane_base, int row_c, int chunk_c) {
    return (lane_base ^ xor_bytes(chunk_c)) + const_bytes(row_c, chunk_c);
  }
};

// A b16 tile staged in shared memory (Tile's layout, a SwizzledTile; rows from row0) -> global memory (out: row 0's
// first element, rows row_stride apart), 16 bytes a thread per step: thread `thread` of kThreads takes chunk
// idx % kDTiles of row row0 + idx / kDTiles, idx = thread + i kThreads, for the rows below `rows` and the columns
// below headdim (the reads take the whole tile's rows: staged bytes, in bounds). Every shared-memory read first, then
// predicated stores: written as a read and an `if` around a store per step, ptxas made each store a branch with its
// own 64-bit address arithmetic, behind its read, and the next read waited for that store (the register it reused):
// kIters round trips (docs/tuning.md).
// after_reads() runs between the two: the shared bytes may be released there, before the stores are issued.
template <typename Tile, int kDTiles, int kIters, int kThreads, typename T, typename AfterReads>
__device__ __forceinline__ void copy_out_rows(const unsigned char* tile, T* out, int64_t row_stride, int row0,
                                              int thread, int rows, int headdim, AfterReads&& after_reads) {
  uint4 chunks[kIters];
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int idx = thread + i * kThreads;
    chunks[i] = *reinterpret_cast<const uint4*>(tile + Tile::offset(row0 + idx / kDTiles, idx % kDTiles) * 2);
  }
  after_reads();
  if constexpr (kThreads % kDTiles == 0) {
    // (a thread's chunk is the same in every step, its row kThreads / kDTiles further each: one address, stepped)
    constexpr int kRowStep = kThreads / kDTiles;
    const int row = row0 + thread / kDTiles, chunk = thread % kDTiles;
    T* dst = out + row * row_stride + chunk * 8;
    const int64_t step = kRowStep * row_stride;
    const bool in_cols = chunk * 8 < headdim;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      ptx::st_global_16(dst + i * step, chunks[i], in_cols && row + i * kRowStep < rows);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int idx = thread + i * kThreads;
      const int row = row0 + idx / kDTiles, chunk = idx % kDTiles;
      ptx::st_global_16(out + row * row_stride + chunk * 8, chunks[i], row < rows && chunk * 8 < headdim);
    }
  }
}

}  // namespace fa2
