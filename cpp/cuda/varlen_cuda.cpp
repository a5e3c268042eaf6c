// CUDA varlen (packed sequences): torch tensors -> checks -> AttentionParams -> the plan -> fa2::run_fwd / run_bwd.
// Registers only fa2::varlen_fwd and fa2::varlen_bwd for the CUDA dispatch key (schemas in cpp/ops.cpp). No host
// synchronization: cu_seqlens and seqused_k stay on the device, max_seqlen_q / max_seqlen_k size the grids, and a
// block past its sequence's end exits (params.h, plan.h: the sm80 path's kernels with kVarlen, on every GPU).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "checks.h"
#include "dropout_state.h"
#include "cuda/params_from_tensors.h"
#include "cuda/varlen_cuda.h"
#include "fa2/launch.h"
#if FA2_CUDA_BWD
#include "fa2/bwd_launch.h"
#endif

namespace fa2 {
namespace {

using at::Tensor;

// A value head dim of its own (fa2.attention's, by zero-padding) is not wired into the varlen kernels' glue yet: an
// error rather than a wrong shape (the CPU takes it).
void check_same_value_headdim(const VarlenProblem& vp) {
  TORCH_CHECK_VALUE(vp.problem.headdim_v == vp.problem.headdim, "fa2.varlen (CUDA): v's headdim must equal q's and "
                    "k's for now (got q/k ", vp.problem.headdim, ", v ", vp.problem.headdim_v, "); the CPU takes it");
}

// The packed tensors as the kernels read them: (1, total, heads, headdim) views, a batch of one whose rows the
// sequences index (params.h), headdim zero-padded and rows aligned as for a dense call (params_from_tensors.h).
Tensor packed_kernel_input(const Tensor& t, int64_t headdim_padded) {
  return cuda_glue::kernel_input(t.unsqueeze(0), headdim_padded);
}

// Points a (pointer, batch / row / head strides) group of the params at a packed (1, total, heads, headdim) tensor.
template <class Ptr>
void point_at(const Tensor& t, Ptr& ptr, int64_t& batch_stride, int64_t& row_stride, int64_t& head_stride) {
  ptr = static_cast<Ptr>(t.data_ptr());
  batch_stride = t.stride(0), row_stride = t.stride(1), head_stride = t.stride(2);
}

// The inputs, sizes and flags (set_common_params on the packed views, headdim padded to a multiple of 8 and rounded to
// an instance's: rounded_headdim, the direction's fwd_ / bwd_headdim_rounded) and the varlen fields.
struct VarlenInputs {
  Tensor q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k;  // (kept alive for the launch)
};
// even: the sequences evenly spaced instead (cu_seqlens_q / _k then undefined; params.h, varlen_q_rows_each).
AttentionParams varlen_params(const VarlenProblem& vp, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                              const std::optional<Tensor>& seqused_k, int (*rounded_headdim)(int),
                              const char* direction, VarlenInputs* inputs,
                              const cuda_glue::EvenlySpacedKeys* even = nullptr) {
  // (the kernels index rows with int: a sequence's first row plus a block stays below 2^31)
  constexpr int64_t kMaxTotal = std::numeric_limits<int32_t>::max() / 2;
  TORCH_CHECK_VALUE(vp.total_q <= kMaxTotal && vp.total_k <= kMaxTotal, "fa2.varlen (CUDA): total_q and total_k must "
                    "be <= ", kMaxTotal, ", got ", vp.total_q, " and ", vp.total_k);
  const int64_t headdim = vp.problem.headdim, headdim_padded = cuda_glue::kernel_headdim(vp.problem);
  const int headdim_rounded = rounded_headdim(static_cast<int>(headdim_padded));
  TORCH_CHECK(headdim_rounded > 0, "fa2: this build has no CUDA ", direction, " kernel for headdim ", headdim,
              " (rebuild with FA2_HEADDIMS including a headdim >= ", headdim_padded, ")");
  inputs->q = packed_kernel_input(q, headdim_padded);
  inputs->k = packed_kernel_input(k, headdim_padded);
  inputs->v = packed_kernel_input(v, headdim_padded);
  if (seqused_k.has_value()) inputs->seqused_k = seqused_k->contiguous();
  AttentionParams params;
  cuda_glue::set_common_params(params, vp.problem, inputs->q, inputs->k, inputs->v);  // (headdim: the padded one)
  params.headdim_rounded = headdim_rounded;
  if (even == nullptr) {
    inputs->cu_seqlens_q = cu_seqlens_q.contiguous();
    inputs->cu_seqlens_k = cu_seqlens_k.contiguous();
    params.cu_seqlens_q = inputs->cu_seqlens_q.data_ptr<int>();
    params.cu_seqlens_k = inputs->cu_seqlens_k.data_ptr<int>();
  } else {  // (b * rows stays below total_q / total_k, which are ints: checked above and by the caller)
    TORCH_CHECK_VALUE(even->seqused_k_added >= 0 && even->seqused_k_added <= std::numeric_limits<int32_t>::max(),
                      "fa2.varlen (CUDA): ", even->seqused_k_added, " keys added to seqused_k: out of int32's range");
    params.varlen_q_rows_each = static_cast<int>(vp.problem.seqlen_q);
    params.varlen_k_rows_apart = static_cast<int>(even->rows_apart);
    params.seqused_k_added = static_cast<int>(even->seqused_k_added);
  }
  params.seqused_k = seqused_k.has_value() ? inputs->seqused_k.data_ptr<int>() : nullptr;
  params.total_q = static_cast<int>(vp.total_q);
  params.total_k = static_cast<int>(vp.total_k);
  return params;
}

// Evenly spaced sequences (params.h, varlen_q_rows_each) as the index tensors the sm80 path's kernels read (only the
// sm_90a ones compute the bounds: block_info.cuh, sequence_bounds): cu_seqlens_q / _k and the clamped key counts.
void index_evenly_spaced(const VarlenProblem& vp, const cuda_glue::EvenlySpacedKeys& even, AttentionParams& params,
                         VarlenInputs& inputs) {
  const AttentionProblem& p = vp.problem;
  const auto i32 = inputs.q.options().dtype(at::kInt);
  inputs.cu_seqlens_q = at::arange(0, (p.batch + 1) * p.seqlen_q, p.seqlen_q, i32);
  // (rows_apart > 0: a paged cache, the only layout without, is read by the sm_90a kernels alone; the last entry, past
  // the sequences, is not read: seqused_k gives every length)
  TORCH_INTERNAL_ASSERT(even.rows_apart > 0, "fa2: a paged cache on the sm80 path's varlen kernels");
  inputs.cu_seqlens_k = at::arange(0, p.batch * even.rows_apart + 1, even.rows_apart, i32);
  inputs.seqused_k = cuda_glue::key_counts(even, p.batch, p.seqlen_k, i32);
  params.varlen_q_rows_each = params.varlen_k_rows_apart = params.seqused_k_added = 0;
  params.cu_seqlens_q = inputs.cu_seqlens_q.data_ptr<int>();
  params.cu_seqlens_k = inputs.cu_seqlens_k.data_ptr<int>();
  params.seqused_k = inputs.seqused_k.data_ptr<int>();
}

// Whether no query sees any key: no sequences, no heads, no queries or no keys at all (also where max_seqlen_* say
// so). Such calls launch nothing: out = 0, lse = +inf, gradients 0.
bool nothing_attends(const VarlenProblem& vp) {
  const AttentionProblem& p = vp.problem;
  return p.batch == 0 || p.nheads == 0 || vp.total_q == 0 || vp.total_k == 0 || p.seqlen_q == 0 || p.seqlen_k == 0;
}

// One sequence spanning the packed tensors, by the caller's own numbers (cu_seqlens of two entries, max_seqlen_q /
// _k equal to total_q / _k, no seqused_k): fa2's dense kernels on the (1, total, heads, d) views run it, with all
// their schedules (the varlen ones lack some: docs/performance.md), the same masks and the same dropout bits (the
// sequence is batch 0 either way). Hugging Face's compiled batch-1 calls arrive so.
bool one_spanning_sequence(const VarlenProblem& vp, const Tensor& cu_seqlens_q, int64_t max_seqlen_q,
                           int64_t max_seqlen_k, const std::optional<Tensor>& seqused_k) {
  return cu_seqlens_q.size(0) == 2 && !seqused_k.has_value() && max_seqlen_q == vp.total_q &&
         max_seqlen_k == vp.total_k;
}

// The dense ops (their CUDA kernels, past autograd: this runs below it already).
const c10::DispatchKeySet kCudaKeys(c10::DispatchKey::CUDA);
using OptTensor = std::optional<Tensor>;

std::tuple<Tensor, Tensor> dense_fwd(const Tensor& q, const Tensor& k, const Tensor& v, std::optional<double> scale,
                                     bool causal, int64_t window_left, int64_t window_right, double softcap,
                                     double dropout_p, const OptTensor& rng_state, const OptTensor& sinks) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fa2::fwd", "")
          .typed<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
                                            std::optional<double>, bool, int64_t, int64_t, double, double,
                                            const OptTensor&, const OptTensor&)>();
  auto [out, lse] = op.redispatch(kCudaKeys, q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), std::nullopt, scale,
                                  causal, window_left, window_right, softcap, dropout_p, rng_state, sinks);
  return {out.squeeze(0), lse.squeeze(0)};  // ((total_q, nheads, d); (nheads, total_q))
}

