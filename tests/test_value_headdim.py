"""v's own head dim (headdim_v != headdim, as DeepSeek's MLA: q and k 192, v 128): every op, forward and backward,
with GQA, causal, windows, softcap and biases, on the CPU and CUDA, against the reference math with the numerics
rule; opcheck, torch.compile, fa2.sdpa, the error messages and the plan's padding (the CUDA glue zero-pads the
operands with the smaller head dim to the larger one)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import fa2
from fa2.reference import attention_ref
from numerics import assert_close_rule, hi_dtype
from samples import dtypes_for, make_bias, make_qkv

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
DEVICE_DTYPES = ([("cpu", t) for t in dtypes_for("cpu") + [torch.float64]] +
                 [pytest.param("cuda", t, marks=CUDA) for t in (torch.float16, torch.bfloat16)])


def _ids(param):
    return str(param).split(".")[-1]


# (q and k's head dim, v's): DeepSeek's MLA, v wider than q/k, odd ones either way (multiples of 8 or not), extremes
HEADDIM_PAIRS = [(192, 128), (64, 128), (40, 24), (24, 40), (59, 111), (128, 64), (1, 256), (256, 1), (8, 3)]


def _check(device, dtype, shape, headdim_v, flags, bias_kind=None, layout="bshd", seed=0):
    """fa2.attention_with_lse and fa2.attention (forward) and the backward through fa2.attention (dq, dk, dv and a float
    bias's gradient) of one problem, against the reference math (numerics rule: 2x the naive error for out, 3x for
    gradients; lse within 1e-3 / 1e-5)."""
    b, sq, sk, h, hk, d = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device=device, layout=layout, requires_grad=True,
                       generator=gen, headdim_v=headdim_v)
    bias = None if bias_kind is None else make_bias(bias_kind, b, h, sq, sk, dtype=dtype, device=device,
                                                    requires_grad=True, generator=gen)
    what = f"{shape} dv {headdim_v} {dtype} {flags} bias {bias_kind} {layout}"
    out, lse = fa2.attention_with_lse(q, k, v, bias, **flags)
    assert out.shape == (b, sq, h, headdim_v) and out.dtype == dtype and out.is_contiguous(), what
    assert lse.shape == (b, h, sq) and lse.dtype == torch.float32, what
    assert torch.equal(fa2.attention(q, k, v, bias, **flags), out), what

    hi = hi_dtype(dtype)
    bias_grad = bias is not None and bias.requires_grad  # (a float bias other than "padding")
    diff = [q, k, v] + ([bias] if bias_grad else [])
    leaf_hi = [t.detach().to(hi).requires_grad_() for t in diff]
    leaf_lo = [t.detach().clone().requires_grad_() for t in diff]
    fixed_bias = None if bias is None else bias.detach()  # (the reference upcasts a float bias itself)
    out_hi, lse_hi = attention_ref(*leaf_hi[:3], leaf_hi[3] if bias_grad else fixed_bias, return_lse=True, **flags)
    out_lo = attention_ref(*leaf_lo[:3], leaf_lo[3] if bias_grad else fixed_bias, upcast=False, **flags)
    assert_close_rule(f"out {what}", out, out_hi, out_lo, factor=2)
    finite = torch.isfinite(lse_hi)
    assert torch.equal(torch.isfinite(lse), finite) and (lse[~finite] == math.inf).all(), what
    tol = 1e-3 if dtype in (torch.float16, torch.bfloat16) else 1e-5
    assert torch.allclose(lse[finite], lse_hi[finite].float(), atol=tol, rtol=tol), what

    dout = torch.randn(out.shape, generator=gen, device=device).to(dtype)
    grads = torch.autograd.grad(out, diff, dout)
    grads_hi = torch.autograd.grad(out_hi, leaf_hi, dout.to(hi))
    grads_lo = torch.autograd.grad(out_lo, leaf_lo, dout)
    for name, g, g_hi, g_lo, x in zip(("dq", "dk", "dv", "dbias"), grads, grads_hi, grads_lo, diff):
        assert g.shape == x.shape and g.dtype == x.dtype, f"{name} {what}"
        assert_close_rule(f"{name} {what}", g, g_hi, g_lo, factor=3)


# (shape (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim), headdim_v, flags, bias kind, layout)
CASES = [
    ((1, 64, 64, 8, 2, 192), 128, {"causal": True}, None, "bshd"),           # DeepSeek's MLA head dims, GQA 4:1
    ((1, 97, 130, 4, 4, 64), 128, {"window_left": 16, "window_right": 0}, None, "bhsd"),
    ((1, 33, 47, 4, 1, 40), 24, {"softcap": 5.0}, "full", "bshd"),          # MQA, a bias with a gradient
    ((2, 17, 9, 2, 2, 24), 40, {"causal": True}, "bool_padding", "bhsd"),
    ((1, 130, 97, 6, 2, 128), 64, {"causal": True, "scale": 0.1}, "padding", "bshd"),
    ((1, 64, 32, 2, 1, 59), 111, {"causal": True}, None, "bshd"),           # rows 0..31 see no key
]


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES, ids=_ids)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0][-1]}-{c[1]}")
def test_value_headdim_matches_reference(device, dtype, case):
    shape, headdim_v, flags, bias_kind, layout = case
    _check(device, dtype, shape, headdim_v, flags, bias_kind, layout)



def test_rows_that_see_one_key_hypothesis_case():
    """A draw of test_value_headdim_property that failed on the CPU: causal with window_left 0 and seqlen_k > seqlen_q,
    so every row sees exactly one key. The reference's dk is exactly 0 (a softmax over one key is constant), while the
    backward's recomputed S sat an ulp off the forward's: P = exp(S - lse) = 1 - 4e-7, dS = P dP (1 - P) gave
    dk = 1.45e-5 > the rule's 1e-5 floor (headdim 2: scale 0.7; headdim_v 54: |dP| ~ 17)."""
    flags = {"causal": True, "window_left": 0, "window_right": -1, "softcap": 0.0, "scale": None}
    _check("cpu", torch.float32, (2, 17, 64, 2, 2, 2), 54, flags, None, "bshd", seed=0)

