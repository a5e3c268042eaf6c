"""PyTorch's own SDPA on fa2: ``fa2.enable_sdpa_backend()`` / ``fa2.disable_sdpa_backend()`` / ``fa2.sdpa_backend()``.

On the CPU: the registration mechanics (torch.nn.attention's flash-attention registry, the CUDA kernels of the flash
operators swapped in and out, the context manager putting back what was active, a clear error where torch lacks the
registry), and the kernels themselves: registered for the CPU dispatch key here (PyTorch has no CPU kernel for these
operators), so the operators' own calls, forward and autograd backward, run fa2's CPU kernel and are checked against
the fp32/fp64 reference, with the meta kernels' layouts. On CUDA (skipped without a GPU): F.scaled_dot_product_attention
on its flash path runs fa2 (the profiler sees fa2::fwd / fa2::bwd), equal to PyTorch's flash kernel within the
numerics rule, forward and backward, eager and compiled, and calls fa2 leaves (dropout) keep PyTorch's kernel.
"""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.attention as attention
import torch.nn.functional as F

import fa2
from fa2.reference import attention_ref
from numerics import assert_close_rule, hi_dtype

backend_module = sys.modules["fa2._sdpa_backend"]
_CUDA = torch.cuda.is_available() and torch._C._dispatch_has_kernel_for_dispatch_key("fa2::fwd", "CUDA")
FORWARD = torch.ops.aten._scaled_dot_product_flash_attention.default
needs_registry = pytest.mark.skipif(not hasattr(attention, "activate_flash_attention_impl"),
                                    reason="this torch has no flash-attention implementation registry")


def _kernel_site(op: str, dispatch_key: str) -> str:
    """Where op's kernel for dispatch_key was registered (the dispatcher's own table), '' when it has none."""
    for line in torch._C._dispatch_dump(op).splitlines():
        if line.startswith(f"{dispatch_key}: "):
            return line
    return ""


@pytest.fixture(autouse=True)
def _backend_off_after():
    yield
    if hasattr(attention, "current_flash_attention_impl") and attention.current_flash_attention_impl() == "fa2":
        fa2.disable_sdpa_backend()


# ---- the registration mechanics ----------------------------------------------------------------------------------

@needs_registry
def test_enable_disable_swap_the_flash_operators_cuda_kernels():
    ops = ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_backward")
    before = {op: _kernel_site(op, "CUDA") for op in ops}
    assert attention.current_flash_attention_impl() is None
    fa2.enable_sdpa_backend()
    fa2.enable_sdpa_backend()  # idempotent
    assert attention.current_flash_attention_impl() == "fa2"
    assert "fa2" in attention.list_flash_attention_impls()
    for op in ops:
        assert "fa2/_sdpa_backend.py" in _kernel_site(op, "CUDA"), torch._C._dispatch_dump(op)
    fa2.disable_sdpa_backend()
    fa2.disable_sdpa_backend()  # nothing to do
    assert attention.current_flash_attention_impl() is None
    assert {op: _kernel_site(op, "CUDA") for op in ops} == before


@needs_registry
def test_context_manager_puts_back_what_was_active():
    removed = []

    class Handle:
        def remove(self):
            removed.append(True)
    attention.register_flash_attention_impl("fa2-test-other", register_fn=Handle)
    try:
        with fa2.sdpa_backend():
            assert attention.current_flash_attention_impl() == "fa2"
        assert attention.current_flash_attention_impl() is None
        with fa2.sdpa_backend():  # nested in an enabled block: stays on
            with fa2.sdpa_backend():
                pass
            assert attention.current_flash_attention_impl() == "fa2"
        assert attention.current_flash_attention_impl() is None
        if not hasattr(attention, "restore_flash_attention_impl"):
            return  # (the first registry cannot take another implementation off again)
        attention.activate_flash_attention_impl("fa2-test-other")
        with fa2.sdpa_backend():
            assert attention.current_flash_attention_impl() == "fa2" and removed
        assert attention.current_flash_attention_impl() == "fa2-test-other"
        attention.restore_flash_attention_impl()
    finally:
        attention._registry._FLASH_ATTENTION_IMPLS.pop("fa2-test-other", None)


def test_a_torch_without_the_registry_gets_a_clear_error(monkeypatch):
    monkeypatch.delattr(attention, "activate_flash_attention_impl", raising=False)
    for switch in (fa2.enable_sdpa_backend, fa2.disable_sdpa_backend):
        with pytest.raises(RuntimeError, match="no flash-attention implementation registry"):
            switch()
    with pytest.raises(RuntimeError, match="no flash-attention implementation registry"):
        with fa2.sdpa_backend():
            pass


