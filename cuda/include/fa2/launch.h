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
// The current device's compute capability major version (cached per device), or -1 when CUDA cannot say.
int device_cc_major();
// How many clusters of `config`'s CTAs (its block, dynamic shared memory and cluster attribute) of `kernel` (its
// shared memory limit already raised) the current device runs at once, 0 if none or CUDA cannot say. Cached per device
// once CUDA answers: its one caller's kernels all have one launch shape (the d 128 forward's clusters of two).
int max_active_cluster_pairs(const void* kernel, const cudaLaunchConfig_t& config);

// The warp-specialized sm_90a forward's persistent grid (fwd_kernel.cuh: each CTA takes every grid-th query
// block, or with a causal mask or window the next block of a tile counter: fwd_workspace_ints): -1 (the default) one
// CTA per SM at the headdims where that measured faster (tile_config.h, fwd_persistent_headdim) where every query
// block has the same key range (no causal mask or window) or the call has the counter, else one CTA per query block;
// 0 never persistent; n > 0 at most n CTAs on every call at those headdims (tests: many query blocks through one
// CTA; the other headdims' kernels take one query block per CTA whatever the setting). For A/B timing
// and tests; the environment's FA2_PERSISTENT_FWD_CTAS until set.
void set_persistent_forward_ctas(int ctas);
int persistent_forward_ctas();
// The CTAs of a persistent forward grid over `tiles` query blocks: at most one per SM (where CUDA can say) and at
// most persistent_forward_ctas() when that is > 0 (the launcher and fwd_workspace_ints both size it so).
int64_t persistent_forward_grid(int64_t tiles);
// The tail of a launch's tile order (tile_order.h) over `blocks` blocks per (batch, head) (heads: the grid's heads per
// batch, nheads unless given; the GQA-grouped backward's grid has nheads_k): tile_order_tail of the
// device's SMs where the blocks have causal lengths (a causal mask or a window bounded on the right only; not in
// deterministic mode, whose CTAs take their tiles in start order), else 0. Set by the launchers of the kernels that
// follow it: the sm_90a forward ones and the warp-specialized backward at d 128 / 256. set_tile_order_tail(false) (or
// FA2_NO_TILE_ORDER_TAIL=1 in the environment) makes it 0 everywhere: head by head, as before (A/B timing, tests).
int launch_tile_order_tail(const AttentionParams& params, int blocks, int heads = -1);
void set_tile_order_tail(bool enabled);
bool tile_order_tail_enabled();
// The persistent d 128 forward's clusters of two (fwd_kernel.cuh, kCluster: the pair's CTAs share each K/V tile's L2
// read through TMA multicast), where its calls allow them (fwd_launch_template.cuh): on by default;
// set_fwd_cluster(false) (or FA2_NO_FWD_CLUSTER=1 in the environment) runs those calls without (A/B timing, tests).
void set_fwd_cluster(bool enabled);
bool fwd_cluster_enabled();
// nullptr when batch and nheads fit the grid's y and z dimensions (at most 65535 each), else a message.
const char* check_grid_batch_heads(const char* what, int64_t batch, int64_t nheads);

// Ints of zeroed scratch (params.workspace) the forward can use: 1 where its persistent sm_90a kernel may run with
// a causal mask or a window (the tile-counter kernel: its CTAs take their next query block from a counter there; d
// 128, plain score path, more query blocks than the persistent grid's CTAs), else 0. Without it such calls run one
// CTA per query block. Measured (H200, d 128, bf16, causal, against one CTA per block, two rounds of
// scripts/fwd_variant_bench.cu: benchmarks/results/variants_h200-20261201-fwd-tile-counter-o16.json): +10.0 / +5.9 /
// +3.4 / +1.5 / +0.9% at S 1k / 2k / 4k / 8k / 16k (with O stored 4 bytes a lane: +3.5 / +1.1 / +0.8 / -0.3 / -0.6%).
int64_t fwd_workspace_ints(const AttentionParams& params);

// Forward: fills params.out and params.lse. params.workspace: nullptr, or fwd_workspace_ints(params) zeroed ints (a
// stale nonzero counter would make the persistent kernel skip query blocks).
// Needs params.headdim_rounded == fwd_headdim_rounded(params.headdim),
// headdim a multiple of 8, q/k/v/out 16-byte aligned with row/head/batch strides that are multiples of 8
// elements, seqlen_q, seqlen_k, batch, nheads >= 1 (the torch glue pads/copies and handles empty inputs).
// Picks the instance compiled for the current device's architecture.
const char* run_fwd(const AttentionParams& params, cudaStream_t stream);

}  // namespace fa2
