#!/usr/bin/env python
"""KV-cache attention (issue 48, "Speed"): decode and chunked prefill, fa2 against its peers side by side in one run.

Decode: seqlen_q 1, bf16, GQA 32/8 (--heads 32,32: MHA), head dims 64 / 128, batch 1..256 x cache 512..128k keys
(K + V above --max-kv-gib are left out), a contiguous cache and paged ones (--paged 0,64: 0 = contiguous, N = blocks
of N keys, shuffled). Every sequence holds the whole cache (cache_seqlens = cache length).
  fa2   fa2.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=..., block_table=..., num_splits=0)
  sdpa  F.scaled_dot_product_attention(..., enable_gqa=True): q (B, H, 1, D) against (B, Hk, N, D) views of the cache;
        torch picks the backend (each row's "backend": the aten op a profiled call dispatched to)
  flex  flex_attention(..., enable_gqa=True) through torch.compile (dynamic=False: one compilation per shape, in its
        first call, outside the timing; its decoding kernel for one query row); eager on the CPU
  fa4   FlashAttention-4, flash_attn.cute.flash_attn_varlen_func(q, k_cache, v_cache, seqused_k=...,
        page_table=..., num_splits=0: its own split heuristic); n/a with the reason where not importable
  SDPA and flex take no block table: on a paged cache their call gathers its blocks into a contiguous copy first
  (k_cache[block_table], timed with the attention: what serving SDPA from a paged cache costs; the contiguous rows
  are their attention alone). Flex's paged attention through a block mask is not measured.
  Bandwidth: bytes of K and V read (2·B·N·Hk·D·2) / time, and as a share of the device's copy bandwidth (a --copy-mib
  copy, read + write / time). The cache stays in L2 between calls: below ~50 MB it is partly read from there.

Chunked prefill: seqlen_q 128..2048 against caches of 4k..64k keys, causal (bottom-right), bf16, D 128, the same heads,
batch --prefill-batch (1):
  fa2-dense           fa2.attention(q, k_cache, v_cache, causal=True): the cache as dense (B, L, Hk, D) keys / values
  fa2-kvcache         fa2.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=L, causal=True): k=None, the
                      chunk's keys already in the cache
  fa2-kvcache-append  the same with k= / v= the chunk's keys, written at cache_seqlens = L - seqlen_q (the values
                      already there, so the cache does not change from call to call)
  fa2-kvcache-paged   fa2-kvcache over the same keys as a paged cache (pages of 64 keys, shuffled; 16 where L is no
                      multiple of 64)
  FLOPs, the unmasked work only (bench_common.attention_flops): 4·B·H·D·P, P = Sq·L − Sq·(Sq − 1)/2 the (query, key)
  pairs the bottom-right causal mask keeps; TFLOP/s = FLOPs / time / 1e12. "vs_dense": TFLOP/s over fa2-dense's.

Time (both sections): the mean of --iters calls replayed from one CUDA graph where the implementation can be
captured (the kernels without the host's per-call cost), else --iters eager calls; each row has "timing" (graph or
eager, with "graph" saying why not), eager_us and graph_us. Checks: every row's output against the section's first
implementation's (fa2 / fa2-dense) on the same inputs (max |diff|), and against fp32 math (fa2.reference.attention_ref)
on the shapes small enough (decode: batch x cache <= 16k keys; prefill: B·Sq·L <= 2M): max |error|, relative error and
"check_ok" (relative error <= bench_attention.TOLERANCE). A failure (OOM, unsupported shape, missing package) is a row
with its status and reason; the run goes on. --time-budget: later shapes are recorded as skipped.

Usage:
  PYTHONPATH=python python benchmarks/bench_decode.py --quick --out DIR --tag T    # GPU, < 4 minutes on an H100
  PYTHONPATH=python python benchmarks/bench_decode.py --out DIR --tag T            # the whole grid (<= ~9 minutes)
  python benchmarks/bench_decode.py --device cpu                                   # smoke test, tiny sizes
Writes <out>/kvcache_<tag>.json (or --json FILE) and, through benchmarks/plot.py, <stem>_decode.png / _prefill.png.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch._dynamo
import torch.nn.functional as F

from bench_attention import TOLERANCE, _flex, csv, fa4_version, import_fa4, parse_size, rel_err, reset_flex
from bench_common import (attention_flops, copy_bandwidth, decode_inputs, environment, graph_time_ms, import_fa2,
                          is_oom, mean_time_ms, short_error)

HERE = os.path.dirname(os.path.abspath(__file__))
DECODE_IMPLS = ("fa2", "sdpa", "flex", "fa4")
PREFILL_IMPLS = ("fa2-dense", "fa2-kvcache", "fa2-kvcache-append", "fa2-kvcache-paged")
DECODE_REF_KEYS = 16384  # batch x cache up to which decode rows are also checked against fp32 math
PREFILL_REF_PAIRS = 1 << 21  # B·Sq·L up to which prefill rows are

PROFILES = {
    ("cuda", False): dict(dims="64,128", batches="1,4,16,64,256", caches="512,2k,8k,32k,128k", paged="0,16,64,256",
                          prefill_q="128,512,2048", prefill_k="4k,16k,64k", iters=20, copy_mib=1024, max_kv_gib=16,
                          time_budget=500),  # (what is left after that is skipped: one 10-minute device call)
    # ~2-3 minutes on an H100, most of it flex's compilations (one per decode shape)
    ("cuda", True): dict(dims="64,128", batches="1,16,256", caches="512,8k,128k", paged="0,64",
                         prefill_q="128,2048", prefill_k="4k,64k", iters=20, copy_mib=1024, max_kv_gib=16,
                         time_budget=170),
    ("cpu", False): dict(dims="64", batches="1,3", caches="64,128", paged="0,16", prefill_q="16", prefill_k="64",
                         iters=2, copy_mib=4, max_kv_gib=1, time_budget=0),
}
PROFILES[("cpu", True)] = PROFILES[("cpu", False)]


class Unavailable(RuntimeError):
    """An implementation that cannot run here (not installed, not on this device): its rows are "n/a"."""


# ---- the timed calls -------------------------------------------------------------------------------------------------

def timed(fn, iters: int, device) -> dict:
    """eager_us, graph_us where fn can be captured in a CUDA graph, and us: the graph's time, else the eager one."""
    got = {"eager_us": 1e3 * mean_time_ms(fn, iters, device), "timing": "eager"}
    if device.type != "cuda":
        got["graph"] = "no CUDA graphs on the CPU"
    else:
        try:
            got["graph_us"] = 1e3 * graph_time_ms(fn, iters)
        except Exception as e:  # (a host sync or an allocation the capture refuses)
            got["graph"] = f"capture failed: {short_error(e)}"
            torch.cuda.synchronize()
    if "graph_us" in got:
        # A replay far faster than eager calls that are not host-bound ran kernels outside the graph: not counted.
        if got["graph_us"] < 0.5 * got["eager_us"] and got["eager_us"] > 1000:
            got["graph"] = "replay implausibly fast (kernels outside the capture?): eager time used"
        else:
            got["timing"] = "graph"
    got["us"] = got["graph_us"] if got["timing"] == "graph" else got["eager_us"]
    return got


