"""fa2's ops against the reference math: forward, backward, lse, every flag, CPU and CUDA."""
from __future__ import annotations

import math

import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fa2
from fa2.reference import attention_ref
from kernels import cuda_kernel_names, is_ws_key_row_kernel, switch
from numerics import assert_close_rule, hi_dtype
from samples import SHARES, devices, dtypes_for, in_share, make_qkv, sample_inputs, share_of

# fp64 on the CPU as well: its gradients must be fp64-accurate, although lse is float32 (the CPU backward
# recomputes each row's statistics in fp64)
DEVICE_DTYPES = [(d, t) for d in devices() for t in dtypes_for(d)] + [("cpu", torch.float64)]
IDS = [f"{d}-{str(t).split('.')[-1]}" for d, t in DEVICE_DTYPES]


def _refs(sample, **extra):
    """(ref_hi, ref_naive) outputs (and lse for ref_hi) of a sample."""
    hi = hi_dtype(sample.q.dtype)
    kw = dict(sample.kwargs)
    bias = kw.pop("attn_bias", None)
    up = lambda t: None if t is None else (t.detach().to(hi) if t.dtype != torch.bool else t)  # noqa: E731
    out_hi, lse_hi = attention_ref(up(sample.q), up(sample.k), up(sample.v), up(bias), return_lse=True, **kw)
    out_naive = attention_ref(sample.q.detach(), sample.k.detach(), sample.v.detach(),
                              None if bias is None else bias.detach(), upcast=False, **kw)
    return out_hi, lse_hi, out_naive


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES, ids=IDS)
def test_forward_matches_reference(device, dtype, share):
    for s in share_of(sample_inputs(device, dtype, full=(device == "cuda")), share):
        out, lse = torch.ops.fa2.fwd(*s.args())
        assert out.shape == s.q.shape[:-1] + s.v.shape[-1:] and out.dtype == dtype and out.is_contiguous(), s
        assert lse.shape == (s.q.shape[0], s.q.shape[2], s.q.shape[1]) and lse.dtype == torch.float32, s
        out_hi, lse_hi, out_naive = _refs(s)
        assert_close_rule(f"out {s}", out, out_hi, out_naive, factor=2)
        finite = torch.isfinite(lse_hi)
        assert torch.equal(torch.isfinite(lse), finite), f"lse: rows that see no key must be +inf ({s})"
        assert (lse[~finite] == math.inf).all(), s
        lse_tol = 1e-3 if dtype in (torch.float16, torch.bfloat16) else 1e-5
        assert torch.allclose(lse[finite], lse_hi[finite].float(), atol=lse_tol, rtol=lse_tol), s


