// Host entry points of the CUDA kernels: plain C++, no torch. Each returns nullptr on success, else a message
// (valid until the next call on this thread) that the caller turns into its own error (TORCH_CHECK in cpp/cuda/).
// Launches are asynchronous on `stream`; nothing here synchronizes the host.
#pragma once
#include <cuda_runtime_api.h>

#include "fa2/params.h"

namespace fa2 {

// The instantiated forward headdim that serves a (multiple-of-8) headdim: the smallest instantiated one >= headdim,
// or -1 when this build has none (FA2_HEADDIMS).
int fwd_headdim_rounded(int headdim);

// Whether instances built for an arch-specific target (sm_90a: the wgmma forward) may be chosen on their GPU
// (default: yes, unless the environment has FA2_DISABLE_ARCH_SPECIFIC=1). Process-wide; for A/B timing.
void set_arch_specific_kernels(bool enabled);
bool arch_specific_kernels();

// Whether the sm_90a forward uses its warp-specialized pipeline (a producer warpgroup streaming K/V; plain path
// only so far, every headdim). Default: off unless the environment has FA2_SM90_WARP_SPECIALIZED=1, until it is measured to win.
void set_sm90_warp_specialized(bool enabled);
bool sm90_warp_specialized();
// With it: whether its two consumer warpgroups take turns issuing their products (ping-pong). Default: off unless
// FA2_SM90_PINGPONG=1.
void set_sm90_pingpong(bool enabled);
bool sm90_pingpong();
// With it (and without ping-pong, which wins when both are on): whether each consumer warpgroup keeps P V of tile
// n-1 in flight during the softmax of tile n. Default: off unless FA2_SM90_OVERLAP=1.
void set_sm90_overlap(bool enabled);
bool sm90_overlap();

// Forward: fills params.out and params.lse. Needs params.headdim_rounded == fwd_headdim_rounded(params.headdim),
// headdim a multiple of 8, q/k/v/out 16-byte aligned with row/head/batch strides that are multiples of 8
// elements, seqlen_q, seqlen_k, batch, nheads >= 1 (the torch glue pads/copies and handles empty inputs).
// Picks the instance compiled for the current device's architecture.
const char* run_fwd(const AttentionParams& params, cudaStream_t stream);

}  // namespace fa2