def sdpa_backend(fn):
    """fn's output and the aten SDPA op(s) one profiled call of fn dispatched to."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fn()
    ops = sorted({e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product")})
    return out, ",".join(ops) or "unknown"


def import_fa4_varlen(device):
    fa4, why = import_fa4(device)
    if fa4 is None:
        raise Unavailable(why)
    from flash_attn.cute import flash_attn_varlen_func
    return flash_attn_varlen_func


def flex_fn(device):
    if device.type == "cuda":
        return _flex()[0]
    from torch.nn.attention.flex_attention import flex_attention
    return flex_attention  # (compiling on the CPU takes minutes: the smoke test runs it eager)


def contiguous_kv(k_cache, v_cache, kw):
    """(k, v) as (B, N, Hk, D): the caches themselves, or a paged cache's blocks gathered in sequence order."""
    if "block_table" not in kw:
        return k_cache, v_cache
    return tuple(c[kw["block_table"]].flatten(1, 2) for c in (k_cache, v_cache))


def decode_call(impl, q, k_cache, v_cache, lens, kw, fa2_mod, device):
    """A no-argument call of impl on one decode step, returning (B, 1, H, D)."""
    if impl == "fa2":
        return lambda: fa2_mod.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, num_splits=0, **kw)
    if impl == "fa4":
        fa4 = import_fa4_varlen(device)
        return lambda: fa4(q, k_cache, v_cache, seqused_k=lens, page_table=kw.get("block_table"), num_splits=0)[0]
    if impl not in ("sdpa", "flex"):
        raise ValueError(f"unknown decode implementation {impl!r}")
    attend = flex_fn(device) if impl == "flex" else F.scaled_dot_product_attention

    def call():  # (B, Hk, N, D) views of the cache; a paged one gathered first, in the call
        k, v = contiguous_kv(k_cache, v_cache, kw)
        return attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True).transpose(1, 2)
    return call


