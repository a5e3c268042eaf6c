// Filling fa2::AttentionParams from checked tensors: the fields every CUDA direction shares (inputs, sizes,
// softmax and mask settings, bias). Header-only; used by fwd_cuda.cpp and the backward glue.
//
// What the kernels need and the glue guarantees here: headdim a multiple of 8, and q/k/v data 16-byte aligned with
// batch/row/head strides that are multiples of 8 elements (16-byte cp.async rows). Inputs that are not get a copy:
// a headdim that is not a multiple of 8 is zero-padded up to one (as flash-attn does; zeros change neither q.k
// nor the extra output columns, which are sliced off), a misaligned tensor is made contiguous. The kernels take one
// headdim: where v's differs from q's and k's, the smaller is zero-padded to the larger the same way (zero columns of
// q and k add nothing to q.k; zero columns of v give out columns of 0, sliced off), and so are out / dout and the
// gradients, which are sliced back to their inputs' head dims.
#pragma once
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "checks.h"
#include "fa2/params.h"
#include "fa2/philox.h"  // dropout_keep_threshold
#include "fa2/plan.h"    // kernel_headdim
#include "fa2/sinks_grad.h"

namespace fa2 {
namespace cuda_glue {

// The one headdim the kernels run a call at (fa2/plan.h: the larger of q/k's and v's, rounded up to a multiple of 8).
inline int64_t kernel_headdim(const AttentionProblem& prob) {
  return fa2::kernel_headdim(static_cast<int>(prob.headdim), static_cast<int>(prob.headdim_v));
}

// "59", or "192 (q, k) / 128 (v)" where v's head dim differs: for messages.
inline std::string headdims_text(const AttentionProblem& prob) {
  if (prob.headdim == prob.headdim_v) return std::to_string(prob.headdim);
  return std::to_string(prob.headdim) + " (q, k) / " + std::to_string(prob.headdim_v) + " (v)";
}

// 16-byte aligned data and batch/row/head strides that are multiples of 8 elements (dims of size 1 excepted);
// with real_strides, not 0 either (an expand()ed tensor): TMA descriptors (the sm_90a forward) describe real
// strides only, the other kernels read stride 0 as it is.
inline bool rows_16b_aligned(const at::Tensor& t, bool real_strides) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int d = 0; d < 3; ++d) {
    if (t.size(d) > 1 && (t.stride(d) % 8 != 0 || (real_strides && t.stride(d) == 0))) return false;
  }
  return true;
}

// q, k or v as the kernels read it: headdim zero-padded to headdim_padded, rows 16-byte aligned. No copy when the
// tensor already qualifies (any strides, e.g. a (B, H, S, D) tensor transposed to (B, S, H, D)).
inline at::Tensor kernel_input(const at::Tensor& t, int64_t headdim_padded, bool real_strides = false) {
  // constant_pad_nd keeps the input's memory format (e.g. channels_last for a headdim-1 tensor, whose last stride
  // need not be 1), so make the padded copy row-contiguous explicitly.
  if (t.size(3) != headdim_padded) {
    return at::constant_pad_nd(t, {0, headdim_padded - t.size(3)}, 0).contiguous();
  }
  if (!rows_16b_aligned(t, real_strides)) return t.clone(at::MemoryFormat::Contiguous);
  return t;
}

inline DType dtype_of(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? DType::kBFloat16 : DType::kFloat16;
}

// Dropout (prob.dropout_p > 0, rng_state resolved: cpp/dropout_state.h): the state's device pointer, the keep threshold of
// the 16-bit draws and the keep scale (params.h).
inline void set_dropout_params(AttentionParams& p, const AttentionProblem& prob) {
  if (prob.dropout_p <= 0.0) return;
  TORCH_CHECK(prob.rng_state.has_value() && prob.rng_state->is_contiguous(), "fa2 (CUDA): dropout without rng_state");
  p.rng_state = prob.rng_state->const_data_ptr<int64_t>();
  p.dropout_keep_threshold = dropout_keep_threshold(prob.dropout_p);
  p.dropout_keep_scale = static_cast<float>(1.0 / (1.0 - prob.dropout_p));
}