@st.composite
def problems(draw, device):
    dtype = draw(st.sampled_from(dtypes_for(device)))
    headdim, headdim_v = draw(st.one_of(st.sampled_from(HEADDIM_PAIRS),
                                        st.tuples(st.integers(1, 256), st.integers(1, 256))))
    nheads_k = draw(st.integers(1, 2))
    shape = (draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 17, 64, 97])),
             draw(st.sampled_from([1, 3, 31, 64, 130])), nheads_k * draw(st.sampled_from([1, 2, 4])), nheads_k,
             headdim)
    flags = dict(causal=draw(st.booleans()), window_left=draw(st.sampled_from([-1, -1, 0, 5, 40])),
                 window_right=draw(st.sampled_from([-1, -1, 0, 3])),
                 softcap=draw(st.sampled_from([0.0, 0.0, 3.0])), scale=draw(st.sampled_from([None, None, 0.05])))
    bias_kind = draw(st.sampled_from([None, None, "full", "padding", "2d", "bool_full", "fp32"]))
    layout = draw(st.sampled_from(["bshd", "bhsd"]))
    return dtype, shape, headdim_v, flags, bias_kind, layout


@pytest.mark.parametrize("device", DEVICES)
def test_value_headdim_property(device):
    @given(problems(device), st.integers(0, 2**16))
    def check(problem, seed):
        dtype, shape, headdim_v, flags, bias_kind, layout = problem
        _check(device, dtype, shape, headdim_v, flags, bias_kind, layout, seed=seed)
    check()


