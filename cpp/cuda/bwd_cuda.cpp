// CUDA backward: torch tensors -> checks -> AttentionParams -> fa2::run_bwd. Registers only fa2::bwd for the CUDA
// dispatch key (schemas live in cpp/ops.cpp). Scratch (dq_accum, D, the GQA fp32 accumulators or partials, dbias, the
// deterministic counters) comes from torch's caching allocator. No host synchronization.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "checks.h"
#include "dropout_state.h"

#if FA2_CUDA_BWD
#include "cuda/params_from_tensors.h"
#include "fa2/bwd_launch.h"

namespace fa2 {
namespace {

using at::Tensor;

using BwdResults = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;  // dq, dk, dv, dbias, dsinks

// fa2::bwd, and fa2::bwd_with_sinks where sinks are given: dsinks from the rows' D the kernels computed.
BwdResults bwd_cuda_impl(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                         const Tensor& lse, const std::optional<Tensor>& attn_bias, std::optional<double> scale,
                         bool causal, int64_t window_left, int64_t window_right, double softcap,
                         bool bias_requires_grad, bool deterministic, double dropout_p,
                         const std::optional<Tensor>& rng_state, const std::optional<Tensor>& sinks) {
  AttentionProblem prob = check_bwd_inputs(dout, q, k, v, out, lse, attn_bias, scale, causal, window_left,
                                           window_right, softcap, bias_requires_grad, dropout_p, rng_state, sinks);
  resolve_rng_state(prob, q, "fa2.bwd", /*draw=*/false);
  const c10::cuda::CUDAGuard device_guard(q.device());
  const int64_t batch = prob.batch, seqlen_q = prob.seqlen_q, seqlen_k = prob.seqlen_k;
  const int64_t nheads = prob.nheads, nheads_k = prob.nheads_k, headdim = prob.headdim, headdim_v = prob.headdim_v;

  Tensor dq = empty_grad_like(q), dk = empty_grad_like(k), dv = empty_grad_like(v);  // (the kernels take strides)
  if (batch == 0 || nheads == 0 || seqlen_q == 0 || seqlen_k == 0) {  // nothing attends: all gradients are 0
    dq.zero_();
    dk.zero_();
    dv.zero_();
    Tensor dbias = bias_requires_grad ? at::zeros_like(*attn_bias, at::MemoryFormat::Contiguous)
                                      : at::empty({0}, q.options());
    return {dq, dk, dv, dbias, sinks.has_value() ? at::zeros_like(*sinks) : Tensor()};
  }

  // Kernels run on one headdim, the larger of q/k's and v's rounded up to a multiple of 8 (zero-padded copies when
  // needed: cuda_glue::kernel_headdim), instantiated for the next headdim in FA2_HEADDIMS; loads and stores are
  // predicated on the padded headdim. Zero columns of q, k give zero columns of dk, dq; of v, out and dout, zero
  // columns of dv: all sliced off at the end.
  const int64_t headdim_padded = cuda_glue::kernel_headdim(prob);
  const int headdim_rounded = bwd_headdim_rounded(static_cast<int>(headdim_padded));
  TORCH_CHECK(headdim_rounded > 0, "fa2: this build has no CUDA backward kernel for headdim ",
              cuda_glue::headdims_text(prob), " (rebuild with FA2_HEADDIMS including a headdim >= ", headdim_padded,
              ")");
  const Tensor qk = cuda_glue::kernel_input(q, headdim_padded);
  const Tensor kk = cuda_glue::kernel_input(k, headdim_padded);
  const Tensor vk = cuda_glue::kernel_input(v, headdim_padded);
  const Tensor outk = cuda_glue::kernel_input(out, headdim_padded);
  const Tensor doutk = cuda_glue::kernel_input(dout, headdim_padded);
  const Tensor lsek = lse.contiguous();

  const bool padded_qk = headdim_padded != headdim, padded_v = headdim_padded != headdim_v;
  const bool gqa = nheads != nheads_k;
  const auto f32 = q.options().dtype(at::kFloat);
  Tensor dq_k = padded_qk ? at::empty({batch, seqlen_q, nheads, headdim_padded}, q.options()) : dq;
  // GQA/MQA: like k where the kernel sums each group, else what the plan asks for (below): fp32 accumulators per kv
  // head (rounded to dk, dv at the end) or fp32 partials per query head.
  Tensor dk_k = padded_qk ? at::empty({batch, seqlen_k, nheads_k, headdim_padded}, k.options()) : dk;
  Tensor dv_k = padded_v ? at::empty({batch, seqlen_k, nheads_k, headdim_padded}, v.options()) : dv;
  Tensor softmax_d = at::empty({batch, nheads, seqlen_q}, f32);
  Tensor dq_accum = at::empty({batch, nheads, seqlen_q, headdim_rounded}, f32);  // zeroed by the kernels
  // Only the blocks the mask lets through are written: the rest of the gradient is 0.
  Tensor dbias_full = bias_requires_grad ? at::zeros({batch, nheads, seqlen_q, seqlen_k}, f32) : Tensor();

  AttentionParams params;
  cuda_glue::set_common_params(params, prob, qk, kk, vk);
  params.headdim_rounded = headdim_rounded;
  params.out = outk.data_ptr();
  params.out_batch_stride = outk.stride(0), params.out_row_stride = outk.stride(1);
  params.out_head_stride = outk.stride(2);
  params.lse = lsek.data_ptr<float>();
  params.dout = doutk.data_ptr();
  params.dout_batch_stride = doutk.stride(0), params.dout_row_stride = doutk.stride(1);
  params.dout_head_stride = doutk.stride(2);
  params.dq = dq_k.data_ptr();
  params.dq_batch_stride = dq_k.stride(0), params.dq_row_stride = dq_k.stride(1), params.dq_head_stride = dq_k.stride(2);
  auto set_dk_dv = [&] {
    params.dk = dk_k.data_ptr();
    params.dk_batch_stride = dk_k.stride(0), params.dk_row_stride = dk_k.stride(1);
    params.dk_head_stride = dk_k.stride(2);
    params.dv = dv_k.data_ptr();
    params.dv_batch_stride = dv_k.stride(0), params.dv_row_stride = dv_k.stride(1);
    params.dv_head_stride = dv_k.stride(2);
  };
  set_dk_dv();
  params.gqa_dkv = GqaDkv::kInKernel;
  params.softmax_d = softmax_d.data_ptr<float>();
  params.dq_accum = dq_accum.data_ptr<float>();
  params.dbias = bias_requires_grad ? dbias_full.data_ptr<float>() : nullptr;
  // The score-mod path's per-row statistics (softcap or bias; written by the kernels, see bwd_row_stats_kernel).
  Tensor row_lse, row_shift;
  if (bwd_uses_score_mod(params)) {
    row_lse = at::empty({batch, nheads, seqlen_q}, f32);
    row_shift = at::empty({batch, nheads, seqlen_q}, f32);
    params.row_lse = row_lse.data_ptr<float>();
    params.row_shift = row_shift.data_ptr<float>();
  }
  params.deterministic = deterministic;
  // The plan (fa2/plan.h) says which kernel runs, what a GQA call's dk / dv hold and the workspace.
  const BwdPlan plan = plan_bwd_call(params);
  TORCH_CHECK(plan.error == nullptr, "fa2 backward (CUDA) failed: ", plan.error);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  auto use_partials = [&] {  // fp32 per query head, summed over each group below (a fixed-order reduction)
    dk_k = at::empty({batch, seqlen_k, nheads, headdim_padded}, f32);
    dv_k = at::empty({batch, seqlen_k, nheads, headdim_padded}, f32);
    set_dk_dv();
    params.gqa_dkv = GqaDkv::kPartials;
  };
  if (gqa && plan.gqa_dkv == GqaDkv::kAccumulate) {
    // (batch, nheads_k, seqlen_k, headdim_rounded) contiguous each (params.h), given as (batch, seqlen_k, ...)
    const Tensor dkv_accum = cuda_glue::zeroed({2, batch, nheads_k, seqlen_k, headdim_rounded}, f32, stream);
    dk_k = dkv_accum[0].transpose(1, 2);
    dv_k = dkv_accum[1].transpose(1, 2);
    set_dk_dv();
    params.gqa_dkv = GqaDkv::kAccumulate;
  } else if (gqa && plan.gqa_dkv == GqaDkv::kPartials) {
    use_partials();
  }
  // (zeroed here for the deterministic mode's counters; the other mode's are zeroed by the backward)
  const Tensor workspace =
      cuda_glue::attach_workspace(params, plan.workspace_ints, plan.zero_workspace, q.options(), stream);

  bool needs_partials = false;
  const char* err = run_bwd(plan, params, stream, &needs_partials);
  if (err == nullptr && needs_partials) {  // (the driver rejected the kernel's tensor maps; nothing was launched)
    use_partials();
    err = run_bwd(plan_bwd_call(params, PlanBuffers::kGiven), params, stream);
  }
  TORCH_CHECK(err == nullptr, "fa2 backward (CUDA) failed: ", err);

  if (padded_qk) dq.copy_(dq_k.narrow(3, 0, headdim));
  if (gqa && params.gqa_dkv == GqaDkv::kPartials) {
    const int64_t group = nheads / nheads_k;
    dk.copy_(dk_k.narrow(3, 0, headdim).unflatten(2, {nheads_k, group}).sum(3));
    dv.copy_(dv_k.narrow(3, 0, headdim_v).unflatten(2, {nheads_k, group}).sum(3));
  } else {
    const bool accumulated = gqa && params.gqa_dkv == GqaDkv::kAccumulate;
    if (padded_qk || accumulated) dk.copy_(dk_k.narrow(3, 0, headdim));
    if (padded_v || accumulated) dv.copy_(dv_k.narrow(3, 0, headdim_v));
  }
  Tensor dbias = bias_requires_grad ? reduce_dbias(dbias_full, *attn_bias) : at::empty({0}, q.options());
  // (lse includes the sinks: the kernels above need nothing more)
  Tensor dsinks = sinks.has_value() ? cuda_glue::sinks_grad_cuda(softmax_d, lsek, *sinks, 1, stream) : Tensor();
  return {dq, dk, dv, dbias, dsinks};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> bwd_cuda(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                    const Tensor& v, const Tensor& out, const Tensor& lse,
                                                    const std::optional<Tensor>& attn_bias,
                                                    std::optional<double> scale, bool causal, int64_t window_left,
                                                    int64_t window_right, double softcap, bool bias_requires_grad,
                                                    bool deterministic, double dropout_p,
                                                    const std::optional<Tensor>& rng_state) {
  const BwdResults r = bwd_cuda_impl(dout, q, k, v, out, lse, attn_bias, scale, causal, window_left, window_right,
                                     softcap, bias_requires_grad, deterministic, dropout_p, rng_state, std::nullopt);
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r)};
}

BwdResults bwd_with_sinks_cuda(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, const Tensor& lse, const Tensor& sinks,
                               const std::optional<Tensor>& attn_bias, std::optional<double> scale, bool causal,
                               int64_t window_left, int64_t window_right, double softcap, bool bias_requires_grad,
                               bool deterministic, double dropout_p, const std::optional<Tensor>& rng_state) {
  return bwd_cuda_impl(dout, q, k, v, out, lse, attn_bias, scale, causal, window_left, window_right, softcap,
                       bias_requires_grad, deterministic, dropout_p, rng_state, sinks);
}

}  // namespace
}  // namespace fa2

