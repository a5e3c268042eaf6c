"""Attention over a KV cache: fa2.attention_with_kvcache / torch.ops.fa2.kvcache_fwd against the reference
(fa2.reference.kvcache_attention_ref: the append on copies of the caches, then the fp32 / fp64 math per batch element)
with the numerics rule, and the caches after the call; contiguous and paged caches (blocks of 16, 64, 256),
cache_batch_idx, rotary (both styles, partial rotary dims), GQA, causal / windows / softcap, seqlen_q 1 and > 1,
nothing appended; bad input (the error names the argument, the caches are unchanged); opcheck; torch.compile of a
decode step with no graph break; on CUDA, the device-side guard and a CUDA-graph capture of decode steps."""
from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
import torch

import fa2
from fa2.reference import attention_ref, kvcache_attention_ref, rotary_ref
from numerics import assert_close_rule, hi_dtype
from samples import dtypes_for, skip_without_device

DEVICE_DTYPES = [(d, t) for d in ["cpu", "cuda"] for t in dtypes_for(d)] + [("cpu", torch.float64)]
IDS = [f"{d}-{str(t).split('.')[-1]}" for d, t in DEVICE_DTYPES]


_needs = skip_without_device


# ---- cases ---------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class KvcacheCase:
    """One call's shape and flags. block: None = a contiguous cache of `cache` positions, else a paged cache of
    blocks of that size (enough blocks per sequence for `cache` positions, shuffled). rotary: None, "interleaved" or
    "half", over rotary_dim dims. seqlens: "tensor", "int" or None (the whole cache, nothing appended)."""
    name: str
    batch: int = 3
    seqlen_q: int = 1
    seqlen_new: int = 1
    nheads: int = 4
    nheads_k: int = 2
    headdim: int = 64
    cache: int = 96
    block: int | None = None
    batch_idx: bool = False
    rotary: str | None = None
    rotary_dim: int = 0
    seqlens: str | None = "tensor"
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    scale: float | None = None
    bhsd: bool = False  # caches as (B, H, S, D) storage seen through .transpose(1, 2) (Hugging Face's layout)


CASES = [
    KvcacheCase("decode"),
    KvcacheCase("decode-mha-causal", nheads=4, nheads_k=4, causal=True),
    KvcacheCase("decode-paged16-gqa4", nheads=8, nheads_k=2, block=16, causal=True),
    KvcacheCase("chunk-paged64-rotary-interleaved", seqlen_q=5, seqlen_new=5, block=64, rotary="interleaved",
                rotary_dim=64, causal=True, nheads=6, nheads_k=2),
    KvcacheCase("chunk-paged256-rotary-half-partial", seqlen_q=4, seqlen_new=4, block=256, rotary="half",
                rotary_dim=32, causal=True),
    KvcacheCase("batch-idx-rotary-noncausal", seqlen_q=3, seqlen_new=3, batch_idx=True, rotary="half", rotary_dim=64),
    KvcacheCase("batch-idx-window", seqlen_q=4, seqlen_new=2, batch_idx=True, window=(7, 0), nheads=8, nheads_k=1),
    KvcacheCase("rotary-window-both-sides", seqlen_q=3, seqlen_new=3, rotary="interleaved", rotary_dim=16,
                window=(5, 2)),
    KvcacheCase("no-append-softcap-int-seqlens", seqlen_q=6, seqlen_new=0, seqlens="int", softcap=5.0, causal=True),
    KvcacheCase("whole-cache", seqlen_q=2, seqlen_new=0, seqlens=None, block=16, scale=0.3),
    KvcacheCase("odd-headdim-speculative", seqlen_q=4, seqlen_new=4, headdim=40, causal=True, cache=50),
    KvcacheCase("empty-cache-one-key", batch=2, seqlen_q=1, seqlen_new=1, cache=16),
    KvcacheCase("bhsd-cache-rotary", seqlen_q=2, seqlen_new=2, bhsd=True, rotary="half", rotary_dim=64, causal=True),
    # chunks of prefill with more query rows a kv head than the CUDA decode kernel takes (256): the varlen kernels,
    # reading a paged cache's pages in place on sm_90a (pages of 16 .. 256 keys, 48 not a power of two; the pipelined
    # kernel, the warp-specialized twin at d 128 / 256 causal, separate K and V stages at d 192 / 256, key tiles that
    # start mid-page), else gathered (head dim 36)
    KvcacheCase("prefill-paged16-gqa4", seqlen_q=80, seqlen_new=80, nheads=8, nheads_k=2, block=16, cache=400,
                causal=True),
    KvcacheCase("prefill-paged48-noncausal-d128", seqlen_q=70, seqlen_new=0, nheads=8, nheads_k=2, headdim=128,
                block=48, cache=300),
    KvcacheCase("prefill-paged64-window-d128", seqlen_q=90, seqlen_new=30, nheads=8, nheads_k=2, headdim=128,
                block=64, cache=500, window=(100, 0)),
    KvcacheCase("prefill-paged256-softcap-mha", seqlen_q=300, seqlen_new=300, nheads=2, nheads_k=2, block=256,
                cache=700, causal=True, softcap=5.0),
    KvcacheCase("prefill-paged32-odd-headdim", seqlen_q=70, seqlen_new=70, nheads=8, nheads_k=2, headdim=36,
                block=32, cache=200, causal=True),
    KvcacheCase("prefill-paged48-causal-d256", seqlen_q=70, seqlen_new=70, nheads=8, nheads_k=2, headdim=256,
                block=48, cache=300, causal=True),
    KvcacheCase("prefill-paged64-noncausal-d192", seqlen_q=70, seqlen_new=20, nheads=8, nheads_k=2, headdim=192,
                block=64, cache=260),
    KvcacheCase("prefill-contiguous-gqa4", seqlen_q=80, seqlen_new=80, nheads=8, nheads_k=2, cache=300, causal=True),
]