@pytest.mark.parametrize("device", DEVICES)
def test_packed_mla_views(device):
    """k and v as views of one packed projection (DeepSeek's kv_b_proj output split into k_nope | v, k_nope then joined
    with a shared rope part), q as a slice of a wider tensor: read through their strides, gradients in every operand."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(7)
    b, s, h, nope, rope, dv = 2, 45, 4, 128, 64, 128
    kv = torch.randn(b, s, h, nope + dv, generator=gen, device=device).to(dtype).requires_grad_()
    k_rope = torch.randn(b, s, 1, rope, generator=gen, device=device).to(dtype).requires_grad_()
    q_wide = torch.randn(b, s, h, nope + rope + 8, generator=gen, device=device).to(dtype).requires_grad_()

    def run(attention, kv, k_rope, q_wide):
        k_nope, v = kv.split([nope, dv], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(b, s, h, rope)], dim=-1)
        return attention(q_wide[..., :nope + rope], k, v)
    out = run(lambda q, k, v: fa2.attention(q, k, v, causal=True), kv, k_rope, q_wide)
    leaves = (kv, k_rope, q_wide)
    dout = torch.randn(out.shape, generator=gen, device=device).to(dtype)
    grads = torch.autograd.grad(out, leaves, dout)
    hi = hi_dtype(dtype)
    leaf_hi = [t.detach().to(hi).requires_grad_() for t in leaves]
    out_hi = run(lambda q, k, v: attention_ref(q, k, v, causal=True), *leaf_hi)
    leaf_lo = [t.detach().clone().requires_grad_() for t in leaves]
    out_lo = run(lambda q, k, v: attention_ref(q, k, v, causal=True, upcast=False), *leaf_lo)
    assert out.shape == (b, s, h, dv)
    assert_close_rule("out", out, out_hi, out_lo, factor=2)
    for name, g, g_hi, g_lo in zip(("dkv", "dk_rope", "dq"), grads, torch.autograd.grad(out_hi, leaf_hi, dout.to(hi)),
                                   torch.autograd.grad(out_lo, leaf_lo, dout)):
        assert_close_rule(name, g, g_hi, g_lo, factor=3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0, 5, 5, 2, 2, 16), (1, 0, 5, 2, 2, 16), (1, 5, 0, 2, 2, 16), (1, 1, 1, 1, 1, 1)])
def test_value_headdim_degenerate_sizes(device, shape):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    b, sq, sk, h, hk, d = shape
    headdim_v = 2 * d + 3
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device=device, requires_grad=True, headdim_v=headdim_v)
    out, lse = torch.ops.fa2.fwd(q, k, v)
    ref = attention_ref(q.detach().double(), k.detach().double(), v.detach().double())
    assert out.shape == (b, sq, h, headdim_v) and lse.shape == (b, h, sq)
    assert torch.allclose(out.double(), ref, atol=2e-2)
    dq, dk, dv = torch.autograd.grad(fa2.attention(q, k, v).sum(), (q, k, v))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    if sk == 0:
        assert (out == 0).all() and (dq == 0).all()


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES, ids=_ids)
def test_value_headdim_deterministic_backward(device, dtype):
    q, k, v = make_qkv(2, 93, 157, 4, 2, 192, dtype=dtype, device=device, requires_grad=True, headdim_v=128)
    dout = torch.randn(2, 93, 4, 128, dtype=dtype, device=device)
    with fa2.deterministic():
        runs = [torch.autograd.grad(fa2.attention(q, k, v, causal=True), (q, k, v), dout) for _ in range(3)]
    for r in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(r, runs[0]))


# ---- fa2.sdpa ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask", [None, "causal", "bool", "float"])
def test_sdpa_value_headdim(device, mask):
    """fa2.sdpa with value's own head dim, (B, H, S, D) layout, GQA, top-left is_causal (seqlen_q > seqlen_k and <)
    and masks: forward and backward against the reference math (the mask as a bool / float bias), and the reference
    against torch's own scaled_dot_product_attention."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(11)
    for sq, sk in [(37, 23), (23, 37)]:
        q = torch.randn(2, 4, sq, 192, generator=gen, device=device).to(dtype).requires_grad_()
        k = torch.randn(2, 2, sk, 192, generator=gen, device=device).to(dtype).requires_grad_()
        v = torch.randn(2, 2, sk, 128, generator=gen, device=device).to(dtype).requires_grad_()
        attn_mask, bias = None, None
        if mask == "causal":
            bias = torch.ones(sq, sk, dtype=torch.bool, device=device).tril()
        elif mask == "bool":
            attn_mask = bias = torch.rand(2, 1, sq, sk, generator=gen, device=device) > 0.3
        elif mask == "float":
            attn_mask = bias = torch.randn(1, 4, sq, sk, generator=gen, device=device).to(dtype)
        out = fa2.sdpa(q, k, v, attn_mask=attn_mask, is_causal=mask == "causal", enable_gqa=True)
        assert out.shape == (2, 4, sq, 128)
        dout = torch.randn(out.shape, generator=gen, device=device).to(dtype)
        grads = torch.autograd.grad(out, (q, k, v), dout)

        def ref(q, k, v, upcast):
            o = attention_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias, upcast=upcast)
            return o.transpose(1, 2)
        hi = hi_dtype(dtype)
        leaf_hi = [t.detach().to(hi).requires_grad_() for t in (q, k, v)]
        out_hi = ref(*leaf_hi, True)
        leaf_lo = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out_lo = ref(*leaf_lo, False)
        assert_close_rule(f"sdpa out {sq}x{sk} {mask}", out, out_hi, out_lo, factor=2)
        for name, g, g_hi, g_lo in zip(("dq", "dk", "dv"), grads, torch.autograd.grad(out_hi, leaf_hi, dout.to(hi)),
                                       torch.autograd.grad(out_lo, leaf_lo, dout)):
            assert_close_rule(f"sdpa {name} {sq}x{sk} {mask}", g, g_hi, g_lo, factor=3)
        m = None if attn_mask is None else (attn_mask if attn_mask.dtype == torch.bool else attn_mask.to(hi))
        torch_out = F.scaled_dot_product_attention(*(t.detach() for t in leaf_hi), attn_mask=m,
                                                   is_causal=mask == "causal", enable_gqa=True)
        rows = torch.isfinite(torch_out).all(-1)  # (torch gives NaN for rows that see no key; fa2 0)
        assert torch.allclose(torch_out[rows], out_hi.detach()[rows], atol=1e-6 if hi == torch.float64 else 1e-4)


