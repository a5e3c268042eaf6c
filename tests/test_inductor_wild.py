"""The Inductor pass on attention as models nobody on the project picked write it (issue "the compile pass in the
wild"): layouts Inductor chooses, consumers of the output that ``view`` it, baddbmm / einsum scores, upcasts, ALiBi,
need_weights, dynamic shapes, additive relative-position terms, padding and sliding windows, a value head dim of its
own. Each test checks what the pass reported and that outputs and gradients match eager within the numerics rule.
"""
from __future__ import annotations

import copy

import pytest
import torch

import fa2.backend  # noqa: F401  (registers the "fa2" and "fa2_eager" backends)
from fa2.inductor import recording
from fa2.inductor._compat import without_aot_cache
from numerics import assert_close_rule, hi_dtype
from test_inductor_patterns import DEVICE_DTYPES, assert_kept, assert_rewritten, check_numerics, qkv, run


def run_module(module, inputs, *, train, backend="fa2_eager", dtype=torch.float32, dynamic=None):
    """Compile ``module`` and call it on ``inputs`` (a list of tensor tuples: one call each); returns the records and
    checks each call's output (and in training the parameters' gradients) against eager and a high-precision copy."""
    module = module.to(dtype).train(train)
    reference = copy.deepcopy(module).to(hi_dtype(dtype))
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend, dynamic=dynamic)

    def step(m, args):
        m.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(train):
            out = m(*args)
            out = out[0] if isinstance(out, tuple) else out
            if train:
                weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
                (out.float() * weight).sum().backward()
        grads = {n.removeprefix("_orig_mod."): p.grad.detach().clone() for n, p in m.named_parameters()
                 if p.grad is not None}
        return out.detach(), grads

    with recording() as records, without_aot_cache():
        got = [step(compiled, args) for args in inputs]
    for i, args in enumerate(inputs):
        naive = step(module, args)
        hi = step(reference, [a.to(hi_dtype(dtype)) if a.is_floating_point() else a for a in args])
        assert_close_rule(f"call {i}: out", got[i][0], hi[0], naive[0], 2)
        assert set(got[i][1]) == set(hi[1])
        for name in hi[1]:
            assert_close_rule(f"call {i}: grad {name}", got[i][1][name], hi[1][name], naive[1][name], 3)
    return records


# ---- layouts: the op's inputs, and the consumers of its output ------------------------------------------------------

@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_without_weights(batch_first, train):
    """nn.MultiheadAttention(need_weights=False) takes SDPA and views its output as (S * B, E) after moving S first:
    a view that fa2's differently strided output cannot take (it gets a contiguous copy)."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=batch_first)
    shape = (lambda s: (2, s, 32)) if batch_first else (lambda s: (s, 2, 32))
    x, y = torch.randn(shape(16)), torch.randn(shape(9))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x, y):
            return self.mha(x, y, y, need_weights=False)[0]

    records = run_module(Block(), [(x, y)], train=train)
    assert_rewritten(records)


def test_fa2_ops_carry_their_input_strides():
    """Inductor gives an op that a custom pass inserted whatever input layout it likes unless the node carries the
    fake inputs it was traced with (``eager_input_vals``): SegFormer's q then reached fa2.fwd with its head dim
    strided. Every fa2 op the pass emits carries them, with a contiguous last dim."""
    from fa2.inductor import _compat
    from fa2.inductor.graph_pass import rewrite_attention
    seen = []

    def check(graph):
        sites = rewrite_attention(graph)
        for n in graph.nodes:
            if n.op == "call_function" and n.target in (torch.ops.fa2.fwd.default, torch.ops.fa2.bwd.default):
                args, _ = n.meta["eager_input_vals"]
                tensors = [a for a in args if isinstance(a, torch.Tensor) and a.dim() == 4]
                assert tensors and all(t.stride(-1) == 1 for t in tensors[:3]), n.format_node()
                seen.append(n.target)
        return sites

    def fn(q, k, v):
        return (q @ k.transpose(-1, -2) * 0.25).softmax(-1) @ v
    q, k, v = (t.requires_grad_() for t in qkv("cpu", torch.float32))
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=_compat.aot_eager_with_joint_pass(check))
    compiled(q, k, v).sum().backward()
    assert set(seen) == {torch.ops.fa2.fwd.default, torch.ops.fa2.bwd.default}