def make_inputs(case: KvcacheCase, dtype, device, *, seed=0):
    """(args, kwargs) of attention_with_kvcache for a case: random q, caches, new rows, lengths that leave room."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    b, hk, d = case.batch, case.nheads_k, case.headdim
    q = randn(b, case.seqlen_q, case.nheads, d)
    kwargs = dict(causal=case.causal, window_left=case.window[0], window_right=case.window[1], softcap=case.softcap,
                  scale=case.scale)
    if case.block is None:
        rows = b + 2 if case.batch_idx else b
        if case.bhsd:
            k_cache, v_cache = (randn(rows, hk, case.cache, d).transpose(1, 2) for _ in range(2))
        else:
            k_cache, v_cache = randn(rows, case.cache, hk, d), randn(rows, case.cache, hk, d)
        capacity = case.cache
        if case.batch_idx:
            kwargs["cache_batch_idx"] = torch.randperm(rows, generator=g)[:b].to(torch.int32).to(device)
    else:
        max_blocks = -(-case.cache // case.block)
        num_blocks = b * max_blocks + 3
        k_cache, v_cache = randn(num_blocks, case.block, hk, d), randn(num_blocks, case.block, hk, d)
        table = torch.randperm(num_blocks, generator=g)[:b * max_blocks].view(b, max_blocks)
        kwargs["block_table"] = table.to(torch.int32).to(device)
        capacity = max_blocks * case.block
    k = v = None
    if case.seqlen_new:
        k, v = randn(b, case.seqlen_new, hk, d), randn(b, case.seqlen_new, hk, d)
    if case.name.startswith("empty-cache"):
        lengths = torch.zeros(b, dtype=torch.int32)
    else:
        lengths = torch.randint(0, capacity - case.seqlen_new + 1, (b,), generator=g, dtype=torch.int32)
        lengths[0] = capacity - case.seqlen_new  # one sequence fills its cache exactly
    if case.seqlens == "tensor":
        kwargs["cache_seqlens"] = lengths.to(device)
    elif case.seqlens == "int":
        kwargs["cache_seqlens"] = int(lengths[0])
    if case.rotary is not None:
        inv_freq = 1.0 / (10000 ** (torch.arange(0, case.rotary_dim, 2, dtype=torch.float32) / case.rotary_dim))
        angles = torch.arange(capacity, dtype=torch.float32)[:, None] * inv_freq[None]
        kwargs.update(rotary_cos=angles.cos().to(dtype).to(device), rotary_sin=angles.sin().to(dtype).to(device),
                      rotary_interleaved=case.rotary == "interleaved")
    return (q, k_cache, v_cache, k, v), kwargs


_ROTARY = ("rotary_cos", "rotary_sin", "rotary_interleaved")


def rotated_q(q, kwargs, case):
    """q as the op rotates it (fa2.reference.rotary_ref at cache_seqlens[b] (+ i when causal or windowed))."""
    if case.rotary is None:
        return q
    per_row = case.causal or case.window != (-1, -1)
    first = kwargs["cache_seqlens"].long()[:, None]
    rows = torch.arange(case.seqlen_q, device=q.device)[None]
    return rotary_ref(q, kwargs["rotary_cos"], kwargs["rotary_sin"], first + (rows if per_row else 0 * rows),
                      kwargs["rotary_interleaved"])


def check_against_reference(case, dtype, device, seed=0):
    """The caches after the call equal the reference append's; out and lse follow the numerics rule against the
    attention over the appended caches (the reference's rotated q and keys, so rotary's rounding is the same on both
    sides)."""
    (q, k_cache, v_cache, k, v), kwargs = make_inputs(case, dtype, device, seed=seed)
    _, _, k_cache_ref, v_cache_ref = kvcache_attention_ref(q, k_cache, v_cache, k, v, **kwargs)
    out, lse = fa2.attention_with_kvcache(q, k_cache, v_cache, k, v, return_lse=True, **kwargs)
    assert out.shape == q.shape[:3] + (v_cache.shape[3],) and out.dtype == dtype, case
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32, case
    # exact, but for CUDA's rotary (fp32 math with its own FMA contractions: a last-bit difference in the dtype)
    k_tol = dict(rtol=0, atol=0) if device == "cpu" or case.rotary is None else {}
    torch.testing.assert_close(k_cache, k_cache_ref, **k_tol, msg=lambda m: f"k_cache after the call ({case}): {m}")
    torch.testing.assert_close(v_cache, v_cache_ref, rtol=0, atol=0, msg=lambda m: f"v_cache ({case}): {m}")

    # the attention: nothing left to append, each sequence's keys now cached_b + seqlen_new
    attn = {key: value for key, value in kwargs.items() if key not in _ROTARY}
    lengths = kwargs.get("cache_seqlens")
    if lengths is not None:
        attn["cache_seqlens"] = lengths + case.seqlen_new
    q_rot = rotated_q(q, kwargs, case)
    hi = hi_dtype(dtype)
    out_hi, lse_hi, _, _ = kvcache_attention_ref(q_rot.to(hi), k_cache_ref.to(hi), v_cache_ref.to(hi), **attn)
    out_naive, _, _, _ = kvcache_attention_ref(q_rot, k_cache_ref, v_cache_ref, upcast=False, **attn)
    assert_close_rule(f"out ({case.name})", out, out_hi, out_naive, 2)
    finite = torch.isfinite(lse_hi)
    assert torch.equal(torch.isfinite(lse), finite), f"lse: rows that see no key must be +inf ({case})"
    assert (lse[~finite] == math.inf).all(), case
    lse_tol = 1e-3 if dtype in (torch.float16, torch.bfloat16) else 1e-5
    assert torch.allclose(lse[finite], lse_hi[finite].float(), atol=lse_tol, rtol=lse_tol), case


def _reference_params():
    # quick profile: every case in float32 on the CPU (and every CUDA case), every 4th in the CPU's other dtypes
    for (device, dtype), dev_id in zip(DEVICE_DTYPES, IDS):
        for index, case in enumerate(CASES):
            quick = device == "cuda" or dtype == torch.float32 or index % 4 == 0
            yield pytest.param(device, dtype, case, id=f"{dev_id}-{case.name}",
                               marks=() if quick else (pytest.mark.slow,))


@pytest.mark.parametrize("device,dtype,case", list(_reference_params()))
def test_kvcache_matches_reference(device, dtype, case):
    _needs(device)
    check_against_reference(case, dtype, device)


@pytest.mark.parametrize("splits", [0, 3], ids=["unsplit", "splits3"])
@pytest.mark.parametrize("case", [
    KvcacheCase("decode-paged48-long", nheads=8, nheads_k=2, block=48, cache=1100, causal=True),
    KvcacheCase("speculative-paged48-window", seqlen_q=3, seqlen_new=3, nheads=8, nheads_k=1, block=48, cache=1300,
                window=(600, 0)),
    KvcacheCase("decode-contiguous-long-softcap", nheads=4, nheads_k=1, cache=1500, softcap=4.0),
], ids=lambda c: c.name)
def test_cpu_long_caches_split_or_not_match_reference(case, splits):
    """The CPU kernel over caches of several key blocks (paged: blocks of 48 keys, so key tiles span blocks), each
    tile's keys whole or split into three runs (development option cpu_key_splits) and merged: within the rule."""
    with fa2.dev.options_override(cpu_key_splits=splits):
        check_against_reference(case, torch.float32, "cpu")


