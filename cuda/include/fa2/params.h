// The one parameter struct every fa2 CUDA kernel takes. Plain C++: nothing here (or anywhere under cuda/)
// includes torch, ATen or c10. Strides are in elements, int64 so that tensors past 2^31 elements index correctly.
#pragma once
#include <cstdint>

namespace fa2 {

enum class DType : int { kFloat16 = 0, kBFloat16 = 1 };
enum class BiasType : int { kNone = 0, kSameAsInput = 1, kFloat32 = 2, kBool = 3 };

// GQA / MQA backward (h_h_k_ratio > 1): what params.dk / params.dv hold and who sums each group of query heads.
enum class GqaDkv : int {
  // fp32 (batch, seqlen_k, nheads, headdim): each query head's own dK, dV, which the caller sums over each group of
  // h_h_k_ratio heads (any kernel; a fixed-order sum, so the deterministic mode's)
  kPartials = 0,
  // fp32 (batch, nheads_k, seqlen_k, headdim_rounded) contiguous (given by strides as (batch, seqlen_k, nheads_k)),
  // zeroed by the caller: each query head's CTAs add theirs into their kv head's rows (the TMA's reduce-add, or
  // red.global.add; the sm_90a warp-specialized kernels only), the caller rounds them to dk, dv
  kAccumulate = 1,
  // like k, (batch, seqlen_k, nheads_k, headdim): each of the kernel's CTAs sums a whole group in its registers (the
  // sm_90a warp-specialized kernels only, ws_groups_gqa)
  kInKernel = 2,
};

struct AttentionParams {
  // ---- forward inputs ---------------------------------------------------------------------------------
  const void* q = nullptr;  // (batch, seqlen_q, nheads, headdim)
  const void* k = nullptr;  // (batch, seqlen_k, nheads_k, headdim)
  const void* v = nullptr;  // (batch, seqlen_k, nheads_k, headdim)
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;

  // Additive bias read through strides, 0 on broadcast dims (never materialized); bool: true = keep.
  const void* bias = nullptr;  // logically (batch, nheads, seqlen_q, seqlen_k)
  BiasType bias_type = BiasType::kNone;
  int64_t bias_batch_stride = 0, bias_head_stride = 0, bias_row_stride = 0, bias_col_stride = 0;

  // ---- forward outputs --------------------------------------------------------------------------------
  void* out = nullptr;    // (batch, seqlen_q, nheads, headdim)
  float* lse = nullptr;   // (batch, nheads, seqlen_q) contiguous; natural log; +inf for a row that sees no key
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;

  // ---- sizes ------------------------------------------------------------------------------------------
  int batch = 0, seqlen_q = 0, seqlen_k = 0, nheads = 0, nheads_k = 0;
  int headdim = 0;         // q's, k's and v's (<= 256; the glue pads them to one: call_headdim_qk / _v below)
  int headdim_rounded = 0; // the instantiated kernel's headdim (>= headdim); loads/stores are predicated
  int h_h_k_ratio = 1;     // nheads / nheads_k: query head h reads kv head h / h_h_k_ratio

  // ---- softmax and masking ----------------------------------------------------------------------------
  float scale = 0.f;       // softmax scale applied to q.k
  float scale_log2 = 0.f;  // scale * log2(e), folded into one FMA before exp2 (no softcap, no bias)
  float softcap = 0.f;     // 0 = off; else s = softcap * tanh(s * scale / softcap)
  // Derived by the forward's launcher (fwd_launch_template.cuh), not the caller: 1 / scale (what a bias is folded
  // by) and -kHeavyRowLog2 / scale_log2 (softmax.cuh's heavy-row bound). Divisions in the kernel (IEEE, with a
  // slow-path call) cost the 128-register d 64 kernels spills in their key loop (ptxas); on the host they round the
  // same.
  float inv_scale = 0.f;
  float heavy_score = 0.f;
  bool is_causal = false;  // informational; already folded into window_right
  int window_left = -1;    // query i sees keys [i + sk - sq - window_left, i + sk - sq + window_right]; -1 = unbounded
  int window_right = -1;

  DType dtype = DType::kFloat16;

  // ---- backward ---------------------------------------------------------------------------------------
  const void* dout = nullptr;  // like out
  int64_t dout_batch_stride = 0, dout_row_stride = 0, dout_head_stride = 0;
  void* dq = nullptr;  // like q, contiguous (batch, seqlen_q, nheads, headdim)
  void* dk = nullptr;  // like k, contiguous (batch, seqlen_k, nheads_k, headdim)
  void* dv = nullptr;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;
  // GQA / MQA (h_h_k_ratio > 1): where the dK, dV of a group's query heads are summed (GqaDkv). Ignored without GQA.
  GqaDkv gqa_dkv = GqaDkv::kPartials;
  float* softmax_d = nullptr;   // D = rowsum(dout * out), fp32 (batch, nheads, seqlen_q), contiguous
  float* dq_accum = nullptr;    // fp32 accumulator for dq, layout chosen by the backward launcher
  float* dbias = nullptr;       // fp32 (batch, nheads, seqlen_q, seqlen_k) when the bias needs a gradient
  // Score-mod path (softcap or bias), both (batch, nheads, seqlen_q) fp32, written by bwd_row_stats_kernel:
  // P = exp(s - row_shift - row_lse); (0, lse) for ordinary rows, (m, log l) for rows whose lse cannot carry log l.
  float* row_lse = nullptr;
  float* row_shift = nullptr;
  bool deterministic = false;

