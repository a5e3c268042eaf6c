"""Variable-length (packed) attention: fa2.varlen_attention and torch.ops.fa2.varlen_fwd / varlen_bwd against the
reference computed per sequence (fp32 / fp64) with the numerics rule, CPU and CUDA; lengths 0 and 1, GQA, every flag,
seqused_k; opcheck, torch.compile without graph breaks or recompiles, hypothesis, bad input."""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math

import pytest
import torch
from hypothesis import given, strategies as st

import fa2
from fa2.reference import varlen_attention_ref
from numerics import assert_close_rule, hi_dtype
from samples import FLAG_SETS, SHARES, dtypes_for, in_share, make_qkv, share_of, skip_without_device

DEVICE_DTYPES = [(d, t) for d in ["cpu", "cuda"] for t in dtypes_for(d)] + [("cpu", torch.float64)]
IDS = [f"{d}-{str(t).split('.')[-1]}" for d, t in DEVICE_DTYPES]


_needs = skip_without_device


# ---- samples -------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class VarlenSample:
    name: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    kwargs: dict  # the ops' keyword arguments (seqused_k, scale, causal, window_left, window_right, softcap)

    def args(self):
        return (self.q, self.k, self.v, self.cu_seqlens_q, self.cu_seqlens_k, self.max_seqlen_q, self.max_seqlen_k)

    def __repr__(self):
        return f"VarlenSample({self.name}, q={tuple(self.q.shape)}, k={tuple(self.k.shape)}, {self.q.dtype})"


def cu_seqlens(lengths, device):
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


def make_varlen(lengths_q, lengths_k, nheads, nheads_k, headdim, *, dtype, device, seqused=None, flags=None,
                layout="bshd", requires_grad=False, generator=None, max_seqlen_extra=0, name=""):
    """A packed sample from samples.make_qkv's generator (one batch entry of total_q / total_k rows; layout "bhsd"
    gives (total, heads, headdim) views of (heads, total, headdim) storage)."""
    q, k, v = make_qkv(1, sum(lengths_q), sum(lengths_k), nheads, nheads_k, headdim, dtype=dtype, device=device,
                       layout=layout, generator=generator)
    q, k, v = (t[0].requires_grad_(requires_grad) for t in (q, k, v))
    kwargs = dict(flags or {})
    used_k = lengths_k
    if seqused is not None:
        kwargs["seqused_k"] = torch.tensor(seqused, dtype=torch.int32, device=device)
        used_k = seqused
    name = name or f"{lengths_q}/{lengths_k}-h{nheads}/{nheads_k}-d{headdim}-{flags}-used{seqused}-{layout}"
    return VarlenSample(name, q, k, v, cu_seqlens(lengths_q, device), cu_seqlens(lengths_k, device),
                        max(lengths_q, default=0) + max_seqlen_extra, max(used_k, default=0) + max_seqlen_extra,
                        kwargs)


# (lengths_q, lengths_k, nheads, nheads_k, headdim): equal lengths, mixed with 0- and 1-long sequences, fewer queries
# than keys and the other way round, GQA 1:1 / 2:1 / 8:1, odd headdims, one long sequence among many short ones
# (the CPU runs it alone on every thread and shares the others out).
SHAPES = [
    ([64, 64], [64, 64], 4, 4, 64),
    ([5, 0, 1, 97, 33], [7, 3, 0, 97, 60], 4, 2, 59),
    ([1, 1, 3, 2], [40, 17, 130, 1], 8, 1, 32),
    ([70, 9, 1], [20, 9, 1], 2, 2, 111),
    ([300] + [1, 2, 3, 5, 8, 13] * 3, [280] + [2, 3, 1, 8, 5, 13] * 3, 2, 1, 64),
    ([17, 0, 40], [17, 25, 0], 3, 3, 1),
    ([33, 65], [65, 33], 2, 1, 256),
    ([129, 63], [129, 200], 2, 2, 128),
]
SHAPES_CUDA_EXTRA = [
    ([1025, 3, 500], [1025, 700, 3], 4, 2, 128),
    ([256, 256, 256, 256], [256, 256, 256, 256], 8, 2, 96),
    ([200, 1, 77], [300, 64, 77], 4, 4, 192),
    ([96, 31], [96, 160], 2, 1, 160),
]

def varlen_samples(device, dtype, *, requires_grad=False, full=False, seed=0):
    """Every shape plain and causal, every flag on three shapes (all with ``full``), seqused_k, a (heads, total) storage
    layout, a max_seqlen larger than needed, rows that see no key."""
    g = torch.Generator(device=device).manual_seed(seed)
    shapes = SHAPES + (SHAPES_CUDA_EXTRA if full else [])
    out = []

    def add(shape, flags, **extra):
        lq, lk, h, hk, d = shape
        out.append(make_varlen(lq, lk, h, hk, d, dtype=dtype, device=device, flags=flags, generator=g,
                               requires_grad=requires_grad, **extra))

    for shape in shapes:
        add(shape, {})
        add(shape, {"causal": True})
    for flags in FLAG_SETS:
        for shape in shapes if full else (shapes[1], shapes[2], shapes[4]):
            add(shape, flags)
    # seqused_k: fewer keys than cu_seqlens_k holds (0 and all of them too); causal aligns to the keys used
    for flags in ({}, {"causal": True}, {"window_left": 5, "window_right": 2}):
        add(([5, 0, 1, 30, 12], [9, 3, 4, 40, 12], 4, 2, 64), flags, seqused=[6, 0, 4, 25, 12])
    add(([3, 20], [50, 20], 2, 1, 32), {"causal": True}, seqused=[1, 20], max_seqlen_extra=7)
    # equal lengths: one run (one batched call on the CPU) when every key is used, else a run per sequence
    add(([8, 8, 8], [10, 10, 10], 2, 1, 32), {"causal": True}, seqused=[10, 10, 10])
    add(([8, 8, 8], [10, 10, 10], 2, 1, 32), {"causal": True}, seqused=[7, 7, 10])
    add(SHAPES[1], {"causal": True}, layout="bhsd")
    add(SHAPES[3], {}, layout="bhsd", max_seqlen_extra=5)
    # rows that see no key: causal with more queries than keys, a zero-wide window, sequences without keys
    add(([64, 10], [32, 0], 2, 2, 64), {"causal": True})
    add(([48, 7], [48, 7], 2, 1, 32), {"window_left": 0, "window_right": 0})
    return out


def _refs(s, dq_inputs=None):
    """(ref_hi out, ref_hi lse, ref_naive out) of a sample."""
    hi = hi_dtype(s.q.dtype)
    q, k, v = (t.detach() for t in (s.q, s.k, s.v))
    cu = (s.cu_seqlens_q.cpu(), s.cu_seqlens_k.cpu())
    kw = dict(s.kwargs)
    if "seqused_k" in kw:
        kw["seqused_k"] = kw["seqused_k"].cpu()
    out_hi, lse_hi = varlen_attention_ref(q.to(hi), k.to(hi), v.to(hi), *cu, return_lse=True, **kw)
    out_naive = varlen_attention_ref(q, k, v, *cu, upcast=False, **kw)
    return out_hi, lse_hi, out_naive


