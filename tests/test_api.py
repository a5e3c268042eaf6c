"""opcheck, torch.compile (fullgraph, dynamic), hypothesis properties, fa2.sdpa vs F.sdpa, bad input."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import fa2
from fa2.reference import attention_ref
from numerics import assert_close_rule, hi_dtype
from samples import SHARES, devices, dtypes_for, make_bias, make_qkv, sample_inputs, share_of

DEVICE_DTYPES = [(d, t) for d in devices() for t in dtypes_for(d)]
IDS = [f"{d}-{str(t).split('.')[-1]}" for d, t in DEVICE_DTYPES]


# ---- opcheck --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("device", devices())
def test_opcheck_every_op(device, share):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    samples = sample_inputs(device, dtype, requires_grad=True, seed=3)
    # A representative subset: opcheck runs each op several times (schema, fake, autograd registration, aot).
    picked = [s for s in samples if s.q.shape[1] * s.k.shape[1] <= 20_000][::3]
    assert len(picked) >= 8
    for s in share_of(picked, share):
        torch.library.opcheck(torch.ops.fa2.attention.default, s.args())
        torch.library.opcheck(torch.ops.fa2.fwd.default, s.args())
        with torch.no_grad():
            out, lse = torch.ops.fa2.fwd(*s.args())
        bias = s.kwargs.get("attn_bias")
        bias_grad = bias is not None and bias.dtype != torch.bool
        a = s.args()
        bwd_args = (torch.randn_like(out), s.q.detach(), s.k.detach(), s.v.detach(), out, lse,
                    None if bias is None else bias.detach()) + a[4:] + (bias_grad, False)
        torch.library.opcheck(torch.ops.fa2.bwd.default, bwd_args)


# ---- torch.compile --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dynamic", [pytest.param(False, marks=pytest.mark.slow), True])
def test_compile_fullgraph_no_graph_break(device, dynamic):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch._dynamo.reset()

    def f(q, k, v, bias):
        return fa2.attention(q, k, v, bias, causal=True, softcap=20.0).float().square().sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=dynamic)
    for sq, sk in [(64, 64), (37, 80), (80, 37)]:
        q, k, v = make_qkv(2, sq, sk, 4, 2, 32, dtype=dtype, device=device, requires_grad=True)
        bias = torch.randn(2, 1, 1, sk, dtype=dtype, device=device, requires_grad=True)
        loss = compiled(q, k, v, bias)
        grads = torch.autograd.grad(loss, (q, k, v, bias))
        loss_e = f(q, k, v, bias)
        grads_e = torch.autograd.grad(loss_e, (q, k, v, bias))
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        assert torch.allclose(loss, loss_e, rtol=tol)
        for g, ge in zip(grads, grads_e):
            assert torch.allclose(g, ge, rtol=tol, atol=tol)


# ---- hypothesis -------------------------------------------------------------------------------------------------

@st.composite
def problems(draw, device):
    dtype = draw(st.sampled_from(dtypes_for(device)))
    nheads_k = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 4, 8]))
    shape = (draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 17, 64, 97, 130])),
             draw(st.sampled_from([1, 3, 31, 64, 97, 130])), nheads_k * group, nheads_k,
             draw(st.sampled_from([1, 8, 16, 32, 59, 64, 96, 111, 128, 160, 256])))
    flags = dict(causal=draw(st.booleans()), window_left=draw(st.sampled_from([-1, -1, 0, 5, 40])),
                 window_right=draw(st.sampled_from([-1, -1, 0, 3])),
                 softcap=draw(st.sampled_from([0.0, 0.0, 3.0])), scale=draw(st.sampled_from([None, None, 0.05])))
    bias_kind = draw(st.sampled_from([None, None, "full", "padding", "2d", "bool_full", "fp32"]))
    layout = draw(st.sampled_from(["bshd", "bhsd"]))
    return dtype, shape, flags, bias_kind, layout


def _check_problem(device, problem, grads):
    dtype, (b, sq, sk, h, hk, d), flags, bias_kind, layout = problem
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device=device, layout=layout, requires_grad=grads)
    bias = None if bias_kind is None else make_bias(bias_kind, b, h, sq, sk, dtype=dtype, device=device,
                                                    requires_grad=grads)
    out = fa2.attention(q, k, v, bias, **flags)
    hi = hi_dtype(dtype)
    up = lambda t: t if t is None or t.dtype == torch.bool else t.detach().to(hi)  # noqa: E731
    out_hi = attention_ref(up(q), up(k), up(v), up(bias), **flags)
    out_lo = attention_ref(q.detach(), k.detach(), v.detach(), None if bias is None else bias.detach(),
                           upcast=False, **flags)
    assert_close_rule("out", out, out_hi, out_lo, factor=2)
    if grads:
        diff = [q, k, v]
        dout = torch.randn_like(out)
        g = torch.autograd.grad(out, diff, dout)
        leaf_hi = [t.detach().to(hi).requires_grad_() for t in diff]
        g_hi = torch.autograd.grad(attention_ref(*leaf_hi, up(bias), **flags), leaf_hi, dout.to(hi))
        leaf_lo = [t.detach().clone().requires_grad_() for t in diff]
        g_lo = torch.autograd.grad(attention_ref(*leaf_lo, None if bias is None else bias.detach(), upcast=False,
                                                 **flags), leaf_lo, dout)
        for name, a, ah, al in zip("qkv", g, g_hi, g_lo):
            assert_close_rule(f"d{name}", a, ah, al, factor=3)


@pytest.mark.parametrize("device", devices())
def test_hypothesis_forward_and_backward(device):
    @given(problems(device), st.booleans())
    def run(problem, grads):
        _check_problem(device, problem, grads)
    run()


# ---- fa2.sdpa vs F.scaled_dot_product_attention -----------------------------------------------------------------

@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES, ids=IDS)
def test_sdpa_matches_torch(device, dtype):
    hi = hi_dtype(dtype)
    combos = itertools.product([(64, 64), (37, 80), (80, 37)], [None, "bool", "float"], [False, True],
                               [None, 0.25], [False, True])
    for (sq, sk), mask_kind, is_causal, scale, gqa in combos:
        if mask_kind is not None and is_causal:
            continue  # F.sdpa rejects both at once; so does fa2.sdpa (tested below)
        hk = 2 if gqa else 4
        q = torch.randn(2, 4, sq, 32, device=device).to(dtype).requires_grad_()
        k = torch.randn(2, hk, sk, 32, device=device).to(dtype).requires_grad_()
        v = torch.randn(2, hk, sk, 32, device=device).to(dtype).requires_grad_()
        mask = None
        if mask_kind == "bool":
            mask = torch.rand(2, 1, sq, sk, device=device) > 0.2
            mask[..., 0] = True  # keep every row non-empty: F.sdpa gives NaN there, fa2 gives 0 (documented)
        elif mask_kind == "float":
            mask = torch.randn(1, 4, sq, sk, device=device).to(dtype)
        kw = dict(attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa)
        out = fa2.sdpa(q, k, v, **kw)
        mask_hi = mask if mask is None or mask.dtype == torch.bool else mask.to(hi)
        ref = F.scaled_dot_product_attention(*(t.detach().to(hi) for t in (q, k, v)), **{**kw, "attn_mask": mask_hi})
        naive = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), **kw)
        assert out.shape == ref.shape
        assert_close_rule(f"sdpa {sq},{sk},{mask_kind},{is_causal},{scale},{gqa}", out, ref, naive, factor=2)
        g = torch.autograd.grad(out.float().sum(), (q, k, v))
        assert all(not torch.isnan(x).any() for x in g)


def test_sdpa_rejects_what_it_cannot_do():
    q = torch.randn(1, 4, 8, 16)
    k = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="enable_gqa"):
        fa2.sdpa(q, k, k)
    with pytest.raises(ValueError, match="dropout_p"):
        fa2.sdpa(q, q, q, dropout_p=1.0)
    with pytest.raises(ValueError, match="attn_mask and is_causal"):
        fa2.sdpa(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool), is_causal=True)
    # a 0/1 integer mask is neither a keep mask nor a bias (F.sdpa refuses it too): not silently added as +1
    for dtype in (torch.uint8, torch.int64):
        with pytest.raises(TypeError, match="attn_mask must be bool .* or floating point"):
            fa2.sdpa(q, q, q, attn_mask=torch.ones(8, 8, dtype=dtype).tril())


# ---- bad input: a clear exception naming the argument -----------------------------------------------------------

def _bad_cases(device):
    dt = torch.float32 if device == "cpu" else torch.bfloat16
    q = torch.randn(2, 8, 4, 16, device=device, dtype=dt)
    k = torch.randn(2, 8, 2, 16, device=device, dtype=dt)
    # Patterns include the numbers given: integers are formatted into the messages by the C++ checks (a build that
    # linked parts of libstdc++ statically once printed "got " with nothing after it, or crashed).
    cases = [
        ("k dtype", (q, k.to(torch.float64 if device == "cpu" else torch.float16), k), {}, "k must have q's dtype"),
        ("int dtype", (q.int(), k.int(), k.int()), {}, "q must be"),
        ("rank", (q[0], k, k), {}, "q must have 4 dims .*got 3 dims"),
        ("batch", (q, k[:1], k[:1]), {}, "batch size mismatch: q has 2, k has 1"),
        ("headdim", (q, k[..., :8], k[..., :8]), {}, "headdim .*q has 16, k has 8"),
        ("headdim>256", (torch.randn(1, 2, 1, 257, device=device, dtype=dt),) * 3, {}, "headdim must be in \\[1, 256\\], got 257"),
        ("nheads", (torch.randn(2, 8, 3, 16, device=device, dtype=dt), k, k), {}, "q.size\\(2\\)=3.*multiple of nheads_k"),
        ("last dim", (q.transpose(2, 3).contiguous().transpose(2, 3), k, k), {}, "contiguous in its last dim"),
        ("bias shape", (q, k, k), {"attn_bias": torch.zeros(3, 8, 8, device=device, dtype=dt)}, "not broadcastable"),
        ("bias dtype", (q, k, k), {"attn_bias": torch.zeros(8, 8, device=device, dtype=torch.int32)}, "attn_bias must be"),
        ("window", (q, k, k), {"window_left": -2}, "window_left must be >= -1 .*got -2"),
        ("softcap", (q, k, k), {"softcap": -1.0}, "softcap must be .*got -1"),
        ("scale", (q, k, k), {"scale": float("nan")}, "scale must be a finite"),
        ("float32 scale", (q, k, k), {"scale": 1e39}, "scale must be finite in float32"),
        ("meta k", (q, k.to("meta"), k), {}, "k must be on q's device"),
        ("meta bias", (q, k, k), {"attn_bias": torch.zeros(8, 8, device="meta", dtype=dt)},
         "attn_bias must be on q's"),
        ("kv seqlen", (q, k, k[:, :3]), {}, "same seqlen_k .*got 8 and 3"),
    ]
    if device == "cuda":
        cases.append(("fp32 on cuda", (q.float(), k.float(), k.float()), {}, "float16 or bfloat16"))
        cases.append(("device", (q, k.cpu(), k.cpu()), {}, "same device"))
    return cases


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("compiled", [False, True])
def test_bad_input_raises_clear_error(device, compiled):
    fn = fa2.attention
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fa2.attention, backend="eager")
    for name, args, kwargs, message in _bad_cases(device):
        with pytest.raises((RuntimeError, ValueError, TypeError), match=message):
            fn(*args, **kwargs)
    # The process is still usable afterwards.
    dt = torch.float32 if device == "cpu" else torch.bfloat16
    q = torch.randn(1, 4, 2, 16, device=device, dtype=dt)
    assert torch.isfinite(fa2.attention(q, q, q)).all()


# ---- packaging ----------------------------------------------------------------------------------------------------

def test_gpu_older_than_sm80_gets_a_clear_error():
    """The CUDA forward's compute-capability check (cpp/checks.cpp), called as it is on such a GPU: no sm < 8.0 GPU
    exists on the test machines, so the check is reached through fa2._C."""
    with pytest.raises(RuntimeError, match=r"compute capability 8\.0 or newer .*cuda:1 is Tesla T4 with compute "
                                           r"capability 7\.5"):
        fa2._C._check_compute_capability(7, 5, "cuda:1", "Tesla T4")
    fa2._C._check_compute_capability(8, 0, "cuda:0", "NVIDIA A100")  # passes
    fa2._C._check_compute_capability(9, 0, "cuda:0", "NVIDIA H200")


def test_abi_mismatch_gives_rebuild_message(monkeypatch):
    import builtins
    import sys

    from fa2 import _loader

    real_import = builtins.__import__

    def fake_import(name, globals=None, locals=None, fromlist=(), level=0):
        if fromlist and "_C" in fromlist:
            raise ImportError("_C.so: undefined symbol: _ZN3c1017SomethingThatMovedEv")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    monkeypatch.delitem(sys.modules, "fa2._C", raising=False)
    with pytest.raises(ImportError, match="rebuild fa2 against the installed torch"):
        _loader.load_native()


def test_build_info_and_env_report():
    import subprocess
    import sys

    info = fa2.build_info()
    assert info["version"] == fa2.__version__ and info["torch_version"]
    report = subprocess.run([sys.executable, "-m", "fa2"], capture_output=True, text=True, check=True).stdout
    assert "fa2 built against torch" in report and "active paths" in report


def test_env_report_names_the_hopper_paths(monkeypatch, capsys):
    """python -m fa2 on a (simulated) H200 with an sm_90a build: which forward/backward kernels run and the schedule
    setting (the GPU machine has the real thing; here torch.cuda and the build record are stand-ins)."""
    import fa2.__main__ as report

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    info = dict(fa2.build_info(), with_cuda=True, torch_cuda="13.0", cuda_archs="90,90a",
                kernels="fwd_bf16_hdim64_sm90,fwd_bf16_hdim64_sm90a,bwd_bf16_hdim64_sm90a,bwd_bf16_hdim128_sm90a")
    monkeypatch.setattr(fa2, "build_info", lambda: info)
    options = dict(fa2.dev.default_options(), sm90_backward=False, key_bias_backward=False,
                   bwd_gqa_accumulate=False, fwd_cluster=False)
    monkeypatch.setattr(fa2.dev, "options", lambda: dict(options))
    assert report.main() == 0
    out = capsys.readouterr().out
    assert "cuda:0 forward sm_90a kernels (wgmma, TMA; schedule auto), backward sm80-instruction kernels" in out, out
    assert ("d64 pipelined, d128 pingpong-overlap (overlap without a causal mask or window), d192 overlap, "
            "d256 pingpong-overlap)") in out, out
    assert "general bias path (switched off: option key_bias_backward)" in out, out
    assert "one CTA at a time (switched off: option fwd_cluster)" in out, out
    assert "GQA backward groups" in out and "(option bwd_gqa_grouping=0 / 1)" in out, out
    assert "fp32 partials per query head (option bwd_gqa_accumulate=0)" in out, out
    assert "ws backward last-wave split : where its tiles have the query blocks it was measured to pay at" in out, out
    assert "(option bwd_tail_split=0 / 1)" in out, out
    options.update(sm90_backward=True, key_bias_backward=True, sm90_ws_backward=True, bwd_gqa_accumulate=True,
                   fwd_cluster=True)
    assert report.main() == 0
    out = capsys.readouterr().out
    assert fa2.dev.tuning_tables()["sm90_ws_backward_headdims"] == [64, 128, 256]  # (bwd_tile_config.h)
    assert "backward sm_90a wgmma (warp-specialized at d64, d128) (fp16/bf16)" in out, out
    assert "key-row variant (option key_bias_backward=0: general bias path)" in out, out
    assert "pairs of CTAs sharing K/V loads without a causal mask or window (option fwd_cluster=0" in out, out
    assert "fp32 accumulators per kv head where the ws backward runs" in out, out
    options.update(sm90_ws_backward=False)
    assert report.main() == 0
    out = capsys.readouterr().out
    assert "backward sm_90a wgmma (fp16/bf16)" in out and "warp-specialized at" not in out, out


def test_sdpa_more_than_4_dims_broadcasts_mask():
    q = torch.randn(2, 3, 4, 6, 16)
    k = torch.randn(2, 3, 4, 9, 16)
    v = torch.randn(2, 3, 4, 9, 16)
    for mask in (torch.randn(3, 1, 6, 9), torch.rand(1, 3, 1, 6, 9) > 0.2, torch.randn(6, 9)):
        if mask.dtype == torch.bool:
            mask[..., 0] = True
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                             attn_mask=mask if mask.dtype == torch.bool else mask.double())
        out = fa2.sdpa(q, k, v, attn_mask=mask)
        assert out.shape == ref.shape
        assert torch.allclose(out.double(), ref, atol=1e-5)


# ---- autodiff modes fa2 has no formula for: a clear error, never a silently zero result ------------------------

def test_double_backward_is_refused():
    q, k, v = (torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    (g,) = torch.autograd.grad(fa2.attention(q, k, v).pow(2).sum(), q, create_graph=True)
    assert g.requires_grad  # create_graph alone is fine; differentiating again is not
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(g.sum(), (q, k, v))


def test_forward_mode_and_func_grad_are_refused_vmap_works():
    q, k, v = (torch.randn(1, 5, 2, 8, dtype=torch.float64) for _ in range(3))
    t = torch.randn_like(q)
    with pytest.raises(NotImplementedError, match="forward-mode AD"):
        torch.func.jvp(lambda x: fa2.attention(x, k, v), (q,), (t,))
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match="forward-mode AD"):
        fa2.attention_with_lse(fwAD.make_dual(q, t), k, v)
    with pytest.raises(NotImplementedError, match="torch.func.grad"):
        torch.func.grad(lambda x: fa2.attention(x, k, v).sum())(q)
    # vmap over an extra batch dim: the same as the loop
    qs, ks, vs = (torch.randn(3, 1, 5, 2, 8, dtype=torch.float64) for _ in range(3))
    out = torch.func.vmap(fa2.attention)(qs, ks, vs)
    torch.testing.assert_close(out, torch.stack([fa2.attention(*x) for x in zip(qs, ks, vs)]))


@pytest.mark.parametrize("device", devices())
def test_window_wider_than_the_sequence_is_unbounded(device):
    """A window side of any size >= the sequence (INT64_MAX, sys.maxsize as "unbounded") is no window: exactly the
    -1 result, with no index overflow (the window is folded to -1 by the shared checks)."""
    dt = torch.float64 if device == "cpu" else torch.bfloat16
    q, k, v = make_qkv(2, 37, 23, 2, 2, 16, dtype=dt, device=device)
    big = 2**63 - 1
    for causal in (False, True):
        want = fa2.attention(q, k, v, causal=causal)
        for left, right in ((big, -1), (-1, big), (big, big), (23, 37)):
            got = fa2.attention(q, k, v, causal=causal, window_left=left, window_right=right)
            assert torch.equal(got, want), (causal, left, right)


def test_sdpa_broadcasts_batch_dims_like_torch():
    """One key/value set for every batch entry (batch dim 1, or absent), as F.sdpa broadcasts them."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(3, 4, 9, 16, generator=g, dtype=torch.float64)
    for k_shape in ((1, 4, 11, 16), (4, 11, 16)):
        k = torch.randn(k_shape, generator=g, dtype=torch.float64)
        v = torch.randn(k_shape, generator=g, dtype=torch.float64)
        torch.testing.assert_close(fa2.sdpa(q, k, v), F.scaled_dot_product_attention(q, k, v))
    q2, k2 = torch.randn(9, 16, generator=g, dtype=torch.float64), torch.randn(11, 16, generator=g, dtype=torch.float64)
    torch.testing.assert_close(fa2.sdpa(q2, k2, k2), F.scaled_dot_product_attention(q2, k2, k2))  # 2-D: (L, E)
    torch.testing.assert_close(fa2.sdpa(q2, k2, k2, is_causal=True),
                               F.scaled_dot_product_attention(q2, k2, k2, is_causal=True))
    with pytest.raises(ValueError, match="do not broadcast"):
        fa2.sdpa(q, torch.randn(2, 4, 11, 16, dtype=torch.float64), torch.randn(2, 4, 11, 16, dtype=torch.float64))


def test_attention_with_lse_compiles_into_one_graph():
    q = torch.randn(1, 6, 2, 16)
    lin = torch.nn.Linear(16, 16)

    def f(q):
        out, lse = fa2.attention_with_lse(lin(q), q, q)
        return lin(out).sum() + lse.sum()
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, backend="eager", fullgraph=True)(q), f(q))
