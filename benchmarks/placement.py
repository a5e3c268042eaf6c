"""Where does the grid's round-to-round spread come from? One cell (default: D=128, S=8k, non-causal backward, the
grid's shapes), fa2 and cuDNN timed as bench_attention.py times them (triton's do_bench median of 50 ms bursts after
0.1 s idle), in three regimes, --reps times each:

  warm    the same inputs, and the caching allocator keeps its blocks between measurements: every burst's
          gradients, workspaces and outputs land at the same addresses as the burst before;
  fresh   the same inputs, torch.cuda.empty_cache() before each burst (what the grid does): the burst's own buffers
          come from new cudaMallocs;
  shifted as fresh, and a spacer of a random size (0-1 GiB, seeded) held while the burst runs, so that its buffers
          land elsewhere in the address space.

If the ~10% spread (e.g. D=128 S=8k backward rounds of ~4.6 and ~5.1 ms, fa2 and cuDNN alike, at the same SM clock)
follows the buffers' placement, "warm" is steady within a rep's noise and "fresh" / "shifted" spread; if it is the
GPU's state, all three spread alike. Each rep times fa2 then cuDNN (reversed every other rep), so a rep's pair
shares the GPU's state; the summary gives each regime's median, min and max and the median of the paired ratios.
Usage: python benchmarks/placement.py [--dim 128] [--seqlen 8192] [--dtypes fp16,bf16] [--passes bwd] [--reps 10]
       [--regimes warm,fresh,shifted] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics

import torch

import bench_attention as bench
from bench_common import ClockSampler, environment, import_fa2, nvidia_smi_id


def timed_pass(f, q, k, v, dout, pass_, device, window):
    """As the grid times a pass (bench_attention's call of it): do_bench's median of 50 ms after 5 ms of warm-up and
    0.1 s idle; window receives the unix times the warm-up and timed calls started and ended (after the idle time)."""
    return bench.time_ms(bench._pass_fn(f, pass_, q, k, v, True, dout), device, 5, 50, 0.1, window)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--passes", default="bwd")
    ap.add_argument("--impls", default="fa2,cudnn")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--regimes", default="warm,fresh,shifted")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    device = torch.device("cuda")
    fa2_mod, fa2_err = import_fa2()
    impls = args.impls.split(",")
    rng = random.Random(0)
    results = []
    with ClockSampler(gpu=nvidia_smi_id(device)) as sampler:
        measure(args, device, fa2_mod, impls, rng, results)
    for row in results:
        row["sm_mhz_reps"] = {impl: [sampler.during(*w).get("sm_mhz") for w in ws]
                              for impl, ws in row.pop("windows").items()}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"kind": "placement", "argv": vars(args), "env": environment(device, fa2_mod, fa2_err),
                       "timing": ("triton do_bench" if bench._do_bench is not None else "CUDA events")
                       + " median, warmup 5 ms, rep 50 ms, 0.1 s idle before each", "results": results}, fh, indent=1)


def measure(args, device, fa2_mod, impls, rng, results) -> None:
    """The reps of every (dtype, pass, regime), appended to results (their windows for the clock)."""
    for dtype in args.dtypes.split(","):
        cfg = bench.Config(dtype, args.dim, args.seqlen, max(1, 16384 // args.seqlen), max(1, 2048 // args.dim),
                           False, "none")
        q, k, v, _ = bench.make_inputs(cfg, device)
        calls = {}
        for impl in impls:
            with bench.switched(impl, fa2_mod):  # (fa2-nosplit and the like: their switches around every call)
                calls[impl] = bench.make_call(impl, cfg, None, fa2_mod, device)
        for pass_ in args.passes.split(","):
            flops = bench.attention_flops(cfg.batch, cfg.nheads, cfg.seqlen, cfg.seqlen, cfg.headdim, False, pass_)
            for regime in args.regimes.split(","):
                times = {impl: [] for impl in impls}
                windows = {impl: [] for impl in impls}
                for rep in range(args.reps):
                    for impl in (impls if rep % 2 == 0 else impls[::-1]):
                        f, _ = calls[impl]
                        with bench.switched(impl, fa2_mod):
                            out = f(q, k, v)
                        dout = torch.randn_like(out)
                        del out
                        spacer = None
                        if regime != "warm":
                            torch.cuda.synchronize()
                            torch.cuda.empty_cache()
                        if regime == "shifted":
                            spacer = torch.empty(rng.randrange(0, 2**30, 2**21), dtype=torch.uint8, device=device)
                        w = []
                        with bench.switched(impl, fa2_mod):
                            times[impl].append(timed_pass(f, q, k, v, dout, pass_, device, w))
                        windows[impl].append(w)
                        del spacer, dout
                row = {"dtype": dtype, "headdim": cfg.headdim, "seqlen": cfg.seqlen, "batch": cfg.batch,
                       "nheads": cfg.nheads, "pass": pass_, "regime": regime, "flops": flops, "ms_reps": times,
                       "windows": windows}
                results.append(row)
                pairs = [times[impls[1]][i] / times[impls[0]][i] for i in range(args.reps)] if len(impls) > 1 else []
                print(f"{dtype} D{cfg.headdim} S{cfg.seqlen} {pass_:6s} {regime:8s} "
                      + "  ".join(f"{impl} median {statistics.median(t):.3f} [{min(t):.3f}, {max(t):.3f}] ms"
                                  for impl, t in times.items())
                      + (f"  paired {impls[1]}/{impls[0]} time median {statistics.median(pairs):.3f}" if pairs else ""),
                      flush=True)
                print("   " + "  ".join(f"{impl}: " + " ".join(f"{t:.3f}" for t in ts) for impl, ts in times.items()),
                      flush=True)


if __name__ == "__main__":
    main()
