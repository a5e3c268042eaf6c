#!/usr/bin/env python
"""Attention kernel benchmark: fa2 against PyTorch's attention kernels, side by side in one run.

Implementations (``--impls``):
  fa2        fa2.attention (flash-attn layout; the (B, H, S, D) inputs are passed as ``.transpose(1, 2)`` views)
  torch-fa2  F.scaled_dot_product_attention pinned to SDPBackend.FLASH_ATTENTION (PyTorch's FA-2)
  cudnn      ... pinned to SDPBackend.CUDNN_ATTENTION
  efficient  ... pinned to SDPBackend.EFFICIENT_ATTENTION (memory-efficient / xformers kernel)
  math       ... pinned to SDPBackend.MATH (materializes the S x S scores)
  flex       torch.compile(flex_attention), with a causal block mask when causal and a score_mod for biases
  fa4        FlashAttention-4 (PyPI flash-attn-4: flash_attn.cute.flash_attn_func, CuTe DSL, an sm90 forward and
             backward), flash-attn layout like fa2, no masks; not in the defaults. Where flash_attn.cute is not
             importable its rows are "n/a" with the reason (the GPU machine installs it from carried wheels:
             docs/performance.md, "FA-4 beside fa2"). It compiles each kernel on its first call (1-3 s): the check
             call below is its warm-up, outside the timing.
  sdpa       F.scaled_dot_product_attention with PyTorch's own backend choice (not in the defaults)

Grid (the FA-2 paper's, Dao 2023, section 4.1): 16k tokens (batch = 16384 // seqlen), hidden 2048
(nheads = 2048 // D), D in {64, 128, 256}, seqlen 512 ... 16k, causal and not, bf16 and fp16; passes fwd, bwd,
fwd+bwd. Mask variants (non-causal only, as SDPA cannot combine attn_mask with is_causal):
  padding: a (B, 1, 1, S) additive float bias, the last 10% of each batch's keys -inf (fa2 gets attn_bias,
           SDPA gets attn_mask, flex a score_mod reading the same tensor);
  full:    a (B, H, S, S) random float bias (relative-position-style), seqlen <= --full-bias-max-seqlen.
Memory: peak GPU memory of one fwd+bwd call vs seqlen (batch 1, 16 heads, D 128, S up to 64k), fa2 vs math.

Timing: triton's do_bench median (CUDA events around each call, the L2 flushed before it). On a GPU each cell's
implementations are timed in two rounds, the second in reverse order, each measurement after 0.1 s with the GPU idle,
and the median round is reported (--rounds, --cooldown: otherwise a short burst is timed in the state the kernel before
left the GPU in, which moved the H200's ratios by a median 2-3%).

Every failure (unsupported shape or dtype, OOM, missing backend, a wrong result) is recorded with its reason
and the run goes on. Each implementation's first output (and its gradients) is compared with an fp32 reference
on the first batch and first two heads; a mismatch is flagged with '!' in the table and kept in the JSON. Where fa2
runs in the same job, every peer's output and gradients on that slice are also compared with fa2's (check.vs_fa2:
relative differences, recorded, not flagged: the fp32 reference judges both).

Usage:
  python benchmarks/bench_attention.py --quick                       # ~1 minute on an H200
  python benchmarks/bench_attention.py                               # the whole grid (long)
  python benchmarks/bench_attention.py --dims 128 --seqlens 2k,8k --impls fa2,cudnn --pass fwd
  python benchmarks/bench_attention.py --device cpu --quick          # CPU smoke test; --device cpu: CPU section
Writes <out>/attention_<tag>.json and PNG plots (benchmarks/plot.py, which also re-plots a saved JSON).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import math
import os
import statistics
import sys
import time
import warnings
import zlib
from dataclasses import asdict, dataclass

import torch
import torch._dynamo
import torch.nn.functional as F

from bench_common import (ClockSampler, attention_flops, environment, import_fa2, is_oom, nvidia_smi_id,
                          pass_closure, proc_status_kib, short_error, sync)

HERE = os.path.dirname(os.path.abspath(__file__))

# fa2-sm80: fa2 with its sm_90a (wgmma) instances switched off, i.e. the sm80-path kernels of the same build (the
# same as fa2 on builds without FA2_CUDA_ARCHS=...90a): the Hopper path's gain, measured in one run.
# fa2-pipe / fa2-ws / fa2-wspp / fa2-wsov / fa2-wsppov: fa2 with the sm_90a forward's schedule forced
# (fa2.dev option sm90_schedule; fa2 itself runs each headdim's default, tile_config.h): pipelined (no warp
# specialization), warp-specialized, with ping-pong between its consumer warpgroups, with P V overlapping the next
# softmax, with both. Forced warp-specialized schedules apply to the plain path (and fa2-ws at d <= 64 to a padding
# mask too: the wide kernel); the rest runs as fa2 (or pipelined under fa2-pipe).
# fa2-nopers: fa2 with the warp-specialized forward's persistent grid off (fa2.dev option persistent_forward_ctas=0):
# one CTA per query block.
# fa2-nocluster: fa2 with the d 128 forward's clusters of two off (fa2.dev option fwd_cluster=False): its CTAs load their
# K/V tiles each for itself (calls without a causal mask or window).
# fa2-bwd80: fa2 with the backward's sm_90a (wgmma) instances switched off (fa2.dev option sm90_backward), i.e. the
# sm80-path backward of the same build (the forward stays on sm_90a).
# fa2-bwdnows: fa2 with the sm_90a backward's warp-specialized kernel switched off (fa2.dev option sm90_ws_backward): its
# d 64 / 128 plain calls on bwd_kernel.cuh's wgmma instances.
# fa2-kbias-off: fa2 with the backward's key-row bias variant switched off (fa2.dev option key_bias_backward): padding
# masks on the general bias path, as before it became the default (--masks padding --pass bwd,fwdbwd).
# fa2-nosplit / fa2-split: fa2 with the warp-specialized backward's split of its last partial wave
# (fa2.dev option bwd_tail_split) off (one CTA per (key block, head) throughout) / on wherever its cost model gains (the
# default splits only where it was measured to pay; --causal no --pass bwd,fwdbwd at d 64 / 128).
# fa2-nobwdpdl: fa2 with the warp-specialized backward's main kernel launched after the preprocess completes rather
# than as its programmatic dependent (fa2.dev option bwd_programmatic_main off; on, its launch and K / V loads overlap
# the preprocess's last wave).
# fa2-sinks: fa2 with attention sinks (gpt-oss), learned (requires grad: the backward's d sinks pass counts) and all
# -inf: the kernels do the sinks' work (the forward epilogue's extra exp per row, d sinks) while the output stays
# fa2's, so the reference check holds. `--impls fa2,fa2-sinks --interleave` gives the sinks' cost.
FA2_SWITCHES = {"fa2-sm80": {"arch_specific_kernels": False},
                "fa2-nosplit": {"bwd_tail_split": 0},
                "fa2-split": {"bwd_tail_split": 1},
                "fa2-bwd80": {"sm90_backward": False},
                "fa2-bwdnows": {"sm90_ws_backward": False},
                "fa2-kbias-off": {"key_bias_backward": False},
                "fa2-pipe": {"sm90_schedule": "pipelined"},
                "fa2-ws": {"sm90_schedule": "ws"},
                "fa2-wspp": {"sm90_schedule": "pingpong"},
                "fa2-wsov": {"sm90_schedule": "overlap"},
                "fa2-wsppov": {"sm90_schedule": "pingpong-overlap"},
                "fa2-nopers": {"persistent_forward_ctas": 0},
                "fa2-nocluster": {"fwd_cluster": False},
                "fa2-nobwdpdl": {"bwd_programmatic_main": False}}
IMPLS = ("fa2", "fa2-sinks", "fa2-nosplit", "fa2-split", "fa2-sm80", "fa2-bwd80", "fa2-bwdnows", "fa2-kbias-off",
         "fa2-pipe", "fa2-ws", "fa2-wspp", "fa2-wsov", "fa2-wsppov", "fa2-nopers", "fa2-nocluster", "fa2-nobwdpdl",
         "torch-fa2", "cudnn", "efficient", "math", "flex", "sdpa", "fa4")
SDPA_BACKENDS = {"torch-fa2": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "math": "MATH", "sdpa": None}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}
PASSES = ("fwd", "bwd", "fwdbwd")
MASKS = ("none", "padding", "full")
# Relative error (||out - ref|| / ||ref||, ref in fp32) above which a result is flagged as wrong. Loose on
# purpose: it catches garbage (error ~1), not rounding (bf16 ~4e-3, fp16 ~5e-4, naive bf16 math ~1e-2).
TOLERANCE = {torch.bfloat16: 0.05, torch.float16: 0.02, torch.float32: 1e-3, torch.float64: 1e-6}


# ---- defaults: (device, quick) -> grid ----------------------------------------------------------------------

PROFILES = {
    ("cuda", False): dict(dims="64,128,256", seqlens="512,1k,2k,4k,8k,16k", dtypes="bf16,fp16", causal="both",
                          masks="none,padding,full", passes="fwd,bwd,fwdbwd",
                          impls="fa2,torch-fa2,cudnn,efficient,math,flex", tokens=16384, hidden=2048,
                          mem_seqlens="1k,2k,4k,8k,16k,32k,64k", mem_impls="fa2,math,torch-fa2",
                          mem_heads=16, mem_dim=128, full_bias_max_seqlen=4096, warmup_ms=25, rep_ms=100,
                          rounds=2, cooldown=0.1),
    ("cuda", True): dict(dims="64,128", seqlens="1k,4k", dtypes="bf16", causal="both", masks="none",
                         passes="fwd,fwdbwd", impls="fa2,torch-fa2,cudnn,efficient,math,flex", tokens=16384,
                         hidden=2048, mem_seqlens="1k,4k,16k,64k", mem_impls="fa2,math", mem_heads=16, mem_dim=128,
                         full_bias_max_seqlen=4096, warmup_ms=25, rep_ms=100, rounds=2, cooldown=0.1),
    # CPU section: fa2's CPU kernel against PyTorch's CPU SDPA (its FLASH_ATTENTION backend is a CPU flash kernel).
    ("cpu", False): dict(dims="64,128", seqlens="256,512,1k", dtypes="fp32,bf16", causal="both",
                         masks="none,padding", passes="fwd,bwd,fwdbwd", impls="fa2,torch-fa2,math", tokens=2048,
                         hidden=512, mem_seqlens="256,512,1k,2k", mem_impls="fa2,math", mem_heads=4, mem_dim=64,
                         full_bias_max_seqlen=1024, warmup_ms=50, rep_ms=300, rounds=1, cooldown=0.0),
    # The GPU quick grid's code paths with tiny sizes (a smoke test, also what CI runs).
    ("cpu", True): dict(dims="64,128", seqlens="128,256", dtypes="fp32", causal="both", masks="none",
                        passes="fwd,fwdbwd", impls="fa2,torch-fa2,cudnn,efficient,math,flex", tokens=512,
                        hidden=256, mem_seqlens="128,256,512", mem_impls="fa2,math", mem_heads=2, mem_dim=64,
                        full_bias_max_seqlen=256, warmup_ms=5, rep_ms=30, rounds=1, cooldown=0.0),
}


def parse_size(s: str) -> int:
    s = s.strip().lower()
    return int(float(s[:-1]) * 1024) if s.endswith("k") else int(s)


def csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


# ---- timing -----------------------------------------------------------------------------------------------

try:
    from triton.testing import do_bench as _do_bench
except Exception:  # no triton (CPU machines): CUDA events below
    _do_bench = None


def time_ms(fn, device: torch.device, warmup_ms: float, rep_ms: float, cooldown_s: float = 0.0,
            window: list | None = None) -> float:
    """Median time of fn() in milliseconds, after warm-up (and, with cooldown_s, that long with the GPU idle first).
    window, if given, receives the unix times the warm-up and timed calls started and ended (--clocks)."""
    if cooldown_s > 0:
        sync(device)
        time.sleep(cooldown_s)
    if window is not None:
        window.append(time.time())
        try:
            return time_ms(fn, device, warmup_ms, rep_ms)
        finally:
            sync(device)
            window.append(time.time())
    if device.type == "cuda":
        if _do_bench is not None:
            # do_bench: CUDA events around each call, L2 flushed between calls, warm-up/rep in milliseconds.
            try:
                return float(_do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
            except TypeError:  # older triton without return_mode
                return float(_do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5])[0])
        return _cuda_events_median(fn, warmup_ms, rep_ms)
    return _cpu_median(fn, warmup_ms, rep_ms)


def time_interleaved(fns: dict, device: torch.device, warmup_ms: float, rep_ms: float, cooldown_s: float = 0.0,
                     windows: dict | None = None) -> dict:
    """Median time in milliseconds of each of several calls, their calls interleaved in one burst (a b a b ..., the
    order flipped every other step; each call after an L2 flush and between CUDA events, as do_bench times them).
    fns: name -> (fn, context factory entered around each of its calls: fa2's switches). Why: on the H200 one
    implementation's 50 ms bursts a second apart fall into groups ~10% apart, fa2's and cuDNN's alike, and the group
    follows neither the SM clock (attention_h200-20261204-d128-rounds.json) nor the buffers' placement
    (placement_h200-20261204-*.json); timed in one burst, call by call, peers share the GPU's state. Every name gets
    the same number of calls: the slowest's rep_ms worth, at least 5, at most 1000.
    windows: name -> list that receives the burst's start and end unix times. CUDA only (run_jobs times the CPU's one
    after the other)."""
    windows = windows if windows is not None else {}
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device)
    names = list(fns)
    est = []
    for name in names:
        fn, ctx = fns[name]
        with ctx():
            fn()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(3):
                fn()
            b.record()
            torch.cuda.synchronize()
        est.append(max(a.elapsed_time(b) / 3, 1e-3))
    warm, reps = max(1, int(warmup_ms / max(est))), min(1000, max(5, int(rep_ms / max(est))))
    if cooldown_s > 0:
        torch.cuda.synchronize()
        time.sleep(cooldown_s)
    t0 = time.time()
    events = {name: [] for name in names}
    for i in range(warm + reps):
        for name in (names if i % 2 == 0 else names[::-1]):
            fn, ctx = fns[name]
            with ctx():
                flush.zero_()
                if i < warm:
                    fn()
                    continue
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                events[name].append((a, b))
    torch.cuda.synchronize()
    t1 = time.time()
    for name in names:
        if name in windows:
            windows[name] += [t0, t1]
    return {name: statistics.median(a.elapsed_time(b) for a, b in events[name]) for name in names}


def _cuda_events_median(fn, warmup_ms, rep_ms):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    est = max((time.perf_counter() - t0) / 3 * 1e3, 1e-3)
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    times = []
    for _ in range(min(1000, max(5, int(rep_ms / est)))):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        times.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in times)


def _cpu_median(fn, warmup_ms, rep_ms):
    t_end = time.perf_counter() + warmup_ms / 1e3
    fn()
    while time.perf_counter() < t_end:
        fn()
    times = []
    t_end = time.perf_counter() + rep_ms / 1e3
    while len(times) < 3 or (time.perf_counter() < t_end and len(times) < 100):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# ---- memory -----------------------------------------------------------------------------------------------

class PeakMemory:
    """Peak memory allocated during a region, above what was allocated at its start.
    CUDA: torch.cuda.max_memory_allocated (exact, caching allocator). CPU: the process's resident-set high-water
    mark (VmHWM, reset through /proc/self/clear_refs) -- coarse, Linux only; None where unavailable."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        sync(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            self.base = None
            with contextlib.suppress(OSError):
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # resets VmHWM to the current RSS
                self.base = proc_status_kib("VmRSS")
        return self

    def __exit__(self, *exc):
        sync(self.device)
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device) - self.base
        else:
            hwm = proc_status_kib("VmHWM")
            self.peak = None if self.base is None or hwm is None else max(0, hwm - self.base) * 1024
        return False


