"""Attention sinks (gpt-oss: a learned per-head logit in each row's softmax denominator): fa2.attention /
fa2.varlen_attention with ``sinks`` against the fp32 / fp64 reference (fa2.reference.attention_ref with sinks) under
the numerics rule, forward (out and lse, which includes the sink) and backward (dq, dk, dv and d sinks); GQA, causal,
windows, softcap, bias, rows that see no key, sinks far above or below the scores; varlen; opcheck; torch.compile
without graph breaks; bad sinks; a tiny gpt-oss model through the Hugging Face path against its eager attention;
the CUDA kernels of both paths at every instantiated head dim (skipped without a GPU)."""
from __future__ import annotations

import copy

import math

import pytest
import torch

import fa2
from fa2.reference import attention_ref, varlen_attention_ref
from kernels import switch
from numerics import assert_close_rule, hi_dtype
from samples import dtypes_for, make_qkv, skip_without_device

# (float16 and float64 in the slow profile: the same kernel code as float32 / bfloat16)
CPU_DTYPES = [torch.float32, torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow),
              pytest.param(torch.float64, marks=pytest.mark.slow)]

# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim): GQA, equal lengths, more queries than keys (causal rows
# that see no key), an odd headdim over many key blocks
SHAPES = [
    (2, 37, 53, 4, 2, 64),
    (1, 64, 64, 4, 4, 32),
    (2, 80, 40, 2, 1, 128),
    (1, 17, 130, 3, 3, 59),
]
FLAGS = [
    {},
    {"causal": True},
    {"window_left": 8, "window_right": 4},
    {"causal": True, "window_left": 16},
    {"softcap": 5.0},
    {"scale": 0.3, "causal": True},
]


_needs = skip_without_device


def make_sinks(nheads, device, dtype=torch.float32, generator=None, requires_grad=False):
    """Sinks of the size of typical scores, one well above them (the sink takes most of the row) and, with 3 or more
    heads, one far below (the same as none)."""
    s = torch.randn(nheads, device=device, generator=generator) * 1.5
    s[0] = 6.0
    if nheads >= 3:
        s[-1] = -30.0
    return s.to(dtype).requires_grad_(requires_grad)


def samples(device, dtype, *, requires_grad=False, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for i, shape in enumerate(SHAPES):
        for j, flags in enumerate(FLAGS):
            if (i + j) % 2 and not (device == "cuda"):  # (half of the crossings on the CPU: fast)
                continue
            b, sq, sk, h, hk, d = shape
            q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device=device, generator=g,
                               requires_grad=requires_grad)
            out.append((f"{shape}-{flags}", q, k, v, make_sinks(h, device, generator=g, requires_grad=requires_grad),
                        dict(flags)))
    # an additive float bias (a key padding of -inf and finite values) with sinks
    b, sq, sk, h, hk, d = SHAPES[0]
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device=device, generator=g, requires_grad=requires_grad)
    bias = torch.randn(b, 1, 1, sk, device=device, generator=g).to(dtype)
    bias[..., -5:] = -math.inf
    out.append(("bias", q, k, v, make_sinks(h, device, generator=g, requires_grad=requires_grad),
                {"attn_bias": bias}))
    return out


def _refs(q, k, v, sinks, flags):
    hi = hi_dtype(q.dtype)
    kw = dict(flags)
    if kw.get("attn_bias") is not None:
        kw["attn_bias"] = kw["attn_bias"].detach()
    leaf_hi = [t.detach().to(hi).requires_grad_() for t in (q, k, v, sinks)]
    out_hi, lse_hi = attention_ref(*leaf_hi[:3], sinks=leaf_hi[3], return_lse=True, **kw)
    leaf_lo = [t.detach().clone().requires_grad_() for t in (q, k, v)] + [sinks.detach().to(q.dtype).requires_grad_()]
    out_lo = attention_ref(*leaf_lo[:3], sinks=leaf_lo[3], upcast=False, **kw)
    return (out_hi, lse_hi, leaf_hi), (out_lo, leaf_lo)