TORCH_LIBRARY_IMPL(fa2, CUDA, m) {
  m.impl("bwd", &fa2::bwd_cuda);
  m.impl("bwd_with_sinks", &fa2::bwd_with_sinks_cuda);
}

#else  // built with FA2_DISABLE_BWD: say so instead of the dispatcher's "no kernel" error

namespace fa2 {
namespace {
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bwd_cuda_disabled(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const std::optional<at::Tensor>&, std::optional<double>, bool, int64_t, int64_t, double, bool, bool, double,
    const std::optional<at::Tensor>&) {
  TORCH_CHECK(false, "fa2: this build has no CUDA backward (built with FA2_DISABLE_BWD=ON); rebuild without it");
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> bwd_with_sinks_cuda_disabled(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, const std::optional<at::Tensor>&, std::optional<double>, bool, int64_t, int64_t, double, bool,
    bool, double, const std::optional<at::Tensor>&) {
  TORCH_CHECK(false, "fa2: this build has no CUDA backward (built with FA2_DISABLE_BWD=ON); rebuild without it");
}
}  // namespace
}  // namespace fa2

TORCH_LIBRARY_IMPL(fa2, CUDA, m) {
  m.impl("bwd", &fa2::bwd_cuda_disabled);
  m.impl("bwd_with_sinks", &fa2::bwd_with_sinks_cuda_disabled);
}

#endif