# ---- problems and implementations --------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    dtype: str
    headdim: int
    seqlen: int
    batch: int
    nheads: int
    causal: bool
    mask: str

    def seed(self) -> int:  # the same random inputs for every implementation of a config
        return zlib.crc32(repr(self).encode())


def make_inputs(cfg: Config, device):
    """q, k, v (B, H, S, D) leaves that require grad, standard normal (never zeros); bias or None."""
    gen = torch.Generator(device=device).manual_seed(cfg.seed())
    dt = DTYPES[cfg.dtype]
    shape = (cfg.batch, cfg.nheads, cfg.seqlen, cfg.headdim)
    q, k, v = (torch.randn(shape, generator=gen, device=device, dtype=dt).requires_grad_() for _ in range(3))
    bias = None
    if cfg.mask == "padding":
        # Additive key-padding bias (B, 1, 1, S): the last 10% of every sequence's keys are padding.
        bias = torch.zeros(cfg.batch, 1, 1, cfg.seqlen, device=device, dtype=dt)
        bias[..., cfg.seqlen - max(1, cfg.seqlen // 10):] = float("-inf")
    elif cfg.mask == "full":
        bias = torch.randn(cfg.batch, cfg.nheads, cfg.seqlen, cfg.seqlen, generator=gen, device=device, dtype=dt)
    return q, k, v, bias


_FLEX = {}


def _flex():
    if "fn" not in _FLEX:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        # One compiled function; each new shape is one more (static-shape) compilation, done in the first call,
        # outside the timing.
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
        _FLEX["create_block_mask"] = create_block_mask
    return _FLEX["fn"], _FLEX["create_block_mask"]


def reset_flex():
    """After an exception inside compiled flex_attention, Dynamo runs that function uncompiled from then on
    (seen with torch 2.13: every later shape ran ~5x slower): start again from a clean Dynamo state."""
    _FLEX.clear()
    torch._dynamo.reset()


_FA4 = {}
FA4_INSTALL_HINT = "bash .fa4/install.sh .fa4 installs it on the GPU machine (docs/performance.md, FA-4 beside fa2)"


def import_fa4(device) -> tuple:
    """(flash_attn.cute.flash_attn_func, None), or (None, why FA-4 cannot run here). Imported once."""
    if device.type != "cuda":
        return None, "FA-4 runs on CUDA GPUs only (flash_attn.cute, CuTe DSL kernels)"
    if "result" not in _FA4:
        try:
            from flash_attn.cute import flash_attn_func
            _FA4["result"] = (flash_attn_func, None)
        except Exception as e:  # ImportError where not installed; the DSL's own errors where its wheels mismatch
            _FA4["result"] = (None, f"flash_attn.cute is not importable ({short_error(e)[:200]}); {FA4_INSTALL_HINT}")
    return _FA4["result"]


def fa4_version() -> dict:
    """flash-attn-4's and the CuTe DSL's versions where installed (the run's environment record)."""
    from importlib.metadata import PackageNotFoundError, version
    got = {}
    for name in ("flash-attn-4", "nvidia-cutlass-dsl", "quack-kernels"):
        with contextlib.suppress(PackageNotFoundError):
            got[name] = version(name)
    return got


# Implementations whose output (and dout) is in the flash-attn layout (B, S, H, D); the others' is (B, H, S, D).
def flash_layout(impl: str) -> bool:
    return impl in ("fa2", "fa2-sinks", "fa4") or impl in FA2_SWITCHES


def make_call(impl: str, cfg: Config, bias, fa2_mod, device):
    """(f, to_bhsd): f(q, k, v) runs the implementation on (B, H, S, D) tensors and returns its output in its own
    layout; to_bhsd(out) views that output as (B, H, S, D)."""
    causal = cfg.causal
    if impl in ("fa2", "fa2-sinks") or impl in FA2_SWITCHES:
        if fa2_mod is None:
            raise RuntimeError(import_fa2()[1] or "fa2 is not importable")
        extra = {}
        if impl == "fa2-sinks":
            extra["sinks"] = torch.full((cfg.nheads,), -math.inf, device=device, requires_grad=True)

        # flash-attn layout (B, S, H, D): transposed views of the (B, H, S, D) tensors, no copies.
        def f(q, k, v):
            return fa2_mod.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias,
                                     causal=causal, **extra)
        return f, lambda out: out.transpose(1, 2)
    if impl == "fa4":
        fa4, why = import_fa4(device)
        if fa4 is None:
            raise RuntimeError(why)
        if bias is not None:
            raise RuntimeError("FA-4 takes no additive attn_bias here (its masks are mask_mod / score_mod callables):"
                               " masks none only")
        # flash_attn_func(q, k, v, softmax_scale=None, causal=False, ...) -> (out, lse), (B, S, H, D) in and out;
        # the transposed views pass without a copy (their last dim is contiguous, strides 16-byte aligned).
        def f(q, k, v):
            return fa4(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)[0]
        return f, lambda out: out.transpose(1, 2)
    if impl in SDPA_BACKENDS:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        name = SDPA_BACKENDS[impl]
        ctx = (lambda: sdpa_kernel([getattr(SDPBackend, name)])) if name else contextlib.nullcontext

        def f(q, k, v):
            with ctx():  # the backward follows the forward's kernel; the context only steers dispatch
                return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal)
        return f, lambda out: out
    if impl == "flex":
        flex, create_block_mask = _flex()
        block_mask = None
        if causal:
            block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, cfg.seqlen,
                                           cfg.seqlen, device=device)
        score_mod = None
        if cfg.mask == "padding":
            def score_mod(score, b, h, q_idx, kv_idx):
                return score + bias[b, 0, 0, kv_idx]
        elif cfg.mask == "full":
            def score_mod(score, b, h, q_idx, kv_idx):
                return score + bias[b, h, q_idx, kv_idx]

        def f(q, k, v):
            return flex(q, k, v, score_mod=score_mod, block_mask=block_mask)
        return f, lambda out: out
    raise ValueError(f"unknown implementation {impl!r}")


