"""The sm_90a kernels (FA2_CUDA_ARCHS with 90a: the wgmma forward) against the sm80-path kernels of the same build,
on the same inputs: both within the numerics rule, and really two different kernels (fa2._C.set_arch_specific_kernels
switches between them). Runs on a compute capability 9.0 GPU with a build that has sm_90a instances."""
from __future__ import annotations

import contextlib

import pytest
import torch

import fa2
from fa2.reference import attention_ref
from numerics import assert_close_rule
from samples import make_qkv, sample_inputs


def _has_sm90a_build() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and \
        "sm90a" in fa2._C.build_info()["kernels"]


pytestmark = pytest.mark.skipif(not _has_sm90a_build(),
                                reason="needs a compute capability 9.0 GPU and a build with FA2_CUDA_ARCHS including 90a")


@contextlib.contextmanager
def _switch(name, value):
    """fa2._C.set_<name>(value) inside the block, the previous value restored after it."""
    before = getattr(fa2._C, name)()
    getattr(fa2._C, "set_" + name)(value)
    try:
        yield
    finally:
        getattr(fa2._C, "set_" + name)(before)


def _both_paths(fn):
    """fn() with the sm_90a instances, then with the sm80-path instances of the same build."""
    with _switch("arch_specific_kernels", True):
        first = fn()
    with _switch("arch_specific_kernels", False):
        second = fn()
    return first, second


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_wgmma_forward_and_sm80_path_both_follow_the_rule(dtype):
    differ = 0
    for s in sample_inputs("cuda", dtype, full=True):
        (out_a, lse_a), (out_b, lse_b) = _both_paths(lambda: torch.ops.fa2.fwd(*s.args()))
        kw = dict(s.kwargs)
        bias = kw.pop("attn_bias", None)
        up = (lambda t: None if t is None else (t.float() if t.dtype != torch.bool else t))  # noqa: E731
        out_hi = attention_ref(s.q.float(), s.k.float(), s.v.float(), up(bias), **kw)
        out_naive = attention_ref(s.q, s.k, s.v, bias, upcast=False, **kw)
        assert_close_rule(f"wgmma out {s}", out_a, out_hi, out_naive, factor=2)
        assert_close_rule(f"sm80-path out {s}", out_b, out_hi, out_naive, factor=2)
        finite = torch.isfinite(lse_b)
        assert torch.equal(torch.isfinite(lse_a), finite), s
        assert torch.allclose(lse_a[finite], lse_b[finite], atol=1e-3, rtol=1e-3), s
        differ += not torch.equal(out_a, out_b)
    assert differ > 0, "the switch changed nothing: the sm_90a instances did not run"


def test_wgmma_training_step_matches_sm80_path():
    q, k, v = (torch.randn(2, 777, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)

    def step():
        out = fa2.attention(q, k, v, causal=True)
        return (out.detach(),) + torch.autograd.grad(out, (q, k, v), dout)

    a, b = _both_paths(step)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = attention_ref(*leaves, causal=True)
    ref_grads = torch.autograd.grad(ref, leaves, dout.float())
    for name, x, y, r in zip(("out", "dq", "dk", "dv"), a, b, (ref.detach(),) + ref_grads):
        err_a = ((x.float() - r).norm() / r.norm()).item()
        err_b = ((y.float() - r).norm() / r.norm()).item()
        assert err_a < 2 * err_b + 1e-3, f"{name}: wgmma path {err_a:.2e} vs sm80 path {err_b:.2e} relative error"


def _fwd_kernel_names(fn):
    """Names of the CUDA kernels fn() launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("schedule", ["plain", "pingpong", "overlap"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_warp_specialized_forward_equals_the_default(dtype, schedule):
    """The warp-specialized sm_90a forward (fa2._C.set_sm90_warp_specialized; plain path) runs the
    same products and softmax as the default pipeline, only scheduled differently: bitwise the same out and lse on
    every plain sample (the others fall back to the default kernels), including key ranges long enough for the
    producer to wait on released stages and query blocks that see no key; and it really is another kernel, at every
    instantiated headdim it serves. With ping-pong (fa2._C.set_sm90_pingpong) only the order in which the two consumer
    warpgroups issue their products changes; with the overlap (set_sm90_overlap) only when each warpgroup waits."""
    samples = [s for s in sample_inputs("cuda", dtype, full=True)
               if "attn_bias" not in s.kwargs and not s.kwargs.get("softcap")]
    extra = [((1, 300, 1100, 2, 1, 128), {}), ((1, 300, 1100, 2, 1, 128), {"causal": True}),
             ((2, 260, 700, 4, 2, 96), {}), ((1, 500, 900, 2, 2, 32), {"window_left": 300, "window_right": 0}),
             ((1, 300, 20, 2, 2, 64), {"causal": True}),  # bottom-right causal: rows 0..279 see no key
             ((1, 200, 700, 2, 1, 256), {}), ((1, 150, 500, 2, 2, 192), {"causal": True})]
    calls = [(s.args(), str(s)) for s in samples]
    for shape, flags in extra:
        q, k, v = make_qkv(*shape, dtype=dtype, device="cuda")
        calls.append(((q, k, v, None, None, flags.get("causal", False), flags.get("window_left", -1),
                       flags.get("window_right", -1), 0.0), f"{shape} {flags}"))
    assert len(calls) > 15
    with _switch("sm90_warp_specialized", True), _switch("sm90_pingpong", schedule == "pingpong"), \
            _switch("sm90_overlap", schedule == "overlap"):
        ws = [torch.ops.fa2.fwd(*args) for args, _ in calls]
        by_headdim = {}
        for args, _ in calls:
            by_headdim.setdefault(-(-args[0].shape[-1] // 32) * 32, args)  # one call per rounded headdim (32..256)
        names = {d: _fwd_kernel_names(lambda a=a: torch.ops.fa2.fwd(*a)) for d, a in by_headdim.items()}
    with _switch("sm90_warp_specialized", False):
        default = [torch.ops.fa2.fwd(*args) for args, _ in calls]
    # fwd_kernel<T, D, 901, mode, bias, warp_specialized, pingpong, overlap>
    want = {"plain": ", true, false, false>(", "pingpong": ", true, true, false>(",
            "overlap": ", true, false, true>("}[schedule]
    for d, kernels in names.items():
        assert any("fwd_kernel<" in n and want in n for n in kernels), (schedule, d, kernels)
    for (_, what), (out_ws, lse_ws), (out, lse) in zip(calls, ws, default):
        assert torch.equal(out_ws, out), f"out differs by {(out_ws.float() - out.float()).abs().max().item()}: {what}"
        assert torch.equal(lse_ws, lse), f"lse differs: {what}"
