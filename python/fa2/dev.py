"""fa2's development namespace: the switches that make fa2 run a kernel other than its default (for A/B timing and
tests), and the plan of a call ("why did this kernel run").

    fa2.dev.options()                                   # the process's options (a dict)
    fa2.dev.set_options(sm90_schedule="pingpong", fwd_cluster=False)
    with fa2.dev.options_override(tile_order_tail=False): ...
    print(fa2.dev.explain_plan(q, k, v, causal=True))   # kernel, grid, smem, workspace, reasons
    fa2.dev.plan("bwd", batch=1, nheads=16, seqlen_q=4096, headdim=128, device="h100")

The environment's FA2_DEV_OPTIONS="key=value,..." sets the options at the first call (docs/development.md: Options and plans).
Defaults are what users run.
"""
from __future__ import annotations

import contextlib
import math

from . import _C

# Devices a plan can be asked for without one (compute capability, SMs, opt-in shared memory per block).
DEVICES = {
    "h100": {"cc": 90, "sm_count": 132, "smem_optin": 227 * 1024},
    "h200": {"cc": 90, "sm_count": 132, "smem_optin": 227 * 1024},
    "a100": {"cc": 80, "sm_count": 108, "smem_optin": 163 * 1024},
    "l40": {"cc": 89, "sm_count": 142, "smem_optin": 99 * 1024},
}


def options() -> dict:
    """The process's development options (the defaults, then FA2_DEV_OPTIONS, then set_options)."""
    return dict(_C.dev_options())


def default_options() -> dict:
    return dict(_C.dev_options(True))


def set_options(**changes) -> None:
    """Sets the named options (the others keep their values); unknown names or bad values raise ValueError."""
    try:
        base = _C.dev_options()
    except ValueError:  # (FA2_DEV_OPTIONS is malformed: start from the defaults)
        base = _C.dev_options(True)
    _C.set_dev_options(base, changes)


@contextlib.contextmanager
def options_override(**changes):
    """The named options set inside the block, all restored after it."""
    before = options()
    set_options(**changes)
    try:
        yield
    finally:
        _C.set_dev_options(before, {})


def tuning_tables() -> dict:
    """What the plans read from the tile configs: each headdim's sm_90a schedules, the warp-specialized backward's
    headdims, ..."""
    return dict(_C.tuning_tables())


def _device(device):
    if device is None or isinstance(device, dict):
        return device
    if isinstance(device, str):
        return DEVICES[device.lower()]
    raise TypeError("device: None (the current GPU), a name in fa2.dev.DEVICES or a dict (cc, sm_count, smem_optin)")


def plan(direction: str = "fwd", device=None, **call) -> dict:
    """The plan of a described call: direction "fwd" or "bwd" (or "decode": below); call: batch, seqlen_q, seqlen_k,
    nheads, nheads_k, headdim (q's and k's), headdim_v (v's; default headdim: the plan's "padding" says what the glue zero-pads), dtype
    ("bfloat16" / "float16"), causal, window_left, window_right, softcap, scale, bias ("none", "key_row": a padding
    mask, "full"), bias_dtype ("same", "float32", "bool"), bias_requires_grad, deterministic, dropout_p, varlen
    (packed sequences: batch of them, seqlen_q / seqlen_k their max_seqlen, total_q / total_k the packed rows, default
    batch x max_seqlen), sinks (True: sinks given).
    device: None (the current GPU), "h100", "h200", "a100", "l40" or a dict. A forward plan's "decode_kernel": True
    where fa2.attention hands the call to the KV-cache op's decode kernel (option dense_decode; the plan's kernel is
    then the fallback for a layout that kernel declines).
    "decode": the KV-cache op's decode kernel for batch, seqlen_q, seqlen_k (the cache's capacity), nheads, nheads_k,
    headdim and num_splits (0: the library's choice): its row blocks, warps over rows, shared memory, CTAs a split and
    "num_splits", the splits of the KV length it runs."""
    return dict(_C.plan(direction, call, _device(device)))


def _call_of(q, k, v, attn_bias, scale, causal, window_left, window_right, softcap, deterministic):
    import torch

    call = {"batch": q.shape[0], "seqlen_q": q.shape[1], "nheads": q.shape[2], "headdim": q.shape[3],
            "headdim_v": v.shape[3],
            "seqlen_k": k.shape[1], "nheads_k": k.shape[2], "causal": causal, "window_left": window_left,
            "window_right": window_right, "softcap": softcap, "deterministic": deterministic,
            "dtype": "float16" if q.dtype == torch.float16 else "bfloat16",
            "scale": scale if scale is not None else 1.0 / math.sqrt(q.shape[3])}
    if attn_bias is not None:
        b = attn_bias.expand(q.shape[0], q.shape[2], q.shape[1], k.shape[1])
        call["bias"] = "key_row" if b.stride(2) == 0 else "full"
        call["bias_dtype"] = ("bool" if attn_bias.dtype == torch.bool else
                              "float32" if attn_bias.dtype == torch.float32 else "same")
        call["bias_requires_grad"] = attn_bias.requires_grad
    return call


