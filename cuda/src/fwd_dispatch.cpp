// run_fwd: the forward's entry point; the instance table comes from the generated fa2_kernel_instances.h.
#include "dispatch.h"
#include "fa2/launch.h"
#include "fa2/tile_config.h"
#include "fa2_kernel_instances.h"

namespace fa2 {
namespace {
const InstanceEntry kFwdInstances[] = {FA2_FWD_INSTANCES(FA2_INSTANCE_ENTRY)};
constexpr int kNumFwdInstances = sizeof(kFwdInstances) / sizeof(kFwdInstances[0]);
}  // namespace

int fwd_headdim_rounded(int headdim) { return rounded_headdim(kFwdInstances, kNumFwdInstances, headdim); }

int64_t fwd_workspace_ints(const AttentionParams& p) {
  const bool equal_blocks = p.window_left < 0 && p.window_right < 0;  // (as run_fwd_instance's)
  // The tile-counter kernels are sm_90a's, on the plain score path (no bias, softcap or scale <= 0). (The int goes
  // unused where a forced schedule (set_sm90_schedule) or arch-specific kernels switched off pick another kernel.)
  const bool plain = p.bias_type == BiasType::kNone && !(p.softcap > 0.f) && p.scale > 0.f;
  if (equal_blocks || !plain || !fwd_persistent_headdim(p.headdim_rounded) || device_cc_major() != 9) return 0;
  // only where the persistent grid (one CTA per SM, or the cap of set_persistent_forward_ctas) has fewer CTAs than
  // tiles (the warp-specialized tile's rows)
  const int64_t block_m = FwdTileConfig<128, /*kWgmma=*/true>::kBlockM;
  static_assert(fwd_persistent_headdim(128), "the persistent headdims' tile");
  const int64_t tiles = (p.seqlen_q + block_m - 1) / block_m * p.nheads * p.batch;
  return persistent_forward_ctas() != 0 && persistent_forward_grid(tiles) < tiles ? 1 : 0;
}

const char* run_fwd(const AttentionParams& params, cudaStream_t stream) {
  return dispatch_instance("forward", kFwdInstances, kNumFwdInstances, params, stream);
}

}  // namespace fa2
