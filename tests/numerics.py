"""The numerics rule of DESIGN.md (as flash-attn's own test suite), in one place.

|out - ref_hi| <= factor * |out_naive - ref_hi| (+ a floor of a few ulps of the output dtype), where ref_hi is the
math in fp32 (fp64 for fp32/fp64 inputs) and out_naive the same math done naively in the input dtype.
factor = 2 for the forward, 3 for gradients.
"""
from __future__ import annotations

import torch

_ULP = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7, torch.float32: 2.0 ** -23, torch.float64: 2.0 ** -52}


def assert_close_rule(name, got, ref_hi, ref_naive, factor):
    assert not torch.isnan(got).any(), f"{name}: NaN in fa2's result"
    got, ref_hi, ref_naive = (t.double() for t in (got, ref_hi, ref_naive))
    err = (got - ref_hi).abs().max().item() if got.numel() else 0.0
    naive_err = (ref_naive - ref_hi).abs().max().item() if got.numel() else 0.0
    scale = max(1.0, ref_hi.abs().max().item() if got.numel() else 0.0)
    floor = 4 * _ULP[torch.float32] * scale
    bound = factor * naive_err + floor
    assert err <= bound, f"{name}: max|fa2 - ref| = {err:.3g} > {factor} x naive error {naive_err:.3g} (+{floor:.1g})"
    return err, bound


def hi_dtype(dtype):
    return torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32