def reference(cfg: Config, q, k, v, bias, dout_bhsd):
    """fp32 math on the first batch and the first (up to) two heads: output and (dq, dk, dv) for dout."""
    h = min(2, cfg.nheads)
    qs, ks, vs = (t.detach()[:1, :h].float().requires_grad_() for t in (q, k, v))
    s = (qs @ ks.transpose(-1, -2)) * cfg.headdim ** -0.5
    if bias is not None:
        s = s + bias[:1, :h].float()
    if cfg.causal:
        s = s.masked_fill(torch.ones(cfg.seqlen, cfg.seqlen, dtype=torch.bool, device=q.device).triu(1),
                          float("-inf"))
    out = torch.softmax(s, dim=-1) @ vs
    grads = torch.autograd.grad(out, (qs, ks, vs), dout_bhsd[:1, :h].float())
    return out.detach(), grads


def rel_err(x, ref):
    x, ref = x.detach().float(), ref.detach().float()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def short(e: BaseException, caught=()) -> str:
    text = short_error(e)
    # SDPA explains why it has no kernel in warnings; keep the first ones, they are the useful part.
    reasons = [str(w.message).strip().splitlines()[0] for w in caught if "kernel not used" in str(w.message)
               or "not supported" in str(w.message).lower()]
    if reasons:
        text += " | " + " | ".join(dict.fromkeys(reasons))
    return text[:400]


