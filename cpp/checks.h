// Input checks shared by every backend (written once: CPU and CUDA both call these).
// Every failure raises a Python exception (RuntimeError/ValueError) naming the argument, what was expected and
// what was given.
#pragma once
#include <ATen/ATen.h>
#include <optional>
#include <string>

namespace fa2 {

// Sizes and flags of one attention call after validation. The causal flag is folded into the window:
// query i sees key j iff  i + sk - sq - window_left <= j <= i + sk - sq + window_right,  -1 = unbounded.
struct AttentionProblem {
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, nheads = 0, nheads_k = 0;
  int64_t headdim = 0;      // q's and k's (the q·k products)
  int64_t headdim_v = 0;    // v's, and so out's, dout's and dv's (may differ from headdim, as in DeepSeek's MLA)
  double scale = 1.0;       // resolved (headdim ** -0.5 when not given: q·k's head dim)
  double softcap = 0.0;     // 0 = off
  bool causal = false;      // as given (already folded into window_right)
  int64_t window_left = -1;
  int64_t window_right = -1;
  // attn_bias as a (batch, nheads, seqlen_q, seqlen_k) view with stride 0 on broadcast dims: never materialized.
  std::optional<at::Tensor> bias;
  double dropout_p = 0.0;               // probability of dropping each attention weight (0 = off)
  std::optional<at::Tensor> rng_state;  // int64 (2,) = (seed, offset) of the dropout generator, on q's device
  std::optional<at::Tensor> sinks;      // (nheads,) floating, on q's device: each head's extra softmax logit
};

// dropout_p must be in [0, 1); rng_state, when given, int64 (2,) on q's device; sinks, when given, floating (nheads,)
// on q's device.
AttentionProblem check_fwd_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const std::optional<at::Tensor>& attn_bias, std::optional<double> scale,
                                  bool causal, int64_t window_left, int64_t window_right, double softcap,
                                  double dropout_p = 0.0, const std::optional<at::Tensor>& rng_state = std::nullopt,
                                  const std::optional<at::Tensor>& sinks = std::nullopt);

// Checks the forward's inputs again plus dout/out/lse (dout and out: (batch, seqlen_q, nheads, headdim_v)), and
// that dbias can be produced when asked for (sinks: bwd_with_sinks').
AttentionProblem check_bwd_inputs(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                  const std::optional<at::Tensor>& attn_bias, std::optional<double> scale,
                                  bool causal, int64_t window_left, int64_t window_right, double softcap,
                                  bool bias_requires_grad, double dropout_p = 0.0,
                                  const std::optional<at::Tensor>& rng_state = std::nullopt,
                                  const std::optional<at::Tensor>& sinks = std::nullopt);

// The CUDA kernels need compute capability 8.0 or newer: raises naming the device, its name and capability
// otherwise. (The CUDA forward asks the runtime; fa2._C._check_compute_capability lets tests reach the message.)
void check_compute_capability(int major, int minor, const std::string& device, const std::string& device_name);

// The buffer of the gradient of a 4-d q, k or v (input): in input's memory order where input is contiguous in some
// order of its first three dims with headdim innermost (e.g. (batch, nheads, seqlen, headdim) storage passed as a
// transposed view, as SDPA-layout callers have it: its gradient then comes back in that storage order, what autograd's
// accumulation and the caller's next backward op read fastest), else contiguous. The fake kernel
// (python/fa2/_ops_impl.py, _grad_like) follows the same rule, orders tried in the same sequence.
at::Tensor empty_grad_like(const at::Tensor& input);

// Reduces a full (batch, nheads, seqlen_q, seqlen_k) float32 gradient to the shape/dtype of the bias as given.
at::Tensor reduce_dbias(const at::Tensor& dbias_full, const at::Tensor& attn_bias);

}  // namespace fa2

namespace fa2 {

// ---- variable length (packed sequences): fa2::varlen_fwd / varlen_bwd -------------------------------------------
// q (total_q, nheads, headdim), k / v (total_k, nheads_k, headdim); sequence b is rows cu_seqlens[b]:cu_seqlens[b+1]
// (int32, (batch + 1,)), of which the first seqused_k[b] keys are used when seqused_k is given.
//
// Checked everywhere (no host sync): ranks, dtypes, devices, the lengths of cu_seqlens_q / cu_seqlens_k (equal:
// batch + 1) and seqused_k ((batch,)), max_seqlen >= 0, the flags. The VALUES of cu_seqlens / seqused_k (starting at
// 0, non-decreasing, last entry = total, each sequence no longer than max_seqlen, seqused_k[b] within its sequence)
// are read only where that costs no host sync: when they are CPU tensors (values_checked). On CUDA they are not
// checked on the host; a bad value there is the caller's error (see docs/design.md, Variable length).
struct VarlenProblem {
  // The shared sizes and flags: batch = the number of sequences, seqlen_q / seqlen_k = max_seqlen_q / max_seqlen_k
  // (what sizes a grid), nheads, nheads_k, headdim, scale, softcap, causal as the padded ops resolve them. Windows are
  // folded to -1 against the packed totals (a window at least total_k / total_q wide is unbounded for every
  // sequence), causal folded into window_right as for the padded ops; they align bottom-right per sequence.
  AttentionProblem problem;
  int64_t total_q = 0, total_k = 0;
  at::Tensor cu_seqlens_q, cu_seqlens_k;  // int32 (batch + 1,), contiguous, on q's device
  std::optional<at::Tensor> seqused_k;    // int32 (batch,), contiguous, on q's device
  bool values_checked = false;            // the values above were read and checked (CPU tensors)
};

VarlenProblem check_varlen_fwd_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                      int64_t max_seqlen_q, int64_t max_seqlen_k,
                                      const std::optional<at::Tensor>& seqused_k, std::optional<double> scale,
                                      bool causal, int64_t window_left, int64_t window_right, double softcap,
                                      double dropout_p, const std::optional<at::Tensor>& sinks,
                                      const std::optional<at::Tensor>& rng_state);

