"""A/B of two builds of the fa2 library in one process, call by call (on the GPU machine).

The base build is an earlier tree whose ops were renamed to the namespace ``fa2ab`` before building
(scripts/dev/ab_library.sh does both), loaded beside this tree's fa2 with torch.ops.load_library; each config's
``torch.ops.fa2ab.*`` and ``torch.ops.fa2.*`` calls are then interleaved in one burst (an L2 flush before each call,
benchmarks/bench_attention.py's time_interleaved), so both builds share the GPU's state. Every result is compared too:
out, lse, dk, dv bitwise (dq is summed with atomics: compared within rounding).

The grid is the FA-2 paper's (benchmarks/bench_attention.py): 16k tokens (batch = 16384 / S), hidden 2048 (nheads =
2048 / D), D 64 / 128 / 256, S 1k-16k, causal both, no mask and a (B, 1, 1, S) padding bias (last 10% of keys
-inf; non-causal), bf16 and fp16, forward / backward / forward+backward. FLOPs: forward 4 B H S^2 D (half when
causal), backward 2.5x, forward+backward 3.5x. Ratio = base ms / head ms (> 1: the head is faster).

Usage: python scripts/dev/ab_library.py --base-lib PATH/_C.so [--rounds 3] [--out DIR] [grid options]
"""
import argparse
import contextlib
import json
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks"))
from bench_attention import parse_size, time_interleaved  # noqa: E402
from bench_common import attention_flops  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def inputs(dtype, D, S, causal, mask, seed):
    batch, nheads = max(1, 16384 // S), max(1, 2048 // D)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (batch, nheads, S, D)  # (B, H, S, D) tensors seen as (B, S, H, D): the layout SDPA users pass
    q, k, v, dout = (torch.randn(shape, generator=gen, device="cuda", dtype=dtype).transpose(1, 2) for _ in range(4))
    bias = None
    if mask == "padding":
        bias = torch.zeros(batch, 1, 1, S, device="cuda", dtype=dtype)
        bias[..., S - max(1, S // 10):] = float("-inf")
    return dict(batch=batch, nheads=nheads, q=q, k=k, v=v, dout=dout, bias=bias)


def calls(ns, x, causal):
    """The three timed passes of one build (namespace ns) on inputs x, and its results for the comparison."""
    fwd, bwd = getattr(torch.ops, ns).fwd, getattr(torch.ops, ns).bwd
    q, k, v, dout, bias = x["q"], x["k"], x["v"], x["dout"], x["bias"]
    out, lse = fwd(q, k, v, bias, None, causal)
    grads = bwd(dout, q, k, v, out, lse, bias, None, causal)
    passes = {
        "fwd": lambda: fwd(q, k, v, bias, None, causal),
        "bwd": lambda: bwd(dout, q, k, v, out, lse, bias, None, causal),
        "fwdbwd": lambda: bwd(dout, q, k, v, *fwd(q, k, v, bias, None, causal), bias, None, causal),
    }
    return passes, dict(out=out, lse=lse, dq=grads[0], dk=grads[1], dv=grads[2])


def compare(a, b):
    """'bitwise' where every result but dq is bitwise equal (dq: atomics) and dq within rounding, else what differs.
    (The warp-specialized backward's split last wave sums dK / dV pieces with atomics too: the ones it splits differ from
    run to run in the last bits, which the base build's control comparison shows.)"""
    diffs = [name for name in ("out", "lse", "dk", "dv") if not torch.equal(a[name], b[name])]
    dq_err = ((a["dq"].float() - b["dq"].float()).norm() / b["dq"].float().norm().clamp_min(1e-30)).item()
    if dq_err > 1e-2:
        diffs.append(f"dq (rel {dq_err:.2e})")
    return "bitwise" if not diffs else "differs: " + ", ".join(diffs)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-lib", required=True, help="the base build's _C*.so (ops in the fa2ab namespace)")
    p.add_argument("--dims", default="64,128,256")
    p.add_argument("--seqlens", default="1k,2k,4k,8k,16k")
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--masks", default="none,padding")
    p.add_argument("--passes", default="fwd,bwd,fwdbwd")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup-ms", type=float, default=10)
    p.add_argument("--rep-ms", type=float, default=40)
    p.add_argument("--out", default="out/ab_library")
    p.add_argument("--tag", default="ab")
    args = p.parse_args()
    torch.ops.load_library(args.base_lib)
    import fa2  # noqa: F401  (this tree's build: the fa2 namespace)

    configs = []
    for mask in args.masks.split(","):
        for dtype in args.dtypes.split(","):
            for D in (int(d) for d in args.dims.split(",")):
                for causal in ((False, True) if mask == "none" else (False,)):
                    for S in (parse_size(s) for s in args.seqlens.split(",")):
                        configs.append((dtype, D, S, causal, mask))
    rows = []
    for i, (dtype, D, S, causal, mask) in enumerate(configs):
        x = inputs(DTYPES[dtype], D, S, causal, mask, seed=1000 + i)
        base_passes, base_res = calls("fa2ab", x, causal)
        head_passes, head_res = calls("fa2", x, causal)
        same = compare(head_res, base_res)
        if same != "bitwise":  # the control: does the base build itself differ from run to run on these inputs?
            same += "; base run to run: " + compare(calls("fa2ab", x, causal)[1], base_res)
        del base_res, head_res
        for pass_ in args.passes.split(","):
            ms = {"base": [], "head": []}
            for r in range(args.rounds):
                names = ("base", "head") if r % 2 == 0 else ("head", "base")
                fns = {"base": base_passes[pass_], "head": head_passes[pass_]}
                got = time_interleaved({n: (fns[n], contextlib.nullcontext) for n in names}, torch.device("cuda"),
                                       args.warmup_ms, args.rep_ms)
                for n in names:
                    ms[n].append(got[n])
            flops = attention_flops(x["batch"], x["nheads"], S, S, D, causal, pass_)
            ratios = [b / h for b, h in zip(ms["base"], ms["head"])]
            row = dict(dtype=dtype, headdim=D, seqlen=S, causal=causal, mask=mask, batch=x["batch"],
                       nheads=x["nheads"], **{"pass": pass_}, base_ms=ms["base"], head_ms=ms["head"],
                       ratio_rounds=ratios, ratio=statistics.median(ratios),
                       head_tflops=flops / (statistics.median(ms["head"]) * 1e-3) / 1e12,
                       base_tflops=flops / (statistics.median(ms["base"]) * 1e-3) / 1e12, results=same)
            rows.append(row)
            print(f"{dtype} D{D:<3d} S{S:<5d} {'causal' if causal else '      '} {mask:7s} {pass_:6s} "
                  f"head {row['head_tflops']:6.1f} base {row['base_tflops']:6.1f} TFLOP/s  head/base "
                  f"{row['ratio']:.3f} ({' '.join(f'{r:.3f}' for r in ratios)})  {same}", flush=True)
        del x, base_passes, head_passes
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    low = [r for r in rows if r["ratio"] < 0.99]
    result = dict(kind="ab_library", gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                  flops="fwd = 4*B*H*S^2*D (/2 causal); bwd = 2.5*fwd; fwdbwd = 3.5*fwd",
                  timing=f"interleaved call by call (L2 flush before each), warmup {args.warmup_ms} ms, rep "
                         f"{args.rep_ms} ms, {args.rounds} rounds, ratio = median of the rounds' base ms / head ms",
                  rows=rows)
    path = os.path.join(args.out, f"ab_library_{args.tag}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    ratios = [r["ratio"] for r in rows]
    print(f"\n{len(rows)} cells: head/base min {min(ratios):.3f} median {statistics.median(ratios):.3f} "
          f"max {max(ratios):.3f}; below 0.99: {len(low)}; results not bitwise: "
          f"{sum(r['results'] != 'bitwise' for r in rows)}")
    for r in low:
        print(f"  below 0.99: {r['dtype']} D{r['headdim']} S{r['seqlen']} causal={r['causal']} {r['mask']} "
              f"{r['pass']}: {r['ratio']:.3f} {r['ratio_rounds']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
