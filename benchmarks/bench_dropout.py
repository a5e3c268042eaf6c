"""Dropout's cost on the GPU: fa2 forward+backward with dropout_p = 0.1 against fa2 without dropout, and PyTorch's
SDPA flash-attention kernel with and without dropout, on the FA-2 grid (bf16, 16k tokens, hidden 2048: batch =
16384 / seqlen, heads = 2048 / headdim), non-causal and causal. The issue's goals (issue 50): fa2 p=0.1 at >= 0.9x fa2
p=0, and >= SDPA flash p=0.1. On Hopper, "fa2 p=0.1 sm80" is the same call on the sm80 path's dropout kernels
(development option sm90_dropout off), the route dropout took before the sm_90a kernels had it; "fa2 p=0.1 wgmma-bwd"
the same call with option sm90_ws_dropout off (the backward on bwd_kernel's wgmma tiles instead of bwd_ws_kernel).

    python benchmarks/bench_dropout.py [--headdims 64,128] [--seqlens 1024,2048,4096,8192] [--pass fwdbwd|fwd]
                                       [--causal both|yes|no] [--json out.json]

Timing: bench_attention.time_ms (triton's do_bench where installed: CUDA events, L2 flushed between calls), the median.
TFLOP/s with the FA-2 paper's count (bench_common.attention_flops), the work of the undropped attention.
JSON (--json, kind "dropout"): the rows; `python benchmarks/plot.py FILE.json` draws them (plot.plot_dropout).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_attention import time_ms  # noqa: E402
from bench_common import attention_flops, grid_inputs, pass_closure  # noqa: E402

def median_ms(fn):
    return time_ms(fn, torch.device("cuda"), warmup_ms=25, rep_ms=100)


def runners(q, k, v, causal):
    """(B, H, S, D) inputs: name -> (() -> out, fa2's development options while it is timed), each the same
    attention."""
    import fa2
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(p):
        def run():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)
        return run

    # (fa2 takes and returns (B, S, H, D) views of the same tensors: the output viewed back as SDPA's (B, H, S, D),
    # the shape pass_closure's output gradient has)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    dropped = lambda: fa2.attention(qt, kt, vt, causal=causal, dropout_p=0.1).transpose(1, 2)  # noqa: E731
    return {
        "fa2 p=0": (lambda: fa2.attention(qt, kt, vt, causal=causal).transpose(1, 2), {}),
        "fa2 p=0.1": (dropped, {}),
        "fa2 p=0.1 sm80": (dropped, dict(sm90_dropout=False)),
        "fa2 p=0.1 wgmma-bwd": (dropped, dict(sm90_ws_dropout=False)),
        "sdpa-flash p=0": (sdpa(0.0), {}),
        "sdpa-flash p=0.1": (sdpa(0.1), {}),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--headdims", default="64,128")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192")
    ap.add_argument("--pass", dest="pass_", default="fwdbwd", choices=["fwd", "fwdbwd"])
    ap.add_argument("--causal", default="no", choices=["no", "yes", "both"])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_dropout.py needs a CUDA GPU")
    import fa2
    rows = []
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    print(f"{torch.cuda.get_device_name()}  bf16  {args.pass_}  tokens {args.tokens}  hidden {args.hidden}")
    print(f"{'D':>4} {'S':>6} {'causal':>6} | " + " | ".join(f"{n:>16}" for n in
          ("fa2 p=0", "fa2 p=0.1", "fa2 p=0.1 sm80", "fa2 p=0.1 wgmma-bwd", "sdpa-flash p=0", "sdpa-flash p=0.1")) +
          " | p=0.1/p=0  vs sdpa p=0.1")
    for d in (int(x) for x in args.headdims.split(",")):
        for s in (int(x) for x in args.seqlens.split(",")):
            for causal in causals:
                q, k, v, batch, nheads = grid_inputs(s, d, args.tokens, args.hidden, requires_grad=True)
                dout = torch.randn_like(q)
                flops = attention_flops(batch, nheads, s, s, d, causal, args.pass_)
                cells = {}
                for name, (run, options) in runners(q, k, v, causal).items():
                    try:
                        with fa2.dev.options_override(**options):
                            ms = median_ms(pass_closure(run, args.pass_, (q, k, v), dout))
                        cells[name] = flops / ms / 1e9
                    except Exception as e:  # (a backend that cannot run a shape: reported, not fatal)
                        cells[name] = None
                        print(f"  {name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                fmt = lambda x: f"{x:16.1f}" if x is not None else f"{'-':>16}"  # noqa: E731
                ratio = (cells["fa2 p=0.1"] / cells["fa2 p=0"]) if cells["fa2 p=0.1"] and cells["fa2 p=0"] else None
                vs = (cells["fa2 p=0.1"] / cells["sdpa-flash p=0.1"]
                      if cells["fa2 p=0.1"] and cells["sdpa-flash p=0.1"] else None)
                print(f"{d:>4} {s:>6} {str(causal):>6} | " + " | ".join(fmt(cells[n]) for n in cells) +
                      f" | {ratio or float('nan'):9.3f}  {vs or float('nan'):9.3f}")
                rows.append(dict(headdim=d, seqlen=s, causal=causal, tflops=cells, ratio_p01_p0=ratio,
                                 ratio_vs_sdpa_p01=vs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(kind="dropout", device=torch.cuda.get_device_name(), torch=torch.__version__, pass_=args.pass_,
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
