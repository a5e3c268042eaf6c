// Host entry points of the CUDA backward: plain C++, no torch (the forward's are in launch.h). run_bwd returns
// nullptr on success, else a message (valid until the next failing call on this thread). Asynchronous on `stream`.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

#include "fa2/params.h"

namespace fa2 {

// The instantiated backward headdim that serves a (multiple-of-8) headdim, or -1 when this build has none.
int bwd_headdim_rounded(int headdim);

// int32s of scratch the backward needs in params.workspace. params.deterministic: 1 (ticket counter) + batch *
// nheads * ceil(seqlen_q / block_m) (one turn counter per query block; block_m the smaller of the sm80 shapes',
// bwd_min_block_m), zeroed by the caller. Otherwise, at the headdims whose sm_90a warp-specialized kernel has its dQ
// conversion overlap its last CTAs (bwd_tile_config.h, kOverlapDqConversion: d 128), batch * nheads (that kernel's
// finished-CTA counts per head: params.h, key_blocks_done), and where it splits its last wave the split's scratch
// (bwd_tail_split_plan), all of which the backward zeroes itself; else 0. Without them (workspace nullptr) the
// conversion runs after the main kernel and nothing is split. (Defined in dispatch.cpp, which the kernel harness
// links.)
int64_t bwd_workspace_ints(const AttentionParams& params);

// Whether the backward prefers its sm_90a instances on a compute capability 9.0 GPU (wgmma products where the
// headdim allows: bwd_tile_config.h) over the sm80-path ones of the same build. Default: yes (1.16-1.29x the
// sm80-path backward on the H200 at d 64/128/256), unless the environment has FA2_DISABLE_SM90_BACKWARD=1 (switched
// off, a build with 90a and without 90 runs its sm_90a instances with the sm80-path tiles).
void set_sm90_backward(bool enabled);
bool sm90_backward();

// Whether the sm_90a backward runs its warp-specialized main kernel (bwd_ws_kernel.cuh: a TMA producer thread, the
// transposed scores in registers; bwd_ws_dsplit_kernel.cuh at d 256) where it applies: headdims with a BwdWsConfig
// (bwd_ws_headdim), the plain path (no softcap, no bias) or its key-row bias variant (padding masks without dbias),
// not deterministic, lse / softmax_d / dq_accum 16-byte aligned, q / dout / k / v addressable by the TMA (no zero
// stride: a broadcast dout, for one); elsewhere, and wherever a tensor map is rejected, bwd_kernel.cuh's kernels
// run. Default: yes, unless the environment has FA2_DISABLE_SM90_WS_BACKWARD=1 (then bwd_kernel.cuh's wgmma
// instances run those too).
void set_sm90_ws_backward(bool enabled);
bool sm90_ws_backward();

// Whether a key-row bias (padding masks: one value per key; no softcap, no dbias) runs the backward's plain path
// with the bias read once per key block (bwd_kernel.cuh, kKeyBias) instead of the score-mod path (which reads it per
// score, on the sm80 tiles). Default: yes (on the H200, bf16, 10% of keys padded: 2.6-3.2x the general bias path's
// backward at d 64, 2.0-2.4x at d 128, 1.4-1.5x at d 256), unless the environment has FA2_DISABLE_KEY_BIAS_BWD=1.
void set_key_bias_backward(bool enabled);
bool key_bias_backward();

// Whether the sm80-path backward always runs its small-shared-memory tiles (bwd_tile_config.h,
// bwd_tile_shape_small), which it otherwise takes only on GPUs whose per-block limit the regular ones exceed (sm86 /
// sm89). For testing them on any GPU; the environment's FA2_BWD_SMALL_TILES=1 until set.
void set_bwd_small_tiles(bool enabled);
bool bwd_small_tiles();

// Whether a GQA / MQA backward (params.gqa_dkv kInKernel) may have each CTA sum a whole group of query heads into
// dK, dV (the sm_90a warp-specialized kernels, d 64 / 128 / 256): 1 wherever they run, 0 never (one CTA per query
// head: fp32 accumulators or partials, below), -1 (the default) where the grouped grid still fills the GPU
// (bwd_tile_config.h, kBwdGqaGroupMinWaveFill / kBwdGqaGroupMinWavesCausal). For A/B timing and tests;
// FA2_BWD_GQA_GROUPING=0 / 1 in the environment until set.
void set_bwd_gqa_grouping(int mode);
int bwd_gqa_grouping();

// Whether a GQA / MQA backward whose CTAs do not each sum a group, where the warp-specialized kernel runs, has each
// query head's CTAs add their dK, dV into fp32 accumulators per kv head (GqaDkv::kAccumulate, converted by the
// caller) rather than store fp32 partials per query head for the caller to sum (kPartials: h_h_k_ratio times the
// memory, and a reduction over it). Default: yes, unless the environment has FA2_BWD_GQA_NO_ACCUMULATE=1. The
// deterministic mode keeps the partials (a fixed-order sum). For A/B timing and tests.
void set_bwd_gqa_accumulate(bool enabled);
bool bwd_gqa_accumulate();

// The warp-specialized backward's split of its grid's last partial wave for a call (tile_order.h, tail_split, with
// bwd_tile_config.h's kBwdTailSplitTuning; bwd_ws_kernel.cuh): pieces > 1 where it splits: bwd_tail_split() 1, or
// -1 (auto) with at least the headdim's kTailSplitMinQueryBlocks query blocks a tile; not deterministic, no causal
// mask or window, no bias or softcap, no GQA, a headdim whose kernel has it (BwdWsTileConfig::kTailSplit: 64, 128), a
// compute capability 9.0 GPU, the sm_90a and ws backward switched on. The split tiles' dK, dV are then fp32 sums
// added in no fixed order (as dQ's are outside the deterministic mode). Its scratch (bwd_workspace_ints counts it)
// follows the finished-CTA counts in params.workspace: workspace_offset ints, then zero_ints ints (a count per tail
// tile, rounded up to 4, then fp32 dK and dV rows) that bwd_preprocess_kernel zeroes. The launcher splits only where
// params.workspace_ints holds it.
struct BwdTailSplitPlan {
  int tiles = 0;       // the grid's last `tiles` tiles (key block, head) are split
  int pieces = 1;      // into this many CTAs each
  int grid_tiles = 0;  // of this many
  // its scratch in the workspace (ints), which the backward zeroes: from workspace_offset (past the overlapped dQ
  // conversion's counts) one count per split tile, then from dkv_offset (the counts rounded up to 16 bytes, the
  // TMA's alignment) the fp32 dK rows of the split tiles, then their dV rows (tiles x block_n rows of headdim_rounded
  // each: params.h, bwd_tail_dkv); zero_ints in all
  int64_t workspace_offset = 0;
  int64_t dkv_offset = 0;
  int64_t zero_ints = 0;
};
BwdTailSplitPlan bwd_tail_split_plan(const AttentionParams& params);
// -1 (auto, the default), 0 never, 1 wherever the cost model gains (tests, A/B timing); FA2_BWD_TAIL_SPLIT=0 / 1 in
// the environment until set.
void set_bwd_tail_split(int mode);
int bwd_tail_split();

// run_bwd's answers, with nothing launched, to a GQA / MQA call whose params.gqa_dkv no kernel that would run serves:
// the caller gives fp32 accumulators per kv head, zeroed (gqa_dkv kAccumulate), or fp32 partials per query head
// (kPartials, which every kernel serves), and calls again.
extern const char* const kBwdNeedsGqaAccumulators;
extern const char* const kBwdNeedsGqaPartials;

// Backward: fills dq, dk, dv (and dbias when params.dbias != nullptr). Needs, besides the forward's conditions
// (launch.h: headdim a multiple of 8, 16-byte aligned tensors, strides multiples of 8 elements, non-empty sizes):
//   params.headdim_rounded == bwd_headdim_rounded(params.headdim);
//   lse (batch, nheads, seqlen_q) contiguous; softmax_d: (batch, nheads, seqlen_q) fp32 scratch;
//   dq_accum: (batch, nheads, seqlen_q, headdim_rounded) fp32 scratch (zeroed by the backward itself);
//   dq (and dout, out) with the forward's alignment; dk/dv: f16/bf16 (batch, seqlen_k, nheads_k, d) when
//   h_h_k_ratio == 1 or gqa_dkv is kInKernel (the sm_90a warp-specialized kernel needs them 16-byte aligned,
//   strides multiples of 8 elements, or is not used: bwd_ws_applies), else fp32 as params.h's GqaDkv says (a GQA call
//   whose gqa_dkv no kernel that would run serves returns kBwdNeedsGqaAccumulators or kBwdNeedsGqaPartials);
//   dbias (optional): fp32 (batch, nheads, seqlen_q, seqlen_k) contiguous, zeroed (only the visible blocks are
//   written);  workspace: bwd_workspace_ints(params)
//   int32s (zeroed by the caller when deterministic), or nullptr where that is 0 (and, when not deterministic, to
//   run the dQ conversion after the main kernel), and workspace_ints its size (the tail split runs only where it
//   holds the split's scratch).
const char* run_bwd(const AttentionParams& params, cudaStream_t stream);

}  // namespace fa2