# ---- opcheck, torch.compile -----------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("headdims,flags,bias_kind", [
    ((192, 128), {"causal": True}, None),
    pytest.param((24, 40), {"softcap": 2.0}, "full", marks=pytest.mark.slow),
    pytest.param((40, 24), {"window_left": 3, "window_right": 1}, "bool_padding", marks=pytest.mark.slow)])
def test_opcheck_value_headdim(device, headdims, flags, bias_kind):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(5)
    d, dv = headdims
    q, k, v = make_qkv(2, 19, 27, 4, 2, d, dtype=dtype, device=device, requires_grad=True, generator=gen,
                       headdim_v=dv)
    bias = None if bias_kind is None else make_bias(bias_kind, 2, 4, 19, 27, dtype=dtype, device=device,
                                                    requires_grad=True, generator=gen)
    args = (q, k, v, bias, None, flags.get("causal", False), flags.get("window_left", -1),
            flags.get("window_right", -1), flags.get("softcap", 0.0))
    torch.library.opcheck(torch.ops.fa2.attention.default, args)
    torch.library.opcheck(torch.ops.fa2.fwd.default, args)
    with torch.no_grad():
        out, lse = torch.ops.fa2.fwd(*args)
    bias_grad = bias is not None and bias.dtype != torch.bool
    bwd_args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse,
                None if bias is None else bias.detach()) + args[4:] + (bias_grad, False)
    torch.library.opcheck(torch.ops.fa2.bwd.default, bwd_args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compile_fullgraph_value_headdim(device, backend):
    """One torch.compile(fullgraph=True) graph, dynamic shapes: fa2.attention with v's own head dim, whose output
    feeds a projection sized by v's head dim (the fake kernel must give out that shape), forward and backward equal
    to eager."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch._dynamo.reset()
    weight = torch.randn(4 * 128, 64, device=device, dtype=dtype)

    def f(q, k, v):
        out = fa2.attention(q, k, v, causal=True)
        return (out.flatten(2) @ weight).float().square().sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend=backend)
    for sq, sk in [(37, 80), (80, 37)]:
        q, k, v = make_qkv(2, sq, sk, 4, 2, 192, dtype=dtype, device=device, requires_grad=True, headdim_v=128)
        loss = compiled(q, k, v)
        grads = torch.autograd.grad(loss, (q, k, v))
        loss_e = f(q, k, v)
        grads_e = torch.autograd.grad(loss_e, (q, k, v))
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        assert torch.allclose(loss, loss_e, rtol=tol)
        for g, ge in zip(grads, grads_e):
            assert g.shape == ge.shape and torch.allclose(g, ge, rtol=tol, atol=tol)


# ---- errors -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_value_headdim_errors_name_the_argument(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = make_qkv(1, 5, 7, 2, 2, 64, dtype=dtype, device=device, headdim_v=32)
    with pytest.raises(ValueError, match=r"headdim \(dim 3\) of q and k must match: q has 64, k has 32 \(v's may "
                                         r"differ: v has 32\)"):
        fa2.attention(q, k[..., :32], v)
    with pytest.raises(ValueError, match=r"v's headdim \(v.size\(3\)\) must be in \[1, 256\], got 257"):
        fa2.attention(q, k, torch.randn(1, 7, 2, 257, device=device, dtype=dtype))
    with pytest.raises(ValueError, match=r"v's headdim \(v.size\(3\)\) must be in \[1, 256\], got 0"):
        fa2.attention(q, k, v[..., :0])
    out, lse = torch.ops.fa2.fwd(q, k, v)
    assert out.shape == (1, 5, 2, 32)
    with pytest.raises(ValueError, match=r"dout must have shape \(batch, seqlen_q, nheads, headdim_v\) = "
                                         r"\[1, 5, 2, 32\].*got \[1, 5, 2, 64\]"):
        torch.ops.fa2.bwd(torch.randn_like(q), q, k, v, out, lse)
    with pytest.raises(ValueError, match=r"out must have shape \(batch, seqlen_q, nheads, headdim_v\)"):
        torch.ops.fa2.bwd(torch.randn_like(out), q, k, v, q, lse)


# ---- the plan: what the CUDA glue pads ------------------------------------------------------------------------

@pytest.mark.parametrize("headdim,headdim_v,padding,instance", [
    (192, 128, "v from headdim 128 to 192 (zero-padded copies)", 192),
    (64, 128, "q, k from headdim 64 to 128 (zero-padded copies)", 128),
    (40, 24, "v from headdim 24 to 40 (zero-padded copies)", 64),
    (59, 24, "q, k from headdim 59 and v from 24 to 64 (zero-padded copies)", 64),
    (59, 59, "q, k, v from headdim 59 to 64 (zero-padded copies)", 64),
    (128, 128, "none", 128),
    (128, None, "none", 128),
])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_plan_says_what_is_padded(direction, headdim, headdim_v, padding, instance):
    p = fa2.dev.plan(direction, device="h100", batch=2, nheads=8, seqlen_q=512, headdim=headdim, headdim_v=headdim_v)
    assert "error" not in p, p
    assert p["padding"] == padding, p
    assert f", {instance}, " in p["kernel"], p
    assert any(r.startswith("padding: " + ("none" if padding == "none" else padding)) for r in p["reasons"]), p


def test_explain_plan_and_command_line_report_the_padding(capsys):
    q, k, v = make_qkv(1, 64, 64, 4, 1, 192, dtype=torch.bfloat16, device="cpu", headdim_v=128)
    text = fa2.dev.explain_plan(q, k, v, causal=True, device="h100")
    assert text.count("padding: v from headdim 128 to 192 (zero-padded copies)") == 4, text  # (key and why, twice)
    from fa2.__main__ import plan_main
    assert plan_main(["--device", "h100", "--headdim", "64", "--headdim-v", "128", "--direction", "fwd"]) == 0
    assert "padding: q, k from headdim 64 to 128 (zero-padded copies)" in capsys.readouterr().out


# ---- CUDA: the glue's padding, exactly ------------------------------------------------------------------------

@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("headdim,headdim_v", [(192, 128), (128, 192), (64, 128), (40, 24), (24, 40)])
def test_cuda_value_headdim_is_the_padded_call_sliced(dtype, headdim, headdim_v):
    """The CUDA path is the call with the smaller head dim zero-padded to the larger, sliced back: out bitwise that
    of the padded call, lse too, and (deterministic mode) the gradients bitwise the padded call's, sliced."""
    gen = torch.Generator(device="cuda").manual_seed(headdim * 1000 + headdim_v)
    q, k, v = make_qkv(2, 150, 211, 8, 2, headdim, dtype=dtype, device="cuda", requires_grad=True, generator=gen,
                       headdim_v=headdim_v)
    width = max(headdim, headdim_v)
    pad = lambda t: F.pad(t.detach(), (0, width - t.shape[-1])).requires_grad_()  # noqa: E731
    qp, kp, vp = pad(q), pad(k), pad(v)
    scale = 1.0 / math.sqrt(headdim)  # (bitwise the default the C++ checks compute)
    for flags in ({"causal": True}, {"softcap": 4.0, "window_left": 40, "window_right": 7}):
        out, lse = torch.ops.fa2.fwd(q, k, v, None, None, flags.get("causal", False), flags.get("window_left", -1),
                                     flags.get("window_right", -1), flags.get("softcap", 0.0))
        out_p, lse_p = torch.ops.fa2.fwd(qp, kp, vp, None, scale, flags.get("causal", False),
                                         flags.get("window_left", -1), flags.get("window_right", -1),
                                         flags.get("softcap", 0.0))
        assert torch.equal(out, out_p[..., :headdim_v]) and torch.equal(lse, lse_p), flags
        dout = torch.randn(out.shape, generator=gen, device="cuda").to(dtype)
        with fa2.deterministic():
            grads = torch.autograd.grad(fa2.attention(q, k, v, **flags), (q, k, v), dout)
            grads_p = torch.autograd.grad(fa2.attention(qp, kp, vp, scale=scale, **flags), (qp, kp, vp),
                                          F.pad(dout, (0, width - headdim_v)))
        for name, g, gp, n in zip(("dq", "dk", "dv"), grads, grads_p, (headdim, headdim, headdim_v)):
            assert torch.equal(g, gp[..., :n]), (name, flags)


@CUDA
@pytest.mark.parametrize("options", [{}, {"bwd_gqa_accumulate": False}, {"bwd_gqa_grouping": 0},
                                     {"bwd_gqa_grouping": 1}, {"sm90_ws_backward": False},
                                     {"arch_specific_kernels": False}, {"bwd_small_tiles": True}],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("headdim,headdim_v", [(192, 128), (128, 192), (128, 64), (64, 128)])
def test_cuda_value_headdim_every_backward_path(options, headdim, headdim_v):
    """Every way the CUDA backward holds a GQA call's dK / dV (fp32 partials per query head, fp32 accumulators per kv
    head, whole groups in the kernel) and each kernel family, with v's own head dim: within the rule, GQA and not,
    a transposed (B, H, S, D) layout and a key-row bias."""
    with fa2.dev.options_override(**options):
        for shape, flags, bias_kind, layout in [((2, 300, 300, 8, 2, headdim), {"causal": True}, None, "bshd"),
                                                ((1, 200, 333, 4, 4, headdim), {}, "padding", "bhsd"),
                                                ((2, 129, 257, 8, 1, headdim), {"window_left": 64}, None, "bshd")]:
            _check("cuda", torch.bfloat16, shape, headdim_v, flags, bias_kind, layout)
