// Host side of one backward instance (dtype, headdim, arch): runs the kernels a plan (plan.h) names: the row
// preprocessing, the main kernel with the plan's grid, the dQ conversion. Included only by the generated instance
// files (build/.../generated/bwd_*.cu) and the kernel harness.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "fa2/bwd_kernel.cuh"
#include "fa2/bwd_ws_dsplit_kernel.cuh"
#include "fa2/bwd_ws_kernel.cuh"
#include "fa2/bwd_launch.h"
#include "fa2/launch.h"
#include "fa2/plan.h"
#include "fa2/programmatic_launch.cuh"
#include "fa2/bwd_tile_config.h"
#include "fa2/params.h"

namespace fa2 {

// The shared memory of the key-row bias variant: its key block's bias after the tiles (bwd_kernel.cuh).
template <typename Cfg>
constexpr int bwd_key_bias_smem_bytes() {
  return Cfg::kSmemBytes + Cfg::kBlockN * 4;
}

// The main kernel (step 2 below) of one score path with its tile config, on the plan's grid.
template <typename T, typename Cfg, int kArch, bool kScoreMod, bool kKeyBias = false, bool kVarlen = false,
          bool kDropout = false>
const char* launch_bwd_kernel(const BwdPlan& plan, const AttentionParams& p, cudaStream_t stream) {
  void (*kernel)(const AttentionParams) = &bwd::bwd_kernel<T, Cfg, kArch, kScoreMod, kKeyBias, kVarlen, kDropout>;
  const int smem = kKeyBias ? bwd_key_bias_smem_bytes<Cfg>() : Cfg::kSmemBytes;
  if (smem != plan.smem || Cfg::kNThreads != plan.threads) {
    return "fa2: the backward plan names a kernel this instance does not have";
  }
  const dim3 grid(unsigned(plan.grid_x), unsigned(plan.grid_y), unsigned(plan.grid_z));
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  kernel<<<grid, Cfg::kNThreads, smem, stream>>>(p);
  err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// The varlen and / or dropout main kernel (bwd_kernel.cuh, kVarlen, kDropout) of one score path: an sm_90a plan's
// (arch_tag 901: varlen with the wgmma tiles on the plain path, the sm80 ones on the score-mod path, as a dense call's;
// dropout, padded or varlen, with the wgmma tiles on the plain path only: plan.cpp, sm90_dropout_backward), else the
// sm80 path's, where the instance has those kernels (kVarlenKernels: cmake/Kernels.cmake; an sm_90a one runs them with
// the sm80 path's tag 900): on sm_90 only with the regular tiles (plan.cpp, choose_bwd_tiles), so that few kernels are
// instantiated.
template <typename T, typename Cfg, int kArch, bool kScoreMod, bool kVarlenKernels>
const char* launch_bwd_varlen_or_dropout_kernel(const BwdPlan& plan, const AttentionParams& p, cudaStream_t stream) {
  if (plan.arch_tag == 901) {
    constexpr bool kNoKeyBias = false, kDropout = true;
    if constexpr (kArch == 901 && Cfg::kWgmma && !kScoreMod) {
      if (plan.dropout && plan.varlen) {
        return launch_bwd_kernel<T, Cfg, kArch, false, kNoKeyBias, /*kVarlen=*/true, kDropout>(plan, p, stream);
      }
      if (plan.dropout) {
        return launch_bwd_kernel<T, Cfg, kArch, false, kNoKeyBias, /*kVarlen=*/false, kDropout>(plan, p, stream);
      }
    }
    if constexpr (kArch == 901 && (Cfg::kWgmma || kScoreMod)) {
      if (plan.dropout) return "fa2: the backward plan names a kernel this instance does not have";
      return launch_bwd_kernel<T, Cfg, kArch, kScoreMod, kNoKeyBias, /*kVarlen=*/true>(plan, p, stream);
    } else {
      return "fa2: the backward plan names a kernel this instance does not have";
    }
  }
  if constexpr (kVarlenKernels && (kArch < 900 || std::is_same_v<Cfg, BwdTileConfig<Cfg::kHeadDim>>)) {
    constexpr int kSm80 = kArch / 10 * 10;
    constexpr bool kNoKeyBias = false;
    if (!plan.dropout) return launch_bwd_kernel<T, Cfg, kSm80, kScoreMod, kNoKeyBias, true>(plan, p, stream);
    if (!plan.varlen) return launch_bwd_kernel<T, Cfg, kSm80, kScoreMod, kNoKeyBias, false, true>(plan, p, stream);
    return launch_bwd_kernel<T, Cfg, kSm80, kScoreMod, kNoKeyBias, true, true>(plan, p, stream);
  } else {
    return "fa2: the backward plan names a kernel this instance does not have";
  }
}

// The sm_90a warp-specialized main kernel's TMA maps (q, dout in query blocks, k, v in key blocks, the row statistics,
// dq_accum, GQA's accumulators), built before anything is launched: false where the encoder rejects one (the plan
// checked everything else: plan.cpp, bwd_ws_applies).
template <typename T, int kHeadDim, bool kKeyBias>
bool make_bwd_ws_maps(const AttentionParams& p, sm90::BwdTensorMaps* maps) {
  using Cfg = BwdWsConfig<kHeadDim>;
  const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr int kCols = Cfg::kBlockCols;
  const char* e = sm90::make_bshd_tensor_map(&maps->q, p.q, bf16, p.batch, p.seqlen_q, p.nheads, p.headdim,
                                             p.q_batch_stride, p.q_row_stride, p.q_head_stride, Cfg::kBlockM, kCols);
  if (e == nullptr) {
    e = sm90::make_bshd_tensor_map(&maps->dout, p.dout, bf16, p.batch, p.seqlen_q, p.nheads, p.headdim,
                                   p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride, Cfg::kBlockM, kCols);
  }
  if (e == nullptr) {
    e = sm90::make_bshd_tensor_map(&maps->k, p.k, bf16, p.batch, p.seqlen_k, p.nheads_k, p.headdim,
                                   p.k_batch_stride, p.k_row_stride, p.k_head_stride, Cfg::kBlockN, kCols);
  }
  if (e == nullptr) {
    e = sm90::make_bshd_tensor_map(&maps->v, p.v, bf16, p.batch, p.seqlen_k, p.nheads_k, p.headdim,
                                   p.v_batch_stride, p.v_row_stride, p.v_head_stride, Cfg::kBlockN, kCols);
  }
  const int64_t rows = int64_t(p.batch) * p.nheads * p.seqlen_q;  // of lse, D and dq_accum
  // (the key-row bias variant takes P against bwd_row_stats_kernel's statistics: its lse and the row shift)
  constexpr int kStatBox = bwd::ws_stat_box_elems<Cfg::kBlockM>();
  if (e == nullptr) e = sm90::make_flat_f32_tensor_map(&maps->lse, kKeyBias ? p.row_lse : p.lse, rows, kStatBox);
  if (e == nullptr && kKeyBias) e = sm90::make_flat_f32_tensor_map(&maps->shift, p.row_shift, rows, kStatBox);
  if (e == nullptr) e = sm90::make_flat_f32_tensor_map(&maps->dsum, p.softmax_d, rows, kStatBox);
  if constexpr (!kBwdWsSplit<kHeadDim>) {  // (the headdim-split kernel adds dQ from its registers: no map)
    if (e == nullptr) e = sm90::make_rows_f32_tensor_map(&maps->dq_accum, p.dq_accum, rows, kHeadDim, Cfg::kDqRows);
    // GQA's dK / dV accumulators (bwd_launch.h: (batch, nheads_k, seqlen_k, kHeadDim) contiguous), added to by the
    // TMA as dQ is (bwd_ws_kernel.cuh), each warpgroup's 64 keys a box of rows
    if (e == nullptr && p.h_h_k_ratio > 1 && p.gqa_dkv == GqaDkv::kAccumulate) {
      const int64_t kv_rows = int64_t(p.batch) * p.nheads_k * p.seqlen_k;  // (contiguous, int rows: the plan's)
      e = sm90::make_rows_f32_tensor_map(&maps->dk_accum, p.dk, kv_rows, kHeadDim, 64);
      if (e == nullptr) e = sm90::make_rows_f32_tensor_map(&maps->dv_accum, p.dv, kv_rows, kHeadDim, 64);
    }
  }
  return e == nullptr;
}

// The plan's split of the warp-specialized kernel's last partial wave into p's fields, with the maps of its fp32 dK
// and dV rows (maps->dk_accum / dv_accum, which only GQA's accumulators use otherwise); false where the encoder
// rejects a map (the plan then runs without the split: plan_bwd_without_tail_split).
template <int kHeadDim>
bool apply_bwd_tail_split(const BwdTailSplitPlan& split, AttentionParams& p, sm90::BwdTensorMaps* maps) {
  using Cfg = BwdWsConfig<kHeadDim>;
  if constexpr (Cfg::kTailSplit) {
    int* const counts = static_cast<int*>(p.workspace) + split.workspace_offset;
    float* const dkv = reinterpret_cast<float*>(counts + split.dkv_offset);
    const int64_t rows = int64_t(split.tiles) * Cfg::kBlockN;
    if (sm90::make_rows_f32_tensor_map(&maps->dk_accum, dkv, rows, kHeadDim, 64) != nullptr ||
        sm90::make_rows_f32_tensor_map(&maps->dv_accum, dkv + rows * kHeadDim, rows, kHeadDim, 64) != nullptr) {
      return false;
    }
    p.bwd_tail_pieces = split.pieces;
    p.bwd_tail_tiles = split.tiles;
    p.bwd_tail_grid_tiles = split.grid_tiles;
    p.bwd_tail_counts = counts;
    p.bwd_tail_dkv = dkv;
    p.bwd_tail_zero_ints = split.zero_ints;
    return true;
  }
  return false;
}

// Launches the sm_90a warp-specialized main kernel (bwd_ws_kernel.cuh; maps: make_bwd_ws_maps') on the plan's grid
// and tile order. kVarlen: its packed-sequence variant.
template <typename T, int kHeadDim, bool kKeyBias, bool kVarlen = false, bool kDropout = false>
const char* launch_bwd_ws_kernel(const BwdPlan& plan, const AttentionParams& p, const sm90::BwdTensorMaps& maps,
                                 cudaStream_t stream) {
  using Cfg = BwdWsConfig<kHeadDim>;
  void (*kernel)(const AttentionParams, const sm90::BwdTensorMaps);
  if constexpr (kBwdWsSplit<kHeadDim>) {
    if constexpr (kDropout) return "fa2: the backward plan names a kernel this instance does not have";
    kernel = &bwd::bwd_ws_dsplit_kernel<T, Cfg, kKeyBias, kVarlen>;
  } else {
    kernel = &bwd::bwd_ws_kernel<T, Cfg, kKeyBias, kVarlen, kDropout>;
  }
  if (Cfg::kSmemBytes != plan.smem || Cfg::kNThreads != plan.threads) {
    return "fa2: the backward plan names a kernel this instance does not have";
  }
  const dim3 grid(unsigned(plan.grid_x), unsigned(plan.grid_y), unsigned(plan.grid_z));
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  AttentionParams kernel_params = p;
  kernel_params.tile_order_tail = plan.tile_order_tail;
  // (programmatic_main: ws_start has each thread wait for the preprocess before it needs its results)
  err = launch_kernel(kernel, grid, dim3(Cfg::kNThreads), Cfg::kSmemBytes, stream, plan.programmatic_main,
                      kernel_params, maps);
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// The ws kernel's maps (and its tail split's) for a plan that names it; where the encoder rejects one, the plan
// without it (plan_bwd_without_ws, plan_bwd_without_tail_split). p receives the split's fields.
// (varlen: the packed tensors as a batch of one, params.h's varlen_rows_view: the kernel adds each sequence's first
// row)
template <typename T, int kHeadDim>
BwdPlan prepare_bwd_ws(const BwdPlan& plan, AttentionParams& p, sm90::BwdTensorMaps* maps) {
  const bool made = plan.key_bias  ? make_bwd_ws_maps<T, kHeadDim, true>(p, maps)
                    : plan.varlen ? make_bwd_ws_maps<T, kHeadDim, false>(varlen_rows_view(p), maps)
                                  : make_bwd_ws_maps<T, kHeadDim, false>(p, maps);
  if (!made) return plan_bwd_without_ws(plan, p, current_device());
  if (plan.tail_split.pieces > 1 && !apply_bwd_tail_split<kHeadDim>(plan.tail_split, p, maps)) {
    return plan_bwd_without_tail_split(plan, p);
  }
  return plan;
}

// Steps 1 and 3 of the backward around its main kernel: D = rowsum(dO * O) with dq_accum (and the plan's counts)
// zeroed before, and dq = scale * dq_accum after (where the headdim-split ws kernel ran, its whole query blocks in
// its fragment order: bwd_kernel.cuh, DqFragmentOrder). Behind the ws kernel with its finished-CTA counts
// (plan.dq_overlap) the conversion is a programmatic dependent launch: its CTAs may start on the SMs that the main
// kernel's last wave leaves idle, each converting a head's rows once the head's main-kernel CTAs have all counted
// themselves finished (ws_key_block_done).
template <typename T, int kHeadDim>
struct BwdRowKernels {
  static constexpr int kRowThreads = 256;
  static constexpr int kRowsPerCta = kRowThreads / bwd::row_group_threads<kHeadDim>();

  static int64_t row_ctas(const AttentionParams& p) {
    return (int64_t(p.batch) * p.seqlen_q * p.nheads + kRowsPerCta - 1) / kRowsPerCta;
  }
  static const char* preprocess(const AttentionParams& p, int* key_blocks_done, cudaStream_t stream) {
    AttentionParams preprocess = p;
    preprocess.key_blocks_done = key_blocks_done;
    bwd::bwd_preprocess_kernel<T, kHeadDim, kRowThreads><<<unsigned(row_ctas(p)), kRowThreads, 0, stream>>>(
        preprocess);
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
  }
  static const char* row_stats(const AttentionParams& p, cudaStream_t stream) {
    if (p.row_lse == nullptr || p.row_shift == nullptr) return "fa2: the CUDA backward needs row_lse/row_shift buffers";
    constexpr int kStatsRowsPerCta = 8;
    const int64_t stats_ctas = (int64_t(p.batch) * p.nheads * p.seqlen_q + kStatsRowsPerCta - 1) / kStatsRowsPerCta;
    if (stats_ctas > 0x7fffffff) return "fa2: batch * nheads * seqlen_q is too large for the CUDA backward";
    bwd::bwd_row_stats_kernel<T, kHeadDim><<<unsigned(stats_ctas), 32 * kStatsRowsPerCta, 0, stream>>>(p);
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
  }
  // kOverlapCapable: the instance's ws kernel overlaps its conversion (only then is that kernel instantiated).
  // grid: the main kernel's call (p: the rows it converts; a varlen call's its batch-of-one view, whose heads each
  // count the main kernel's CTAs of every sequence)
  template <bool kOverlapCapable>
  static const char* convert_dq(const BwdPlan& plan, const AttentionParams& p, const AttentionParams& grid,
                                int* key_blocks_done, cudaStream_t stream) {
    AttentionParams convert = p;
    const bool ws = plan.main == BwdMain::kWarpSpecialized;
    // (a varlen call's blocks start at each sequence's first row: fragment order only with varlen_dq_head_rows)
    if constexpr (bwd_ws_headdim(kHeadDim)) {
      convert.dq_accum_fragment_order = ws && kBwdWsSplit<kHeadDim> && !plan.varlen;
    }
    if (p.varlen_dq_head_rows != 0) {  // (the rows' sequences, which the batch-of-one view leaves out)
      convert.cu_seqlens_q = grid.cu_seqlens_q;
      convert.varlen_sequences = grid.batch;
    }
    cudaError_t err = cudaSuccess;
    if constexpr (kOverlapCapable) {
      if (ws && plan.dq_overlap) {
        convert.key_blocks_done = key_blocks_done;
        constexpr int kKeys = BwdWsConfig<kHeadDim>::kBlockN;
        convert.key_blocks_per_head = (grid.seqlen_k + kKeys - 1) / kKeys * (plan.varlen ? grid.batch : 1);
        err = launch_kernel(&bwd::bwd_convert_dq_kernel<T, kHeadDim, kRowThreads, /*kAfterHeads=*/true>,
                            dim3(unsigned(row_ctas(p))), dim3(kRowThreads), 0, stream, /*programmatic=*/true, convert);
        return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
      }
    }
    bwd::bwd_convert_dq_kernel<T, kHeadDim, kRowThreads><<<unsigned(row_ctas(p)), kRowThreads, 0, stream>>>(convert);
    err = cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
  }
};

// Runs a backward plan with the instance's tile configs (CfgScoreMod: the score-mod path's, softcap or a general
// bias, where it differs from the plain one's): 1. preprocessing, 2. the main kernel the plan names (with the
// score-mod path's row statistics first), 3. the dQ conversion. A GQA plan whose ws maps the encoder rejects
// launches nothing and sets *needs_partials (bwd_launch.h).
template <typename T, typename Cfg, int kArch, bool kVarlenKernels, typename CfgScoreMod = Cfg>
const char* run_bwd_with_config(const BwdPlan& planned, const AttentionParams& call, cudaStream_t stream,
                                bool* needs_partials) {
  constexpr int kHeadDim = Cfg::kHeadDim;
  using Rows = BwdRowKernels<T, kHeadDim>;
  AttentionParams p = call;  // (with the tail split's fields where the ws kernel splits its last wave)
  BwdPlan plan = planned;
  constexpr bool kWsCapable = kArch == 901 && Cfg::kWgmma && bwd_ws_headdim(kHeadDim);
  sm90::BwdTensorMaps ws_maps{};
  if (plan.main == BwdMain::kWarpSpecialized) {
    if constexpr (kWsCapable) {
      plan = prepare_bwd_ws<T, kHeadDim>(plan, p, &ws_maps);
    } else {
      return "fa2: the backward plan names a kernel this instance does not have";
    }
  }
  if (plan.error != nullptr) {
    const bool gqa_buffers = call.h_h_k_ratio > 1 && planned.gqa_dkv != GqaDkv::kPartials;
    if (gqa_buffers && needs_partials != nullptr) *needs_partials = true;  // (nothing launched)
    return gqa_buffers && needs_partials != nullptr ? nullptr : plan.error;
  }
  // (a varlen call's dq_accum in whole blocks is for the headdim-split ws kernel only: params.h, varlen_dq_head_rows)
  if (!(plan.main == BwdMain::kWarpSpecialized && kBwdWsSplit<kHeadDim> && !plan.dq_overlap)) p.varlen_dq_head_rows = 0;
  // (the row-wise kernels read a varlen call's rows as a dense batch of one: params.h, varlen_rows_view)
  const AttentionParams rows = plan.varlen ? varlen_rows_view(p) : p;
  if (Rows::row_ctas(rows) > 0x7fffffff) return "fa2: batch * seqlen_q * nheads is too large for the CUDA backward";
  int* const key_blocks_done = plan.dq_overlap ? static_cast<int*>(p.workspace) : nullptr;
  if (const char* e = Rows::preprocess(rows, key_blocks_done, stream)) return e;
  if (plan.row_stats) {
    if (const char* e = Rows::row_stats(p, stream)) return e;
  }
  const char* e = nullptr;
  const bool sm80_only = plan.varlen || plan.dropout;  // (kernels only the sm80 path has)
  constexpr bool kKeyBiasFits = kArch >= 900 || bwd_key_bias_smem_bytes<Cfg>() <= 163 * 1024;
  switch (plan.main) {
    case BwdMain::kWarpSpecialized:
      if constexpr (kWsCapable) {
        AttentionParams main = p;
        main.key_blocks_done = key_blocks_done;
        e = plan.key_bias  ? launch_bwd_ws_kernel<T, kHeadDim, true>(plan, main, ws_maps, stream)
            : plan.varlen  ? launch_bwd_ws_kernel<T, kHeadDim, false, /*kVarlen=*/true>(plan, main, ws_maps, stream)
            : plan.dropout ? launch_bwd_ws_kernel<T, kHeadDim, false, false, /*kDropout=*/true>(plan, main, ws_maps,
                                                                                                stream)
                           : launch_bwd_ws_kernel<T, kHeadDim, false>(plan, main, ws_maps, stream);
      }
      break;
    case BwdMain::kKeyBias:
      if constexpr (kKeyBiasFits) {
        e = launch_bwd_kernel<T, Cfg, kArch, /*kScoreMod=*/false, /*kKeyBias=*/true>(plan, p, stream);
      } else {
        e = "fa2: the backward plan names a kernel this instance does not have";
      }
      break;
    case BwdMain::kScoreMod:
      e = sm80_only ? launch_bwd_varlen_or_dropout_kernel<T, CfgScoreMod, kArch, true, kVarlenKernels>(plan, p, stream)
                    : launch_bwd_kernel<T, CfgScoreMod, kArch, /*kScoreMod=*/true>(plan, p, stream);
      break;
    case BwdMain::kPlain:
      e = sm80_only ? launch_bwd_varlen_or_dropout_kernel<T, Cfg, kArch, false, kVarlenKernels>(plan, p, stream)
                    : launch_bwd_kernel<T, Cfg, kArch, /*kScoreMod=*/false>(plan, p, stream);
      break;
  }
  if (e != nullptr) return e;
  constexpr bool kOverlapCapable = kWsCapable && bwd_ws_overlaps_dq_conversion<kHeadDim>();
  return Rows::template convert_dq<kOverlapCapable>(plan, rows, p, key_blocks_done, stream);
}

// The instance's tile configs as the plan chose them (plan.tiles): sm_90a instances the wgmma ones (kSm90a) or the
// sm80 ones; the sm80-path instances the regular or the small-shared-memory ones.
// kVarlenKernels: the instance has the varlen kernels (cmake/Kernels.cmake).
template <typename T, int kHeadDim, int kArch, bool kVarlenKernels = (kArch != 901)>
const char* run_bwd_instance(const BwdPlan& plan, const AttentionParams& p, cudaStream_t stream,
                             bool* needs_partials) {
  if (plan.headdim != kHeadDim) return "fa2: the backward plan names a kernel this instance does not have";
  constexpr bool kV = kVarlenKernels;
  if constexpr (kArch == 901) {
    if (plan.tiles == BwdTiles::kSm90a) {
      return run_bwd_with_config<T, typename BwdTileConfigSm90a<kHeadDim>::type, kArch, false,
                                 BwdTileConfig<kHeadDim>>(plan, p, stream, needs_partials);
    }
    return run_bwd_with_config<T, BwdTileConfig<kHeadDim>, kArch, kV>(plan, p, stream, needs_partials);
  } else {
    if (plan.tiles == BwdTiles::kSmall) {
      return run_bwd_with_config<T, BwdTileConfigSmall<kHeadDim>, kArch, kV>(plan, p, stream, needs_partials);
    }
    return run_bwd_with_config<T, BwdTileConfig<kHeadDim>, kArch, kV>(plan, p, stream, needs_partials);
  }
}

// This instance alone, planned for the current device with the process's options and params' own buffers (the
// kernel harness, scripts/dev/fwd_variant_bench.cu).
template <typename T, int kHeadDim, int kArch>
const char* run_bwd_instance(const AttentionParams& p, cudaStream_t stream) {
  DevOptions options;
  if (const char* e = dev_options(&options)) return e;
  const InstanceDesc instance = instance_desc(std::is_same_v<T, __nv_bfloat16>, kHeadDim, kArch);
  const BwdPlan plan = plan_bwd(p, current_device(), options, &instance, 1, PlanBuffers::kGiven);
  if (plan.error != nullptr) return plan.error;
  return run_bwd_instance<T, kHeadDim, kArch>(plan, p, stream, nullptr);
}

}  // namespace fa2