// The forward's checks plus dout / out ((total_q, nheads, v.size(2)), q's dtype and device, last dim contiguous) and
// lse (float32 (nheads, total_q)).
VarlenProblem check_varlen_bwd_inputs(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                      const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                      int64_t max_seqlen_q, int64_t max_seqlen_k,
                                      const std::optional<at::Tensor>& seqused_k, std::optional<double> scale,
                                      bool causal, int64_t window_left, int64_t window_right, double softcap,
                                      double dropout_p, const std::optional<at::Tensor>& sinks,
                                      const std::optional<at::Tensor>& rng_state);

}  // namespace fa2

namespace fa2 {

// ---- KV cache (inference): fa2::kvcache_fwd --------------------------------------------------------------------
// q (batch, seqlen_q, nheads, headdim); k_cache / v_cache contiguous (batch_cache, seqlen_cache, nheads_k, headdim)
// or paged (num_blocks, block_size, nheads_k, headdim) with block_table; k / v (batch, seqlen_new, nheads_k, headdim)
// appended at cache_seqlens[b]; rotary_cos / rotary_sin (seqlen_ro, rotary_dim / 2).
//
// Checked everywhere, before anything is written (no host sync): ranks, shapes, dtypes, devices, strides, the flags,
// the block size (a multiple of 16), rotary_dim (a multiple of 16, at most headdim), seqlen_ro >= capacity, and
// cache_seqlens = None with k given (no room). The VALUES of cache_seqlens (>= 0, cache_seqlens[b] + seqlen_new <=
// capacity), block_table (the entries a sequence uses in [0, num_blocks)) and cache_batch_idx (in [0, batch_cache))
// are read only where that costs no host sync: CPU tensors (values_checked). On CUDA a bad value is the caller's
// error; the CUDA path cannot write or read outside the caches for it (writes past the capacity or to a block out
// of range are skipped, lengths and indices are clamped: docs/design.md, KV cache).
struct KvcacheProblem {
  // batch, seqlen_q, nheads, nheads_k, headdim, headdim_v, scale, softcap, causal, windows (causal folded into
  // window_right; sides folded to -1 against seqlen_q and the capacity, as the padded ops fold them); seqlen_k is
  // the capacity. Each sequence's own key count (cache_seqlens[b] + seqlen_new) replaces seqlen_k per sequence.
  AttentionProblem problem;
  int64_t seqlen_new = 0;   // rows of k / v appended (0: k = None)
  bool paged = false;
  int64_t batch_cache = 0;  // k_cache.size(0): cache rows (contiguous) or blocks (paged)
  int64_t block_size = 0;   // paged: k_cache.size(1)
  int64_t max_blocks = 0;   // paged: block_table.size(1)
  int64_t capacity = 0;     // keys one sequence can hold: seqlen_cache, or max_blocks * block_size when paged
  std::optional<at::Tensor> cache_seqlens, block_table, cache_batch_idx;  // int32, contiguous, on q's device
  std::optional<at::Tensor> rotary_cos, rotary_sin;                       // (seqlen_ro, rotary_dim / 2), q's dtype
  int64_t rotary_dim = 0;   // 0: no rotary
  bool rotary_interleaved = false;
  // q row i is rotated at cache_seqlens[b] + i when causal or windowed, else every row at cache_seqlens[b]
  bool rotary_q_per_row = false;
  bool values_checked = false;  // the values above were read and checked (CPU tensors)
};

KvcacheProblem check_kvcache_inputs(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                    const std::optional<at::Tensor>& k, const std::optional<at::Tensor>& v,
                                    const std::optional<at::Tensor>& cache_seqlens,
                                    const std::optional<at::Tensor>& block_table,
                                    const std::optional<at::Tensor>& cache_batch_idx,
                                    const std::optional<at::Tensor>& rotary_cos,
                                    const std::optional<at::Tensor>& rotary_sin, bool rotary_interleaved,
                                    std::optional<double> scale, bool causal, int64_t window_left,
                                    int64_t window_right, double softcap, int64_t num_splits);

}  // namespace fa2
