"""GQA / MQA backward on the GPU: fa2 with each group summed in its CTAs (fa2-grouped: bwd_gqa_grouping 1), with one CTA
per query head adding into fp32 accumulators per kv head (fa2-accum: grouping 0, bwd_gqa_accumulate on), with fp32
partials per query head summed by torch afterwards (fa2-partials: grouping 0, accumulate off), with its default choice
(fa2: grouped where the grouped grid fills the GPU, bwd_tile_config.h, else accumulators), beside SDPA's cuDNN and
FlashAttention backends with enable_gqa, in one run. Each cell: batch = tokens / seqlen, nheads query heads, nheads_k kv heads, bf16 (or fp16), causal or not.
Time: the median of --rounds rounds, each the median over --rep-ms of calls (benchmarks/bench_attention.py's
time_ms: CUDA events, L2 flushed where triton's do_bench is there), the impls interleaved within a round, each round
starting at the next impl.
FLOPs (as bench_attention.py): fwd = 4 B H Sq Sk D (/2 causal), bwd = 2.5 fwd, fwdbwd = 3.5 fwd, H the query heads.
Memory: the peak allocated above the inputs during one backward (torch.cuda.max_memory_allocated).
Usage: cd benchmarks && PYTHONPATH=../python python3 gqa_backward.py --out results/gqa_backward_h200-DATE.json
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from bench_attention import parse_size, time_ms
from bench_common import attention_flops, environment, import_fa2, short_error

FA2_MODES = {"fa2": (-1, True), "fa2-grouped": (1, True), "fa2-accum": (0, True), "fa2-partials": (0, False)}


def set_fa2_mode(fa2, impl):
    """fa2.dev's GQA backward options as FA2_MODES[impl] (grouping, accumulate) says."""
    grouping, accumulate = FA2_MODES[impl]
    fa2.dev.set_options(bwd_gqa_grouping=grouping, bwd_gqa_accumulate=accumulate)
SDPA = {"cudnn": "CUDNN_ATTENTION", "torch-fa2": "FLASH_ATTENTION"}


def attention_fn(impl, fa2, causal):
    """f(q, k, v) on (B, S, H, D) tensors for one impl, and the setup to run around it."""
    if impl in FA2_MODES:
        def f(q, k, v):
            return fa2.attention(q, k, v, causal=causal)
        return f
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, SDPA[impl])

    def f(q, k, v):
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=causal, enable_gqa=True)
        return out.transpose(1, 2)
    return f