# ---- the kernels, on the CPU (registered there for these tests) ------------------------------------------------------

def _fa2_events(fn) -> dict:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key: e.count for e in prof.key_averages() if e.key in ("fa2::fwd", "fa2::bwd")}


@pytest.fixture
def cpu_registration():
    registration = backend_module._Registration("CPU")
    yield
    registration.remove()


def _inputs(batch, heads, heads_k, seqlen_q, seqlen_k, headdim, dtype, device, layout):
    """(B, H, S, D) q, k, v requiring grad: "bhsd" contiguous, or "bshd" (views of (B, S, H, D) tensors, as models
    make them)."""
    g = torch.Generator().manual_seed(seqlen_q * 131 + seqlen_k)

    def make(h, s):
        shape = (batch, h, s, headdim) if layout == "bhsd" else (batch, s, h, headdim)
        t = torch.randn(shape, generator=g).to(device, dtype)
        return (t if layout == "bhsd" else t.transpose(1, 2)).requires_grad_()
    return make(heads, seqlen_q), make(heads_k, seqlen_k), make(heads_k, seqlen_k)


def _same_layout(t, ref):
    """Equal strides, size-1 dims aside (as compiled graphs' stride checks compare them)."""
    return all(a == b for a, b, size in zip(t.stride(), ref.stride(), t.shape) if size != 1)


def _reference(q, k, v, is_causal, scale, upcast):
    """The operator's math on (B, H, S, D) tensors: PyTorch's flash kernel aligns causal bottom-right."""
    dtype = hi_dtype(q.dtype) if upcast else q.dtype
    args = [t.detach().to(dtype).transpose(1, 2).requires_grad_() for t in (q, k, v)]
    out, lse = attention_ref(*args, scale=scale, causal=is_causal, upcast=upcast, return_lse=True)
    return args, out.transpose(1, 2), lse


CPU_CASES = [  # (batch, heads, heads_k, seqlen_q, seqlen_k, headdim, is_causal, scale, layout)
    (2, 4, 4, 33, 33, 32, True, None, "bshd"),
    (1, 4, 2, 17, 40, 59, False, 0.3, "bhsd"),     # GQA, seqlen_q < seqlen_k, odd headdim
    (2, 2, 1, 40, 17, 16, True, None, "bhsd"),     # causal with more queries than keys: rows that see no key
    (1, 3, 3, 1, 25, 64, True, None, "bshd"),      # one query
]


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)])
@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: "-".join(map(str, c)))
def test_flash_operator_runs_fa2_forward_and_backward(case, dtype, cpu_registration):
    batch, heads, heads_k, seqlen_q, seqlen_k, headdim, is_causal, scale, layout = case
    q, k, v = _inputs(batch, heads, heads_k, seqlen_q, seqlen_k, headdim, dtype, "cpu", layout)
    grad = torch.randn(batch, heads, seqlen_q, headdim, dtype=dtype)
    results = []

    def run():
        out, lse, *rest = FORWARD(q, k, v, 0.0, is_causal, False, scale=scale)
        out.backward(grad)
        results.extend([out.detach(), lse, rest])
    assert _fa2_events(run) == {"fa2::fwd": 1, "fa2::bwd": 1}  # the profiler sees fa2's ops under the aten one
    out, lse, rest = results
    # the meta kernel's promises: out laid out like query, lse (B, H, Sq) float32, grads laid out like their inputs
    meta = FORWARD(*(torch.empty_strided(t.shape, t.stride(), dtype=dtype, device="meta") for t in (q, k, v)), 0.0,
                   is_causal, False, scale=scale)
    assert out.shape == meta[0].shape and _same_layout(out, meta[0])
    assert lse.shape == meta[1].shape and lse.dtype == torch.float32
    assert rest[2:4] == [seqlen_q, seqlen_k]
    for got, want in zip(rest[4:6], meta[6:8]):  # the philox seed and offset (unused without dropout)
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
    for t in (q, k, v):
        assert _same_layout(t.grad, torch.empty_like(t))
    (qh, kh, vh), out_hi, lse_hi = _reference(q, k, v, is_causal, scale, upcast=True)
    (ql, kl, vl), out_lo, _ = _reference(q, k, v, is_causal, scale, upcast=False)
    assert_close_rule("out", out, out_hi, out_lo, 2)
    seen = torch.isfinite(lse_hi)
    assert torch.equal(torch.isfinite(lse), seen)
    torch.testing.assert_close(lse[seen], lse_hi[seen].float(), atol=1e-3, rtol=1e-3)
    out_hi.backward(grad.to(out_hi.dtype))
    out_lo.backward(grad)
    for name, got, hi, lo in (("dq", q, qh, ql), ("dk", k, kh, kl), ("dv", v, vh, vl)):
        assert_close_rule(name, got.grad, hi.grad.transpose(1, 2), lo.grad.transpose(1, 2), 3)


BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_backward.default


def _split_keys_gradients(q, k, v, dout, is_causal):
    """Attention over k/v in two halves (the flash operators per half, the halves merged by their LSE), then each
    half's backward given the merged out and LSE, as context parallel's ring does: (out, dq, dk, dv)."""
    half = k.shape[2] // 2
    parts = [FORWARD(q, k[:, :, s], v[:, :, s], 0.0, False, False) for s in (slice(0, half), slice(half, None))]
    lse = torch.logaddexp(parts[0][1], parts[1][1])
    out = sum(torch.exp(p[1] - lse)[..., None] * p[0].double() for p in parts).to(q.dtype)
    grads = [BACKWARD(dout, q, k[:, :, s], v[:, :, s], out, lse, None, None, q.shape[2], k.shape[2] - half, 0.0,
                      False, parts[0][6], parts[0][7]) for s in (slice(0, half), slice(half, None))]
    return (out, grads[0][0] + grads[1][0], torch.cat([grads[0][1], grads[1][1]], 2),
            torch.cat([grads[0][2], grads[1][2]], 2))


def _check_split_keys(dtype, device):
    q, k, v = (t.detach() for t in _inputs(2, 4, 2, 40, 64, 32, dtype, device, "bshd"))
    dout = torch.randn(2, 4, 40, 32, dtype=dtype, device=device)
    got = _split_keys_gradients(q, k, v, dout, False)
    hi, lo = (_reference(q, k, v, False, None, upcast) for upcast in (True, False))
    for (args, out, _), g in ((hi, dout.to(hi[1].dtype)), (lo, dout)):
        out.backward(g)
    wants = [(got[0], hi[1], lo[1])] + [(g, h.grad.transpose(1, 2), l.grad.transpose(1, 2))
                                        for g, h, l in zip(got[1:], hi[0], lo[0])]
    for name, (g, want_hi, want_lo) in zip(("out", "dq", "dk", "dv"), wants):
        if dtype == torch.float64:  # (the LSEs are float32: the merged one carries float's precision, not fp64's)
            torch.testing.assert_close(g, want_hi, atol=1e-5, rtol=1e-5, msg=name)
        else:
            assert_close_rule(name, g, want_hi, want_lo, 2 if name == "out" else 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backward_takes_out_and_lse_over_more_keys(dtype, cpu_registration):
    """The flash backward's contract context parallel relies on: given the out and LSE of attention over more keys
    than its own (the other ring chunks'), each call's gradients add up to the whole attention's."""
    _check_split_keys(dtype, "cpu")


def test_calls_fa2_leaves_go_to_the_kernel_before(cpu_registration):
    """Dropout (fa2 has none) is left to the kernel registered before: on the CPU there is none, which it says."""
    q, k, v = _inputs(1, 2, 2, 8, 8, 16, torch.float32, "cpu", "bhsd")
    with pytest.raises(NotImplementedError, match="no CPU kernel for it to fall back on"):
        FORWARD(q, k, v, 0.1, False, False)


# ---- CUDA: F.scaled_dot_product_attention on its flash path ------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU and fa2's CUDA kernels")


def _sdpa_flash(q, k, v, **kwargs):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


CUDA_CASES = [  # (batch, heads, heads_k, seqlen_q, seqlen_k, headdim, is_causal, layout)
    (2, 8, 8, 512, 512, 128, True, "bshd"),
    (2, 8, 2, 257, 257, 64, True, "bhsd"),        # GQA (enable_gqa)
    (1, 4, 4, 128, 384, 96, False, "bshd"),
    (3, 4, 4, 1, 200, 128, False, "bhsd"),
]


@needs_cuda
@needs_registry
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CUDA_CASES, ids=lambda c: "-".join(map(str, c)))
def test_cuda_sdpa_runs_fa2_and_matches_pytorch_flash(case, dtype):
    batch, heads, heads_k, seqlen_q, seqlen_k, headdim, is_causal, layout = case
    q, k, v = _inputs(batch, heads, heads_k, seqlen_q, seqlen_k, headdim, dtype, "cuda", layout)
    kwargs = dict(is_causal=is_causal, enable_gqa=heads != heads_k)
    grad = torch.randn(batch, heads, seqlen_q, headdim, device="cuda", dtype=dtype)

    def run():
        for t in (q, k, v):
            t.grad = None
        out = _sdpa_flash(q, k, v, **kwargs)
        out.backward(grad)
        return out.detach(), [t.grad for t in (q, k, v)]
    torch_out, torch_grads = run()
    with fa2.sdpa_backend():
        events = _fa2_events(run)
        out, grads = run()
    assert events == {"fa2::fwd": 1, "fa2::bwd": 1}, events
    assert _fa2_events(run) == {}  # off again
    (qh, kh, vh), out_hi, _ = _reference(q, k, v, is_causal, None, upcast=True)
    (ql, kl, vl), out_lo, _ = _reference(q, k, v, is_causal, None, upcast=False)
    out_hi.backward(grad.float())
    out_lo.backward(grad)
    assert_close_rule("pytorch flash out", torch_out, out_hi, out_lo, 2)
    assert_close_rule("fa2 out", out, out_hi, out_lo, 2)
    for name, got, theirs, hi, lo in zip(("dq", "dk", "dv"), grads, torch_grads, (qh, kh, vh), (ql, kl, vl)):
        assert_close_rule(f"pytorch flash {name}", theirs, hi.grad.transpose(1, 2), lo.grad.transpose(1, 2), 3)
        assert_close_rule(f"fa2 {name}", got, hi.grad.transpose(1, 2), lo.grad.transpose(1, 2), 3)


