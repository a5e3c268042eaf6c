#!/usr/bin/env python
"""Varlen (packed) attention benchmark: fa2.varlen_attention against its peers on the same packed batches, one run.

Batches (``--mixes``; each seeded, filling exactly ``--tokens`` tokens, the last sequence cut to fit):
  loguniform  lengths log-uniform in [--min-len, --max-len] (64..8k)
  uniform     lengths uniform in [--min-len, --max-len] (as scripts/dev/varlen_gpu_check.py --bench-mixed)
  longtail    a document mix: Pareto lengths (alpha 1, from --min-len, capped at --max-len): most documents short,
              most tokens in the long ones
  equal       every sequence --equal-len long
Heads: nheads = --hidden // D; --gqa r gives nheads_k = nheads // r. bf16 on a GPU (fp32 on the CPU).

Implementations (``--impls``), all on the same packed q, k, v (total, heads, D):
  fa2      fa2.varlen_attention(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=)
  fa4      FlashAttention-4: flash_attn.cute.flash_attn_varlen_func(q, k, v, cu_seqlens_q=, cu_seqlens_k=,
           max_seqlen_q=, max_seqlen_k=, causal=) -> (out, lse) (CuTe DSL; compiles on its first call, which is the
           check below, outside the timing). n/a with the reason where flash_attn.cute is not importable
           (bench_attention.import_fa4: the GPU machine installs it from the carried wheels, .fa4/install.sh)
  torch    PyTorch's varlen API, torch.nn.attention.varlen.varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k)
           (aten._flash_attention_forward with cum_seq: PyTorch's own FA-2 kernels); causal as is_causal=True or,
           where the signature has no is_causal (torch 2.13), window_size=(-1, 0); GQA with enable_gqa=True where the
           signature has it (2.13), else the fewer KV heads as they are. n/a where torch has no
           torch.nn.attention.varlen, and on the CPU (no CPU kernel)
  cudnn    cuDNN through SDPA on nested tensors: F.scaled_dot_product_attention on
           torch.nested.nested_tensor_from_jagged views of the packed tensors (jagged layout, offsets = cu_seqlens,
           min / max seqlen given so that no call syncs), transposed to (B, H, j, D), pinned to
           SDPBackend.CUDNN_ATTENTION; n/a with SDPA's reasons where cuDNN does not take the call
  padded   the baseline: fa2.attention over the batch padded to the longest sequence, (B, max_seqlen, H, D), with a
           key-row padding mask (bool (B, 1, 1, max_seqlen), True = keep). Only the attention call is timed (the
           inputs are padded once, outside): the most favourable case for padding
Passes: fwd (the forward on inputs that require grad) and fwdbwd (forward + backward, bench_common.pass_closure).

FLOPs: the useful work of the real lengths, sum over sequences of the FA-2 paper's count (bench_common.
attention_flops): forward 4 * L^2 * H * D per sequence of length L (halved when causal), fwd+bwd 3.5 x that. The
padded call is credited with the same useful FLOPs (what it computes on padding is waste).

Timing: on a GPU all implementations of a batch are timed together, their calls interleaved call by call, each after
an L2 flush (bench_attention.time_interleaved); on the CPU one after the other (bench_attention.time_ms). Once
--time-budget seconds are spent (GPU: 170 with --quick, 540 without) the configs left are recorded as skipped, so that
a run under a 10-minute limit still writes its JSON.

Checks, in the same run, on the same inputs and output gradient: every implementation's output (and for fwdbwd its
dq, dk, dv) against fa2's over the whole batch (max |x - fa2|, recorded in check.vs_fa2), and against fp32 math
(fa2.reference.attention_ref) on two sequences (the longest and the last), the first KV head and its query heads
(relative error; check.ok against bench_attention.TOLERANCE). A failure is recorded with its reason; the run goes on.

Usage:
  python benchmarks/bench_varlen.py --quick --out $OUT --tag h100-quick   # < 4 minutes on an H100
  python benchmarks/bench_varlen.py                                        # every mix, 16k and 64k tokens, D 64-256
  python benchmarks/bench_varlen.py --mixes loguniform --dims 128 --gqa 1,4 --impls fa2,fa4,padded
  python benchmarks/bench_varlen.py --device cpu --quick                   # CPU smoke test (fa2 and padded)
Writes <out>/varlen_peers_<tag>.json and <out>/varlen_peers_<tag>.png (plot.plot_varlen_peers; --replot FILE redraws
a saved JSON).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import inspect
import itertools
import json
import math
import os
import sys
import time
import warnings
import zlib
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from bench_attention import (DTYPES, TOLERANCE, csv, fa4_version, import_fa4, parse_size, rel_err, short,
                             time_interleaved, time_ms)
from bench_common import attention_flops, environment, import_fa2, is_oom, pass_closure, short_error, sync

HERE = os.path.dirname(os.path.abspath(__file__))
IMPLS = ("fa2", "fa4", "torch", "cudnn", "padded")
MIXES = ("loguniform", "uniform", "longtail", "equal")
PASSES = ("fwd", "fwdbwd")
REF_MAX_LEN = 4096  # the longest sequence checked against fp32 math

PROFILES = {
    ("cuda", False): dict(mixes="loguniform,uniform,longtail,equal", tokens="16k,64k", dims="64,128,256",
                          causal="both", gqa="1", passes="fwd,fwdbwd", impls="fa2,fa4,torch,cudnn,padded",
                          hidden=2048, min_len=64, max_len=8192, equal_len=2048, dtype="bf16", warmup_ms=50,
                          rep_ms=500, time_budget=540),
    ("cuda", True): dict(mixes="loguniform,equal", tokens="16k", dims="64,128", causal="both", gqa="1",
                         passes="fwd,fwdbwd", impls="fa2,fa4,torch,cudnn,padded", hidden=2048, min_len=64,
                         max_len=8192, equal_len=2048, dtype="bf16", warmup_ms=50, rep_ms=500, time_budget=170),
    ("cpu", False): dict(mixes="loguniform,longtail,equal", tokens="1k", dims="32,64", causal="both", gqa="1,2",
                         passes="fwd,fwdbwd", impls="fa2,padded", hidden=128, min_len=8, max_len=256, equal_len=128,
                         dtype="fp32", warmup_ms=20, rep_ms=100, time_budget=0),
    # the GPU quick run's code paths with tiny sizes (tests/test_benchmarks.py runs it)
    ("cpu", True): dict(mixes="loguniform,equal", tokens="192", dims="32", causal="both", gqa="1",
                        passes="fwd,fwdbwd", impls="fa2,padded", hidden=64, min_len=4, max_len=64, equal_len=48,
                        dtype="fp32", warmup_ms=1, rep_ms=5, time_budget=0),
}


# ---- batches ---------------------------------------------------------------------------------------------------

def draw_lengths(mix: str, tokens: int, min_len: int, max_len: int, equal_len: int) -> list[int]:
    """Sequence lengths filling exactly `tokens` (the last one cut to fit), seeded by (mix, tokens)."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{mix}/{tokens}".encode()))
    lengths = []
    while sum(lengths) < tokens:
        u = float(torch.rand((), generator=gen))
        if mix == "loguniform":
            n = math.exp(math.log(min_len) + u * (math.log(max_len + 1) - math.log(min_len)))
        elif mix == "uniform":
            n = min_len + u * (max_len + 1 - min_len)
        elif mix == "longtail":
            n = min(max_len, min_len / max(1.0 - u, 1e-9))  # Pareto, alpha 1
        elif mix == "equal":
            n = equal_len
        else:
            raise ValueError(f"--mixes: unknown {mix!r}; choose from {list(MIXES)}")
        lengths.append(min(int(n), tokens - sum(lengths)))
    return lengths


