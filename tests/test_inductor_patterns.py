"""The Inductor pass on hand-written attention: one test per way real code writes it, and negative tests where a
rewrite must not happen. Each test compiles a small function, checks what the pass reported for every site (rewritten
or not, the flags it inferred, why not) and that outputs and gradients match eager within the numerics rule.

Most tests use ``backend="fa2_eager"`` (AOT autograd + the pass, no Inductor code generation: the same graphs the pass
sees under Inductor, in a fraction of the time); the ``inductor`` tests run the real ``backend="fa2"``.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fa2
import fa2.backend  # noqa: F401  (registers the "fa2" and "fa2_eager" backends)
from fa2.inductor import recording
from fa2.inductor._compat import without_aot_cache
from numerics import assert_close_rule, hi_dtype

_CUDA = torch.cuda.is_available()
DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu-float32"),
    # (the pass sees the same graphs in bf16: the quick run checks its patterns in fp32, bf16 numerics in test_ops)
    pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16", marks=pytest.mark.slow),
    pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=pytest.mark.skipif(not _CUDA, reason="no CUDA")),
    pytest.param("cuda", torch.float16, id="cuda-float16", marks=pytest.mark.skipif(not _CUDA, reason="no CUDA")),
]
B, H, S, D = 2, 4, 13, 16


def qkv(device, dtype, *, b=B, h=H, hk=None, sq=S, sk=S, d=D, layout="bhsd", seed=0):
    g = torch.Generator().manual_seed(seed)
    hk = hk or h

    def one(s, heads):
        shape = (b, heads, s, d) if layout == "bhsd" else (b, s, heads, d)
        return torch.randn(shape, generator=g).to(device=device, dtype=dtype)
    return one(sq, h), one(sk, hk), one(sk, hk)


def run(fn, args, *, device, dtype, train=True, backend="fa2_eager", dynamic=None, frozen=()):
    """Compile and run ``fn(*args)`` (float args get gradients when ``train``, except the indices in ``frozen``);
    returns (records, out, grads) and the same from eager in the input dtype and in the high-precision dtype."""
    def prepare(target_dtype):
        out = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                a = a.detach().to(target_dtype).requires_grad_(train and i not in frozen)
            out.append(a)
        return out

    def execute(f, inputs):
        out = f(*inputs)
        grads = []
        if train:
            weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
            (out.float() * weight).sum().backward()
            grads = [a.grad for a in inputs if isinstance(a, torch.Tensor) and a.requires_grad]
        return out.detach(), grads

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    with recording() as records, without_aot_cache(), torch.set_grad_enabled(train):
        got = execute(compiled, prepare(dtype))
    with torch.set_grad_enabled(train):
        naive = execute(fn, prepare(dtype))
        hi = execute(fn, prepare(hi_dtype(dtype)))
    return records, got, naive, hi


def check_numerics(got, naive, hi):
    assert_close_rule("out", got[0], hi[0], naive[0], 2)
    for i, (g, n, h) in enumerate(zip(got[1], naive[1], hi[1])):
        assert_close_rule(f"grad[{i}]", g, h, n, 3)


def assert_rewritten(records, n=1, **flags):
    assert len(records) == n, [str(r) for r in records]
    for r in records:
        assert r.rewritten, str(r)
        for key, value in flags.items():
            if value is None:
                assert key not in r.flags, str(r)
            else:
                assert r.flags.get(key) == value, str(r)
    for g in records.graphs:
        if g["sites"]:
            assert g["fa2_fwd"] == g["rewritten"]
            if g["kind"] == "training":
                assert g["fa2_bwd"] == g["rewritten"], "backward must use fa2.bwd"


def assert_kept(records, reason: str):
    assert records, "the site was not even found"
    for r in records:
        assert not r.rewritten, str(r)
        assert reason in (r.reason or ""), str(r)
    for g in records.graphs:
        assert g["fa2_fwd"] == 0 and g["fa2_bwd"] == 0


def causal_bool(sq, sk, device):
    return torch.ones(sq, sk, dtype=torch.bool, device=device).tril()


# ---- the forms real code writes ----------------------------------------------------------------------------------

def attn_mul_scale(q, k, v):
    s = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5)
    return s.softmax(-1) @ v


def attn_div_scale(q, k, v):
    s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.size(-1))
    return torch.matmul(F.softmax(s, dim=-1), v)


def attn_no_scale(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v


def attn_scale_on_q(q, k, v):
    q = q * (q.shape[-1] ** -0.5)
    return (q @ k.transpose(-2, -1)).softmax(-1) @ v


def attn_einsum(q, k, v):
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) * 0.25
    return torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v)


def attn_einsum_bshd(q, k, v):
    # inputs (B, S, H, D), einsum in that layout: einsum permutes P to its bmm and back (two permutes that cancel)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * 0.25
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


def attn_bmm_3d(q, k, v):
    b, h, s, d = q.shape
    q3, k3, v3 = (t.reshape(b * h, t.shape[2], d) for t in (q, k, v))
    p = torch.bmm(q3, k3.transpose(1, 2)).mul(d ** -0.5).softmax(-1)
    return torch.bmm(p, v3).view(b, h, s, d)


def attn_bshd_permute(q, k, v):
    # inputs (B, S, H, D): GPT-2-style permutes, K permuted straight to (B, H, D, S)
    qh, vh = q.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)
    kt = k.permute(0, 2, 3, 1)
    out = torch.softmax(qh @ kt * 0.25, dim=-1) @ vh
    return out.permute(0, 2, 1, 3).contiguous()


FORMS = {
    "mul_scale": (attn_mul_scale, {"scale": 0.25}),
    "div_scale": (attn_div_scale, {"scale": 0.25}),
    "no_scale": (attn_no_scale, {"scale": 1.0}),
    "scale_on_q": (attn_scale_on_q, {"scale": 1.0}),
    "einsum": (attn_einsum, {"scale": 0.25}),
    "einsum_bshd": (attn_einsum_bshd, {"scale": 0.25}),
    "bmm_3d": (attn_bmm_3d, {"scale": 0.25}),
    "bshd_permute": (attn_bshd_permute, {"scale": 0.25}),
}


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_three_d_inputs(causal, device, dtype):
    """(H, S, D) inputs (no batch dim) through @: the matmul's views lead the scores back to the bmm's own 3-D shape
    (before, 'the scores are reshaped in a way fa2 cannot follow'); with a causal tril mask too."""
    def attn_3d(q, k, v):
        s = q @ k.transpose(-1, -2) * 0.25
        if causal:
            s = s.masked_fill(~causal_bool(s.shape[-2], s.shape[-1], s.device), float("-inf"))
        return s.softmax(-1) @ v
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(H, S, D, generator=g).to(device=device, dtype=dtype) for _ in range(3))
    records, got, naive, hi = run(attn_3d, (q, k, v), device=device, dtype=dtype)
    assert_rewritten(records, scale=0.25)
    check_numerics(got, naive, hi)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("masked", [False, True])
def test_gqa_through_a_grouped_view_of_q(masked, device, dtype):
    """GQA written as q viewed (B, Hk, G, S, D) against k / v unsqueezed to (B, Hk, 1, S, D): 5-D scores, before
    'reshaped in a way fa2 cannot follow'. Without a mask it is rewritten (heads folded into the batch), forward and
    backward as eager; a causal mask on the 5-D scores becomes the causal flag (a mask that stays a bias is kept:
    fa2 reads 4-D masks)."""
    def attn_grouped(q, k, v):
        b, h, s, d = q.shape
        hk = k.shape[1]
        scores = q.view(b, hk, h // hk, s, d) @ k.unsqueeze(2).transpose(-1, -2) * 0.25
        if masked:
            scores = scores.masked_fill(~causal_bool(s, k.shape[2], q.device), float("-inf"))
        return (scores.softmax(-1) @ v.unsqueeze(2)).reshape(b, h, s, d)
    g = torch.Generator().manual_seed(9)
    q = torch.randn(B, H, S, D, generator=g).to(device=device, dtype=dtype)
    k, v = (torch.randn(B, H // 2, S, D, generator=g).to(device=device, dtype=dtype) for _ in range(2))
    records, got, naive, hi = run(attn_grouped, (q, k, v), device=device, dtype=dtype)
    assert_rewritten(records, scale=0.25, causal=True if masked else None)
    check_numerics(got, naive, hi)


def _attn_3d_plain(q, k, v):
    return (q @ k.transpose(-1, -2) * 0.25).softmax(-1) @ v


def _attn_grouped_plain(q, k, v):
    b, h, s, d = q.shape
    scores = q.view(b, k.shape[1], h // k.shape[1], s, d) @ k.unsqueeze(2).transpose(-1, -2) * 0.25
    return (scores.softmax(-1) @ v.unsqueeze(2)).reshape(b, h, s, d)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("form", [pytest.param("einsum_bshd", marks=pytest.mark.slow), "bmm_3d", "three_d",
                                  pytest.param("grouped", marks=pytest.mark.slow)])
def test_folded_and_permuted_forms_under_dynamic_shapes(form, device, dtype):
    """The forms whose output reaches its consumers through a view with symbolic sizes under dynamic=True (einsum in
    (B, S, H, D), 3-D, grouped-view GQA, explicit bmm): rewritten, forward and backward as eager (the view check of
    the rewritten output once called view() with graph nodes for sizes: 'internal error while rewriting')."""
    g = torch.Generator().manual_seed(10)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    fn, args = {"einsum_bshd": (attn_einsum_bshd, [rand(B, S, H, D) for _ in range(3)]),
                "bmm_3d": (attn_bmm_3d, [rand(B, H, S, D) for _ in range(3)]),
                "three_d": (_attn_3d_plain, [rand(H, S, D) for _ in range(3)]),
                "grouped": (_attn_grouped_plain, [rand(B, H, S, D), rand(B, H // 2, S, D), rand(B, H // 2, S, D)])}[form]
    records, got, naive, hi = run(fn, args, device=device, dtype=dtype, dynamic=True)
    # (bmm_3d's scale, d ** -0.5 of a symbolic d, is computed in the graph: a tensor)
    assert_rewritten(records, **({} if form == "bmm_3d" else {"scale": 0.25}))
    check_numerics(got, naive, hi)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("form", list(FORMS))
def test_matmul_forms(form, device, dtype):
    fn, flags = FORMS[form]
    layout = "bshd" if form in ("bshd_permute", "einsum_bshd") else "bhsd"
    records, got, naive, hi = run(fn, qkv(device, dtype, layout=layout), device=device, dtype=dtype)
    assert_rewritten(records, causal=None, **flags)
    check_numerics(got, naive, hi)


# ---- masks ---------------------------------------------------------------------------------------------------------

def attn_float_mask(q, k, v, mask):
    return (q @ k.transpose(-2, -1) * 0.25 + mask).softmax(-1) @ v


def attn_hf_causal_min_mask(q, k, v):
    # what Hugging Face eager models add: a materialized 0 / dtype-min mask built from arange
    sq, sk = q.shape[2], k.shape[2]
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    mask = torch.where(j <= i, torch.zeros((), dtype=q.dtype, device=q.device), torch.finfo(q.dtype).min)[None, None]
    s = torch.matmul(q, k.transpose(2, 3)) * 0.25 + mask
    return torch.matmul(F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype), v)


def attn_tril_masked_fill(q, k, v):
    sq, sk = q.shape[2], k.shape[2]
    mask = torch.tril(torch.ones(sq, sk, dtype=torch.bool, device=q.device))
    s = (q @ k.transpose(-2, -1) * 0.25).masked_fill(~mask, float("-inf"))
    return s.softmax(-1) @ v


def attn_triu_masked_fill(q, k, v):
    sq, sk = q.shape[2], k.shape[2]
    hidden = torch.triu(torch.ones(sq, sk, device=q.device), diagonal=1).bool()
    s = (q @ k.transpose(-2, -1) * 0.25).masked_fill(hidden, float("-inf"))
    return s.softmax(-1) @ v


def attn_ones_tril_eq0(q, k, v):
    # nanoGPT's spelling: a float tril of ones compared with 0
    sq, sk = q.shape[2], k.shape[2]
    tril = torch.tril(torch.ones(sq, sk, device=q.device)).view(1, 1, sq, sk)
    s = (q @ k.transpose(-2, -1) * 0.25).masked_fill(tril == 0, float("-inf"))
    return F.softmax(s, dim=-1) @ v


def attn_sliding_window_where(q, k, v):
    sq, sk = q.shape[2], k.shape[2]
    i = torch.arange(sq, device=q.device).unsqueeze(-1)
    j = torch.arange(sk, device=q.device).unsqueeze(0)
    keep = (j <= i) & (j > i - 4)
    s = torch.where(keep, q @ k.transpose(-2, -1) * 0.25, float("-inf"))
    return s.softmax(-1) @ v


def attn_min_fill(q, k, v):
    sq, sk = q.shape[2], k.shape[2]
    mask = causal_bool(sq, sk, q.device)
    s = (q @ k.transpose(-2, -1) * 0.25).masked_fill(~mask, torch.finfo(q.dtype).min)
    return s.softmax(-1) @ v


def attn_bool_buffer(q, k, v, mask):
    # a mask from a buffer/input cannot be proven causal: it is passed as attn_bias
    s = (q @ k.transpose(-2, -1) * 0.25).masked_fill(mask == 0, float("-inf"))
    return s.softmax(-1) @ v


def attn_cross_causal(q, k, v):
    # seqlen_q < seqlen_k, mask aligned bottom-right (a decoder chunk after a cache): flags, not a bias
    sq, sk = q.shape[2], k.shape[2]
    i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    s = (q @ k.transpose(-2, -1) * 0.25).masked_fill(j > i, float("-inf"))
    return s.softmax(-1) @ v


MASKS = {
    "hf_causal_min": (attn_hf_causal_min_mask, dict(causal=True)),
    "tril_masked_fill": (attn_tril_masked_fill, dict(causal=True)),
    "triu_masked_fill": (attn_triu_masked_fill, dict(causal=True)),
    "ones_tril_eq0": (attn_ones_tril_eq0, dict(causal=True)),
    "sliding_window_where": (attn_sliding_window_where, dict(causal=True, window_left=3)),
    "min_fill": (attn_min_fill, dict(causal=True)),
}


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("form", list(MASKS))
def test_mask_constructions_become_flags(form, device, dtype):
    fn, flags = MASKS[form]
    records, got, naive, hi = run(fn, qkv(device, dtype), device=device, dtype=dtype)
    assert_rewritten(records, bias=None, **flags)
    check_numerics(got, naive, hi)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_bottom_right_causal_cross(device, dtype):
    records, got, naive, hi = run(attn_cross_causal, qkv(device, dtype, sq=7, sk=19), device=device, dtype=dtype)
    assert_rewritten(records, causal=True, bias=None)
    check_numerics(got, naive, hi)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_top_left_causal_short_queries_stays_a_bias(device, dtype):
    # top-left causal with seqlen_q < seqlen_k hides keys fa2's bottom-right flags cannot: passed as a mask instead
    records, got, naive, hi = run(attn_tril_masked_fill, qkv(device, dtype, sq=7, sk=19), device=device, dtype=dtype)
    assert_rewritten(records, causal=None, bias="bool")
    check_numerics(got, naive, hi)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_additive_padding_mask(device, dtype):
    q, k, v = qkv(device, dtype)
    mask = torch.zeros(B, 1, 1, S, device=device, dtype=dtype)
    mask[1, ..., -4:] = torch.finfo(dtype).min
    records, got, naive, hi = run(attn_float_mask, (q, k, v, mask), device=device, dtype=dtype)
    assert_rewritten(records, bias="float")
    check_numerics(got, naive, hi)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_bool_mask_input(device, dtype):
    q, k, v = qkv(device, dtype)
    mask = causal_bool(S, S, device)[None, None].to(torch.uint8)
    records, got, naive, hi = run(attn_bool_buffer, (q, k, v, mask), device=device, dtype=dtype)
    assert_rewritten(records, causal=None, bias="bool")
    check_numerics(got, naive, hi)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_learned_bias_gets_its_gradient(device, dtype):
    # T5 / ALiBi-like: a bias that is trained; fa2's backward must return its gradient
    q, k, v = qkv(device, dtype)
    bias = torch.randn(1, H, S, S, generator=torch.Generator().manual_seed(3)).to(device)
    records, got, naive, hi = run(attn_float_mask, (q, k, v, bias), device=device, dtype=dtype)
    assert_rewritten(records, bias="float")
    assert len(got[1]) == 4
    check_numerics(got, naive, hi)


# ---- softmax precision, GQA, softcap, dropout ------------------------------------------------------------------------

def attn_fp32_softmax(q, k, v):
    s = torch.matmul(q, k.transpose(2, 3)) * 0.25
    p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v)


def attn_fp32_scores(q, k, v):
    s = torch.matmul(q, k.transpose(2, 3)).float() * 0.25
    return torch.matmul(s.softmax(-1).type_as(v), v)


def repeat_kv(x, n):
    b, hk, s, d = x.shape
    return x[:, :, None, :, :].expand(b, hk, n, s, d).reshape(b, hk * n, s, d)


def attn_gqa_repeat_kv(q, k, v):
    n = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n), repeat_kv(v, n)
    return (q @ k.transpose(2, 3) * 0.25).softmax(-1) @ v


def attn_gqa_repeat_interleave(q, k, v):
    n = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n, dim=1), v.repeat_interleave(n, dim=1)
    return (q @ k.transpose(2, 3) * 0.25).softmax(-1) @ v


def attn_mqa_broadcast(q, k, v):
    # k, v (B, 1, S, D): matmul broadcasting over heads
    return (q @ k.transpose(-2, -1) * 0.25).softmax(-1) @ v


def attn_softcap(q, k, v):
    s = torch.matmul(q, k.transpose(2, 3)) * 0.25
    s = s / 5.0
    s = torch.tanh(s)
    s = s * 5.0
    return torch.matmul(F.softmax(s, dim=-1), v)


def attn_dropout_p0_train(q, k, v):
    p = F.dropout((q @ k.transpose(-2, -1) * 0.25).softmax(-1), p=0.0, training=True)
    return p @ v


def attn_dropout_eval(q, k, v):
    p = F.dropout((q @ k.transpose(-2, -1) * 0.25).softmax(-1), p=0.3, training=False)
    return p @ v


OTHER = {
    "fp32_softmax_downcast": (attn_fp32_softmax, {}, {}),
    "fp32_scores": (attn_fp32_scores, {}, {}),
    "gqa_repeat_kv": (attn_gqa_repeat_kv, {"hk": 2}, {"gqa": "4/2"}),
    "gqa_repeat_interleave": (attn_gqa_repeat_interleave, {"hk": 2}, {"gqa": "4/2"}),
    "mqa_broadcast": (attn_mqa_broadcast, {"hk": 1}, {"gqa": "4/1"}),
    "softcap": (attn_softcap, {}, {"softcap": 5.0, "scale": 0.25}),
    "dropout_p0_train": (attn_dropout_p0_train, {}, {}),
    "dropout_eval": (attn_dropout_eval, {}, {}),
}


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("form", list(OTHER))
def test_other_forms(form, device, dtype):
    fn, shape, flags = OTHER[form]
    records, got, naive, hi = run(fn, qkv(device, dtype, **shape), device=device, dtype=dtype)
    assert_rewritten(records, **flags)
    check_numerics(got, naive, hi)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_inference_graph(device, dtype):
    records, got, naive, hi = run(attn_gqa_repeat_kv, qkv(device, dtype, hk=2), device=device, dtype=dtype,
                                  train=False)
    assert_rewritten(records, gqa="4/2")
    assert records[0].graph == "inference"
    check_numerics(got, naive, hi)


# ---- masks that are compile-time constants (masks.constant_band) ---------------------------------------------------

def _packed_sequence_ids(n, device):
    # Hugging Face's packed-sequence check on position ids: a new sequence wherever a position does not follow the
    # previous one; positions 0..n-1 are one sequence (ids all 0), but reaching that takes diff / cumsum / index, which
    # the symbolic interpreter does not model: the mask is only known as a constant of the graph
    pos = torch.arange(n, device=device)[None]
    diff = torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1)
    return (diff != 1).cumsum(-1)[0]


def attn_hf_packed_causal(q, k, v):
    sq, sk = q.shape[2], k.shape[2]
    ids = _packed_sequence_ids(sk, q.device)
    i = torch.arange(sq, device=q.device)
    j = torch.arange(sk, device=q.device)
    keep = (j[None, :] <= i[:, None]) & (ids[i][:, None] == ids[j][None, :])
    mask = torch.where(keep, torch.zeros((), dtype=q.dtype, device=q.device), torch.finfo(q.dtype).min)
    s = q @ k.transpose(-2, -1) * 0.25 + mask[None, None].expand(q.shape[0], 1, sq, sk)
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


def attn_cumsum_window(q, k, v):
    # a sliding window (3 keys back) whose bounds come through cumsum: masked_fill with a constant bool mask
    sq, sk = q.shape[2], k.shape[2]
    i = torch.ones(sq, dtype=torch.long, device=q.device).cumsum(0) - 1
    j = torch.ones(sk, dtype=torch.long, device=q.device).cumsum(0) - 1
    hidden = (j[None, :] > i[:, None]) | (j[None, :] < i[:, None] - 3)
    s = (q @ k.transpose(-2, -1) * 0.25).masked_fill(hidden, float("-inf"))
    return s.softmax(-1) @ v


def attn_constant_not_a_band(q, k, v):
    # a constant pattern that is no band (every third key of each row hidden, through cumsum): stays a bias
    sq, sk = q.shape[2], k.shape[2]
    i = torch.ones(sq, dtype=torch.long, device=q.device).cumsum(0)
    j = torch.ones(sk, dtype=torch.long, device=q.device).cumsum(0)
    keep = (i[:, None] + j[None, :]) % 3 != 0
    s = (q @ k.transpose(-2, -1) * 0.25).masked_fill(~keep, float("-inf"))
    return s.softmax(-1) @ v


def attn_random_keep_all(q, k, v):
    # drawn at run time: never evaluated at compile time, even though this one keeps every key
    sq, sk = q.shape[2], k.shape[2]
    keep = torch.rand(sq, sk, device=q.device) >= 0
    s = (q @ k.transpose(-2, -1) * 0.25).masked_fill(~keep, float("-inf"))
    return s.softmax(-1) @ v


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_constant_masks_become_flags(device, dtype, train):
    """A mask that depends on no input and no random op is a constant of the graph: where the symbolic interpreter
    cannot follow it (Hugging Face's inference graphs check packed sequences through diff / cumsum / index), its
    values are evaluated at compile time and matched exactly against a band."""
    for fn, flags in [(attn_hf_packed_causal, dict(causal=True)),
                      (attn_cumsum_window, dict(causal=True, window_left=3))]:
        records, got, naive, hi = run(fn, qkv(device, dtype), device=device, dtype=dtype, train=train)
        assert_rewritten(records, bias=None, note="mask recognized from its compile-time value", **flags)
        check_numerics(got, naive, hi)


@torch.library.custom_op("fa2_test::state_mask", mutates_args=())
def _state_mask(n: int) -> torch.Tensor:
    # a custom op with no tensor input may read state that changes between calls: never a compile-time constant
    return torch.ones(n, n, dtype=torch.bool).tril()


@_state_mask.register_fake
def _(n):
    return torch.empty(n, n, dtype=torch.bool)


def attn_custom_op_mask(q, k, v):
    keep = torch.ops.fa2_test.state_mask(q.shape[2]).to(q.device)
    s = (q @ k.transpose(-2, -1) * 0.25).masked_fill(~keep, float("-inf"))
    return s.softmax(-1) @ v


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_constant_masks_that_are_no_band_or_random_stay_a_bias(device, dtype):
    for fn, backend in [(attn_constant_not_a_band, "fa2_eager"), (attn_random_keep_all, "fa2_eager"),
                        (attn_random_keep_all, "fa2"),  # (Inductor replaces rand by its own random prims)
                        (attn_custom_op_mask, "fa2_eager")]:
        records, got, naive, hi = run(fn, qkv(device, dtype), device=device, dtype=dtype, train=False, backend=backend)
        assert_rewritten(records, causal=None, bias="bool")
        if fn is not attn_random_keep_all:
            check_numerics(got, naive, hi)


def test_constant_band_checks_values_exactly():
    """masks.constant_band's value check on its own: a 0 / hide mask is a band only when its kept entries are exactly
    one diagonal band, the same in every batch / head slice; finite hiding values are reported."""
    import sympy
    from fa2.inductor.masks import _band_of_values
    sq, sk = 5, 7
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    causal = j <= i + (sk - sq)
    band = _band_of_values(causal, sq, sk, True)
    assert band.lo is None and band.hi == sympy.Integer(sk - sq) and not band.finite_fill
    fmin = torch.finfo(torch.float32).min
    band = _band_of_values(torch.where(causal, 0.0, fmin), sq, sk, True)
    assert band.hi == sk - sq and band.finite_fill
    assert _band_of_values(torch.where(causal, 0.0, -1.0), sq, sk, True) is None  # -1 does not hide a key
    half_min = torch.where(causal, 0.0, torch.finfo(torch.float16).min).half()  # fp16's own minimum hides
    assert _band_of_values(half_min, sq, sk, True).finite_fill
    assert _band_of_values(torch.where(causal, 0.5, float("-inf")), sq, sk, True) is None  # 0.5 is a bias
    per_batch = torch.stack([causal, causal & (j >= 1)])
    assert _band_of_values(per_batch, sq, sk, True) is None  # batch-dependent
    holes = causal.clone()
    holes[3, 1] = False
    assert _band_of_values(holes, sq, sk, True) is None  # not contiguous
    band = _band_of_values(~causal, sq, sk, False)  # the hidden entries given, keep_if_true=False
    assert band.hi == sk - sq
    key_padding = torch.zeros(1, 1, 1, sk)
    key_padding[..., -2:] = float("-inf")
    assert _band_of_values(key_padding, sq, sk, True) is None  # the same keys hidden for every row: no band
    everything = _band_of_values(torch.zeros(1, 1, 1, sk), sq, sk, True)  # broadcast rows, nothing hidden
    assert everything.lo is None and everything.hi is None
    window = (j <= i + (sk - sq)) & (j >= i + (sk - sq) - 2)
    band = _band_of_values(window, sq, sk, True)
    assert band.lo == sk - sq - 2 and band.hi == sk - sq


# ---- scaled_dot_product_attention ---------------------------------------------------------------------------------

def sdpa_plain(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sdpa_causal_mask(q, k, v):
    mask = causal_bool(q.shape[2], k.shape[2], q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)


def sdpa_gqa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


SDPA = {
    "plain": (sdpa_plain, {}, {"causal": None}),
    "is_causal": (sdpa_causal, {}, {"causal": "top-left"}),
    "is_causal_short_queries": (sdpa_causal, {"sq": 5, "sk": 13}, {"causal": "top-left"}),
    "bool_mask_causal": (sdpa_causal_mask, {}, {"causal": True, "scale": 0.3, "bias": None}),
    "gqa": (sdpa_gqa, {"hk": 2}, {"causal": "top-left"}),
}


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("form", list(SDPA))
def test_sdpa_calls(form, device, dtype):
    fn, shape, flags = SDPA[form]
    if device == "cuda" and form == "bool_mask_causal":
        # CUDA's memory-efficient SDPA preprocesses the mask (padding it for alignment) in a way the causal proof
        # does not follow yet: the mask is passed to fa2 as it is (exact, without the causal block skipping)
        flags = {"scale": 0.3}
    records, got, naive, hi = run(fn, qkv(device, dtype, **shape), device=device, dtype=dtype)
    assert_rewritten(records, **flags)
    assert all(r.kind == "sdpa" for r in records)
    check_numerics(got, naive, hi)


# ---- negative tests: nothing may change ------------------------------------------------------------------------

def attn_dropout_active(q, k, v):
    p = F.dropout((q @ k.transpose(-2, -1) * 0.25).softmax(-1), p=0.5, training=True)
    return p @ v


def attn_returns_probs(q, k, v):
    p = (q @ k.transpose(-2, -1) * 0.25).softmax(-1)
    return torch.cat([(p @ v).flatten(), p.flatten()])


def attn_finite_fill(q, k, v):
    mask = causal_bool(q.shape[2], k.shape[2], q.device)
    return (q @ k.transpose(-2, -1) * 0.25).masked_fill(~mask, -1e4).softmax(-1) @ v


def attn_softmax_dim2(q, k, v):
    return (q @ k.transpose(-2, -1) * 0.25).softmax(-2) @ v


def attn_tensor_temperature(q, k, v, t):
    return (q @ k.transpose(-2, -1) * t).softmax(-1) @ v


def attn_rel_pos_matmul(q, k, v, r):
    s = q @ k.transpose(-2, -1) + q @ r.transpose(-2, -1)
    return (s * 0.25).softmax(-1) @ v


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES[:2])
def test_dropout_active_becomes_fa2_dropout(device, dtype):
    """(was a negative test before fa2 had dropout: tests/test_inductor_dropout.py checks the statistics)"""
    torch.manual_seed(0)
    records, *_ = run(attn_dropout_active, qkv(device, dtype), device=device, dtype=dtype)
    assert_rewritten(records, dropout_p=0.5)


NEGATIVE = {
    "returns_probs": (attn_returns_probs, (), "also used elsewhere"),
    "finite_fill": (attn_finite_fill, (), "masked_fill/where with value -10000"),
    "trained_temperature": (attn_tensor_temperature, ("scalar",), "used elsewhere in the backward"),
    "per_head_scale": (attn_tensor_temperature, ("per_head",), "multiplied by a tensor"),
    "relative_position_matmul": (attn_rel_pos_matmul, ("rel",), "two matmul terms"),
}


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES[:2])
@pytest.mark.parametrize("form", list(NEGATIVE))
def test_negative_not_rewritten(form, device, dtype):
    fn, extras, reason = NEGATIVE[form]
    args = list(qkv(device, dtype))
    g = torch.Generator().manual_seed(5)
    for extra in extras:
        if extra == "bias":
            args.append(torch.randn(1, H, S, S, generator=g).to(device=device, dtype=dtype))
        elif extra == "scalar":
            args.append(torch.tensor(0.25, device=device, dtype=dtype))
        elif extra == "per_head":
            args.append(torch.rand(1, H, 1, 1, generator=g).to(device=device, dtype=dtype))
        else:
            args.append(torch.randn(B, H, S, D, generator=g).to(device=device, dtype=dtype))
    records, got, naive, hi = run(fn, args, device=device, dtype=dtype)
    assert_kept(records, reason)
    check_numerics(got, naive, hi)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_runtime_scalar_scale(device, dtype):
    # a scale held in a 0-d tensor (what dynamic=True makes of a Python float attribute): applied to q
    q, k, v = qkv(device, dtype)
    t = torch.tensor(0.3, dtype=torch.float64, device=device)
    records, got, naive, hi = run(attn_tensor_temperature, (q, k, v, t), device=device, dtype=dtype, frozen=(3,))
    assert_rewritten(records, scale="tensor")
    check_numerics(got, naive, hi)


def test_negative_softmax_not_over_keys():
    records, *_ = run(attn_softmax_dim2, qkv("cpu", torch.float32), device="cpu", dtype=torch.float32)
    assert all(not r.rewritten for r in records)
    assert all(g["fa2_fwd"] == 0 for g in records.graphs)


def test_negative_headdim_too_large():
    records, *_ = run(attn_mul_scale, qkv("cpu", torch.float32, d=264), device="cpu", dtype=torch.float32)
    assert_kept(records, "head dim 264 > 256")


def test_repeat_tiles_heads_is_not_gqa():
    # k.repeat(1, n, 1, 1) maps head h to kv head h % Hk (not fa2's h // n): bound after the repeat, still exact
    def fn(q, k, v):
        k, v = k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1)
        return (q @ k.transpose(-2, -1) * 0.25).softmax(-1) @ v
    records, got, naive, hi = run(fn, qkv("cpu", torch.float32, hk=2), device="cpu", dtype=torch.float32)
    assert_rewritten(records, gqa=None)
    check_numerics(got, naive, hi)


# ---- the pass itself ------------------------------------------------------------------------------------------------

def test_dynamic_shapes_rewrite_without_recompiles():
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(attn_tril_masked_fill, backend="fa2_eager", dynamic=True)
    with recording() as records, without_aot_cache():
        for seqlen in (13, 21, 34):
            q, k, v = qkv("cpu", torch.float32, sq=seqlen, sk=seqlen)
            torch.testing.assert_close(compiled(q, k, v), attn_tril_masked_fill(q, k, v), atol=2e-6, rtol=1e-5)
    assert_rewritten(records, causal=True, bias=None)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_pass_is_idempotent_and_has_a_uuid():
    from fa2.inductor import get_pass
    from fa2.inductor.graph_pass import rewrite_attention
    from fa2.inductor._compat import make_fx_trace
    q, k, v = qkv("cpu", torch.float32)
    gm = make_fx_trace(attn_tril_masked_fill, [q, k, v])
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    FakeTensorProp(gm, FakeTensorMode()).propagate(q, k, v)
    first = rewrite_attention(gm.graph)
    assert [s.rewritten for s in first] == [True]
    code = gm.graph.python_code("self").src
    assert rewrite_attention(gm.graph) == []
    assert gm.graph.python_code("self").src == code
    uuid = get_pass().uuid()
    assert isinstance(uuid, str) and len(uuid) == 64 and uuid == get_pass().uuid()


def test_install_uninstall():
    import torch._inductor.config as config
    from fa2.inductor import installed
    before = config.joint_custom_pre_pass
    try:
        fa2.install()
        fa2.install()
        assert installed()
        fa2.uninstall()
        assert not installed() and config.joint_custom_pre_pass is before
    finally:
        config.joint_custom_pre_pass = before


def test_backend_registered_by_name():
    from torch._dynamo.backends.registry import lookup_backend
    assert lookup_backend("fa2") is fa2.backend.fa2_backend


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_inductor_backend(device, dtype):
    """The real thing: backend="fa2" (Inductor code generation), training, GQA + causal from arange."""
    def fn(q, k, v):
        return attn_hf_causal_min_mask(q, repeat_kv(k, 2), repeat_kv(v, 2))
    records, got, naive, hi = run(fn, qkv(device, dtype, hk=2), device=device, dtype=dtype, backend="fa2")
    assert_rewritten(records, causal=True, gqa="4/2", bias=None)
    check_numerics(got, naive, hi)


def test_install_rewrites_default_compile():
    import torch._inductor.config as config
    before = config.joint_custom_pre_pass
    try:
        fa2.install()
        records, got, naive, hi = run(attn_softcap, qkv("cpu", torch.float32), device="cpu", dtype=torch.float32,
                                      backend="inductor", train=False)
        assert_rewritten(records, softcap=5.0)
    finally:
        fa2.uninstall()
        config.joint_custom_pre_pass = before


# ---- finite fills over rows that see no key: eager averages such a row uniformly and passes no gradient to its
#      scores (where / masked_fill); the rewrite must do both, also when several masks hide the same key ----------

def attn_two_finite_fills(q, k, v, keep):
    s = q @ k.transpose(-2, -1) * D**-0.5
    tril = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).tril()
    s = s.masked_fill(~tril, torch.finfo(s.dtype).min).masked_fill(~keep, torch.finfo(s.dtype).min)
    return s.softmax(-1) @ v


def attn_finite_fill_input(q, k, v, keep):
    s = (q @ k.transpose(-2, -1) * D**-0.5).masked_fill(~keep, torch.finfo(q.dtype).min)
    return s.softmax(-1) @ v


def attn_gpt2_where_plus_padding(q, k, v, attention_mask):
    # GPT-2 (eager): where(causal, scores, min) + (1 - attention_mask) * min; hidden by both -> -inf, as in eager
    s = q @ k.transpose(-2, -1) * D**-0.5
    causal = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).tril()
    mask_value = torch.finfo(s.dtype).min
    s = torch.where(causal, s, torch.full([], mask_value, dtype=s.dtype, device=s.device))
    s = s + (1.0 - attention_mask[:, None, None, :].to(s.dtype)) * mask_value
    # (the padded query rows' outputs are not used, as in a model whose loss skips padding: eager differentiates
    # such a row, which sees no key, through the scores where() kept (its padded keys) and not the ones it hid, an
    # additive bias through all of them; only with a zero output gradient there are the two the same)
    return (s.softmax(-1) @ v) * attention_mask[:, None, :, None].to(v.dtype)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES + [pytest.param("cpu", torch.float64, id="cpu-float64")])
def test_finite_fills_over_rows_that_see_no_key(device, dtype):
    q, k, v = qkv(device, dtype)
    keep = torch.ones(B, 1, 1, S, dtype=torch.bool, device=device)
    keep[0, ..., :6] = False  # left padding: causal rows 0-5 of batch 0 see no key
    records, got, naive, hi = run(attn_two_finite_fills, (q, k, v, keep), device=device, dtype=dtype)
    assert_rewritten(records)
    check_numerics(got, naive, hi)

    rows = torch.ones(B, 1, S, S, dtype=torch.bool, device=device)
    rows[0, :, 2:7] = False  # whole rows hidden by a data-dependent mask
    rows[1, :, :, -3:] = False
    records, got, naive, hi = run(attn_finite_fill_input, (q, k, v, rows), device=device, dtype=dtype)
    assert_rewritten(records)
    check_numerics(got, naive, hi)

    am = torch.ones(B, S, device=device)
    am[0, :5] = 0
    records, got, naive, hi = run(attn_gpt2_where_plus_padding, (q, k, v, am), device=device, dtype=dtype,
                                  frozen=(3,))
    assert_rewritten(records)
    check_numerics(got, naive, hi)


def attn_chained(q, k, v):
    # one attention's output is the next one's query (the pass rewrites site by site, searching the graph again)
    a = (q @ k.transpose(-1, -2) * D**-0.5).softmax(-1) @ v
    return (a @ k.transpose(-1, -2) * 0.1).softmax(-1) @ v


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("train", [True, False])
def test_attention_output_feeds_the_next_attention(device, dtype, train):
    q, k, v = qkv(device, dtype)
    records, got, naive, hi = run(attn_chained, (q, k, v), device=device, dtype=dtype, train=train)
    assert_rewritten(records, n=2)
    check_numerics(got, naive, hi)


def attn_residual_loop(x, w):
    # self-attention over a residual stream: each layer's k = v = x, and the next layer views the stream
    for i in range(3):
        q = torch.nn.functional.linear(x, w[i])
        x = x + (q @ x.transpose(-1, -2) * D**-0.5).softmax(-1) @ x
    return x


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_residual_self_attention_loop(device, dtype):
    x = torch.randn(B, H, S, D, generator=torch.Generator().manual_seed(4)).to(device=device, dtype=dtype)
    w = (torch.randn(3, D, D, generator=torch.Generator().manual_seed(5)) * D**-0.5).to(device=device, dtype=dtype)
    records, got, naive, hi = run(attn_residual_loop, (x, w), device=device, dtype=dtype)
    assert_rewritten(records, n=3)
    check_numerics(got, naive, hi)


def test_explain_reports_the_sites_every_time():
    """fa2.explain compiles with backend="fa2" and reports each site; asked again (or after the model was compiled)
    it still does: Dynamo would otherwise reuse the graph it compiled for the same code and backend."""
    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            return (q @ k.transpose(-1, -2) * 0.25).softmax(-1) @ v

    model, x = Attn(), torch.randn(1, 2, 8, 16)
    torch._dynamo.reset()
    first = fa2.explain(model, x, x, x)
    again = fa2.explain(model, x, x, x)
    torch.compile(model, backend="fa2")(x, x, x)
    after_compile = fa2.explain(model, x, x, x)
    for records in (first, again, after_compile):
        assert len(records) == 1 and records[0].rewritten, [str(r) for r in records]
        assert records[0].flags.get("scale") == 0.25


@pytest.mark.slow  # (explain: test_explain_reports_the_sites_every_time in the quick run)
def test_explain_many_times_keeps_reporting_and_leaves_no_cache_entries():
    """fa2.explain compiles through a caller of its own (a fresh code object each call) and drops the entries it made
    on the model's own frames (a graph break): explaining one model more often than Dynamo's recompile limit (8)
    still reports its sites every time, under the module's own path, and leaves no compiled entries on the model's
    code (before, the 9th explain ran eagerly and found nothing). Module paths are those of compiling the model itself,
    for a module, a bound method, a compiled module or a function taking the module."""
    import contextlib
    import io

    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    class Inner(torch.nn.Module):
        def forward(self, q, k, v):
            return (q @ k.transpose(-1, -2) * 0.25).softmax(-1) @ v

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = Inner()

        def forward(self, x):
            return self.attn(x, x, x)

    class WithBreak(torch.nn.Module):  # Dynamo compiles this forward's own frames around the break
        def __init__(self):
            super().__init__()
            self.a, self.b = Inner(), Inner()

        def forward(self, x):
            y = self.a(x, x, x)
            torch._dynamo.graph_break()
            return self.b(y, y, y)

    def quiet(*args, **kwargs):
        with contextlib.redirect_stdout(io.StringIO()):
            return fa2.explain(*args, **kwargs)

    model, x = Outer(), torch.randn(1, 2, 8, 16)
    torch._dynamo.reset()
    for _ in range(torch._dynamo.config.recompile_limit + 3):
        records = quiet(model, x)
        assert len(records) == 1 and records[0].rewritten, [str(r) for r in records]
        assert records[0].module == "attn", records[0].module
        records = quiet(WithBreak(), x)
        assert [(r.module, r.rewritten) for r in records] == [("a", True), ("b", True)], [str(r) for r in records]
    for code in (Outer.forward.__code__, Inner.forward.__code__, WithBreak.forward.__code__):
        assert not _debug_get_cache_entry_list(code)
    # the module paths Dynamo gives when the model itself is compiled, whatever form it is passed in
    def call_module(mod, t):
        return mod(t)
    assert [r.module for r in quiet(model.forward, x)] == ["attn"]
    assert [r.module for r in quiet(torch.compile(model), x)] == ["attn"]
    assert [r.module for r in quiet(call_module, model, x)] == ["L['mod'].attn"]
    assert [r.module for r in quiet(call_module, mod=model, t=x)] == ["L['mod'].attn"]
    # callers the signature mirroring must not break: a functools.wraps wrapper with its own signature, a keyword
    # argument named self, a bound method reached under another name
    import functools

    def wrapper(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            return fn(*args, **kwargs)
        return inner

    def takes_self(t, **kw):
        return model(t) * kw["self"]

    class Mangled(Outer):
        def __run(self, t):
            return self.attn(t, t, t)

        def entry(self):
            return self.__run

    for args, kwargs in [((wrapper(call_module), model, x), {}), ((takes_self, x), {"self": 2.0}),
                         ((Mangled().entry(), x), {})]:
        records = quiet(*args, **kwargs)
        assert len(records) == 1 and records[0].rewritten, [str(r) for r in records]


def test_unknown_inductor_option_is_named():
    torch._dynamo.reset()
    q = torch.randn(1, 2, 8, 16)
    compiled = torch.compile(attn_mul_scale, backend="fa2", options={"max_autotun": True})
    with pytest.raises(Exception, match="unexpected optimization option 'max_autotun'"):
        compiled(q, q, q)


def attn_fill_then_inf_causal(q, k, v, keep):
    s = (q @ k.transpose(-2, -1) * D**-0.5).masked_fill(~keep, torch.finfo(q.dtype).min)  # padding: finite fill
    tril = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).tril()
    return s.masked_fill(~tril, float("-inf")).softmax(-1) @ v  # causal: -inf (becomes the causal flag)


def attn_fill_then_alibi(q, k, v, keep, alibi):
    s = (q @ k.transpose(-2, -1) * D**-0.5).masked_fill(~keep, torch.finfo(q.dtype).min)
    return (s + alibi).softmax(-1) @ v


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES + [pytest.param("cpu", torch.float64, id="cpu-float64"),
                                                          pytest.param("cpu", torch.float16, id="cpu-float16")])
def test_finite_fill_with_other_masks_over_rows_that_see_no_key(device, dtype):
    """A row that the fill and the causal flag (or an additive term) leave without a key: its q gets no gradient, as
    in eager; a float16 fill stays float16 so that an added ALiBi term rounds into it as in eager (uniform row)."""
    q, k, v = qkv(device, dtype)
    keep = torch.ones(B, 1, 1, S, dtype=torch.bool, device=device)
    keep[0, ..., :4] = False  # causal rows 0-3 of batch 0 see only padding
    records, got, naive, hi = run(attn_fill_then_inf_causal, (q, k, v, keep), device=device, dtype=dtype)
    assert_rewritten(records, causal=True)
    check_numerics(got, naive, hi)
    rows = torch.ones(B, 1, S, S, dtype=torch.bool, device=device)
    rows[0, :, 2] = False
    alibi = (-torch.arange(S, dtype=torch.float32)).expand(1, H, S, S).to(device=device, dtype=dtype)
    records, got, naive, hi = run(attn_fill_then_alibi, (q, k, v, rows, alibi), device=device, dtype=dtype,
                                  frozen=(4,))
    assert_rewritten(records)
    check_numerics(got, naive, hi)


@pytest.mark.slow
def test_fused_encoder_fast_path_is_reported_and_can_be_exposed():
    """nn.TransformerEncoderLayer in eval mode runs PyTorch's fused fast path (one aten op for the layer): explain
    lists it as kept, saying how to expose it; with the fast path off its attention is rewritten and matches."""
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
    x = torch.randn(3, 6, 16)
    before = torch.backends.mha.get_fastpath_enabled()
    try:
        torch._dynamo.reset()
        with torch.no_grad():
            records = fa2.explain(layer, x)
        assert len(records) == 1 and not records[0].rewritten and "set_fastpath_enabled(False)" in records[0].reason
        torch.backends.mha.set_fastpath_enabled(False)
        torch._dynamo.reset()
        with torch.no_grad():
            records = fa2.explain(layer, x)
            got = torch.compile(layer, backend="fa2")(x)
        assert len(records) == 1 and records[0].rewritten, [str(r) for r in records]
        torch.testing.assert_close(got, layer(x))
    finally:
        torch.backends.mha.set_fastpath_enabled(before)
