"""The CUDA decode kernel alone (torch.ops.fa2._decode_attention; the public KV-cache op is tested elsewhere):
results against fp32 math (tests/decode_samples.py), the op's fake kernel (opcheck), torch.compile, CUDA-graph
capture and replay with a changing cache length, and the calls the kernel declines."""
from __future__ import annotations

import pytest
import torch

import fa2  # noqa: F401
from decode_samples import build_case, cases, run_case

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="the decode kernel needs a CUDA device")]

QUICK = list(cases(quick=True))
_quick_names = {name for name, _ in QUICK}
FULL_ONLY = [(name, kw) for name, kw in cases(quick=False) if name not in _quick_names]


@pytest.mark.parametrize("name,kw", QUICK, ids=[name for name, _ in QUICK])
def test_decode_matches_reference(name, kw):
    run_case(name, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("name,kw", FULL_ONLY, ids=[name for name, _ in FULL_ONLY])
def test_decode_matches_reference_full(name, kw):
    run_case(name, **kw)


def _small_case(page=0):
    q, k, v, lens, kw = build_case([5, 130, 0], 2, 8, 2, 64, torch.bfloat16, page=page, capacity=256)
    return (q, k, v, lens), kw


@pytest.mark.parametrize("page", [0, 16])
def test_opcheck(page):
    args, kw = _small_case(page)
    torch.library.opcheck(torch.ops.fa2._decode_attention.default, args, dict(kw, causal=True))


def test_compile_fullgraph():
    (q, k, v, lens), kw = _small_case(16)

    def step(q, k, v, lens, table):
        return torch.ops.fa2._decode_attention(q, k, v, lens, block_table=table, causal=True)[0] * 2

    expected = step(q, k, v, lens, kw["block_table"])
    got = torch.compile(step, fullgraph=True)(q, k, v, lens, kw["block_table"])
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("num_splits", [0, 1, 4])
def test_cuda_graph_replay_follows_lengths(num_splits):
    """Captured once, replayed with other cache lengths in the same device tensor: each replay matches an eager call
    (no host sync in the op, the split scratch sized from shapes)."""
    q, k, v, lens, _ = build_case([100, 2000], 1, 32, 8, 128, torch.bfloat16, capacity=4096)
    static_lens = lens.clone()
    torch.ops.fa2._decode_attention(q, k, v, static_lens, num_splits=num_splits)  # warm-up (attributes, allocator)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = torch.ops.fa2._decode_attention(q, k, v, static_lens, num_splits=num_splits)
    for new in ([100, 2000], [4096, 1], [0, 777]):
        static_lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        want_out, want_lse = torch.ops.fa2._decode_attention(q, k, v, static_lens, num_splits=num_splits)
        torch.testing.assert_close(out, want_out, rtol=0, atol=0)
        torch.testing.assert_close(lse, want_lse, rtol=0, atol=0)


def test_declines_too_many_rows():
    # 16 query heads per kv head x 32 queries = 512 rows: more than 4 row blocks, left to the caller's fallback
    q, k, v, lens, _ = build_case([10], 32, 16, 1, 64, torch.bfloat16)
    with pytest.raises(RuntimeError, match="does not take this call: more than 256 query rows"):
        torch.ops.fa2._decode_attention(q, k, v, lens)


def test_bad_indices_read_inside_the_cache():
    """block_table / cache_batch_idx values outside the cache (not checked on the host: that would sync) are clamped
    into it: the result equals the call with the clamped indices, and nothing outside the cache is read."""
    q, k, v, lens, kw = build_case([40, 100], 1, 8, 2, 64, torch.bfloat16, page=16, capacity=128)
    table = kw["block_table"].clone()
    table[0, 1], table[1, 3] = 10**6, -5
    got = torch.ops.fa2._decode_attention(q, k, v, lens, block_table=table)
    want = torch.ops.fa2._decode_attention(q, k, v, lens, block_table=table.clamp(0, k.shape[0] - 1))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    q, k, v, lens, kw = build_case([40, 100], 1, 8, 2, 64, torch.bfloat16, capacity=128, cache_batch_idx=True)
    idx = torch.tensor([-3, 99], dtype=torch.int32, device="cuda")
    got = torch.ops.fa2._decode_attention(q, k, v, lens, cache_batch_idx=idx)
    want = torch.ops.fa2._decode_attention(q, k, v, lens, cache_batch_idx=idx.clamp(0, k.shape[0] - 1))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


DENSE_DECODE_SHAPES = [  # (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim)
    (1, 1, 4099, 32, 8, 128),   # one decode step over a long cache: split-KV
    (3, 4, 1000, 8, 2, 64),     # speculative tokens, GQA: 16 rows a kv head
    (2, 1, 129, 4, 4, 64),      # MHA, a key tile's edge
    (2, 16, 300, 8, 2, 128),    # 64 rows a kv head: the limit (decode::kMaxRowsForDenseCalls)
    (1, 2, 1, 8, 1, 256),       # one key, MQA
]


def _check_both_routes(q, k, v, dout, flags):
    """fa2.attention(q, k, v, **flags) with option dense_decode on (the decode kernel must run) and off (it must not):
    output and gradients within the rule against fp64 / low-precision references; returns both outputs."""
    from fa2.reference import attention_ref
    from kernels import cuda_kernel_names, switch
    from numerics import assert_close_rule
    leaves_hi = [t.double().requires_grad_() for t in (q, k, v)]
    ref_hi = attention_ref(*leaves_hi, **flags)
    grads_hi = torch.autograd.grad(ref_hi, leaves_hi, dout.double())
    leaves_lo = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_lo = attention_ref(*leaves_lo, upcast=False, **flags)
    grads_lo = torch.autograd.grad(ref_lo, leaves_lo, dout)
    outs = []
    for on in (True, False):
        with switch("dense_decode", on):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            names = cuda_kernel_names(lambda: fa2.attention(*leaves, **flags))
            assert any("decode_kernel" in n for n in names) == on, names
            out = fa2.attention(*leaves, **flags)
            grads = torch.autograd.grad(out, leaves, dout)
        assert_close_rule(f"out (dense_decode {on})", out, ref_hi, ref_lo, factor=2)
        for name, got, hi, lo in zip(("dq", "dk", "dv"), grads, grads_hi, grads_lo):
            assert_close_rule(f"{name} (dense_decode {on})", got, hi, lo, factor=3)
        outs.append(out)
    return outs


@pytest.mark.parametrize("shape", DENSE_DECODE_SHAPES, ids=[str(s) for s in DENSE_DECODE_SHAPES])
@pytest.mark.parametrize("flags", [{}, {"causal": True}, {"causal": True, "window_left": 100},
                                   {"softcap": 30.0, "window_left": 50, "window_right": 2}],
                         ids=["plain", "causal", "causal-window", "softcap-window"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dense_decode_shaped_calls_run_the_decode_kernel(shape, flags, dtype):
    """fa2.attention with few query rows per kv head (option dense_decode, the default) runs the decode kernel:
    output and gradients (the backward reads its out and lse) within the rule against fp32 math, with the option
    off the dense kernels, equally within the rule."""
    from samples import make_qkv
    b, sq, sk, h, hk, d = shape
    g = torch.Generator(device="cuda").manual_seed(sq * 1000 + sk)
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device="cuda", generator=g)
    dout = torch.randn(b, sq, h, d, dtype=dtype, device="cuda", generator=g)
    _check_both_routes(q, k, v, dout, flags)


KEY_MASK_SHAPES = [DENSE_DECODE_SHAPES[0], DENSE_DECODE_SHAPES[1], DENSE_DECODE_SHAPES[3]]


@pytest.mark.parametrize("shape", KEY_MASK_SHAPES, ids=[str(s) for s in KEY_MASK_SHAPES])
@pytest.mark.parametrize("flags", [{}, {"causal": True}, {"causal": True, "window_left": 100}],
                         ids=["plain", "causal", "causal-window"])
def test_dense_decode_takes_a_key_mask(shape, flags):
    """A bool key mask (B, 1, 1, Sk) — a static cache's decoding step: left padding, empty slots past the tokens —
    goes to the decode kernel too (its keys hidden on top of causal / windows; a batch element with no key left
    outputs 0): output and gradients within the rule, as the dense kernels' with the option off."""
    from samples import make_qkv
    b, sq, sk, h, hk, d = shape
    g = torch.Generator(device="cuda").manual_seed(sq * 1000 + sk + 7)
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=torch.bfloat16, device="cuda", generator=g)
    dout = torch.randn(b, sq, h, d, dtype=torch.bfloat16, device="cuda", generator=g)
    keys = torch.arange(sk, device="cuda")
    mask = (keys >= 5) & (keys < sk - 40)  # left padding, and empty cache slots at the end
    mask = mask & (torch.rand(b, sk, device="cuda", generator=g) > 0.1)  # and holes
    if b > 1:
        mask[1] = False  # a batch element that sees no key at all
    mask = mask[:, None, None, :]
    for out in _check_both_routes(q, k, v, dout, dict(flags, attn_bias=mask)):
        if b > 1:
            assert torch.equal(out[1], torch.zeros_like(out[1])), "a row that sees no key outputs 0"


def test_dense_decode_leaves_what_the_decode_kernel_does_not_take():
    """A bias other than a bool key mask, dropout, sinks or a value headdim of its own keep fa2.attention on the
    dense kernels, as do more than 64 query rows per kv head."""
    from kernels import cuda_kernel_names
    from samples import make_qkv
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = make_qkv(2, 2, 700, 8, 2, 64, dtype=torch.bfloat16, device="cuda", generator=g)
    calls = {
        "float key bias": dict(attn_bias=torch.zeros(2, 1, 1, 700, dtype=torch.bfloat16, device="cuda")),
        "bool mask per query": dict(attn_bias=torch.ones(2, 1, 2, 700, dtype=torch.bool, device="cuda")),
        "bool mask per head": dict(attn_bias=torch.ones(2, 8, 1, 700, dtype=torch.bool, device="cuda")),
        "dropout": dict(dropout_p=0.1),
        "sinks": dict(sinks=torch.zeros(8, device="cuda")),
    }
    for what, kw in calls.items():
        names = cuda_kernel_names(lambda: fa2.attention(q, k, v, **kw))
        assert names and not any("decode_kernel" in n for n in names), (what, names)
    q_many = torch.randn(2, 17, 8, 64, dtype=torch.bfloat16, device="cuda", generator=g)  # 68 rows a kv head
    names = cuda_kernel_names(lambda: fa2.attention(q_many, k, v))
    assert names and not any("decode_kernel" in n for n in names), names
    v_wide = torch.randn(2, 700, 2, 128, dtype=torch.bfloat16, device="cuda", generator=g)
    names = cuda_kernel_names(lambda: fa2.attention(q, k, v_wide))
    assert names and not any("decode_kernel" in n for n in names), names