def _grads_ref(s, dout):
    """Gradients of the reference, fp32 / fp64 and naive, with respect to q, k, v."""
    hi = hi_dtype(s.q.dtype)
    cu = (s.cu_seqlens_q.cpu(), s.cu_seqlens_k.cpu())
    kw = dict(s.kwargs)
    if "seqused_k" in kw:
        kw["seqused_k"] = kw["seqused_k"].cpu()
    leaf_hi = [t.detach().to(hi).requires_grad_() for t in (s.q, s.k, s.v)]
    g_hi = torch.autograd.grad(varlen_attention_ref(*leaf_hi, *cu, **kw), leaf_hi, dout.to(hi))
    leaf_lo = [t.detach().clone().requires_grad_() for t in (s.q, s.k, s.v)]
    g_lo = torch.autograd.grad(varlen_attention_ref(*leaf_lo, *cu, upcast=False, **kw), leaf_lo, dout)
    return g_hi, g_lo


def _check_forward(s):
    out, lse = torch.ops.fa2.varlen_fwd(*s.args(), **s.kwargs)
    total_q, nheads = s.q.shape[:2]
    assert out.shape == (total_q, nheads, s.v.shape[-1]) and out.dtype == s.q.dtype and out.is_contiguous(), s
    assert lse.shape == (nheads, total_q) and lse.dtype == torch.float32 and lse.is_contiguous(), s
    out_hi, lse_hi, out_naive = _refs(s)
    assert_close_rule(f"out {s}", out, out_hi, out_naive, factor=2)
    finite = torch.isfinite(lse_hi).to(lse.device)
    assert torch.equal(torch.isfinite(lse), finite), f"lse: rows that see no key must be +inf ({s})"
    assert (lse[~finite] == math.inf).all(), s
    assert (out.transpose(0, 1)[~finite] == 0).all(), f"rows that see no key must output 0 ({s})"
    tol = 1e-3 if s.q.dtype in (torch.float16, torch.bfloat16) else 1e-5
    assert torch.allclose(lse[finite], lse_hi.to(lse.device)[finite].float(), atol=tol, rtol=tol), s
    return out


def _check_backward(s, dout, grads):
    g_hi, g_lo = _grads_ref(s, dout)
    for name, g, gh, gl, t in zip(("dq", "dk", "dv"), grads, g_hi, g_lo, (s.q, s.k, s.v)):
        assert g.shape == t.shape and g.dtype == t.dtype, (name, s)
        assert_close_rule(f"{name} {s}", g, gh.to(g.device), gl.to(g.device), factor=3)
    if "seqused_k" in s.kwargs:  # keys past seqused_k take no part: exactly zero gradients
        unused = torch.ones(s.k.shape[0], dtype=torch.bool)
        cu, used = s.cu_seqlens_k.tolist(), s.kwargs["seqused_k"].tolist()
        for b, n in enumerate(used):
            unused[cu[b]:cu[b] + n] = False
        assert (grads[1][unused.to(s.k.device)] == 0).all() and (grads[2][unused.to(s.k.device)] == 0).all(), s


# ---- forward and backward against the reference ----------------------------------------------------------------------

@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES, ids=IDS)
def test_varlen_forward_matches_reference(device, dtype, share):
    _needs(device)
    for s in share_of(varlen_samples(device, dtype, full=(device == "cuda")), share):
        _check_forward(s)


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES, ids=IDS)
def test_varlen_backward_matches_reference(device, dtype, share):
    _needs(device)
    samples = varlen_samples(device, dtype, requires_grad=True, full=(device == "cuda"), seed=1)
    for index, s in enumerate(samples):
        # every sample's output gradient is drawn, in order, whichever share checks it: each keeps its inputs
        dout = torch.randn(s.q.shape[:-1] + s.v.shape[-1:], dtype=s.q.dtype, device=device)
        if not in_share(index, share):
            continue
        out = fa2.varlen_attention(*s.args(), **s.kwargs)
        _check_backward(s, dout, torch.autograd.grad(out, (s.q, s.k, s.v), dout))


# What the sm_90a forward's schedules meet (Hopper): persistent CTAs over more tiles than SMs (d 128), many short
# sequences beside a long one (most tiles of max_seqlen's grid past their sequence's end: skipped, with the tile counter
# never handed out), lengths at and around the 128-row tile, a last tile past the packed tensor's end, 192 / 256 heads.
TILE_EDGES = [128, 1, 129, 255, 256, 127, 0, 3000]
SHAPES_HOPPER = [
    ([4096, 1000, 3000, 1], [4096, 1000, 3000, 7], 8, 2, 128),
    ([(7 * i) % 41 for i in range(120)] + [2500], [(5 * i) % 37 + 1 for i in range(120)] + [2600], 4, 4, 128),
    (TILE_EDGES, TILE_EDGES[::-1], 4, 4, 128),
    (TILE_EDGES, TILE_EDGES, 4, 2, 64),
    (TILE_EDGES, TILE_EDGES, 4, 2, 192),
    (TILE_EDGES, TILE_EDGES, 4, 2, 256),
]


@pytest.mark.parametrize("route", ["sm90a", "sm80"])
def test_varlen_hopper_routes(route):
    """On compute capability 9.0 both varlen routes (development option sm90_varlen: the sm_90a kernels, the forward's
    with TMA loads over the packed tensors, or the sm80 path's) are within the rule, forward on the CUDA samples and
    on shapes that meet the sm_90a schedules (plain, causal and windowed), backward on the CUDA samples; the plans
    name the route's kernels."""
    _needs("cuda")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("two varlen routes on compute capability 9.0 only")
    g = torch.Generator(device="cuda").manual_seed(3)
    samples = varlen_samples("cuda", torch.bfloat16, full=True)
    for shape in SHAPES_HOPPER:
        for flags in ({}, {"causal": True}, {"window_left": 100, "window_right": 0}):
            samples.append(make_varlen(*shape, dtype=torch.bfloat16, device="cuda", flags=flags, generator=g))
    with fa2.dev.options_override(sm90_varlen=(route == "sm90a")):
        for direction in ("fwd", "bwd"):
            for d in (64, 128, 192, 256):
                plan = fa2.dev.plan(direction, varlen=True, batch=2, nheads=4, seqlen_q=512, headdim=d, causal=True)
                # (the backward's sm_90a varlen kernels are the warp-specialized ones at d 64 / 128 / 256; d 192
                # takes the sm_90 instance's sm80 one)
                sm90a = route == "sm90a" and (direction == "fwd" or d != 192)
                name = plan["kernel"]
                ws = name.startswith(("bwd_ws_kernel<", "bwd_ws_dsplit_kernel<"))
                assert ("sm90a" in name or ws) == sm90a and "varlen" in name, plan
                assert ws == (sm90a and direction == "bwd"), plan
        for s in samples:
            _check_forward(s)
        for s in varlen_samples("cuda", torch.bfloat16, requires_grad=True, full=True, seed=2):
            dout = torch.randn(s.q.shape[:-1] + s.v.shape[-1:], dtype=s.q.dtype, device="cuda")
            out = fa2.varlen_attention(*s.args(), **s.kwargs)
            _check_backward(s, dout, torch.autograd.grad(out, (s.q, s.k, s.v), dout))