def check_forward(name, q, k, v, sinks, flags):
    out, lse = fa2.attention_with_lse(q, k, v, sinks=sinks, **flags)
    (out_hi, lse_hi, _), (out_lo, _) = _refs(q, k, v, sinks, flags)
    assert_close_rule(f"out {name}", out, out_hi.detach(), out_lo.detach(), factor=2)
    lse_hi = lse_hi.detach().to(lse.device)
    finite = torch.isfinite(lse_hi)
    assert torch.equal(torch.isfinite(lse), finite), f"lse: +inf exactly for the rows that see no key ({name})"
    tol = 1e-3 if q.dtype in (torch.float16, torch.bfloat16) else 1e-5
    assert torch.allclose(lse[finite], lse_hi[finite].float(), atol=tol, rtol=tol), (
        f"lse {name}: max diff {(lse[finite] - lse_hi[finite]).abs().max().item():.3g}")
    assert (out.transpose(1, 2)[~finite] == 0).all(), f"rows that see no key output 0 ({name})"
    return out, lse


def check_backward(name, q, k, v, sinks, flags, dout):
    grads = torch.autograd.grad(fa2.attention(q, k, v, sinks=sinks, **flags), (q, k, v, sinks), dout)
    (out_hi, _, leaf_hi), (out_lo, leaf_lo) = _refs(q, k, v, sinks, flags)
    g_hi = torch.autograd.grad(out_hi, leaf_hi, dout.to(out_hi.dtype))
    g_lo = torch.autograd.grad(out_lo, leaf_lo, dout)
    for gname, g, gh, gl, t in zip(("dq", "dk", "dv", "dsinks"), grads, g_hi, g_lo, (q, k, v, sinks)):
        assert g.shape == t.shape and g.dtype == t.dtype, (gname, name, g.shape, g.dtype)
        assert_close_rule(f"{gname} {name}", g, gh.to(g.device), gl.to(g.device), factor=3)
    return grads


# ---- against the reference ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_forward_matches_reference(dtype):
    for name, q, k, v, sinks, flags in samples("cpu", dtype):
        check_forward(name, q, k, v, sinks, flags)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)  # (lse is float32: float64 P to ~1e-7)
def test_backward_matches_reference(dtype):
    for name, q, k, v, sinks, flags in samples("cpu", dtype, requires_grad=True, seed=1):
        dout = torch.randn(q.shape[:-1] + v.shape[-1:], dtype=dtype)
        check_backward(name, q, k, v, sinks, flags, dout)


def test_sinks_formula_by_hand():
    """The definition itself, written out for one small case (float64): p_j = exp(s_j - m) / (exp(sink - m) +
    sum_j exp(s_j - m)), lse = log(exp(sink) + sum_j exp(s_j)); d sinks = -sum_i p_sink,i * (dO_i . O_i)."""
    q, k, v = (torch.randn(1, 3, 2, 4, dtype=torch.float64) for _ in range(3))
    sinks = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
    out, lse = fa2.attention_with_lse(q, k, v, sinks=sinks, scale=0.7)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * 0.7
    denom = s.exp().sum(-1) + sinks.detach().view(1, 2, 1).exp()
    p = s.exp() / denom.unsqueeze(-1)
    torch.testing.assert_close(out, torch.einsum("bhij,bjhd->bihd", p, v), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, denom.log().float())
    dout = torch.randn_like(out)
    (dsinks,) = torch.autograd.grad(fa2.attention(q, k, v, sinks=sinks, scale=0.7), sinks, dout)
    p_sink = sinks.detach().view(1, 2, 1).exp() / denom
    want = -(p_sink * torch.einsum("bihd,bihd->bhi", dout, out)).sum((0, 2))
    torch.testing.assert_close(dsinks, want, rtol=1e-6, atol=1e-9)  # (the backward reads lse as float32)


