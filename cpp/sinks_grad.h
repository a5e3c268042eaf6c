// The gradient of attention sinks, for the varlen backward ops (CPU and CUDA glue alike; the padded ops' autograd
// computes the same in Python: fa2/_ops_impl.py, sinks_grad).
#pragma once
#include <ATen/ATen.h>

namespace fa2 {

// d sinks_h = -sum_i exp(sinks[h] - lse_{h,i}) * rowsum(dout * out)_{i,h}: lse includes the sink, so the exponential
// is the sink's probability (0 where lse is +inf: a row that sees no key), and rowsum(dout * out) is the backward's
// D. dout / out (total_q, nheads, headdim), lse float32 (nheads, total_q); like sinks (nheads,). Reductions of torch
// in a fixed order: deterministic.
inline at::Tensor varlen_sinks_grad(const at::Tensor& dout, const at::Tensor& out, const at::Tensor& lse,
                                    const at::Tensor& sinks) {
  const auto acc = out.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor rowsum = (dout.to(acc) * out.to(acc)).sum(-1).t();  // (nheads, total_q)
  const at::Tensor p_sink = at::exp(sinks.to(acc).unsqueeze(1) - lse.to(acc));
  return (p_sink * rowsum).sum(1).neg().to(sinks.scalar_type());
}

}  // namespace fa2