def test_varlen_forward_stage_masks():
    """Option varlen_stage_masks: the warp-specialized varlen forward's producer marks the K/V stages whose key block
    needs the mask and the consumers load the sequence's bounds only for those. out and lse bitwise those of the same
    kernels without the marks (the mask decision moves, not the arithmetic), and within the rule: the CUDA samples and
    the Hopper shapes plain, causal and windowed (left and right edges), bf16 and fp16; and, repeated, many sequences
    with seqused_k below the keys held at d 128 (overlap; causal: the tile-counter kernel) and d 256 (windowed), more
    tiles than SMs, so that persistent CTAs reuse each stage across masked and unmasked blocks of different sequences
    (a race between the producer's marks and the consumers' reads would show as an occasional difference)."""
    _needs("cuda")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a warp-specialized kernels")
    g = torch.Generator(device="cuda").manual_seed(11)
    for dtype in (torch.bfloat16, torch.float16):
        samples = varlen_samples("cuda", dtype, full=True, seed=4)
        for shape in SHAPES_HOPPER:
            for flags in ({}, {"causal": True}, {"window_left": 100, "window_right": 0},
                          {"window_left": 37, "window_right": 300}):
                samples.append(make_varlen(*shape, dtype=dtype, device="cuda", flags=flags, generator=g))
        with fa2.dev.options_override(varlen_stage_masks=True):
            plan = fa2.dev.plan("fwd", varlen=True, batch=2, nheads=4, seqlen_q=4096, headdim=128,
                                dtype=str(dtype).split(".")[-1])
            assert plan["stage_masks"] == "yes" and "warp-specialized" in plan["kernel"], plan
        for s in samples:
            with fa2.dev.options_override(varlen_stage_masks=True):
                on = torch.ops.fa2.varlen_fwd(*s.args(), **s.kwargs)
                _check_forward(s)
            with fa2.dev.options_override(varlen_stage_masks=False):
                off = torch.ops.fa2.varlen_fwd(*s.args(), **s.kwargs)
            for name, a, b in zip(("out", "lse"), on, off):
                diff = (a.float() - b.float()).abs().max()
                assert torch.equal(a, b), f"{s} {name}: stage masks on / off differ by {diff}"
        lengths = [(37 * i) % 700 + 1 for i in range(160)]
        used = [max(0, n + 50 - (i % 60)) for i, n in enumerate(lengths)]
        for d, flags in ((128, {}), (128, {"causal": True}), (256, {"window_left": 200, "window_right": 30})):
            s = make_varlen(lengths, [n + 50 for n in lengths], 4, 2, d, dtype=dtype, device="cuda", flags=flags,
                            generator=g, seqused=used)
            with fa2.dev.options_override(varlen_stage_masks=False):
                off = torch.ops.fa2.varlen_fwd(*s.args(), **s.kwargs)
            with fa2.dev.options_override(varlen_stage_masks=True):
                _check_forward(s)
                for _ in range(10):
                    on = torch.ops.fa2.varlen_fwd(*s.args(), **s.kwargs)
                    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1]), f"d {d} {flags} {dtype}"


def test_varlen_forward_wide_kernel_long_sequences():
    """d 64 with long sequences on average (total_k / batch from kWideOverlapMinKeys keys; twice that with a causal
    mask): the plan takes the wide (192-row) warp-specialized overlap kernel, as the dense call does at that length,
    and it is within the rule over sequences of 1 and 191 / 193 rows (a 192-row tile ending inside the next sequence)
    beside long ones, GQA, plain, causal, windowed and with seqused_k; below the average length the pipelined kernel."""
    _needs("cuda")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a warp-specialized kernels")
    g = torch.Generator(device="cuda").manual_seed(17)
    long_mix = [16001, 191, 1, 8383]  # 24576 keys over 4 sequences: 6144 on average
    cases = [  # (lengths_q, lengths_k, heads, kv heads, flags, seqused_k)
        ([16001, 191, 8384], long_mix[:1] + [193, 8382], 4, 2, {}, None),  # 8192 keys a sequence on average
        ([16001, 191, 8384], [16001, 191, 8384], 4, 2, {"window_left": 3000, "window_right": 0}, None),
        ([24000, 8768], [24000, 8768], 2, 1, {"causal": True}, None),  # 16384: causal takes it from twice as many
        ([9000, 1, 15575], [9000, 1, 15575], 4, 2, {}, [8000, 1, 15575]),
    ]
    for lengths_q, lengths_k, h, hk, flags, used in cases:
        windowed = bool(flags)
        s = make_varlen(lengths_q, lengths_k, h, hk, 64, dtype=torch.bfloat16, device="cuda", flags=flags,
                        generator=g, seqused=used)
        plan = fa2.dev.plan("fwd", varlen=True, batch=len(lengths_k), nheads=h, nheads_k=hk, headdim=64,
                            seqlen_q=s.max_seqlen_q, seqlen_k=s.max_seqlen_k, total_q=sum(lengths_q),
                            total_k=sum(lengths_k), **flags)
        wide = sum(lengths_k) // len(lengths_k) >= (16384 if windowed else 8192)
        assert ("warp-specialized overlap" in plan["kernel"]) == wide, (lengths_k, flags, plan)
        _check_forward(s)
    plan = fa2.dev.plan("fwd", varlen=True, batch=len(long_mix), nheads=4, headdim=64, seqlen_q=max(long_mix),
                        seqlen_k=max(long_mix), total_q=sum(long_mix), total_k=sum(long_mix))
    assert "warp-specialized" not in plan["kernel"], plan