@pytest.mark.parametrize("bf16_gemm", [True, False], ids=["bf16-products", "fp32-products"])
def test_cpu_bf16_forward_follows_the_rule_on_both_product_paths(bf16_gemm):
    """The CPU bf16 forward's tile products on bf16 operands (MKL's gemm_bf16bf16f32 where the CPU has AMX, our own
    AVX512-BF16 ones where it has only that: P rounded to bf16 for P V) and on fp32-converted tiles (sgemm): both
    within the rule on every sample (flags, biases, layouts), and on a row whose scores jump by more than 80 from one
    512-key tile to the next (the forward recomputes that row's scores, a one-row product). Where the bf16 products
    are supported the two paths round differently, so their outputs differ: the switch reached the kernel."""
    supported = fa2._C.cpu_bf16_gemm_supported()
    if bf16_gemm and not supported:
        pytest.skip("no bf16 tile products here (AMX / AVX512-BF16, or MKL's gemm_bf16bf16f32 on AMX, missing)")
    samples = sample_inputs("cpu", torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    d, sk = 64, 1100
    q = 0.02 * torch.randn(1, 40, 2, d, generator=gen)
    k = 0.02 * torch.randn(1, sk, 2, d, generator=gen)
    q[..., 0] = 1.0
    k[:, 512:, :, 0] = 100.0 * d ** 0.5  # keys of the second tile score ~100 above the first's
    v = torch.randn(1, sk, 2, d, generator=gen)
    jump = [t.to(torch.bfloat16) for t in (q, k, v)]
    outs = []
    with switch("cpu_bf16_gemm", bf16_gemm):
        assert fa2.dev.options()["cpu_bf16_gemm"] == bf16_gemm
        for s in samples:
            out, _ = torch.ops.fa2.fwd(*s.args())
            out_hi, _, out_naive = _refs(s)
            assert_close_rule(f"out {s}", out, out_hi, out_naive, factor=2)
            outs.append(out)
        out, lse = torch.ops.fa2.fwd(*jump, None, None, False, -1, -1, 0.0)
    out_hi, lse_hi = attention_ref(*(t.double() for t in jump), return_lse=True)
    assert_close_rule("out (score jump > 80)", out, out_hi, attention_ref(*jump, upcast=False), factor=2)
    assert torch.allclose(lse, lse_hi.float(), atol=1e-3, rtol=1e-3)
    if supported:
        with switch("cpu_bf16_gemm", not bf16_gemm):
            others = [torch.ops.fa2.fwd(*s.args())[0] for s in samples]
        assert any(not torch.equal(a, b) for a, b in zip(outs, others)), "both switch settings gave the same bits"


@pytest.mark.parametrize("headdim,seqlen_q,seqlen_k", [(1, 1, 1), (7, 9, 31), (33, 17, 100), (64, 9, 513),
                                                       (96, 130, 47), (128, 8, 1)])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_cpu_bf16_products_at_ragged_tile_edges(headdim, seqlen_q, seqlen_k, layout):
    """The CPU bf16 tile products (bf16_dot.h's AVX512-BF16 ones where the CPU has no AMX, else MKL's) at shapes whose
    tiles end inside a micro tile: an odd headdim (the last bf16 pair of Q K^T holds one element), seqlen_k not a
    multiple of 16 or 32 (Q K^T's packed columns, P V's odd pair), fewer query rows than a micro tile, and rows read
    through a transposed view (leading dims other than headdim). Forward and backward (whose five products take
    P, dS and their transposes rounded to bf16), on both switch settings: within the rule against fp64, and the
    forward close to the fp32 products of the same inputs."""
    if not fa2._C.cpu_bf16_gemm_supported():
        pytest.skip("no bf16 tile products here (AMX / AVX512-BF16, or MKL's gemm_bf16bf16f32 on AMX, missing)")
    gen = torch.Generator().manual_seed(headdim * 1000 + seqlen_k)
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, 3, 3, headdim, dtype=torch.bfloat16, device="cpu", layout=layout,
                       generator=gen, requires_grad=True)
    dout = torch.randn(q.shape, generator=gen).to(torch.bfloat16)
    for causal in (False, True):
        leaf_hi = [t.detach().double().requires_grad_() for t in (q, k, v)]
        grads_hi = torch.autograd.grad(attention_ref(*leaf_hi, causal=causal), leaf_hi, dout.double())
        leaf_lo = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        grads_lo = torch.autograd.grad(attention_ref(*leaf_lo, causal=causal, upcast=False), leaf_lo, dout)
        for products in (True, False):
            with switch("cpu_bf16_gemm", products):
                grads = torch.autograd.grad(fa2.attention(q, k, v, causal=causal), (q, k, v), dout)
            for name, g, g_hi, g_lo in zip(("dq", "dk", "dv"), grads, grads_hi, grads_lo):
                assert_close_rule(f"{name} d{headdim} sq{seqlen_q} sk{seqlen_k} {layout} causal={causal} "
                                  f"bf16 products {products}", g, g_hi, g_lo, factor=3)
        with switch("cpu_bf16_gemm", True):
            out, lse = torch.ops.fa2.fwd(q.detach(), k.detach(), v.detach(), None, None, causal, -1, -1, 0.0)
        with switch("cpu_bf16_gemm", False):
            out_fp32, _ = torch.ops.fa2.fwd(q.detach(), k.detach(), v.detach(), None, None, causal, -1, -1, 0.0)
        out_hi, lse_hi = attention_ref(*leaf_hi, causal=causal, return_lse=True)
        naive = attention_ref(q.detach(), k.detach(), v.detach(), causal=causal, upcast=False)
        assert_close_rule(f"out d{headdim} sq{seqlen_q} sk{seqlen_k} {layout} causal={causal}", out, out_hi, naive,
                          factor=2)
        assert torch.allclose(lse, lse_hi.float(), atol=1e-2, rtol=1e-3)
        assert (out.float() - out_fp32.float()).abs().max() <= 0.05


# Rises of the scores' max from one 64-key chunk to the next, in the order the forward visits key tiles (the highest
# first), in units of a row's gain (0.6-1.4 log2 units). 128-key tiles (d <= 128) see pairs of them: 3, 6, 7, 13, 7,
# 6, 22, 7, so rises of 2-10 log2 units (kept as a stale max by most rows, up to p = 256, taken by some), 8-18 (both)
# and 13-31 (taken); 64-key tiles (d 256) see small rises that add up past 2^8 before the row takes its new max.
_RISES = [0, 3, 3, 3, 2, 5, 1, 12, 4, 3, 0, 6, 20, 2, 3, 4]


