// Development options: every switch that makes fa2 run a kernel other than its default, in one struct, so that A/B
// timing and tests can pick variants on one build. Plain C++ (no CUDA, no torch): the plan builder (plan.h) takes a
// DevOptions by value, and so does the CPU-only build's plan printer. Defaults are what users run.
#pragma once
#include <string>

#include "fa2/tile_config.h"  // Sm90Schedule

namespace fa2 {

struct DevOptions {
  // sm_XXa instances (sm_90a: wgmma, TMA) may be chosen on their GPU; off: the sm80-path ones of the same build
  bool arch_specific_kernels = true;
  // the sm_90a forward's key-loop schedule; kAuto: each headdim's measured best (sm90_default_schedule)
  Sm90Schedule sm90_schedule = Sm90Schedule::kAuto;
  // the warp-specialized forward's persistent grid: -1 one CTA per SM where it pays, 0 never, n > 0 at most n CTAs
  int persistent_forward_ctas = -1;
  // the persistent d 128 forward in clusters of two sharing K/V loads where a call allows them
  bool fwd_cluster = true;
  // causal-length launches end with tile_order.h's rank-major tail; off: head by head
  bool tile_order_tail = true;
  // the backward prefers its sm_90a (wgmma) instances on compute capability 9.0
  bool sm90_backward = true;
  // the sm_90a backward runs its warp-specialized kernel where it applies
  bool sm90_ws_backward = true;
  // a key-row bias (padding mask) runs the backward's plain path with the bias per key block
  bool key_bias_backward = true;
  // the sm80-path backward always takes its small-shared-memory tiles (otherwise only where the regular ones
  // exceed the GPU's per-block limit)
  bool bwd_small_tiles = false;
  // GQA backward: each CTA sums a whole group: -1 where the grouped grid still fills the GPU, 0 never, 1 always
  int bwd_gqa_grouping = -1;
  // GQA backward without grouping, where the warp-specialized kernel runs: fp32 accumulators per kv head (on) or
  // fp32 partials per query head (off)
  bool bwd_gqa_accumulate = true;
  // the warp-specialized backward's split of its last partial wave: -1 where measured to pay, 0 never, 1 wherever
  // the cost model gains
  int bwd_tail_split = -1;
  // the CPU's bf16 tile products on bf16 operands where the CPU has bf16 dot products (cpu/blas.h); off: converted
  // to fp32 for sgemm
  bool cpu_bf16_gemm = true;
  // varlen calls run the sm_90a kernels on compute capability 9.0 (the forward's: TMA over the packed tensors; the
  // backward's: bwd_kernel's wgmma tiles, while sm90_backward is on); off: the sm80 path's varlen kernels there too
  bool sm90_varlen = true;
  // dropout calls run the sm_90a kernels on compute capability 9.0 (the pipelined forward; bwd_kernel's wgmma tiles on
  // the plain path, while sm90_backward is on); off: the sm80 path's dropout kernels there too
  bool sm90_dropout = true;
  // dropout backwards at d 64 / 128 (plain path, not varlen) run the warp-specialized bwd_ws_kernel, which draws the
  // forward's keep bits for its transposed fragments (fa2/dropout.cuh, TransposedKeep); off: bwd_kernel's wgmma tiles
  bool sm90_ws_dropout = true;
  // fa2.attention's decode-shaped CUDA calls (few query rows per kv head, no bias / dropout / sinks) run the KV-cache
  // op's decode kernel (split-KV, the kv head's query heads together); off: the dense forward kernels
  bool dense_decode = true;
  // the sm_90a warp-specialized backward's main kernel is a programmatic dependent launch of the preprocess kernel
  // (its launch and its K / V loads overlap the preprocess's last wave; it waits for D and the zeroed dq_accum
  // before it needs them); off: launched after the preprocess completes
  bool bwd_programmatic_main = true;
  // the sm_90a warp-specialized varlen forward's producer marks the K/V stages whose key block needs the mask, and
  // the consumers reload the sequence's bounds only for those (params.h, varlen_stage_masks); off: the consumers
  // reload them for every key block
  bool varlen_stage_masks = true;
  // a d 256 varlen backward's dq_accum in whole blocks a sequence, which the headdim-split ws kernel adds in its
  // fragment order (params.h, varlen_dq_head_rows; bwd_launch.h, varlen_dq_block_rows); off: row-major red.v2
  bool varlen_dq_blocks = true;
  // a paged KV cache's chunked prefill read in place by the sm_90a varlen forward (params.h, block_table; FwdPlan::
  // paged); off: the plan declines (kPagedKvDeclined) and the KV-cache op gathers the pages first
  bool paged_kv_in_place = true;
  // the CPU forward's short query runs under GQA (fewer queries than a tile's rows, no dropout) as tiles of a kv
  // head's query heads, each K / V tile read once for them (cpu/fwd_kernel.h, TileRows); off: a tile a head
  bool cpu_head_tiles = true;
  // the CPU forward's short query runs (no dropout) whose tiles give fewer tasks than threads: each tile's keys split
  // into whole key blocks, merged after (cpu/tile_config.h, fwd_key_splits); -1: as many as fill the threads, 0 / 1:
  // none, n > 1: n (at most one a key block)
  int cpu_key_splits = -1;
};

// The names of DevOptions' fields, in declaration order (the keys of set_dev_option and FA2_DEV_OPTIONS).
extern const char* const kDevOptionNames[];
extern const int kNumDevOptions;

// The process's options: the defaults, then FA2_DEV_OPTIONS (read once, at the first call), then set_dev_options.
// Returns nullptr and sets *out, or a message when the environment names no option or a bad value (the defaults are
// then returned in *out).
const char* dev_options(DevOptions* out);
// Replaces the process's options (for A/B timing and tests; takes effect at the next call into the kernels).
void set_dev_options(const DevOptions& options);

// One option of `options` set from text (`value` as FA2_DEV_OPTIONS spells it: 0/1/true/false/on/off for switches,
// an integer for counts and modes, a schedule name for sm90_schedule): nullptr, or a message naming the problem.
const char* set_dev_option(DevOptions* options, const char* key, const char* value);
// "key=value,key=value" (FA2_DEV_OPTIONS' syntax) applied to *options in order: nullptr, or a message.
const char* parse_dev_options(const char* text, DevOptions* options);
// An option's value as text (set_dev_option's spelling), or "" for an unknown key.
std::string dev_option_value(const DevOptions& options, const char* key);

}  // namespace fa2
