"""Dropout (docs/design.md, Dropout): the mask's statistics and independence, the kernels' mask against the Python
mirror of the Philox mapping (fa2/_rng.py), the forward's mask replayed by the backward (gradients against a reference
that applies the same mask), reproducibility under torch.manual_seed, p = 0, bad input, opcheck, torch.compile; CPU
and CUDA (the CUDA tests skip without a GPU; on Hopper they run the sm_90a kernels the plan routes dropout to: the
pipelined forward, bwd_kernel's wgmma tiles on the plain path at d 32 / 64 / 128 / 256, the sm80 path's elsewhere)."""
from __future__ import annotations

import math

import pytest
import torch

import fa2
from fa2 import _rng
from fa2.reference import visibility_mask
from numerics import assert_close_rule, hi_dtype
from samples import make_bias, make_qkv, skip_without_device

DEVICES = ["cpu", "cuda"]


_needs = skip_without_device


def _dtype(device):
    return torch.float32 if device == "cpu" else torch.bfloat16


def _state(seed, offset, device):
    return torch.tensor([seed, offset], dtype=torch.int64, device=device)


def _binomial_ok(kept, n, p_keep, sigmas=6.0):
    return abs(kept - n * p_keep) <= sigmas * math.sqrt(n * p_keep * (1 - p_keep)) + 1


# ---- the reference with a given mask ------------------------------------------------------------------------------

def attention_ref_dropout(q, k, v, keep, dropout_p, attn_bias=None, scale=None, causal=False, window_left=-1,
                          window_right=-1, softcap=0.0, upcast=True):
    """fa2's semantics with the mask ``keep`` (bool (B, H, Sq, Sk)): P ∘ keep / (1 - p) before P V (fp32 / fp64 with
    upcast, else in q's dtype); a row that sees no key gives 0."""
    dtype = q.dtype
    compute = (torch.float64 if dtype == torch.float64 else torch.float32) if upcast else dtype
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    qh = q.to(compute).transpose(1, 2)
    kh = k.to(compute).transpose(1, 2).repeat_interleave(H // Hk, dim=1)
    vh = v.to(compute).transpose(1, 2).repeat_interleave(H // Hk, dim=1)
    s = (qh * scale) @ kh.transpose(-1, -2)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    seen = visibility_mask(Sq, Sk, causal, window_left, window_right, device=q.device)
    if attn_bias is not None:
        if attn_bias.dtype == torch.bool:
            seen = attn_bias if seen is None else attn_bias & seen
        else:
            s = s + attn_bias.to(compute)
    if seen is not None:
        s = s.masked_fill(~seen, float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    p = p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(compute).tiny)
    p = p * keep.to(compute) / (1 - dropout_p)
    return (p @ vh).transpose(1, 2).to(dtype)


def _keep(rng_state, q, k, dropout_p):
    b, sq, h, _ = q.shape
    return _rng.dropout_keep_mask(rng_state, b, h, sq, k.shape[1], dropout_p).to(q.device)


# ---- the generator and the mapping --------------------------------------------------------------------------------

@pytest.mark.parametrize("rounds,answers", [
    (7, [(0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48), (0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662),
         (0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A)]),
    (10, [(0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
          (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)]),
])
def test_philox_known_answers(rounds, answers):
    """Random123's known-answer vectors for Philox4x32-7 (the kernels' generator) and -10 (the mirror's rounds; the
    kernels' mask is checked against the mirror)."""
    inputs = [((0, 0, 0, 0), (0, 0)), ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2),
              ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0))]
    assert [_rng.philox4x32(counter, key, rounds) for counter, key in inputs] == answers


@pytest.mark.parametrize("dropout_p", [0.1, pytest.param(0.5, marks=pytest.mark.slow),
                                       pytest.param(0.9, marks=pytest.mark.slow)])
def test_kept_fraction_is_binomial(dropout_p):
    """The keep probability is round((1 - p) 65536) / 65536 (within 2^-17 of 1 - p): the kept fraction of 1M weights
    within 6 sigma of 1 - p, also per position of a weight in its Philox group (each 16-bit lane)."""
    keep = _rng.dropout_keep_mask(_state(1234, 99, "cpu"), 2, 4, 256, 512, dropout_p)
    n = keep.numel()
    assert _binomial_ok(int(keep.sum()), n, 1 - dropout_p)
    assert abs(_rng.keep_threshold(dropout_p) / 65536 - (1 - dropout_p)) <= 2 ** -17
    for di in (0, 8):
        for dj in (0, 1, 8, 9):
            lane = keep[..., di::16, :][..., dj::16]
            assert _binomial_ok(int(lane.sum()), lane.numel(), 1 - dropout_p), (di, dj)


