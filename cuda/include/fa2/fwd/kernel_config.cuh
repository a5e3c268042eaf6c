// Which tile config and how many threads one forward kernel instance runs with (host and device).
#pragma once
#include "fa2/tile_config.h"

namespace fa2 {
namespace fwd {

// The tile config of one forward kernel: the wide shape for a warp-specialized one where fwd_wide_warp_specialized
// (tile_config.h; with ping-pong its three consumer warpgroups take turns in a ring), else the arch's shape.
template <int kHeadDim, int kArchTag, bool kWarpSpecialized>
using FwdKernelConfig =
    FwdTileConfig<kHeadDim, kArchTag == 901, kWarpSpecialized && fwd_wide_warp_specialized(kHeadDim)>;

template <int kHeadDim, int kArchTag, bool kWarpSpecialized>
constexpr int fwd_kernel_threads() {
  return FwdKernelConfig<kHeadDim, kArchTag, kWarpSpecialized>::kNThreads +
         (kWarpSpecialized ? kWsProducerThreads : 0);
}

}  // namespace fwd
}  // namespace fa2
