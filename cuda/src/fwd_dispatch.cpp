// run_fwd: the forward's entry point; the instance table comes from the generated fa2_kernel_instances.h.
#include "dispatch.h"
#include "fa2/launch.h"
#include "fa2_kernel_instances.h"

namespace fa2 {
namespace {
const InstanceDesc kFwdInstances[] = {FA2_FWD_INSTANCES(FA2_INSTANCE_DESC)};
const FwdInstanceFn kFwdInstanceFns[] = {FA2_FWD_INSTANCES(FA2_INSTANCE_FN)};
constexpr int kNumFwdInstances = sizeof(kFwdInstances) / sizeof(kFwdInstances[0]);
}  // namespace

int fwd_headdim_rounded(int headdim) { return plan_rounded_headdim(kFwdInstances, kNumFwdInstances, headdim); }

const InstanceDesc* fwd_instances(int* count) {
  *count = kNumFwdInstances;
  return kFwdInstances;
}

FwdPlan plan_fwd_call(const AttentionParams& params, PlanBuffers buffers, PlanNotes* notes) {
  const char* error = nullptr;
  const DevOptions options = process_dev_options(&error);
  if (error != nullptr) {
    FwdPlan plan;
    plan.error = error;
    return plan;
  }
  return plan_fwd(params, current_device(), options, kFwdInstances, kNumFwdInstances, buffers, notes);
}

const char* run_fwd(const FwdPlan& plan, const AttentionParams& params, cudaStream_t stream) {
  if (plan.error != nullptr) return plan.error;
  if (plan.instance < 0 || plan.instance >= kNumFwdInstances) return "fa2: a forward plan without an instance";
  return kFwdInstanceFns[plan.instance](plan, params, stream);
}

}  // namespace fa2