@dataclass(frozen=True)
class Config:
    mix: str
    tokens: int
    dtype: str
    headdim: int
    nheads: int
    nheads_k: int
    causal: bool


def useful_flops(lengths: list[int], cfg: Config, pass_: str) -> float:
    """The FA-2 paper's count summed over the real sequences (bench_common.attention_flops per sequence)."""
    return sum(attention_flops(1, cfg.nheads, n, n, cfg.headdim, cfg.causal, pass_) for n in lengths)


class Batch:
    """One config's packed inputs: q (total, H, D), k / v (total, Hk, D) leaves that require grad, cu_seqlens (int32,
    offsets64 int64 for nested tensors), max_seqlen, dout (total, H, D); the padded copies are made on demand."""

    def __init__(self, cfg: Config, lengths: list[int], device):
        gen = torch.Generator(device=device).manual_seed(zlib.crc32(repr(cfg).encode()))  # (seeded by the config)
        dt, total = DTYPES[cfg.dtype], sum(lengths)
        self.cfg, self.lengths, self.device = cfg, lengths, device
        self.q, self.k, self.v = (torch.randn(total, h, cfg.headdim, generator=gen, device=device, dtype=dt)
                                  .requires_grad_() for h in (cfg.nheads, cfg.nheads_k, cfg.nheads_k))
        self.dout = torch.randn(total, cfg.nheads, cfg.headdim, generator=gen, device=device, dtype=dt)
        starts = [0] + list(itertools.accumulate(lengths))
        self.starts = starts
        self.cu_seqlens = torch.tensor(starts, dtype=torch.int32, device=device)
        self.offsets64 = self.cu_seqlens.long()
        self.max_seqlen = max(lengths)

    def rows_in_padded(self) -> torch.Tensor:
        """Index of each packed row in the padded batch flattened to (B * max_seqlen, ...)."""
        return torch.cat([b * self.max_seqlen + torch.arange(n, device=self.device)
                          for b, n in enumerate(self.lengths)])

    def padded(self):
        """Padded leaves (B, max_seqlen, heads, D) (zeros past each length), the key-row mask (B, 1, 1, max_seqlen)
        (True = keep), the padded dout, and the function taking a padded tensor back to the packed rows."""
        rows, B, S = self.rows_in_padded(), len(self.lengths), self.max_seqlen

        def pad(t):
            out = t.new_zeros(B * S, *t.shape[1:])
            out[rows] = t.detach()
            return out.view(B, S, *t.shape[1:])
        keep = torch.zeros(B * S, dtype=torch.bool, device=self.device)
        keep[rows] = True
        leaves = tuple(pad(t).requires_grad_() for t in (self.q, self.k, self.v))
        return leaves, keep.view(B, 1, 1, S), pad(self.dout), lambda t: t.reshape(B * S, *t.shape[2:])[rows]