def paged_cache(k_cache, v_cache, block):
    """The same keys and values as a paged cache: pages of `block` keys in shuffled order, and its block table."""
    batch, cache = k_cache.shape[:2]
    pages = batch * cache // block
    order = torch.randperm(pages, device=k_cache.device)
    paged = []
    for c in (k_cache, v_cache):
        p = torch.empty((pages, block) + tuple(c.shape[2:]), dtype=c.dtype, device=c.device)
        p[order] = c.reshape((pages, block) + tuple(c.shape[2:]))  # (sequence b's page j: page order[b * n + j])
        paged.append(p)
    return paged[0], paged[1], order.view(batch, cache // block).to(torch.int32)


def prefill_calls(q, k_cache, v_cache, fa2_mod) -> dict:
    """fa2's dense forward and its KV-cache call (the chunk's keys already cached, or appended) on one chunk; the
    same over a paged cache (pages of 64 keys, 16 where the cache is no multiple of 64; the chunk's keys cached)."""
    batch, seqlen_q, cache = q.shape[0], q.shape[1], k_cache.shape[1]
    full = torch.full((batch,), cache, dtype=torch.int32, device=q.device)
    before = full - seqlen_q
    k_new, v_new = k_cache[:, cache - seqlen_q:].clone(), v_cache[:, cache - seqlen_q:].clone()
    k_pages, v_pages, table = paged_cache(k_cache, v_cache, 64 if cache % 64 == 0 else 16)
    return {"fa2-dense": lambda: fa2_mod.attention(q, k_cache, v_cache, causal=True),
            "fa2-kvcache": lambda: fa2_mod.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=full,
                                                                  causal=True),
            "fa2-kvcache-append": lambda: fa2_mod.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                                                         cache_seqlens=before, causal=True),
            "fa2-kvcache-paged": lambda: fa2_mod.attention_with_kvcache(q, k_pages, v_pages, cache_seqlens=full,
                                                                        block_table=table, causal=True)}


# ---- one shape: every implementation, timed and checked --------------------------------------------------------------

def first_call(impl, fn, row):
    """The untimed first call (flex compiles, FA-4 JIT-compiles here): its output; row gets its time (and SDPA's
    backend)."""
    start = time.perf_counter()
    if impl == "sdpa":
        out, row["backend"] = sdpa_backend(fn)
    else:
        out = fn()
    if out.device.type == "cuda":
        torch.cuda.synchronize()
    row["first_call_s"] = round(time.perf_counter() - start, 3)
    return out


def measure(impl, make, base, iters, device, rate):
    """One implementation's row and first output (None where it failed). make() -> the call; rate(us) -> the row's
    bandwidth or TFLOP/s."""
    row = dict(base, impl=impl)
    try:
        fn = make()
        out = first_call(impl, fn, row)
        row.update(timed(fn, iters, device))
        row.update(rate(row["us"]), status="ok")
        return row, out
    except Unavailable as e:
        row.update(status="n/a", reason=str(e))
    except Exception as e:  # noqa: BLE001  (every failure becomes a row; the run goes on)
        row.update(status="oom" if is_oom(e) else "error", reason=short_error(e))
        if impl == "flex":
            reset_flex()
    return row, None


