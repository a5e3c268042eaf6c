// Host side of one forward instance (dtype, headdim, arch): runs the kernel a plan (plan.h) names with the plan's
// grid and shared memory. Included only by the generated instance files (build/.../generated/fwd_*.cu) and the
// kernel harness.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <numeric>
#include <type_traits>

#include "fa2/fwd_kernel.cuh"
#include "fa2/launch.h"
#include "fa2/plan.h"
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

// The varlen kernel of a score path (plain or general: no bias), the sm80 path's (fwd_kernel.cuh, kVarlen), or nullptr.
// (kArch: 800, 860, 900: its sm80-path tag, also where an sm_90a instance carries it)
template <typename T, int kHeadDim, int kArch>
FwdKernel fwd_varlen_kernel(FwdScore score) {
  using fwd::ScoreMode;
  constexpr BiasType kNone = BiasType::kNone;
  static_assert(kArch % 10 == 0, "varlen runs the sm80 path's kernels");
  if (score == FwdScore::kPlain) {
    return &fwd::fwd_kernel<T, kHeadDim, kArch, ScoreMode::kPlain, kNone, false, false, false, false, false, true>;
  }
  if (score == FwdScore::kGeneral) {
    return &fwd::fwd_kernel<T, kHeadDim, kArch, ScoreMode::kGeneral, kNone, false, false, false, false, false, true>;
  }
  return nullptr;
}

// The dropout kernel (fwd_kernel.cuh, kDropout) of a plan: plain (no bias) or general (any bias, softcap), padded or
// varlen (no bias), or nullptr. kArch: 800, 860, 900 (the sm80 path's, as fwd_varlen_kernel's) or 901 (the pipelined
// sm_90a kernels, TMA loads).
template <typename T, int kHeadDim, int kArch>
FwdKernel fwd_dropout_kernel(const FwdPlan& plan) {
  using fwd::ScoreMode;
  static_assert(kArch % 10 == 0 || (kArch == 901 && FA2_SM90_TMA), "dropout: the sm80 path's or pipelined kernels");
  constexpr ScoreMode kPlain = ScoreMode::kPlain, kGeneral = ScoreMode::kGeneral;
  constexpr bool kDropout = true;
  if (plan.varlen) {
    if (plan.score == FwdScore::kPlain) {
      return &fwd::fwd_kernel<T, kHeadDim, kArch, kPlain, BiasType::kNone, false, false, false, false, false, true,
                              kDropout>;
    }
    if (plan.score == FwdScore::kGeneral) {
      return &fwd::fwd_kernel<T, kHeadDim, kArch, kGeneral, BiasType::kNone, false, false, false, false, false, true,
                              kDropout>;
    }
    return nullptr;
  }
  if (plan.score == FwdScore::kPlain) {
    return &fwd::fwd_kernel<T, kHeadDim, kArch, kPlain, BiasType::kNone, false, false, false, false, false, false,
                            kDropout>;
  }
  if (plan.score != FwdScore::kGeneral) return nullptr;
  switch (plan.bias) {
    case BiasType::kNone:
      return &fwd::fwd_kernel<T, kHeadDim, kArch, kGeneral, BiasType::kNone, false, false, false, false, false, false,
                              kDropout>;
    case BiasType::kSameAsInput:
      return &fwd::fwd_kernel<T, kHeadDim, kArch, kGeneral, BiasType::kSameAsInput, false, false, false, false, false,
                              false, kDropout>;
    case BiasType::kFloat32:
      return &fwd::fwd_kernel<T, kHeadDim, kArch, kGeneral, BiasType::kFloat32, false, false, false, false, false,
                              false, kDropout>;
    case BiasType::kBool:
      return &fwd::fwd_kernel<T, kHeadDim, kArch, kGeneral, BiasType::kBool, false, false, false, false, false, false,
                              kDropout>;
  }
  return nullptr;
}

