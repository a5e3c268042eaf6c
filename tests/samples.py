"""The one sample generator every test draws from (numerics, gradients, opcheck, compile), CPU and CUDA.

A Sample is (q, k, v, kwargs) in fa2's layout; kwargs are the op's keyword arguments.
"""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch


# Tests that loop over many samples take a share as a parameter: "quick" (every QUICK_STRIDE-th item) runs in the quick
# run (FA2_CI=1, scripts/test.sh), "rest" (the others) is marked slow; FA2_CI=0 (and the GPU runs) run both, every item.
QUICK_STRIDE = 4
SHARES = [pytest.param("quick", id="quick"), pytest.param("rest", id="rest", marks=pytest.mark.slow)]


def in_share(index: int, share: str) -> bool:
    return (index % QUICK_STRIDE == 0) == (share == "quick")


def share_of(items, share: str) -> list:
    return [x for i, x in enumerate(items) if in_share(i, share)]


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def skip_without_device(device: str) -> None:
    """Skip the calling test when it asks for CUDA on a machine without it."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def dtypes_for(device: str) -> list[torch.dtype]:
    if device == "cuda":
        return [torch.float16, torch.bfloat16]
    return [torch.float32, torch.bfloat16, torch.float16]


@dataclasses.dataclass
class Sample:
    name: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kwargs: dict

    def args(self):
        kw = self.kwargs
        return (self.q, self.k, self.v, kw.get("attn_bias"), kw.get("scale"), kw.get("causal", False),
                kw.get("window_left", -1), kw.get("window_right", -1), kw.get("softcap", 0.0))

    def __repr__(self):
        return f"Sample({self.name}, q={tuple(self.q.shape)}, k={tuple(self.k.shape)}, {self.q.dtype})"


def make_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, *, dtype, device, layout="bshd",
             requires_grad=False, generator=None, magnitude=1.0, headdim_v=None):
    """Random (never zero) q/k/v in fa2's (B, S, H, D) layout. layout="bhsd" gives the same logical tensors as
    transposed views of (B, H, S, D) storage, as Hugging Face models and SDPA users have them. headdim_v: v's own
    head dim (default headdim, q's and k's)."""
    def one(s, h, d):
        if layout == "bhsd":
            t = torch.randn(batch, h, s, d, dtype=torch.float32, device=device, generator=generator)
            t = (t * magnitude).to(dtype).transpose(1, 2)
        else:
            t = (torch.randn(batch, s, h, d, dtype=torch.float32, device=device, generator=generator)
                 * magnitude).to(dtype)
        return t.requires_grad_(requires_grad)
    headdim_v = headdim if headdim_v is None else headdim_v
    return one(seqlen_q, nheads, headdim), one(seqlen_k, nheads_k, headdim), one(seqlen_k, nheads_k, headdim_v)


def make_bias(kind, batch, nheads, seqlen_q, seqlen_k, *, dtype, device, requires_grad=False, generator=None):
    """kind: "full" (B,H,Sq,Sk), "shared" (1,1,Sq,Sk), "padding" (B,1,1,Sk), "2d" (Sq,Sk), "bool_padding"
    (B,1,1,Sk) bool, "bool_full" (B,H,Sq,Sk) bool, "fp32" (B,H,Sq,Sk) float32 whatever q's dtype."""
    if kind.startswith("bool"):
        shape = (batch, 1, 1, seqlen_k) if kind == "bool_padding" else (batch, nheads, seqlen_q, seqlen_k)
        keep = torch.rand(shape, device=device, generator=generator) > 0.3
        return keep
    shape = {"full": (batch, nheads, seqlen_q, seqlen_k), "shared": (1, 1, seqlen_q, seqlen_k),
             "padding": (batch, 1, 1, seqlen_k), "2d": (seqlen_q, seqlen_k),
             "fp32": (batch, nheads, seqlen_q, seqlen_k)}[kind]
    bias_dtype = torch.float32 if kind == "fp32" else dtype
    bias = torch.randn(shape, device=device, generator=generator, dtype=torch.float32)
    if kind == "padding":
        # Hugging Face style: 0 where attended, a large negative number on padded keys (a few keys per row).
        pad = torch.rand(shape, device=device, generator=generator) < 0.25
        bias = torch.where(pad, torch.full_like(bias, -1e4), torch.zeros_like(bias))
    return bias.to(bias_dtype).requires_grad_(requires_grad and kind != "padding")


