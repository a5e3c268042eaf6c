// The few instructions the backward needs beyond ptx.cuh: fire-and-forget fp32 reductions into global memory (dQ)
// and the acquire/release pair of the deterministic mode's per-(query block) turn counters.
#pragma once
#include <cstdint>

namespace fa2 {
namespace ptx {

// *addr += (a, b) for two adjacent floats (addr 8-byte aligned), as one vector reduction on sm90 (half the L2
// atomic operations of two scalar ones), two scalar reductions before that.
__device__ __forceinline__ void red_add_f32x2(float* addr, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory");
#else
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(addr), "f"(a) : "memory");
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(addr + 1), "f"(b) : "memory");
#endif
}

// *addr += (a.x, a.y, a.z, a.w) for four adjacent floats (addr 16-byte aligned), one vector reduction on sm90 (the d
// 256 ws backward's fragment-order dQ), two pairs before that.
__device__ __forceinline__ void red_add_f32x4(float* addr, float4 a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(addr), "f"(a.x), "f"(a.y), "f"(a.z), "f"(a.w)
               : "memory");
#else
  red_add_f32x2(addr, a.x, a.y);
  red_add_f32x2(addr + 2, a.z, a.w);
#endif
}

// 4-byte global -> shared copy (cp.async.ca); when !pred nothing is read and the 4 bytes become 0.
__device__ __forceinline__ void cp_async_4(uint32_t smem_addr, const void* gmem, bool pred) {
  const int src_size = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_size));
}

__device__ __forceinline__ int ld_acquire_gpu(const int* addr) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_gpu(int* addr, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(addr), "r"(v) : "memory");
}

// *addr += v after everything this thread has written, and what other threads wrote before a barrier with it, is
// visible at GPU scope (a release fence, then a relaxed reduction: a counter of finished CTAs).
__device__ __forceinline__ void red_add_release_gpu(int* addr, int v) {
  asm volatile("fence.acq_rel.gpu;\nred.relaxed.gpu.global.add.s32 [%0], %1;\n" ::"l"(addr), "r"(v) : "memory");
}

// old = *addr, *addr += v, with acquire and release semantics at GPU scope after a release fence (as
// red_add_release_gpu's: what this thread, and other threads before a barrier with it, wrote is visible to whoever
// acquires the new value; and what they wrote before their own releases of it is visible to this thread, and after a
// barrier with it to the others).
__device__ __forceinline__ int atom_add_acq_rel_gpu(int* addr, int v) {
  int old;
  asm volatile("fence.acq_rel.gpu;\natom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n"
               : "=r"(old)
               : "l"(addr), "r"(v)
               : "memory");
  return old;
}

}  // namespace ptx
}  // namespace fa2
