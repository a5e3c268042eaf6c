// The plan of one call: which compiled kernel runs, with what grid, block, shared memory and scratch, and why. The
// host builds it once from the params, a description of the device and the development options; the torch glue
// allocates the workspace it names and the launcher (fwd/bwd_launch_template.cuh) runs it, deciding nothing.
// Plain C++ (no CUDA, no torch): the CPU-only build compiles it too, so that a plan can be printed and tested for a
// described GPU (fa2.dev.explain_plan, python -m fa2 plan).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fa2/dev_options.h"
#include "fa2/params.h"
#include "fa2/tile_config.h"  // Sm90Schedule

namespace fa2 {

// What the plan needs to know of a GPU (dispatch.cpp's current_device() asks CUDA once per device).
struct DeviceDesc {
  int cc = 0;           // compute capability as 10 * major + minor: 80 (A100), 86, 89, 90 (H100 / H200)
  int sm_count = -1;    // -1: unknown (no persistent grid, no tail order)
  int smem_optin = -1;  // opt-in dynamic shared memory per block in bytes; -1: unknown (not checked)
};

// One compiled instance (the generated fa2_kernel_instances.h lists them): its dtype, headdim and the arch its
// SASS was built for (80, 86, 90; arch_specific: sm_90a, which runs on exactly compute capability 9.0).
struct InstanceDesc {
  DType dtype;
  int headdim;
  int arch;
  bool arch_specific;
};

// The InstanceDesc of an instance's template arguments (arch_tag: its kernels' tag, 800 / 900 / 901).
constexpr InstanceDesc instance_desc(bool bf16, int headdim, int arch_tag) {
  return InstanceDesc{bf16 ? DType::kBFloat16 : DType::kFloat16, headdim, arch_tag / 10, arch_tag % 10 == 1};
}

// Notes on why each choice was made, filled only where the caller asks (printing a plan; launches pass nullptr).
using PlanNotes = std::vector<std::string>;

// The forward's score path (the kernels' fwd::ScoreMode, same values).
enum class FwdScore : int { kPlain = 0, kBiasFold = 1, kGeneral = 2, kKeyBiasFold = 3 };

struct FwdPlan {
  const char* error = nullptr;  // set: nothing may run (the message says why)
  int instance = -1;            // index into the instance table the plan was built from
  int arch_tag = 0;             // the kernel's tag: 10 x arch (+ 1 for sm_90a): 800, 860, 900, 901
  int headdim = 0;              // the instance's headdim
  FwdScore score = FwdScore::kPlain;
  BiasType bias = BiasType::kNone;
  bool warp_specialized = false;  // the sm_90a producer/consumer kernel (a 1-D grid over tiles)
  Sm90Schedule schedule = Sm90Schedule::kPipelined;  // its schedule; kPipelined for the other kernels
  bool tile_counter = false;     // persistent CTAs claim tiles from a counter in the workspace
  bool cluster = false;          // clusters of two sharing K/V loads, if the device runs such pairs (launch time)
  bool persistent_grid = false;  // fewer CTAs than tiles
  bool key_bias_tma = false;     // the key-row bias' tiles loaded by the TMA (its tensor map is built)
  int block_m = 0, num_m_blocks = 0;
  int64_t grid_x = 0;
  int grid_y = 1, grid_z = 1;
  int threads = 0, smem = 0;
  int tile_order_tail = 0;     // params.tile_order_tail for the kernel
  int64_t workspace_ints = 0;  // zeroed int32s the caller passes in params.workspace
  // packed sequences (params.h, is_varlen): on compute capability 9.0 the sm_90a kernels with kVarlen (arch_tag 901:
  // TMA loads over the packed tensors, each headdim's default schedule, grids as a dense call's of max_seqlen_q's
  // query blocks x nheads x sequences, no clusters) while option sm90_varlen is on; elsewhere, or with it off, the
  // sm80 path's kernel with kVarlen (arch_tag 800 .. 900) from an sm80-path instance (Hopper: the sm_90 one; in a
  // build without those, an sm_90a one carries it), on a (query blocks of max_seqlen_q, nheads, sequences) grid
  bool varlen = false;
  // the warp-specialized varlen kernel's stage masks (params.h, varlen_stage_masks; option varlen_stage_masks)
  bool stage_masks = false;
  // keys and values in a paged cache (params.h, has_paged_kv): the sm_90a varlen kernels' TMA loads a box per page
  // (FwdTmaLoads::for_each_page_box); elsewhere (the sm80 path's cp.async loads, dropout) the plan declines with
  // kPagedKvDeclined (paged_declined) and the KV-cache op gathers the pages instead
  bool paged = false, paged_declined = false;
  // dropout (params.h, has_dropout): the kernel with kDropout, plain or general score path: on compute capability 9.0
  // the pipelined sm_90a one (arch_tag 901; not warp_specialized) while option sm90_dropout is on, else the sm80
  // path's from an sm80-path instance as varlen's
  bool dropout = false;
};

// FwdPlan::error where a paged cache's call runs on kernels that cannot read pages (with paged_declined: the caller
// falls back on this decline alone, any other error stays an error).
inline constexpr const char* kPagedKvDeclined =
    "fa2: a paged key/value cache is read by the sm_90a varlen forward kernels only (compute capability 9.0 with the "
    "TMA loads and options sm90_varlen and paged_kv_in_place, no dropout)";

// The backward's tile configs (bwd_tile_config.h): the sm80 ones, sm_90a's wgmma ones (the score-mod path keeps the
// sm80 ones), or the sm80 small-shared-memory ones.
enum class BwdTiles : int { kSm80 = 0, kSm90a = 1, kSmall = 2 };
// The backward's main kernel: the sm_90a warp-specialized one (bwd_ws_kernel.cuh, at d 256 bwd_ws_dsplit_kernel.cuh),
// or bwd_kernel.cuh's on the plain path, its key-row bias variant, or the score-mod path.
enum class BwdMain : int { kWarpSpecialized = 0, kPlain = 1, kKeyBias = 2, kScoreMod = 3 };

// The warp-specialized backward's split of its grid's last partial wave (tile_order.h, tail_split): the last
// `tiles` of its `grid_tiles` tiles run as `pieces` CTAs each. Its scratch in the workspace (which the backward
// zeroes): from workspace_offset one count per split tile, then from dkv_offset (16-byte aligned) the split tiles'
// fp32 dK rows, then their dV rows; zero_ints in all.
struct BwdTailSplitPlan {
  int tiles = 0;
  int pieces = 1;
  int grid_tiles = 0;
  int64_t workspace_offset = 0;
  int64_t dkv_offset = 0;
  int64_t zero_ints = 0;
};

struct BwdPlan {
  const char* error = nullptr;
  int instance = -1;
  int arch_tag = 0;
  int headdim = 0;
  BwdTiles tiles = BwdTiles::kSm80;
  BwdMain main = BwdMain::kPlain;
  bool key_bias = false;   // a key-row bias on the plain path's schedule (ws or bwd_kernel)
  bool row_stats = false;  // bwd_row_stats_kernel runs first (softcap or a bias): params.row_lse / row_shift needed
  bool gqa = false;                     // a GQA / MQA call (nheads > nheads_k)
  GqaDkv gqa_dkv = GqaDkv::kPartials;  // what params.dk / dv must hold for a GQA call (params.h)
  BwdTailSplitPlan tail_split;
  bool dq_overlap = false;  // the dQ conversion overlaps the ws kernel's last CTAs (counts in the workspace)
  bool programmatic_main = false;  // the ws kernel is a programmatic dependent launch of the preprocess kernel
  int tile_order_tail = 0;
  int64_t grid_x = 0;
  int grid_y = 1, grid_z = 1;
  int threads = 0, smem = 0;
  int64_t workspace_ints = 0;
  bool zero_workspace = false;  // the caller zeroes the workspace (the deterministic mode's counters)
  // packed sequences (params.h, is_varlen): bwd_kernel.cuh's kernel with kVarlen, on a (key blocks of max_seqlen_k,
  // nheads, sequences) grid; on compute capability 9.0 while options sm90_varlen and sm90_backward are on the sm_90a
  // one (arch_tag 901: the wgmma tiles, the sm80 ones on the score-mod path; not yet the warp-specialized kernel),
  // elsewhere the sm80 tiles (arch_tag 800 .. 900, as FwdPlan::varlen); no row statistics kernel (softcap: the caller
  // passes row_lse = lse and a zero row_shift)
  bool varlen = false;
  // dropout (params.h, has_dropout): bwd_kernel.cuh's kernel with kDropout (never the ws kernel), the plain path
  // (kPlain) or the score-mod path (softcap, any bias: kScoreMod): the sm_90a wgmma tiles on the plain path at their
  // headdims on compute capability 9.0 (option sm90_dropout), else the sm80 tiles from an sm80-path instance as
  // varlen's
  bool dropout = false;
};

// How the plan treats the call's buffers: kDecide (the torch glue) sizes the workspace and, for GQA, picks what
// dk / dv hold, to be allocated as the plan says; kGiven (the kernel harness) takes params.workspace /
// workspace_ints and params.gqa_dkv as they are and plans around them.
enum class PlanBuffers : int { kDecide = 0, kGiven = 1 };

// The plans. params: as for run_fwd / run_bwd, less the buffers the plan sizes (with kDecide: the workspace; for a
// GQA backward dk / dv as like k, gqa_dkv kInKernel). instances: the compiled ones (or, for a described device, the
// ones a build would have). notes: where non-null, one line per decision ("what: why").
FwdPlan plan_fwd(const AttentionParams& params, const DeviceDesc& device, const DevOptions& options,
                 const InstanceDesc* instances, int num_instances, PlanBuffers buffers = PlanBuffers::kDecide,
                 PlanNotes* notes = nullptr);
BwdPlan plan_bwd(const AttentionParams& params, const DeviceDesc& device, const DevOptions& options,
                 const InstanceDesc* instances, int num_instances, PlanBuffers buffers = PlanBuffers::kDecide,
                 PlanNotes* notes = nullptr);
// The same plan with the warp-specialized kernel's tensor maps rejected at launch (the only thing the plan cannot
// know: the driver's encoder): bwd_kernel.cuh's kernel instead, no split, no overlap; an error for a GQA call whose
// dk / dv only that kernel serves (the caller then plans with partials: with_partials).
BwdPlan plan_bwd_without_ws(const BwdPlan& plan, const AttentionParams& params, const DeviceDesc& device);

// The same plan without its tail split (the encoder rejected the split's maps): one CTA per tile.
BwdPlan plan_bwd_without_tail_split(const BwdPlan& plan, const AttentionParams& params);

// The split the warp-specialized backward would make of a plain call (a part of plan_bwd, for tests and the harness).
BwdTailSplitPlan bwd_tail_split_plan(const AttentionParams& params, const DeviceDesc& device,
                                     const DevOptions& options);

// The smallest instantiated headdim >= headdim among the instances, or -1.
int plan_rounded_headdim(const InstanceDesc* instances, int num_instances, int headdim);

// The one headdim the kernels run a call at: the larger of q/k's and v's head dims, rounded up to a multiple of 8 (the
// torch glue zero-pads q, k, v, out and dout to it where they differ: cpp/cuda/params_from_tensors.h).
constexpr int kernel_headdim(int headdim_qk, int headdim_v) {
  return ((headdim_qk > headdim_v ? headdim_qk : headdim_v) + 7) / 8 * 8;
}

// What the glue zero-pads for a call (params.call_headdim_qk / call_headdim_v against kernel_headdim), as text, e.g.
// "v from headdim 128 to 192 (zero-padded copies)"; "" where q, k and v are read at their own headdim.
std::string headdim_padding(const AttentionParams& params);

// The kernel a plan names, as text (e.g. "fwd_kernel<bf16, 128, sm90a, plain, none, ws pingpong-overlap, tile
// counter>"), and the whole plan as "key: value" lines.
std::string fwd_kernel_name(const FwdPlan& plan, DType dtype);
std::string bwd_kernel_name(const BwdPlan& plan, DType dtype);
std::vector<std::pair<std::string, std::string>> describe(const FwdPlan& plan, DType dtype);
std::vector<std::pair<std::string, std::string>> describe(const BwdPlan& plan, DType dtype);

}  // namespace fa2
