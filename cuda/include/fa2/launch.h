// Host entry points of the CUDA kernels: plain C++, no torch. Each returns nullptr on success, else a message
// (valid until the next call on this thread) that the caller turns into its own error (TORCH_CHECK in cpp/cuda/).
// Launches are asynchronous on `stream`; nothing here synchronizes the host.
//
// A call is planned (plan.h: which kernel, grid, shared memory, workspace, and why), the caller allocates what the
// plan names, and run_fwd / run_bwd (bwd_launch.h) launch the plan.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "fa2/dev_options.h"
#include "fa2/params.h"
#include "fa2/plan.h"

namespace fa2 {

// The current device as the plans need it (asked of CUDA once per device ordinal); cc 0 when CUDA cannot say.
DeviceDesc current_device();

// The instantiated forward headdim that serves a (multiple-of-8) headdim: the smallest instantiated one >= headdim,
// or -1 when this build has none (FA2_HEADDIMS).
int fwd_headdim_rounded(int headdim);
// This build's forward instances (the generated fa2_kernel_instances.h).
const InstanceDesc* fwd_instances(int* count);

// The plan of a forward call on the current device with the process's development options (dev_options.h);
// plan.error says what is wrong, if anything. Needs params as run_fwd does, less the workspace (buffers kDecide).
FwdPlan plan_fwd_call(const AttentionParams& params, PlanBuffers buffers = PlanBuffers::kDecide,
                      PlanNotes* notes = nullptr);

// Forward: fills params.out and params.lse as `plan` says (plan_fwd_call of the same params). params.workspace:
// plan.workspace_ints zeroed ints (a stale nonzero counter would make the persistent kernel skip query blocks), or
// nullptr where that is 0. Needs params.headdim_rounded == fwd_headdim_rounded(params.headdim), headdim a multiple
// of 8, q/k/v/out 16-byte aligned with row/head/batch strides that are multiples of 8 elements, seqlen_q, seqlen_k,
// batch, nheads >= 1 (the torch glue pads/copies and handles empty inputs).
const char* run_fwd(const FwdPlan& plan, const AttentionParams& params, cudaStream_t stream);

// How many clusters of `config`'s CTAs (its block, dynamic shared memory and cluster attribute) of `kernel` (its
// shared memory limit already raised) the current device runs at once, 0 if none or CUDA cannot say. Cached per
// device once CUDA answers: its one caller's kernels all have one launch shape (the d 128 forward's clusters of two).
int max_active_cluster_pairs(const void* kernel, const cudaLaunchConfig_t& config);

}  // namespace fa2