def _rising_scores_qkv(device, dtype, d, sk, gen):
    """q, k, v whose scores rise from one 64-key chunk to the next (the chunks the forward visits first, the highest,
    lowest) by _RISES times a per-row gain: the online softmax's stale max (softmax.cuh, kStaleMaxLog2 = 8) keeps some
    rows' max across a rise (p then up to 256) and raises others', at 128-key tiles (d <= 128) and 64-key ones
    (d 256). Within a chunk the scores vary by one log2 unit, so about 64 keys share each row's weight."""
    b, sq, h = 1, 96, 2
    chunks = -(-sk // 64)
    visit_offsets = torch.tensor(_RISES * (-(-chunks // len(_RISES))), dtype=torch.float64)[:chunks].cumsum(0)
    per_key = visit_offsets.flip(0).repeat_interleave(64)[:sk] + torch.rand(sk, generator=gen, dtype=torch.float64)
    row_gain = 0.6 + 0.8 * torch.rand(sq, generator=gen, dtype=torch.float64)
    scale = d ** -0.5
    # s[i, j] = scale * q_i . k_j = row_gain[i] * per_key[j] * ln 2 (natural units) from the first dimension, plus
    # small noise from the others
    q = 0.05 * torch.randn(b, sq, h, d, generator=gen, dtype=torch.float64)
    k = 0.05 * torch.randn(b, sk, h, d, generator=gen, dtype=torch.float64)
    q[..., 0] = (row_gain * math.log(2) / scale).view(1, sq, 1)
    k[..., 0] = per_key.view(1, sk, 1)
    v = torch.randn(b, sk, h, d, generator=gen, dtype=torch.float64)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def _short_run_inputs(case, dtype, seed):
    """q, k, v, bias, sinks and the remaining flags of a (batch, nheads_k, group, seqlen_q, seqlen_k, headdim,
    headdim_v, flags) case; flags' "bias" ("float" / "bool") and "sinks" (True) become tensors."""
    b, hk, group, sq, sk, d, dv, flags = case
    flags = dict(flags)
    gen = torch.Generator().manual_seed(seed)
    h = hk * group
    q, k, v = (torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
               for shape in ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, dv)))
    bias = flags.pop("bias", None)
    if bias == "float":
        bias = torch.randn(b, h, sq, sk, generator=gen, dtype=torch.float64).to(dtype)
    elif bias == "bool":
        bias = torch.rand(b, h, sq, sk, generator=gen) > 0.3
    sinks = torch.randn(h, generator=gen, dtype=torch.float64).to(torch.float32) if flags.pop("sinks", False) else None
    return q, k, v, bias, sinks, flags


def _short_run_reference(q, k, v, bias, sinks, flags):
    """The references a short-run case is held to: (out, lse) in fp64 / fp32 (hi_dtype) and out in q's dtype."""
    hi = hi_dtype(q.dtype)
    up = lambda t: None if t is None else (t.to(hi) if t.dtype != torch.bool else t)  # noqa: E731
    out_hi, lse_hi = attention_ref(q.to(hi), k.to(hi), v.to(hi), up(bias), sinks=up(sinks), return_lse=True,
                                   **flags)
    return out_hi, lse_hi, attention_ref(q, k, v, bias, sinks=sinks, upcast=False, **flags)


CPU_HEAD_TILE_CASES = [
    # (batch, nheads_k, group, seqlen_q, seqlen_k, headdim, headdim_v, flags)
    (2, 2, 4, 1, 1100, 64, 64, dict(causal=True)),
    (1, 2, 40, 1, 700, 32, 48, dict(softcap=3.0, window_left=300, window_right=0)),  # 40 heads: two tiles' rows
    (3, 1, 8, 1, 530, 64, 64, dict(bias="float", sinks=True)),
    (2, 2, 2, 1, 600, 16, 16, dict(bias="bool", causal=True, sinks=True)),
    (2, 2, 4, 5, 900, 64, 64, dict(causal=True, bias="float")),  # speculative decoding: 5 queries x 4 heads a tile
    (1, 2, 40, 7, 800, 32, 32, dict(window_left=100, window_right=2, sinks=True)),  # 3 queries x 40 heads a tile
    (1, 1, 6, 23, 1300, 48, 64, dict(causal=True, softcap=2.0)),  # 23 queries: rows of several tiles
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=lambda t: str(t).split(".")[-1])
@pytest.mark.parametrize("case", CPU_HEAD_TILE_CASES, ids=lambda c: f"b{c[0]}-hk{c[1]}-g{c[2]}-sq{c[3]}-sk{c[4]}")
def test_cpu_short_query_runs_tile_a_kv_heads_query_heads(dtype, case):
    """Short query runs under GQA on the CPU (decode steps, speculative decoding: fewer queries than a tile's rows):
    the kernel's tiles take queries of all the query heads of a kv head (each K / V tile read once for them; row r:
    query r / heads of head r % heads), each row with its own head's bias and sink, its own query's causal / window
    mask, output and lse. Within the rule against the fp64 / fp32 reference, lse within 1e-3, and beside a tile a
    head (development option cpu_head_tiles off)."""
    b, hk, group, sq, sk, d, dv, flags = case
    q, k, v, bias, sinks, flags = _short_run_inputs(case, dtype, seed=sk)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (the head tiles run where they give every thread a task: fwd_kernel.h)
    try:
        out, lse = torch.ops.fa2.fwd(q, k, v, bias, None, sinks=sinks, **flags)
        with fa2.dev.options_override(cpu_head_tiles=False):
            out_heads, lse_heads = torch.ops.fa2.fwd(q, k, v, bias, None, sinks=sinks, **flags)
    finally:
        torch.set_num_threads(threads)
    out_hi, lse_hi, out_naive = _short_run_reference(q, k, v, bias, sinks, flags)
    assert_close_rule(f"out {case}", out, out_hi, out_naive, factor=2)
    finite = torch.isfinite(lse_hi)
    assert torch.equal(torch.isfinite(lse), finite), case
    assert torch.allclose(lse[finite], lse_hi[finite].float(), atol=1e-3, rtol=1e-3), case
    tol = 2e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-5  # (a few ulps apart in half precision)
    torch.testing.assert_close(out, out_heads, rtol=tol, atol=tol)
    torch.testing.assert_close(lse, lse_heads, rtol=1e-4, atol=1e-4)


CPU_KEY_SPLIT_CASES = [
    # (batch, nheads_k, group, seqlen_q, seqlen_k, headdim, headdim_v, flags)
    (1, 1, 32, 1, 2100, 64, 64, dict(causal=True)),  # MQA decode step: 5 key blocks
    (1, 2, 4, 3, 1300, 32, 48, dict(softcap=3.0, window_left=100, window_right=0)),  # the first splits see no key
    (2, 1, 1, 1, 1500, 64, 64, dict(bias="float", sinks=True)),  # MHA: a tile a head
    (1, 2, 40, 2, 1100, 16, 16, dict(bias="bool", causal=True, sinks=True)),  # 80 rows a kv head
    (1, 1, 8, 1, 3000, 64, 64, dict(window_left=700, window_right=0)),  # splits over the window's keys only
    (1, 1, 6, 23, 1024, 48, 64, dict(causal=True)),  # 23 queries: rows of several tiles, whole blocks
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=lambda t: str(t).split(".")[-1])
@pytest.mark.parametrize("case", CPU_KEY_SPLIT_CASES, ids=lambda c: f"b{c[0]}-hk{c[1]}-g{c[2]}-sq{c[3]}-sk{c[4]}")
def test_cpu_short_query_runs_split_their_keys(dtype, case):
    """Short query runs whose tiles give fewer tasks than threads (one sequence's decode step on a many-core machine)
    split each tile's keys (those its queries see) into runs of whole key blocks and merge the splits' partial
    softmax states (development option cpu_key_splits: n splits, at most one a block). Two, three and more splits than
    blocks: out within the rule against the fp64 / fp32 reference, lse within 1e-3, beside the unsplit call; and with
    the machine's threads set to two, the automatic choice (-1) equals two splits or none, two for a single tile. A
    NaN key reaches the rows that see it alike split or not."""
    b, hk, group, sq, sk, d, dv, flags = case
    q, k, v, bias, sinks, flags = _short_run_inputs(case, dtype, seed=sk + group)
    call = lambda k_=k: torch.ops.fa2.fwd(q, k_, v, bias, None, sinks=sinks, **flags)  # noqa: E731
    with fa2.dev.options_override(cpu_key_splits=0):
        out_whole, lse_whole = call()
    out_hi, lse_hi, out_naive = _short_run_reference(q, k, v, bias, sinks, flags)
    finite = torch.isfinite(lse_hi)
    tol = 2e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-5  # (a few ulps apart in half precision)
    for splits in (2, 3, 64):
        with fa2.dev.options_override(cpu_key_splits=splits):
            out, lse = call()
        assert_close_rule(f"out {case} splits {splits}", out, out_hi, out_naive, factor=2)
        assert torch.equal(torch.isfinite(lse), finite), (case, splits)
        assert torch.allclose(lse[finite], lse_hi[finite].float(), atol=1e-3, rtol=1e-3), (case, splits)
        torch.testing.assert_close(out, out_whole, rtol=tol, atol=tol)
        torch.testing.assert_close(lse, lse_whole, rtol=1e-4, atol=1e-4)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with fa2.dev.options_override(cpu_key_splits=2):
            out_two, lse_two = call()
        with fa2.dev.options_override(cpu_key_splits=0):
            out_one, lse_one = call()
        out_auto, lse_auto = call()  # (the default, -1)
        k_nan = k.clone()
        k_nan[0, sk - 5, 0, 0] = float("nan")
        with fa2.dev.options_override(cpu_key_splits=3):
            out_nan, _ = call(k_nan)
        with fa2.dev.options_override(cpu_key_splits=0):
            out_nan_whole, _ = call(k_nan)
    finally:
        torch.set_num_threads(threads)
    # (two threads: one tile is split in two, more tiles are not split)
    assert ((torch.equal(out_auto, out_two) and torch.equal(lse_auto, lse_two))
            or (torch.equal(out_auto, out_one) and torch.equal(lse_auto, lse_one))), case
    if b * hk == 1 and group * sq <= 32:  # (one tile whatever block_q is)
        assert torch.equal(out_auto, out_two) and torch.equal(lse_auto, lse_two), case
    assert torch.equal(torch.isnan(out_nan), torch.isnan(out_nan_whole)), case
    assert torch.isnan(out_nan).any(), case


@given(hk=st.integers(1, 3), group=st.sampled_from([1, 2, 5, 8]), sq=st.integers(1, 9), sk=st.integers(1, 2600),
       window=st.sampled_from([(-1, -1), (-1, 0), (300, 0), (900, 40), (50, -1)]), softcap=st.sampled_from([0.0, 4.0]),
       splits=st.integers(2, 6), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_cpu_key_splits_hypothesis(hk, group, sq, sk, window, softcap, splits, dtype):
    """Random short query runs (GQA groups, windows bottom-right, softcap, caches of one to six key blocks), their
    keys forced into 2..6 splits: out within the rule against the reference, beside the unsplit call, and lse alike."""
    case = (1, hk, group, sq, sk, 32, 32, dict(window_left=window[0], window_right=window[1], softcap=softcap))
    q, k, v, bias, sinks, flags = _short_run_inputs(case, dtype, seed=sk)
    with fa2.dev.options_override(cpu_key_splits=splits):
        out, lse = torch.ops.fa2.fwd(q, k, v, None, None, **flags)
    with fa2.dev.options_override(cpu_key_splits=0):
        out_whole, lse_whole = torch.ops.fa2.fwd(q, k, v, None, None, **flags)
    out_hi, _, out_naive = _short_run_reference(q, k, v, bias, sinks, flags)
    assert_close_rule(f"out {case} splits {splits}", out, out_hi, out_naive, factor=2)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out, out_whole, rtol=tol, atol=tol)
    torch.testing.assert_close(lse, lse_whole, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device,dtype", [(d, t) for d, t in DEVICE_DTYPES if t != torch.float64],
                         ids=[i for i, (_, t) in zip(IDS, DEVICE_DTYPES) if t != torch.float64])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_forward_with_rising_row_max_follows_the_rule(device, dtype, d):
    """Scores whose max rises from key tile to key tile, by less than 2^8 for some rows and more for others (a row
    keeps its running max across the first: the forward's stale max, p then up to 256 in the P operand; it takes the
    second and rescales O): out within the rule and lse within 1e-3 of the fp64 reference, plain, causal and with a
    window (whole tiles masked for some rows), on the CPU kernel and on the GPU's default kernels; on an sm_90a GPU
    every schedule also bitwise equal to the pipelined one (each row's decisions depend on its own scores only)."""
    gen = torch.Generator().manual_seed(d)
    q, k, v = _rising_scores_qkv(device, dtype, d, 1000, gen)
    schedules = []
    if device == "cuda" and torch.cuda.get_device_capability() == (9, 0):
        schedules = ["ws", "pingpong", "overlap", "pingpong-overlap"]
    for causal, left, right in ((False, -1, -1), (True, -1, -1), (False, 300, 40)):
        args = (q, k, v, None, None, causal, left, right, 0.0)
        out_hi, lse_hi = attention_ref(q.double(), k.double(), v.double(), causal=causal, window_left=left,
                                       window_right=right, return_lse=True)
        out_naive = attention_ref(q, k, v, causal=causal, window_left=left, window_right=right, upcast=False)
        what = f"d {d} causal {causal} window ({left}, {right})"
        out, lse = torch.ops.fa2.fwd(*args)
        assert_close_rule(f"out {what}", out, out_hi, out_naive, factor=2)
        finite = torch.isfinite(lse_hi)
        assert torch.equal(torch.isfinite(lse), finite), what
        assert torch.allclose(lse[finite], lse_hi[finite].float(), atol=1e-3, rtol=1e-3), what
        if schedules:
            with switch("sm90_schedule", "pipelined"):
                out_p, lse_p = torch.ops.fa2.fwd(*args)
            assert_close_rule(f"out {what} pipelined", out_p, out_hi, out_naive, factor=2)
            for schedule in schedules:
                with switch("sm90_schedule", schedule):
                    out_s, lse_s = torch.ops.fa2.fwd(*args)
                assert torch.equal(out_s, out_p) and torch.equal(lse_s, lse_p), f"{what}: {schedule} vs pipelined"


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES, ids=IDS)
def test_backward_matches_reference(device, dtype, share):
    hi = hi_dtype(dtype)
    for index, s in enumerate(sample_inputs(device, dtype, requires_grad=True, full=(device == "cuda"), seed=1)):
        # every sample's output gradient is drawn, in order, whichever share checks it: each sample keeps its inputs
        dout = torch.randn(s.q.shape[:-1] + s.v.shape[-1:], dtype=s.q.dtype, device=s.q.device)
        if not in_share(index, share):
            continue
        bias = s.kwargs.get("attn_bias")
        diff = [s.q, s.k, s.v] + ([bias] if bias is not None and bias.requires_grad else [])
        out = fa2.attention(*s.args())
        grads = torch.autograd.grad(out, diff, dout)

        kw = {k: v for k, v in s.kwargs.items() if k != "attn_bias"}
        leaf_hi = [t.detach().to(hi).requires_grad_() for t in diff]
        bias_hi = leaf_hi[3] if len(diff) == 4 else (None if bias is None else bias.detach())
        out_hi = attention_ref(*leaf_hi[:3], bias_hi, **kw)
        grads_hi = torch.autograd.grad(out_hi, leaf_hi, dout.to(hi))
        leaf_lo = [t.detach().clone().requires_grad_() for t in diff]
        bias_lo = leaf_lo[3] if len(diff) == 4 else (None if bias is None else bias.detach())
        out_lo = attention_ref(*leaf_lo[:3], bias_lo, upcast=False, **kw)
        grads_lo = torch.autograd.grad(out_lo, leaf_lo, dout)
        for name, g, g_hi, g_lo in zip(("dq", "dk", "dv", "dbias"), grads, grads_hi, grads_lo):
            assert g.shape == g_hi.shape and g.dtype == diff[["dq", "dk", "dv", "dbias"].index(name)].dtype
            assert_close_rule(f"{name} {s}", g, g_hi, g_lo, factor=3)


@pytest.mark.parametrize("device", devices())
def test_fully_masked_rows_are_zero_with_zero_grads(device):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v = make_qkv(2, 40, 24, 2, 1, 64, dtype=dtype, device=device, requires_grad=True)
    keep = torch.ones(2, 2, 40, 24, dtype=torch.bool, device=device)
    keep[:, :, 5] = False                       # an all-False bool bias row
    neg = torch.zeros(2, 2, 40, 24, dtype=dtype, device=device)
    neg[:, :, 7] = float("-inf")                # an all -inf float bias row
    for bias in (keep, neg):
        out, lse = torch.ops.fa2.fwd(q, k, v, bias, None, True)   # causal: rows 0..15 see no key
        assert not torch.isnan(out).any()
        dead = [*range(16), 5, 7] if bias is neg else [*range(16), 5]
        dead = sorted(set(dead) - ({7} if bias is keep else {5}))
        assert (out[:, dead] == 0).all() and (lse[:, :, dead] == math.inf).all()
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
        assert not any(torch.isnan(g).any() for g in (dq, dk, dv))
        assert (dq[:, dead] == 0).all()



@pytest.mark.parametrize("dtype", dtypes_for("cpu") + [torch.float64], ids=lambda t: str(t).split(".")[-1])
@pytest.mark.parametrize("shape,headdim_v,flags", [
    ((2, 17, 64, 2, 2, 2), 54, dict(causal=True, window_left=0)),       # seqlen_k > seqlen_q: bottom-right aligned
    ((1, 130, 130, 4, 2, 128), 128, dict(window_left=0, window_right=0)),  # GQA; keys past one 128-key tile
    ((2, 40, 1, 4, 4, 64), 64, dict()),                                    # a single key
], ids=["causal-left0-d2", "window00-d128", "seqlen_k1"])
def test_cpu_rows_that_see_one_key_have_exactly_zero_dq_dk(dtype, shape, headdim_v, flags):
    """A softmax over one key is constant: dq and dk are exactly 0, as in the reference math (where P = 1 and
    dS = P (dP - P dP) = 0), however large dP. The CPU backward recomputes S in other tiles than the forward (an ulp
    or so off), so P = exp(S - lse) alone came out 1 - 1e-6, leaving dS = P dP (1 - P) of noise in dq and dk."""
    b, sq, sk, h, hk, d = shape
    gen = torch.Generator().manual_seed(3)
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device="cpu", requires_grad=True, generator=gen,
                       headdim_v=headdim_v)
    out = fa2.attention(q, k, v, **flags)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn(out.shape, generator=gen).to(dtype))
    assert torch.count_nonzero(dq) == 0 and torch.count_nonzero(dk) == 0
    assert dv.abs().sum() > 0  # (the gradient did flow)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("shape", [(0, 5, 5, 2, 2, 16), (1, 0, 5, 2, 2, 16), (1, 5, 0, 2, 2, 16),
                                   (1, 1, 1, 1, 1, 1), (2, 3, 7, 4, 2, 256)])
