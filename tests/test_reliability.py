"""Edge cases, scale and systems behaviour (issue 7): nothing crashes, nothing is silently wrong."""
from __future__ import annotations

import gc
import threading

import pytest
import torch

import fa2
from fa2.reference import attention_ref
from samples import devices, make_qkv

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


def _dtype(device):
    return torch.bfloat16 if device == "cuda" else torch.float32


def _ref(q, k, v, *a, **kw):
    return attention_ref(q.double(), k.double(), v.double(), *a, **kw)


@pytest.mark.parametrize("device", devices())
def test_nan_inputs_propagate_to_their_rows_only(device):
    q, k, v = make_qkv(1, 16, 16, 2, 2, 32, dtype=_dtype(device), device=device)
    q = q.clone()
    q[0, 3, 1, 0] = float("nan")            # one query row of one head
    out = fa2.attention(q, k, v)
    assert torch.isnan(out[0, 3, 1]).all()
    mask = torch.ones_like(out, dtype=torch.bool)
    mask[0, 3, 1] = False
    assert torch.isfinite(out[mask]).all()


@pytest.mark.parametrize("headdim", [64, 128, 256])
@pytest.mark.parametrize("device", devices())
def test_nan_gradient_of_one_head_stays_in_that_head(device, headdim):
    """A NaN in one head's dout (its D = rowsum(dO * O) NaN) leaves the other heads' gradients as they are: 100
    queries, so that a kernel's last query block of head 0 reaches past its rows, where the flat (batch, heads,
    queries) statistics hold head 1's (the warp-specialized backward zeroes D there: ws_zero_dsum_past_sequence)."""
    q, k, v = make_qkv(1, 100, 100, 2, 2, headdim, dtype=_dtype(device), device=device)
    dout = torch.randn_like(q)
    dout_bad = dout.clone()
    dout_bad[0, 5, 1, 0] = float("nan")  # head 1, query 5
    grads = []
    for d in (dout, dout_bad):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        grads.append(torch.autograd.grad(fa2.attention(*leaves), leaves, d))
    for name, g, g_bad in zip(("dq", "dk", "dv"), *grads):
        assert torch.isfinite(g_bad[:, :, 0]).all(), f"{name} of head 0: NaN from head 1"
        torch.testing.assert_close(g_bad[:, :, 0], g[:, :, 0], atol=1e-2, rtol=1e-2)
    assert torch.isnan(grads[1][0][:, :, 1]).any()  # (head 1's own dq)


@pytest.mark.parametrize("device", devices())
def test_neg_inf_bias_entries(device):
    dt = _dtype(device)
    q, k, v = make_qkv(2, 24, 40, 2, 2, 64, dtype=dt, device=device)
    bias = torch.randn(2, 2, 24, 40, device=device).to(dt)
    bias[bias > 1.0] = float("-inf")
    out = fa2.attention(q, k, v, bias)
    ref = _ref(q, k, v, bias.double())
    assert torch.allclose(out.double(), ref, atol=3e-2 if dt != torch.float32 else 1e-5)


@pytest.mark.parametrize("fill", ["finfo_min", "-1e9"])
@pytest.mark.parametrize("device,dtype", [("cpu", torch.float32), ("cpu", torch.bfloat16), ("cpu", torch.float64),
                                          ("cuda", torch.bfloat16), ("cuda", torch.float16)])