def test_extreme_sinks_and_rows_without_keys():
    """A sink far above every score takes the whole row (out ~ 0, lse ~ sink, no overflow); one far below changes
    nothing (within rounding); rows that see no key output 0 with lse +inf and add nothing to d sinks."""
    q, k, v = make_qkv(1, 8, 4, 2, 2, 16, dtype=torch.float64, device="cpu")
    sinks = torch.tensor([500.0, -500.0], dtype=torch.float64, requires_grad=True)
    out, lse = fa2.attention_with_lse(q, k, v, sinks=sinks, causal=True)
    base, base_lse = fa2.attention_with_lse(q, k, v, causal=True)
    seen = torch.isfinite(base_lse[0, 0])
    assert seen.sum() == 4 and not seen[:4].any()  # causal, 8 queries on 4 keys: the first 4 rows see none
    assert torch.isinf(lse[0, :, ~seen]).all() and (out[0, ~seen] == 0).all()
    assert out[0, seen, 0].abs().max() < 1e-100 and torch.allclose(lse[0, 0, seen], torch.tensor(500.0))
    torch.testing.assert_close(out[0, :, 1], base[0, :, 1])
    torch.testing.assert_close(lse[0, 1], base_lse[0, 1])
    dout = torch.randn_like(out)
    (dsinks,) = torch.autograd.grad(fa2.attention(q, k, v, sinks=sinks, causal=True), sinks, dout)
    assert torch.isfinite(dsinks).all()
    # the head whose sink takes every row: d sinks = -sum_i dO_i . O_i = 0 as O = 0; the other: ~0 as p_sink ~ 0
    assert dsinks.abs().max() < 1e-100
    # no key at all
    q0, k0, v0 = make_qkv(1, 3, 0, 2, 2, 16, dtype=torch.float32, device="cpu")
    out0, lse0 = fa2.attention_with_lse(q0, k0, v0, sinks=sinks.detach().float())
    assert (out0 == 0).all() and torch.isinf(lse0).all()


def test_cuda_extreme_sinks():
    """The CUDA epilogue's sink fold (add_sink, on the SFU) at the extremes: a sink far above every score takes the
    whole row (out 0, lse = the sink, no overflow), one far below leaves out and lse as without sinks; rows that see
    no key (causal, more queries than keys) stay out 0 / lse +inf; d sinks finite."""
    _needs("cuda")
    q, k, v = make_qkv(2, 300, 200, 2, 2, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    sinks = torch.tensor([500.0, -500.0], device="cuda", requires_grad=True)
    out, lse = fa2.attention_with_lse(q, k, v, sinks=sinks, causal=True)
    base, base_lse = fa2.attention_with_lse(q, k, v, causal=True)
    seen = torch.isfinite(base_lse[:, 0])  # (batch, queries): the first 100 queries see no key
    assert not seen[:, :100].any() and seen[:, 100:].all()
    assert torch.isinf(lse.transpose(1, 2)[~seen]).all() and (out[~seen] == 0).all()
    assert (out[:, :, 0][seen] == 0).all() and torch.equal(lse[:, 0][seen], torch.full_like(lse[:, 0][seen], 500.0))
    torch.testing.assert_close(out[:, :, 1], base[:, :, 1])  # (rcp.approx(1) may be 1 ulp off 1)
    torch.testing.assert_close(lse[:, 1], base_lse[:, 1], rtol=0, atol=1e-6)
    (dsinks,) = torch.autograd.grad(fa2.attention(q, k, v, sinks=sinks, causal=True), sinks, torch.randn_like(out))
    assert torch.isfinite(dsinks).all() and dsinks.abs().max() < 1e-20


def test_sink_dtypes_and_gqa_head_mapping():
    """Sinks in any float dtype (read as float32 / the accumulation dtype); with GQA, sink h belongs to query head h
    (not its kv head): swapping two query heads' q and sinks swaps their outputs."""
    q, k, v = make_qkv(1, 20, 30, 4, 2, 32, dtype=torch.float32, device="cpu")
    sinks = torch.tensor([1.0, -2.0, 3.0, 0.5])
    want = fa2.attention(q, k, v, sinks=sinks)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        got = fa2.attention(q, k, v, sinks=sinks.to(dtype))
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # (these values are exact in every dtype)
    perm = [1, 0, 3, 2]  # swaps query heads within each kv group
    got = fa2.attention(q[:, :, perm], k, v, sinks=sinks[perm])
    torch.testing.assert_close(got, want[:, :, perm])


# ---- varlen ---------------------------------------------------------------------------------------------------------

def _cu(lengths, device):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)