def test_degenerate_sizes(device, shape):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    b, sq, sk, h, hk, d = shape
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device=device, requires_grad=True)
    out, lse = torch.ops.fa2.fwd(q, k, v)
    ref, lse_ref = attention_ref(q.detach().double(), k.detach().double(), v.detach().double(), return_lse=True)
    assert out.shape == q.shape and lse.shape == (b, h, sq)
    assert torch.allclose(out.double(), ref, atol=2e-2), (out, ref)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref))
    dq, dk, dv = torch.autograd.grad(fa2.attention(q, k, v).sum(), (q, k, v))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    if sk == 0:
        assert (dq == 0).all()
    if sq == 0:
        assert (dk == 0).all() and (dv == 0).all()


@pytest.mark.parametrize("share", [pytest.param("quick", id="quick"),
                                   pytest.param("rest", id="rest", marks=pytest.mark.slow)])
def test_gradcheck_float64(share):
    torch.manual_seed(0)
    cases = [({}, None), ({"causal": True}, (1, 2, 5, 7)), ({"softcap": 2.0}, (2, 1, 1, 7)),
             ({"window_left": 2, "window_right": 1}, (5, 7)), ({"scale": 0.7}, None)]
    for index, (flags, bias_shape) in enumerate(cases):
        q, k, v = make_qkv(2, 5, 7, 2, 1, 6, dtype=torch.float64, device="cpu", requires_grad=True)
        inputs = [q, k, v]
        if bias_shape is not None:
            inputs.append(torch.randn(bias_shape, dtype=torch.float64, requires_grad=True))
        if (index in (1, 2)) != (share == "quick"):  # (inputs drawn for every case: each keeps the same ones)
            continue
        fn = lambda *xs: fa2.attention(*xs[:3], xs[3] if len(xs) > 3 else None, **flags)  # noqa: E731
        assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7), flags


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES, ids=IDS)
def test_deterministic_backward(device, dtype):
    q, k, v = make_qkv(2, 193, 257, 4, 2, 64, dtype=dtype, device=device, requires_grad=True)
    dout = torch.randn(q.shape, dtype=dtype, device=device)
    with fa2.deterministic():
        runs = [torch.autograd.grad(fa2.attention(q, k, v, causal=True), (q, k, v), dout) for _ in range(20)]
    for r in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(r, runs[0]))