# ---- one implementation on one config: all passes ------------------------------------------------------------

@contextlib.contextmanager
def switched(impl: str, fa2_mod):
    """fa2's switches set as impl needs them (FA2_SWITCHES: fa2-nosplit, fa2-ws, ...), restored on the way out."""
    switches = FA2_SWITCHES.get(impl, {}) if fa2_mod is not None else {}
    dev = getattr(fa2_mod, "dev", None) if switches else None
    if dev is not None:  # (fa2.dev's options; builds before it had one fa2._C setter per switch)
        with dev.options_override(**switches):
            yield
        return
    before = {name: getattr(fa2_mod._C, name)() for name in switches}
    for name, value in switches.items():
        getattr(fa2_mod._C, "set_" + name)(value)
    try:
        yield
    finally:
        for name, value in before.items():
            getattr(fa2_mod._C, "set_" + name)(value)


def run_jobs(cfg: Config, impls: list[str], passes, fa2_mod, device, warmup_ms, rep_ms, cooldown_s=0.0) -> list[dict]:
    """Rows for one config and the given implementations, on the same inputs. One implementation: each pass timed on
    its own (time_ms); several (--interleave): each pass's calls of all of them interleaved in one burst
    (time_interleaved), so that they share the GPU's state."""
    def rec(impl, pass_, status, **kw):
        return dict(impl=impl, **asdict(cfg), **{"pass": pass_, "status": status}, **kw)

    try:
        q, k, v, bias = make_inputs(cfg, device)
    except Exception as e:
        status = "oom" if is_oom(e) else "error"
        _free(device)
        return [rec(i, p, status, reason=f"inputs: {short(e)}") for i in impls for p in passes]

    results = []
    ready = {}  # impl -> (f, grad_ok, note, check, dout)
    for impl in impls:
        with switched(impl, fa2_mod):
            got = _prepare(cfg, impl, q, k, v, bias, fa2_mod, device)
        if isinstance(got, str):  # (status, reason) of a backend that did not take the problem
            status, reason = got.split("|", 1)
            results += [rec(impl, p, status, reason=reason) for p in passes]
        else:
            ready[impl] = got
    compare_with_fa2(ready)

    def failed(impl, pass_, e, check):
        return rec(impl, pass_, "oom" if is_oom(e) else "error", reason=short(e), check=check)

    for pass_ in passes:
        flops = attention_flops(cfg.batch, cfg.nheads, cfg.seqlen, cfg.seqlen, cfg.headdim, cfg.causal, pass_)
        fns = {}
        try:
            for impl, (f, grad_ok, note, check, dout, _) in ready.items():
                if pass_ != "fwd" and not grad_ok:
                    results.append(rec(impl, pass_, "n/a", reason=note, check=check))
                    continue
                try:
                    with switched(impl, fa2_mod):
                        fns[impl] = _pass_fn(f, pass_, q, k, v, grad_ok, dout)
                except Exception as e:  # (the bwd pass's forward) this implementation's row only
                    results.append(failed(impl, pass_, e, check))
            windows = {impl: [] for impl in fns}
            times, together = None, {}  # together: impl -> the implementations it was interleaved with
            if len(fns) > 1 and device.type == "cuda":
                try:
                    times = time_interleaved({i: (fn, functools.partial(switched, i, fa2_mod))
                                              for i, fn in fns.items()}, device, warmup_ms, rep_ms, cooldown_s, windows)
                    together = {i: [j for j in fns if j != i] for i in fns}
                except Exception:  # one of them failed the burst: each alone (below), so that only it gets the error
                    _free(device)
            if times is None:  # one at a time: a single implementation, the CPU, or a failed burst
                times = {}
                for impl in fns:
                    try:
                        with switched(impl, fa2_mod):
                            times[impl] = time_ms(fns[impl], device, warmup_ms, rep_ms, cooldown_s, windows[impl])
                    except Exception as e:
                        results.append(failed(impl, pass_, e, ready[impl][3]))
                        _free(device)
            for impl, ms in times.items():
                note, check = ready[impl][2:4]
                r = rec(impl, pass_, "ok", ms=ms, flops=flops, tflops=flops / (ms * 1e-3) / 1e12, check=check,
                        window=windows[impl])
                if together:
                    r["interleaved_with"] = together[impl]
                if note:
                    r["note"] = note
                results.append(r)
        finally:
            fns = None
            _free(device)
    return results