// Keys and values in a paged cache (params.h, has_paged_kv): its block table, int32 (batch, pages_per_sequence)
// contiguous, and its pages' size and count; k and v are the pages flattened to rows.
struct PagedKeys {
  Tensor block_table;
  int64_t page_size = 0, num_pages = 0;
};

// The varlen kernels' launch for checked inputs (out (total_q, nheads, headdim), lse (nheads, total_q)). paged: the
// keys' pages; returns nullopt, launching and allocating nothing, where the plan declines them (paged_declined).
std::optional<std::tuple<Tensor, Tensor>> launch_varlen_fwd(const VarlenProblem& vp, const Tensor& q,
                                                            const Tensor& k, const Tensor& v,
                                                            const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                                            const std::optional<Tensor>& seqused_k,
                                                            const PagedKeys* paged = nullptr,
                                                            const cuda_glue::EvenlySpacedKeys* even = nullptr) {
  const c10::cuda::CUDAGuard device_guard(q.device());
  const int64_t nheads = vp.problem.nheads, headdim = vp.problem.headdim;
  if (nothing_attends(vp)) {
    return std::make_tuple(at::zeros({vp.total_q, nheads, headdim}, q.options()),
                           at::full({nheads, vp.total_q}, std::numeric_limits<float>::infinity(),
                                    q.options().dtype(at::kFloat)));
  }
  VarlenInputs inputs;
  AttentionParams params =
      varlen_params(vp, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, &fwd_headdim_rounded, "forward", &inputs, even);
  if (paged != nullptr) {
    params.block_table = paged->block_table.data_ptr<int>();
    params.block_table_batch_stride = paged->block_table.stride(0);
    params.pages_per_sequence = static_cast<int>(paged->block_table.size(1));
    params.page_size = static_cast<int>(paged->page_size);
    params.num_pages = static_cast<int>(paged->num_pages);
    // (the flattened pages: page i starts page_size rows after page i - 1)
    params.k_batch_stride = paged->page_size * params.k_row_stride;
    params.v_batch_stride = paged->page_size * params.v_row_stride;
  }
  const FwdPlan plan = plan_fwd_call(params);
  if (paged != nullptr && plan.paged_declined) return std::nullopt;
  TORCH_CHECK(plan.error == nullptr, "fa2 varlen forward (CUDA) failed: ", plan.error);
  if (even != nullptr && plan.arch_tag != 901) index_evenly_spaced(vp, *even, params, inputs);
  Tensor out = at::empty({vp.total_q, nheads, headdim}, q.options());
  Tensor lse = at::empty({nheads, vp.total_q}, q.options().dtype(at::kFloat));
  const int64_t headdim_padded = params.headdim;
  Tensor out_k = headdim_padded == headdim ? out.unsqueeze(0)
                                           : at::empty({1, vp.total_q, nheads, headdim_padded}, q.options());
  point_at(out_k, params.out, params.out_batch_stride, params.out_row_stride, params.out_head_stride);
  params.lse = lse.data_ptr<float>();  // (nheads, total_q)
  const Tensor sinks_f32 = cuda_glue::attach_sinks(params, vp.problem);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  // (none for the varlen kernels today; allocated as for any plan)
  const Tensor workspace = cuda_glue::attach_workspace(params, plan.workspace_ints, true, q.options(), stream);
  const char* err = run_fwd(plan, params, stream);
  TORCH_CHECK(err == nullptr, "fa2 varlen forward (CUDA) failed: ", err);
  if (headdim_padded != headdim) out.copy_(out_k[0].narrow(2, 0, headdim));
  return std::make_tuple(out, lse);
}