VARLEN_CASES = [
    ([5, 0, 1, 40, 17], [7, 3, 0, 40, 30], 4, 2, 64, {}),
    ([5, 0, 1, 40, 17], [7, 3, 0, 40, 30], 4, 2, 64, {"causal": True}),
    ([33, 12], [20, 12], 2, 2, 32, {"causal": True, "window_left": 4, "softcap": 8.0}),
    ([8, 8, 8], [8, 8, 8], 3, 1, 48, {}),
]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_varlen_with_sinks_matches_reference(device):
    _needs(device)
    g = torch.Generator(device=device).manual_seed(5)
    for dtype in dtypes_for(device)[:2] + ([torch.float64] if device == "cpu" else []):
        for lq, lk, h, hk, d, flags in VARLEN_CASES:
            name = f"{lq}/{lk}-h{h}/{hk}-d{d}-{flags}-{dtype}"
            q, k, v = (t[0].requires_grad_() for t in make_qkv(1, sum(lq), sum(lk), h, hk, d, dtype=dtype,
                                                                device=device, generator=g))
            sinks = make_sinks(h, device, generator=g, requires_grad=True)
            cu_q, cu_k = _cu(lq, device), _cu(lk, device)
            args = (q, k, v, cu_q, cu_k, max(lq), max(lk))
            out, lse = torch.ops.fa2.varlen_fwd(*args, sinks=sinks, **flags)
            hi = hi_dtype(dtype)
            leaf_hi = [t.detach().to(hi).requires_grad_() for t in (q, k, v, sinks)]
            out_hi, lse_hi = varlen_attention_ref(*leaf_hi[:3], cu_q.cpu(), cu_k.cpu(), sinks=leaf_hi[3].cpu(),
                                                  return_lse=True, **flags) if device == "cpu" else \
                varlen_attention_ref(*(t.cpu() for t in leaf_hi[:3]), cu_q.cpu(), cu_k.cpu(),
                                     sinks=leaf_hi[3].cpu(), return_lse=True, **flags)
            leaf_lo = [t.detach().cpu().clone().requires_grad_() for t in (q, k, v)] + \
                [sinks.detach().cpu().to(dtype).requires_grad_()]
            out_lo = varlen_attention_ref(*leaf_lo[:3], cu_q.cpu(), cu_k.cpu(), sinks=leaf_lo[3], upcast=False,
                                          **flags)
            assert_close_rule(f"out {name}", out, out_hi.detach().to(device), out_lo.detach().to(device), factor=2)
            finite = torch.isfinite(lse_hi).to(device)
            assert torch.equal(torch.isfinite(lse), finite), name
            tol = 1e-3 if dtype in (torch.float16, torch.bfloat16) else 1e-5
            assert torch.allclose(lse[finite], lse_hi.detach().to(device)[finite].float(), atol=tol, rtol=tol), name
            dout = torch.randn_like(out)
            grads = torch.autograd.grad(fa2.varlen_attention(*args, sinks=sinks, **flags), (q, k, v, sinks), dout)
            if dtype == torch.float64:  # (lse is float32: float64 gradients only to ~1e-7, the forward exactly)
                continue
            g_hi = torch.autograd.grad(out_hi, leaf_hi, dout.cpu().to(hi))
            g_lo = torch.autograd.grad(out_lo, leaf_lo, dout.cpu())
            for gname, gr, gh, gl in zip(("dq", "dk", "dv", "dsinks"), grads, g_hi, g_lo):
                assert_close_rule(f"{gname} {name}", gr, gh.to(device), gl.to(device), factor=3)