def test_rows_whose_every_key_is_heavily_biased(device, dtype, fill):
    """A query row whose every key carries a huge finite negative bias (Hugging Face's finfo.min mask on a padded
    query, an old-style -1e9 mask) is not a masked row: its softmax runs over its keys like any other row's (all
    scores equal after rounding -> uniform), as the reference and eager PyTorch compute it; forward and gradients
    follow the numerics rule. Next to it: rows with some keys biased and one key less biased than the rest.
    (The CPU backward recomputes such rows' statistics exactly; CUDA shifts them by their max in the forward and
    recomputes them in the backward: softmax.cuh, bwd_row_stats_kernel.)"""
    if device == "cuda" and not CUDA:
        pytest.skip("needs a CUDA GPU")
    from numerics import assert_close_rule, hi_dtype
    huge = torch.finfo(dtype).min if fill == "finfo_min" else -1e9
    q, k, v = make_qkv(2, 6, 9, 2, 2, 16, dtype=dtype, device=device, requires_grad=True)
    bias = torch.zeros(2, 1, 6, 9, device=device, dtype=dtype)
    bias[:, :, 1] = huge              # every key
    bias[:, :, 2, :4] = huge          # some keys
    bias[:, :, 3] = huge
    # every key, one of them less (still huge: the row stays one the kernels must treat specially; -1e30 rather than
    # finfo.min / 2 because CUDA's bias fold keeps biases beyond -3.4e38 * scale apart only up to float's range)
    bias[:, :, 3, 5] = huge / 2 if fill == "-1e9" else -1e30
    out = fa2.attention(q, k, v, bias)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    hi = hi_dtype(dtype)
    leaves_hi = [t.detach().to(hi).requires_grad_() for t in (q, k, v)]
    out_hi = attention_ref(*leaves_hi, bias.to(hi))
    grads_hi = torch.autograd.grad(out_hi, leaves_hi, dout.to(hi))
    leaves_lo = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out_lo = attention_ref(*leaves_lo, bias, upcast=False)
    grads_lo = torch.autograd.grad(out_lo, leaves_lo, dout)
    assert_close_rule(f"out {fill}", out, out_hi, out_lo, factor=2)
    for name, g, g_hi, g_lo in zip(("dq", "dk", "dv"), grads, grads_hi, grads_lo):
        assert_close_rule(f"{name} {fill}", g, g_hi, g_lo, factor=3)


@pytest.mark.parametrize("device", devices())
def test_large_and_small_magnitudes(device):
    dtypes = [torch.float16, torch.bfloat16] if device == "cuda" else [torch.float16, torch.float32]
    for dt in dtypes:
        for magnitude in (100.0, 1e-3):
            q, k, v = make_qkv(1, 64, 64, 2, 2, 64, dtype=dt, device=device, magnitude=magnitude)
            out = fa2.attention(q, k, v, causal=True)
            assert torch.isfinite(out).all(), (dt, magnitude)
            ref = _ref(q, k, v, causal=True)
            tol = 2e-2 * magnitude if dt != torch.float32 else 1e-4 * magnitude
            assert (out.double() - ref).abs().max() <= tol, (dt, magnitude)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("sq,sk", [(1, 100_000), (20_000, 1)])
def test_very_unequal_seqlens(device, sq, sk):
    dt = _dtype(device)
    q, k, v = make_qkv(1, sq, sk, 2, 1, 64, dtype=dt, device=device, requires_grad=True)
    out = fa2.attention(q, k, v, causal=True)
    if sq == 1:
        ref = _ref(q.detach(), k.detach(), v.detach(), causal=True)
        assert torch.allclose(out.double(), ref, atol=2e-2 if dt != torch.float32 else 1e-5)
    else:
        # 1 key, causal bottom-right: only the last query row sees it; the others are 0.
        assert (out[:, :-1] == 0).all() and torch.allclose(out[:, -1].double(), v[:, 0].double().repeat_interleave(2, 1))
    dq, dk, dv = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))


@pytest.mark.slow
@pytest.mark.parametrize("device", devices())
def test_no_memory_growth_over_many_calls(device):
    dt = _dtype(device)
    q, k, v = make_qkv(1, 64, 64, 2, 2, 32, dtype=dt, device=device, requires_grad=True)

    def step():
        out = fa2.attention(q, k, v, causal=True)
        torch.autograd.grad(out.sum(), (q, k, v))

    for _ in range(50):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        for _ in range(1000):
            step()
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before
    else:
        import resource
        gc.collect()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for _ in range(1000):
            step()
        gc.collect()
        grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        assert grown_kb < 20_000, f"peak RSS grew by {grown_kb} kB over 1000 calls"


@pytest.mark.parametrize("device", devices())
def test_thread_safe(device):
    dt = _dtype(device)
    inputs = [make_qkv(1, 97, 131, 4, 2, 64, dtype=dt, device=device) for _ in range(4)]
    expected = [fa2.attention(*x, causal=True) for x in inputs]
    errors = []

    def worker(i):
        try:
            for _ in range(10):
                got = fa2.attention(*inputs[i], causal=True)
                if not torch.equal(got, expected[i]):
                    errors.append(f"thread {i}: result differs")
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ---- CUDA systems -------------------------------------------------------------------------------------------------