def check(rows, outs, ref):
    """Each row's output against the first implementation's (max |diff|) and, where ref is given, fp32 math."""
    baseline = outs.get(rows[0]["impl"])
    for row in rows:
        out = outs.get(row["impl"])
        if out is None:
            continue
        if baseline is not None:
            row.update(baseline=rows[0]["impl"],
                       max_diff_vs_baseline=float((out.float() - baseline.float()).abs().max()))
        if ref is not None:
            err = rel_err(out, ref)
            row.update(max_err_vs_fp32=float((out.float() - ref).abs().max()), rel_err_vs_fp32=err,
                       check_ok=err <= TOLERANCE[out.dtype])


def run_shape(makers, base, iters, device, rate, ref_fn):
    """Rows of every implementation in makers (name -> make) on one shape, checked against each other and ref_fn()."""
    rows, outs = [], {}
    for impl, make in makers.items():
        row, out = measure(impl, make, base, iters, device, rate)
        rows.append(row)
        if out is not None:
            outs[impl] = out
    check(rows, outs, ref_fn() if ref_fn is not None else None)
    return rows


# ---- the two sections ------------------------------------------------------------------------------------------------

def decode_shapes(args):
    """(page, headdim, batch, cache) of the decode grid, K + V at most --max-kv-gib, caches that fill whole blocks."""
    hk = args.nheads_k
    for page in args.paged:
        for d in args.dims:
            for batch in args.batches:
                for n in args.caches:
                    if 4 * batch * n * hk * d <= args.max_kv_gib * 2**30 and (not page or n % page == 0):
                        yield page, d, batch, n


def decode_rows(spec, args, fa2_mod, device, copy_gbps):
    page, d, batch, n = spec
    h, hk = args.nheads, args.nheads_k
    q, k_cache, v_cache, lens, kw = decode_inputs(batch, n, h, hk, d, page, device)
    kv_bytes = 4 * batch * n * hk * d
    base = dict(section="decode", headdim=d, batch=batch, cache=n, page=page, nheads=h, nheads_k=hk,
                kv_bytes=kv_bytes, copy_gbps=copy_gbps)
    makers = {impl: (lambda impl=impl: decode_call(impl, q, k_cache, v_cache, lens, kw, fa2_mod, device))
              for impl in args.impls}

    def rate(us):
        gbps = kv_bytes / us / 1e3
        return dict(gbps=gbps, pct_copy=100 * gbps / copy_gbps)

    ref = None
    if batch * n <= DECODE_REF_KEYS:
        from fa2.reference import attention_ref
        ref = lambda: attention_ref(q, *contiguous_kv(k_cache, v_cache, kw)).float()  # noqa: E731
    return run_shape(makers, base, args.iters, device, rate, ref)


def prefill_shapes(args):
    for seqlen_q in args.prefill_q:
        for cache in args.prefill_k:
            if seqlen_q <= cache:
                yield seqlen_q, cache


def prefill_rows(spec, args, fa2_mod, device):
    seqlen_q, cache = spec
    batch, h, hk, d = args.prefill_batch, args.nheads, args.nheads_k, args.prefill_dim
    q = torch.randn(batch, seqlen_q, h, d, device=device, dtype=torch.bfloat16)
    k_cache, v_cache = (torch.randn(batch, cache, hk, d, device=device, dtype=torch.bfloat16) for _ in range(2))
    flops = attention_flops(batch, h, seqlen_q, cache, d, True, "fwd")
    base = dict(section="prefill", headdim=d, batch=batch, seqlen_q=seqlen_q, cache=cache, nheads=h, nheads_k=hk,
                flops=flops)
    calls = prefill_calls(q, k_cache, v_cache, fa2_mod)
    makers = {impl: (lambda impl=impl: calls[impl]) for impl in PREFILL_IMPLS}
    ref = None
    if batch * seqlen_q * cache <= PREFILL_REF_PAIRS:
        from fa2.reference import attention_ref
        ref = lambda: attention_ref(q, k_cache, v_cache, causal=True).float()  # noqa: E731
    rows = run_shape(makers, base, args.iters, device, lambda us: {"tflops": flops / us / 1e6}, ref)
    dense = rows[0].get("tflops")
    for row in rows[1:]:
        if dense and row.get("tflops"):
            row["vs_dense"] = row["tflops"] / dense
    return rows


