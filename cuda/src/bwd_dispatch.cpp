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

int64_t bwd_workspace_ints(const AttentionParams& p) {
  if (!p.deterministic) {  // the finished-CTA counts (params.h, key_blocks_done) where the headdim overlaps
    return bwd_ws_overlaps_dq_conversion_at(p.headdim_rounded) ? int64_t(p.batch) * p.nheads : 0;
  }
  const int64_t block_m = bwd_min_block_m(p.headdim_rounded);  // (whichever tiles run: bwd_launch_template.cuh)
  const int64_t num_m_blocks = (p.seqlen_q + block_m - 1) / block_m;
  return 1 + int64_t(p.batch) * p.nheads * num_m_blocks;
}

const char* run_bwd(const AttentionParams& params, cudaStream_t stream) {
  // the sm_90a (wgmma) instances only when switched on (bwd_launch.h), else the sm80-path ones where built
  return dispatch_instance("backward", kBwdInstances, kNumBwdInstances, params, stream, sm90_backward());
}

}  // namespace fa2