std::tuple<Tensor, Tensor> varlen_fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                           int64_t max_seqlen_q, int64_t max_seqlen_k,
                                           const std::optional<Tensor>& seqused_k, std::optional<double> scale,
                                           bool causal, int64_t window_left, int64_t window_right, double softcap,
                                           double dropout_p, const std::optional<Tensor>& sinks,
                                           const std::optional<Tensor>& rng_state) {
  VarlenProblem vp =
      check_varlen_fwd_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, scale,
                              causal, window_left, window_right, softcap, dropout_p, sinks, rng_state);
  resolve_rng_state(vp.problem, q, "fa2.varlen_fwd", /*draw=*/true);
  check_same_value_headdim(vp);
  if (one_spanning_sequence(vp, cu_seqlens_q, max_seqlen_q, max_seqlen_k, seqused_k)) {
    return dense_fwd(q, k, v, scale, causal, window_left, window_right, softcap, dropout_p, vp.problem.rng_state,
                     sinks);
  }
  return *launch_varlen_fwd(vp, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k);
}

#if FA2_CUDA_BWD

// The dense backward on the (1, total, heads, d) views (one_spanning_sequence), d sinks from its row sums.
std::tuple<Tensor, Tensor, Tensor, Tensor> dense_bwd(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                     const Tensor& v, const Tensor& out, const Tensor& lse,
                                                     std::optional<double> scale, bool causal, int64_t window_left,
                                                     int64_t window_right, double softcap, double dropout_p,
                                                     const OptTensor& sinks, bool deterministic,
                                                     const OptTensor& rng_state) {
  const Tensor dout1 = dout.unsqueeze(0), q1 = q.unsqueeze(0), k1 = k.unsqueeze(0), v1 = v.unsqueeze(0);
  const Tensor out1 = out.unsqueeze(0), lse1 = lse.unsqueeze(0);
  constexpr bool kNoBiasGrad = false;
  if (sinks.has_value()) {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("fa2::bwd_with_sinks", "")
            .typed<std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(
                const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                const Tensor&, const OptTensor&, std::optional<double>, bool, int64_t, int64_t, double, bool, bool,
                double, const OptTensor&)>();
    const auto r = op.redispatch(kCudaKeys, dout1, q1, k1, v1, out1, lse1, *sinks, std::nullopt, scale, causal,
                                 window_left, window_right, softcap, kNoBiasGrad, deterministic, dropout_p, rng_state);
    return {std::get<0>(r).squeeze(0), std::get<1>(r).squeeze(0), std::get<2>(r).squeeze(0), std::get<4>(r)};
  }
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fa2::bwd", "")
          .typed<std::tuple<Tensor, Tensor, Tensor, Tensor>(
              const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
              const OptTensor&, std::optional<double>, bool, int64_t, int64_t, double, bool, bool, double,
              const OptTensor&)>();
  const auto r = op.redispatch(kCudaKeys, dout1, q1, k1, v1, out1, lse1, std::nullopt, scale, causal, window_left,
                               window_right, softcap, kNoBiasGrad, deterministic, dropout_p, rng_state);
  return {std::get<0>(r).squeeze(0), std::get<1>(r).squeeze(0), std::get<2>(r).squeeze(0), at::empty({0}, q.options())};
}