def _poison_past_lengths(case, k_cache, v_cache, kwargs):
    """Copies of the caches with NaN in every row past each sequence's keys after the call's append (cache_seqlens +
    seqlen_new): the rest of its cache row or of its last page, unused cache rows and pages whole."""
    k_bad, v_bad = k_cache.clone(), v_cache.clone()
    ends = (kwargs["cache_seqlens"] + case.seqlen_new).tolist()
    keep = torch.zeros(k_bad.shape[:2], dtype=torch.bool, device=k_bad.device)  # (cache row or page, position)
    for b, end in enumerate(ends):
        if case.block is None:
            keep[kwargs["cache_batch_idx"][b] if case.batch_idx else b, :end] = True
        else:
            positions = torch.arange(end, device=k_bad.device)
            keep[kwargs["block_table"][b].long()[positions // case.block], positions % case.block] = True
    k_bad[~keep], v_bad[~keep] = math.nan, math.nan
    return k_bad, v_bad


@pytest.mark.parametrize("device,route", [("cpu", None), ("cuda", "sm90a"), ("cuda", "sm80")])
@pytest.mark.parametrize("case", [c for c in CASES if c.name in (
    "decode-paged16-gqa4", "batch-idx-window", "prefill-paged16-gqa4", "prefill-paged48-noncausal-d128",
    "prefill-paged48-causal-d256", "prefill-paged64-noncausal-d192", "prefill-contiguous-gqa4")] + [
    KvcacheCase("prefill-contiguous-d128", seqlen_q=80, seqlen_new=30, nheads=8, nheads_k=2, headdim=128, cache=300),
    KvcacheCase("prefill-contiguous-causal-d256", seqlen_q=70, seqlen_new=70, nheads=4, nheads_k=2, headdim=256,
                cache=250, causal=True)], ids=lambda c: c.name)
def test_unwritten_cache_rows_never_reach_the_output(device, route, case):
    """A cache holds whatever its owner left past each sequence's keys (torch.empty's bytes, NaN among them), as
    flash-attn's flash_attn_with_kvcache allows: the output is the one computed with finite values there, bitwise.
    (P is 0 for those keys, but 0 * NaN is NaN: the sm_90a varlen kernels' TMA loads a key tile's rows past the
    sequence as they are and zero them first; the decode kernel's and the sm80 loads write zeros.) On compute
    capability 9.0 both varlen routes (development option sm90_varlen)."""
    _needs(device)
    if route == "sm80" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm80 route is every other GPU's: taken by the sm90a case there")
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    (q, k_cache, v_cache, k, v), kwargs = make_inputs(case, dtype, device)
    k_bad, v_bad = _poison_past_lengths(case, k_cache, v_cache, kwargs)
    with fa2.dev.options_override(sm90_varlen=(route == "sm90a")) if route else contextlib.nullcontext():
        out, lse = fa2.attention_with_kvcache(q, k_cache, v_cache, k, v, return_lse=True, **kwargs)
        out_bad, lse_bad = fa2.attention_with_kvcache(q, k_bad, v_bad, k, v, return_lse=True, **kwargs)
    assert torch.isfinite(out_bad).all(), f"{case.name}: NaN from the cache rows past the sequences"
    assert torch.equal(out_bad, out) and torch.equal(lse_bad, lse), case.name


# ---- bad input: a clear error naming the argument, the caches unchanged ------------------------------------------

def _decode_inputs(device="cpu", dtype=torch.float32, paged=False):
    case = KvcacheCase("bad", seqlen_q=2, seqlen_new=2, block=16 if paged else None, cache=32)
    return make_inputs(case, dtype, device)


BAD_INPUTS = [
    # (name, change to (args, kwargs), exception, text in the message)
    ("cache-too-short", lambda a, kw: kw.update(cache_seqlens=torch.tensor([31, 0, 0], dtype=torch.int32)),
     ValueError, "cache is too short for sequence 0"),
    ("negative-seqlens", lambda a, kw: kw.update(cache_seqlens=torch.tensor([0, -1, 0], dtype=torch.int32)),
     ValueError, "cache_seqlens[1] must be >= 0"),
    ("seqlens-int64", lambda a, kw: kw.update(cache_seqlens=kw["cache_seqlens"].long()), TypeError,
     "cache_seqlens must be int32"),
    ("seqlens-shape", lambda a, kw: kw.update(cache_seqlens=torch.zeros(4, dtype=torch.int32)), ValueError,
     "cache_seqlens must have shape (batch,)"),
    ("cache-dtype", lambda a, kw: a.__setitem__(1, a[1].double()), TypeError, "k_cache must have q's dtype"),
    ("new-k-dtype", lambda a, kw: a.__setitem__(3, a[3].half()), TypeError, "k must have q's dtype"),
    ("k-without-v", lambda a, kw: a.__setitem__(4, None), ValueError, "k and v (the new keys and values)"),
    ("k-heads", lambda a, kw: a.__setitem__(3, a[3][:, :, :1]), ValueError, "k must have shape"),
    ("cache-headdim", lambda a, kw: a.__setitem__(1, a[1][..., :32]), ValueError, "k_cache's headdim"),
    ("v-cache-shape", lambda a, kw: a.__setitem__(2, a[2][:, :16]), ValueError, "v_cache must have k_cache's"),
    ("gqa", lambda a, kw: a.__setitem__(0, a[0][:, :, :3]), ValueError, "must be a multiple of nheads_k"),
    ("batch-idx-range", lambda a, kw: kw.update(cache_batch_idx=torch.tensor([0, 3, 1], dtype=torch.int32)),
     ValueError, "cache_batch_idx[1] must be in [0, 3)"),
    ("too-few-cache-rows", lambda a, kw: (a.__setitem__(1, a[1][:2]), a.__setitem__(2, a[2][:2])), ValueError,
     "k_cache must have a row per batch element"),
    ("no-room-without-seqlens", lambda a, kw: kw.pop("cache_seqlens"), ValueError, "no room to append k"),
    ("rotary-dim", lambda a, kw: kw.update(rotary_cos=torch.ones(32, 4), rotary_sin=torch.ones(32, 4)), ValueError,
     "must be a multiple of 16"),
    ("rotary-too-short", lambda a, kw: kw.update(rotary_cos=torch.ones(31, 8), rotary_sin=torch.ones(31, 8)),
     ValueError, "seqlen_ro >= 32"),
    ("rotary-one-of-two", lambda a, kw: kw.update(rotary_cos=torch.ones(32, 8)), ValueError,
     "rotary_cos and rotary_sin must be given together"),
    ("window", lambda a, kw: kw.update(window_left=-2), ValueError, "window_left must be >= -1"),
    ("num-splits", lambda a, kw: kw.update(num_splits=-1), ValueError, "num_splits must be >= 0"),
    ("meta-k", lambda a, kw: a.__setitem__(3, a[3].to("meta")), RuntimeError, "k must be on q's device"),
]
PAGED_BAD_INPUTS = [
    ("block-out-of-range", lambda a, kw: kw["block_table"].__setitem__((1, 1), 99), ValueError,
     "block_table[1, 1] = 99 is out of range"),
    ("block-negative", lambda a, kw: kw["block_table"].__setitem__((0, 0), -1), ValueError,
     "block_table[0, 0] = -1 is out of range"),
    ("block-size", lambda a, kw: (a.__setitem__(1, a[1][:, :8]), a.__setitem__(2, a[2][:, :8])), ValueError,
     "block size (k_cache.size(1)) must be a positive multiple of 16"),
    ("paged-with-batch-idx", lambda a, kw: kw.update(cache_batch_idx=torch.zeros(3, dtype=torch.int32)), ValueError,
     "cache_batch_idx cannot be used with a paged cache"),
    ("table-dtype", lambda a, kw: kw.update(block_table=kw["block_table"].long()), TypeError,
     "block_table must be int32"),
    ("paged-too-short", lambda a, kw: kw.update(cache_seqlens=torch.tensor([0, 31, 0], dtype=torch.int32)),
     ValueError, "cache is too short for sequence 1"),
]


@pytest.mark.parametrize("paged,name,change,error,text",
                         [(False, *b) for b in BAD_INPUTS] + [(True, *b) for b in PAGED_BAD_INPUTS],
                         ids=[b[0] for b in BAD_INPUTS] + [b[0] for b in PAGED_BAD_INPUTS])
def test_bad_input_is_a_clear_error_and_leaves_the_cache(paged, name, change, error, text):
    args, kwargs = _decode_inputs(paged=paged)
    args = list(args)
    change(args, kwargs)
    caches = [t.clone() for t in args[1:3]]
    with pytest.raises(error) as info:
        fa2.attention_with_kvcache(*args, **kwargs)
    assert text in str(info.value), f"{name}: {info.value}"
    assert torch.equal(args[1], caches[0]) and torch.equal(args[2], caches[1]), f"{name}: the cache changed"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_an_int_cache_seqlens_is_checked_on_every_device(device, paged):
    """An int cache_seqlens is a host value: out of range, it is an error on CUDA too (no sync needed)."""
    _needs(device)
    args, kwargs = _decode_inputs(device, torch.float16 if device == "cuda" else torch.float32, paged=paged)
    caches = [t.clone() for t in args[1:3]]
    with pytest.raises(ValueError, match="cache_seqlens must be >= 0"):
        fa2.attention_with_kvcache(*args, **dict(kwargs, cache_seqlens=-1))
    with pytest.raises(ValueError, match="the cache is too short: cache_seqlens \\+ seqlen_new = 31 \\+ 2"):
        fa2.attention_with_kvcache(*args, **dict(kwargs, cache_seqlens=31))
    assert torch.equal(args[1], caches[0]) and torch.equal(args[2], caches[1])
    fa2.attention_with_kvcache(*args, **dict(kwargs, cache_seqlens=30))  # (the last two positions: fine)


@pytest.mark.parametrize("which", [0, 3], ids=["q", "k"])
def test_forward_only_refuses_inputs_that_require_grad(which):
    """Any tensor input (positional or optional) that requires grad under grad mode is an error, raised before the
    caches are touched (cpp/forward_only.cpp); under no_grad the same call runs."""
    args, kwargs = _decode_inputs()
    args[which].requires_grad_()
    before = args[1].clone()
    with pytest.raises(RuntimeError, match="forward only"):
        fa2.attention_with_kvcache(*args, **kwargs)
    assert torch.equal(args[1], before)
    with torch.no_grad():
        out = fa2.attention_with_kvcache(*args, **kwargs)
    assert not out.requires_grad


def test_returns_out_alone_by_default_and_lse_with_return_lse():
    args, kwargs = _decode_inputs()
    out = fa2.attention_with_kvcache(*[a.clone() if a is not None else None for a in args], **kwargs)
    out2, lse = fa2.attention_with_kvcache(*args, return_lse=True, **kwargs)
    assert isinstance(out, torch.Tensor) and torch.equal(out, out2) and lse.dtype == torch.float32


# ---- opcheck, torch.compile -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[5]], ids=lambda c: c.name)
def test_opcheck(case):
    (q, k_cache, v_cache, k, v), kwargs = make_inputs(case, torch.float32, "cpu")
    if isinstance(kwargs.get("cache_seqlens"), int):
        kwargs["cache_seqlens"] = torch.full((case.batch,), kwargs["cache_seqlens"], dtype=torch.int32)
    torch.library.opcheck(torch.ops.fa2.kvcache_fwd.default, (q, k_cache, v_cache, k, v), kwargs)


def test_compiled_decode_step_has_no_graph_break():
    """A decode step (new token appended at cache_seqlens, rotary, GQA, causal) compiled with fullgraph=True: same
    outputs and caches as eager, over several steps (cache_seqlens a tensor that advances; one compilation)."""
    torch._dynamo.reset()
    case = KvcacheCase("compiled", batch=2, nheads=4, nheads_k=2, headdim=32, cache=64, rotary="half", rotary_dim=32,
                       causal=True)
    (q, k_cache, v_cache, k, v), kwargs = make_inputs(case, torch.float32, "cpu")
    kwargs["cache_seqlens"] = torch.tensor([3, 10], dtype=torch.int32)
    cos, sin = kwargs["rotary_cos"], kwargs["rotary_sin"]

    def step(q, k, v, k_cache, v_cache, cache_seqlens):
        out = fa2.attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, rotary_cos=cos,
                                         rotary_sin=sin, causal=True)
        return out * 2

    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = torch.compile(step, fullgraph=True)
    eager_caches = [k_cache.clone(), v_cache.clone()]
    for _ in range(3):
        q, k, v = (torch.randn_like(t) for t in (q, k, v))
        seqlens = kwargs["cache_seqlens"]
        got = compiled(q, k, v, k_cache, v_cache, seqlens)
        want = step(q, k, v, *eager_caches, seqlens)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(k_cache, eager_caches[0], rtol=0, atol=0)
        torch.testing.assert_close(v_cache, eager_caches[1], rtol=0, atol=0)
        kwargs["cache_seqlens"] = seqlens + 1
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


# ---- CUDA: the device-side guard, CUDA graphs ------------------------------------------------------------------------

def _sm90a_varlen(headdim: int) -> bool:
    """Whether the KV-cache op's varlen fallback runs the sm_90a kernels at this head dim (bf16), which compute each
    sequence's bounds themselves; the sm80 path's kernels read index tensors the glue builds."""
    info = fa2.build_info()
    return (torch.cuda.get_device_capability() == (9, 0) and headdim % 8 == 0 and
            f"fwd_bf16_hdim{headdim}_sm90a" in info["kernels"].split(",") and
            all(fa2.dev.options()[o] for o in ("sm90_varlen", "arch_specific_kernels")))


def _reads_pages_in_place(case) -> bool:
    """Whether the sm_90a varlen kernels take this case's paged prefill (kPagedKvDeclined otherwise: a gather)."""
    return _sm90a_varlen(case.headdim) and fa2.dev.options()["paged_kv_in_place"]


def _gathers(args, kwargs) -> bool:
    """Whether the KV-cache call gathers the pages (aten::index_select in a profile of it)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fa2.attention_with_kvcache(*args, **kwargs)
    return any(event.name == "aten::index_select" for event in prof.events())


_TENSOR_OPS = {"aten::arange", "aten::clamp", "aten::clamp_", "aten::add", "aten::add_", "aten::cat", "aten::full",
               "aten::fill_", "aten::copy_", "aten::index_select", "aten::zeros", "aten::mul"}


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("seqlen_new", [0, 16])
def test_cuda_prefill_chunk_launches_only_its_kernels(paged, seqlen_new):
    """A chunk of prefill (batch 1, more query rows a kv head than the decode kernel takes) runs no tensor op around
    its kernels (the append's, the attention's): the sm_90a varlen kernels compute each sequence's rows and key count
    (cache_seqlens + seqlen_new, clamped) themselves, so no index tensor is built (each would be a launch of a few
    microseconds before a chunk's attention of tens). A paged cache is read in place there. (The sm80 path's kernels
    read index tensors: skipped where they run.)"""
    _needs("cuda")
    case = KvcacheCase("chunk", batch=1, seqlen_q=160, seqlen_new=seqlen_new, nheads=8, nheads_k=2, headdim=128,
                       block=64 if paged else None, cache=512, causal=True)
    if not (_reads_pages_in_place(case) if paged else _sm90a_varlen(case.headdim)):
        pytest.skip("the sm80 path's varlen kernels on this GPU or build: they read index tensors")
    args, kwargs = make_inputs(case, torch.bfloat16, "cuda")
    fa2.attention_with_kvcache(*args, **kwargs)  # (first call: anything lazily set up)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fa2.attention_with_kvcache(*args, **kwargs)
    ops = {event.name for event in prof.events()}
    assert not ops & _TENSOR_OPS, f"tensor ops around the attention: {sorted(ops & _TENSOR_OPS)}"


@pytest.mark.parametrize("name", ["prefill-paged16-gqa4", "prefill-paged256-softcap-mha", "prefill-paged32-odd-headdim",
                                  "prefill-paged48-causal-d256"])
def test_cuda_paged_prefill_reads_the_pages_in_place(name):
    """A chunk of prefill the decode kernel does not take reads a paged cache's pages in place on sm_90a (the
    varlen kernels' TMA loads a box per page: no gathered copy, no index_select); a headdim the TMA cannot take there
    (not a multiple of 8), and every other GPU, gathers the pages first. The results: test_kvcache_matches_reference."""
    _needs("cuda")
    case = next(c for c in CASES if c.name == name)
    args, kwargs = make_inputs(case, torch.bfloat16, "cuda")
    in_place = _reads_pages_in_place(case)
    assert _gathers(args, kwargs) != in_place, f"{name}: expected the pages {'in place' if in_place else 'gathered'}"


@pytest.mark.parametrize("headdim", [64, 128])
def test_cuda_paged_prefill_with_bad_pages_stays_inside(headdim):
    """A chunk of prefill over a paged cache whose table names pages out of range (99, -1), among a sequence's keys
    and past them: no fault and finite outputs (sm_90a reads such a page as the TMA's zeros; the pipelined kernel at
    d 64, the warp-specialized twin at d 128, causal), the caches unchanged, the other sequence's result as with a
    good table."""
    _needs("cuda")
    case = KvcacheCase("bad-pages", batch=2, seqlen_q=80, seqlen_new=0, nheads=8, nheads_k=2, headdim=headdim,
                       block=16, cache=96, causal=True)
    (q, k_cache, v_cache, _, _), kwargs = make_inputs(case, torch.bfloat16, "cuda")
    assert _gathers((q, k_cache, v_cache), kwargs) != _reads_pages_in_place(case)
    good = fa2.attention_with_kvcache(q, k_cache, v_cache, **kwargs)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    table = kwargs["block_table"].clone()
    table[0, 1], table[0, -1] = 99, -1  # (sequence 0 fills its cache: both are among its keys)
    out = fa2.attention_with_kvcache(q, k_cache, v_cache, **dict(kwargs, block_table=table))
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)
    assert torch.equal(out[1], good[1]), "sequence 1's table is unchanged"


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_cuda_bad_indices_never_touch_memory_outside_the_cache(paged):
    """On CUDA the index values are not checked on the host (no sync): cache_seqlens past the capacity and block ids
    out of range must still never write outside the caches (rows past the capacity, bad blocks: skipped)."""
    _needs("cuda")
    dtype, device = torch.bfloat16, "cuda"
    g = torch.Generator().manual_seed(1)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    # the caches are the middle of larger buffers: everything around them must stay as it was
    big_k, big_v = randn(7, 40, 2, 64), randn(7, 40, 2, 64)
    if paged:  # 5 blocks of 32; the batch's tables point at blocks 99, -1 and 5 (out of range) past their first
        k_cache, v_cache = big_k[1:6, 4:36], big_v[1:6, 4:36]
        table = torch.tensor([[0, 99], [1, -1], [2, 5]], dtype=torch.int32, device=device)
        kwargs = dict(block_table=table)
    else:
        k_cache, v_cache = big_k[1:4, 4:36], big_v[1:4, 4:36]
        kwargs = dict(cache_batch_idx=torch.tensor([0, 7, 2], dtype=torch.int32, device=device))
    inside = torch.zeros(big_k.shape[:2], dtype=torch.bool, device=device)
    inside[1:6 if paged else 4, 4:36] = True
    before_k, before_v = big_k.clone(), big_v.clone()
    q, k, v = randn(3, 4, 4, 64), randn(3, 4, 2, 64), randn(3, 4, 2, 64)
    seqlens = torch.tensor([30, 30, 40], dtype=torch.int32, device=device)  # 30 + 4 and 40 are past 32 (or 64)
    out = fa2.attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=True, **kwargs)
    torch.cuda.synchronize()
    assert torch.equal(big_k[~inside], before_k[~inside]) and torch.equal(big_v[~inside], before_v[~inside])
    assert not torch.isnan(out).any()
    if paged:  # sequence 0: positions 30, 31 in block 0, 32, 33 in block 99 (skipped)
        assert torch.equal(k_cache[0, 30:32], k[0, :2]) and torch.equal(v_cache[0, 30:32], v[0, :2])
    else:  # sequence 0 (row 0): 30, 31 written, 32, 33 past the capacity; sequence 1's row 7 is out of range
        assert torch.equal(k_cache[0, 30:32], k[0, :2])
        assert torch.equal(k_cache[1], before_k[2, 4:36]), "row 1 belongs to no batch element"


@pytest.mark.parametrize("layout", ["contiguous", "paged", "batch-idx"])
@pytest.mark.parametrize("seqlen_q,route", [(1, None), (130, "sm90a"), (130, "sm80")],
                         ids=["decode", "varlen-sm90a", "varlen-sm80"])
def test_cuda_cache_seqlens_out_of_range_clamp_to_the_capacity(seqlen_q, route, layout):
    """cache_seqlens + the appended rows is clamped to [0, capacity] on the device (in 64 bits: a value near INT32_MAX
    does not wrap): a sequence pushed below 0 sees no key (out 0), one past the end sees the whole cache. Both
    attention routes: the decode kernel (one query) and the varlen kernels (130 queries: 260 rows a kv head, more than
    the decode kernel takes), which compute each sequence's bounds from cache_seqlens themselves; on compute
    capability 9.0 both varlen routes (development option sm90_varlen)."""
    _needs("cuda")
    if route == "sm80" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm80 route is every other GPU's: taken by the sm90a case there")
    if route == "sm90a" and not _sm90a_varlen(64) and torch.cuda.get_device_capability() == (9, 0):
        pytest.skip("no sm_90a varlen kernels at head dim 64 in this build or options: the sm80 case covers it")
    g = torch.Generator().manual_seed(3)
    dtype, device = torch.bfloat16, "cuda"
    k_cache, v_cache = (torch.randn(4, 64, 2, 64, generator=g).to(dtype).to(device) for _ in range(2))
    q = torch.randn(4, seqlen_q, 4, 64, generator=g).to(dtype).to(device)
    k, v = (torch.randn(4, 1, 2, 64, generator=g).to(dtype).to(device) for _ in range(2))
    seqlens = torch.tensor([-5, 63, 100, 2**31 - 1], dtype=torch.int32, device=device)
    # sequence b's keys are k_cache[b]; paged: 16 blocks of 16 keys, its 4 blocks in reverse order; batch-idx: the
    # cache's rows permuted
    if layout == "paged":
        place = lambda cache: cache.reshape(4, 4, 16, 2, 64).flip(1).reshape(16, 16, 2, 64).clone()
        table = (torch.arange(16, dtype=torch.int32, device=device).reshape(4, 4) // 4 * 4 + 3
                 - torch.arange(4, dtype=torch.int32, device=device))
        extra, appended_row = dict(block_table=table), lambda c: c[table[1, 3], 15]
    elif layout == "batch-idx":
        perm = torch.tensor([2, 0, 3, 1], device=device)
        place = lambda cache: cache[perm].clone()
        idx = torch.argsort(perm).to(torch.int32)
        extra, appended_row = dict(cache_batch_idx=idx), lambda c: c[idx[1], 63]
    else:
        place, extra, appended_row = torch.clone, {}, lambda c: c[1, 63]
    k_in, v_in = place(k_cache), place(v_cache)
    with fa2.dev.options_override(sm90_varlen=(route == "sm90a")) if route else contextlib.nullcontext():
        out = fa2.attention_with_kvcache(q, k_in, v_in, k, v, cache_seqlens=seqlens, **extra)
    assert torch.equal(appended_row(k_in), k[1, 0]), "row 63 of sequence 1 is appended"
    k_cache[1, 63], v_cache[1, 63] = k[1, 0], v[1, 0]
    for b, keys in enumerate([0, 64, 64, 64]):
        if keys == 0:
            assert (out[b] == 0).all(), "a sequence with no key outputs 0"
            continue
        want = attention_ref(q[b:b + 1], k_cache[b:b + 1, :keys], v_cache[b:b + 1, :keys])
        torch.testing.assert_close(out[b:b + 1].float(), want.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_cuda_graph_capture_and_replay_of_decode_steps(paged):
    """A decode step (append + rotary + attention) captured once in a CUDA graph and replayed for several tokens, the
    inputs and cache_seqlens updated in place between replays: the same outputs and caches as eager calls."""
    _needs("cuda")
    case = KvcacheCase("graph", batch=4, nheads=8, nheads_k=2, headdim=128, cache=256, block=64 if paged else None,
                       rotary="half", rotary_dim=64, causal=True)
    (q, k_cache, v_cache, k, v), kwargs = make_inputs(case, torch.bfloat16, "cuda")
    seqlens = torch.tensor([5, 17, 0, 100], dtype=torch.int32, device="cuda")
    kwargs["cache_seqlens"] = seqlens
    flags = {key: value for key, value in kwargs.items() if key != "cache_seqlens"}
    eager_k, eager_v = k_cache.clone(), v_cache.clone()
    static_q, static_k, static_v, static_seqlens = q.clone(), k.clone(), v.clone(), seqlens.clone()

    def step():
        return fa2.attention_with_kvcache(static_q, k_cache, v_cache, static_k, static_v,
                                          cache_seqlens=static_seqlens, **flags)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (as torch.cuda.graphs' docs do)
        step()
    torch.cuda.current_stream().wait_stream(side)
    k_cache.copy_(eager_k)  # (the warm-up appended)
    v_cache.copy_(eager_v)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    for token in range(3):
        q, k, v = (torch.randn_like(t) for t in (q, k, v))
        static_q.copy_(q), static_k.copy_(k), static_v.copy_(v)
        graph.replay()
        want = fa2.attention_with_kvcache(q, eager_k, eager_v, k, v, cache_seqlens=seqlens, **flags)
        torch.cuda.synchronize()
        torch.testing.assert_close(static_out, want, rtol=0, atol=0, msg=lambda m: f"token {token}: {m}")
        torch.testing.assert_close(k_cache, eager_k, rtol=0, atol=0, msg=lambda m: f"token {token}: {m}")
        torch.testing.assert_close(v_cache, eager_v, rtol=0, atol=0, msg=lambda m: f"token {token}: {m}")
        static_seqlens.add_(1)
        seqlens = seqlens + 1


# ---- Hugging Face generation ----------------------------------------------------------------------------------------

def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    import fa2.hf
    fa2.hf.register()
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _greedy(model, implementation, ids, mask, cache):
    model.set_attn_implementation(implementation)
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, **kwargs)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_hf_greedy_generation_matches_sdpa(cache):
    """attn_implementation="fa2" generates sdpa's tokens, token for token (tiny Llama, GQA, a left-padded row), with
    transformers' dynamic cache and its static cache (transformers appends to its caches itself; fa2 reads them)."""
    model = _tiny_llama()
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    want = _greedy(model, "sdpa", ids, mask, cache)
    got = _greedy(model, "fa2", ids, mask, cache)
    assert torch.equal(got, want), (got[:, ids.shape[1]:], want[:, ids.shape[1]:])


@pytest.mark.slow
def test_hf_compiled_static_cache_generation_matches_sdpa():
    """The static cache with the model's forward compiled (fullgraph): sdpa's tokens."""
    model = _tiny_llama()
    ids = torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    want = _greedy(model, "sdpa", ids, mask, "static")
    torch._dynamo.reset()
    forward = model.forward
    model.forward = torch.compile(forward, fullgraph=True)
    try:
        got = _greedy(model, "fa2", ids, mask, "static")
    finally:
        model.forward = forward
    assert torch.equal(got, want)


def _generate_batch(model, implementation, prompts, monkeypatch, decode_fast_path):
    """transformers' continuous batching (generate_batch, paged cache of 32-token blocks) on the CPU."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import cache as cb_cache, initialization
    # (transformers sizes the cache from the free device memory, which it cannot read on a CPU without psutil)
    monkeypatch.setattr(cb_cache.PagedAttentionMemoryHandler, "get_available_memory", lambda self: 1 << 30)
    if decode_fast_path:
        # transformers 5.17 passes a block table (decode-only batches) to flash-attn's implementations on CUDA only:
        # lift that gate so that "paged|fa2" gets block tables here too
        monkeypatch.setattr(initialization, "ensure_decode_fast_path_is_available", lambda *args, **kwargs: None)
    model.set_attn_implementation(implementation)
    config = GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=-1, pad_token_id=0)
    batching = ContinuousBatchingConfig(block_size=32, num_blocks=16, max_batch_tokens=64,
                                        max_blocks_per_request=4 if decode_fast_path else 0)
    with torch.no_grad():
        out = model.generate_batch(prompts, generation_config=config, continuous_batching_config=batching,
                                   warmup=False)
    return [out[key].generated_tokens for key in sorted(out)]


@pytest.mark.parametrize("decode_fast_path", [False, True], ids=["varlen", "block-table"])
def test_hf_continuous_batching_matches_paged_sdpa(monkeypatch, decode_fast_path):
    """attn_implementation "paged|fa2" (transformers' continuous batching): "paged|sdpa"'s tokens. Prefill batches run
    fa2.varlen_attention over the keys the paged cache reads back; decode-only batches with a block table run
    fa2.attention_with_kvcache on the paged cache (appending the token itself)."""
    model = _tiny_llama()
    prompts = [[5, 9, 33, 7, 100], [17, 4, 8], [60, 61, 62, 63, 64, 65, 66]]
    want = _generate_batch(model, "paged|sdpa", prompts, monkeypatch, False)
    calls = {"kvcache": 0, "varlen": 0}
    for name, key in (("attention_with_kvcache", "kvcache"), ("varlen_attention", "varlen")):
        def counted(*args, _fn=getattr(fa2, name), _key=key, **kwargs):
            calls[_key] += 1
            return _fn(*args, **kwargs)
        monkeypatch.setattr(fa2, name, counted)
    got = _generate_batch(model, "paged|fa2", prompts, monkeypatch, decode_fast_path)
    assert got == want
    assert calls["varlen"] > 0 and (calls["kvcache"] > 0) == decode_fast_path, calls
