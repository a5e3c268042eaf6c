// run_bwd: the backward's entry point; the instance table comes from the generated fa2_kernel_instances.h.
#include "dispatch.h"
#include "fa2/bwd_launch.h"
#include "fa2/bwd_tile_config.h"
#include "fa2_kernel_instances.h"

namespace fa2 {
namespace {
const InstanceEntry kBwdInstances[] = {FA2_BWD_INSTANCES(FA2_INSTANCE_ENTRY)};
constexpr int kNumBwdInstances = sizeof(kBwdInstances) / sizeof(kBwdInstances[0]);
}  // namespace

int bwd_headdim_rounded(int headdim) { return rounded_headdim(kBwdInstances, kNumBwdInstances, headdim); }

const char* run_bwd(const AttentionParams& params, cudaStream_t stream) {
  // the sm_90a (wgmma) instances only when switched on (bwd_launch.h), else the sm80-path ones where built
  return dispatch_instance("backward", kBwdInstances, kNumBwdInstances, params, stream, sm90_backward());
}

}  // namespace fa2