def _prepare(cfg: Config, impl: str, q, k, v, bias, fa2_mod, device):
    """(f, grad_ok, note, check, dout, sample) for impl on these inputs: its first call (flex and FA-4 compile there,
    the backward in the check's gradients: their warm-up, outside the timing; a backend that does not take the
    problem says so) and its output and gradients checked against fp32 math on a slice (dout: the output gradient,
    kept for the timed backward; sample: that slice's output and gradients in fp32, (B, H, S, D), which run_jobs
    compares with fa2's); or "status|reason" where the first call failed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            f, to_bhsd = make_call(impl, cfg, bias, fa2_mod, device)
            # FlexAttention has no backward on the CPU (it raises NotImplementedError for inputs that require
            # grad, and a compiled flex that raised once stays slow): time its forward on no-grad inputs.
            grad_ok = not (impl == "flex" and device.type == "cpu")
            note = None if grad_ok else "no backward on this device: forward timed on no-grad inputs"
            t_first = time.perf_counter()
            out = f(q, k, v) if grad_ok else f(q.detach(), k.detach(), v.detach())
            sync(device)
            first_call_s = time.perf_counter() - t_first
        except Exception as e:
            status = "oom" if is_oom(e) else "n/a"
            _free(device)
            return f"{status}|{short(e, caught)}"

    tol = TOLERANCE[DTYPES[cfg.dtype]]
    check = {"first_call_s": round(first_call_s, 3)}  # (a JIT's compile time: flex, FA-4)
    sample = None
    # dout: the same values (B, H, S, D) for every implementation (so that their gradients compare), stored
    # contiguous in the implementation's own output shape
    dout = torch.empty(out.shape, device=device, dtype=out.dtype)
    to_bhsd(dout).copy_(torch.randn(to_bhsd(out).shape, device=device, dtype=out.dtype,
                                    generator=torch.Generator(device=device).manual_seed(cfg.seed() + 1)))
    try:
        ref_out, ref_grads = reference(cfg, q, k, v, bias, to_bhsd(dout))
        h = ref_out.shape[1]
        out_slice = to_bhsd(out)[:1, :h].detach().float()
        check["out_rel_err"] = rel_err(out_slice, ref_out)
        sample = (out_slice, None)
        if grad_ok:
            grads = torch.autograd.grad(out, (q, k, v), dout)
            check["grad_rel_err"] = max(rel_err(g[:1, :h], r) for g, r in zip(grads, ref_grads))
            sample = (out_slice, [g[:1, :h].detach().float() for g in grads])
            del grads
        errs = [x for x in (check.get("out_rel_err"), check.get("grad_rel_err")) if x is not None]
        check["ok"] = all(x <= tol for x in errs)  # NaN compares False: not ok
        check["tol"] = tol
    except Exception as e:
        check.update(ok=None, error=short(e))
        if is_oom(e):
            _free(device)
    return f, grad_ok, note, check, dout, sample


def compare_with_fa2(ready: dict) -> None:
    """check["vs_fa2"] of every prepared peer where fa2 was prepared too: the relative difference of its output and
    (the largest of) its gradients from fa2's on the checked slice (the same inputs and dout)."""
    base = ready.get("fa2")
    if base is None or base[5] is None:
        return
    base_out, base_grads = base[5]
    for impl, (_, _, _, check, _, sample) in ready.items():
        if impl == "fa2" or sample is None:
            continue
        out, grads = sample
        diff = {"out_rel_diff": rel_err(out, base_out)}
        if grads is not None and base_grads is not None:
            diff["grad_rel_diff"] = max(rel_err(g, b) for g, b in zip(grads, base_grads))
        check["vs_fa2"] = diff