def test_deterministic_setting_reaches_a_backward_on_another_thread(monkeypatch):
    """fa2.deterministic() holds for the calls made inside it even when their backward runs on another thread (the
    autograd engine runs CUDA nodes on a device worker thread, where a thread-local setting was invisible: CUDA
    gradients were silently not deterministic) or after the block. Checked on the flag fa2.bwd receives."""
    seen = []
    real_bwd = torch.ops.fa2.bwd

    def spy(*args):
        seen.append(args[13])  # deterministic
        return real_bwd(*args)

    monkeypatch.setattr(torch.ops.fa2, "bwd", spy)
    q, k, v = make_qkv(1, 9, 11, 2, 2, 8, dtype=torch.float32, device="cpu", requires_grad=True)
    with fa2.deterministic():
        out = fa2.attention(q, k, v)
    worker = threading.Thread(target=lambda: torch.autograd.grad(out.sum(), (q, k, v)))
    worker.start()
    worker.join()
    out = fa2.attention(q, k, v)  # outside the block: not deterministic
    torch.autograd.grad(out.sum(), (q, k, v))
    assert seen == [True, False]


@pytest.mark.parametrize("device", devices())
def test_bhsd_views_need_no_copy(device):
    """(B, H, S, D) tensors transposed to (B, S, H, D) are read in place: no aten copy runs in the call."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v = make_qkv(2, 64, 64, 4, 4, 64, dtype=dtype, device=device, layout="bhsd")
    with Log() as log:
        out = fa2.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    assert not any(("copy" in o or "clone" in o or "contiguous" in o) for o in log.ops), log.ops
    assert out.shape == (2, 4, 64, 64)


@pytest.mark.parametrize("device,dtype", [(d, t) for d, t in DEVICE_DTYPES if t != torch.float64],
                         ids=[i for (d, t), i in zip(DEVICE_DTYPES, IDS) if t != torch.float64])
@pytest.mark.parametrize("bias_dtype", ["same", "fp32", "bool"])
def test_key_row_bias_equals_the_same_bias_materialized(device, dtype, bias_dtype):
    """A bias that is the same for every query row (stride 0 along queries: a padding mask) takes its own kernel
    variant on CUDA; it must give bitwise what the same values give as a full (B, H, Sq, Sk) tensor, forward and
    backward (both paths fold the same values, in the same order; the backward in deterministic mode).
    On sm_90a the key-row bias is loaded into shared memory by the TMA when its rows are 16-byte aligned (the warp-specialized
    kernels at d 128 / 256 too) and read from global memory otherwise: CUDA runs headdims and key lengths that take
    both, with key tiles that are all full (640) or not."""
    configs = [(64, 300)] + ([(64, 320), (128, 300), (128, 640), (256, 520)] if device == "cuda" else [])
    # the backward's key-row variant (the default on CUDA) runs other tiles than the materialized bias: within
    # the rule, not bitwise (test_cuda_key_bias_backward_variant_follows_the_rule); this compares the general paths
    with switch("key_bias_backward", False):
        _key_row_bias_vs_materialized(device, dtype, bias_dtype, configs)


def _key_row_bias_vs_materialized(device, dtype, bias_dtype, configs):
    for d, sk in configs:
        b, sq, h, hk = 2, 150, 4, 2
        g = torch.Generator(device=device).manual_seed(3)
        q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device=device, requires_grad=True, generator=g)
        if bias_dtype == "bool":
            row = torch.rand(b, 1, 1, sk, device=device, generator=g) > 0.2
        else:
            bias_t = dtype if bias_dtype == "same" else torch.float32
            row = torch.randn(b, 1, 1, sk, device=device, generator=g).to(bias_t)
            row[..., -7:] = torch.finfo(bias_t).min  # padded keys, as Hugging Face writes them
        full = row.expand(b, h, sq, sk).contiguous()
        dout = torch.randn(b, sq, h, d, device=device, dtype=dtype, generator=g)
        results = []
        for bias in (row.expand(b, h, sq, sk), full):
            with fa2.deterministic():  # dQ is otherwise summed with atomics, in no fixed order
                out = fa2.attention(q, k, v, attn_bias=bias)
                results.append((out,) + torch.autograd.grad(out, (q, k, v), dout))
        for name, a, c in zip(("out", "dq", "dk", "dv"), *results):
            assert torch.equal(a, c), f"d {d} sk {sk} {name}: max diff {(a.float() - c.float()).abs().max().item()}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["same", "fp32", "bool"])
@pytest.mark.parametrize("d", [64, 96, 128, 256])
def test_cuda_key_bias_backward_variant_follows_the_rule(d, kind):
    """Development option key_bias_backward on (the default; FA2_DEV_OPTIONS=key_bias_backward=0 turns it off): a key-row bias
    (padding mask) whose gradient is not needed takes the backward's plain path with its key block's values read once
    (bwd_kernel.cuh, kKeyBias). Gradients within the rule against the fp32 reference, causal or not, GQA, with right
    padding (-inf / False: whole padded key blocks, a batch with every key padded) and Hugging Face's left padding
    (finfo.min: under causal, query rows that see only padded keys, P taken against the row statistics' shift);
    key blocks whose keys are all padded (skipped: dK = dV = 0, their dQ turns passed on in deterministic mode);
    deterministic mode bitwise repeatable; the key-row kernel is what ran, and a bias that needs its gradient still
    takes the score-mod path."""
    if d == 64 and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("not built where its shared memory exceeds the GPU's (sm80 tiles at d 64: 163 KB + 512 B)")

    def bwd_kernel_names(fn):
        return [n for n in cuda_kernel_names(fn) if "bwd_kernel<" in n or "bwd_ws_" in n]

    # sm_90a at the warp-specialized backward's headdims: its key-row variant (bwd_ws_kernel<T, Cfg, true, ...>) takes
    # the non-deterministic calls; test_hopper.py compares the two kernels
    ws = (torch.cuda.get_device_capability() == (9, 0) and fa2.dev.options()["sm90_backward"]
          and fa2.dev.options()["sm90_ws_backward"] and d in fa2.dev.tuning_tables()["sm90_ws_backward_headdims"]
          and f"bwd_bf16_hdim{d}_sm90a" in fa2._C.build_info()["kernels"])

    def key_row_kernel(name):
        if ws:
            return is_ws_key_row_kernel(name)
        return name.endswith(", false, true, false, false>(fa2::AttentionParams)")

    dtype = torch.bfloat16
    b, sq, sk, h, hk = 3, 200, 300, 4, 2
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device="cuda", requires_grad=True, generator=g)
    dout = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    if kind == "bool":
        row = torch.ones(b, 1, 1, sk, dtype=torch.bool, device="cuda")
        row[0, ..., 250:] = row[1] = row[2, ..., :120] = False
    else:
        bias_dtype = dtype if kind == "same" else torch.float32
        row = torch.randn(b, 1, 1, sk, device="cuda", generator=g).to(bias_dtype)
        row[0, ..., 250:] = row[1] = float("-inf")
        # causal (bottom-right): rows 0..19 see only these. bf16's min for both dtypes: the bf16 reference keeps it
        # finite (fp32's min would round to -inf there, masking those rows and loosening the rule's bound)
        row[2, ..., :120] = torch.finfo(dtype).min
    bias = row.expand(b, h, sq, sk)
    with switch("key_bias_backward", True):
        for causal in (False, True):
            out = fa2.attention(q, k, v, bias, causal=causal)
            names = bwd_kernel_names(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
            assert names and all(key_row_kernel(n) for n in names), names
            grads = torch.autograd.grad(out, (q, k, v), dout)
            leaf_hi = [t.detach().float().requires_grad_() for t in (q, k, v)]
            bias_hi = bias if kind == "bool" else bias.float()
            grads_hi = torch.autograd.grad(attention_ref(*leaf_hi, bias_hi, causal=causal), leaf_hi, dout.float())
            leaf_lo = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            grads_lo = torch.autograd.grad(attention_ref(*leaf_lo, bias, causal=causal, upcast=False), leaf_lo, dout)
            for name, gr, g_hi, g_lo in zip(("dq", "dk", "dv"), grads, grads_hi, grads_lo):
                assert not torch.isnan(gr).any(), f"{name} d {d} causal {causal}: NaN"
                assert_close_rule(f"{name} d {d} {kind} causal {causal}", gr, g_hi, g_lo, factor=3)
        with fa2.deterministic():
            runs = [torch.autograd.grad(fa2.attention(q, k, v, bias, causal=True), (q, k, v), dout) for _ in range(3)]
        assert all(torch.equal(x, y) for r in runs[1:] for x, y in zip(r, runs[0]))
        if kind != "bool":  # a bias that needs its gradient: the score-mod path (dbias)
            leaf_bias = row.detach().clone().requires_grad_()
            out = fa2.attention(q, k, v, leaf_bias.expand(b, h, sq, sk))
            names = bwd_kernel_names(lambda: torch.autograd.grad(out, (q, k, v, leaf_bias), dout))
            assert names and all(n.endswith(", true, false, false, false>(fa2::AttentionParams)") for n in names), names


def test_float64_logits_beyond_float32_range_keep_their_gradients():
    """float64 scores above float32's range: lse (float32 by contract) overflows to +inf, which must not read as
    "this row sees no key" (zero gradients): the CPU backward recomputes float64 rows' statistics."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, 2, 8, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3))
    bias = torch.full((4, 4), 1e40, dtype=torch.float64)
    bias[:, 0] = 2e40  # every row: one key dominates
    bias[1] = float("-inf")  # and a row that sees no key: zero gradients
    out = fa2.attention(q, k, v, bias)
    grads = torch.autograd.grad((out * out).sum(), (q, k, v))
    leaf = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref = attention_ref(*leaf, bias)
    want = torch.autograd.grad((ref * ref).sum(), leaf)
    torch.testing.assert_close(out, ref)
    for got, exp in zip(grads, want):
        torch.testing.assert_close(got, exp)
    assert grads[2].abs().sum() > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("d", [32, 64, 96, 128, 192, 256])
def test_cuda_small_smem_backward_tiles_follow_the_rule(d):
    """The sm80-path backward's small-shared-memory tiles (bwd_tile_config.h: what sm86 / sm89 GPUs, 99 KB a block,
    run by themselves), forced on this GPU (set_bwd_small_tiles, the sm_90a backward off): gradients within the rule
    causal or not with GQA and query/key tails, a padding mask (the key-row variant) and a bias that needs its
    gradient (the score-mod path), deterministic mode bitwise repeatable; the small-tile kernel is what ran."""
    from fa2._C import build_info
    if f"bwd_bf16_hdim{d}_" not in build_info()["kernels"]:  # (one string of instance names)
        pytest.skip(f"this build has no backward for headdim {d}")
    dtype = torch.bfloat16
    b, sq, sk, h, hk = 2, 157, 301, 4, 2
    g = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device="cuda", requires_grad=True, generator=g)
    dout = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    keep = torch.ones(b, 1, 1, sk, dtype=torch.bool, device="cuda")
    keep[0, ..., 260:] = False
    learned = torch.randn(1, h, sq, sk, device="cuda", generator=g).requires_grad_()
    small = {32: "128, 64", 64: "128, 64", 96: "64, 64", 128: "64, 64", 192: "64, 32", 256: "32, 32"}[d]  # (m, n)
    with switch("sm90_backward", False), switch("bwd_small_tiles", True):
        for causal, bias in ((False, None), (True, None), (False, keep), (True, learned)):
            out = fa2.attention(q, k, v, bias, causal=causal)
            inputs = (q, k, v) + ((learned,) if bias is learned else ())
            names = [n for n in cuda_kernel_names(lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True))
                     if "bwd_kernel<" in n]
            assert names and all(f"BwdTileConfig<{d}, {small}, " in n for n in names), names
            grads = torch.autograd.grad(out, inputs, dout)
            leaf_hi = [t.detach().float().requires_grad_() for t in inputs]
            bias_hi = leaf_hi[3] if bias is learned else bias
            grads_hi = torch.autograd.grad(attention_ref(*leaf_hi[:3], bias_hi, causal=causal), leaf_hi, dout.float())
            leaf_lo = [t.detach().clone().requires_grad_() for t in inputs]
            bias_lo = leaf_lo[3] if bias is learned else bias
            grads_lo = torch.autograd.grad(attention_ref(*leaf_lo[:3], bias_lo, causal=causal, upcast=False), leaf_lo,
                                           dout)
            for name, gr, g_hi, g_lo in zip(("dq", "dk", "dv", "dbias"), grads, grads_hi, grads_lo):
                assert_close_rule(f"{name} d {d} causal {causal} bias {bias is not None}", gr, g_hi, g_lo, factor=3)
        with fa2.deterministic():
            runs = [torch.autograd.grad(fa2.attention(q, k, v, causal=True), (q, k, v), dout) for _ in range(3)]
        assert all(torch.equal(x, y) for r in runs[1:] for x, y in zip(r, runs[0]))