def test_masks_are_independent_across_heads_batch_calls_and_neighbours():
    """Two masks that should be independent agree on a fraction (1-p)^2 + p^2 of their weights (binomial bounds):
    heads, batch entries, two rng states (two calls), and neighbouring weights of one Philox group."""
    p = 0.3
    agree = (1 - p) ** 2 + p ** 2
    keep = _rng.dropout_keep_mask(_state(7, 0, "cpu"), 2, 4, 128, 128, p)
    other = _rng.dropout_keep_mask(_state(8, 0, "cpu"), 2, 4, 128, 128, p)
    pairs = [(keep[0, 0], keep[0, 1]), (keep[0, 2], keep[1, 2]), (keep, other),
             (keep[..., 0::2], keep[..., 1::2]), (keep[..., 0:8, :], keep[..., 8:16, :])]
    for a, b in pairs:
        assert _binomial_ok(int((a == b).sum()), a.numel(), agree)
    # the same state and coordinates: the same mask (it is a function, not a stream)
    assert torch.equal(keep[:1], _rng.dropout_keep_mask(_state(7, 0, "cpu"), 1, 4, 128, 128, p))
    # the offset moves the counter: offset o + 1 at head h is offset o at head h + 1
    shifted = _rng.dropout_keep_mask(_state(7, 1, "cpu"), 1, 3, 64, 64, p)
    assert torch.equal(shifted[0], keep[0, 1:4, :64, :64])


def test_draw_consumes_the_default_generator():
    torch.manual_seed(5)
    a, b = _rng.draw_rng_state("cpu"), _rng.draw_rng_state("cpu")
    torch.manual_seed(5)
    assert torch.equal(a, _rng.draw_rng_state("cpu"))
    assert not torch.equal(a, b)
    assert a.dtype == torch.int64 and a.shape == (2,)


# ---- the kernels' mask --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_kernel_mask_matches_the_mirror(device):
    """v = the identity (headdim_v = seqlen_k) makes out = P ∘ Z / (1 - p): its zeros are the kernel's mask, which
    must be the mirror's, weight for weight (odd sizes: partial 16-blocks, several key tiles)."""
    _needs(device)
    dtype = _dtype(device)
    p = 0.4
    b, sq, sk, h = 2, 70, 200, 3
    q, k, _ = make_qkv(b, sq, sk, h, h, 32, dtype=dtype, device=device)
    v = torch.eye(sk, dtype=dtype, device=device).expand(b, h, sk, sk).transpose(1, 2)
    state = _state(0x1234_5678_9ABC_DEF0 - 2 ** 63, 0xFFFF_FFFF_FFFF_FFF0 - 2 ** 64, device)
    out, _ = torch.ops.fa2.fwd(q, k, v, dropout_p=p, rng_state=state)
    got = out.transpose(1, 2) != 0  # (b, h, sq, sk)
    expected = _keep(state, q, k, p)
    assert torch.equal(got, expected), f"{int((got != expected).sum())} of {got.numel()} weights differ"
    # kept weights carry P / (1 - p)
    ref = attention_ref_dropout(q, k, v, expected, p)
    assert_close_rule("out", out, ref, attention_ref_dropout(q, k, v, expected, p, upcast=False), 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("headdim", [64, 128])
def test_kernel_mask_matches_the_mirror_in_key_slices(device, headdim):
    """The mask at a real headdim over several key and query tiles: v = the identity on keys j d .. j d + d - 1 (zero
    elsewhere) makes out = (P ∘ Z / (1 - p)) of those keys, one call per slice, the same rng_state each time. CUDA:
    both routes (on Hopper the sm_90a kernels, and the sm80 path's with development option sm90_dropout off)."""
    _needs(device)
    dtype = _dtype(device)
    p = 0.3
    b, sq, sk, h = 1, 150 if device == "cpu" else 300, 2 * headdim + 44, 2
    q, k, _ = make_qkv(b, sq, sk, h, h, headdim, dtype=dtype, device=device)
    state = _state(77, 2 ** 33 + 5, device)
    expected = _keep(state, q, k, p)
    for sm90_dropout in ([True] if device == "cpu" else [True, False]):
        got = torch.zeros(b, h, sq, sk, dtype=torch.bool, device=device)
        with fa2.dev.options_override(sm90_dropout=sm90_dropout):
            for j0 in range(0, sk, headdim):
                width = min(headdim, sk - j0)
                v = torch.zeros(sk, headdim, dtype=dtype, device=device)
                v[j0:j0 + width, :width] = torch.eye(width, dtype=dtype, device=device)
                v = v.expand(b, h, sk, headdim).transpose(1, 2)
                out, _ = torch.ops.fa2.fwd(q, k, v, dropout_p=p, rng_state=state)
                got[..., j0:j0 + width] = (out.transpose(1, 2) != 0)[..., :width]
        assert torch.equal(got, expected), (f"sm90_dropout={sm90_dropout}: {int((got != expected).sum())} of "
                                            f"{got.numel()} weights differ")


# ---- forward and backward against the reference with the same mask ------------------------------------------------

CASES = [
    ("plain", (2, 97, 113, 4, 4, 64), {}),
    ("causal_gqa", (1, 128, 160, 4, 2, 32), dict(causal=True)),
    ("window_softcap", (1, 65, 65, 2, 1, 59), dict(window_left=16, window_right=4, softcap=5.0)),
    ("bias", (2, 33, 80, 2, 2, 40), dict(bias="padding")),
    ("full_bias", (1, 48, 48, 2, 2, 64), dict(bias="full")),
]


def _case_inputs(shape, flags, device, dtype):
    b, sq, sk, h, hk, d = shape
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device=device, requires_grad=True)
    flags = dict(flags)
    kind = flags.pop("bias", None)
    bias = None if kind is None else make_bias(kind, b, h, sq, sk, dtype=dtype, device=device)
    return q, k, v, bias, flags


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,shape,flags", CASES, ids=[c[0] for c in CASES])
def test_forward_and_backward_match_reference_with_the_same_mask(device, name, shape, flags):
    _needs(device)
    _check_forward_and_backward(device, name, shape, flags, 0.2)