# ---- implementations -------------------------------------------------------------------------------------------

def torch_varlen_call(batch: Batch):
    """PyTorch's varlen_attn with this torch's spelling of causal and GQA (its signature changed across releases)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as e:
        raise RuntimeError(f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn ({e})") from None
    params, cfg, kw = inspect.signature(varlen_attn).parameters, batch.cfg, {}
    if cfg.causal:
        if "is_causal" in params:
            kw["is_causal"] = True
        elif "window_size" in params:
            kw["window_size"] = (-1, 0)  # (torch 2.13: causal is this window)
        else:
            raise RuntimeError(f"torch {torch.__version__}'s varlen_attn has neither is_causal nor window_size")
    if cfg.nheads_k != cfg.nheads and "enable_gqa" in params:
        kw["enable_gqa"] = True  # (a signature without it passes fewer KV heads as they are: its FA-2 kernels take
        # them; the check against fa2 says whether the answer is right)
    cu, m = batch.cu_seqlens, batch.max_seqlen
    return lambda q, k, v: varlen_attn(q, k, v, cu, cu, m, m, **kw)


def cudnn_nested_call(batch: Batch, backend: str = "CUDNN_ATTENTION"):
    """SDPA on jagged nested tensors (views of the packed tensors) pinned to one SDPA backend; returns the packed
    output. (backend: tests run the same views through MATH on the CPU.)"""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    cfg, lo, hi = batch.cfg, min(batch.lengths), batch.max_seqlen

    def nested(t):  # (total, h, D) -> (B, h, j, D)
        return torch.nested.nested_tensor_from_jagged(t, batch.offsets64, min_seqlen=lo, max_seqlen=hi).transpose(1, 2)

    def f(q, k, v):
        with sdpa_kernel([getattr(SDPBackend, backend)]):
            out = F.scaled_dot_product_attention(nested(q), nested(k), nested(v), is_causal=cfg.causal,
                                                 enable_gqa=cfg.nheads_k != cfg.nheads)
        return out.transpose(1, 2).values()
    return f


def make_call(impl: str, batch: Batch, fa2_mod):
    """(run, leaves, dout, to_packed): run() computes impl's output from the leaves; to_packed takes that output (or
    a gradient of a leaf) to the packed rows (total, heads, D)."""
    cfg, cu, m = batch.cfg, batch.cu_seqlens, batch.max_seqlen
    packed = (batch.q, batch.k, batch.v)
    if impl == "padded":
        leaves, keep, dout, to_packed = batch.padded()
        return lambda: fa2_mod.attention(*leaves, attn_bias=keep, causal=cfg.causal), leaves, dout, to_packed
    if impl == "fa2":
        if fa2_mod is None:
            raise RuntimeError(import_fa2()[1])
        f = lambda q, k, v: fa2_mod.varlen_attention(q, k, v, cu, cu, m, m, causal=cfg.causal)  # noqa: E731
    elif impl == "fa4":
        f = fa4_varlen_call(batch)
    elif impl == "torch":
        f = torch_varlen_call(batch)
    elif impl == "cudnn":
        f = cudnn_nested_call(batch)
    else:
        raise ValueError(f"--impls: unknown {impl!r}; choose from {list(IMPLS)}")
    return (lambda: f(*packed)), packed, batch.dout, (lambda t: t)


def fa4_varlen_call(batch: Batch):
    fa4, why = import_fa4(batch.device)  # (the same availability check and reason as the dense grid's fa4)
    if fa4 is None:
        raise RuntimeError(why)
    from flash_attn.cute import flash_attn_varlen_func
    cu, m, causal = batch.cu_seqlens, batch.max_seqlen, batch.cfg.causal
    return lambda q, k, v: flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=m,
                                                  max_seqlen_k=m, causal=causal)[0]


# ---- checks ----------------------------------------------------------------------------------------------------

def reference_slices(batch: Batch) -> list[tuple]:
    """fp32 math (fa2.reference.attention_ref) on two sequences, the longest up to REF_MAX_LEN (else the shortest)
    and the last, KV head 0 and its query heads: (start, end, query heads, out, (dq, dk, dv)) for the batch's dout.
    (The cap keeps the fp32 scores of a GQA group's heads to a few GB.)"""
    from fa2.reference import attention_ref
    group, lengths = batch.cfg.nheads // batch.cfg.nheads_k, batch.lengths
    fits = [b for b, n in enumerate(lengths) if n <= REF_MAX_LEN]
    longest = max(fits, key=lengths.__getitem__) if fits else min(range(len(lengths)), key=lengths.__getitem__)
    got = []
    for b in dict.fromkeys((longest, len(lengths) - 1) if lengths[-1] <= REF_MAX_LEN else (longest,)):
        s, e = batch.starts[b], batch.starts[b + 1]
        q, k, v = (t.detach()[s:e, :h].float().requires_grad_() for t, h in ((batch.q, group), (batch.k, 1),
                                                                              (batch.v, 1)))
        out = attention_ref(q[None], k[None], v[None], causal=batch.cfg.causal)[0]
        grads = torch.autograd.grad(out, (q, k, v), batch.dout[s:e, :group].float())
        got.append((s, e, group, out.detach(), grads))
    return got


def check_against(refs, fa2_sample, out, grads, dtype) -> dict:
    """Relative error against the fp32 slices (where they were computed), max |x - fa2| over the batch (where fa2's
    sample is there)."""
    check = {}
    if refs:
        check["out_rel_err"] = max(rel_err(out[s:e, :g], r) for s, e, g, r, _ in refs)
        if grads is not None:
            check["grad_rel_err"] = max(rel_err(x[s:e, :h], r) for s, e, g, _, rg in refs
                                        for x, h, r in zip(grads, (g, 1, 1), rg))
        errs = [check[k] for k in ("out_rel_err", "grad_rel_err") if k in check]
        check.update(ok=all(x <= TOLERANCE[dtype] for x in errs), tol=TOLERANCE[dtype])  # (NaN: not ok)
    if fa2_sample is not None:
        diff = {"out_max_abs": float((out.float() - fa2_sample[0].float()).abs().max())}
        if grads is not None and fa2_sample[1] is not None:
            diff["grad_max_abs"] = max(float((x.float() - y.float()).abs().max())
                                       for x, y in zip(grads, fa2_sample[1]))
        check["vs_fa2"] = diff
    return check


def failure_reason(e: BaseException, caught) -> str:
    """The error and the first line of each warning raised with it (SDPA says there why no backend took the call),
    but nested tensors' 'prototype' notice."""
    notes = dict.fromkeys(str(w.message).strip().splitlines()[0] for w in caught
                          if str(w.message).strip() and "prototype" not in str(w.message))
    return " | ".join([short_error(e), *notes])[:600]


def prepare(impl: str, batch: Batch, fa2_mod, refs, fa2_sample, passes):
    """impl's first call (a JIT's compile: FA-4's, cuDNN's graph), its output and gradients checked. Returns
    ((run, leaves, dout), check, sample) or the "status|reason" of a first call that failed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run, leaves, dout, to_packed = make_call(impl, batch, fa2_mod)
            t0 = time.perf_counter()
            out = run()
            grads = torch.autograd.grad(out, leaves, dout) if "fwdbwd" in passes else None
            sync(batch.device)
            first_call_s = time.perf_counter() - t0
        except Exception as e:
            return f"{'oom' if is_oom(e) else 'n/a'}|{failure_reason(e, caught)}"
    sample = (to_packed(out).detach(), None if grads is None else [to_packed(g) for g in grads])
    check = check_against(refs, fa2_sample, *sample, DTYPES[batch.cfg.dtype])
    check["first_call_s"] = round(first_call_s, 3)  # (the first forward and backward: a JIT's compile time)
    return (run, leaves, dout), check, sample


# ---- one config: every implementation, every pass --------------------------------------------------------------

def run_config(cfg: Config, lengths: list[int], impls, passes, fa2_mod, device, warmup_ms, rep_ms) -> list[dict]:
    def rec(impl, pass_, status, **kw):
        return dict(impl=impl, **asdict(cfg), sequences=len(lengths), max_seqlen=max(lengths),
                    **{"pass": pass_, "status": status}, **kw)
    try:
        batch = Batch(cfg, lengths, device)
    except Exception as e:
        return [rec(i, p, "oom" if is_oom(e) else "error", reason=f"inputs: {short(e)}") for i in impls for p in passes]
    try:
        refs = reference_slices(batch)
    except Exception as e:  # (the peers are still compared with fa2)
        print(f"  no fp32 reference for {cfg}: {short(e)}", flush=True)
        refs = None
    rows, ready, fa2_sample = [], {}, None
    for impl in sorted(impls, key=lambda i: i != "fa2"):  # (fa2 first: the others compare with its sample)
        got = prepare(impl, batch, fa2_mod, refs, fa2_sample, passes)
        if isinstance(got, str):
            status, reason = got.split("|", 1)
            rows += [rec(impl, p, status, reason=reason) for p in passes]
            continue
        ready[impl] = got[:2]
        fa2_sample = got[2] if impl == "fa2" else fa2_sample
    got = fa2_sample = None  # (the samples' memory, before the timing)
    for pass_ in passes:
        rows += time_pass(ready, pass_, device, warmup_ms, rep_ms, useful_flops(lengths, cfg, pass_),
                          lambda impl, status, **kw: rec(impl, pass_, status, **kw))
    return rows


def time_pass(ready: dict, pass_: str, device, warmup_ms, rep_ms, flops, rec) -> list[dict]:
    """Rows of one pass: the implementations' calls interleaved in one burst on a GPU (each alone where the burst
    failed, so that only the failing one gets the error), one after the other on the CPU."""
    fns = {impl: pass_closure(run, pass_, leaves, dout) for impl, ((run, leaves, dout), _) in ready.items()}
    rows, times = [], None
    if len(fns) > 1 and device.type == "cuda":
        with contextlib.suppress(Exception):
            times = time_interleaved({i: (fn, contextlib.nullcontext) for i, fn in fns.items()}, device, warmup_ms,
                                     rep_ms)
    together = times is not None
    if times is None:
        times = {}
        for impl, fn in fns.items():
            try:
                times[impl] = time_ms(fn, device, warmup_ms, rep_ms)
            except Exception as e:
                rows.append(rec(impl, "oom" if is_oom(e) else "error", reason=short(e), check=ready[impl][1]))
    for impl, ms in times.items():
        extra = {"interleaved_with": [j for j in times if j != impl]} if together else {}
        rows.append(rec(impl, "ok", ms=ms, flops=flops, tflops=flops / (ms * 1e-3) / 1e12, check=ready[impl][1],
                        **extra))
    return rows


# ---- report ----------------------------------------------------------------------------------------------------

def print_table(rows, impls, unit, header=True, file=sys.stdout):
    """One line per (batch, D, heads, causal, pass): each implementation's useful rate ('!' = check failed) and
    fa2's rate over each peer's (> 1: fa2 faster); header=False: the lines only (progress, config by config)."""
    keys = ("mix", "tokens", "headdim", "nheads", "nheads_k", "causal", "pass")
    cells = {}
    for r in rows:
        cells.setdefault(tuple(r[k] for k in keys), {})[r["impl"]] = r
    scale = 1000 if unit == "GFLOP/s" else 1
    peers = [i for i in impls if i != "fa2"]
    if header:
        print(f"\n{unit} of the real lengths; fa2/peer > 1: fa2 faster; '!' = check failed", file=file)
        print(f"{'mix':>10} {'tokens':>6} {'D':>3} {'H/Hk':>6} {'causal':>6} {'pass':>6} " +
              " ".join(f"{i:>7}" for i in impls) + "".join(f" {'fa2/' + p:>11}" for p in peers), file=file)
    for key, by in cells.items():
        def rate(i):
            r = by.get(i)
            if r is None or r["status"] != "ok":
                return "-" if r is None else r["status"]
            return f"{r['tflops'] * scale:.1f}" + ("!" if r["check"].get("ok") is False else "")
        ok = {i: by[i]["tflops"] for i in impls if by.get(i, {}).get("status") == "ok"}
        ratios = [f"{ok['fa2'] / ok[p]:.2f}x" if "fa2" in ok and p in ok else "-" for p in peers]
        mix, tokens, d, h, hk, causal, pass_ = key
        print(f"{mix:>10} {tokens:>6} {d:>3} {f'{h}/{hk}':>6} {str(causal):>6} {pass_:>6} " +
              " ".join(f"{rate(i):>7}" for i in impls) + "".join(f" {x:>11}" for x in ratios), file=file, flush=True)


def print_failures(rows, file=sys.stdout):
    seen = dict.fromkeys((r["impl"], r["status"], r.get("reason", "")) for r in rows if r["status"] != "ok")
    for impl, status, reason in seen:
        print(f"  {impl:7s} {status:7s} {reason[:200]}", file=file)
    for r in rows:
        if r["status"] == "ok" and r["check"].get("ok") is False:
            print(f"  CHECK FAILED {r['impl']} {r['mix']} D={r['headdim']} causal={r['causal']}: {r['check']}",
                  file=file)


# ---- main ------------------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="GPU: < 4 minutes on an H100; CPU: tiny sizes (a smoke test)")
    for name, what in (("mixes", ",".join(MIXES)), ("tokens", "tokens per batch, e.g. 16k,64k"),
                       ("dims", "head dims, e.g. 64,128"), ("gqa", "nheads / nheads_k ratios, e.g. 1,4"),
                       ("passes", ",".join(PASSES)), ("impls", ",".join(IMPLS)), ("dtype", "bf16, fp16 (CPU: fp32)")):
        p.add_argument("--" + name, help=what)
    p.add_argument("--causal", choices=("both", "yes", "no"))
    for name in ("hidden", "min_len", "max_len", "equal_len"):
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=int)
    for name in ("warmup_ms", "rep_ms"):
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=float)
    p.add_argument("--time-budget", dest="time_budget", type=float,
                   help="seconds; the configs left once spent are recorded as skipped, so that a run under a time "
                        "limit still writes its JSON (0: none; default 170 with --quick, 540 without, on a GPU)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--tag", help="name part of the output files (default: <gpu or cpu>-<date>[-quick])")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--replot", metavar="FILE", help="draw the PNG of a saved JSON (next to it) and exit")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False (use --device cpu)")
    for key, val in PROFILES[(args.device, args.quick)].items():
        if getattr(args, key) is None:
            setattr(args, key, val)
    for name, allowed in (("mixes", MIXES), ("passes", PASSES), ("impls", IMPLS), ("dtype", DTYPES)):
        bad = [x for x in csv(getattr(args, name)) if x not in allowed]
        if bad:
            p.error(f"--{name}: unknown {bad}; choose from {list(allowed)}")
    return args


def configs(args) -> list[tuple[Config, list[int]]]:
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    got = []
    for mix, tokens in itertools.product(csv(args.mixes), [parse_size(t) for t in csv(args.tokens)]):
        lengths = draw_lengths(mix, tokens, args.min_len, args.max_len, args.equal_len)
        for d, ratio, causal in itertools.product([int(x) for x in csv(args.dims)], [int(x) for x in csv(args.gqa)],
                                                  causals):
            h = max(1, args.hidden // d)
            got.append((Config(mix, tokens, args.dtype, d, h, max(1, h // ratio), causal), lengths))
    return got


def environment_record(device, fa2_mod, fa2_err, impls) -> dict:
    env = environment(device, fa2_mod, fa2_err)
    if "fa4" in impls:
        fa4, why = import_fa4(device)
        env["fa4"] = fa4_version() if fa4 is not None else {"error": why}
    try:
        from torch.nn.attention.varlen import varlen_attn
        env["torch_varlen_attn"] = str(inspect.signature(varlen_attn))
    except ImportError as e:
        env["torch_varlen_attn"] = {"error": str(e)}
    return env


def save(result: dict, out_dir: str, plot_it: bool) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"varlen_peers_{result['tag']}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    paths = [path]
    if plot_it:
        try:
            sys.path.insert(0, HERE)
            import plot
            paths += plot.plot_varlen_peers(result, out_dir, f"varlen_peers_{result['tag']}")
        except Exception as e:  # plotting never loses the measurements
            print(f"plotting failed: {type(e).__name__}: {e}", file=sys.stderr)
    return paths


def main(argv=None):
    args = parse_args(argv)
    if args.replot:
        sys.path.insert(0, HERE)
        import plot
        with open(args.replot) as f:
            result = json.load(f)
        stem = os.path.splitext(os.path.basename(args.replot))[0]
        print("\n".join(plot.plot_varlen_peers(result, os.path.dirname(os.path.abspath(args.replot)), stem)))
        return result
    device, impls, passes = torch.device(args.device), csv(args.impls), csv(args.passes)
    fa2_mod, fa2_err = import_fa2()
    env = environment_record(device, fa2_mod, fa2_err, impls)
    short_name = (env.get("gpu", "gpu").replace("NVIDIA", "").split() or ["gpu"])[0].lower() \
        if device.type == "cuda" else "cpu"
    tag = args.tag or f"{short_name}-{datetime.date.today():%Y%m%d}" + ("-quick" if args.quick else "")
    unit = "TFLOP/s" if device.type == "cuda" else "GFLOP/s"
    print(f"varlen benchmark on {env.get('gpu') or env.get('cpu')}: torch {torch.__version__}, fa2 "
          f"{env['fa2'].get('version', fa2_err)}, fa4 {env.get('fa4', '-')}", flush=True)
    t_start, rows, batches = time.monotonic(), [], {}
    try:
        for cfg, lengths in configs(args):
            batches[f"{cfg.mix}/{cfg.tokens}"] = lengths
            if args.time_budget and time.monotonic() - t_start > args.time_budget:
                rows += [dict(impl=i, **asdict(cfg), **{"pass": p}, status="skipped", reason="time budget")
                         for i in impls for p in passes]
                continue
            got = run_config(cfg, lengths, impls, passes, fa2_mod, device, args.warmup_ms, args.rep_ms)
            rows += got
            print_table(got, impls, unit, header=len(rows) == len(got))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    except KeyboardInterrupt:
        print("\ninterrupted: writing what was measured", file=sys.stderr)
    env["elapsed_s"] = round(time.monotonic() - t_start, 1)
    result = {"kind": "varlen_peers", "tag": tag, "env": env, "dtype": args.dtype,
              "flops": "sum over sequences of 4*L^2*H*D (/2 causal); fwdbwd = 3.5 x (the real lengths; the padded "
                       "call gets the same useful FLOPs)",
              "timing": ("implementations interleaved call by call, each after an L2 flush (median of CUDA events)"
                         if device.type == "cuda" else "time.perf_counter median, one implementation after the other")
              + f", warmup {args.warmup_ms} ms, rep {args.rep_ms} ms",
              "grid": {k: getattr(args, k) for k in ("mixes", "tokens", "dims", "gqa", "causal", "passes", "impls",
                                                    "hidden", "min_len", "max_len", "equal_len")},
              "batches": batches, "rows": rows}
    paths = save(result, args.out, not args.no_plot)
    print("\nnot measured / failed checks:")
    print_failures(rows)
    print_table(rows, impls, unit)
    print("".join(f"\nwrote {x}" for x in paths) + f"\n({env['elapsed_s']} s)")
    return result


if __name__ == "__main__":
    main()