// dq, dk, dv like q, k, v (contiguous). Keys past a sequence's seqused_k[b] are seen by no query: their gradients are
// the zeros they start as (no kernel writes them).
std::tuple<Tensor, Tensor, Tensor, Tensor> varlen_bwd_cuda(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
    const std::optional<Tensor>& seqused_k, std::optional<double> scale, bool causal, int64_t window_left,
    int64_t window_right, double softcap, double dropout_p, const std::optional<Tensor>& sinks, bool deterministic,
    const std::optional<Tensor>& rng_state) {
  VarlenProblem vp =
      check_varlen_bwd_inputs(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              seqused_k, scale, causal, window_left, window_right, softcap, dropout_p, sinks,
                              rng_state);
  resolve_rng_state(vp.problem, q, "fa2.varlen_bwd", /*draw=*/false);
  check_same_value_headdim(vp);
  if (one_spanning_sequence(vp, cu_seqlens_q, max_seqlen_q, max_seqlen_k, seqused_k)) {  // (as the forward ran)
    return dense_bwd(dout, q, k, v, out, lse, scale, causal, window_left, window_right, softcap, dropout_p, sinks,
                     deterministic, vp.problem.rng_state);
  }
  const c10::cuda::CUDAGuard device_guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const int64_t nheads = vp.problem.nheads, nheads_k = vp.problem.nheads_k, headdim = vp.problem.headdim;
  const int64_t total_q = vp.total_q, total_k = vp.total_k;
  const bool unused_keys = seqused_k.has_value();
  auto kv_grad = [&](at::IntArrayRef sizes, const at::TensorOptions& options) {
    return unused_keys ? cuda_glue::zeroed(sizes, options, stream) : at::empty(sizes, options);
  };
  // (in their inputs' memory order, as the CPU's and the fake kernel's: empty_grad_like on the batch-1 view)
  auto grad_like = [](const Tensor& t) { return empty_grad_like(t.unsqueeze(0)).squeeze(0); };
  Tensor dq = grad_like(q), dk = grad_like(k), dv = grad_like(v);
  if (unused_keys) dk.zero_(), dv.zero_();
  // (no row that sees a key: no sink gradient either)
  Tensor dsinks = vp.problem.sinks.has_value() ? at::zeros_like(*vp.problem.sinks) : at::empty({0}, q.options());
  if (nothing_attends(vp)) {
    dq.zero_();
    dk.zero_();
    dv.zero_();
    return {dq, dk, dv, dsinks};
  }
  VarlenInputs inputs;
  AttentionParams params =
      varlen_params(vp, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, &bwd_headdim_rounded, "backward", &inputs);
  const int64_t headdim_padded = params.headdim, headdim_rounded = params.headdim_rounded;
  const Tensor outk = packed_kernel_input(out, headdim_padded);
  const Tensor doutk = packed_kernel_input(dout, headdim_padded);
  const Tensor lsek = lse.contiguous();
  const bool padded = headdim_padded != headdim;
  const bool gqa = nheads != nheads_k;
  const auto f32 = q.options().dtype(at::kFloat);
  Tensor dq_k = padded ? at::empty({1, total_q, nheads, headdim_padded}, q.options()) : dq.unsqueeze(0);
  // GQA: fp32 partials per query head (bwd_kernel.cuh), summed over each group below
  Tensor dk_k = gqa      ? kv_grad({1, total_k, nheads, headdim_padded}, f32)
                : padded ? kv_grad({1, total_k, nheads_k, headdim_padded}, k.options())
                         : dk.unsqueeze(0);
  Tensor dv_k = gqa      ? kv_grad({1, total_k, nheads, headdim_padded}, f32)
                : padded ? kv_grad({1, total_k, nheads_k, headdim_padded}, v.options())
                         : dv.unsqueeze(0);
  Tensor softmax_d = at::empty({nheads, total_q}, f32);
  // (zeroed by the kernels; in whole blocks a sequence where the headdim-split ws backward adds dQ in its fragment
  // order, bwd_launch.h)
  const int64_t dq_block_rows = varlen_dq_block_rows(total_q, params.batch, int(headdim_rounded));
  Tensor dq_accum = at::empty({nheads, dq_block_rows != 0 ? dq_block_rows : total_q, headdim_rounded}, f32);
  params.varlen_dq_head_rows = dq_block_rows;
  point_at(outk, params.out, params.out_batch_stride, params.out_row_stride, params.out_head_stride);
  point_at(doutk, params.dout, params.dout_batch_stride, params.dout_row_stride, params.dout_head_stride);
  point_at(dq_k, params.dq, params.dq_batch_stride, params.dq_row_stride, params.dq_head_stride);
  point_at(dk_k, params.dk, params.dk_batch_stride, params.dk_row_stride, params.dk_head_stride);
  point_at(dv_k, params.dv, params.dv_batch_stride, params.dv_row_stride, params.dv_head_stride);
  params.lse = lsek.data_ptr<float>();  // (nheads, total_q)
  params.gqa_dkv = GqaDkv::kPartials;
  params.softmax_d = softmax_d.data_ptr<float>();
  params.dq_accum = dq_accum.data_ptr<float>();
  // Softcap (the score-mod path): P against (row_shift, row_lse) = (0, lse), with no row statistics kernel (plan.h,
  // BwdPlan::varlen). Exact wherever |lse| <= 4096 (bwd_row_stats_kernel), which a softcap keeps every score within.
  Tensor row_shift;
  if (bwd_uses_score_mod(params)) {
    row_shift = cuda_glue::zeroed({nheads, total_q}, f32, stream);
    params.row_lse = params.lse;
    params.row_shift = row_shift.data_ptr<float>();
  }
  params.deterministic = deterministic;
  const BwdPlan plan = plan_bwd_call(params);
  TORCH_CHECK(plan.error == nullptr, "fa2 varlen backward (CUDA) failed: ", plan.error);
  TORCH_CHECK(!gqa || plan.gqa_dkv == GqaDkv::kPartials, "fa2 varlen backward (CUDA): the plan asks for GQA dK / dV "
              "buffers other than fp32 partials, which its kernel does not write");
  const Tensor workspace =
      cuda_glue::attach_workspace(params, plan.workspace_ints, plan.zero_workspace, q.options(), stream);
  const char* err = run_bwd(plan, params, stream);
  TORCH_CHECK(err == nullptr, "fa2 varlen backward (CUDA) failed: ", err);
  if (padded) dq.copy_(dq_k[0].narrow(2, 0, headdim));
  if (gqa) {
    const int64_t group = nheads / nheads_k;
    dk.copy_(dk_k[0].narrow(2, 0, headdim).unflatten(1, {nheads_k, group}).sum(2));
    dv.copy_(dv_k[0].narrow(2, 0, headdim).unflatten(1, {nheads_k, group}).sum(2));
  } else if (padded) {
    dk.copy_(dk_k[0].narrow(2, 0, headdim));
    dv.copy_(dv_k[0].narrow(2, 0, headdim));
  }
  // (lse includes the sinks: the kernels above need nothing more; d sinks from their rows' D = rowsum(dout * out))
  if (vp.problem.sinks.has_value()) {
    dsinks = cuda_glue::sinks_grad_cuda(softmax_d, lsek, *vp.problem.sinks, 0, stream);
  }
  return {dq, dk, dv, dsinks};
}

