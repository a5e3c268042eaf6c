// The gradient of attention sinks, for the CPU backward ops (the CUDA glue runs one kernel instead:
// cuda_glue::sinks_grad_cuda, fa2/sinks_grad.h).
#pragma once
#include <ATen/ATen.h>

namespace fa2 {

// d sinks_h = -sum_i exp(sinks[h] - lse_i) * D_i over the rows i of head h, where D = rowsum(dout * out) is the
// backward's own per-row sum (the CUDA kernels' softmax_d) and lse includes the sink, so that the exponential is the
// sink's probability (0 where lse is +inf: a row that sees no key). d_rows and lse: the same shape, heads at
// dimension head_dim. In float32 (float64 for float64 rows); reductions of torch in a fixed order (deterministic);
// returned like sinks.
inline at::Tensor sinks_grad_from_rows(const at::Tensor& d_rows, const at::Tensor& lse, const at::Tensor& sinks,
                                       int64_t head_dim) {
  const auto acc = d_rows.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  std::vector<int64_t> shape(d_rows.dim(), 1), others;
  shape[head_dim] = sinks.size(0);
  for (int64_t i = 0; i < d_rows.dim(); ++i) {
    if (i != head_dim) others.push_back(i);
  }
  const at::Tensor p_sink = at::exp(sinks.to(acc).view(shape) - lse.to(acc));
  return (p_sink * d_rows.to(acc)).sum(others).neg().to(sinks.scalar_type());
}

// The same from dout and out (the CPU backward, which keeps no D): rows = rowsum(dout * out) over the last dim, heads
// at dimension head_dim of dout / out; lse's heads at dimension lse_head_dim, its other dims the rows' in order.
inline at::Tensor sinks_grad(const at::Tensor& dout, const at::Tensor& out, const at::Tensor& lse,
                             const at::Tensor& sinks, int64_t head_dim, int64_t lse_head_dim) {
  const auto acc = out.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor rows = (dout.to(acc) * out.to(acc)).sum(-1).movedim(head_dim, lse_head_dim);
  return sinks_grad_from_rows(rows, lse, sinks, lse_head_dim);
}

}  // namespace fa2