@needs_cuda
@needs_registry
def test_cuda_sdpa_is_causal_stays_top_left():
    """F.scaled_dot_product_attention's is_causal is top-left: with fewer queries than keys it never takes the flash
    path (PyTorch sends it elsewhere), so fa2's backend does not change its result."""
    q, k, v = _inputs(1, 4, 4, 64, 160, 64, torch.bfloat16, "cuda", "bhsd")
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with fa2.sdpa_backend():
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mask = torch.ones(64, 160, dtype=torch.bool, device="cuda").tril()
    ref = attention_ref(*(t.detach().float().transpose(1, 2) for t in (q, k, v)), attn_bias=mask).transpose(1, 2)
    torch.testing.assert_close(got, want)
    assert (got.float() - ref).abs().max() < 2e-2


@needs_cuda
@needs_registry
def test_cuda_compiled_sdpa_runs_fa2():
    """torch.compile (Inductor) calls the flash operator from its generated code: fa2 runs there too, forward and
    backward, with the layouts Inductor checks."""
    q, k, v = _inputs(2, 8, 8, 256, 256, 128, torch.bfloat16, "cuda", "bshd")

    def step(q, k, v):  # (the flash path forced: on an H100 SDPA's own priority may pick another backend)
        out = _sdpa_flash(q, k, v, is_causal=True)
        out.sum().backward()
        return out.detach()
    eager = step(q, k, v)
    grads = [t.grad.clone() for t in (q, k, v)]
    torch._dynamo.reset()
    compiled = torch.compile(step)
    with fa2.sdpa_backend():
        for t in (q, k, v):
            t.grad = None
        compiled(q, k, v)  # compiles
        events = _fa2_events(lambda: compiled(q, k, v))
        for t in (q, k, v):
            t.grad = None
        out = compiled(q, k, v)
    assert events == {"fa2::fwd": 1, "fa2::bwd": 1}, events
    torch.testing.assert_close(out, eager, atol=2e-2, rtol=2e-2)
    for got, want in zip((t.grad for t in (q, k, v)), grads):
        torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)


@needs_cuda
@needs_registry
def test_cuda_dropout_keeps_pytorchs_kernel():
    q, k, v = _inputs(1, 4, 4, 128, 128, 64, torch.bfloat16, "cuda", "bhsd")
    with fa2.sdpa_backend():
        events = _fa2_events(lambda: _sdpa_flash(q, k, v, dropout_p=0.5).sum().backward())
    assert events == {}, events


@needs_cuda
@needs_registry
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_backward_takes_out_and_lse_over_more_keys(dtype):
    with fa2.sdpa_backend():
        _check_split_keys(dtype, "cuda")