def _check_forward_and_backward(device, name, shape, flags, p):
    dtype = _dtype(device)
    q, k, v, bias, flags = _case_inputs(shape, flags, device, dtype)
    state = _state(42, 7, device)
    out, lse = torch.ops.fa2.fwd(q, k, v, bias, dropout_p=p, rng_state=state, **flags)
    keep = _keep(state, q, k, p)
    dout = torch.randn_like(out)
    dq, dk, dv, _ = torch.ops.fa2.bwd(dout, q.detach(), k.detach(), v.detach(), out, lse, bias, dropout_p=p,
                                      rng_state=state, **flags)
    hi = [t.detach().to(hi_dtype(dtype)).requires_grad_() for t in (q, k, v)]
    lo = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref_hi = attention_ref_dropout(*hi, keep, p, bias, **flags)
    ref_lo = attention_ref_dropout(*lo, keep, p, bias, upcast=False, **flags)
    assert_close_rule(f"{name} out", out, ref_hi, ref_lo, 2)
    g_hi = torch.autograd.grad(ref_hi, hi, dout.to(ref_hi.dtype))
    g_lo = torch.autograd.grad(ref_lo, lo, dout)
    for label, got, gh, gl in zip(("dq", "dk", "dv"), (dq, dk, dv), g_hi, g_lo):
        assert_close_rule(f"{name} {label}", got, gh, gl, 3)


def test_gradients_float64_exact_with_the_same_mask():
    q, k, v = make_qkv(1, 37, 41, 2, 1, 16, dtype=torch.float64, device="cpu", requires_grad=True)
    state = _state(3, 4, "cpu")
    p = 0.3
    out = torch.ops.fa2.fwd(q, k, v, causal=True, dropout_p=p, rng_state=state)[0]
    ref = attention_ref_dropout(q, k, v, _keep(state, q, k, p), p, causal=True)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(ref, (q, k, v), dout)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