def _pass_fn(f, pass_, q, k, v, grad_ok, dout):
    """The call one measurement of pass_ repeats (bench_common.pass_closure); the forward of an implementation
    without gradients runs on detached inputs."""
    if pass_ == "fwd" and not grad_ok:
        q, k, v = q.detach(), k.detach(), v.detach()
    return pass_closure(lambda: f(q, k, v), pass_, (q, k, v), dout)


def _free(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


# ---- memory section ---------------------------------------------------------------------------------------

def run_memory(impls, seqlens, nheads, headdim, dtype, fa2_mod, device) -> list[dict]:
    """Peak memory of one fwd+bwd call (batch 1), above the inputs q, k, v and dout. Includes the output and
    the three gradients, which every implementation must allocate; stops an implementation at its first OOM."""
    rows = []
    for impl in impls:
        stopped = None
        for S in seqlens:
            cfg = Config(dtype, headdim, S, 1, nheads, False, "none")
            row = dict(impl=impl, seqlen=S, batch=1, nheads=nheads, headdim=headdim, dtype=dtype)
            if stopped:
                rows.append(dict(row, status="skipped", reason=stopped))
                continue
            q = k = v = dout = out = grads = None
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    q, k, v, _ = make_inputs(cfg, device)
                    f, _ = make_call(impl, cfg, None, fa2_mod, device)
                    # dout in the implementation's own output layout: fa2, fa4 (B, S, H, D), SDPA (B, H, S, D)
                    shape = (1, S, nheads, headdim) if flash_layout(impl) else (1, nheads, S, headdim)
                    dout = torch.randn(shape, device=device, dtype=q.dtype)
                    with PeakMemory(device) as pm:
                        out = f(q, k, v)
                        grads = torch.autograd.grad(out, (q, k, v), dout)
                    if not all(torch.isfinite(g).all() for g in grads):
                        raise RuntimeError("non-finite gradients")
                rows.append(dict(row, status="ok", peak_bytes=pm.peak))
            except Exception as e:
                status = "oom" if is_oom(e) else "error"
                rows.append(dict(row, status=status, reason=short(e, caught)))
                stopped = f"after {status} at seqlen {S}"
            finally:
                q = k = v = dout = out = grads = None
                _free(device)
    return rows


# ---- report -----------------------------------------------------------------------------------------------

def ordered_jobs(configs: list, impls: list[str], rounds: int = 1, interleave: bool = False) -> list[tuple]:
    """(config, impl) in the order they run: config by config, each config's implementations round after round, every
    other round in reverse (a, b, c, c, b, a, ...); flex jobs last (each new shape is a compilation, the slowest part
    of the run: under a time budget the kernels that need none are measured first). interleave: (config, (a, b, c))
    once per round instead, the implementations timed together (time_interleaved); flex still on its own."""
    plain = [i for i in impls if i != "flex"]
    if interleave:
        jobs = [(c, tuple(plain)) for c in configs for _ in range(rounds)] if plain else []
    else:
        jobs = [(c, i) for c in configs for r in range(rounds) for i in (plain if r % 2 == 0 else plain[::-1])]
    return jobs + [(c, "flex") for c in configs if "flex" in impls for _ in range(rounds)]


def merge_rounds(rows: list[dict]) -> list[dict]:
    """One row per (implementation, config, pass) out of --rounds repeats: the median time of the rounds that ran
    (ms_rounds lists them all), or, where a round did not run ok, that round's row (its status and reason)."""
    groups: dict = {}
    for r in rows:
        key = tuple(r[k] for k in ("impl", "pass", *Config.__dataclass_fields__))
        groups.setdefault(key, []).append(r)
    merged = []
    for group in groups.values():
        bad = [r for r in group if r["status"] != "ok"]
        row = dict(bad[0] if bad else group[0])
        times = [r["ms"] for r in group if r["status"] == "ok"]
        if times:
            row["ms_rounds"] = times
        # (--clocks) each round's clock, power, memory clock, temperature and throttle reasons, beside its time
        for key in ("sm_mhz", "power_w", "mem_mhz", "temp_c", "throttle", "clock_samples"):
            if any(key in r for r in group):
                row[key + "_rounds"] = [r.get(key) for r in group if r["status"] == "ok"]
                row.pop(key, None)
        if not bad:
            row["ms"] = statistics.median(times)
            row["tflops"] = row["flops"] / (row["ms"] * 1e-3) / 1e12
        merged.append(row)
    return merged


def fmt_rate(r, unit):
    if r is None:
        return "-"
    if r["status"] != "ok":
        return {"n/a": "n/a", "oom": "oom", "error": "err", "skipped": "skip"}.get(r["status"], r["status"])
    val = r["tflops"] * (1000 if unit == "GFLOP/s" else 1)
    bad = r.get("check", {}).get("ok") is False
    return (f"{val:.0f}" if val >= 100 else f"{val:.1f}" if val >= 1 else f"{val:.3f}") + ("!" if bad else "")


def print_table(rows, impls, unit, file=sys.stdout):
    keys = ["dtype", "headdim", "seqlen", "causal", "mask", "pass"]
    by_key = {}
    for r in rows:
        by_key.setdefault(tuple(r[k] for k in keys), {})[r["impl"]] = r
    peers = [i for i in impls if i != "fa2"]
    ratio_cols = [f"fa2/{p}" for p in peers] if "fa2" in impls else []
    head = ["dtype", "D", "S", "causal", "mask", "pass"] + list(impls) + ratio_cols
    lines = []
    order = {p: i for i, p in enumerate(PASSES)}
    # mask "none" (the paper's grid) last: the end of the output is what a remote run shows first
    for key in sorted(by_key, key=lambda t: (t[4] == "none", t[4], t[0], t[1], t[3], order[t[5]], t[2])):
        cells = by_key[key]
        dtype, D, S, causal, mask, pass_ = key
        line = [dtype, str(D), f"{S // 1024}k" if S >= 1024 and S % 1024 == 0 else str(S), "yes" if causal else "no",
                mask, pass_] + [fmt_rate(cells.get(i), unit) for i in impls]
        fa = cells.get("fa2")
        for p in peers if ratio_cols else []:
            pr = cells.get(p)
            ok = fa and pr and fa["status"] == "ok" and pr["status"] == "ok"
            line.append(f"{fa['tflops'] / pr['tflops']:.2f}x" if ok else "-")
        lines.append(line)
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(head)]
    print(f"\n{unit} (median; '!' = output/gradient check failed; fa2/peer > 1 means fa2 is faster)", file=file)
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)), file=file)
    for l in lines:
        print("  ".join(c.rjust(w) for c, w in zip(l, widths)), file=file)


