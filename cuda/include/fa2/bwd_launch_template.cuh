// Host side of one backward instance (dtype, headdim, arch): picks the kernel variant, sizes the grids, launches the
// three kernels. Included only by the generated instance files (build/.../generated/bwd_*.cu).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "fa2/bwd_kernel.cuh"
#include "fa2/bwd_ws_dsplit_kernel.cuh"
#include "fa2/bwd_ws_kernel.cuh"
#include "fa2/bwd_launch.h"  // sm90_backward
#include "fa2/launch.h"      // check_dynamic_smem, check_grid_batch_heads
#include "fa2/bwd_tile_config.h"
#include "fa2/params.h"

namespace fa2 {

// The shared memory of the key-row bias variant: its key block's bias after the tiles (bwd_kernel.cuh).
template <typename Cfg>
constexpr int bwd_key_bias_smem_bytes() {
  return Cfg::kSmemBytes + Cfg::kBlockN * 4;
}

// The main kernel (step 2 below) of one score path with its tile config.
template <typename T, typename Cfg, int kArch, bool kScoreMod, bool kKeyBias = false>
const char* launch_bwd_kernel(const AttentionParams& p, cudaStream_t stream) {
  void (*kernel)(const AttentionParams) = &bwd::bwd_kernel<T, Cfg, kArch, kScoreMod, kKeyBias>;
  const int num_n_blocks = (p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
  const dim3 grid(num_n_blocks, p.nheads, p.batch);
  const int smem = kKeyBias ? bwd_key_bias_smem_bytes<Cfg>() : Cfg::kSmemBytes;
  if (const char* e = check_dynamic_smem("backward", Cfg::kHeadDim, smem)) return e;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  kernel<<<grid, Cfg::kNThreads, smem, stream>>>(p);
  err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Whether the TMA can address a (batch, seqlen, heads, headdim) tensor (b16 elements): a 16-byte aligned base and, for
// every dimension longer than 1, a non-zero stride (the glue keeps broadcast inputs' zero strides for the backward,
// e.g. a dout expanded over heads from out.sum(dim=2), which the tensor-map encoder rejects or, if not, was never
// tested) that is a multiple of 8 elements.
inline bool bshd_tma_addressable(const void* base, int64_t batch, int64_t seqlen, int64_t heads, int64_t batch_stride,
                                 int64_t row_stride, int64_t head_stride) {
  auto ok = [](int64_t size, int64_t stride) { return size == 1 || (stride != 0 && stride % 8 == 0); };
  return aligned16(base) && ok(batch, batch_stride) && ok(seqlen, row_stride) && ok(heads, head_stride);
}

// Whether a non-deterministic backward call on the plain path (key_bias: its key-row bias variant) can run the
// warp-specialized kernel (bwd_ws_kernel.cuh): its TMA reads each query block's row statistics (lse and D; with a
// key-row bias bwd_row_stats_kernel's lse and shift) from flat (batch, heads, seqlen_q) fp32 buffers (16-byte aligned
// bases; the boxes start at multiples of 4 values, ws_stat_box_elems), q / dout / k / v in tiles
// (bshd_tma_addressable), adds dQ into dq_accum, all with int coordinates (batch * nheads * seqlen_q rows and a box
// past the last block's); and unless they are GQA's fp32 partials or accumulators it stores dK, dV in 16-byte pieces
// (FA2_BWD_STAGED_DKV: the same 16-byte aligned bases and strides in multiples of 8 elements).
inline bool bwd_ws_applies(const AttentionParams& p, int block_m, bool key_bias) {
  const bool dkv_16b = (p.h_h_k_ratio > 1 && p.gqa_dkv != GqaDkv::kInKernel) ||
                       (bshd_tma_addressable(p.dk, p.batch, p.seqlen_k, p.nheads_k, p.dk_batch_stride, p.dk_row_stride,
                                             p.dk_head_stride) &&
                        bshd_tma_addressable(p.dv, p.batch, p.seqlen_k, p.nheads_k, p.dv_batch_stride, p.dv_row_stride,
                                             p.dv_head_stride));
  return dkv_16b && aligned16(p.softmax_d) && aligned16(p.dq_accum) &&
         (key_bias ? aligned16(p.row_lse) && aligned16(p.row_shift) : aligned16(p.lse)) &&
         int64_t(p.batch) * p.nheads * p.seqlen_q + block_m + 4 <= 0x7fffffff &&
         bshd_tma_addressable(p.q, p.batch, p.seqlen_q, p.nheads, p.q_batch_stride, p.q_row_stride, p.q_head_stride) &&
         bshd_tma_addressable(p.dout, p.batch, p.seqlen_q, p.nheads, p.dout_batch_stride, p.dout_row_stride,
                              p.dout_head_stride) &&
         bshd_tma_addressable(p.k, p.batch, p.seqlen_k, p.nheads_k, p.k_batch_stride, p.k_row_stride,
                              p.k_head_stride) &&
         bshd_tma_addressable(p.v, p.batch, p.seqlen_k, p.nheads_k, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
}

// The sm_90a warp-specialized main kernel's TMA maps (q, dout in query blocks, k, v in key blocks, the row statistics,
// dq_accum) and its shared memory, checked before anything is launched: false where a map cannot be built or the
// shared memory is not available (bwd_kernel.cuh's kernel runs instead).
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
      const int64_t kv_rows = int64_t(p.batch) * p.nheads_k * p.seqlen_k;
      const bool contiguous = p.dk_row_stride == kHeadDim && p.dk_head_stride == int64_t(p.seqlen_k) * kHeadDim &&
                              p.dk_batch_stride == int64_t(p.nheads_k) * p.dk_head_stride &&
                              p.dv_row_stride == p.dk_row_stride && p.dv_head_stride == p.dk_head_stride &&
                              p.dv_batch_stride == p.dk_batch_stride;
      if (!contiguous || kv_rows + Cfg::kBlockN > 0x7fffffff) return false;  // (the rows are int coordinates)
      e = sm90::make_rows_f32_tensor_map(&maps->dk_accum, p.dk, kv_rows, kHeadDim, 64);
      if (e == nullptr) e = sm90::make_rows_f32_tensor_map(&maps->dv_accum, p.dv, kv_rows, kHeadDim, 64);
    }
  }
  if (e == nullptr) e = check_dynamic_smem("backward", kHeadDim, Cfg::kSmemBytes);
  return e == nullptr;
}

// The key blocks of the warp-specialized backward's grid (one CTA each per head and batch).
template <int kHeadDim>
int bwd_ws_key_blocks(const AttentionParams& p) {
  return (p.seqlen_k + BwdWsConfig<kHeadDim>::kBlockN - 1) / BwdWsConfig<kHeadDim>::kBlockN;
}

// Whether a GQA call's warp-specialized CTAs each take a whole group (dK, dV summed in the kernel, no fp32 partials:
// bwd_ws_kernel.cuh / bwd_ws_dsplit_kernel.cuh, ws_groups_gqa) where the kernel can (with a key-row bias, one that
// every head shares, whose values the consumers keep in registers): bwd_gqa_grouping() 1 always, 0 never, -1
// (auto) where the grouped grid still fills the GPU (bwd_tile_config.h: kBwdGqaGroupMinWaveFill, and with causal
// lengths kBwdGqaGroupMinWavesCausal).
template <int kHeadDim>
bool bwd_ws_groups_gqa(const AttentionParams& p, bool key_bias) {
  if (p.h_h_k_ratio == 1 || (key_bias && p.bias_head_stride != 0)) return false;
  const int mode = bwd_gqa_grouping();
  if (mode >= 0) return mode == 1;
  const int64_t ctas = int64_t(bwd_ws_key_blocks<kHeadDim>(p)) * p.nheads_k * p.batch;
  const int64_t sms = device_sm_count();
  if (sms <= 0) return false;
  if (has_causal_lengths(p)) return ctas >= kBwdGqaGroupMinWavesCausal * sms;
  const int64_t waves = (ctas + sms - 1) / sms;
  return double(ctas) >= kBwdGqaGroupMinWaveFill * double(waves * sms);
}

// The split of the warp-specialized kernel's last partial wave (bwd_tail_split_plan) into p's fields, with the maps of
// its fp32 dK and dV rows (maps->dk_accum / dv_accum, which only GQA's accumulators use otherwise); p unchanged where
// the plan has none, the workspace does not hold its scratch, or a map is rejected (one CTA per tile then).
template <int kHeadDim>
void apply_bwd_tail_split(AttentionParams& p, sm90::BwdTensorMaps* maps) {
  using Cfg = BwdWsConfig<kHeadDim>;
  if constexpr (Cfg::kTailSplit) {
    const BwdTailSplitPlan plan = bwd_tail_split_plan(p);
    if (plan.pieces <= 1 || p.workspace == nullptr || p.workspace_ints < plan.workspace_offset + plan.zero_ints) {
      return;
    }
    int* const counts = static_cast<int*>(p.workspace) + plan.workspace_offset;
    float* const dkv = reinterpret_cast<float*>(counts + plan.dkv_offset);
    const int64_t rows = int64_t(plan.tiles) * Cfg::kBlockN;
    if (sm90::make_rows_f32_tensor_map(&maps->dk_accum, dkv, rows, kHeadDim, 64) != nullptr ||
        sm90::make_rows_f32_tensor_map(&maps->dv_accum, dkv + rows * kHeadDim, rows, kHeadDim, 64) != nullptr) {
      return;
    }
    p.bwd_tail_pieces = plan.pieces;
    p.bwd_tail_tiles = plan.tiles;
    p.bwd_tail_grid_tiles = plan.grid_tiles;
    p.bwd_tail_counts = counts;
    p.bwd_tail_dkv = dkv;
    p.bwd_tail_zero_ints = plan.zero_ints;
  }
}

// Launches the sm_90a warp-specialized main kernel (bwd_ws_kernel.cuh; maps: make_bwd_ws_maps'): one CTA per
// (key block, head, batch) as launch_bwd_kernel's, the heads being the kv heads where each CTA sums a GQA group
// (ws_groups_gqa).
template <typename T, int kHeadDim, bool kKeyBias>
const char* launch_bwd_ws_kernel(const AttentionParams& p, const sm90::BwdTensorMaps& maps, cudaStream_t stream) {
  using Cfg = BwdWsConfig<kHeadDim>;
  void (*kernel)(const AttentionParams, const sm90::BwdTensorMaps);
  if constexpr (kBwdWsSplit<kHeadDim>) {
    kernel = &bwd::bwd_ws_dsplit_kernel<T, Cfg, kKeyBias>;
  } else {
    kernel = &bwd::bwd_ws_kernel<T, Cfg, kKeyBias>;
  }
  const int num_n_blocks = bwd_ws_key_blocks<kHeadDim>(p);
  const int grid_heads = bwd::ws_groups_gqa(p) ? p.nheads_k : p.nheads;
  // (with its last wave split, apply_bwd_tail_split: a 1-D grid of the whole tiles, then the tail tiles' pieces)
  const dim3 grid = p.bwd_tail_pieces > 1 ? dim3(unsigned(p.bwd_tail_grid_tiles - p.bwd_tail_tiles +
                                                          int64_t(p.bwd_tail_tiles) * p.bwd_tail_pieces))
                                          : dim3(num_n_blocks, grid_heads, p.batch);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  AttentionParams kernel_params = p;  // (with the launch's tile order, params.h; none where the tail is split)
  kernel_params.tile_order_tail =
      Cfg::kTileOrderTail && p.bwd_tail_pieces <= 1 ? launch_tile_order_tail(p, num_n_blocks, grid_heads) : 0;
  kernel<<<grid, Cfg::kNThreads, Cfg::kSmemBytes, stream>>>(kernel_params, maps);
  err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// CfgScoreMod: the tile config of the score-mod variant (softcap, bias), when it differs from the plain one's.
template <typename T, typename Cfg, int kArch, typename CfgScoreMod = Cfg>
const char* run_bwd_with_config(const AttentionParams& call, cudaStream_t stream) {
  AttentionParams p = call;  // (with the tail split's fields where the ws kernel splits its last wave, below)
  static_assert(Cfg::kBlockM == CfgScoreMod::kBlockM, "one deterministic-mode counter layout (bwd_workspace_ints)");
  constexpr int kHeadDim = Cfg::kHeadDim;
  if (const char* e = check_grid_batch_heads("backward", p.batch, p.nheads)) return e;

  // Without the deterministic mode the workspace (bwd_workspace_ints) holds the counts of finished main-kernel CTAs
  // per (batch, head) that let the dQ conversion overlap the warp-specialized kernel's last CTAs (step 3), at the
  // headdims where that pays (bwd_tile_config.h, kOverlapDqConversion), then the tail split's scratch
  // (apply_bwd_tail_split)
  constexpr bool kOverlapCapable = kArch == 901 && Cfg::kWgmma && bwd_ws_overlaps_dq_conversion<kHeadDim>();
  int* const key_blocks_done = kOverlapCapable && !p.deterministic ? static_cast<int*>(p.workspace) : nullptr;

  // The main kernel is chosen before anything is launched (so that a GQA call can be answered kBwdNeedsGqa...):
  // the plain variant folds scale*log2(e) into the exp2 FMA on raw q.k; softcap or a bias need the recomputed score,
  // and its row statistics (bwd_kernel.cuh). A key-row bias without dbias may take the plain path's schedule and tiles
  // (key_bias_backward(), the default) where its extra shared memory fits the instance's GPU (A100: 163 KB).
  const bool score_mod = bwd_uses_score_mod(p);
  constexpr bool kKeyBiasFits = kArch >= 900 || bwd_key_bias_smem_bytes<Cfg>() <= 163 * 1024;
  const bool key_bias = kKeyBiasFits && key_bias_backward() && p.bias_type != BiasType::kNone &&
                        p.bias_row_stride == 0 && p.softcap == 0.f && p.dbias == nullptr;
  // sm_90a, plain path or its key-row bias variant (bwd_uses_score_mod is true for any bias), not deterministic: the
  // warp-specialized kernel where its tiles are defined, switched on (sm90_ws_backward), its TMA can address
  // everything (bwd_ws_applies) and its maps and shared memory are to be had (make_bwd_ws_maps, built last: only
  // where it would run). A GQA call that asks for the group summed in the kernel (GqaDkv::kInKernel) takes it only
  // where its CTAs may each take a group (bwd_ws_groups_gqa); otherwise, with nothing launched, it is answered
  // kBwdNeedsGqaAccumulators where the kernel would run with one CTA per query head (and bwd_gqa_accumulate()),
  // else kBwdNeedsGqaPartials: no other kernel adds into accumulators or sums a group (the tensor maps are built only
  // for the call that runs; a GQA call whose maps are then rejected is answered kBwdNeedsGqaPartials).
  const bool gqa = p.h_h_k_ratio > 1;
  bool ws = false;
  sm90::BwdTensorMaps ws_maps{};
  constexpr bool kWsCapable = kArch == 901 && Cfg::kWgmma && bwd_ws_headdim(kHeadDim);
  if constexpr (kWsCapable) {
    auto ws_eligible = [&](const AttentionParams& call) {
      return sm90_ws_backward() && (!score_mod || key_bias) && !call.deterministic &&
             bwd_ws_applies(call, BwdWsConfig<kHeadDim>::kBlockM, key_bias);
    };
    if (bwd::ws_groups_gqa(p) && !(ws_eligible(p) && bwd_ws_groups_gqa<kHeadDim>(p, key_bias))) {
      AttentionParams accumulating = p;
      accumulating.gqa_dkv = GqaDkv::kAccumulate;
      return bwd_gqa_accumulate() && ws_eligible(accumulating) ? kBwdNeedsGqaAccumulators : kBwdNeedsGqaPartials;
    }
    ws = ws_eligible(p) && (key_bias ? make_bwd_ws_maps<T, kHeadDim, true>(p, &ws_maps)
                                     : make_bwd_ws_maps<T, kHeadDim, false>(p, &ws_maps));
  }
  if (gqa && p.gqa_dkv != GqaDkv::kPartials && !ws) return kBwdNeedsGqaPartials;
  // the ws kernel's last partial wave split (apply_bwd_tail_split: its scratch zeroed by the preprocess kernel below)
  if constexpr (kWsCapable) {
    if (ws && !key_bias) apply_bwd_tail_split<kHeadDim>(p, &ws_maps);  // (the plan excludes a bias too)
  }

  // -- 1. D = rowsum(dO * O), dq_accum = 0 (and those counts)
  constexpr int kRowThreads = 256;
  constexpr int kRowsPerCta = kRowThreads / bwd::row_group_threads<kHeadDim>();
  const int64_t num_rows = int64_t(p.batch) * p.seqlen_q * p.nheads;
  const int64_t row_ctas = (num_rows + kRowsPerCta - 1) / kRowsPerCta;
  if (row_ctas > 0x7fffffff) return "fa2: batch * seqlen_q * nheads is too large for the CUDA backward";
  AttentionParams preprocess = p;
  preprocess.key_blocks_done = key_blocks_done;
  bwd::bwd_preprocess_kernel<T, kHeadDim, kRowThreads><<<unsigned(row_ctas), kRowThreads, 0, stream>>>(preprocess);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return cudaGetErrorString(err);

  // -- 2. dK, dV, dQ partials: one CTA per (key block, head, batch), or with the group summed in the kernel per (key
  //    block, kv head, batch)
  if (score_mod || key_bias) {  // (a key-row bias is a bias: the glue allocates the buffers for both)
    if (p.row_lse == nullptr || p.row_shift == nullptr) return "fa2: the CUDA backward needs row_lse/row_shift buffers";
    constexpr int kStatsRowsPerCta = 8;
    const int64_t stats_ctas = (int64_t(p.batch) * p.nheads * p.seqlen_q + kStatsRowsPerCta - 1) / kStatsRowsPerCta;
    if (stats_ctas > 0x7fffffff) return "fa2: batch * nheads * seqlen_q is too large for the CUDA backward";
    bwd::bwd_row_stats_kernel<T, kHeadDim><<<unsigned(stats_ctas), 32 * kStatsRowsPerCta, 0, stream>>>(p);
    err = cudaGetLastError();
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  const char* e = nullptr;
  if constexpr (kWsCapable) {
    if (ws) {
      AttentionParams main = p;
      main.key_blocks_done = key_blocks_done;
      e = key_bias ? launch_bwd_ws_kernel<T, kHeadDim, true>(main, ws_maps, stream)
                   : launch_bwd_ws_kernel<T, kHeadDim, false>(main, ws_maps, stream);
    }
  }
  if constexpr (kKeyBiasFits) {
    if (key_bias && !ws) e = launch_bwd_kernel<T, Cfg, kArch, /*kScoreMod=*/false, /*kKeyBias=*/true>(p, stream);
  }
  if (!key_bias && !ws) {
    e = score_mod ? launch_bwd_kernel<T, CfgScoreMod, kArch, /*kScoreMod=*/true>(p, stream)
                  : launch_bwd_kernel<T, Cfg, kArch, /*kScoreMod=*/false>(p, stream);
  }
  if (e != nullptr) return e;

  // -- 3. dq = scale * dq_accum (where the headdim-split ws kernel ran, its whole query blocks in its fragment order:
  //    bwd_kernel.cuh, DqFragmentOrder). Behind the ws kernel, with its finished-CTA counts, as a programmatic
  //    dependent launch: its CTAs may start on the SMs that the main kernel's last wave leaves idle (they cannot share
  //    an SM with a main-kernel CTA, which takes all its registers), each converting a head's rows once the head's
  //    main-kernel CTAs have all counted themselves finished (ws_key_block_done); ~0.5 of a wave at the grid's end
  //    when the CTAs do not divide evenly over the SMs.
  AttentionParams convert = p;
  if constexpr (kWsCapable) {
    convert.dq_accum_fragment_order = ws && kBwdWsSplit<kHeadDim>;
  }
  bool overlapped = false;
  if constexpr (kOverlapCapable) {
    if (ws && key_blocks_done != nullptr) {
      overlapped = true;
      convert.key_blocks_done = key_blocks_done;
      convert.key_blocks_per_head = bwd_ws_key_blocks<kHeadDim>(p);
      cudaLaunchAttribute attribute{};
      attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attribute.val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t launch{};
      launch.gridDim = dim3(unsigned(row_ctas));
      launch.blockDim = dim3(kRowThreads);
      launch.stream = stream;
      launch.attrs = &attribute;
      launch.numAttrs = 1;
      err = cudaLaunchKernelEx(&launch, &bwd::bwd_convert_dq_kernel<T, kHeadDim, kRowThreads, /*kAfterHeads=*/true>,
                               convert);
    }
  }
  if (!overlapped) {
    bwd::bwd_convert_dq_kernel<T, kHeadDim, kRowThreads><<<unsigned(row_ctas), kRowThreads, 0, stream>>>(convert);
    err = cudaGetLastError();
  }
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// sm_90a instances (kArch 901), unless switched off (set_sm90_backward), take the wgmma tile configs where there is one
// (bwd_tile_config.h) for the plain path; the score-mod path keeps the sm80 one (with wgmma, ptxas spilled 0.2-5 KB a
// thread there: the recomputed score's loads and S, dP, dK, dV all live at once). Switched off, they run the sm80
// configs: what a build with 90a but without 90 ran before.
// The sm80-path instances (kArch < 90) take the small-shared-memory tiles where the regular ones (with the key-row
// bias variant's extra key block of bias) exceed the device's per-block limit (sm86 / sm89: 99 KB), or when forced
// (set_bwd_small_tiles). (sm90 GPUs allow 227 KB: their instances never need them.)
template <typename T, int kHeadDim, int kArch>
const char* run_bwd_instance(const AttentionParams& p, cudaStream_t stream) {
  if constexpr (kArch == 901) {
    if (sm90_backward()) {
      return run_bwd_with_config<T, typename BwdTileConfigSm90a<kHeadDim>::type, kArch, BwdTileConfig<kHeadDim>>(
          p, stream);
    }
    return run_bwd_with_config<T, BwdTileConfig<kHeadDim>, kArch>(p, stream);
  } else {
    bool small = bwd_small_tiles();
    if (!small) {
      const int limit = device_smem_optin_limit();
      small = limit > 0 && bwd_key_bias_smem_bytes<BwdTileConfig<kHeadDim>>() > limit;
    }
    if (small) return run_bwd_with_config<T, BwdTileConfigSmall<kHeadDim>, kArch>(p, stream);
    return run_bwd_with_config<T, BwdTileConfig<kHeadDim>, kArch>(p, stream);
  }
}

}  // namespace fa2