def _hopper_ws_backward_samples():
    """test_varlen_warp_specialized_backward's samples: tile edges (lengths 0, 1, 127, 128, 129, 255, 256, 3000; the
    query and key blocks of 64 / 128 rows end inside the next sequence), GQA, many short sequences beside a long one,
    each plain, causal and windowed; seqused_k; and a sequence whose values and output gradient are 30 times its
    neighbour's, so that any leak across the boundary (P of the next sequence's queries or keys not masked, a tail
    block's dK / dV stored over the next sequence's rows) is far outside the rule."""
    g = torch.Generator(device="cuda").manual_seed(5)
    samples = []
    shapes = [(TILE_EDGES, TILE_EDGES[::-1], 4, 4, 128), (TILE_EDGES, TILE_EDGES, 4, 2, 64),
              (TILE_EDGES[::-1], TILE_EDGES, 2, 2, 64), ([129, 127, 1, 128], [127, 129, 128, 1], 8, 1, 128),
              (TILE_EDGES, TILE_EDGES, 2, 1, 256), ([65, 63, 0, 64, 1], [63, 65, 64, 1, 0], 2, 2, 256),
              ([(7 * i) % 41 for i in range(60)] + [1500], [(5 * i) % 37 + 1 for i in range(60)] + [1600], 4, 4, 128)]
    for shape in shapes:
        for flags in ({}, {"causal": True}, {"window_left": 100, "window_right": 0}, {"window_left": 7,
                                                                                      "window_right": 30}):
            samples.append(make_varlen(*shape, dtype=torch.bfloat16, device="cuda", flags=flags, generator=g,
                                       requires_grad=True))
    for d in (64, 128, 256):
        for flags in ({}, {"causal": True}):
            samples.append(make_varlen([5, 0, 1, 130, 300], [9, 3, 4, 140, 300], 4, 2, d, dtype=torch.bfloat16,
                                       device="cuda", flags=flags, seqused=[6, 0, 4, 129, 250], generator=g,
                                       requires_grad=True))
        for flags in ({}, {"causal": True}):
            s = make_varlen([100, 50, 129], [100, 50, 129], 2, 2, d, dtype=torch.bfloat16, device="cuda", flags=flags,
                            generator=g, name=f"loud first sequence d{d} {flags}")
            with torch.no_grad():
                s.v[:100] *= 30
            s.q.requires_grad_(), s.k.requires_grad_(), s.v.requires_grad_()
            samples.append(s)
    return samples


