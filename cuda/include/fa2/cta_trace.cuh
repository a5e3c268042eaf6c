// CTA timelines for diagnosis: where a kernel's CTAs spend their time, from stamps each CTA writes at fixed points
// (clock64 within the CTA, globaltimer at its entry and exit, the SM it ran on). A development tool, off in every
// library build; a harness build with -DFA2_CTA_TRACE=1 (scripts/dev/fwd_variant_bench.cu, single translation unit: the
// buffer is one __device__ array) records the last launch of an instrumented kernel and dumps it to $FA2_TRACE_OUT,
// and scripts/dev/cta_trace.py summarizes it. Instrumented: the warp-specialized backward (bwd_ws_kernel.cuh) and the
// forward (fwd_kernel.cuh, fwd/tile_context.cuh: FwdTrace; with -DFA2_CTA_TRACE_TILES=1 too, every tile of both
// consumer warpgroups instead of two tiles' key iterations). What they found: docs/tuning.md.
#pragma once

#ifndef FA2_CTA_TRACE
#define FA2_CTA_TRACE 0
#endif
#ifndef FA2_CTA_TRACE_TILES
#define FA2_CTA_TRACE_TILES 0
#endif

namespace fa2::trace {

// Per CTA (linear block index below kCtas) kSlots 64-bit values: kEntry / kEntryNs / kSm / kExitNs, then the
// kernel's own events (clock64) from kFirstEvent on; scripts/dev/cta_trace.py reads the same layout.
constexpr int kCtas = 4096, kSlots = 128;
constexpr int kEntry = 0, kEntryNs = 1, kSm = 2, kExitNs = 3, kFirstEvent = 4;

#if FA2_CTA_TRACE
__device__ unsigned long long g_cta_trace[kCtas][kSlots];

// Slot `slot` of this CTA, written by the calling thread when `who`: globaltimer for kEntryNs / kExitNs, the SM for
// kSm, clock64 otherwise.
__device__ __forceinline__ void mark(int slot, bool who) {
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (!who || cta >= unsigned(kCtas) || slot >= kSlots) return;
  unsigned long long v;
  if (slot == kEntryNs || slot == kExitNs) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
  } else if (slot == kSm) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    v = sm;
  } else {
    v = clock64();
  }
  g_cta_trace[cta][slot] = v;
}
#define FA2_CTA_MARK(slot, who) ::fa2::trace::mark(slot, who)
#else
#define FA2_CTA_MARK(slot, who)
#endif

}  // namespace fa2::trace