def test_varlen_equals_padded_with_sinks():
    """One sequence of a varlen batch = fa2.attention on it alone, sinks included (out, lse and d sinks summed)."""
    lq, lk = [9, 30, 1], [12, 30, 5]
    q, k, v = (t[0] for t in make_qkv(1, sum(lq), sum(lk), 4, 2, 32, dtype=torch.float64, device="cpu"))
    sinks = make_sinks(4, "cpu", dtype=torch.float64, requires_grad=True)
    cu_q, cu_k = _cu(lq, "cpu"), _cu(lk, "cpu")
    out, lse = torch.ops.fa2.varlen_fwd(q, k, v, cu_q, cu_k, max(lq), max(lk), sinks=sinks, causal=True)
    dout = torch.randn_like(out)
    (dsinks,) = torch.autograd.grad(fa2.varlen_attention(q, k, v, cu_q, cu_k, max(lq), max(lk), sinks=sinks,
                                                         causal=True), sinks, dout)
    want_dsinks = torch.zeros_like(sinks)
    for b in range(3):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        o, l = fa2.attention_with_lse(q[None, rq], k[None, rk], v[None, rk], sinks=sinks.detach(), causal=True)
        torch.testing.assert_close(out[rq], o[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse[:, rq], l[0])
        want_dsinks += torch.autograd.grad(fa2.attention(q[None, rq], k[None, rk], v[None, rk], sinks=sinks,
                                                         causal=True), sinks, dout[None, rq])[0]
    torch.testing.assert_close(dsinks, want_dsinks, rtol=1e-12, atol=1e-12)


# ---- opcheck, torch.compile ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_opcheck_with_sinks(device):
    _needs(device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = make_qkv(2, 24, 40, 4, 2, 32, dtype=dtype, device=device, requires_grad=True)
    sinks = make_sinks(4, device, requires_grad=True)
    torch.library.opcheck(torch.ops.fa2.attention.default, (q, k, v), {"sinks": sinks, "causal": True,
                                                                        "window_left": 6})
    torch.library.opcheck(torch.ops.fa2.fwd.default, (q, k, v), {"sinks": sinks})
    with torch.no_grad():
        out, lse = torch.ops.fa2.fwd(q, k, v, None, None, True, sinks=sinks)
    dense_bwd_args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse)
    torch.library.opcheck(torch.ops.fa2.bwd_with_sinks.default, dense_bwd_args + (sinks.detach(),), {"causal": True})
    # bwd_with_sinks = bwd + d sinks: the same kernels, bitwise
    with_sinks = torch.ops.fa2.bwd_with_sinks(*dense_bwd_args, sinks.detach(), causal=True)
    plain = torch.ops.fa2.bwd(*dense_bwd_args, causal=True)
    assert all(torch.equal(a, b) for a, b in zip(with_sinks[:3], plain[:3]))
    assert with_sinks[4].shape == sinks.shape and with_sinks[4].dtype == sinks.dtype
    lq, lk = [7, 0, 17], [9, 4, 20]
    qv, kv_, vv = (t[0].requires_grad_() for t in make_qkv(1, sum(lq), sum(lk), 4, 2, 32, dtype=dtype, device=device))
    args = (qv, kv_, vv, _cu(lq, device), _cu(lk, device), max(lq), max(lk))
    torch.library.opcheck(torch.ops.fa2.varlen_fwd.default, args, {"sinks": sinks, "causal": True})
    with torch.no_grad():
        out, lse = torch.ops.fa2.varlen_fwd(*args, sinks=sinks, causal=True)
    bwd_args = (torch.randn_like(out), qv.detach(), kv_.detach(), vv.detach(), out, lse) + args[3:]
    torch.library.opcheck(torch.ops.fa2.varlen_bwd.default, bwd_args, {"sinks": sinks.detach(), "causal": True})


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_compile_fullgraph_with_sinks(device):
    """torch.compile(fullgraph=True) of fa2.attention / fa2.varlen_attention with learned sinks: one graph each, no
    graph break, results and gradients (d sinks included) equal to eager's."""
    _needs(device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()

    def f(q, k, v, sinks):
        return fa2.attention(q, k, v, sinks=sinks, causal=True, window_left=7).float().square().sum()

    def f_varlen(q, k, v, cu, sinks):
        return fa2.varlen_attention(q, k, v, cu, cu, 20, 20, sinks=sinks, causal=True).float().square().sum()

    q, k, v = make_qkv(2, 33, 33, 4, 2, 32, dtype=dtype, device=device, requires_grad=True)
    sinks = make_sinks(4, device, requires_grad=True)
    cu = _cu([13, 20], device)
    qv, kv_, vv = (t.detach()[0, :33].clone().requires_grad_() for t in (q, k, v))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for fn, inputs in ((f, (q, k, v, sinks)), (f_varlen, (qv, kv_, vv, cu, sinks))):
        leaves = [t for t in inputs if t.requires_grad]
        loss = torch.compile(fn, fullgraph=True)(*inputs)
        grads = torch.autograd.grad(loss, leaves)
        loss_e = fn(*inputs)
        grads_e = torch.autograd.grad(loss_e, leaves)
        assert torch.allclose(loss, loss_e, rtol=tol), fn.__name__
        for g, ge in zip(grads, grads_e):
            assert torch.allclose(g, ge, rtol=tol, atol=tol), fn.__name__
    assert not counters["graph_break"], dict(counters["graph_break"])


# ---- bad input ------------------------------------------------------------------------------------------------------

def test_bad_sinks_raise_clear_errors():
    q, k, v = make_qkv(1, 5, 6, 4, 2, 16, dtype=torch.float32, device="cpu")
    cases = [
        (torch.zeros(3), ValueError, r"sinks must have shape \(nheads,\) = \(4,\).*got \[3\]"),
        (torch.zeros(1, 4), ValueError, r"sinks must have shape \(nheads,\) = \(4,\).*got \[1, 4\]"),
        (torch.zeros(2), ValueError, r"got \[2\]"),  # (nheads_k's count: sinks are per query head)
        (torch.zeros(4, dtype=torch.int64), TypeError, "sinks must be a floating-point tensor.*got Long"),
        (torch.zeros(4, dtype=torch.bool), TypeError, "sinks must be a floating-point tensor.*got Bool"),
        (torch.zeros(4, device="meta"), RuntimeError, r"sinks must be on q's device \(cpu\), got meta"),
    ]
    for sinks, error, match in cases:
        with pytest.raises(error, match=match):
            fa2.attention(q, k, v, sinks=sinks)
        with pytest.raises(error, match=match):
            fa2.varlen_attention(q[0], k[0], v[0], _cu([5], "cpu"), _cu([6], "cpu"), 5, 6, sinks=sinks)


# ---- Hugging Face: gpt-oss ------------------------------------------------------------------------------------------

def test_gpt_oss_tiny_matches_eager():
    """A tiny gpt-oss (sinks on every layer, a sliding-window layer and a full one, GQA) through
    attn_implementation="fa2": logits and every gradient (the sinks' included) equal to its eager attention (float32,
    CPU: gpt-oss's experts have no float64 path), without and with a padded batch."""
    transformers = pytest.importorskip("transformers")
    import fa2.hf
    fa2.hf.register()
    cfg = transformers.GptOssConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                    num_experts_per_tok=2, sliding_window=6, max_position_embeddings=128,
                                    layer_types=["sliding_attention", "full_attention"], attention_dropout=0.0)
    torch.manual_seed(0)
    eager = transformers.GptOssForCausalLM(cfg).eval()
    eager.config._attn_implementation = "eager"
    with torch.no_grad():  # sinks of both signs, large enough to matter
        for layer in eager.model.layers:
            layer.self_attn.sinks.copy_(torch.tensor([2.0, -1.0, 0.5, 4.0]))
    model = transformers.GptOssForCausalLM(copy.deepcopy(cfg)).eval()  # (its own config: set_attn_implementation
    model.load_state_dict(eager.state_dict())                         # would switch a shared one for both)
    model.set_attn_implementation("fa2")
    assert eager.config._attn_implementation == "eager"
    ids = torch.randint(0, 128, (2, 19))
    with torch.profiler.profile() as prof:  # (really fa2's op, not a fallback)
        model(input_ids=ids)
    assert sum(e.key == "fa2::fwd" for e in prof.key_averages()) == 1
    with torch.profiler.profile() as prof:  # (and the reference really eager)
        eager(input_ids=ids)
    assert not any(e.key.startswith("fa2::") for e in prof.key_averages())
    padded = torch.ones_like(ids)
    padded[1, :5] = 0  # left padding on the second row
    for mask in (None, padded):
        outs = []
        for m in (eager, model):
            m.zero_grad()
            logits = m(input_ids=ids, attention_mask=mask).logits
            keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
            logits[keep].square().sum().backward()
            outs.append((logits[keep].detach(), {n: p.grad.clone() for n, p in m.named_parameters()
                                                 if p.grad is not None}))
        (le, ge), (lf, gf) = outs
        torch.testing.assert_close(lf, le, rtol=1e-5, atol=1e-5)
        assert ge.keys() == gf.keys() and any(n.endswith("sinks") for n in gf)
        for n in ge:
            scale = ge[n].abs().max().item()
            torch.testing.assert_close(gf[n], ge[n], rtol=1e-4, atol=1e-5 * scale, msg=lambda m, n=n: f"{n}: {m}")


# ---- CUDA: both forward paths, every instantiated head dim -----------------------------------------------------------

def _arch_paths():
    """[True] (the default kernels), plus False (the sm80-path kernels) where the GPU also has sm_90a ones and the
    build has the plain sm_90 ones that path runs on (FA2_CUDA_ARCHS with 90, not only 90a)."""
    info = fa2._C.build_info()
    archs = str(info.get("cuda_archs", "")).replace(";", ",").split(",")
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and \
            "sm90a" in info["kernels"] and "90" in archs:
        return [True, False]
    return [True]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_cuda_sinks_both_paths_every_headdim(dtype):
    """Forward (out, lse) and backward (dq, dk, dv, d sinks) with sinks on the GPU, every headdim the build
    instantiates, plain / causal / window / softcap, GQA, on the sm_90a kernels and the sm80-path ones."""
    _needs("cuda")
    g = torch.Generator(device="cuda").manual_seed(7)
    cases = [((2, 300, 300, 4, 2), {}), ((1, 257, 511, 2, 2), {"causal": True}),
             ((2, 200, 130, 4, 1), {"causal": True, "window_left": 50}), ((1, 128, 384, 2, 2), {"softcap": 10.0})]
    for arch_specific in _arch_paths():
        with switch("arch_specific_kernels", arch_specific):
            for d in (32, 64, 96, 128, 192, 256):
                for (b, sq, sk, h, hk), flags in cases:
                    name = f"arch_specific={arch_specific} d{d} {(b, sq, sk, h, hk)} {flags} {dtype}"
                    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device="cuda", generator=g,
                                       requires_grad=True)
                    sinks = make_sinks(h, "cuda", generator=g, requires_grad=True)
                    check_forward(name, q, k, v, sinks, flags)
                    dout = torch.randn(q.shape, dtype=dtype, device="cuda", generator=g)
                    check_backward(name, q, k, v, sinks, flags, dout)