@pytest.mark.parametrize("share", SHARES)
def test_varlen_warp_specialized_backward(share):
    """On compute capability 9.0 the varlen backward on the plain path runs the warp-specialized kernels (kVarlen:
    bwd_ws_kernel at d 64 / 128, bwd_ws_dsplit_kernel at 256; the plans name them, also with GQA, causal and
    windows, and a call launches them, at d 128 with the overlapping dQ conversion) and is within the rule on
    _hopper_ws_backward_samples (whose loud sequences catch a leak across a sequence boundary); a sequence without
    queries gets exactly zero dk / dv, and the queries of a sequence whose keys are all unused (seqused_k 0) exactly
    zero dq, although the blocks of the sequence before cover their rows (their dK / dV stores and dQ adds)."""
    _needs("cuda")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialized backward runs on compute capability 9.0")
    for d in (64, 128, 256):
        kernel = "bwd_ws_dsplit_kernel" if d == 256 else "bwd_ws_kernel"
        for flags in ({}, {"causal": True}, {"window_left": 100, "window_right": 0}):
            for nheads_k in (4, 2):
                plan = fa2.dev.plan("bwd", varlen=True, batch=3, nheads=4, nheads_k=nheads_k, seqlen_q=3000,
                                    headdim=d, **flags)
                assert plan["kernel"] == f"{kernel}<bf16, {d}, plain, varlen>", plan
    if share == "quick":  # (the kernels a call launches: <..., kKeyBias, kVarlen[, kDropout]> end their names)
        from kernels import cuda_kernel_names

        for d in (64, 128, 256):
            s = make_varlen([300, 0, 129], [200, 5, 129], 4, 2, d, dtype=torch.bfloat16, device="cuda",
                            flags={"causal": True}, requires_grad=True)
            out = fa2.varlen_attention(*s.args(), causal=True)
            names = cuda_kernel_names(lambda: torch.autograd.grad(out, (s.q, s.k, s.v), torch.ones_like(out)))
            assert any(("bwd_ws_kernel<" in n and "false, true, false>" in n) or
                       ("bwd_ws_dsplit_kernel<" in n and "false, true>" in n) for n in names), (d, names)
            if d == 128:  # (the dQ conversion overlapping the main kernel's last CTAs: kAfterHeads)
                assert any("bwd_convert_dq_kernel" in n and "true>" in n for n in names), names
    samples = _hopper_ws_backward_samples()
    for index, s in enumerate(samples):
        dout = torch.randn(s.q.shape[:-1] + s.v.shape[-1:], dtype=s.q.dtype, device="cuda")
        if s.name.startswith("loud"):
            dout[:100] *= 30
        if not in_share(index, share):
            continue
        out = fa2.varlen_attention(*s.args(), **s.kwargs)
        _check_backward(s, dout, torch.autograd.grad(out, (s.q, s.k, s.v), dout))
    if share != "quick":
        return
    for d in (64, 128, 256):
        # sequence 1 has no queries: its keys' dk / dv exactly 0 (sequence 0's key block 0 covers its rows)
        s = make_varlen([100, 0, 70], [100, 60, 70], 2, 2, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        grads = torch.autograd.grad(fa2.varlen_attention(*s.args()), (s.q, s.k, s.v),
                                    torch.randn(s.q.shape, dtype=s.q.dtype, device="cuda"))
        assert (grads[1][100:160] == 0).all() and (grads[2][100:160] == 0).all(), d
        # sequence 1 uses none of its keys: its queries' dq exactly 0 (sequence 0's query blocks cover its rows,
        # whose dO is large)
        s = make_varlen([100, 50, 70], [100, 60, 70], 2, 2, d, dtype=torch.bfloat16, device="cuda",
                        seqused=[100, 0, 70], requires_grad=True)
        dout = torch.randn(s.q.shape, dtype=s.q.dtype, device="cuda")
        dout[100:150] *= 100
        grads = torch.autograd.grad(fa2.varlen_attention(*s.args(), **s.kwargs), (s.q, s.k, s.v), dout)
        assert (grads[0][100:150] == 0).all(), d
        _check_backward(s, dout, grads)


def test_varlen_d256_backward_dq_in_whole_blocks():
    """Option varlen_dq_blocks: d 256's headdim-split ws backward adds dQ in its fragment order at each sequence's own
    64-row blocks of dq_accum (params.h, varlen_dq_head_rows: taken where the sequences average 64 queries or more,
    row-major otherwise and with the option off) and the conversion finds
    each row's sequence: sequences starting off a block boundary, lengths 0 / 1 / 63 / 64 / 65 / long, every other
    one loud (values and output gradient 30 times), GQA, plain / causal / windowed, within the rule; the same
    sequences with zero-length ones added (average below 64: dq_accum row-major) give the same gradients within
    the rule too."""
    _needs("cuda")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialized backward runs on compute capability 9.0")
    g = torch.Generator(device="cuda").manual_seed(21)
    lengths = [65, 1, 63, 300, 0, 64, 129, 37, 700, 190, 2, 250]
    flag_sets = ({}, {"causal": True}, {"window_left": 90, "window_right": 20})
    for extra_empty, flags in itertools.product((0, 40), flag_sets):
        lq = lengths + [0] * extra_empty
        lk = [n + (7 if i % 3 == 0 else 0) for i, n in enumerate(lq)]
        s = make_varlen(lq, lk, 4, 2, 256, dtype=torch.bfloat16, device="cuda", flags=flags, generator=g,
                        name=f"d256 blocks {flags} +{extra_empty} empty")
        assert (sum(lq) >= 64 * len(lq)) == (extra_empty == 0)  # (which layout the glue takes)
        dout = torch.randn(s.q.shape, dtype=s.q.dtype, device="cuda")
        cq, ck = s.cu_seqlens_q.tolist(), s.cu_seqlens_k.tolist()
        with torch.no_grad():
            for b in range(0, len(lq), 2):
                s.v[ck[b]:ck[b + 1]] *= 30
                dout[cq[b]:cq[b + 1]] *= 30
        s.q.requires_grad_(), s.k.requires_grad_(), s.v.requires_grad_()
        for blocks in (True, False):
            with fa2.dev.options_override(varlen_dq_blocks=blocks):
                out = fa2.varlen_attention(*s.args(), **s.kwargs)
                _check_backward(s, dout, torch.autograd.grad(out, (s.q, s.k, s.v), dout))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_varlen_equals_padded_attention_per_sequence(device):
    """Each sequence of a packed batch gives what fa2's padded op gives on that sequence alone (bitwise on the CPU,
    where the varlen op runs the padded kernels on each sequence, or on each run of adjacent equal lengths: none here;
    within 2% of the largest value on CUDA), forward and backward, whatever the other sequences are."""
    _needs(device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    lengths_q, lengths_k = [37, 1, 0, 130, 64], [50, 1, 9, 130, 20]
    # and equal lengths, one batched call on the CPU: the same as the padded op on the same tokens
    s = make_varlen([33] * 5, [47] * 5, 4, 2, 64, dtype=dtype, device=device, flags={"causal": True})
    padded = [t.view(5, -1, *t.shape[1:]) for t in (s.q, s.k, s.v)]
    out, lse = torch.ops.fa2.varlen_fwd(*s.args(), causal=True)
    out_p, lse_p = torch.ops.fa2.fwd(*padded, causal=True)
    lse_p = lse_p.transpose(0, 1).reshape(4, -1)
    if device == "cpu":
        assert torch.equal(out, out_p.view(out.shape)) and torch.equal(lse, lse_p)
    else:
        assert (out - out_p.view(out.shape)).abs().max() <= 2e-2 and (lse - lse_p).abs().max() <= 1e-3
    for flags in ({}, {"causal": True}, {"window_left": 9, "window_right": 3, "softcap": 4.0}):
        s = make_varlen(lengths_q, lengths_k, 4, 2, 64, dtype=dtype, device=device, flags=flags, requires_grad=True)
        out = fa2.varlen_attention(*s.args(), **flags)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (s.q, s.k, s.v), dout)
        cq, ck = s.cu_seqlens_q.tolist(), s.cu_seqlens_k.tolist()
        for b in range(len(lengths_q)):
            rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
            q, k, v = (t.detach()[r].unsqueeze(0).requires_grad_() for t, r in ((s.q, rows), (s.k, keys), (s.v, keys)))
            out_b = fa2.attention(q, k, v, **flags)
            grads_b = torch.autograd.grad(out_b, (q, k, v), dout[rows].unsqueeze(0))
            pairs = [("out", out[rows], out_b[0])] + [(n, g[r], gb[0]) for n, g, gb, r in
                                                      zip(("dq", "dk", "dv"), grads, grads_b, (rows, keys, keys))]
            for name, got, want in pairs:
                if want.numel() == 0:  # (a sequence of no queries or no keys: nothing to compare)
                    assert got.numel() == 0, (name, b, flags)
                    continue
                if device == "cpu":
                    assert torch.equal(got, want), (name, b, flags)
                else:  # two kernels, each within the rule: a few bf16 roundings of the largest value apart
                    bound = 2e-2 * max(1.0, want.float().abs().max().item())
                    assert (got.float() - want.float()).abs().max() <= bound, (name, b, flags)


def _nan_past_used(keys_and_values, cu_seqlens_k, used):
    """NaN in place in each sequence's key rows past its first used[b] (k and v alike; no autograd record)."""
    cu_k = cu_seqlens_k.tolist()
    with torch.no_grad():
        for t in keys_and_values:
            for b, n in enumerate(used):
                t[cu_k[b] + n:cu_k[b + 1]] = math.nan


@pytest.mark.parametrize("headdim", [64, 128, 256])
@pytest.mark.parametrize("device,route", [("cpu", None), ("cuda", "sm90a"), ("cuda", "sm80")])
def test_varlen_rows_past_a_sequence_never_reach_its_results(device, route, headdim):
    """What lies past a sequence's keys never reaches its results: NaN in the keys and values past seqused_k (a KV
    cache's unwritten rows, torch.empty's bytes) and an inf in the next sequence's first value. P is 0 there, but
    0 * NaN is NaN: the sm_90a kernels' TMA loads a key tile's rows past the sequence as they are, and zero them first
    (the cp.async loads write zeros, the CPU never reads them). Sequences 0 and 2 get the results they get with finite
    values there: out and lse bitwise; the gradients bitwise in the deterministic mode (the backward with a fixed dQ
    order), and within a few roundings of the largest value in the default mode, which on Hopper takes the
    warp-specialized backward (dQ's atomic adds vary in order). On compute capability 9.0 both varlen routes
    (development option sm90_varlen)."""
    _needs(device)
    if route == "sm80" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm80 route is every other GPU's: taken by the sm90a case there")

    def options(deterministic):  # (context managers each time: they are single-use)
        stack = contextlib.ExitStack()
        if deterministic:
            stack.enter_context(fa2.deterministic())
        if route:
            stack.enter_context(fa2.dev.options_override(sm90_varlen=(route == "sm90a")))
        return stack

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    lengths_q, lengths_k, used = [70, 33, 150], [100, 60, 200], [65, 60, 131]
    for flags, deterministic in itertools.product(({}, {"causal": True}), (True, False)):
        s = make_varlen(lengths_q, lengths_k, 4, 2, headdim, dtype=dtype, device=device, seqused=used, flags=flags)
        ck, cq = s.cu_seqlens_k.tolist(), s.cu_seqlens_q.tolist()
        k_bad, v_bad = s.k.clone(), s.v.clone()
        _nan_past_used((k_bad, v_bad), s.cu_seqlens_k, used)
        v_bad[ck[1]] = math.inf  # (sequence 1's own: its results are not compared)
        if route == "sm90a" and not deterministic and torch.cuda.get_device_capability() == (9, 0):
            # (the warp-specialized backward is the one that zeroes K / V past the sequence itself)
            with options(deterministic):
                plan = fa2.dev.plan("bwd", varlen=True, batch=3, nheads=4, nheads_k=2, seqlen_q=150, headdim=headdim,
                                    **flags)
            assert plan["kernel"].startswith("bwd_ws_"), plan
        dout = torch.randn_like(s.q)
        results = []
        for k, v in ((s.k, s.v), (k_bad, v_bad)):
            q, k, v = (t.detach().clone().requires_grad_() for t in (s.q, k, v))
            with options(deterministic):
                out, lse = torch.ops.fa2.varlen_fwd(q, k, v, *s.args()[3:], **s.kwargs)
                grads = torch.autograd.grad(fa2.varlen_attention(q, k, v, *s.args()[3:], **s.kwargs), (q, k, v), dout)
            results.append((out, lse, grads))
        (out, lse, grads), (out_bad, lse_bad, grads_bad) = results
        for b in (0, 2):
            rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b] + used[b])
            what = f"sequence {b}, {flags}, deterministic {deterministic}"
            assert torch.isfinite(out_bad[rows]).all(), f"out of {what}: NaN from rows past the sequence"
            assert torch.equal(out_bad[rows], out[rows]) and torch.equal(lse_bad[:, rows], lse[:, rows]), what
            for name, g, g_bad, r in zip(("dq", "dk", "dv"), grads, grads_bad, (rows, keys, keys)):
                assert torch.isfinite(g_bad[r]).all(), f"{name} of {what}: NaN from rows past the sequence"
                if deterministic:
                    assert torch.equal(g_bad[r], g[r]), f"{name} of {what}"
                else:
                    bound = 2e-2 * max(1.0, g[r].float().abs().max().item())
                    assert (g_bad[r].float() - g[r].float()).abs().max() <= bound, f"{name} of {what}"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_varlen_deterministic_backward(device):
    _needs(device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    s = make_varlen([193, 1, 0, 77, 257], [257, 5, 9, 77, 100], 4, 2, 64, dtype=dtype, device=device,
                    flags={"causal": True}, requires_grad=True)
    dout = torch.randn(s.q.shape, dtype=dtype, device=device)
    with fa2.deterministic():
        runs = [torch.autograd.grad(fa2.varlen_attention(*s.args(), causal=True), (s.q, s.k, s.v), dout)
                for _ in range(5 if device == "cpu" else 20)]
    for r in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(r, runs[0]))


