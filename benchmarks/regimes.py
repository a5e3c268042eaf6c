"""One attention shape timed in three regimes, fa2 against cuDNN (SDPA), to tell a kernel's speed from the state the
GPU is timed in:
  cold      single calls, each after 150 ms with the GPU idle (CUDA events around the call: the GPU's clock ramps up
            from idle, and the host's launch is inside the interval)
  do_bench  triton's do_bench median (an L2 flush before each call; the grid's timing, bench_attention.py)
  b2b       calls back to back (host_overhead.gpu_us: CUDA events around 50 of them queued behind a short GPU
            sleep, so that the host runs ahead; no flush)
Implementations alternate (fa2, cudnn, fa2, cudnn) so that each is timed twice. sustained.py covers seconds at the
power cap. FLOPs: 4 B H S^2 D (halved when causal).
Usage: python benchmarks/regimes.py [--seqlens 4096,16384] [--dim 128] [--causal] [--grad] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from bench_common import attention_flops, grid_inputs
from host_overhead import gpu_us, make_call


def cold_ms(fn, n=8, idle_s=0.15):
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        time.sleep(idle_s)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--grad", action="store_true", help="inputs that require grad (the grid's forward does)")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("regimes.py needs a CUDA GPU")
    from triton.testing import do_bench
    results = []
    for seqlen in (int(s) for s in args.seqlens.split(",")):
        q, k, v, batch, nheads = grid_inputs(seqlen, args.dim, args.tokens, args.hidden, requires_grad=args.grad)
        flops = attention_flops(batch, nheads, seqlen, seqlen, args.dim, args.causal, "fwd")
        for impl in ("fa2", "cudnn", "fa2", "cudnn"):
            fn = make_call(impl, q, k, v, args.causal)
            ms = {"cold": cold_ms(fn), "do_bench": do_bench(fn, warmup=5, rep=20), "b2b": gpu_us(fn, 50) / 1e3}
            row = {"impl": impl, "seqlen": seqlen, "headdim": args.dim, "causal": args.causal, "grad": args.grad,
                   "ms": ms, "tflops": {k: flops / t / 1e9 for k, t in ms.items()}}
            results.append(row)
            print(f"S {seqlen:5d} {impl:6s} " + "  ".join(f"{k} {x:6.1f}" for k, x in row["tflops"].items())
                  + " TFLOP/s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"kind": "regimes", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "argv": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