// A kernel and what its launch needs from its tile config (fwd::FwdKernelConfig).
struct FwdLaunch {
  FwdKernel kernel;
  int threads, smem, block_m;
  bool persistent;  // warp-specialized: a 1-D grid of tiles (persistent where the plan says)
  // the same kernel with persistent CTAs claiming tiles from a counter (fwd_kernel.cuh, kTileCounter), or nullptr
  FwdKernel tile_counter_kernel = nullptr;
  // the same kernel in clusters of two sharing K/V loads (fwd_kernel.cuh, kCluster), or nullptr
  FwdKernel cluster_kernel = nullptr;
};

// The warp-specialized sm_90a kernel with schedule kSchedule (not kPipelined) for one score path and bias type (and
// with kWithTileCounter its tile-counter twin, with kWithCluster its twin in clusters of two).
// kVarlen: the packed-sequence kernels (no cluster twin); kPagedKV: their twin over a paged cache (no tile counter).
template <typename T, int kHeadDim, int kArch, fwd::ScoreMode kMode, BiasType kBias, Sm90Schedule kSchedule,
          bool kWithTileCounter = false, bool kWithCluster = false, bool kVarlen = false, bool kPagedKV = false>
FwdLaunch ws_launch() {
  static_assert(kSchedule != Sm90Schedule::kAuto && kSchedule != Sm90Schedule::kPipelined);
  constexpr bool kPingpong = sm90_schedule_pingpong(kSchedule);
  using Cfg = fwd::FwdKernelConfig<kHeadDim, kArch, /*kWarpSpecialized=*/true>;
  static_assert(Cfg::kBlockN == FwdTileConfig<kHeadDim, true>::kBlockN, "K/V tensor maps of the instance's key tile");
  // (one CTA per SM: its setmaxnreg split takes the whole register file, ws_consumer_regs)
  static_assert(kWsProducerThreads * kWsProducerRegs + Cfg::kNThreads * ws_consumer_regs(Cfg::kNThreads) >
                    32 * 1024, "a persistent grid of one CTA per SM");
  constexpr bool kOverlap = sm90_schedule_overlap(kSchedule);
  FwdKernel tile_counter_kernel = nullptr;
  if constexpr (kWithTileCounter) {
    tile_counter_kernel =
        &fwd::fwd_kernel<T, kHeadDim, kArch, kMode, kBias, true, kPingpong, kOverlap, true, false, kVarlen>;
  }
  FwdKernel cluster_kernel = nullptr;
  static_assert(!(kWithCluster && kVarlen), "no varlen clusters");
  if constexpr (kWithCluster) {
    cluster_kernel = &fwd::fwd_kernel<T, kHeadDim, kArch, kMode, kBias, true, kPingpong, kOverlap, false, true>;
  }
  static_assert(!(kWithTileCounter && kPagedKV), "no paged tile-counter twin");
  return {&fwd::fwd_kernel<T, kHeadDim, kArch, kMode, kBias, /*kWarpSpecialized=*/true, kPingpong, kOverlap, false,
                           false, kVarlen, /*kDropout=*/false, kPagedKV>,
          fwd::fwd_kernel_threads<kHeadDim, kArch, true>(), Cfg::kSmemBytesWs, Cfg::kBlockM, true,
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

// The sm_90a varlen kernels (TMA loads over the packed tensors, kVarlen) a plan names: each headdim's default
// warp-specialized schedules on the plain path (with and without a causal mask or window; the tile-counter twin where
// the dense kernels have it; d 64's wide overlap kernel for long sequences), else the pipelined kernel, plain or
// general (softcap). No bias, no clusters, no forced schedule (plan.cpp: sm90_schedule_for_keys of the mean sequence
// length). A paged cache (plan.paged): the pipelined kernels, and the windowed schedule's warp-specialized twin with
// kPagedKV (plan.cpp, choose_fwd_kernel). launch.kernel nullptr for anything else.
template <typename T, int kHeadDim, int kArch>
FwdLaunch fwd_varlen_tma_launch(const FwdPlan& plan) {
  using Cfg = FwdTileConfig<kHeadDim, /*kWgmma=*/true>;
  using fwd::ScoreMode;
  constexpr BiasType kNone = BiasType::kNone;
  FwdLaunch launch{nullptr, Cfg::kNThreads, Cfg::kSmemBytes, Cfg::kBlockM, false};
  constexpr Sm90Schedule kWindowed = sm90_default_schedule(kHeadDim, /*windowed=*/true);
  constexpr Sm90Schedule kEqual = sm90_default_schedule(kHeadDim, /*windowed=*/false);
  if (plan.warp_specialized && plan.paged) {
    if constexpr (kWindowed != Sm90Schedule::kPipelined) {
      if (plan.score == FwdScore::kPlain && plan.schedule == kWindowed && !plan.tile_counter) {
        return ws_launch<T, kHeadDim, kArch, ScoreMode::kPlain, kNone, kWindowed, false, false, true, true>();
      }
    }
    return launch;
  }
  if (plan.warp_specialized) {
    if (plan.score != FwdScore::kPlain) return launch;
    if constexpr (kWindowed != Sm90Schedule::kPipelined) {
      constexpr bool kTileCounterTwin =
          kWindowed == Sm90Schedule::kPingpongOverlap && fwd_persistent_headdim(kHeadDim);
      if (plan.schedule == kWindowed) {
        return ws_launch<T, kHeadDim, kArch, ScoreMode::kPlain, kNone, kWindowed, kTileCounterTwin, false, true>();
      }
    }
    if constexpr (kEqual != Sm90Schedule::kPipelined && kEqual != kWindowed) {
      if (plan.schedule == kEqual) {
        return ws_launch<T, kHeadDim, kArch, ScoreMode::kPlain, kNone, kEqual, false, false, true>();
      }
    }
    if constexpr (kEqual == Sm90Schedule::kPipelined && fwd_wide_warp_specialized(kHeadDim)) {
      if (plan.schedule == Sm90Schedule::kOverlap) {  // (long sequences: sm90_schedule_for_keys)
        return ws_launch<T, kHeadDim, kArch, ScoreMode::kPlain, kNone, Sm90Schedule::kOverlap, false, false, true>();
      }
    }
    return launch;
  }
  if (plan.score == FwdScore::kPlain) {
    launch.kernel =
        &fwd::fwd_kernel<T, kHeadDim, kArch, ScoreMode::kPlain, kNone, false, false, false, false, false, true>;
  } else if (plan.score == FwdScore::kGeneral) {
    launch.kernel =
        &fwd::fwd_kernel<T, kHeadDim, kArch, ScoreMode::kGeneral, kNone, false, false, false, false, false, true>;
  }
  return launch;
}

// The kernel a plan names (fwd_kernel_for_bias, ws_launch): the same instantiations as the plan's choices can reach,
// and nothing else. launch.kernel nullptr where the plan names a kernel this instance does not have.
// kVarlenKernels: the instance has the sm80 path's varlen and dropout kernels (cmake/Kernels.cmake: the sm80-path
// instances, and an sm_90a one in a build without sm_90 ones, which runs them with the sm80 path's tag 900). The sm_90a
// instances with TMA loads have their own (arch_tag 901 plans).
template <typename T, int kHeadDim, int kArch, bool kVarlenKernels>
FwdLaunch fwd_launch_of(const FwdPlan& plan) {
  using Cfg = FwdTileConfig<kHeadDim, /*kWgmma=*/kArch == 901>;  // the non-warp-specialized kernels'
  using fwd::ScoreMode;
  FwdLaunch launch{nullptr, Cfg::kNThreads, Cfg::kSmemBytes, Cfg::kBlockM, false};
  constexpr bool kTma = kArch == 901 && FA2_SM90_TMA;
  if (plan.dropout && plan.arch_tag == 901) {  // (the pipelined sm_90a kernels: Cfg's shape)
    if constexpr (kTma) launch.kernel = fwd_dropout_kernel<T, kHeadDim, kArch>(plan);
    return launch;
  }
  if (plan.dropout) {
    if constexpr (kVarlenKernels) {
      using Sm80Cfg = FwdTileConfig<kHeadDim, /*kWgmma=*/false>;
      launch = {fwd_dropout_kernel<T, kHeadDim, kArch / 10 * 10>(plan), Sm80Cfg::kNThreads, Sm80Cfg::kSmemBytes,
                Sm80Cfg::kBlockM, false};
    }
    return launch;
  }
  if (plan.varlen && plan.arch_tag == 901) {  // (the sm_90a varlen kernels)
    if constexpr (kTma) launch = fwd_varlen_tma_launch<T, kHeadDim, kArch>(plan);
    return launch;
  }
  if (plan.varlen) {  // (the sm80 path's)
    if constexpr (kVarlenKernels) {
      using Sm80Cfg = FwdTileConfig<kHeadDim, /*kWgmma=*/false>;
      launch = {fwd_varlen_kernel<T, kHeadDim, kArch / 10 * 10>(plan.score), Sm80Cfg::kNThreads, Sm80Cfg::kSmemBytes,
                Sm80Cfg::kBlockM, false};
    }
    return launch;
  }
  if constexpr (kTma) {
    // (kDefault: causal / windowed calls' default schedule, the one the tile-counter and key-bias kernels exist for)
    constexpr Sm90Schedule kDefault = sm90_default_schedule(kHeadDim, /*windowed=*/true);
    constexpr ScoreMode kPlain = ScoreMode::kPlain;
    if (plan.warp_specialized && plan.score == FwdScore::kPlain) {
      if (plan.schedule == Sm90Schedule::kPingpong) {
        launch = ws_launch<T, kHeadDim, kArch, kPlain, BiasType::kNone, Sm90Schedule::kPingpong>();
      } else if (plan.schedule == Sm90Schedule::kOverlap) {
        launch = ws_launch<T, kHeadDim, kArch, kPlain, BiasType::kNone, Sm90Schedule::kOverlap, false,
                           fwd_cluster_headdim(kHeadDim)>();
      } else if (plan.schedule == Sm90Schedule::kPingpongOverlap) {
        launch = ws_launch<T, kHeadDim, kArch, kPlain, BiasType::kNone, Sm90Schedule::kPingpongOverlap,
                           fwd_persistent_headdim(kHeadDim) && kDefault == Sm90Schedule::kPingpongOverlap>();
      } else if (plan.schedule == Sm90Schedule::kWarpSpecialized) {
        launch = ws_launch<T, kHeadDim, kArch, kPlain, BiasType::kNone, Sm90Schedule::kWarpSpecialized>();
      }
      return launch;
    }
    if (plan.warp_specialized) {  // a key-row bias: the headdim's key-bias schedule, or the wide ws kernel
      constexpr Sm90Schedule kKeyBiasSchedule =
          kDefault != Sm90Schedule::kPipelined ? sm90_key_bias_schedule(kHeadDim) : Sm90Schedule::kWarpSpecialized;
      if constexpr (kDefault != Sm90Schedule::kPipelined || fwd_wide_warp_specialized(kHeadDim)) {
        if (plan.score == FwdScore::kKeyBiasFold && plan.schedule == kKeyBiasSchedule) {
          use_key_bias_ws_launch<T, kHeadDim, kArch, kKeyBiasSchedule>(plan.bias, launch);
        }
      }
      return launch;
    }
  }
  if (plan.warp_specialized) return launch;  // (none here)
  switch (plan.score) {
    case FwdScore::kGeneral:
      launch.kernel = fwd_kernel_for_bias<T, kHeadDim, kArch, ScoreMode::kGeneral>(plan.bias);
      break;
    case FwdScore::kPlain:
      launch.kernel = fwd_kernel_for_bias<T, kHeadDim, kArch, ScoreMode::kPlain>(plan.bias);
      break;
    case FwdScore::kKeyBiasFold:
      launch.kernel = fwd_kernel_for_bias<T, kHeadDim, kArch, ScoreMode::kKeyBiasFold>(plan.bias);
      break;
    case FwdScore::kBiasFold:
      launch.kernel = fwd_kernel_for_bias<T, kHeadDim, kArch, ScoreMode::kBiasFold>(plan.bias);
      break;
  }
  return launch;
}

// The keys one TMA box of a paged cache takes (params.h, page_box_rows): the longest run that divides both the page
// and the kernel's key block, so that no box crosses a page and a tile's boxes fill it (16 or more: both are multiples
// of 16, which also keeps each box's shared-memory rows on the swizzle's period).
constexpr int paged_box_rows(int page_size, int block_n) { return std::gcd(page_size, block_n); }

// The TMA's view of q, k, v (and a key-row bias) for the sm_90a instances that load with it (p: the kernel's params,
// page_box_rows set where the plan is paged).
template <typename T, int kHeadDim, int kArch>
const char* make_fwd_tensor_maps(const FwdPlan& plan, const AttentionParams& p, sm90::FwdTensorMaps* maps) {
  if (plan.arch_tag != 901) return nullptr;  // (the sm80 path's kernels: cp.async loads)
  if constexpr (kArch == 901 && FA2_SM90_TMA) {
    using Cfg = FwdTileConfig<kHeadDim, /*kWgmma=*/true>;
    const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
    // varlen: the packed (total, heads, headdim) tensors as a batch of one (the kernels add each sequence's first
    // row); a paged cache's keys and values as a batch of pages (the kernels look each box's page up)
    const int64_t batch = plan.varlen ? 1 : p.batch;
    const int64_t rows_q = plan.varlen ? p.total_q : p.seqlen_q, rows_k = plan.varlen ? p.total_k : p.seqlen_k;
    const int64_t kv_batch = plan.paged ? p.num_pages : batch, kv_rows = plan.paged ? p.page_size : rows_k;
    const int kv_box_rows = plan.paged ? p.page_box_rows : Cfg::kBlockN;
    const char* e = sm90::make_bshd_tensor_map(&maps->q, p.q, bf16, batch, rows_q, p.nheads, p.headdim,
                                               p.q_batch_stride, p.q_row_stride, p.q_head_stride, plan.block_m,
                                               Cfg::kSmemBlockCols);
    if (e == nullptr) {
      e = sm90::make_bshd_tensor_map(&maps->k, p.k, bf16, kv_batch, kv_rows, p.nheads_k, p.headdim,
                                     p.k_batch_stride, p.k_row_stride, p.k_head_stride, kv_box_rows,
                                     Cfg::kSmemBlockCols);
    }
    if (e == nullptr) {
      e = sm90::make_bshd_tensor_map(&maps->v, p.v, bf16, kv_batch, kv_rows, p.nheads_k, p.headdim,
                                     p.v_batch_stride, p.v_row_stride, p.v_head_stride, kv_box_rows,
                                     Cfg::kSmemBlockCols);
    }
    if (e == nullptr && plan.key_bias_tma) {
      e = sm90::make_key_bias_tensor_map(&maps->bias, p.bias, bias_element_bytes(p.bias_type), bf16, p.batch,
                                         p.nheads, p.seqlen_k, p.bias_batch_stride, p.bias_head_stride, Cfg::kBlockN);
    }
    return e;
  }
  return nullptr;
}

// Runs a forward plan (plan.h, plan_fwd) on this instance. The one thing decided here is what the plan leaves to
// the device: a cluster plan runs without clusters where the device cannot set up or co-schedule its pairs, and a
// persistent cluster grid is cut to the pairs that run at once (a persistent CTA must not wait for a slot).
template <typename T, int kHeadDim, int kArch, bool kVarlenKernels = (kArch != 901)>
const char* run_fwd_instance(const FwdPlan& plan, const AttentionParams& p, cudaStream_t stream) {
  FwdLaunch launch = fwd_launch_of<T, kHeadDim, kArch, kVarlenKernels>(plan);
  FwdKernel kernel = plan.tile_counter ? launch.tile_counter_kernel : launch.kernel;
  if (kernel == nullptr || (plan.cluster && launch.cluster_kernel == nullptr) || launch.threads != plan.threads ||
      launch.smem != plan.smem || launch.block_m != plan.block_m || plan.headdim != kHeadDim) {
    return "fa2: the forward plan names a kernel this instance does not have";
  }
  dim3 grid(unsigned(plan.grid_x), unsigned(plan.grid_y), unsigned(plan.grid_z));
  bool use_cluster = plan.cluster;
  cudaError_t err = cudaSuccess;
  if (launch.smem > 48 * 1024) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, launch.smem);
    if (err != cudaSuccess) return cudaGetErrorString(err);
    if (use_cluster &&
        cudaFuncSetAttribute(launch.cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, launch.smem) !=
            cudaSuccess) {
      (void)cudaGetLastError();  // (the call runs without clusters)
      use_cluster = false;
    }
  }
  if (use_cluster) {
    cudaLaunchAttribute cluster;
    const int pairs = max_active_cluster_pairs(
        reinterpret_cast<const void*>(launch.cluster_kernel),
        cluster_of_two_config(dim3(2), launch.threads, launch.smem, nullptr, &cluster));
    use_cluster = pairs > 0;
    if (use_cluster && plan.persistent_grid) grid.x = std::min(grid.x & ~1u, 2u * unsigned(pairs));
  }
  AttentionParams kernel_params = p;  // with the values derived for the kernel (params.h)
  kernel_params.workspace = plan.tile_counter ? p.workspace : nullptr;
  kernel_params.inv_scale = 1.f / p.scale;
  kernel_params.heavy_score = -kHeavyRowLog2 / p.scale_log2;
  kernel_params.tile_order_tail = plan.tile_order_tail;
  kernel_params.varlen_stage_masks = plan.stage_masks;
  if constexpr (kArch == 901) {
    if (plan.paged) kernel_params.page_box_rows = paged_box_rows(p.page_size, FwdTileConfig<kHeadDim, true>::kBlockN);
  }
  sm90::FwdTensorMaps maps{};  // (from kernel_params: a paged cache's boxes are page_box_rows keys)
  if (const char* e = make_fwd_tensor_maps<T, kHeadDim, kArch>(plan, kernel_params, &maps)) return e;
  if (use_cluster) {
    cudaLaunchAttribute cluster;
    const cudaLaunchConfig_t config = cluster_of_two_config(grid, launch.threads, launch.smem, stream, &cluster);
    err = cudaLaunchKernelEx(&config, launch.cluster_kernel, kernel_params, maps);
    const cudaError_t last = cudaGetLastError();  // (cleared, as the <<<>>> path's check clears it)
    if (err == cudaSuccess) err = last;
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
  }
  kernel<<<grid, launch.threads, launch.smem, stream>>>(kernel_params, maps);
  err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// This instance alone, planned for the current device with the process's options and params' own workspace (the
// kernel harness, scripts/dev/fwd_variant_bench.cu).
template <typename T, int kHeadDim, int kArch>
const char* run_fwd_instance(const AttentionParams& p, cudaStream_t stream) {
  DevOptions options;
  if (const char* e = dev_options(&options)) return e;
  const InstanceDesc instance = instance_desc(std::is_same_v<T, __nv_bfloat16>, kHeadDim, kArch);
  const FwdPlan plan = plan_fwd(p, current_device(), options, &instance, 1, PlanBuffers::kGiven);
  if (plan.error != nullptr) return plan.error;
  return run_fwd_instance<T, kHeadDim, kArch>(plan, p, stream);
}

}  // namespace fa2
