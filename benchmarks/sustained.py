"""Attention run back to back for a few seconds: TFLOP/s, SM clock and power once the GPU has settled, fa2 against
cuDNN (SDPA).

Why: the grid (bench_attention.py) times single calls after an L2 flush (triton's do_bench), with the GPU idle between
them; in training the kernels run back to back, where an H200 sits at its power cap and each kernel gets the clock
its power draw allows. The ratio of two kernels can differ between the two regimes, and this says by how much.
For each dtype, pass, seqlen and implementation: calls back to back for --secs seconds (CUDA events around all of
them), while nvidia-smi samples the SM clock, the power draw and the throttle reasons every 100 ms; the last three
quarters of the samples count (the first quarter is the clock settling). FLOPs as the grid's: 4 B H S^2 D (halved
when causal). --passes bwd times the backward alone (one forward, its graph retained, the backward replayed),
--passes fwdbwd the forward and backward together, as the grid's passes (FLOPs 2.5x and 3.5x the forward's).
Usage: python benchmarks/sustained.py [--dim 128] [--seqlens 2048,4096] [--causal] [--impls fa2,cudnn,fa2]
       [--dtypes bf16,fp16] [--passes fwd,bwd,fwdbwd] [--secs 4] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch

from bench_common import attention_flops, environment, grid_inputs, pass_closure
from host_overhead import make_call

SMI_FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def settled(fn, secs: float) -> tuple[float, list[list[str]]]:
    """ms per call of fn run back to back for secs seconds, and nvidia-smi's samples after the first quarter."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0, calls = time.time(), 0
    start.record()
    while time.time() - t0 < secs:
        for _ in range(10):
            fn()
        calls += 10
        torch.cuda.synchronize()  # (keeps the queue short, so that the loop's clock reads the GPU's progress)
    stop.record()
    torch.cuda.synchronize()
    smi.terminate()
    rows = [r.split(", ") for r in smi.communicate()[0].splitlines() if r[:1].isdigit()]
    return start.elapsed_time(stop) / calls, rows[len(rows) // 4:]


def pass_call(impl, pass_, q, k, v, causal):
    """f() running one pass of impl on the (B, H, S, D) tensors q, k, v (leaves that require grad unless pass_ is
    fwd), with a fixed random output gradient."""
    return pass_closure(make_call(impl, q, k, v, causal), pass_, (q, k, v),
                        None if pass_ == "fwd" else torch.randn_like(q))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seqlens", default="2048,4096")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--impls", default="fa2,cudnn,fa2", help="in this order (a repeat shows drift)")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--passes", default="fwd", help="fwd, bwd, fwdbwd: any of them, comma-separated")
    ap.add_argument("--secs", type=float, default=4.0)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sustained.py needs a CUDA GPU")
    results = []
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    for dtype, pass_, seqlen in ((d, p, int(s)) for d in args.dtypes.split(",") for p in args.passes.split(",")
                                 for s in args.seqlens.split(",")):
        q, k, v, batch, nheads = grid_inputs(seqlen, args.dim, args.tokens, args.hidden)
        q, k, v = (t.detach().to(dtypes[dtype]).requires_grad_(pass_ != "fwd") for t in (q, k, v))
        flops = attention_flops(batch, nheads, seqlen, seqlen, args.dim, args.causal, pass_)
        for impl in args.impls.split(","):
            ms, rows = settled(pass_call(impl, pass_, q, k, v, args.causal), args.secs)
            row = {"impl": impl, "seqlen": seqlen, "batch": batch, "nheads": nheads, "headdim": args.dim,
                   "causal": args.causal, "dtype": dtype, "pass": pass_, "ms": ms, "tflops": flops / ms / 1e9,
                   "sm_clock_mhz": statistics.median(float(r[0]) for r in rows),
                   "power_w": statistics.median(float(r[1]) for r in rows),
                   "throttle_reasons": sorted({r[3] for r in rows if len(r) > 3})}
            results.append(row)
            print(f"{impl:6s} {dtype} {pass_:6s} S {seqlen:5d}: {row['tflops']:6.1f} TFLOP/s back to back, "
                  f"SM clock {row['sm_clock_mhz']:.0f} MHz, power {row['power_w']:.0f} W, "
                  f"throttle {row['throttle_reasons']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            import fa2
            json.dump({"kind": "sustained", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "env": environment(torch.device("cuda"), fa2, None), "argv": vars(args), "results": results},
                      f, indent=1)


if __name__ == "__main__":
    main()
