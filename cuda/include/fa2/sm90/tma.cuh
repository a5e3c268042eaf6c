// Hopper (sm_90a) tensor memory accelerator: loading (rows x 64 or x 32) blocks of a (batch, seqlen, heads, headdim)
// tensor straight into fa2's SwizzledTile layout (the TMA's 128-byte swizzle writes exactly that layout), completion
// tracked by a shared-memory mbarrier; also 1-D fp32 boxes (row statistics) and the reduce-add of a shared-memory
// fp32 box into global memory (the backward's dQ). Host side: make_*_tensor_map (driver entry point, no libcuda
// link).
// Second building block of the sm90 kernel family; checked by scripts/dev/sm90_tma_probe.cu.
#pragma once
#include <cuda.h>  // CUtensorMap and its enums (types only)
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fa2::sm90 {

// The forward's maps (a kernel argument, __grid_constant__: the TMA reads them from parameter space): q, k, v, and
// a key-row bias's (make_key_bias_tensor_map) when the kernel stages one.
struct FwdTensorMaps {
  CUtensorMap q, k, v, bias;
};
// The warp-specialized backward's (bwd_ws_kernel.cuh): q and dout in query blocks, k and v in key blocks, lse and
// D (softmax_d) flat (make_flat_f32_tensor_map; with a key-row bias lse is row_lse, and shift row_shift), dq_accum as
// (rows, headdim) fp32 for the TMA's reduce-add, and so a GQA call's dK / dV accumulators (GqaDkv::kAccumulate).
struct BwdTensorMaps {
  CUtensorMap q, k, v, dout, lse, dsum, shift, dq_accum, dk_accum, dv_accum;
};

// ---- host: a 4-D tensor map over (batch, seqlen, heads, headdim) b16 elements with any strides (in elements; the
// row/head/batch strides must be multiples of 8 and the base 16-byte aligned), box = (box_cols headdim elements,
// box_rows positions, 1 head, 1 batch). box_cols 64 with the 128-byte swizzle, 32 with the 64-byte one, as the
// SwizzledTile column blocks. Rows and columns outside the tensor read as zeros. Returns nullptr or a message.
// cuTensorMapEncodeTiled, looked up once; nullptr when the driver does not have it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  // Looked up once (thread-safe static initialization); nullptr when the driver does not have it. The older
  // cudaGetDriverEntryPoint (CUDA 11.3+, deprecated in 13) rather than ...ByVersion (12.5+): the extension links
  // the cudart torch loaded, which may predate 12.5 within the same major version.
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    cudaDriverEntryPointQueryResult found;
    void* fn = nullptr;
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    const bool ok = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found) == cudaSuccess &&
                    found == cudaDriverEntryPointSuccess;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
    return ok ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn) : nullptr;
  }();
  return encode;
}

inline const char* make_bshd_tensor_map(CUtensorMap* map, const void* base, bool bf16, int64_t batch, int64_t seqlen,
                                        int64_t heads, int64_t headdim, int64_t batch_stride, int64_t row_stride,
                                        int64_t head_stride, int box_rows, int box_cols) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return "fa2: cuTensorMapEncodeTiled is not available from the CUDA driver";
  // A dimension of size 1 is never stepped over: give it the stride a contiguous tensor would have, so that whatever
  // the caller's tensor says there (torch allows anything) passes the encoder's checks.
  if (seqlen == 1) row_stride = headdim;
  if (heads == 1) head_stride = seqlen * row_stride;
  if (batch == 1) batch_stride = heads * head_stride;
  const cuuint64_t dims[4] = {cuuint64_t(headdim), cuuint64_t(seqlen), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(row_stride) * 2, cuuint64_t(head_stride) * 2, cuuint64_t(batch_stride) * 2};
  const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                            const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            box_cols == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? nullptr : "fa2: cuTensorMapEncodeTiled rejected the tensor (alignment or strides)";
}

