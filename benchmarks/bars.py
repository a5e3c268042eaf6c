"""Issue 8's bars, read off a grid JSON of bench_attention.py (fa2 against cuDNN, the FA-2 paper's grid):

  1. fa2 / cuDNN >= 1.0 forward at D 64 / 128 / 256, seqlen >= 2k, causal and not (no mask);
  2. the same for forward+backward;
  3. with a (B, 1, 1, Sk) padding mask, fa2 >= cuDNN forward and forward+backward (every D and seqlen >= 2k run);
  4. (stretch) forward >= 700 TFLOP/s at D=128, S=16k (non-causal, any dtype run).

For each: met or not, the range of the ratios, and the cells below 1 (or, for 4, the TFLOP/s). A cell that did not run
ok for either implementation counts as not met (it is listed). The backward alone is reported beside bar 2.
A cell below 1 also shows its rounds' ratios (cuDNN's ms / fa2's ms of round i, where both have the same number of
ms_rounds: with --interleave a round's two timings come from one burst, so its ratio is a paired one), to tell a
cell whose every round is below 1 from one that straddles it.
Usage: python benchmarks/bars.py benchmarks/results/attention_h200-20261204g-grid.json [--min-seqlen 2048]
"""
from __future__ import annotations

import argparse
import json
import math

BAR_DIMS = (64, 128, 256)


def _cells(result: dict, min_seqlen: int):
    """{(dtype, D, S, causal, mask, pass): {impl: row}} of the grid's rows from min_seqlen on."""
    cells: dict = {}
    for r in result["measurements"]:
        if r["seqlen"] >= min_seqlen and r["headdim"] in BAR_DIMS:
            key = (r["dtype"], r["headdim"], r["seqlen"], r["causal"], r["mask"], r["pass"])
            cells.setdefault(key, {})[r["impl"]] = r
    return cells


def ratio_bar(cells: dict, mask: str, passes: tuple[str, ...]) -> dict:
    """fa2 / cuDNN over the cells of this mask and these passes: met (every one >= 1 and every one ran), the range,
    the cells below 1 and the ones that did not run."""
    ratios, below, missing, rounds = [], [], [], {}
    for key in sorted(cells):
        if key[4] != mask or key[5] not in passes:
            continue
        fa2, cudnn = cells[key].get("fa2"), cells[key].get("cudnn")
        if not fa2 or not cudnn or fa2.get("status") != "ok" or cudnn.get("status") != "ok":
            missing.append(key)
            continue
        ratio = fa2["tflops"] / cudnn["tflops"]
        ratios.append(ratio)
        if ratio < 1.0:
            below.append((key, math.floor(ratio * 1e4) / 1e4))  # (rounded down: a cell below 1 never shows 1.0)
            fa2_ms, cudnn_ms = fa2.get("ms_rounds") or [], cudnn.get("ms_rounds") or []
            if fa2_ms and len(fa2_ms) == len(cudnn_ms):
                rounds[key] = [round(c / f, 3) for f, c in zip(fa2_ms, cudnn_ms)]
    return {"met": bool(ratios) and not below and not missing, "cells": len(ratios),
            # (the low end rounded down, as the cells below 1 are: a bar not met never shows a range from 1.0)
            "range": (math.floor(min(ratios) * 1e3) / 1e3, round(max(ratios), 3)) if ratios else None, "below": below,
            "rounds": rounds, "missing": missing}


def stretch_bar(cells: dict, target: float = 700.0) -> dict:
    """fa2's forward TFLOP/s at D=128, S=16k, non-causal, no mask, per dtype run; met where any dtype reaches target."""
    got = {key[0]: row["tflops"] for key, impls in cells.items() for row in [impls.get("fa2")]
           if row and row.get("status") == "ok" and key[1:] == (128, 16384, False, "none", "fwd")}
    return {"met": any(v >= target for v in got.values()), "tflops": {k: round(v) for k, v in sorted(got.items())}}


def bars(result: dict, min_seqlen: int = 2048) -> dict:
    cells = _cells(result, min_seqlen)
    return {"1 forward": ratio_bar(cells, "none", ("fwd",)),
            "2 forward+backward": ratio_bar(cells, "none", ("fwdbwd",)),
            "(backward alone)": ratio_bar(cells, "none", ("bwd",)),
            "3 padding mask": ratio_bar(cells, "padding", ("fwd", "fwdbwd")),
            "4 stretch": stretch_bar(cells)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--min-seqlen", type=int, default=2048)
    args = ap.parse_args()
    with open(args.json) as f:
        result = json.load(f)
    for name, bar in bars(result, args.min_seqlen).items():
        if "tflops" in bar:
            print(f"{name}: {'met' if bar['met'] else 'NOT met'} (fa2 forward D=128 S=16k: {bar['tflops']})")
            continue
        print(f"{name}: {'met' if bar['met'] else 'NOT met'}, {bar['cells']} cells, fa2 / cuDNN {bar['range']}")
        for key, ratio in bar["below"]:
            dtype, d, s, causal, mask, pass_ = key
            per_round = bar["rounds"].get(key)
            print(f"    below 1: {dtype} D={d} S={s} {'causal' if causal else 'non-causal'} {mask} {pass_}: {ratio}"
                  + (f" (rounds {' / '.join(str(r) for r in per_round)})" if per_round else ""))
        for key in bar["missing"]:
            print(f"    did not run: {key}")


if __name__ == "__main__":
    main()