def run_cell(fa2, impls, dtype, d, s, batch, h, hk, causal, passes, rep_ms, rounds):
    g = torch.Generator(device="cuda").manual_seed(s * 131 + d * 7 + hk)
    q = torch.randn(batch, s, h, d, device="cuda", dtype=dtype, generator=g, requires_grad=True)
    k, v = (torch.randn(batch, s, hk, d, device="cuda", dtype=dtype, generator=g, requires_grad=True)
            for _ in range(2))
    dout = torch.randn(batch, s, h, d, device="cuda", dtype=dtype, generator=g)
    rows = {(impl, p): dict(impl=impl, dtype=str(dtype).split(".")[-1], headdim=d, seqlen=s, batch=batch, nheads=h,
                            nheads_k=hk, causal=causal, **{"pass": p}, ms_rounds=[])
            for impl in impls for p in passes}
    fns, failed = {}, {}
    for impl in impls:
        f = attention_fn(impl, fa2, causal)
        try:
            out = f(q, k, v)
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            fns[impl] = (f, out)
        except Exception as e:  # (an SDPA backend without GQA support, for one)
            failed[impl] = short_error(e)
    order = list(fns)
    for r in range(rounds):  # (each round starts at another impl: none always runs right after the same one)
        for impl in order[r % len(order):] + order[:r % len(order)]:
            f, out = fns[impl]
            if impl in FA2_MODES:
                set_fa2_mode(fa2, impl)
            for p in passes:
                if p == "bwd":
                    def fn():
                        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                else:
                    def fn():
                        return torch.autograd.grad(f(q, k, v), (q, k, v), dout)
                rows[(impl, p)]["ms_rounds"].append(time_ms(fn, torch.device("cuda"), 10, rep_ms))
    peaks = {}
    for impl, (f, out) in fns.items():
        if impl in FA2_MODES:
            set_fa2_mode(fa2, impl)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        torch.cuda.synchronize()
        peaks[impl] = torch.cuda.max_memory_allocated() - base
    set_fa2_mode(fa2, "fa2")
    result = []
    for (impl, p), r in rows.items():
        flops = attention_flops(batch, h, s, s, d, causal, p)
        if impl in failed:
            r.update(status="error", reason=failed[impl])
        else:
            ms = statistics.median(r["ms_rounds"])
            r.update(status="ok", ms=ms, flops=flops, tflops=flops / (ms * 1e-3) / 1e12,
                     bwd_peak_mib=peaks[impl] / 2**20)
        result.append(r)
    return result


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cells = sorted({(r["headdim"], r["nheads_k"], r["causal"], r["pass"]) for r in rows})
    fig, axes = plt.subplots(1, len(cells), figsize=(3.2 * len(cells), 3.4), squeeze=False)
    for ax, (d, hk, causal, p) in zip(axes[0], cells):
        sub = [r for r in rows if (r["headdim"], r["nheads_k"], r["causal"], r["pass"]) == (d, hk, causal, p)]
        for impl in sorted({r["impl"] for r in sub}):
            pts = sorted((r["seqlen"], r["tflops"]) for r in sub if r["impl"] == impl and r["status"] == "ok")
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_title(f"d{d} {sub[0]['nheads']}/{hk} {'causal' if causal else 'nc'} {p}", fontsize=8)
        ax.set_xlabel("seqlen")
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--seqlens", default="1k,2k,4k,8k,16k")
    ap.add_argument("--nheads", type=int, default=32)
    ap.add_argument("--kv-heads", default="8,1")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--causal", default="both", choices=("both", "true", "false"))
    ap.add_argument("--passes", default="bwd,fwdbwd")
    ap.add_argument("--impls", default="fa2,fa2-grouped,fa2-accum,fa2-partials,cudnn,torch-fa2")
    ap.add_argument("--rep-ms", type=float, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    fa2, err = import_fa2()
    if fa2 is None:
        raise SystemExit(f"fa2 does not import: {err}")
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    impls = a.impls.split(",")
    causals = {"both": (False, True), "true": (True,), "false": (False,)}[a.causal]
    rows = []
    for d in map(int, a.dims.split(",")):
        for hk in map(int, a.kv_heads.split(",")):
            for s in map(parse_size, a.seqlens.split(",")):
                for causal in causals:
                    cell = run_cell(fa2, impls, dtype, d, s, a.tokens // s, a.nheads, hk, causal,
                                    a.passes.split(","), a.rep_ms, a.rounds)
                    rows += cell
                    line = "  ".join(f"{r['impl']}:{r['pass']} {r['tflops']:.0f}" for r in cell if r["status"] == "ok")
                    print(f"d{d} {a.nheads}/{hk} S{s} {'c' if causal else 'nc'}  {line}", flush=True)
    doc = dict(kind="gqa_backward", env=environment(torch.device("cuda"), fa2, None),
               flops="fwd = 4*B*H*Sq*Sk*D (/2 causal); bwd = 2.5*fwd; fwdbwd = 3.5*fwd (H: query heads)",
               timing=f"median of {a.rounds} rounds of time_ms over {a.rep_ms} ms, impls interleaved per round "
                      "(rotated)",
               measurements=rows)
    with open(a.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    plot(rows, a.out.rsplit(".", 1)[0] + ".png")


if __name__ == "__main__":
    main()