// ---- host: a 3-D tensor map over a key-row bias, (batch, heads, seqlen_k) elements of `elem_bytes` (2: b16 of the
// inputs' type, 4: float32, 1: bool as bytes) with unit key stride; a broadcast dimension (stride 0) has size 1 and
// is addressed at 0. Box = box_cols keys of one (batch, head); keys past seqlen_k read as zeros (masked anyway).
// Needs a 16-byte aligned base and head/batch strides that are multiples of 16 bytes. Returns nullptr or a message.
inline const char* make_key_bias_tensor_map(CUtensorMap* map, const void* base, int elem_bytes, bool bf16,
                                            int64_t batch, int64_t heads, int64_t seqlen_k, int64_t batch_stride,
                                            int64_t head_stride, int box_cols) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return "fa2: cuTensorMapEncodeTiled is not available from the CUDA driver";
  if (head_stride == 0) heads = 1;
  if (batch_stride == 0) batch = 1;
  // a dimension of size 1 is never stepped over: any multiple of 16 bytes will do there
  const int64_t row_bytes = (seqlen_k * elem_bytes + 15) / 16 * 16;
  const int64_t head_bytes = heads == 1 ? row_bytes : head_stride * elem_bytes;
  const int64_t batch_bytes = batch == 1 ? head_bytes * heads : batch_stride * elem_bytes;
  const cuuint64_t dims[3] = {cuuint64_t(seqlen_k), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[2] = {cuuint64_t(head_bytes), cuuint64_t(batch_bytes)};
  const cuuint32_t box[3] = {cuuint32_t(box_cols), 1, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type = elem_bytes == 4   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : elem_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : bf16            ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                     : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult r = encode(map, type, 3, const_cast<void*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? nullptr : "fa2: cuTensorMapEncodeTiled rejected the key-row bias (alignment or strides)";
}

// ---- host: a 1-D tensor map over `elems` fp32 values (16-byte aligned base), box = box_elems values (a multiple of
// 4, at most 256); a box must start at a multiple of 4 values (16 bytes: tma_load_1d), values past the end read as
// zeros. Returns nullptr or a message.
inline const char* make_flat_f32_tensor_map(CUtensorMap* map, const void* base, int64_t elems, int box_elems) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return "fa2: cuTensorMapEncodeTiled is not available from the CUDA driver";
  const cuuint64_t dims[1] = {cuuint64_t(elems)};
  const cuuint64_t strides[1] = {0};  // (rank 1: none are read)
  const cuuint32_t box[1] = {cuuint32_t(box_elems)};
  const cuuint32_t element_strides[1] = {1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 1, const_cast<void*>(base), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? nullptr : "fa2: cuTensorMapEncodeTiled rejected a row statistics buffer (alignment)";
}

// ---- host: a 2-D tensor map over a (rows, cols) fp32 matrix with contiguous rows (cols * 4 bytes a multiple of
// 16, 16-byte aligned base), box = (32 columns, box_rows rows) in the 128-byte swizzle: a box's row r holds its 16-byte
// chunk c at chunk c ^ (r % 8) of a 128-byte line (bwd_ws_kernel.cuh stages dQ so for the TMA's reduce-add).
inline const char* make_rows_f32_tensor_map(CUtensorMap* map, void* base, int64_t rows, int64_t cols, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return "fa2: cuTensorMapEncodeTiled is not available from the CUDA driver";
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 4};
  const cuuint32_t box[2] = {32, cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, base, dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? nullptr : "fa2: cuTensorMapEncodeTiled rejected an fp32 accumulator (alignment)";
}

// ---- device ---------------------------------------------------------------------------------------------------
#if defined(__CUDACC__)
__device__ __forceinline__ void mbarrier_init(uint32_t bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// Makes initialized barriers visible to the async proxy (the TMA) and to the other threads (with a barrier after).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of transactions (the TMA's writes) the phase must wait for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One plain arrival (e.g. a consumer warp releasing a buffer to the producer).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Blocks until the barrier's phase `phase` (0, 1, 0, ...) has completed. A phase that never completes (expected
// bytes that no copy delivers) would hang the kernel, and with it the process in its next synchronization: after
// FA2_MBARRIER_SPIN_LIMIT unsuccessful polls (each of which already waits a while in hardware; seconds in all,
// where a real load takes microseconds) the kernel traps instead, which surfaces as a CUDA error. 0: no limit.
#ifndef FA2_MBARRIER_SPIN_LIMIT
#define FA2_MBARRIER_SPIN_LIMIT (1u << 24)
#endif
__device__ __forceinline__ bool mbarrier_try_wait(uint32_t bar, uint32_t phase) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(phase)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t phase) {
  for (uint32_t polls = 0; !mbarrier_try_wait(bar, phase); ++polls) {
    if (FA2_MBARRIER_SPIN_LIMIT != 0 && polls >= FA2_MBARRIER_SPIN_LIMIT) __trap();
  }
}
// The same without the trap, for the consumer warpgroups of a warp-specialized kernel: a __trap on their path makes
// ptxas ignore their setmaxnreg.inc and hold them to the launch-time register count (seen with CUDA 13.0: 168
// instead of 240, spills). A phase that never completes there stalls the producer too, whose own waits still trap.
__device__ __forceinline__ void mbarrier_wait_untimed(uint32_t bar, uint32_t phase) {
  while (!mbarrier_try_wait(bar, phase)) {
  }
}
// (rows x cols) box at (col, row, head, batch) of the tensor map into shared memory `dst` (aligned to the
// swizzle period: 1024 bytes for 128B), completing `bytes` transactions on `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int col, int row,
                                            int head, int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(head), "r"(batch), "r"(bar)
      : "memory");
}
// The same box written to shared memory `dst` of every CTA of the cluster in `cta_mask` (bit r: rank r), each
// completing its bytes on its own barrier at `bar` (the same shared-memory offsets in every CTA): one L2 read feeds
// them all.
__device__ __forceinline__ void tma_load_4d_multicast(uint32_t dst, const CUtensorMap* map, uint32_t bar, int col,
                                                      int row, int head, int batch, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(head), "r"(batch), "r"(bar), "h"(cta_mask)
      : "memory");
}
// ---- clusters (launched with a cluster dimension; sm_90)
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
__device__ __forceinline__ uint32_t cluster_num_ctas() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}
// One arrival on the barrier at shared-memory offset `bar` of the cluster's CTA `cta` (this CTA's too), with
// mbarrier.arrive's default semantics (release at CTA scope), as CUTLASS's cluster pipelines release a stage: what it
// orders are reads of the stage that have completed already (a consumer releases a stage after its wgmma's wait).
// (With .release.cluster each arrival waited on the thread's earlier memory operations at cluster scope, and the d 128
// forward in clusters ran below the cluster-free kernel: docs/tuning-fwd.md.)
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}
// Every non-exited thread of the cluster (this CTA's included) meets here: e.g. after the mbarriers' initialization,
// before any CTA arrives on or copies into another's.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// A (kRows, kCols) SwizzledTile with kBlockCols-wide column blocks from a 4-D tensor map (make_bshd_tensor_map with
// box (kBlockCols, kRows)): rows row .. row + kRows - 1 of (head, batch), one box per column block, on `bar`.
template <int kRows, int kCols, int kBlockCols>
__device__ __forceinline__ void tma_load_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar, int row, int head,
                                              int batch) {
#pragma unroll
  for (int blk = 0; blk < kCols / kBlockCols; ++blk) {
    tma_load_4d(dst + blk * kRows * kBlockCols * 2, map, bar, blk * kBlockCols, row, head, batch);
  }
}
// Rows first_row .. kRows - 1 of such a tile set to zero, threads `threads` of them (thread: this one's index) sharing
// the stores (the column blocks' rows lie one after another: a row's swizzled chunks stay within its own bytes).
// Generic-proxy stores: a fence_proxy_async and a barrier before the tensor cores read them.
template <int kRows, int kCols, int kBlockCols>
__device__ __forceinline__ void zero_tile_rows_from(uint32_t tile, int first_row, int thread, int threads) {
  constexpr int kRowBytes = kBlockCols * 2;
#pragma unroll
  for (int blk = 0; blk < kCols / kBlockCols; ++blk) {
    const uint32_t end = tile + (blk + 1) * kRows * kRowBytes;
    for (uint32_t a = tile + (blk * kRows + first_row) * kRowBytes + thread * 16; a < end; a += threads * 16) {
      asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(a), "r"(0) : "memory");
    }
  }
}
// (1 x 1 x cols) box at (col, head, batch) of a 3-D tensor map into shared memory `dst` (16-byte aligned),
// completing its bytes on `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int col, int head,
                                            int batch) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(head), "r"(batch), "r"(bar)
      : "memory");
}
// The map's box of values at index `at` of a 1-D tensor map into shared memory `dst` (128-byte aligned), on `bar`. The
// box's start in global memory must be 16-byte aligned too (at * 4 % 16 == 0 for fp32: the H200 raises an illegal
// instruction otherwise).
__device__ __forceinline__ void tma_load_1d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int at) {
  asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2}], "
               "[%3];\n" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(at), "r"(bar)
               : "memory");
}
// Adds the box in shared memory `src` (1024-byte aligned for the 128-byte swizzle) to the tensor at (col, row),
// elementwise (fp32 add in the L2), as one bulk operation of the issuing thread's current bulk group. The smem must
// have been written before a fence_proxy_async (and, by other threads, a barrier).
__device__ __forceinline__ void tma_reduce_add_2d(const CUtensorMap* map, uint32_t src, int col, int row) {
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(col), "r"(row), "r"(src)
               : "memory");
}
// Orders this thread's completed async-proxy global writes (the reduce-adds, after bulk_wait_group<0, false>) before
// its later generic-proxy accesses (a release that other CTAs acquire before reading what was added).
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most kPending of this thread's bulk groups are still reading their shared memory (kRead), or are
// still in flight at all.
template <int kPending, bool kRead>
__device__ __forceinline__ void bulk_wait_group() {
  if constexpr (kRead) {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
  } else {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
  }
}
#endif

}  // namespace fa2::sm90
