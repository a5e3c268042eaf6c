"""Causal masks kept in module buffers (nanoGPT's ``tril``): the fa2 backends take a triangular buffer's value as a
compile-time constant, behind a guard (fa2/inductor/buffers.py), so that such a mask becomes ``causal=True`` instead of
a bool bias; the results stay those of eager, also when the buffer changes after compilation."""
from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn as nn

import fa2
import fa2.backend  # noqa: F401  (registers the "fa2" and "fa2_eager" backends)
from fa2.inductor import recording
from fa2.inductor._compat import without_aot_cache
from fa2.inductor.buffers import take_mask_buffers, triangle_kind
from numerics import assert_close_rule

_CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not _CUDA, reason="no CUDA"))]


class BufferMaskAttention(nn.Module):
    """Attention written by hand with its mask in a buffer, in the spellings real code uses:
    "ones_eq0": nanoGPT / minGPT (float tril of ones, hide == 0); "bool_not": a bool tril, hide ~mask;
    "triu_strict": a strictly upper bool triangle of what to hide (triu(ones, 1)); "where": where(tril, s, -inf).
    Not causal (stays a bias): "hide_lower": a tril hiding where it is 1."""

    def __init__(self, kind: str, block: int = 24, dim: int = 32, heads: int = 2):
        super().__init__()
        self.kind, self.heads = kind, heads
        self.qkv = nn.Linear(dim, 3 * dim)
        ones = torch.ones(block, block)
        if kind in ("ones_eq0", "hide_lower"):
            mask = torch.tril(ones).view(1, 1, block, block)
        elif kind in ("bool_not", "where"):
            mask = torch.tril(ones).bool()
        else:
            mask = torch.triu(ones, 1).bool()
        self.register_buffer("mask", mask)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.kind == "ones_eq0":
            att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        elif self.kind == "bool_not":
            att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        elif self.kind == "where":
            att = torch.where(self.mask[:t, :t], att, float("-inf"))
        elif self.kind == "hide_lower":
            att = att.masked_fill(self.mask[:, :, :t, :t].bool(), -1e4)
        else:
            att = att.masked_fill(self.mask[:t, :t], float("-inf"))
        return (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)


def _taken(model, x):
    """How many buffers take_mask_buffers replaces in each Dynamo graph of model(x)."""
    counts = []

    def capture(gm, example_inputs):
        counts.append(len(take_mask_buffers(gm, example_inputs)[1]))
        return gm
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=capture)(x)
    return counts


def _compare(model, compiled, x):
    """compiled(x) against model(x): the output and every parameter's gradient, by the numerics rule against an fp64
    copy of the model."""
    def step(f, m, inp):
        m.zero_grad()
        out = f(inp)
        out.square().sum().backward()
        return out.detach().float(), [p.grad.float().clone() for p in m.parameters()]
    got = step(compiled, model, x)
    naive = step(model, model, x)
    hi_model = copy.deepcopy(model).double()
    hi = step(hi_model, hi_model, x.double())
    assert_close_rule("out", got[0], hi[0], naive[0], 2)
    for i, (g, n, h) in enumerate(zip(got[1], naive[1], hi[1])):
        assert_close_rule(f"grad[{i}]", g, h, n, 3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["ones_eq0", "bool_not", "triu_strict", "where"])
def test_triangular_buffer_mask_becomes_causal(kind, device):
    """The mask buffer's value is read at compile time: the site becomes fa2 with causal=True (no bias), forward and
    backward, with eager's results."""
    torch.manual_seed(0)
    # (bf16 on CUDA: its kernels take 16-bit inputs; an fp32 site there is recognized, causal, and left as it is)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = BufferMaskAttention(kind).to(device, dtype)
    x = torch.randn(2, 19, 32, device=device, dtype=dtype)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="fa2_eager")
    with recording() as records, without_aot_cache():
        _compare(model, compiled, x)
    assert records and all(r.rewritten for r in records), [str(r) for r in records]
    assert all(r.flags.get("causal") is True and "bias" not in r.flags for r in records), [str(r) for r in records]


@pytest.mark.slow  # (causal buffers through the pass: test_triangular_buffer_mask_becomes_causal in the quick run)
def test_inductor_backend_and_explain_see_the_causal_buffer():
    """The same through backend="fa2" (Inductor) and fa2.explain, on the demo's NanoGPT (the README's first
    command): its tril buffer gives causal=True."""
    from fa2.demo import NanoGPT
    torch.manual_seed(0)
    model = NanoGPT(layers=2, seqlen=32)
    ids = torch.randint(0, 256, (2, 32))
    records = fa2.explain(model, ids)
    assert len(records) == 2 and all(r.rewritten and r.flags.get("causal") is True and "bias" not in r.flags
                                     for r in records), [str(r) for r in records]
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="fa2")
    torch.testing.assert_close(compiled(ids)[0], model(ids)[0], atol=2e-5, rtol=1e-4)