@pytest.mark.parametrize("threads", [1, 3])
def test_varlen_cpu_schedule_with_thread_counts(threads):
    """The CPU schedule (cpp/cpu/varlen_cpu.cpp, VarlenSchedule) with one thread (every run in one list) and three
    (a long sequence alone on every thread, the others dealt into three lists): within the rule, forward and
    backward, and bitwise reproducible."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        s = make_varlen(*SHAPES[4][:2], 4, 2, 64, dtype=torch.bfloat16, device="cpu", flags={"causal": True},
                        requires_grad=True)
        out = _check_forward(s)
        dout = torch.randn_like(out)
        runs = [torch.autograd.grad(fa2.varlen_attention(*s.args(), causal=True), (s.q, s.k, s.v), dout)
                for _ in range(2)]
        _check_backward(s, dout, runs[0])
        assert all(torch.equal(a, b) for a, b in zip(*runs))
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_varlen_degenerate_batches(device):
    """No sequence at all, only empty sequences, no keys anywhere, a single one-token sequence: the right shapes,
    zeros and +inf lse where nothing is seen, zero gradients."""
    _needs(device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    for lq, lk in (([], []), ([0, 0], [0, 0]), ([3, 2], [0, 0]), ([0, 0], [4, 1]), ([1], [1])):
        s = make_varlen(lq, lk, 2, 1, 16, dtype=dtype, device=device, requires_grad=True)
        out, lse = torch.ops.fa2.varlen_fwd(*s.args(), causal=True)
        assert out.shape == s.q.shape and lse.shape == (2, sum(lq)), (lq, lk)
        out_hi, lse_hi, out_naive = _refs(dataclasses.replace(s, kwargs={"causal": True}))
        assert_close_rule(f"out {lq} {lk}", out, out_hi.to(device), out_naive.to(device), factor=2)
        assert torch.equal(torch.isinf(lse), torch.isinf(lse_hi).to(device))
        grads = torch.autograd.grad(fa2.varlen_attention(*s.args(), causal=True).float().sum(), (s.q, s.k, s.v),
                                    allow_unused=False)
        assert [g.shape for g in grads] == [s.q.shape, s.k.shape, s.v.shape]
        if sum(lk) == 0:
            assert (grads[0] == 0).all()
        if sum(lq) == 0:
            assert (grads[1] == 0).all() and (grads[2] == 0).all()


# ---- opcheck, torch.compile ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_varlen_opcheck(device, share):
    _needs(device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    samples = [s for s in varlen_samples(device, dtype, requires_grad=True, seed=3)
               if s.q.shape[0] * s.k.shape[0] <= 40_000][::6]
    assert len(samples) >= 6
    for s in share_of(samples, share):
        torch.library.opcheck(torch.ops.fa2.varlen_fwd.default, s.args(), s.kwargs)
        with torch.no_grad():
            out, lse = torch.ops.fa2.varlen_fwd(*s.args(), **s.kwargs)
        bwd_args = (torch.randn_like(out), s.q.detach(), s.k.detach(), s.v.detach(), out, lse) + s.args()[3:]
        torch.library.opcheck(torch.ops.fa2.varlen_bwd.default, bwd_args, s.kwargs)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_varlen_compile_fullgraph_dynamic_no_recompile(device):
    """torch.compile(fullgraph=True, dynamic=True) of a function calling fa2.varlen_attention: one graph, no graph
    break, and no recompile when the lengths change (cu_seqlens' and seqused_k's values, the total token counts, the
    number of sequences, max_seqlen), forward and backward, with results equal to eager's."""
    _needs(device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()

    def f(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k):
        out = fa2.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=seqused_k, causal=True, softcap=20.0)
        return out.float().square().sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    # No size of the first call equal to another of its sizes (Dynamo's duck sizing would tie them together), and
    # total_q * nheads * headdim > 4096 in every call (Inductor's CPU code for the sum guards on that bound).
    batches = [([30, 2, 17], [40, 2, 17]), ([64, 5, 9, 3], [64, 7, 9, 30]), ([11, 50], [11, 80]), ([17, 9], [9, 17])]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for lengths_q, lengths_k in batches:
            seqused = [max(n - 3, 0) for n in lengths_k]
            s = make_varlen(lengths_q, lengths_k, 6, 2, 32, dtype=dtype, device=device, seqused=seqused,
                            requires_grad=True)
            loss = compiled(*s.args(), s.kwargs["seqused_k"])
            grads = torch.autograd.grad(loss, (s.q, s.k, s.v))
            loss_e = f(*s.args(), s.kwargs["seqused_k"])
            grads_e = torch.autograd.grad(loss_e, (s.q, s.k, s.v))
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            assert torch.allclose(loss, loss_e, rtol=tol), (lengths_q, lengths_k)
            for g, ge in zip(grads, grads_e):
                assert torch.allclose(g, ge, rtol=tol, atol=tol), (lengths_q, lengths_k)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])


# ---- hypothesis ------------------------------------------------------------------------------------------------------

