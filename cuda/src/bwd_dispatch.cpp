// run_bwd: the backward's entry point; the instance table comes from the generated fa2_kernel_instances.h.
#include "dispatch.h"
#include "fa2/bwd/dq_fragment_order.h"
#include "fa2/bwd_launch.h"
#include "fa2_kernel_instances.h"

namespace fa2 {
namespace {
const InstanceDesc kBwdInstances[] = {FA2_BWD_INSTANCES(FA2_INSTANCE_DESC)};
const BwdInstanceFn kBwdInstanceFns[] = {FA2_BWD_INSTANCES(FA2_INSTANCE_FN)};
constexpr int kNumBwdInstances = sizeof(kBwdInstances) / sizeof(kBwdInstances[0]);
}  // namespace

int bwd_headdim_rounded(int headdim) { return plan_rounded_headdim(kBwdInstances, kNumBwdInstances, headdim); }

int64_t varlen_dq_block_rows(int64_t total_q, int64_t sequences, int headdim_rounded) {
  using Order = bwd::DqFragmentOrder;
  const char* error = nullptr;
  const bool blocks = process_dev_options(&error).varlen_dq_blocks && error == nullptr &&
                      headdim_rounded == Order::kCols && sequences > 0 && total_q >= Order::kRows * sequences;
  return blocks ? Order::varlen_rows(total_q, sequences) : 0;
}

const InstanceDesc* bwd_instances(int* count) {
  *count = kNumBwdInstances;
  return kBwdInstances;
}

BwdPlan plan_bwd_call(const AttentionParams& params, PlanBuffers buffers, PlanNotes* notes) {
  const char* error = nullptr;
  const DevOptions options = process_dev_options(&error);
  if (error != nullptr) {
    BwdPlan plan;
    plan.error = error;
    return plan;
  }
  return plan_bwd(params, current_device(), options, kBwdInstances, kNumBwdInstances, buffers, notes);
}

const char* run_bwd(const BwdPlan& plan, const AttentionParams& params, cudaStream_t stream, bool* needs_partials) {
  if (needs_partials != nullptr) *needs_partials = false;
  if (plan.error != nullptr) return plan.error;
  if (plan.instance < 0 || plan.instance >= kNumBwdInstances) return "fa2: a backward plan without an instance";
  return kBwdInstanceFns[plan.instance](plan, params, stream, needs_partials);
}

}  // namespace fa2