  void* workspace = nullptr;    // scratch given by the caller (allocated by torch's caching allocator)

  // Derived by the launchers from the plan (plan.h, tile_order_tail), not the caller: how many of the last
  // (batch, head) pairs start their blocks longest first across heads (tile_order.h); 0: head by head throughout.
  // (Last in the struct: the other fields keep their offsets in the kernels' parameter space.)
  int tile_order_tail = 0;
  // Set by the backward launcher for its dQ conversion only: dq_accum's whole blocks of DqFragmentOrder::kRows
  // queries are in DqFragmentOrder (bwd/dq_fragment_order.h: the headdim-split ws backward's, bwd_ws_dsplit_kernel.cuh), the
  // rest row-major.
  bool dq_accum_fragment_order = false;
  // Set by the forward launcher from the plan (FwdPlan::stage_masks): the warp-specialized varlen kernel's producer
  // marks each K/V stage whose key block needs the mask (FwdBarriers::masked_stages), and the consumers load the
  // sequence's bounds only for those, instead of for every key block
  bool varlen_stage_masks = false;
  // Set by the backward launcher (bwd_launch_template.cuh) where its dQ conversion overlaps the warp-specialized main
  // kernel's last CTAs (programmatic dependent launch): per (batch, head), how many of the main kernel's CTAs have
  // finished (params.workspace, zeroed by bwd_preprocess_kernel); the conversion of a head's rows waits until that
  // is key_blocks_per_head. nullptr: the conversion runs after the main kernel, as the stream orders it.
  int* key_blocks_done = nullptr;
  int key_blocks_per_head = 0;
  // Set by the backward launcher where the warp-specialized kernel splits its grid's last partial wave (plan.h,
  // BwdTailSplitPlan; bwd_launch_template.cuh, apply_bwd_tail_split): the last bwd_tail_tiles of its
  // bwd_tail_grid_tiles (key block, head) tiles, in launch order, each run as bwd_tail_pieces CTAs over consecutive
  // parts of the tile's query blocks, which add their fp32 dK, dV into bwd_tail_dkv (dK rows, then dV rows:
  // bwd_tail_tiles * kBlockN each, headdim_rounded columns), count themselves in bwd_tail_counts (one per tail tile),
  // and the last of a tile's pieces stores its sums. All in params.workspace, zeroed by bwd_preprocess_kernel
  // (bwd_tail_zero_ints ints from bwd_tail_counts). 0 / nullptr: no split, one CTA per tile.
  int bwd_tail_pieces = 0;
  int bwd_tail_tiles = 0;
  int bwd_tail_grid_tiles = 0;
  int* bwd_tail_counts = nullptr;
  float* bwd_tail_dkv = nullptr;
  int64_t bwd_tail_zero_ints = 0;
  // params.workspace's size in int32s, as the caller allocated it (the backward's tail split runs only where its
  // scratch fits: the plan's workspace_ints sizes it)
  int64_t workspace_ints = 0;
  // The call's own head dims, q/k's and v's, before the glue zero-padded q, k, v (and out, dout) to the one headdim
  // above (a multiple of 8, the larger of the two: cpp/cuda/params_from_tensors.h). Only the plan's notes read them
  // (plan.h, headdim_padding); 0: not given (the same as headdim).
  int call_headdim_qk = 0;
  int call_headdim_v = 0;

  // ---- variable length (packed sequences: varlen_fwd / varlen_bwd) ---------------------------------------
  // Set (cu_seqlens_q non-null): q, out, dout, dq are (total_q, nheads, headdim) and k, v, dk, dv (total_k, nheads_k,
  // headdim) (the batch strides are unused); sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q and
  // from cu_seqlens_k[b] on of k (int32, batch + 1 entries each, device memory), of length cu_seqlens_k[b + 1] -
  // cu_seqlens_k[b] or, with seqused_k (int32, batch entries), seqused_k[b]. batch counts the sequences; seqlen_q and
  // seqlen_k hold max_seqlen_q / max_seqlen_k (they size the grids: a block past its sequence's end exits). lse,
  // softmax_d, row_lse and row_shift are (nheads, total_q) and dq_accum (nheads, total_q, headdim_rounded): the
  // dense layouts of a batch of one over total_q rows (varlen_rows_view). GQA dK / dV partials (total_k, nheads,
  // headdim). (At the end of the struct: the dense kernels' parameter offsets stay as they were.)
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  const int* seqused_k = nullptr;
  int total_q = 0, total_k = 0;