def run_section(shapes, rows_of, deadline, describe):
    """Rows of every shape, one printed line per shape; shapes after the deadline are recorded as skipped."""
    rows = []
    for spec in shapes:
        if time.monotonic() > deadline:
            rows.append(dict(describe(spec), status="skipped", reason="time budget"))
            continue
        got = rows_of(spec)
        rows += got
        print(shape_line(got), flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


# ---- output ----------------------------------------------------------------------------------------------------------

def cell(row) -> str:
    if row["status"] != "ok":
        return f"{row['impl']} {row['status']}"
    speed = f"{row['gbps']:.0f} GB/s {row['pct_copy']:.0f}%" if "gbps" in row else f"{row['tflops']:.1f} TFLOP/s"
    flag = "" if row.get("check_ok", True) else " WRONG"
    return f"{row['impl']} {row['us']:.1f} us {speed} ({row['timing'][0]}){flag}"


def shape_line(rows) -> str:
    r = rows[0]
    if r["section"] == "decode":
        head = (f"{'paged ' + str(r['page']) if r['page'] else 'contig':>9} d{r['headdim']:<4}b{r['batch']:<4}"
                f"n{r['cache']:<7}{r['kv_bytes'] / 1e6:>9.1f} MB")
    else:
        head = f"prefill d{r['headdim']} b{r['batch']} q{r['seqlen_q']:<5}n{r['cache']:<6}"
    return head + " | " + " | ".join(cell(x) for x in rows)


def capture_summary(rows) -> dict:
    """Per implementation: on how many of its measured shapes the CUDA-graph replay was timed, and the first reason
    it was not."""
    summary = {}
    for impl in dict.fromkeys(r["impl"] for r in rows if r["status"] == "ok"):
        mine = [r for r in rows if r["impl"] == impl and r["status"] == "ok"]
        graphed = sum(r["timing"] == "graph" for r in mine)
        why = next((r["graph"] for r in mine if r["timing"] != "graph"), None)
        summary[impl] = f"graph replays on {graphed}/{len(mine)} shapes" + (f"; eager where: {why}" if why else "")
    return summary


def write(result, args) -> list[str]:
    """The JSON (and the PNGs unless --no-plot); the paths written."""
    path = args.json or os.path.join(args.out, f"kvcache_{result['tag']}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    written = [path]
    if not args.no_plot:
        try:
            import plot
            stem = os.path.splitext(os.path.basename(path))[0]
            written += plot.plot_all(result, os.path.dirname(os.path.abspath(path)), stem)
        except Exception as e:  # plotting never loses the measurements
            print(f"plotting failed: {short_error(e)}", file=sys.stderr)
    return written


# ---- main ------------------------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="GPU: a smaller grid that fits < 4 minutes on an H100")
    p.add_argument("--dims", help="decode head dims (default 64,128)")
    p.add_argument("--batches", help="decode batch sizes, e.g. 1,16,256")
    p.add_argument("--caches", help="decode cache lengths in keys, e.g. 512,8k,128k (k = 1024)")
    p.add_argument("--paged", help="cache layouts: 0 = contiguous, N = paged, blocks of N keys (e.g. 0,16,64,256)")
    p.add_argument("--heads", default="32,8", help="query heads, kv heads (default 32,8: GQA; 32,32: MHA)")
    p.add_argument("--impls", default=",".join(DECODE_IMPLS), help="decode implementations (fa2 first: the baseline)")
    p.add_argument("--prefill-q", help="chunk lengths (default 128,512,2048; '' skips the prefill section)")
    p.add_argument("--prefill-k", help="cache lengths the chunks attend to (default 4k,16k,64k)")
    p.add_argument("--prefill-batch", type=int, default=1)
    p.add_argument("--prefill-dim", type=int, default=128)
    p.add_argument("--iters", type=int, help="calls per measurement (default 20)")
    p.add_argument("--copy-mib", type=int, help="size of the copy that measures the device's bandwidth (1024)")
    p.add_argument("--max-kv-gib", type=float, help="largest K + V of a decode shape (16)")
    p.add_argument("--time-budget", type=float,
                   help="seconds (0: none; default 500, --quick 170): decode shapes start only within 80%% of it, "
                        "prefill ones within all of it; the rest are recorded as skipped")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--tag", help="name part of the output files (default: <gpu or cpu>-<date>[-quick])")
    p.add_argument("--json", help="write the JSON here instead of <out>/kvcache_<tag>.json")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False (use --device cpu)")
    for key, val in PROFILES[(args.device, args.quick)].items():
        if getattr(args, key, None) is None:
            setattr(args, key, val)
    args.dims, args.batches = [int(x) for x in csv(args.dims)], [int(x) for x in csv(args.batches)]
    args.caches, args.paged = [parse_size(x) for x in csv(args.caches)], [int(x) for x in csv(args.paged)]
    args.prefill_q, args.prefill_k = [parse_size(x) for x in csv(args.prefill_q)], \
        [parse_size(x) for x in csv(args.prefill_k)]
    args.nheads, args.nheads_k = (int(x) for x in csv(args.heads))
    args.impls = csv(args.impls)
    unknown = [x for x in args.impls if x not in DECODE_IMPLS]
    if unknown or args.impls[:1] != ["fa2"]:
        p.error(f"--impls: fa2 first, then any of {list(DECODE_IMPLS[1:])}; got {args.impls}")
    return args


def lift_recompile_limits():
    """Every decode shape is one more compilation of the one compiled flex_attention."""
    for name, value in (("recompile_limit", 4096), ("cache_size_limit", 4096),
                        ("accumulated_recompile_limit", 8192), ("accumulated_cache_size_limit", 8192)):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, value)


def run(args, fa2_mod, device, env) -> dict:
    start = time.monotonic()
    budget = args.time_budget or float("inf")
    copy_gbps = copy_bandwidth(args.copy_mib << 20, device)
    print(f"device copy bandwidth ({args.copy_mib} MiB, read + write): {copy_gbps:.0f} GB/s; "
          f"heads {args.nheads}/{args.nheads_k}, bf16", flush=True)
    decode = run_section(decode_shapes(args), lambda s: decode_rows(s, args, fa2_mod, device, copy_gbps),
                         start + 0.8 * budget, lambda s: dict(section="decode", page=s[0], headdim=s[1], batch=s[2],
                                                              cache=s[3], impl="*"))
    prefill = run_section(prefill_shapes(args), lambda s: prefill_rows(s, args, fa2_mod, device), start + budget,
                          lambda s: dict(section="prefill", seqlen_q=s[0], cache=s[1], impl="*"))
    env["elapsed_s"] = round(time.monotonic() - start, 1)
    gpu = (env.get("gpu", "").replace("NVIDIA", "").strip().split() or ["gpu"])[0].lower()
    tag = args.tag or f"{gpu if device.type == 'cuda' else 'cpu'}-{datetime.date.today():%Y%m%d}" + \
        ("-quick" if args.quick else "")
    return {"kind": "kvcache", "tag": tag, "env": env, "copy_gbps": copy_gbps,
            "graph_capture": capture_summary(decode + prefill),
            "grid": {k: getattr(args, k) for k in ("dims", "batches", "caches", "paged", "nheads", "nheads_k",
                                                   "impls", "prefill_q", "prefill_k", "prefill_batch",
                                                   "prefill_dim", "iters", "copy_mib", "max_kv_gib", "time_budget")},
            "notes": __doc__.split("\n\n")[1:4], "decode": decode, "prefill": prefill}


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    fa2_mod, fa2_err = import_fa2()
    if fa2_mod is None:
        sys.exit(fa2_err)
    lift_recompile_limits()
    torch.manual_seed(0)
    env = environment(device, fa2_mod, fa2_err)
    if "fa4" in args.impls:
        fa4, why = import_fa4(device)
        env["fa4"] = fa4_version() if fa4 is not None else {"error": why}
    print(f"KV-cache benchmark on {env.get('gpu') or env.get('cpu')}: torch {torch.__version__}, "
          f"fa2 {env['fa2'].get('version')}", flush=True)
    with torch.no_grad():
        result = run(args, fa2_mod, device, env)
    for impl, how in result["graph_capture"].items():
        print(f"{impl}: {how}")
    for path in write(result, args):
        print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