# ---- the public API -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_reproducible_under_manual_seed_forward_and_backward(device):
    _needs(device)
    q, k, v = make_qkv(2, 64, 80, 4, 2, 32, dtype=_dtype(device), device=device, requires_grad=True)

    def run(seed):
        torch.manual_seed(seed)
        out = fa2.attention(q, k, v, causal=True, dropout_p=0.25)
        return (out, *torch.autograd.grad(out.float().square().sum(), (q, k, v)))

    first, again, other = run(11), run(11), run(12)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], other[0])
    # and consecutive calls draw fresh masks
    torch.manual_seed(11)
    one, two = fa2.attention(q, k, v, dropout_p=0.25), fa2.attention(q, k, v, dropout_p=0.25)
    assert not torch.equal(one, two)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_zero_is_no_dropout(device):
    _needs(device)
    q, k, v = make_qkv(1, 50, 70, 2, 2, 64, dtype=_dtype(device), device=device, requires_grad=True)
    out0 = fa2.attention(q, k, v, causal=True)
    out1 = fa2.attention(q, k, v, causal=True, dropout_p=0.0)
    assert torch.equal(out0, out1)
    g0 = torch.autograd.grad(out0.sum(), (q, k, v))
    g1 = torch.autograd.grad(out1.sum(), (q, k, v))
    for a, b in zip(g0, g1):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_expectation_is_the_undropped_output(device):
    """E[out] = attention without dropout: the mean of many dropped outputs converges to it."""
    _needs(device)
    q, k, v = make_qkv(1, 16, 32, 1, 1, 16, dtype=torch.float32 if device == "cpu" else torch.float16, device=device)
    want = fa2.attention(q, k, v).float()
    mean = torch.stack([fa2.attention(q, k, v, dropout_p=0.5).float() for _ in range(400)]).mean(0)
    assert (mean - want).abs().max() < 0.25 * v.float().abs().max()


def test_bad_dropout_p_and_rng_state_raise_clearly():
    q, k, v = make_qkv(1, 8, 8, 1, 1, 16, dtype=torch.float32, device="cpu")
    for p in (-0.1, 1.0, 1.5, float("nan")):
        with pytest.raises((ValueError, RuntimeError), match="dropout_p"):
            fa2.attention(q, k, v, dropout_p=p)
    with pytest.raises((TypeError, RuntimeError), match="rng_state"):
        torch.ops.fa2.fwd(q, k, v, dropout_p=0.1, rng_state=torch.zeros(2, dtype=torch.int32))
    with pytest.raises((ValueError, RuntimeError), match="rng_state"):
        torch.ops.fa2.fwd(q, k, v, dropout_p=0.1, rng_state=torch.zeros(3, dtype=torch.int64))
    out, lse = torch.ops.fa2.fwd(q, k, v, dropout_p=0.1, rng_state=_state(1, 2, "cpu"))
    with pytest.raises((ValueError, RuntimeError), match="rng_state"):
        torch.ops.fa2.bwd(torch.ones_like(out), q, k, v, out, lse, dropout_p=0.1)


