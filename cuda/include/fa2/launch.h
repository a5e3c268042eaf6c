// Host entry points of the CUDA kernels: plain C++, no torch. Each returns nullptr on success, else a message
// (valid until the next call on this thread) that the caller turns into its own error (TORCH_CHECK in cpp/cuda/).
// Launches are asynchronous on `stream`; nothing here synchronizes the host.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "fa2/params.h"
#include "fa2/tile_config.h"  // Sm90Schedule

namespace fa2 {

// The instantiated forward headdim that serves a (multiple-of-8) headdim: the smallest instantiated one >= headdim,
// or -1 when this build has none (FA2_HEADDIMS).
int fwd_headdim_rounded(int headdim);

// Whether instances built for an arch-specific target (sm_90a: the wgmma forward) may be chosen on their GPU
// (default: yes, unless the environment has FA2_DISABLE_ARCH_SPECIFIC=1). Process-wide; for A/B timing.
void set_arch_specific_kernels(bool enabled);
bool arch_specific_kernels();

// Which schedule the sm_90a forward's key loop runs (tile_config.h, Sm90Schedule; names in kSm90ScheduleNames):
// "auto" (default: each headdim's measured best, sm90_default_schedule), "pipelined", "ws", "pingpong", "overlap",
// "pingpong-overlap". Process-wide, for A/B timing; until set, the environment's FA2_SM90_SCHEDULE decides. A forced
// warp-specialized schedule applies to the plain path; a key-row bias runs sm90_key_bias_schedule unless "pipelined"
// is forced.
// set_sm90_schedule returns nullptr, or a message for an unknown name (the setting is then unchanged);
// sm90_schedule returns nullptr and sets *schedule, or a message when FA2_SM90_SCHEDULE names no schedule.
const char* set_sm90_schedule(const char* name);
const char* sm90_schedule(Sm90Schedule* schedule);

// Launch limits, checked on the host before a launch so that the caller gets the numbers rather than CUDA's
// "invalid argument" (messages as above):
// nullptr when `what` (a kernel at `headdim`) may use `bytes` of dynamic shared memory per block on the current
// device (its opt-in maximum: 227 KB on the H100/H200, 163 KB on the A100, 99 KB on sm86/sm89), else a message.
const char* check_dynamic_smem(const char* what, int headdim, int bytes);
// The current device's opt-in shared memory limit per block in bytes (cached per device), or -1 when CUDA cannot
// say (no device: the launch then reports it).
int device_smem_optin_limit();
// The current device's SM count (cached per device), or -1 when CUDA cannot say.
int device_sm_count();

// The warp-specialized sm_90a forward's persistent grid (fwd_kernel.cuh: each CTA takes every grid-th query
// block): -1 (the default) one CTA per SM where every query block has the same key range (no causal mask or window)
// at the headdims where that measured faster (tile_config.h, fwd_persistent_headdim), else one CTA per query block;
// 0 never persistent; n > 0 at most n CTAs on every call at those headdims (tests: many query blocks through one
// CTA; the other headdims' kernels take one query block per CTA whatever the setting). For A/B timing
// and tests; the environment's FA2_PERSISTENT_FWD_CTAS until set.
void set_persistent_forward_ctas(int ctas);
int persistent_forward_ctas();
// nullptr when batch and nheads fit the grid's y and z dimensions (at most 65535 each), else a message.
const char* check_grid_batch_heads(const char* what, int64_t batch, int64_t nheads);

// Forward: fills params.out and params.lse. Needs params.headdim_rounded == fwd_headdim_rounded(params.headdim),
// headdim a multiple of 8, q/k/v/out 16-byte aligned with row/head/batch strides that are multiples of 8
// elements, seqlen_q, seqlen_k, batch, nheads >= 1 (the torch glue pads/copies and handles empty inputs).
// Picks the instance compiled for the current device's architecture.
const char* run_fwd(const AttentionParams& params, cudaStream_t stream);

}  // namespace fa2
