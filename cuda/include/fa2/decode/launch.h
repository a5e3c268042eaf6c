// Host entry points of the decode kernel: plain C++, no torch. run_decode returns nullptr on success, else a
// message; the launch is asynchronous on `stream` and never synchronizes the host.
#pragma once
#include <cuda_runtime_api.h>

#include "fa2/decode/params.h"
#include "fa2/decode/plan.h"

namespace fa2 {

// The instantiated decode headdim serving `headdim` (the smallest >= it), -1 if this build has none.
int decode_headdim_rounded(int headdim);

// The plan of a decode call on the current device (params as run_decode needs them, less the workspace).
DecodePlan plan_decode_call(const DecodeParams& params, int requested_splits);

// Fills params.out and params.lse as `plan` says. params.workspace: plan.workspace_floats floats (any content).
const char* run_decode(const DecodePlan& plan, const DecodeParams& params, cudaStream_t stream);

}  // namespace fa2
