// Host side of one forward instance (dtype, headdim, arch): picks the kernel variant, sizes the grid, launches.
// Included only by the generated instance files (build/.../generated/fwd_*.cu).
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <type_traits>

#include "fa2/fwd_kernel.cuh"
#include "fa2/launch.h"  // sm90_schedule
#include "fa2/params.h"
#include "fa2/tile_config.h"

namespace fa2 {

using FwdKernel = void (*)(const AttentionParams, const sm90::FwdTensorMaps);

// A launch of `grid` CTAs of `threads` in clusters of two along x (fwd_kernel.cuh, kCluster); `cluster` receives the
// attribute the config points at.
inline cudaLaunchConfig_t cluster_of_two_config(dim3 grid, int threads, int smem, cudaStream_t stream,
                                                cudaLaunchAttribute* cluster) {
  cluster->id = cudaLaunchAttributeClusterDimension;
  cluster->val.clusterDim.x = 2, cluster->val.clusterDim.y = 1, cluster->val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = size_t(smem);
  config.stream = stream;
  config.attrs = cluster;
  config.numAttrs = 1;
  return config;
}

// The kernel of one score path for the bias element type (nullptr for a combination that does not exist).
template <typename T, int kHeadDim, int kArch, fwd::ScoreMode kMode>
FwdKernel fwd_kernel_for_bias(BiasType bias_type) {
  switch (bias_type) {
    case BiasType::kNone:
      if constexpr (kMode == fwd::ScoreMode::kPlain || kMode == fwd::ScoreMode::kGeneral) {
        return &fwd::fwd_kernel<T, kHeadDim, kArch, kMode, BiasType::kNone>;
      }
      return nullptr;
    case BiasType::kSameAsInput:
    case BiasType::kFloat32:
    case BiasType::kBool:
      if constexpr (kMode != fwd::ScoreMode::kPlain) {
        if (bias_type == BiasType::kSameAsInput) {
          return &fwd::fwd_kernel<T, kHeadDim, kArch, kMode, BiasType::kSameAsInput>;
        }
        if (bias_type == BiasType::kFloat32) return &fwd::fwd_kernel<T, kHeadDim, kArch, kMode, BiasType::kFloat32>;
        return &fwd::fwd_kernel<T, kHeadDim, kArch, kMode, BiasType::kBool>;
      }
      return nullptr;
  }
  return nullptr;
}

// A kernel and what its launch needs from its tile config (fwd::FwdKernelConfig).
struct FwdLaunch {
  FwdKernel kernel;
  int threads, smem, block_m;
  bool persistent;  // warp-specialized: a 1-D grid of tiles, persistent where it pays (run_fwd_instance)
  // the same kernel with persistent CTAs claiming tiles from a counter (fwd_kernel.cuh, kTileCounter), or nullptr
  FwdKernel tile_counter_kernel = nullptr;
  // the same kernel in clusters of two sharing K/V loads (fwd_kernel.cuh, kCluster), or nullptr
  FwdKernel cluster_kernel = nullptr;
};

// The warp-specialized sm_90a kernel with schedule kSchedule (not kPipelined) for one score path and bias type (and
// with kWithTileCounter its tile-counter twin, with kWithCluster its twin in clusters of two).
template <typename T, int kHeadDim, int kArch, fwd::ScoreMode kMode, BiasType kBias, Sm90Schedule kSchedule,
          bool kWithTileCounter = false, bool kWithCluster = false>
FwdLaunch ws_launch() {
  static_assert(kSchedule != Sm90Schedule::kAuto && kSchedule != Sm90Schedule::kPipelined);
  constexpr bool kPingpong = sm90_schedule_pingpong(kSchedule);
  using Cfg = fwd::FwdKernelConfig<kHeadDim, kArch, /*kWarpSpecialized=*/true, kPingpong>;
  static_assert(Cfg::kBlockN == FwdTileConfig<kHeadDim, true>::kBlockN, "K/V tensor maps of the instance's key tile");
  // (one CTA per SM: its setmaxnreg split takes the whole register file, ws_consumer_regs)
  static_assert(kWsProducerThreads * kWsProducerRegs + Cfg::kNThreads * ws_consumer_regs(Cfg::kNThreads) >
                    32 * 1024, "a persistent grid of one CTA per SM");
  constexpr bool kOverlap = sm90_schedule_overlap(kSchedule);
  FwdKernel tile_counter_kernel = nullptr;
  if constexpr (kWithTileCounter) {
    tile_counter_kernel = &fwd::fwd_kernel<T, kHeadDim, kArch, kMode, kBias, true, kPingpong, kOverlap, true>;
  }
  FwdKernel cluster_kernel = nullptr;
  if constexpr (kWithCluster) {
    cluster_kernel = &fwd::fwd_kernel<T, kHeadDim, kArch, kMode, kBias, true, kPingpong, kOverlap, false, true>;
  }
  return {&fwd::fwd_kernel<T, kHeadDim, kArch, kMode, kBias, /*kWarpSpecialized=*/true, kPingpong, kOverlap>,
          fwd::fwd_kernel_threads<kHeadDim, kArch, true, kPingpong>(), Cfg::kSmemBytesWs, Cfg::kBlockM, true,
          tile_counter_kernel, cluster_kernel};
}

// The same for a key-row bias (padding masks) of the given element type; `launch` is left as it is without a bias.
template <typename T, int kHeadDim, int kArch, Sm90Schedule kSchedule>
void use_key_bias_ws_launch(BiasType bias_type, FwdLaunch& launch) {
  constexpr fwd::ScoreMode kKeyBias = fwd::ScoreMode::kKeyBiasFold;
  switch (bias_type) {
    case BiasType::kSameAsInput:
      launch = ws_launch<T, kHeadDim, kArch, kKeyBias, BiasType::kSameAsInput, kSchedule>();
      break;
    case BiasType::kFloat32:
      launch = ws_launch<T, kHeadDim, kArch, kKeyBias, BiasType::kFloat32, kSchedule>();
      break;
    case BiasType::kBool:
      launch = ws_launch<T, kHeadDim, kArch, kKeyBias, BiasType::kBool, kSchedule>();
      break;
    case BiasType::kNone:
      break;
  }
}

template <typename T, int kHeadDim, int kArch>
const char* run_fwd_instance(const AttentionParams& p, cudaStream_t stream) {
  using Cfg = FwdTileConfig<kHeadDim, /*kWgmma=*/kArch == 901>;  // the non-warp-specialized kernels' (fwd_kernel.cuh)
  // Score path (fwd_kernel.cuh, ScoreMode): plain / bias folded into the S accumulator (a key-row bias or one that
  // varies along queries) / general (softcap, scale <= 0), times the bias element type: eleven variants per
  // instance; sm_90a adds the warp-specialized ones (plain: three schedules; key-row bias: the default schedule, or
  // at d <= 64 the wide warp-specialized one).
  using fwd::ScoreMode;
  FwdLaunch launch{nullptr, Cfg::kNThreads, Cfg::kSmemBytes, Cfg::kBlockM, false};
  const bool general = p.softcap > 0.f || !(p.scale > 0.f);  // ScoreMode::kGeneral
  const bool plain = !general && p.bias_type == BiasType::kNone;
  // sm_90a: the schedule of the key loop (tile_config.h, Sm90Schedule): each headdim's default unless
  // set_sm90_schedule / FA2_SM90_SCHEDULE forces one. Warp-specialized kernels serve the plain path (every schedule)
  // and a key-row bias (the headdim's sm90_key_bias_schedule only: fewer instantiations; at d <= 64, whose default is
  // pipelined, also the wide warp-specialized kernel: by default at d 64 from kWideKeyBiasMinKeys keys
  // (tile_config.h), and whenever "ws" is forced); the rest runs pipelined.
  // (kDefault: the default of causal / windowed calls, the one the tile-counter and key-bias kernels are built for;
  // calls that no causal mask or window bounds may default to another, sm90_default_schedule)
  // Every query block sees the same key range: no causal mask or window (causal is folded into window_right). Picks
  // d 128's default schedule here and whether the persistent grid applies by default (below).
  const bool equal_blocks = p.window_left < 0 && p.window_right < 0;
  constexpr bool kTma = kArch == 901 && FA2_SM90_TMA;
  constexpr Sm90Schedule kDefault =
      kTma ? sm90_default_schedule(kHeadDim, /*windowed=*/true) : Sm90Schedule::kPipelined;
  Sm90Schedule schedule = kDefault;
  bool schedule_forced = false;
  if constexpr (kTma) {
    if (const char* e = sm90_schedule(&schedule)) return e;
    schedule_forced = schedule != Sm90Schedule::kAuto;
    if (!schedule_forced) schedule = sm90_default_schedule(kHeadDim, /*windowed=*/!equal_blocks);
  }
  // a bias with one value per key (padding masks): its own variant; on sm_90a its key tiles are loaded by the TMA,
  // which needs 16-byte aligned rows (else the general bias-fold variant reads it)
  const bool key_row_bias = !general && p.bias_type != BiasType::kNone && p.bias_row_stride == 0 &&
                            (!kTma || bias_rows_tma_loadable(p));
  if constexpr (kTma) {
    constexpr ScoreMode kPlain = ScoreMode::kPlain;
    if (plain && schedule != Sm90Schedule::kPipelined) {
      if (schedule == Sm90Schedule::kPingpong) {
        launch = ws_launch<T, kHeadDim, kArch, kPlain, BiasType::kNone, Sm90Schedule::kPingpong>();
      } else if (schedule == Sm90Schedule::kOverlap) {
        launch = ws_launch<T, kHeadDim, kArch, kPlain, BiasType::kNone, Sm90Schedule::kOverlap, false,
                           fwd_cluster_headdim(kHeadDim)>();
      } else if (schedule == Sm90Schedule::kPingpongOverlap) {
        // (with the tile-counter kernel for causal / windowed calls at the persistent headdims: the plain path at
        // the default schedule only, for fewer instantiations)
        launch = ws_launch<T, kHeadDim, kArch, kPlain, BiasType::kNone, Sm90Schedule::kPingpongOverlap,
                           fwd_persistent_headdim(kHeadDim) && kDefault == Sm90Schedule::kPingpongOverlap>();
      } else {
        launch = ws_launch<T, kHeadDim, kArch, kPlain, BiasType::kNone, Sm90Schedule::kWarpSpecialized>();
      }
    } else if (key_row_bias && (schedule != Sm90Schedule::kPipelined || !schedule_forced)) {
      if constexpr (kDefault != Sm90Schedule::kPipelined) {
        use_key_bias_ws_launch<T, kHeadDim, kArch, sm90_key_bias_schedule(kHeadDim)>(p.bias_type, launch);
      } else if constexpr (fwd_wide_warp_specialized(kHeadDim)) {
        if (schedule == Sm90Schedule::kWarpSpecialized ||
            (!schedule_forced && fwd_wide_key_bias_by_default(kHeadDim, p.seqlen_k))) {
          use_key_bias_ws_launch<T, kHeadDim, kArch, Sm90Schedule::kWarpSpecialized>(p.bias_type, launch);
        }
      }
    }
  }
  if (launch.kernel != nullptr) {
    // warp-specialized (above)
  } else if (general) {
    launch.kernel = fwd_kernel_for_bias<T, kHeadDim, kArch, ScoreMode::kGeneral>(p.bias_type);
  } else if (plain) {
    launch.kernel = fwd_kernel_for_bias<T, kHeadDim, kArch, ScoreMode::kPlain>(p.bias_type);
  } else if (key_row_bias) {
    launch.kernel = fwd_kernel_for_bias<T, kHeadDim, kArch, ScoreMode::kKeyBiasFold>(p.bias_type);
  } else {
    launch.kernel = fwd_kernel_for_bias<T, kHeadDim, kArch, ScoreMode::kBiasFold>(p.bias_type);
  }
  if (launch.kernel == nullptr) return "fa2: unknown bias type";
  const int num_m_blocks = (p.seqlen_q + launch.block_m - 1) / launch.block_m;
  if (const char* e = check_grid_batch_heads("forward", p.batch, p.nheads)) return e;
  dim3 grid(num_m_blocks, p.nheads, p.batch);
  bool use_tile_counter = false;  // (the kernel claims tiles from p.workspace only where this launch needs it)
  bool persistent_grid = false;   // fewer CTAs than tiles
  if (launch.persistent) {  // a 1-D grid over the tiles of fwd_kernel.cuh's order; CTA b takes tiles b, b + grid, ...
    // (or, with the tile counter, b and then the next unclaimed tile)
    const int64_t tiles = int64_t(num_m_blocks) * p.nheads * p.batch;
    // (<= 2^30 - 1: the kernel's tile index plus the grid stride stays an int; unreachable in memory at d >= 64)
    if (tiles > 0x3fffffff) return "fa2: batch * nheads * query blocks is too large for the CUDA forward";
    const int setting = persistent_forward_ctas();
    int64_t ctas = tiles;
    // Persistent (fewer CTAs than tiles) by default only where every query block has the same key range (no causal
    // mask or window; causal is folded into window_right): blocks of unequal length would leave some CTAs with far
    // more work (causal, H200 d 128 S 16k: 0.70x of one CTA per block, which the hardware's block scheduling
    // balances); and only at the headdims where it was measured faster (tile_config.h, fwd_persistent_headdim: the
    // others' kernels take one tile per CTA). A cap set for tests applies to every call at those headdims.
    // With a zeroed int of workspace (fwd_workspace_ints) and a tile-counter kernel, the CTAs take the next block
    // from a counter there instead (fwd_kernel.cuh), which balances blocks of unequal length as the hardware's block
    // scheduling would.
    const bool tile_counter = p.workspace != nullptr && launch.tile_counter_kernel != nullptr;
    if (fwd_persistent_headdim(kHeadDim) && (setting > 0 || (setting < 0 && (equal_blocks || tile_counter)))) {
      ctas = persistent_forward_grid(tiles);
      use_tile_counter = tile_counter && ctas < tiles;
      if (use_tile_counter) launch.kernel = launch.tile_counter_kernel;
    }
    grid = dim3(unsigned(ctas));
    persistent_grid = ctas < tiles;
  }
  // Clusters of two (fwd_kernel.cuh, kCluster) where every pair of CTAs takes two query blocks of one head with the
  // same keys: consecutive tiles of the head-major order (no causal mask or window, so no tail: tile_order.h) with an
  // even number of query blocks per head, an even grid (both CTAs then take as many tiles), no tile counter.
  bool use_cluster = launch.cluster_kernel != nullptr && equal_blocks && !use_tile_counter && num_m_blocks % 2 == 0 &&
                     grid.x >= 2 && fwd_cluster_enabled();
  cudaError_t err = cudaSuccess;
  if (launch.smem > 48 * 1024) {
    if (const char* e = check_dynamic_smem("forward", kHeadDim, launch.smem)) return e;
    err = cudaFuncSetAttribute(launch.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, launch.smem);
    if (err != cudaSuccess) return cudaGetErrorString(err);
    if (use_cluster &&
        cudaFuncSetAttribute(launch.cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, launch.smem) !=
            cudaSuccess) {
      (void)cudaGetLastError();  // (the call runs without clusters)
      use_cluster = false;
    }
  }
  if (use_cluster) {
    // none at once: without clusters; a persistent grid: at most the pairs that run at once (the GPCs' SMs need not
    // pair up, and a persistent CTA must not wait for a slot), rounded down to pairs; one tile per CTA keeps its grid
    // (the tile count, even here)
    cudaLaunchAttribute cluster;
    const int pairs = max_active_cluster_pairs(
        reinterpret_cast<const void*>(launch.cluster_kernel),
        cluster_of_two_config(dim3(2), launch.threads, launch.smem, nullptr, &cluster));
    use_cluster = pairs > 0;
    if (use_cluster && persistent_grid) grid.x = std::min(grid.x & ~1u, 2u * unsigned(pairs));
  }
  sm90::FwdTensorMaps maps{};  // the TMA's view of q, k, v (sm_90a instances that load with it)
  if constexpr (kTma) {
    const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
    const char* e = sm90::make_bshd_tensor_map(&maps.q, p.q, bf16, p.batch, p.seqlen_q, p.nheads, p.headdim,
                                               p.q_batch_stride, p.q_row_stride, p.q_head_stride, launch.block_m,
                                               Cfg::kSmemBlockCols);
    if (e == nullptr) {
      e = sm90::make_bshd_tensor_map(&maps.k, p.k, bf16, p.batch, p.seqlen_k, p.nheads_k, p.headdim, p.k_batch_stride,
                                     p.k_row_stride, p.k_head_stride, Cfg::kBlockN, Cfg::kSmemBlockCols);
    }
    if (e == nullptr) {
      e = sm90::make_bshd_tensor_map(&maps.v, p.v, bf16, p.batch, p.seqlen_k, p.nheads_k, p.headdim, p.v_batch_stride,
                                     p.v_row_stride, p.v_head_stride, Cfg::kBlockN, Cfg::kSmemBlockCols);
    }
    if (e == nullptr && key_row_bias) {
      e = sm90::make_key_bias_tensor_map(&maps.bias, p.bias, bias_element_bytes(p.bias_type), bf16, p.batch, p.nheads,
                                         p.seqlen_k, p.bias_batch_stride, p.bias_head_stride, Cfg::kBlockN);
    }
    if (e != nullptr) return e;
  }
  AttentionParams kernel_params = p;  // with the values derived for the kernel (params.h)
  kernel_params.workspace = use_tile_counter ? p.workspace : nullptr;
  kernel_params.inv_scale = 1.f / p.scale;
  kernel_params.heavy_score = -kHeavyRowLog2 / p.scale_log2;
  // (tile_order.h; the sm80-path kernels keep blockIdx's order: fwd_kernel.cuh)
  kernel_params.tile_order_tail = kArch == 901 ? launch_tile_order_tail(p, num_m_blocks) : 0;
  if (use_cluster) {
    cudaLaunchAttribute cluster;
    const cudaLaunchConfig_t config = cluster_of_two_config(grid, launch.threads, launch.smem, stream, &cluster);
    err = cudaLaunchKernelEx(&config, launch.cluster_kernel, kernel_params, maps);
    const cudaError_t last = cudaGetLastError();  // (cleared, as the <<<>>> path's check clears it)
    if (err == cudaSuccess) err = last;
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
  }
  launch.kernel<<<grid, launch.threads, launch.smem, stream>>>(kernel_params, maps);
  err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace fa2
