"""The numerics rule of docs/design.md (as flash-attn's own test suite), in one place.

|out - ref_hi| <= factor * |out_naive - ref_hi| (+ a floor: the output dtype's rounding of ref_hi), where ref_hi is the
math in fp32 (fp64 for fp32/fp64 inputs) and out_naive the same math done naively in the input dtype.
factor = 2 for the forward, 3 for gradients.
"""
from __future__ import annotations

import torch


def assert_close_rule(name, got, ref_hi, ref_naive, factor):
    assert not torch.isnan(got).any(), f"{name}: NaN in fa2's result"
    dtype = got.dtype
    # (the naive result's own dtype where it is the low-precision one: a float32 parameter's gradient, e.g. the
    # sinks', from half-precision inputs, where fa2's comes from the half-precision saved output)
    stored = ref_naive.dtype if ref_naive.dtype in (torch.float16, torch.bfloat16) else dtype
    got, ref_hi, ref_naive = (t.double() for t in (got, ref_hi, ref_naive))
    err = (got - ref_hi).abs().max().item() if got.numel() else 0.0
    naive_err = (ref_naive - ref_hi).abs().max().item() if got.numel() else 0.0
    scale = max(1.0, ref_hi.abs().max().item() if got.numel() else 0.0)
    # An absolute floor far below any real defect: where the exact result is 0 (e.g. dq with a single key, whose
    # softmax is constant) the naive math may hit 0 exactly while fp32 accumulation leaves ~1e-5 of cancellation
    # noise (1/80 of a bf16 ulp at 1.0); and for fp32 inputs a blocked summation order differs from the naive one
    # by a few hundred ulps.
    floor = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 1e-4) * scale
    # Plus twice the error of storing the exact result in the output dtype (flash-attn's own tests add the same,
    # their dq_atol): a correctly rounded result is already half an ulp off, while on a tiny problem (a headdim of
    # 1, two queries) the naive reference can land within a fraction of an ulp by luck, leaving "factor x naive"
    # smaller than the output's rounding. Seen once on CUDA: dq 0.009 against 3 x 0.0028 (bf16, headdim 1, 2 queries x
    # 97 keys; the rerun passed).
    if got.numel() and dtype in (torch.float16, torch.bfloat16):
        floor += 2 * (ref_hi.to(dtype).double() - ref_hi).abs().max().item()
    elif got.numel() and stored in (torch.float16, torch.bfloat16):
        # (a float32 result from half-precision inputs, e.g. the sinks' gradient from the saved half-precision output:
        # one ulp of the inputs' dtype at the result's scale, not the lucky rounding of a two-element result)
        floor += torch.finfo(stored).eps * scale
    bound = factor * naive_err + floor
    assert err <= bound, f"{name}: max|fa2 - ref| = {err:.3g} > {factor} x naive error {naive_err:.3g} (+{floor:.1g})"
    return err, bound


def hi_dtype(dtype):
    return torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32


def reference_grads(reference, inputs, dout):
    """The reference's gradients in `inputs` for the rule: (hi, naive), hi from leaves in hi_dtype (dout upcast), naive
    from leaves in the inputs' own dtype. reference(leaves, upcast) returns the output (fa2.reference.attention_ref
    with upcast=upcast and whatever else the call takes)."""
    hi = hi_dtype(inputs[0].dtype)
    leaf_hi = [t.detach().to(hi).requires_grad_() for t in inputs]
    grads_hi = torch.autograd.grad(reference(leaf_hi, True), leaf_hi, dout.to(hi))
    leaf_lo = [t.detach().clone().requires_grad_() for t in inputs]
    grads_lo = torch.autograd.grad(reference(leaf_lo, False), leaf_lo, dout)
    return grads_hi, grads_lo
