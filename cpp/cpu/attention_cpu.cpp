// CPU implementation of fa2::fwd and fa2::bwd: the FlashAttention-2 algorithm on tiles (forward: cpu/fwd_kernel.h,
// backward: cpu/bwd_kernel.h), with the tile products on BLAS (cpu/blas.h; bf16's on bf16 operands where the CPU has
// bf16 products: cpu/bf16_dot.h or MKL), the softmax in vectorized row loops (cpu/row_ops.h), tile sizes from
// cpu/tile_config.h.
// Memory is O(N): per-thread tiles, plus one (batch, nheads, seqlen_q, seqlen_k) buffer only when dbias is asked for.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "checks.h"
#include "dropout_state.h"
#include "sinks_grad.h"
#include "cpu/bwd_kernel.h"
#include "cpu/fwd_kernel.h"

namespace fa2::cpu {
namespace {

std::tuple<at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const std::optional<at::Tensor>& attn_bias, std::optional<double> scale,
                                           bool causal, int64_t window_left, int64_t window_right, double softcap,
                                           double dropout_p, const std::optional<at::Tensor>& rng_state,
                                           const std::optional<at::Tensor>& sinks) {
  AttentionProblem p = check_fwd_inputs(q, k, v, attn_bias, scale, causal, window_left, window_right, softcap,
                                              dropout_p, rng_state, sinks);
  resolve_rng_state(p, q, "fa2.fwd", /*draw=*/true);
  at::Tensor out = at::empty({p.batch, p.seqlen_q, p.nheads, p.headdim_v}, q.options());
  at::Tensor lse = at::empty({p.batch, p.nheads, p.seqlen_q}, q.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "fa2_fwd_cpu",
                                  [&] { fwd_kernel<scalar_t>(p, q, k, v, out, lse); });
  return {out, lse};
}

using BwdResults = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;  // dq, dk, dv, dbias, dsinks

// fa2::bwd, and fa2::bwd_with_sinks where sinks are given (d sinks from dout and out: the kernel keeps no D).
BwdResults bwd_cpu_impl(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& attn_bias,
                        std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
                        double softcap, bool bias_requires_grad, double dropout_p,
                        const std::optional<at::Tensor>& rng_state, const std::optional<at::Tensor>& sinks) {
  AttentionProblem p = check_bwd_inputs(dout, q, k, v, out, lse, attn_bias, scale, causal, window_left, window_right,
                                        softcap, bias_requires_grad, dropout_p, rng_state, sinks);
  resolve_rng_state(p, q, "fa2.bwd", /*draw=*/false);
  at::Tensor dq = empty_grad_like(q), dk = empty_grad_like(k), dv = empty_grad_like(v);  // (written by strides)
  // dS with respect to the bias, full size (the one O(N²) buffer), in the accumulation dtype; zero where masked.
  const auto acc_dtype = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor dbias_full;
  if (bias_requires_grad) {
    dbias_full = at::zeros({p.batch, p.nheads, p.seqlen_q, p.seqlen_k}, q.options().dtype(acc_dtype));
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "fa2_bwd_cpu", [&] {
    bwd_kernel<scalar_t>(p, dout, q, k, v, out, lse, dq, dk, dv, dbias_full);
  });
  at::Tensor dbias = bias_requires_grad ? reduce_dbias(dbias_full, *attn_bias) : at::empty({0}, q.options());
  // (lse includes the sinks: the kernel above needs nothing more)
  return {dq, dk, dv, dbias, p.sinks.has_value() ? sinks_grad(dout, out, lse, *p.sinks, 2, 1) : at::Tensor()};
}

// Always deterministic on the CPU (see BwdPartition), so `deterministic` needs no separate path.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bwd_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& attn_bias, std::optional<double> scale, bool causal,
    int64_t window_left, int64_t window_right, double softcap, bool bias_requires_grad, bool /*deterministic*/,
    double dropout_p, const std::optional<at::Tensor>& rng_state) {
  const BwdResults r = bwd_cpu_impl(dout, q, k, v, out, lse, attn_bias, scale, causal, window_left, window_right,
                                    softcap, bias_requires_grad, dropout_p, rng_state, std::nullopt);
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r)};
}

BwdResults bwd_with_sinks_cpu(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& out, const at::Tensor& lse, const at::Tensor& sinks,
                              const std::optional<at::Tensor>& attn_bias, std::optional<double> scale, bool causal,
                              int64_t window_left, int64_t window_right, double softcap, bool bias_requires_grad,
                              bool /*deterministic*/, double dropout_p, const std::optional<at::Tensor>& rng_state) {
  return bwd_cpu_impl(dout, q, k, v, out, lse, attn_bias, scale, causal, window_left, window_right, softcap,
                      bias_requires_grad, dropout_p, rng_state, sinks);
}

}  // namespace
}  // namespace fa2::cpu

TORCH_LIBRARY_IMPL(fa2, CPU, m) {
  m.impl("fwd", &fa2::cpu::fwd_cpu);
  m.impl("bwd", &fa2::cpu::bwd_cpu);
  m.impl("bwd_with_sinks", &fa2::cpu::bwd_with_sinks_cpu);
}