# Shapes (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim): odd headdims, seqlens 1/97/1025, sq != sk both
# ways, GQA 1:1, 2:1, 8:1.
SHAPES = [
    (2, 128, 128, 4, 4, 64),
    (1, 97, 97, 2, 1, 59),
    (2, 1, 97, 8, 1, 32),
    (1, 97, 1, 4, 2, 111),
    (1, 113, 203, 2, 2, 128),
    (1, 203, 113, 4, 2, 96),
    (1, 1025, 1025, 1, 1, 64),
    (1, 33, 65, 2, 1, 256),
    (1, 17, 17, 3, 3, 1),
]
SHAPES_QUICK = SHAPES[:6]

FLAG_SETS = [
    dict(),
    dict(causal=True),
    dict(window_left=16, window_right=0),
    dict(window_left=8, window_right=4),
    dict(causal=True, window_left=32),
    dict(softcap=5.0),
    dict(scale=0.3),
    dict(causal=True, softcap=10.0, scale=0.2),
]

BIAS_KINDS = ["full", "shared", "padding", "2d", "bool_padding", "bool_full", "fp32"]


def sample_inputs(device, dtype, *, requires_grad=False, full=False, seed=0):
    """The samples: every shape with a few flags, every flag on a couple of shapes, every bias kind, both layouts.
    ``full`` crosses more combinations (for GPU runs and slow tests)."""
    g = torch.Generator(device=device).manual_seed(seed)
    shapes = SHAPES if full else [s for s in SHAPES if s[1] * s[2] <= 250_000]
    out = []

    def add(name, shape, flags, bias_kind=None, layout="bshd", headdim_v=None):
        b, sq, sk, h, hk, d = shape
        q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device=device, layout=layout,
                           requires_grad=requires_grad, generator=g, headdim_v=headdim_v)
        kw = dict(flags)
        if bias_kind is not None:
            kw["attn_bias"] = make_bias(bias_kind, b, h, sq, sk, dtype=dtype, device=device,
                                        requires_grad=requires_grad, generator=g)
        dv = "" if headdim_v is None else f"-dv{headdim_v}"
        out.append(Sample(f"{name}-{shape}{dv}-{flags}-{bias_kind}-{layout}", q, k, v, kw))

    for shape in shapes:
        add("shape", shape, {})
        add("shape", shape, {"causal": True})
    for flags in FLAG_SETS:
        for shape in (shapes[0], shapes[2], shapes[4]) if not full else shapes:
            add("flags", shape, flags)
    for kind in BIAS_KINDS:
        for shape in (shapes[0], shapes[4]):
            add("bias", shape, {}, kind)
        add("bias-causal", shapes[1], {"causal": True}, kind)
    # a key-row bias (row stride 0) over many key tiles: the CUDA forward stages it in shared memory a tile ahead
    for kind in ("padding", "bool_padding"):
        add("bias-long", (1, 70, 1100, 2, 1, 128), {}, kind)
        add("bias-long", (2, 200, 777, 2, 2, 64), {"causal": True}, kind)
    for shape, flags in itertools.product((shapes[0], shapes[5]), ({}, {"causal": True})):
        add("layout", shape, flags, layout="bhsd")
    # A row that sees no key: window that excludes everything for early rows, and an all-False bool bias row.
    add("empty-rows", (1, 64, 32, 2, 2, 64), {"causal": True})
    add("empty-rows-window", (1, 48, 48, 2, 1, 32), {"window_left": 0, "window_right": 0})
    # v's own head dim (last, so that the samples above keep their inputs): DeepSeek's MLA (q/k 192, v 128), v wider
    # than q/k, odd ones; with GQA, causal, windows, softcap, a bias, the transposed layout
    add("headdim-v", (1, 37, 53, 4, 2, 192), {"causal": True}, headdim_v=128)
    add("headdim-v", (2, 29, 29, 2, 2, 64), {"window_left": 8, "window_right": 4, "softcap": 5.0}, headdim_v=128)
    add("headdim-v", (1, 33, 47, 4, 1, 40), {}, "full", headdim_v=24)
    add("headdim-v", (1, 17, 9, 2, 2, 24), {"causal": True}, "bool_padding", layout="bhsd", headdim_v=40)
    return out