def test_cuda_sinks_schedules_and_determinism():
    """Every sm_90a forward schedule folds the sink alike (the same epilogue), and d sinks is bitwise reproducible
    under fa2.deterministic()."""
    _needs("cuda")
    q, k, v = make_qkv(2, 1000, 1000, 8, 2, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    sinks = make_sinks(8, "cuda", requires_grad=True)
    want, _ = check_forward("default", q, k, v, sinks, {"causal": True})
    if _arch_paths() == [True, False]:
        for schedule in ("pipelined", "ws", "pingpong", "overlap", "pingpong-overlap"):
            with switch("sm90_schedule", schedule):
                check_forward(f"sm90_schedule={schedule}", q, k, v, sinks, {"causal": True})
    dout = torch.randn_like(want)
    with fa2.deterministic():
        runs = [torch.autograd.grad(fa2.attention(q, k, v, sinks=sinks, causal=True), (q, sinks), dout)
                for _ in range(2)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


def test_cuda_sinks_head_of_each_tile():
    """The forward's epilogue finds each tile's sink by its head (sm_90a: from the warp's shared slot written at the
    tile's start): persistent CTAs running tiles of many heads in turn (d 128, with and without the tile counter), the
    causal tail order (d 64 at 1k: the last heads' blocks longest first), the wide d 64 kernel (8k keys), GQA; every
    head's sink different, so that a tile taking another head's sink is far outside the rule."""
    _needs("cuda")
    g = torch.Generator(device="cuda").manual_seed(23)
    cases = [((4, 1024, 1024, 16, 4, 128), {}), ((4, 1024, 1024, 16, 4, 128), {"causal": True}),
             ((8, 1024, 1024, 16, 16, 64), {"causal": True}), ((1, 8192, 8192, 4, 2, 64), {})]
    for (b, sq, sk, h, hk, d), flags in cases:
        q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=torch.bfloat16, device="cuda", generator=g)
        sinks = torch.linspace(-4.0, 6.0, h, device="cuda")[torch.randperm(h, generator=g, device="cuda")]
        check_forward(f"head of each tile {(b, sq, sk, h, hk, d)} {flags}", q, k, v, sinks, flags)


def test_cuda_sinks_grad_over_many_rows():
    """d sinks' one-kernel reduction (a CTA per head, 2048 rows a pass) over several passes and a partial last one,
    rows that see no key (causal, more queries than keys) among them, sinks in bfloat16 (returned in it), dense and
    varlen (a sequence of length 0 among them)."""
    _needs("cuda")
    _check_sinks_grad_over_many_rows("cuda")


def _check_sinks_grad_over_many_rows(device):
    g = torch.Generator(device=device).manual_seed(11)
    q, k, v = make_qkv(3, 1700, 96, 4, 2, 64, dtype=torch.bfloat16, device=device, generator=g, requires_grad=True)
    for sinks_dtype in (torch.float32, torch.bfloat16):
        sinks = make_sinks(4, device, dtype=sinks_dtype, generator=g, requires_grad=True)
        dout = torch.randn(q.shape, dtype=q.dtype, device=device, generator=g)
        check_backward(f"many rows {sinks_dtype}", q, k, v, sinks, {"causal": True}, dout)
    lens = [1500, 0, 2600, 7]
    cu = torch.tensor([0] + lens, device=device).cumsum(0).to(torch.int32)
    total = int(cu[-1])
    qkv = [torch.randn(total, h, 64, device=device, generator=g).to(torch.bfloat16).requires_grad_() for h in (4, 2, 2)]
    sinks = make_sinks(4, device, generator=g, requires_grad=True)
    out = fa2.varlen_attention(*qkv, cu, cu, max(lens), max(lens), causal=True, sinks=sinks)
    dout = torch.randn(out.shape, device=device, generator=g).to(out.dtype)
    got = torch.autograd.grad(out, qkv + [sinks], dout)
    hi = [t.detach().double().requires_grad_() for t in qkv + [sinks]]
    lo = [t.detach().clone().requires_grad_() for t in qkv] + [sinks.detach().to(torch.bfloat16).requires_grad_()]
    want_hi = torch.autograd.grad(varlen_attention_ref(*hi[:3], cu, cu, causal=True, sinks=hi[3]), hi, dout.double())
    want_lo = torch.autograd.grad(varlen_attention_ref(*lo[:3], cu, cu, causal=True, sinks=lo[3], upcast=False), lo,
                                  dout)
    for name, a, h_, l_ in zip(("dq", "dk", "dv", "dsinks"), got, want_hi, want_lo):
        assert_close_rule(f"varlen many rows {name}", a, h_, l_, factor=3)