@st.composite
def varlen_problems(draw, device):
    dtype = draw(st.sampled_from(dtypes_for(device)))
    batch = draw(st.integers(1, 4))
    lengths = st.sampled_from([0, 1, 2, 7, 17, 64, 97, 130])
    lengths_q = [draw(lengths) for _ in range(batch)]
    lengths_k = [draw(lengths) for _ in range(batch)]
    seqused = None
    if draw(st.booleans()):
        seqused = [draw(st.integers(0, n)) for n in lengths_k]
    nheads_k = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 4]))
    headdim = draw(st.sampled_from([1, 8, 16, 32, 59, 64, 96, 111, 128, 160, 256]))
    flags = dict(causal=draw(st.booleans()), window_left=draw(st.sampled_from([-1, -1, 0, 5, 40])),
                 window_right=draw(st.sampled_from([-1, -1, 0, 3])),
                 softcap=draw(st.sampled_from([0.0, 0.0, 3.0])), scale=draw(st.sampled_from([None, None, 0.05])))
    layout = draw(st.sampled_from(["bshd", "bhsd"]))
    return dtype, lengths_q, lengths_k, seqused, nheads_k * group, nheads_k, headdim, flags, layout


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_varlen_hypothesis_forward_and_backward(device):
    _needs(device)

    @given(varlen_problems(device), st.booleans(), st.booleans())
    def run(problem, grads, poison):
        dtype, lengths_q, lengths_k, seqused, h, hk, d, flags, layout = problem
        s = make_varlen(lengths_q, lengths_k, h, hk, d, dtype=dtype, device=device, seqused=seqused, flags=flags,
                        layout=layout, requires_grad=grads)
        if poison and seqused is not None:  # (the keys past seqused_k hold NaN: they must not reach any result)
            _nan_past_used((s.k, s.v), s.cu_seqlens_k, seqused)
        out = _check_forward(s)
        if grads:
            dout = torch.randn_like(out)
            out = fa2.varlen_attention(*s.args(), **s.kwargs)
            _check_backward(s, dout, torch.autograd.grad(out, (s.q, s.k, s.v), dout))
    run()


# ---- bad input: a clear exception naming the argument ---------------------------------------------------------------

def _bad_varlen_cases(device):
    dt = torch.float32 if device == "cpu" else torch.bfloat16
    q = torch.randn(10, 4, 16, device=device, dtype=dt)
    k = torch.randn(12, 2, 16, device=device, dtype=dt)
    cq = torch.tensor([0, 4, 10], dtype=torch.int32, device=device)
    ck = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    good = (q, k, k, cq, ck, 6, 7)

    def with_(index, value):
        return good[:index] + (value,) + good[index + 1:]

    # checked everywhere (metadata only, no host sync)
    cases = [
        ("q rank", with_(0, q[None]), {}, ValueError, r"q must have 3 dims \(total_q, nheads, headdim\), got 4"),
        ("k rank", with_(1, k[0]), {}, ValueError, r"k must have 3 dims .*got 2"),
        ("kv total", with_(2, k[:11]), {}, ValueError, r"same total_k .*got 12 and 11"),
        ("k dtype", with_(1, k.double() if device == "cpu" else k.half()), {}, TypeError, "k must have q's dtype"),
        ("nheads", with_(0, torch.randn(10, 3, 16, device=device, dtype=dt)), {}, ValueError,
         r"nheads \(q.size\(1\)=3\) must be a multiple of nheads_k \(k.size\(1\)=2\)"),
        ("headdim", with_(1, k[..., :8]), {}, ValueError, r"k must have q's headdim \(dim 2: 16\), got 8"),
        ("cu dtype", with_(3, cq.long()), {}, TypeError, "cu_seqlens_q must be int32, got Long"),
        ("cu_k dtype", with_(4, ck.float()), {}, TypeError, "cu_seqlens_k must be int32, got Float"),
        ("cu rank", with_(3, cq[None]), {}, ValueError, r"cu_seqlens_q must have 1 dim \(batch \+ 1,\), got shape"),
        ("cu length", with_(4, ck[:2]), {}, ValueError,
         r"cu_seqlens_q and cu_seqlens_k must have the same length \(batch \+ 1\), got 3 and 2"),
        ("cu empty", with_(3, cq[:0]), {}, ValueError, "cu_seqlens_q must have batch \\+ 1 >= 1 entries"),
        ("cu strides", with_(3, torch.tensor([0, 0, 4, 0, 10, 0], dtype=torch.int32, device=device)[::2]), {},
         ValueError, "cu_seqlens_q must be contiguous"),
        ("cu device", with_(3, cq.to("meta")), {}, RuntimeError, "cu_seqlens_q must be on q's device"),
        ("seqused dtype", good, {"seqused_k": torch.tensor([1, 2], device=device)}, TypeError,
         "seqused_k must be int32, got Long"),
        ("seqused length", good, {"seqused_k": torch.tensor([1, 2, 3], dtype=torch.int32, device=device)},
         ValueError, r"seqused_k must have 2 entries \(batch,\), got 3"),
        ("max_seqlen < 0", with_(5, -1), {}, ValueError, "max_seqlen_q must be >= 0, got -1"),
        ("window", good, {"window_left": -2}, ValueError, "window_left must be >= -1 .*got -2"),
        ("softcap", good, {"softcap": -1.0}, ValueError, "softcap must be .*got -1"),
        ("dropout range", good, {"dropout_p": 1.5}, ValueError, r"dropout_p must be in \[0, 1\), got 1.5"),
        ("dropout nan", good, {"dropout_p": float("nan")}, ValueError, r"dropout_p must be in \[0, 1\), got nan"),
        ("sinks shape", good, {"sinks": torch.zeros(3, device=device)}, ValueError,
         r"sinks must have shape \(nheads,\) = \(4,\)"),
    ]
    if device == "cpu":
        # values: read only where that costs no host sync (CPU tensors)
        cases += [
            ("cu start", with_(3, torch.tensor([1, 4, 10], dtype=torch.int32)), {}, ValueError,
             r"cu_seqlens_q must start at 0, got cu_seqlens_q\[0\] = 1"),
            ("cu decreasing", with_(4, torch.tensor([0, 13, 12], dtype=torch.int32))[:6] + (13,), {}, ValueError,
             r"cu_seqlens_k must be non-decreasing, got cu_seqlens_k\[1\] = 13 > cu_seqlens_k\[2\] = 12"),
            ("cu last", with_(3, torch.tensor([0, 4, 9], dtype=torch.int32)), {}, ValueError,
             r"last entry of cu_seqlens_q must equal total_q \(q.size\(0\)\) = 10, got cu_seqlens_q\[2\] = 9"),
            ("cu_k last", with_(4, torch.tensor([0, 6, 13], dtype=torch.int32)), {}, ValueError,
             r"last entry of cu_seqlens_k must equal total_k \(k.size\(0\)\) = 12, got cu_seqlens_k\[2\] = 13"),
            ("max_seqlen_q", with_(5, 5), {}, ValueError,
             r"max_seqlen_q \(5\) must be at least the longest sequence; sequence 1 has 6 rows"),
            ("max_seqlen_k", with_(6, 6), {}, ValueError,
             r"max_seqlen_k \(6\) must be at least the longest sequence; sequence 1 has 7 rows"),
            ("seqused range", good, {"seqused_k": torch.tensor([6, 2], dtype=torch.int32)}, ValueError,
             r"seqused_k\[0\] must be in \[0, 5\] .*got 6"),
            ("seqused negative", good, {"seqused_k": torch.tensor([1, -2], dtype=torch.int32)}, ValueError,
             r"seqused_k\[1\] must be in \[0, 7\] .*got -2"),
            ("seqused max", with_(6, 3), {"seqused_k": torch.tensor([2, 4], dtype=torch.int32)}, ValueError,
             r"max_seqlen_k \(3\) must be at least every seqused_k entry, got seqused_k\[1\] = 4"),
        ]
    if device == "cuda":
        cases += [("fp32 on cuda", (q.float(), k.float(), k.float()) + good[3:], {}, TypeError, "float16 or bfloat16"),
                  ("cu on cpu", with_(3, cq.cpu()), {}, RuntimeError, "cu_seqlens_q must be on q's device")]
    return cases


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_varlen_bad_input_raises_clear_error(device):
    _needs(device)
    for name, args, kwargs, error, message in _bad_varlen_cases(device):
        with pytest.raises(error, match=message):
            fa2.varlen_attention(*args, **kwargs)
    with pytest.raises(TypeError, match="max_seqlen_q must be a Python int"):
        q = torch.randn(4, 2, 8, device=device)
        cu = torch.tensor([0, 4], dtype=torch.int32, device=device)
        fa2.varlen_attention(q, q, q, cu, cu, torch.tensor(4), 4)
    # the backward's own inputs
    dt = torch.float32 if device == "cpu" else torch.bfloat16
    s = make_varlen([3, 4], [5, 2], 2, 1, 16, dtype=dt, device=device)
    out, lse = torch.ops.fa2.varlen_fwd(*s.args())
    for bad, message in (((out[:5], out, lse), r"dout must have shape \(total_q, nheads, headdim\) = \(7, 2, 16\)"),
                         ((out, out, lse.t()), r"lse must have shape \(nheads, total_q\) = \(2, 7\), got \[7, 2\]"),
                         ((out, out, lse.double()), "lse must be float32")):
        with pytest.raises((ValueError, TypeError), match=message):
            torch.ops.fa2.varlen_bwd(bad[0], s.q, s.k, s.v, bad[1], bad[2], *s.args()[3:])
    # the process is still usable afterwards
    assert torch.isfinite(fa2.varlen_attention(*s.args())).all()


