// run_fwd: the forward's entry point; the instance table comes from the generated fa2_kernel_instances.h.
#include "dispatch.h"
#include "fa2/launch.h"
#include "fa2_kernel_instances.h"

namespace fa2 {
namespace {
const InstanceEntry kFwdInstances[] = {FA2_FWD_INSTANCES(FA2_INSTANCE_ENTRY)};
constexpr int kNumFwdInstances = sizeof(kFwdInstances) / sizeof(kFwdInstances[0]);
}  // namespace

int fwd_headdim_rounded(int headdim) { return rounded_headdim(kFwdInstances, kNumFwdInstances, headdim); }

const char* run_fwd(const AttentionParams& params, cudaStream_t stream) {
  return dispatch_instance("forward", kFwdInstances, kNumFwdInstances, params, stream);
}

}  // namespace fa2