  // ---- dropout (docs/design.md; fa2/philox.h, fa2/dropout.cuh) ------------------------------------------------
  // Set (rng_state non-null): each weight of P is kept iff its Philox draw (fa2/philox.h: seed, offset, and its
  // batch, head, query and key) is below dropout_keep_threshold = round((1 - p) 65536), and scaled by
  // dropout_keep_scale = 1 / (1 - p), after the softmax and before P V. rng_state: int64 (seed, offset) in device
  // memory (read by the kernels, so that a CUDA graph replays with the state written before each replay). The
  // sm80-path kernels only (plan.h: FwdPlan::dropout). (At the end: the other kernels' parameter offsets stay.)
  const int64_t* rng_state = nullptr;
  uint32_t dropout_keep_threshold = 65536;
  float dropout_keep_scale = 1.f;
  // ---- attention sinks (gpt-oss) ---------------------------------------------------------------------------
  // float32 (nheads,), device memory: each query head's extra logit in the softmax denominator, natural-log units,
  // used as given (not scaled, not softcapped); lse includes it. nullptr: none. Read once per row by the forward's
  // epilogue; the backward needs nothing (its P comes from lse).
  const float* sinks = nullptr;
  // ---- a varlen call's dQ accumulators in whole query blocks ----------------------------------------------------
  // Set by the varlen glue (non-zero) where dq_accum is (nheads, varlen_dq_head_rows, headdim_rounded) with each
  // sequence's query blocks from a block boundary (bwd/dq_fragment_order.h, DqFragmentOrder::varlen_block_row0), for
  // the headdim-split ws backward to add every block in its fragment order; the launcher clears it where another main
  // kernel runs (those add rows at (head, packed row), which the buffer also holds). varlen_sequences: the batch, set
  // by the launcher for the dQ conversion, which reads the rows as a batch of one (varlen_rows_view).
  int64_t varlen_dq_head_rows = 0;
  int varlen_sequences = 0;
  // ---- a paged key/value cache (the KV-cache op's chunked prefill: cpp/cuda/kvcache_cuda.cpp) ------------------
  // Set (block_table non-null, with the varlen fields): k and v are num_pages pages of (page_size, nheads_k,
  // headdim), k_batch_stride / v_batch_stride apart; key j of sequence b is row j % page_size of page
  // block_table[b * block_table_batch_stride + j / page_size] (int32, device memory, pages_per_sequence slots a
  // sequence; page_size a multiple of 16). The sm_90a forward kernels only (plan.h, FwdPlan::paged). page_box_rows:
  // set by the forward launcher, the keys one TMA box takes (a divisor of page_size and of the kernel's key block).
  const int* block_table = nullptr;
  int64_t block_table_batch_stride = 0;
  int page_size = 0, pages_per_sequence = 0, num_pages = 0, page_box_rows = 0;
  // ---- evenly spaced sequences (the KV-cache op's: cpp/cuda/kvcache_cuda.cpp) ---------------------------------
  // Set (varlen_q_rows_each > 0) instead of cu_seqlens_q / cu_seqlens_k, with the other varlen fields: sequence b is
  // q's rows [b * varlen_q_rows_each, (b + 1) * varlen_q_rows_each) and k's from row b * varlen_k_rows_apart on (not
  // read when paged), with clamp(seqused_k[b] + seqused_k_added, 0, seqlen_k) keys (seqlen_k of them without
  // seqused_k; seqused_k_added >= 0). The sm_90a forward kernels compute what index tensors would hold, so a chunk of
  // prefill needs no tensor op before its attention; the sm80 path's kernels and the backward read cu_seqlens (the glue
  // builds them: cpp/cuda/varlen_cuda.cpp).
  int varlen_q_rows_each = 0, varlen_k_rows_apart = 0, seqused_k_added = 0;
};

inline bool has_paged_kv(const AttentionParams& p) { return p.block_table != nullptr; }

inline bool has_dropout(const AttentionParams& p) { return p.rng_state != nullptr; }

inline bool is_varlen(const AttentionParams& p) { return p.cu_seqlens_q != nullptr || p.varlen_q_rows_each > 0; }

// A varlen call's rows as the dense layout of one batch element over total_q queries (and total_k keys): what the
// backward's row-wise kernels (D = rowsum(dO * O), the dQ conversion) read and write, unchanged.
inline AttentionParams varlen_rows_view(const AttentionParams& p) {
  AttentionParams rows = p;
  rows.batch = 1;
  rows.seqlen_q = p.total_q;
  rows.seqlen_k = p.total_k;
  rows.cu_seqlens_q = rows.cu_seqlens_k = rows.seqused_k = nullptr;
  rows.varlen_q_rows_each = 0;
  return rows;
}

// Whether the key (or query) blocks of a call have causal lengths: a causal mask or a window bounded on the right only
// (causal is folded into window_right), so that block n is seen by the blocks from its diagonal on. (Host: the
// launchers' tile order and the GQA backward's grouping.)
inline bool has_causal_lengths(const AttentionParams& p) { return p.window_left < 0 && p.window_right >= 0; }

// Whether the backward recomputes scores through softcap / bias (its score-mod path, which needs row_lse and
// row_shift) rather than from raw q.k. One place for the host glue that allocates them and the launcher.
inline bool bwd_uses_score_mod(const AttentionParams& p) {
  return p.softcap > 0.f || p.bias_type != BiasType::kNone;
}

}  // namespace fa2