def test_changed_buffer_runs_uncompiled_with_a_warning():
    """After compilation: the buffer modified in place but still the triangle (or replaced by an equal one, or given
    new storage through .data) keeps the compiled graph; a buffer that no longer holds it makes the graph run
    uncompiled from then on, with a warning, and the results stay eager's. (Writes through .data[...] that the
    version counter does not see are not seen either: documented in fa2/inductor/buffers.py.)"""
    torch.manual_seed(0)
    model = BufferMaskAttention("ones_eq0")
    x = torch.randn(2, 19, 32)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="fa2_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning while the buffer holds the triangle
            model.mask.mul_(1.0)  # in place (version counter moves), same values
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
            model.mask = model.mask.clone()  # replaced by an equal tensor
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
            model.mask.data = torch.tril(torch.ones_like(model.mask))  # new storage, the same triangle
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
        model.mask[..., 3, 7] = 1.0  # no longer causal: query 3 sees key 7
        with pytest.warns(UserWarning, match="causal-mask buffer"):
            got = compiled(x)
        assert torch.equal(got, model(x))  # (the uncompiled graph: eager's operations)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warned once
            assert torch.equal(compiled(x), model(x))


class WritesItsMask(BufferMaskAttention):
    """Uses the buffer as nanoGPT does, then writes it (or returns a view of it): the graph must keep the buffer."""

    def __init__(self, how):
        super().__init__("ones_eq0")
        self.how = how

    def forward(self, x):
        out = super().forward(x)
        if self.how == "write":
            self.mask[..., 0, 5] = 1.0
            return out
        return out, self.mask[..., :4, :4]


@pytest.mark.parametrize("how", ["write", "return"])
def test_buffers_written_or_returned_are_left_alone(how):
    """A buffer the graph writes or returns (a view of it) stays the graph's input: the write reaches the module's
    buffer and the returned view aliases it, as in eager; the mask stays a bias."""
    torch.manual_seed(0)
    model, ref = WritesItsMask(how), WritesItsMask(how)
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 19, 32)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="fa2_eager")
    with torch.no_grad(), recording() as records, without_aot_cache():
        for _ in range(2):
            got, want = compiled(x), ref(x)
            if how == "return":
                assert got[1].untyped_storage().data_ptr() == model.mask.untyped_storage().data_ptr()
                got, want = got[0], want[0]
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(model.mask, ref.mask)
    assert records and all(r.flags.get("bias") == "bool" for r in records), [str(r) for r in records]


def test_a_mask_that_is_not_causal_and_the_guard_s_references():
    """A triangular buffer that hides the lower triangle (not causal=True's band) is left alone (else the graph would
    rebuild the whole triangle on every call for a bias); the guard does not keep a deleted model's buffer alive."""
    import gc
    import weakref
    torch.manual_seed(0)
    model = BufferMaskAttention("hide_lower")
    x = torch.randn(2, 19, 32)
    torch._dynamo.reset()
    with torch.no_grad(), recording() as records, without_aot_cache():
        torch.testing.assert_close(torch.compile(model, backend="fa2_eager")(x), model(x), atol=1e-5, rtol=1e-5)
    assert records and all("causal" not in r.flags for r in records), [str(r) for r in records]
    assert _taken(model, x) == [0] and _taken(BufferMaskAttention("ones_eq0"), x) == [1]
    model = BufferMaskAttention("ones_eq0")
    with torch.no_grad():
        torch.compile(model, backend="fa2_eager")(x)
    buffer = weakref.ref(model.mask)
    del model
    gc.collect()
    assert buffer() is None, "the compiled graph's guard keeps the buffer alive"


def test_only_triangular_module_buffers_are_taken():
    """A mask passed as an input, a parameter holding a triangle and a non-triangular buffer stay what they are
    (bias); triangle_kind names exactly the 0/1 triangles."""
    ones = torch.ones(5, 5)
    assert triangle_kind(torch.tril(ones)) == "tril" and triangle_kind(torch.tril(ones).bool()) == "tril"
    assert triangle_kind(torch.triu(ones, 1)) == "triu_strict" and triangle_kind(torch.triu(ones)) == "triu"
    assert triangle_kind(torch.tril(ones).expand(3, 2, 5, 5)) == "tril"
    for t in (torch.tril(ones) * 2, torch.tril(ones, -2), ones, torch.zeros(5, 5), torch.tril(ones)[0],
              nn.Parameter(torch.tril(ones), requires_grad=False), torch.tril(ones).to("meta"),
              torch.tril(ones).to_sparse()):
        assert triangle_kind(t) is None, t

    def attn(q, k, v, mask):
        s = (q @ k.transpose(-2, -1) * 0.25).masked_fill(mask == 0, float("-inf"))
        return s.softmax(-1) @ v
    q, k, v = (torch.randn(2, 2, 9, 8) for _ in range(3))
    torch._dynamo.reset()
    with recording() as records, without_aot_cache():
        torch.compile(attn, backend="fa2_eager")(q, k, v, torch.tril(torch.ones(9, 9)))
    assert records and all(r.flags.get("bias") == "bool" for r in records), [str(r) for r in records]
    # a triangle held by a parameter, and a buffer that is not a triangle, stay the graph's inputs
    x = torch.randn(2, 19, 32)
    with_parameter = BufferMaskAttention("ones_eq0")
    del with_parameter.mask
    with_parameter.mask = nn.Parameter(torch.tril(torch.ones(24, 24)).view(1, 1, 24, 24), requires_grad=False)
    not_a_triangle = BufferMaskAttention("ones_eq0")
    not_a_triangle.mask[..., 5, 9] = 1.0
    assert _taken(with_parameter, x) == [0] and _taken(not_a_triangle, x) == [0]
