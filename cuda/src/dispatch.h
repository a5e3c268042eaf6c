// The compiled instances of one direction (the generated fa2_kernel_instances.h) as a plan sees them
// (InstanceDesc) and as the launcher calls them; host-only C++.
#pragma once
#include <cuda_runtime_api.h>

#include "fa2/plan.h"

namespace fa2 {

using FwdInstanceFn = const char* (*)(const FwdPlan&, const AttentionParams&, cudaStream_t);
using BwdInstanceFn = const char* (*)(const BwdPlan&, const AttentionParams&, cudaStream_t, bool*);

#define FA2_INSTANCE_DESC(name, dtype, headdim, arch, arch_specific) InstanceDesc{dtype, headdim, arch, arch_specific != 0},
#define FA2_INSTANCE_FN(name, dtype, headdim, arch, arch_specific) &name,

// The options of this process, or (*error) what FA2_DEV_OPTIONS got wrong.
DevOptions process_dev_options(const char** error);

}  // namespace fa2
