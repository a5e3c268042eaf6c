// Choosing the compiled instance for a call: (dtype, headdim_rounded) from the params, arch from the current
// device. Shared by every direction's dispatch (fwd_dispatch.cpp, ...); host-only C++.
#pragma once
#include <cuda_runtime_api.h>

#include "fa2/params.h"

namespace fa2 {

using InstanceFn = const char* (*)(const AttentionParams&, cudaStream_t);

struct InstanceEntry {
  InstanceFn fn;
  DType dtype;
  int headdim;
  int arch;            // compute capability the SASS was built for, as 80, 86, 90
  bool arch_specific;  // built for sm_XXa (e.g. 90a: wgmma): runs on exactly that compute capability
};
#define FA2_INSTANCE_ENTRY(name, dtype, headdim, arch, arch_specific) \
  InstanceEntry{&name, dtype, headdim, arch, arch_specific != 0},

// Runs the instance for (p.dtype, p.headdim_rounded) whose SASS runs on the current device (same major
// compute capability, minor <= the device's; an arch-specific build only on its exact compute capability),
// preferring an arch-specific one (or, with prefer_arch_specific false, one that is not, as long as there is one),
// then the highest. nullptr on success, else a message.
const char* dispatch_instance(const char* direction, const InstanceEntry* entries, int num_entries,
                              const AttentionParams& p, cudaStream_t stream, bool prefer_arch_specific = true);

// The smallest instantiated headdim >= headdim, or -1.
int rounded_headdim(const InstanceEntry* entries, int num_entries, int headdim);

}  // namespace fa2
