// CUDA forward: torch tensors -> checks -> AttentionParams -> fa2::run_fwd. Registers only fa2::fwd for the CUDA
// dispatch key (schemas live in cpp/ops.cpp). No host synchronization.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "checks.h"
#include "dropout_state.h"
#include "cuda/decode_cuda.h"
#include "cuda/params_from_tensors.h"
#include "fa2/decode/dense_route.h"
#include "fa2/launch.h"

namespace fa2 {
namespace {

// q's GPU compute capability as 10 * major + minor, checked to be >= 8.0 (the plan asks for the device itself).
// Asked of the runtime directly (cheap attribute queries; the full properties only for the error message).
int checked_compute_capability(const at::Tensor& q) {
  const int device = q.get_device();
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major >= 8) return 10 * major + minor;
  cudaDeviceProp prop{};
  C10_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  check_compute_capability(major, minor, q.device().str(), prop.name);  // raises
  return 0;
}

// A bool bias that is one key mask per batch element, broadcast over heads and query rows (a padding mask): its
// (batch, seqlen_k) view, unit key stride; else none.
std::optional<at::Tensor> key_mask_of(const AttentionProblem& prob) {
  if (!prob.bias) return std::nullopt;
  const at::Tensor& bias = *prob.bias;  // (batch, nheads, seqlen_q, seqlen_k), stride 0 on broadcast dims
  if (!decode::bias_is_key_mask(bias.scalar_type() == at::kBool, bias.size(1), bias.stride(1), bias.size(2),
                                bias.stride(2), bias.size(3), bias.stride(3))) {
    return std::nullopt;
  }
  return bias.select(2, 0).select(1, 0);
}

// Whether the decode kernel serves the call better than the dense grid (fa2/decode/dense_route.h).
bool decode_shaped(const AttentionProblem& prob, const std::optional<at::Tensor>& key_mask) {
  DevOptions options;
  (void)dev_options(&options);  // (a malformed FA2_DEV_OPTIONS leaves the defaults here; the dense plan reports it)
  return decode::dense_call_goes_to_decode(prob.seqlen_q, prob.nheads, prob.nheads_k,
                                           prob.bias.has_value() && !key_mask.has_value(), prob.dropout_p > 0.0,
                                           prob.sinks.has_value(), prob.headdim_v != prob.headdim, options);
}

// The decode kernel over k / v as a contiguous cache in which every sequence holds all seqlen_k keys (causal and
// windows bottom-right over them, as the dense kernels'), under the bias's key mask if any; false, nothing written,
// where it declines the layout.
bool run_as_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionProblem& prob,
                   const std::optional<at::Tensor>& key_mask, at::Tensor& out, at::Tensor& lse) {
  const cuda_glue::DecodeKeys keys{std::nullopt, std::nullopt, std::nullopt, key_mask};
  return cuda_glue::try_decode_attention(q, k, v, keys, static_cast<float>(prob.scale), prob.causal,
                                         static_cast<int>(prob.window_left), static_cast<int>(prob.window_right),
                                         static_cast<float>(prob.softcap), /*num_splits=*/0, out, lse);
}

std::tuple<at::Tensor, at::Tensor> fwd_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                            const std::optional<at::Tensor>& attn_bias, std::optional<double> scale,
                                            bool causal, int64_t window_left, int64_t window_right,
                                            double softcap, double dropout_p,
                                            const std::optional<at::Tensor>& rng_state,
                                            const std::optional<at::Tensor>& sinks) {
  AttentionProblem prob = check_fwd_inputs(q, k, v, attn_bias, scale, causal, window_left, window_right,
                                                 softcap, dropout_p, rng_state, sinks);
  resolve_rng_state(prob, q, "fa2.fwd", /*draw=*/true);
  const c10::cuda::CUDAGuard device_guard(q.device());
  checked_compute_capability(q);

  const int64_t headdim_v = prob.headdim_v;
  at::Tensor out = at::empty({prob.batch, prob.seqlen_q, prob.nheads, headdim_v}, q.options());
  at::Tensor lse = at::empty({prob.batch, prob.nheads, prob.seqlen_q}, q.options().dtype(at::kFloat));
  if (prob.batch == 0 || prob.nheads == 0 || prob.seqlen_q == 0) return {out, lse};
  if (prob.seqlen_k == 0) {  // no key at all: every row outputs 0 with lse = +inf
    out.zero_();
    lse.fill_(std::numeric_limits<float>::infinity());
    return {out, lse};
  }
  const std::optional<at::Tensor> key_mask = key_mask_of(prob);
  if (decode_shaped(prob, key_mask) && run_as_decode(q, k, v, prob, key_mask, out, lse)) return {out, lse};

  // Kernels run on one headdim, the larger of q/k's and v's rounded up to a multiple of 8 (zero-padded copies when
  // needed: cuda_glue::kernel_headdim), instantiated for the next headdim in FA2_HEADDIMS; loads and stores are
  // predicated on the padded headdim.
  const int64_t headdim_padded = cuda_glue::kernel_headdim(prob);
  const int headdim_rounded = fwd_headdim_rounded(static_cast<int>(headdim_padded));
  TORCH_CHECK(headdim_rounded > 0, "fa2: this build has no CUDA forward kernel for headdim ",
              cuda_glue::headdims_text(prob), " (rebuild with FA2_HEADDIMS including a headdim >= ", headdim_padded,
              ")");
  // The plan (fa2/plan.h) decides from sizes, mask and bias alone; an sm_90a instance (TMA loads) needs real
  // (nonzero) input strides.
  AttentionParams params;
  cuda_glue::set_common_params(params, prob, q, k, v);
  params.headdim_rounded = headdim_rounded;
  const FwdPlan plan = plan_fwd_call(params);
  TORCH_CHECK(plan.error == nullptr, "fa2 forward (CUDA) failed: ", plan.error);
  const bool real_strides = plan.arch_tag == 901;
  const at::Tensor qk = cuda_glue::kernel_input(q, headdim_padded, real_strides);
  const at::Tensor kk = cuda_glue::kernel_input(k, headdim_padded, real_strides);
  const at::Tensor vk = cuda_glue::kernel_input(v, headdim_padded, real_strides);
  at::Tensor out_k = headdim_padded == headdim_v
                         ? out
                         : at::empty({prob.batch, prob.seqlen_q, prob.nheads, headdim_padded}, q.options());

  cuda_glue::set_common_params(params, prob, qk, kk, vk);
  params.out = out_k.data_ptr();
  params.out_batch_stride = out_k.stride(0);
  params.out_row_stride = out_k.stride(1);
  params.out_head_stride = out_k.stride(2);
  params.lse = lse.data_ptr<float>();
  const at::Tensor sinks_f32 = cuda_glue::attach_sinks(params, prob);
  // the persistent sm_90a forward's tile counter (causal / windows), zeroed on the stream
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const at::Tensor workspace = cuda_glue::attach_workspace(params, plan.workspace_ints, true, q.options(), stream);

  const char* err = run_fwd(plan, params, stream);
  TORCH_CHECK(err == nullptr, "fa2 forward (CUDA) failed: ", err);
  if (!out_k.is_same(out)) out.copy_(out_k.narrow(3, 0, headdim_v));
  return {out, lse};
}

}  // namespace
}  // namespace fa2

TORCH_LIBRARY_IMPL(fa2, CUDA, m) { m.impl("fwd", &fa2::fwd_cuda); }