@needs_cuda
def test_respects_current_stream():
    q, k, v = make_qkv(2, 256, 256, 4, 4, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    ref = fa2.attention(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fa2.attention(q, k, v, causal=True)
        g = torch.autograd.grad(out.sum(), (q, k, v))
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    assert all(torch.isfinite(x).all() for x in g)


@needs_cuda
def test_cuda_graph_capture():
    q, k, v = make_qkv(2, 128, 128, 4, 2, 64, dtype=torch.bfloat16, device="cuda")
    static_out = fa2.attention(q, k, v, causal=True)  # warm-up outside capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fa2.attention(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fa2.attention(q, k, v, causal=True)
    for _ in range(3):
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, fa2.attention(q, k, v, causal=True))


@needs_cuda
def test_compile_reduce_overhead():
    torch._dynamo.reset()

    def f(q, k, v):
        return fa2.attention(q, k, v, causal=True)

    g = torch.compile(f, mode="reduce-overhead")
    for _ in range(4):
        q, k, v = make_qkv(2, 128, 128, 4, 2, 64, dtype=torch.bfloat16, device="cuda")
        assert torch.equal(g(q, k, v).clone(), f(q, k, v))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_gpu_runs_on_its_device():
    q, k, v = make_qkv(1, 128, 128, 2, 2, 64, dtype=torch.bfloat16, device="cuda:1", requires_grad=True)
    with torch.cuda.device(0):
        out = fa2.attention(q, k, v, causal=True)
        g = torch.autograd.grad(out.sum(), (q, k, v))
    assert out.device == torch.device("cuda:1") and all(x.device == out.device for x in g)
    ref = attention_ref(q.detach().float(), k.detach().float(), v.detach().float(), causal=True)
    assert torch.allclose(out.float(), ref, atol=2e-2)


@needs_cuda
@pytest.mark.slow
def test_more_than_2_31_elements():
    """q of 1 x 1M x 16 x 136 > 2^31 elements: int64 offsets everywhere. Forward and all three gradients checked
    against an fp32 reference computed in query chunks (the reference's dK/dV are sums over every chunk)."""
    free = torch.cuda.mem_get_info()[0]
    if free < 60 * 2**30:
        pytest.skip("needs ~60 GB of free GPU memory")
    b, s, sk, h, d = 1, 2**20, 4096, 16, 128 + 8
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    k, v = (torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
            for _ in range(2))
    assert q.numel() > 2**31
    out = fa2.attention(q, k, v)
    dout = torch.randn(out.shape, device="cuda", dtype=out.dtype, generator=gen)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)

    def rel(got, want):
        return ((got.float() - want).norm() / want.norm()).item()

    kf, vf = (t.detach().float().requires_grad_() for t in (k, v))
    out_err = dq_err = 0.0
    chunk = 16384
    for i in range(0, s, chunk):
        qf = q.detach()[:, i:i + chunk].float().requires_grad_()
        ref = attention_ref(qf, kf, vf)  # accumulates this chunk's share of dK/dV into kf.grad, vf.grad
        ref.backward(dout[:, i:i + chunk].float())
        out_err = max(out_err, rel(out[:, i:i + chunk].detach(), ref.detach()))
        dq_err = max(dq_err, rel(dq[:, i:i + chunk], qf.grad))
    # bf16 rounding of the results is ~3e-3 relative; an offset error gives garbage (~1)
    assert out_err < 1e-2 and dq_err < 1e-2, (out_err, dq_err)
    assert rel(dk, kf.grad) < 1e-2 and rel(dv, vf.grad) < 1e-2, (rel(dk, kf.grad), rel(dv, vf.grad))


@pytest.mark.parametrize("device", devices())
def test_headdim_1_channels_last(device):
    """headdim 1 lets the last stride be anything (channels_last gives stride(3) != 1): still read correctly."""
    dt = _dtype(device)
    q, k, v = (torch.randn(2, 5, 3, 1, device=device).to(dt).contiguous(memory_format=torch.channels_last)
               .requires_grad_() for _ in range(3))
    assert q.stride(3) != 1
    out = fa2.attention(q, k, v, causal=True)
    ref = _ref(q.detach(), k.detach(), v.detach(), causal=True)
    assert torch.allclose(out.double(), ref, atol=2e-2 if dt != torch.float32 else 1e-5)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    grads_ref = torch.autograd.grad(attention_ref(*leaves, causal=True), leaves, dout.double())
    for g, g_ref in zip(grads, grads_ref):
        assert torch.allclose(g.double(), g_ref, atol=5e-2 if dt != torch.float32 else 1e-5)