// Fills inputs, sizes, scale, softcap, window and bias. q/k/v must come from kernel_input at kernel_headdim (so
// headdim = q.size(3) is the padded one); the caller sets headdim_rounded and its direction's outputs.
inline void set_common_params(AttentionParams& p, const AttentionProblem& prob, const at::Tensor& q,
                              const at::Tensor& k, const at::Tensor& v) {
  constexpr int64_t kMaxSeqlen = std::numeric_limits<int32_t>::max() / 4;  // int32 index math in the kernels
  TORCH_CHECK_VALUE(prob.seqlen_q <= kMaxSeqlen && prob.seqlen_k <= kMaxSeqlen,
                    "fa2 (CUDA): seqlen_q and seqlen_k must be <= ", kMaxSeqlen, ", got ", prob.seqlen_q, " and ",
                    prob.seqlen_k);
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();  // sizes below are int in the params struct
  TORCH_CHECK_VALUE(prob.batch <= kMaxInt && prob.nheads <= kMaxInt && prob.nheads_k <= kMaxInt,
                    "fa2 (CUDA): batch and nheads must fit in int32, got batch=", prob.batch, ", nheads=",
                    prob.nheads, ", nheads_k=", prob.nheads_k);
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.q_batch_stride = q.stride(0), p.q_row_stride = q.stride(1), p.q_head_stride = q.stride(2);
  p.k_batch_stride = k.stride(0), p.k_row_stride = k.stride(1), p.k_head_stride = k.stride(2);
  p.v_batch_stride = v.stride(0), p.v_row_stride = v.stride(1), p.v_head_stride = v.stride(2);

  p.batch = static_cast<int>(prob.batch);
  p.seqlen_q = static_cast<int>(prob.seqlen_q);
  p.seqlen_k = static_cast<int>(prob.seqlen_k);
  p.nheads = static_cast<int>(prob.nheads);
  p.nheads_k = static_cast<int>(prob.nheads_k);
  p.headdim = static_cast<int>(q.size(3));
  p.call_headdim_qk = static_cast<int>(prob.headdim);
  p.call_headdim_v = static_cast<int>(prob.headdim_v);
  p.h_h_k_ratio = prob.nheads_k > 0 ? static_cast<int>(prob.nheads / prob.nheads_k) : 1;

  p.scale = static_cast<float>(prob.scale);
  p.scale_log2 = static_cast<float>(prob.scale * 1.4426950408889634);  // log2(e)
  p.softcap = static_cast<float>(prob.softcap);
  p.is_causal = prob.causal;
  // (check_fwd_inputs already made a window side at least as wide as the sequence -1: below seqlen, it fits an int)
  p.window_left = static_cast<int>(prob.window_left);
  p.window_right = static_cast<int>(prob.window_right);

  p.dtype = dtype_of(q);
  if (prob.bias.has_value()) {
    const at::Tensor& b = *prob.bias;  // (batch, nheads, seqlen_q, seqlen_k), stride 0 on broadcast dims
    p.bias = b.data_ptr();
    p.bias_type = b.scalar_type() == at::kBool    ? BiasType::kBool
                  : b.scalar_type() == at::kFloat ? BiasType::kFloat32
                                                  : BiasType::kSameAsInput;
    p.bias_batch_stride = b.stride(0), p.bias_head_stride = b.stride(1);
    p.bias_row_stride = b.stride(2), p.bias_col_stride = b.stride(3);
  }
  set_dropout_params(p, prob);
}

// A tensor of zeros on `options`' CUDA device, zeroed on `stream` by one cudaMemsetAsync: the kernels' counters and
// accumulators; zeroed_ints: n int32 zeros. (at::zeros launches an elementwise fill through TensorIterator, which
// costs measurable host time per call: docs/tuning.md.)
inline at::Tensor zeroed(at::IntArrayRef sizes, const at::TensorOptions& options, cudaStream_t stream) {
  at::Tensor t = at::empty(sizes, options);
  C10_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, t.nbytes(), stream));
  return t;
}
inline at::Tensor zeroed_ints(int64_t n, const at::TensorOptions& options, cudaStream_t stream) {
  return zeroed({n}, options.dtype(at::kInt), stream);
}

// The workspace a plan names (`ints` int32s, zeroed on `stream` where `zero`), pointed at by params (with its size);
// the tensor returned keeps it alive through the launch. None where the plan needs none.
inline at::Tensor attach_workspace(AttentionParams& params, int64_t ints, bool zero, const at::TensorOptions& options,
                                   cudaStream_t stream) {
  const at::Tensor workspace = ints <= 0 ? at::Tensor()
                               : zero    ? zeroed_ints(ints, options, stream)
                                         : at::empty({ints}, options.dtype(at::kInt));
  params.workspace = ints > 0 ? workspace.data_ptr() : nullptr;
  params.workspace_ints = ints;
  return workspace;
}

// The forward's attention sinks (prob.sinks, any float dtype) as the float32 (nheads,) the kernels read, pointed at
// by params; the tensor returned keeps them alive through the launch. None (nullptr) without sinks.
inline at::Tensor attach_sinks(AttentionParams& params, const AttentionProblem& prob) {
  const at::Tensor sinks = prob.sinks.has_value() ? prob.sinks->to(at::kFloat).contiguous() : at::Tensor();
  params.sinks = sinks.defined() ? sinks.const_data_ptr<float>() : nullptr;
  return sinks;
}

// d sinks (fa2/sinks_grad.h) from the backward's softmax_d and lse (float32, contiguous, the same shape; heads at
// dimension head_dim, batch before it if any): one kernel on `stream`, returned in sinks' dtype.
inline at::Tensor sinks_grad_cuda(const at::Tensor& softmax_d, const at::Tensor& lse, const at::Tensor& sinks,
                                  int64_t head_dim, cudaStream_t stream) {
  TORCH_CHECK(softmax_d.is_contiguous() && lse.is_contiguous() && softmax_d.sizes() == lse.sizes() &&
                  softmax_d.scalar_type() == at::kFloat && lse.scalar_type() == at::kFloat,
              "fa2 sinks backward: softmax_d and lse must be float32, contiguous and of one shape");
  TORCH_CHECK(softmax_d.dim() == head_dim + 2, "fa2 sinks backward: rows must be the last dimension after the heads");
  const at::Tensor sinks_f = sinks.to(at::kFloat).contiguous();
  at::Tensor dsinks = at::empty_like(sinks_f);
  SinksGradParams sp;
  sp.softmax_d = softmax_d.const_data_ptr<float>();
  sp.lse = lse.const_data_ptr<float>();
  sp.sinks = sinks_f.const_data_ptr<float>();
  sp.dsinks = dsinks.data_ptr<float>();
  sp.nheads = static_cast<int>(softmax_d.size(head_dim));
  sp.batch = static_cast<int>(head_dim == 0 ? 1 : softmax_d.size(0));
  sp.head_stride = softmax_d.stride(head_dim);
  sp.batch_stride = head_dim == 0 ? 0 : softmax_d.stride(0);
  sp.rows = softmax_d.size(-1);
  const char* err = run_sinks_grad(sp, stream);
  TORCH_CHECK(err == nullptr, "fa2 sinks backward (CUDA) failed: ", err);
  return dsinks.to(sinks.scalar_type());
}

}  // namespace cuda_glue
}  // namespace fa2