def print_failures(rows, file=sys.stdout):
    seen = {}
    for r in rows:
        if r["status"] not in ("ok", "skipped"):
            seen.setdefault((r["impl"], r["status"], r.get("reason", "")), 0)
            seen[(r["impl"], r["status"], r.get("reason", ""))] += 1
    bad = [r for r in rows if r["status"] == "ok" and r.get("check", {}).get("ok") is False]
    if seen:
        print("\nnot measured (impl, status, count, reason):", file=file)
        for (impl, status, reason), n in sorted(seen.items())[:30]:
            print(f"  {impl:10s} {status:5s} x{n:<3d} {reason[:160]}", file=file)
    for r in bad[:10]:
        print(f"  CHECK FAILED {r['impl']} {r['dtype']} D={r['headdim']} S={r['seqlen']} causal={r['causal']} "
              f"mask={r['mask']}: {r['check']}", file=file)
    skipped = sum(r["status"] == "skipped" for r in rows)
    if skipped:
        print(f"  {skipped} measurements skipped (time budget)", file=file)


def print_memory(rows, file=sys.stdout):
    if not rows:
        return
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    seqlens = sorted({r["seqlen"] for r in rows})
    cell = {(r["impl"], r["seqlen"]): r for r in rows}
    print("\npeak memory of one fwd+bwd call above its inputs, MiB (batch 1, "
          f"H={rows[0]['nheads']}, D={rows[0]['headdim']}, {rows[0]['dtype']})", file=file)
    print("  ".join(["S".rjust(6)] + [i.rjust(10) for i in impls]), file=file)
    for S in seqlens:
        cells = []
        for i in impls:
            r = cell.get((i, S))
            if r is None:
                cells.append("-")
            elif r["status"] == "ok":
                cells.append("?" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.0f}")
            else:
                cells.append(r["status"])
        print("  ".join([str(S).rjust(6)] + [c.rjust(10) for c in cells]), file=file)


