// The op schemas, declared once. Backends register implementations elsewhere (cpu/, cuda/); fake kernels,
// autograd and the CompositeImplicitAutograd body of `attention` are registered from Python (fa2/_ops_impl.py).
#include <torch/library.h>

TORCH_LIBRARY(fa2, m) {
  // Forward: out (batch, seqlen_q, nheads, headdim), contiguous; lse float32 (batch, nheads, seqlen_q), natural log,
  // +inf for a query row that sees no key.
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor? attn_bias=None, float? scale=None, bool causal=False, "
      "int window_left=-1, int window_right=-1, float softcap=0.0) -> (Tensor out, Tensor lse)",
      {at::Tag::pt2_compliant_tag});
  // Backward by recomputation from lse. dbias has the shape and dtype of attn_bias when bias_requires_grad,
  // else it is an empty tensor of shape (0,). deterministic=True gives bitwise-reproducible gradients.
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? attn_bias=None, "
      "float? scale=None, bool causal=False, int window_left=-1, int window_right=-1, float softcap=0.0, "
      "bool bias_requires_grad=False, bool deterministic=False) -> (Tensor dq, Tensor dk, Tensor dv, Tensor dbias)",
      {at::Tag::pt2_compliant_tag});
  // The user-facing op: differentiable through fwd/bwd.
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, Tensor? attn_bias=None, float? scale=None, bool causal=False, "
      "int window_left=-1, int window_right=-1, float softcap=0.0) -> Tensor",
      {at::Tag::pt2_compliant_tag});
}