#else  // built with FA2_DISABLE_BWD

std::tuple<Tensor, Tensor, Tensor, Tensor> varlen_bwd_cuda(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
    const Tensor&, int64_t, int64_t, const std::optional<Tensor>&, std::optional<double>, bool, int64_t, int64_t,
    double, double, const std::optional<Tensor>&, bool, const std::optional<Tensor>&) {
  TORCH_CHECK(false, "fa2: this build has no CUDA backward (built with FA2_DISABLE_BWD=ON); rebuild without it");
}

#endif

}  // namespace

namespace cuda_glue {

namespace {

// The KV-cache op's sequences as a varlen problem: its checked sizes and flags (batch, seqlen_q, seqlen_k = the
// capacity) over q's rows and the packed keys.
VarlenProblem evenly_spaced_problem(const AttentionProblem& problem, const Tensor& q, const Tensor& keys) {
  VarlenProblem vp;
  vp.problem = problem;
  vp.total_q = q.size(0);
  vp.total_k = keys.size(0);
  TORCH_CHECK(vp.total_q == problem.batch * problem.seqlen_q, "fa2: evenly spaced varlen: q has ", vp.total_q,
              " rows, not batch x seqlen_q = ", problem.batch * problem.seqlen_q);
  check_same_value_headdim(vp);
  return vp;
}

}  // namespace

Tensor key_counts(const EvenlySpacedKeys& even, int64_t batch, int64_t max_keys, const at::TensorOptions& i32) {
  if (!even.seqused_k) return at::full({batch}, max_keys, i32);
  // (clamped before the sum, as the kernels do: it cannot wrap)
  return even.seqused_k->clamp(-even.seqused_k_added, max_keys - even.seqused_k_added).add_(even.seqused_k_added);
}

std::tuple<Tensor, Tensor> evenly_spaced_varlen_fwd(const AttentionProblem& problem, const Tensor& q,
                                                    const Tensor& keys, const Tensor& values,
                                                    const EvenlySpacedKeys& even) {
  const VarlenProblem vp = evenly_spaced_problem(problem, q, keys);
  // (then b * rows_apart, a sequence's first key row, is below total_k, which varlen_params bounds)
  TORCH_INTERNAL_ASSERT(problem.batch == 0 || (problem.batch - 1) * even.rows_apart < std::max<int64_t>(vp.total_k, 1),
                        "fa2: evenly spaced varlen: sequence ", problem.batch - 1, " starts past the keys");
  return *launch_varlen_fwd(vp, q, keys, values, Tensor(), Tensor(), even.seqused_k, nullptr, &even);
}

std::optional<std::tuple<Tensor, Tensor>> paged_varlen_fwd(const AttentionProblem& problem, const Tensor& q,
                                                           const Tensor& k_cache, const Tensor& v_cache,
                                                           const Tensor& block_table,
                                                           const EvenlySpacedKeys& even) {
  // The pages as packed rows must be a view the TMA reads as it is: a copy of the pool (kernel_input's padding or
  // alignment) can be far larger than the pages in use, and the caller's gather copies only those.
  for (const Tensor* cache : {&k_cache, &v_cache}) {
    if (cache->size(0) > 1 && cache->stride(0) != cache->size(1) * cache->stride(1)) return std::nullopt;
  }
  const Tensor keys = k_cache.flatten(0, 1), values = v_cache.flatten(0, 1);
  if (q.size(2) % 8 != 0 || v_cache.size(3) != q.size(2) || !rows_16b_aligned(keys.unsqueeze(0), true) ||
      !rows_16b_aligned(values.unsqueeze(0), true)) {
    return std::nullopt;
  }
  const VarlenProblem vp = evenly_spaced_problem(problem, q, keys);
  const PagedKeys paged{block_table.contiguous(), k_cache.size(1), k_cache.size(0)};
  const EvenlySpacedKeys in_pages{0, even.seqused_k, even.seqused_k_added};  // (rows come from the table)
  return launch_varlen_fwd(vp, q, keys, values, Tensor(), Tensor(), even.seqused_k, &paged, &in_pages);
}

}  // namespace cuda_glue
}  // namespace fa2

TORCH_LIBRARY_IMPL(fa2, CUDA, m) {
  m.impl("varlen_fwd", &fa2::varlen_fwd_cuda);
  m.impl("varlen_bwd", &fa2::varlen_bwd_cuda);
}