def explain_plan(q, k, v, attn_bias=None, scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                 deterministic=False, device=None, direction="both", dropout_p=0.0) -> str:
    """The plans fa2 makes for attention(q, k, v, ...) (flash-attn layout: batch, seqlen, heads, headdim), as text:
    for each direction the kernel, grid, block, shared memory, workspace and the reasons for each choice. device:
    None (q's GPU), or a name in DEVICES / a dict for a described one. (Inputs are taken as the glue passes them:
    contiguous and aligned.)"""
    import torch

    call = _call_of(q, k, v, attn_bias, scale, causal, window_left, window_right, softcap, deterministic)
    call["dropout_p"] = dropout_p
    lines = []
    on_gpu = device is None and q.is_cuda
    for d in (("fwd", "bwd") if direction == "both" else (direction,)):
        with torch.cuda.device(q.device) if on_gpu else contextlib.nullcontext():
            p = plan(d, device=device, **call)
        lines.append(f"{'forward' if d == 'fwd' else 'backward'}:")
        lines += [f"  {key}: {value}" for key, value in p.items() if key not in ("reasons", "device")]
        lines += [f"  why: {r}" for r in p.get("reasons", [])]
    return "\n".join(lines)


def sm90_default_schedule(headdim: int, windowed: bool) -> str:
    """What sm90_schedule "auto" runs at an instantiated headdim on the plain path (windowed: a causal mask or
    window)."""
    return _C.tuning_tables()["sm90_default_schedule"][headdim][0 if windowed else 1]


def sm90_key_bias_schedule(headdim: int) -> str:
    """What a key-row bias (padding mask) runs under "auto"."""
    return _C.tuning_tables()["sm90_key_bias_schedule"][headdim]


def bwd_tail_split_plan(batch, nheads, nheads_k, seqlen_q, seqlen_k, headdim, causal=False, device=None):
    """The warp-specialized backward's split of its last wave for a plain bf16 call: (tiles split, pieces each,
    the grid's tiles); (0, 1, 0) where it does not split."""
    p = plan("bwd", device=device, batch=batch, nheads=nheads, nheads_k=nheads_k, seqlen_q=seqlen_q,
             seqlen_k=seqlen_k, headdim=headdim, causal=causal)
    return tuple(p.get("tail_split_plan", (0, 1, 0)))


# The variables that set single options before FA2_DEV_OPTIONS (still honored: dev_options.cpp).
LEGACY_VARIABLES = {
    "arch_specific_kernels": "FA2_DISABLE_ARCH_SPECIFIC", "sm90_schedule": "FA2_SM90_SCHEDULE",
    "persistent_forward_ctas": "FA2_PERSISTENT_FWD_CTAS", "fwd_cluster": "FA2_NO_FWD_CLUSTER",
    "tile_order_tail": "FA2_NO_TILE_ORDER_TAIL", "sm90_backward": "FA2_DISABLE_SM90_BACKWARD",
    "sm90_ws_backward": "FA2_DISABLE_SM90_WS_BACKWARD", "key_bias_backward": "FA2_DISABLE_KEY_BIAS_BWD",
    "bwd_small_tiles": "FA2_BWD_SMALL_TILES", "bwd_gqa_grouping": "FA2_BWD_GQA_GROUPING",
    "bwd_gqa_accumulate": "FA2_BWD_GQA_NO_ACCUMULATE", "bwd_tail_split": "FA2_BWD_TAIL_SPLIT",
    "cpu_bf16_gemm": "FA2_CPU_BF16_GEMM",
}


def environment_sets(name: str) -> bool:
    """Whether the environment names option `name` (FA2_DEV_OPTIONS, or its older variable): tests that check a
    default skip that check then."""
    import os

    keys = [item.split("=", 1)[0].strip() for item in os.environ.get("FA2_DEV_OPTIONS", "").split(",")]
    legacy = LEGACY_VARIABLES.get(name)  # (options newer than FA2_DEV_OPTIONS have none)
    return name in keys or (legacy is not None and os.environ.get(legacy) is not None)