def test_varlen_equal_lengths_give_the_padded_mask():
    """A varlen sequence b takes batch coordinate b: packed equal-length sequences get exactly the padded call's
    mask, forward and backward (bitwise on the CPU, where each run of equal lengths is one padded problem)."""
    b, s, h, d = 3, 40, 2, 32
    q, k, v = make_qkv(b, s, s, h, h, d, dtype=torch.float32, device="cpu", requires_grad=True)
    state = _state(77, 5, "cpu")
    out, lse = torch.ops.fa2.fwd(q, k, v, causal=True, dropout_p=0.3, rng_state=state)
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32)
    packed = [t.reshape(b * s, h, d) for t in (q, k, v)]
    out_v, lse_v = torch.ops.fa2.varlen_fwd(*packed, cu, cu, s, s, causal=True, dropout_p=0.3, rng_state=state)
    assert torch.equal(out_v, out.reshape(b * s, h, d))
    dout = torch.randn_like(out)
    grads = torch.ops.fa2.bwd(dout, q, k, v, out, lse, causal=True, dropout_p=0.3, rng_state=state)[:3]
    grads_v = torch.ops.fa2.varlen_bwd(dout.reshape(b * s, h, d), *packed, out_v, lse_v, cu, cu, s, s, causal=True,
                                       dropout_p=0.3, rng_state=state)[:3]
    for g, gv in zip(grads, grads_v):
        torch.testing.assert_close(gv, g.reshape(gv.shape), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_matches_reference_with_the_same_mask(device):
    _needs(device)
    dtype = _dtype(device)
    lengths_q, lengths_k = [17, 0, 50, 33], [20, 5, 50, 1]
    h, d, p = 2, 64, 0.25
    cu_q = torch.tensor([0] + list(torch.tensor(lengths_q).cumsum(0)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(torch.tensor(lengths_k).cumsum(0)), dtype=torch.int32, device=device)
    q = torch.randn(sum(lengths_q), h, d, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(sum(lengths_k), h, d, dtype=dtype, device=device, requires_grad=True)
    v = torch.randn(sum(lengths_k), h, d, dtype=dtype, device=device, requires_grad=True)
    state = _state(5, 6, device)
    out = torch.ops.fa2.varlen_fwd(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True, dropout_p=p,
                                   rng_state=state)[0]
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)  # (the op's autograd: rng_state passed along)
    for b, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
        if lq == 0:
            continue
        sl_q, sl_k = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        qs, ks, vs = (t.detach()[s][None].to(hi_dtype(dtype)).requires_grad_() for t, s in ((q, sl_q), (k, sl_k),
                                                                                              (v, sl_k)))
        keep = _rng.dropout_keep_mask(state, 1, h, lq, lk, p, batch_index=[b]).to(device)
        ref = attention_ref_dropout(qs, ks, vs, keep, p, causal=True)
        torch.testing.assert_close(out[sl_q].float(), ref[0].float(), rtol=2e-2, atol=2e-2)
        ref_grads = torch.autograd.grad(ref, (qs, ks, vs), dout[sl_q][None].to(ref.dtype))
        for g, rg, s in zip(grads, ref_grads, (sl_q, sl_k, sl_k)):
            torch.testing.assert_close(g[s].float(), rg[0].float(), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_dropout(device):
    """fa2.sdpa(dropout_p=) runs (SDPA's layout) with the statistics of dropout: E[out] over draws is SDPA's output."""
    _needs(device)
    q = torch.randn(1, 2, 16, 32, device=device, dtype=_dtype(device))
    out = fa2.sdpa(q, q, q, dropout_p=0.5)
    assert out.shape == q.shape and not torch.equal(out, fa2.sdpa(q, q, q))


# ---- opcheck, torch.compile ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_with_rng_state(device):
    """With rng_state given the ops are deterministic functions: opcheck (schema, fake, autograd registration, AOT)."""
    _needs(device)
    q, k, v = make_qkv(1, 33, 47, 2, 1, 32, dtype=_dtype(device), device=device, requires_grad=True)
    state = _state(9, 10, device)
    kwargs = dict(causal=True, dropout_p=0.2, rng_state=state)
    torch.library.opcheck(torch.ops.fa2.fwd.default, (q, k, v), kwargs)
    with torch.no_grad():
        out, lse = torch.ops.fa2.fwd(q, k, v, **kwargs)
    torch.library.opcheck(torch.ops.fa2.bwd.default, (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out,
                                                       lse), kwargs)
    cu_q = torch.tensor([0, 33], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 47], dtype=torch.int32, device=device)
    torch.library.opcheck(torch.ops.fa2.varlen_fwd.default, (q[0], k[0], v[0], cu_q, cu_k, 33, 47), kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_no_graph_break(device):
    """fa2.attention with dropout under torch.compile(fullgraph=True): one graph (the draw is a traced op),
    gradients flow, and a seed reproduces the compiled call."""
    _needs(device)
    torch._dynamo.reset()
    q, k, v = make_qkv(2, 48, 64, 4, 2, 32, dtype=_dtype(device), device=device, requires_grad=True)

    def f(q, k, v):
        return fa2.attention(q, k, v, causal=True, dropout_p=0.1).float().square().sum()

    compiled = torch.compile(f, fullgraph=True)
    torch.manual_seed(3)
    loss = compiled(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    torch.manual_seed(3)
    loss_again = compiled(q, k, v)
    assert torch.equal(loss, loss_again)
    assert all(torch.isfinite(g).all() for g in grads)
    # the same statistics as eager: the loss within a few percent of an eager call's (a different draw)
    assert abs(loss.item() - f(q, k, v).item()) < 0.25 * abs(loss.item())


def test_cuda_graph_replays_draw_fresh_masks():
    """Under CUDA graph capture the draw is the CUDA generator's capture-safe one and the kernels read rng_state from
    device memory: each replay drops other weights (v = the identity shows the mask: out's zeros)."""
    _needs("cuda")
    sk = 64
    q, k, _ = make_qkv(1, 32, sk, 2, 2, 32, dtype=torch.bfloat16, device="cuda")
    v = torch.eye(sk, dtype=torch.bfloat16, device="cuda").expand(1, 2, sk, sk).transpose(1, 2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fa2.attention(q, k, v, dropout_p=0.5)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fa2.attention(q, k, v, dropout_p=0.5)
    masks = []
    for _ in range(2):
        graph.replay()
        masks.append(out != 0)
    torch.cuda.synchronize()
    assert not torch.equal(masks[0], masks[1])
    for m in masks:
        assert _binomial_ok(int(m.sum()), m.numel(), 0.5)


# ---- the sm_90a kernels (Hopper): shapes across their tiles ---------------------------------------------------------

# The headdims whose backward has bwd_kernel's wgmma tiles (bwd_tile_config.h, bwd_wgmma_headdim): dropout's plain
# backward runs them on Hopper; the others, and the score-mod path (bias, softcap), run the sm80 tiles.
WGMMA_BWD_HEADDIMS = (32, 64, 128, 256)

SM90_CASES = [
    ("d64_tails", (2, 300, 281, 4, 4, 64), {}),
    ("d64_causal_gqa", (1, 257, 390, 6, 2, 64), dict(causal=True)),
    ("d32_causal", (1, 150, 170, 2, 2, 32), dict(causal=True)),
    ("d128_window_gqa", (2, 200, 333, 4, 2, 128), dict(window_left=50, window_right=10)),
    ("d128_causal", (1, 384, 384, 2, 2, 128), dict(causal=True)),
    ("d256", (1, 130, 150, 2, 1, 256), {}),
    ("d96", (1, 100, 140, 2, 2, 96), {}),
    ("d192_causal", (1, 140, 100, 2, 1, 192), dict(causal=True)),
    ("d128_padding_bias", (2, 130, 200, 2, 2, 128), dict(bias="padding")),
    ("d64_softcap", (1, 200, 260, 2, 2, 64), dict(softcap=8.0)),
]


def _plan_call(shape, flags, dropout_p):
    b, sq, sk, h, hk, d = shape
    call = dict(batch=b, seqlen_q=sq, seqlen_k=sk, nheads=h, nheads_k=hk, headdim=d, dtype="bfloat16",
                dropout_p=dropout_p, **{k: v for k, v in flags.items() if k != "bias"})
    if "bias" in flags:
        call["bias"] = "key_row"
    return call


@pytest.mark.parametrize("name,shape,flags", SM90_CASES, ids=[c[0] for c in SM90_CASES])
def test_sm90a_dropout_kernels_match_reference_with_the_same_mask(name, shape, flags):
    """CUDA: forward and backward against the reference with the mirror's mask, at every headdim's tiles (several
    query and key blocks, tails, causal, window, GQA, bias, softcap); on Hopper the plan must name the sm_90a
    kernels."""
    _needs("cuda")
    if torch.cuda.get_device_capability() == (9, 0):
        call = _plan_call(shape, flags, 0.15)
        fwd_kernel = fa2.dev.plan("fwd", **call)["kernel"]
        bwd_kernel = fa2.dev.plan("bwd", **call)["kernel"]
        assert "sm90a" in fwd_kernel and "dropout" in fwd_kernel, fwd_kernel
        wgmma_bwd = shape[-1] in WGMMA_BWD_HEADDIMS and not flags.get("bias") and not flags.get("softcap")
        assert ("sm90a wgmma tiles" in bwd_kernel) == wgmma_bwd and "dropout" in bwd_kernel, bwd_kernel
    _check_forward_and_backward("cuda", name, shape, flags, 0.15)


WS_DROPOUT_CASES = [  # bwd_ws_kernel's dropout variant: d 64 / 128, plain path (development option sm90_ws_dropout, on)
    ("d64_tails", (2, 300, 281, 4, 4, 64), {}),
    ("d64_causal_gqa", (1, 257, 390, 6, 2, 64), dict(causal=True)),
    ("d128_window_gqa", (2, 200, 333, 4, 2, 128), dict(window_left=50, window_right=10)),
    ("d128_causal_long", (1, 700, 700, 2, 2, 128), dict(causal=True)),
]


@pytest.mark.parametrize("name,shape,flags", WS_DROPOUT_CASES, ids=[c[0] for c in WS_DROPOUT_CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ws_backward_with_dropout_matches_reference_with_the_same_mask(name, shape, flags, dtype):
    """Compute capability 9.0, option sm90_ws_dropout on: the dropout backward runs bwd_ws_kernel (its transposed
    fragments draw the forward's keep bits, a Philox group split over a lane pair), within the rule against the
    reference with the mirror's mask, as bwd_kernel's wgmma tiles are with the option off."""
    _needs("cuda")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("compute capability 9.0 only")
    from kernels import cuda_kernel_names, switch
    b, sq, sk, h, hk, d = shape
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device="cuda", requires_grad=True)
    p = 0.17
    state = _state(5, 2 ** 32 + 3, "cuda")
    out, lse = torch.ops.fa2.fwd(q, k, v, dropout_p=p, rng_state=state, **flags)
    keep = _keep(state, q, k, p)
    dout = torch.randn_like(out)
    hi = [t.detach().to(hi_dtype(dtype)).requires_grad_() for t in (q, k, v)]
    lo = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref_hi = attention_ref_dropout(*hi, keep, p, **flags)
    ref_lo = attention_ref_dropout(*lo, keep, p, upcast=False, **flags)
    g_hi = torch.autograd.grad(ref_hi, hi, dout.to(ref_hi.dtype))
    g_lo = torch.autograd.grad(ref_lo, lo, dout)
    for ws in (True, False):
        with switch("sm90_ws_dropout", ws):
            bwd = lambda: torch.ops.fa2.bwd(dout, q.detach(), k.detach(), v.detach(), out, lse, None, dropout_p=p,
                                            rng_state=state, **flags)
            names = cuda_kernel_names(bwd)
            grads = bwd()[:3]
        assert any("bwd_ws_kernel<" in n for n in names) == ws, (ws, names)
        for label, got, gh, gl in zip(("dq", "dk", "dv"), grads, g_hi, g_lo):
            assert_close_rule(f"{name} {label} (sm90_ws_dropout {ws})", got, gh, gl, 3)


def test_plan_routes_dropout_to_the_ws_backward_by_default():
    """Option sm90_ws_dropout (on by default): the plain dropout backward at d 64 / 128 plans bwd_ws_kernel's dropout
    variant on Hopper; d 256 (the headdim-split kernel), varlen, a bias and softcap keep bwd_kernel; with the option
    off, bwd_kernel's wgmma tiles everywhere."""
    call = dict(batch=2, nheads=8, seqlen_q=1024, seqlen_k=1024, dtype="bfloat16", dropout_p=0.1)
    assert fa2.dev.options()["sm90_ws_dropout"]
    for d in (64, 128):
        plan = fa2.dev.plan("bwd", device="h100", headdim=d, **call)
        if "error" in plan:
            pytest.skip(plan["error"])
        assert plan["kernel"] == f"bwd_ws_kernel<bf16, {d}, plain, dropout>", plan["kernel"]
        causal = fa2.dev.plan("bwd", device="h100", headdim=d, causal=True, nheads_k=2, **call)["kernel"]
        assert causal.startswith("bwd_ws_kernel<") and "dropout" in causal, causal
    for d, extra in ((256, {}), (64, dict(varlen=True, causal=True)), (64, dict(bias="key_row")),
                     (64, dict(softcap=5.0))):
        plan = fa2.dev.plan("bwd", device="h100", headdim=d, **extra, **call)
        if "error" in plan:
            continue
        assert plan["kernel"].startswith("bwd_kernel<") and "dropout" in plan["kernel"], (d, extra, plan["kernel"])
    with fa2.dev.options_override(sm90_ws_dropout=False):
        assert fa2.dev.plan("bwd", device="h100", headdim=64, **call)["kernel"].startswith("bwd_kernel<")


@pytest.mark.parametrize("sm90_dropout", [True, False])
def test_hopper_dropout_launches_the_sm90a_kernels(sm90_dropout):
    """Compute capability 9.0: a dropout call runs the pipelined sm_90a forward with kDropout (tag 901, not
    warp-specialized) and, with option sm90_ws_dropout off, bwd_kernel's wgmma tiles with kDropout; with development
    option sm90_dropout off, the sm80 path's (tag 900). The kernels' names as the profiler gives them."""
    _needs("cuda")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("compute capability 9.0 only")
    from kernels import cuda_kernel_names, switch

    q, k, v = make_qkv(2, 300, 300, 4, 4, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)

    def run():
        out = fa2.attention(q, k, v, causal=True, dropout_p=0.1)
        out.backward(torch.ones_like(out))

    with switch("sm90_dropout", sm90_dropout), switch("sm90_ws_dropout", False):  # (the ws backward: its own test)
        names = cuda_kernel_names(run)
    tag = ", 901, " if sm90_dropout else ", 900, "
    # (fwd_kernel<..., warp_specialized, pingpong, overlap, tile_counter, cluster, varlen, dropout>)
    fwd = [n for n in names if "fwd_kernel<" in n]
    assert len(fwd) == 1 and tag in fwd[0] and fwd[0].endswith(
        ", false, false, false, false, false, false, true>(fa2::AttentionParams, fa2::sm90::FwdTensorMaps)"), names
    # (bwd_kernel<T, Cfg, arch, score_mod, key_bias, varlen, dropout>: with sm90_dropout the wgmma config, kWgmma true)
    bwd = [n for n in names if "bwd_kernel<" in n]
    assert len(bwd) == 1 and tag in bwd[0], names
    assert bwd[0].endswith(", false, false, false, true>(fa2::AttentionParams)"), names
    assert (", true, true>" + tag in bwd[0]) == sm90_dropout, bwd


# ---- the plan: Hopper routes dropout to the sm_90a kernels -----------------------------------------------------------

@pytest.mark.parametrize("headdim", [32, 64, 96, 128, 192, 256])
def test_plan_routes_dropout_to_the_sm90a_kernels_on_hopper(headdim):
    call = dict(batch=2, nheads=8, seqlen_q=1024, seqlen_k=1024, headdim=headdim, dtype="bfloat16")
    dropped = fa2.dev.plan("fwd", device="h100", dropout_p=0.1, **call)
    if "error" in dropped:
        pytest.skip(f"this build has no headdim-{headdim} instance: {dropped['error']}")
    # the forward: the pipelined sm_90a kernel (the warp-specialized ones have no dropout), plain or general
    kernel = dropped["kernel"]
    assert "dropout" in kernel and "sm90a" in kernel and "warp-specialized" not in kernel, kernel
    assert "dropout" not in fa2.dev.plan("fwd", device="h100", **call)["kernel"]
    for extra in (dict(bias="key_row"), dict(softcap=5.0)):
        kernel = fa2.dev.plan("fwd", device="h100", dropout_p=0.1, **extra, **call)["kernel"]
        assert "sm90a" in kernel and "general" in kernel and "dropout" in kernel, (extra, kernel)
    varlen = fa2.dev.plan("fwd", device="h100", dropout_p=0.1, varlen=True, causal=True, **call)["kernel"]
    assert "sm90a" in varlen and "varlen" in varlen and "dropout" in varlen, varlen
    # the backward: bwd_ws_kernel at d 64 / 128 (test_plan_routes_dropout_to_the_ws_backward_by_default), else
    # bwd_kernel's wgmma tiles on the plain path where they exist, as at every headdim with option sm90_ws_dropout off
    kernel = fa2.dev.plan("bwd", device="h100", dropout_p=0.1, **call)["kernel"]
    wgmma = headdim in WGMMA_BWD_HEADDIMS
    ws = headdim in (64, 128)
    assert "dropout" in kernel and kernel.startswith("bwd_ws_kernel<") == ws, kernel
    with fa2.dev.options_override(sm90_ws_dropout=False):
        kernel = fa2.dev.plan("bwd", device="h100", dropout_p=0.1, **call)["kernel"]
    assert "dropout" in kernel and ("sm90a, sm90a wgmma tiles, plain" in kernel) == wgmma, kernel
    assert wgmma or "sm90, sm80 tiles" in kernel, kernel
    assert "dropout" not in fa2.dev.plan("bwd", device="h100", **call)["kernel"]
    varlen = fa2.dev.plan("bwd", device="h100", dropout_p=0.1, varlen=True, causal=True, **call)["kernel"]
    assert ("sm90a wgmma tiles" in varlen) == wgmma and "varlen" in varlen and "dropout" in varlen, varlen
    for extra in (dict(bias="key_row"), dict(softcap=5.0)):
        kernel = fa2.dev.plan("bwd", device="h100", dropout_p=0.1, **extra, **call)["kernel"]
        assert "sm90, sm80 tiles, score-mod" in kernel and "dropout" in kernel, (extra, kernel)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_plan_keeps_dropout_on_the_sm80_path_elsewhere(direction):
    """A100: the sm80 path; Hopper with the sm_90a backward switched off: the sm80 path's backward."""
    call = dict(batch=2, nheads=8, seqlen_q=1024, seqlen_k=1024, headdim=128, dtype="bfloat16", dropout_p=0.1)
    kernel = fa2.dev.plan(direction, device="a100", **call)
    if "error" in kernel:
        pytest.skip(f"this build has no sm80 headdim-128 instance: {kernel['error']}")
    assert "sm80" in kernel["kernel"] and "sm90" not in kernel["kernel"] and "dropout" in kernel["kernel"], kernel
    if direction == "bwd":
        with fa2.dev.options_override(sm90_backward=False):
            kernel = fa2.dev.plan("bwd", device="h100", **call)["kernel"]
        assert "sm90a" not in kernel and "dropout" in kernel, kernel