@pytest.mark.parametrize("device", devices())
def test_expanded_inputs_with_zero_strides(device):
    """k/v expand()ed over heads and q over batch (stride 0): read correctly, forward and gradients (on a cc 9.0 GPU
    the CUDA forward copies them, since the sm_90a kernels' TMA descriptors describe real strides only)."""
    dt = _dtype(device)
    q1, k1, v1 = make_qkv(1, 37, 45, 4, 1, 64, dtype=dt, device=device)
    q = q1.expand(3, -1, -1, -1).requires_grad_()
    k, v = (t.expand(3, -1, 4, -1).requires_grad_() for t in (k1, v1))
    assert q.stride(0) == 0 and k.stride(2) == 0
    out = fa2.attention(q, k, v, causal=True)
    ref = _ref(q.detach(), k.detach(), v.detach(), causal=True)
    tol = 2e-2 if dt != torch.float32 else 1e-5
    assert torch.allclose(out.double(), ref, atol=tol)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    grads_ref = torch.autograd.grad(attention_ref(*leaves, causal=True), leaves, dout.double())
    for g, g_ref in zip(grads, grads_ref):
        assert torch.allclose(g.double(), g_ref, atol=5 * tol)


def _bhsd(t):
    """t's values in (B, H, S, D)-contiguous memory, seen again in fa2's (B, S, H, D) order."""
    return t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("headdim", [64, 59])
def test_gradients_come_back_in_the_layout_of_their_inputs(device, headdim):
    """dq, dk, dv have the strides of q, k, v where those are dense (here (B, H, S, D)-, (B, S, H, D)- and
    (S, B, H, D)-contiguous storage: each on its own), so that accumulating into .grad or the producer's backward reads them
    contiguously; a non-dense input (a slice of a packed qkv) gets a contiguous gradient. Values by the DESIGN rule
    against the fp64 / naive references, for GQA, causal, and a headdim that is not a multiple of 8 (the CUDA glue's
    padded copies); the bwd op's fake kernel gives the same strides (opcheck)."""
    from numerics import assert_close_rule, hi_dtype
    dt = _dtype(device)
    q0, k0, v0 = make_qkv(2, 70, 45, 4, 4, headdim, dtype=dt, device=device)
    _, kg, vg = make_qkv(2, 70, 45, 4, 2, headdim, dtype=dt, device=device)  # (GQA: two K/V heads)
    packed = torch.stack([q0.detach()] * 3, dim=2).requires_grad_()  # (B, S, 3, H, D): q below is its slice 0
    sbhd = v0.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()  # (S, B, H, D) storage
    cases = {"bhsd q, sbhd v": (_bhsd(q0), k0.detach().clone().requires_grad_(), sbhd),
             "packed q, GQA": (packed[:, :, 0], _bhsd(kg), vg.detach().clone().requires_grad_())}
    for name, (q, k, v) in cases.items():
        out = fa2.attention(q, k, v, causal=True)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        for g, t in zip(grads, (q, k, v)):
            dense = any(t.transpose(*dims).is_contiguous() for dims in ((1, 1), (1, 2), (0, 1)))
            expected = t.stride() if dense else torch.empty(t.shape).stride()
            assert g.stride() == expected, f"{name}: gradient strides {g.stride()}, input {t.stride()}"
        hi = hi_dtype(dt)
        leaves_hi = [t.detach().to(hi).requires_grad_() for t in (q, k, v)]
        grads_hi = torch.autograd.grad(attention_ref(*leaves_hi, causal=True), leaves_hi, dout.to(hi))
        leaves_lo = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        grads_lo = torch.autograd.grad(attention_ref(*leaves_lo, causal=True, upcast=False), leaves_lo, dout)
        for gname, g, g_hi, g_lo in zip(("dq", "dk", "dv"), grads, grads_hi, grads_lo):
            assert_close_rule(f"{name} {gname}", g, g_hi, g_lo, factor=3)
        with torch.no_grad():
            out, lse = torch.ops.fa2.fwd(q, k, v, None, None, True, -1, -1, 0.0)
        torch.library.opcheck(torch.ops.fa2.bwd.default, (dout, q.detach(), k.detach(), v.detach(), out, lse, None,
                                                          None, True, -1, -1, 0.0, False, False))


@needs_cuda
def test_cuda_batch_beyond_the_grid_limit_is_a_clear_error():
    """65536 sequences (a CUDA grid's y/z limit is 65535): a message with the numbers, not "invalid argument"; the
    process stays usable."""
    q = torch.randn(65536, 2, 1, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="batch and nheads up to 65535 .*got batch 65536"):
        fa2.attention(q, q, q)
    torch.cuda.synchronize()
    assert torch.isfinite(fa2.attention(q[:4], q[:4], q[:4])).all()