# ---- main -------------------------------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="small grid (GPU: ~1 minute; CPU: tiny sizes)")
    p.add_argument("--dims", help="head dims, e.g. 64,128,256")
    p.add_argument("--seqlens", help="e.g. 512,1k,2k (k = 1024)")
    p.add_argument("--dtypes", help="bf16,fp16 (CPU also fp32,fp64)")
    p.add_argument("--causal", choices=("both", "yes", "no"))
    p.add_argument("--masks", help="none,padding,full (masks run non-causal)")
    p.add_argument("--pass", dest="passes", help="fwd,bwd,fwdbwd")
    p.add_argument("--impls", help=",".join(IMPLS))
    p.add_argument("--tokens", type=int, help="tokens per batch: batch = tokens // seqlen (default 16384)")
    p.add_argument("--hidden", type=int, help="model width: nheads = hidden // D (default 2048)")
    p.add_argument("--full-bias-max-seqlen", type=int, help="largest seqlen of the (B,H,S,S) bias variant")
    p.add_argument("--mem-seqlens", help="memory section seqlens ('' to skip it)")
    p.add_argument("--mem-impls", help="memory section implementations")
    p.add_argument("--mem-heads", type=int)
    p.add_argument("--mem-dim", type=int)
    p.add_argument("--warmup-ms", type=float)
    p.add_argument("--rep-ms", type=float)
    p.add_argument("--rounds", type=int,
                   help="time each config's implementations this many times back to back, the order reversed every "
                        "other round (a, b, c, c, b, a, ...), and report the median round: one cell's peers then "
                        "share the GPU's state (clock, temperature) and a single noisy call counts less (default: 2 on "
                        "a GPU, 1 on the CPU)")
    p.add_argument("--cooldown", type=float,
                   help="seconds the GPU idles before each timed measurement. Without it a kernel's burst is timed in "
                        "whatever state the one before left the GPU in: on the H200 a kernel run right after a slow "
                        "one (torch-fa2) ran faster than after a fast one, by a median 2-3%% and up to 9%% (forward "
                        "bursts of 20 ms, S >= 2k: attention_h200-20261201e.json's rounds). Default: 0.1 on a GPU, "
                        "0 on the CPU")
    p.add_argument("--interleave", action="store_true",
                   help="time a config's implementations together, their calls interleaved in one burst (a b a b "
                        "..., each after an L2 flush) instead of one burst each: peers then share the GPU's state, "
                        "which on the H200 moves single bursts by up to ~10%% (benchmarks/placement.py). With "
                        "--rounds, one such burst per round (flex is still timed on its own)")
    p.add_argument("--clocks", action="store_true",
                   help="sample the SM clock and power with nvidia-smi every 25 ms in the background and record each "
                        "measurement's median (sm_mhz, power_w; with --rounds, sm_mhz_rounds / power_w_rounds beside "
                        "ms_rounds): tells a round run at the boost clock from one run at the power cap")
    p.add_argument("--time-budget", type=float, default=0,
                   help="seconds; once spent, the remaining measurements are recorded as skipped (0 = no limit)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--tag", help="name part of the output files (default: <gpu or cpu>-<date>[-quick])")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--from-json", metavar="FILE", help="print the tables of a saved run and exit")
    args = p.parse_args(argv)

    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        print_failures(saved["measurements"])
        print_memory(saved["memory"])
        print_table(saved["measurements"], saved["grid"]["impls"],
                    "TFLOP/s" if saved["env"].get("gpu") else "GFLOP/s")
        return saved

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False (use --device cpu)")
    device = torch.device(args.device)
    prof = PROFILES[(device.type, args.quick)]
    for key, val in prof.items():
        if getattr(args, key, None) is None:
            setattr(args, key, val)

    dims = [int(x) for x in csv(args.dims)]
    seqlens = [parse_size(x) for x in csv(args.seqlens)]
    dtypes = csv(args.dtypes)
    passes = csv(args.passes)
    masks = csv(args.masks)
    impls = csv(args.impls)
    for name, vals, allowed in (("dtypes", dtypes, DTYPES), ("pass", passes, PASSES), ("masks", masks, MASKS),
                                ("impls", impls, IMPLS)):
        bad = [x for x in vals if x not in allowed]
        if bad:
            p.error(f"--{name}: unknown {bad}; choose from {list(allowed)}")
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]

    # Many shapes through one compiled flex_attention: lift Dynamo's per-function recompile limit.
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 4096)
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 8192)

    fa2_mod, fa2_err = import_fa2()
    env = environment(device, fa2_mod, fa2_err)
    if "fa4" in impls or "fa4" in csv(args.mem_impls):
        fa4, fa4_err = import_fa4(device)
        env["fa4"] = fa4_version() if fa4 is not None else {"error": fa4_err}
        if fa4 is None:  # (each of its rows says so too, status n/a)
            print(f"fa4: not measured: {fa4_err}", flush=True)
    gpu_short = (env.get("gpu", "").replace("NVIDIA", "").strip().split() or ["gpu"])[0].lower() \
        if device.type == "cuda" else "cpu"
    tag = args.tag or f"{gpu_short}-{datetime.date.today():%Y%m%d}" + ("-quick" if args.quick else "")
    unit = "TFLOP/s" if device.type == "cuda" else "GFLOP/s"
    print(f"fa2 attention benchmark on {env.get('gpu') or env.get('cpu')}: torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, triton {env.get('triton')}, fa2 {env['fa2'].get('version', fa2_err)}",
          flush=True)

    # Configs: masks other than none run non-causal; the full (B,H,S,S) bias only up to a moderate seqlen.
    configs = []
    for mask in masks:
        for dtype in dtypes:
            for D in dims:
                for causal in causals:
                    if mask != "none" and causal:
                        continue
                    for S in seqlens:
                        if mask == "full" and S > args.full_bias_max_seqlen:
                            continue
                        configs.append(Config(dtype, D, S, max(1, args.tokens // S), max(1, args.hidden // D),
                                              causal, mask))
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    jobs = ordered_jobs(configs, impls, args.rounds, args.interleave)

    t_start = time.monotonic()
    deadline = t_start + args.time_budget if args.time_budget > 0 else math.inf
    mem_seqlens = [parse_size(x) for x in csv(args.mem_seqlens)]
    mem_rows = []
    if mem_seqlens:
        mem_rows = run_memory(csv(args.mem_impls), mem_seqlens, args.mem_heads, args.mem_dim, dtypes[0], fa2_mod,
                              device)

    try:
        from tqdm import tqdm
        bar = tqdm(total=len(impls) * args.rounds * len(configs) * len(passes), unit="meas",
                   disable=args.no_progress, file=sys.stderr,
                   mininterval=1 if sys.stderr.isatty() else 30, dynamic_ncols=True)
    except ImportError:
        bar = None
    rows = []
    sampler = None
    if args.clocks:
        if device.type != "cuda":
            p.error("--clocks samples a GPU's clock (--device cuda)")
        sampler = ClockSampler(gpu=nvidia_smi_id(device))
    try:
        for cfg, job in jobs:
            group = list(job) if isinstance(job, tuple) else [job]
            if bar is not None:
                bar.set_description(f"{'+'.join(group)} {cfg.dtype} D{cfg.headdim} S{cfg.seqlen}"
                                    f"{' causal' if cfg.causal else ''} {cfg.mask}", refresh=False)
            if time.monotonic() > deadline:
                rows += [dict(impl=impl, **asdict(cfg), **{"pass": p_}, status="skipped", reason="time budget")
                         for impl in group for p_ in passes]
            else:
                got = run_jobs(cfg, group, passes, fa2_mod, device, args.warmup_ms, args.rep_ms, args.cooldown)
                rows += got
                if job == "flex" and any(r["status"] != "ok" or "error" in r.get("check", {}) for r in got):
                    reset_flex()
            if bar is not None:
                bar.update(len(group) * len(passes))
    except KeyboardInterrupt:
        print("\ninterrupted: writing what was measured", file=sys.stderr)
    finally:
        if bar is not None:
            bar.close()
        if sampler is not None:
            sampler.stop()  # (whatever ended the loop: no nvidia-smi left running)

    for r in rows:
        window = r.pop("window", None)
        if sampler is not None and window and len(window) == 2:
            r.update(sampler.during(*window))
    if args.rounds > 1:
        rows = merge_rounds(rows)
    env["elapsed_s"] = round(time.monotonic() - t_start, 1)
    result = {"kind": "attention", "tag": tag, "env": env, "unit_note": "tflops = flops / seconds / 1e12",
              "flops": "fwd = 4*B*H*Sq*Sk*D (/2 causal); bwd = 2.5*fwd; fwdbwd = 3.5*fwd",
              "timing": ("triton.testing.do_bench median" if device.type == "cuda" and _do_bench else
                         "CUDA events median" if device.type == "cuda" else "time.perf_counter median")
              + f", warmup {args.warmup_ms} ms, rep {args.rep_ms} ms"
              + (f"; {args.cooldown} s idle before each" if args.cooldown > 0 else "")
              + ("; with --interleave a config's implementations interleaved call by call in one burst instead (CUDA "
                 "events around each call after an L2 flush, the same number of calls each; rows with interleaved_with)"
                 if args.interleave and device.type == "cuda" else "")
              + (f"; median of {args.rounds} rounds" + ("" if args.interleave else
                                                        ", implementations in alternating order") + " (ms_rounds)"
                 if args.rounds > 1 else ""),
              "grid": dict(dims=dims, seqlens=seqlens, dtypes=dtypes, causal=args.causal, masks=masks, passes=passes,
                           impls=impls, tokens=args.tokens, hidden=args.hidden,
                           full_bias_max_seqlen=args.full_bias_max_seqlen),
              "measurements": rows, "memory": mem_rows}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"attention_{tag}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)

    pngs = []
    if not args.no_plot:
        try:
            sys.path.insert(0, HERE)
            import plot
            pngs = plot.plot_all(result, args.out)
        except Exception as e:  # plotting never loses the measurements
            print(f"plotting failed: {type(e).__name__}: {e}", file=sys.stderr)
    print_failures(rows)
    print_memory(mem_rows)
    print_table(rows, impls, unit)
    print(f"\nwrote {path}" + "".join(f"\nwrote {x}" for x in pngs) + f"\n({env['elapsed_s']} s)")
    return result


if __name__ == "__main__":
    main()