def test_varlen_double_backward_raises():
    s = make_varlen([5, 3], [4, 6], 2, 2, 8, dtype=torch.float64, device="cpu", requires_grad=True)
    out = fa2.varlen_attention(*s.args())
    dq, = torch.autograd.grad(out.sum(), s.q, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(dq.sum(), s.q)


def test_varlen_gradcheck_float64():
    s = make_varlen([3, 0, 2], [4, 2, 3], 2, 1, 4, dtype=torch.float64, device="cpu", requires_grad=True)
    for flags in ({"causal": True, "softcap": 2.0}, {"window_left": 1, "window_right": 1}):
        fn = lambda q, k, v: fa2.varlen_attention(q, k, v, *s.args()[3:], **flags)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (s.q, s.k, s.v), eps=1e-6, atol=1e-7), flags


def _varlen_flag(kernel_name):
    """fwd_kernel / bwd_kernel's kVarlen template flag (the second to last) in a demangled name, else None."""
    if not any(f"{k}<" in kernel_name for k in ("fwd_kernel", "bwd_kernel")) or ">(" not in kernel_name:
        return None
    from kernels import kernel_template_args
    return kernel_template_args(kernel_name)[-2] == "true"


def test_one_spanning_sequence_runs_the_dense_kernels():
    """A varlen call of one sequence that spans the packed tensors (max_seqlen = total, no seqused_k) runs fa2's dense
    kernels (all their schedules): results bitwise those of fa2.attention on the (1, total, ...) view, forward and
    backward, with sinks and dropout (the same bits: the sequence is batch 0); a max_seqlen above the sequence's length
    keeps the varlen kernels, within the rule. (Bitwise in the deterministic mode: otherwise dQ's atomic reduction
    order varies between any two backward calls.)"""
    _needs("cuda")
    from kernels import cuda_kernel_names
    g = torch.Generator(device="cuda").manual_seed(5)
    for d, flags in ((64, {"causal": True}), (128, {}), (128, {"window_left": 64, "window_right": 0})):
        q, k, v = (t[0] for t in make_qkv(1, 1000, 1100, 8, 2, d, dtype=torch.bfloat16, device="cuda", generator=g))
        sinks = torch.randn(8, device="cuda", generator=g)
        cu_q, cu_k = cu_seqlens([1000], "cuda"), cu_seqlens([1100], "cuda")
        for extra in ({}, {"sinks": sinks}, {"dropout_p": 0.1}):
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            leaves_dense = [t.detach().clone().unsqueeze(0).requires_grad_() for t in (q, k, v)]
            extra_v, extra_d = dict(extra), dict(extra)
            if "sinks" in extra:  # (its gradient too: the backward's bwd_with_sinks)
                extra_v["sinks"], extra_d["sinks"] = (sinks.clone().requires_grad_() for _ in range(2))
                leaves.append(extra_v["sinks"])
                leaves_dense.append(extra_d["sinks"])
            dout = torch.randn(q.shape, dtype=q.dtype, device="cuda", generator=g)
            torch.manual_seed(11)
            names = cuda_kernel_names(lambda: torch.autograd.grad(
                fa2.varlen_attention(*leaves[:3], cu_q, cu_k, 1000, 1100, **flags, **extra_v), leaves, dout))
            assert names and not any(_varlen_flag(n) for n in names), names
            with fa2.deterministic():  # (dQ's reduction order fixed, so both backwards can be bitwise equal)
                torch.manual_seed(11)
                out = fa2.varlen_attention(*leaves[:3], cu_q, cu_k, 1000, 1100, **flags, **extra_v)
                grads = torch.autograd.grad(out, leaves, dout)
                torch.manual_seed(11)
                out_dense = fa2.attention(*leaves_dense[:3], **flags, **extra_d)
                grads_dense = torch.autograd.grad(out_dense, leaves_dense, dout.unsqueeze(0))
            assert torch.equal(out, out_dense[0]), (d, flags, extra)
            assert all(torch.equal(a, b[0]) for a, b in zip(grads[:3], grads_dense[:3])), (d, flags, extra)
            assert all(torch.equal(a, b) for a, b in zip(grads[3:], grads_dense[3:])), (d, flags, extra)
        # (max_seqlen above the sequence's length: the varlen kernels, as for any batch)
        names = cuda_kernel_names(lambda: fa2.varlen_attention(q, k, v, cu_q, cu_k, 1024, 1100, **flags))
        assert any(_varlen_flag(n) for n in names), names
