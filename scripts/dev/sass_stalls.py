"""Where a kernel's warps wait, per SASS instruction: Nsight Compute's source-level warp-state sampling
(SourceCounters), summed over the whole kernel, over the top instructions, and over address ranges of your choosing.

The question it answers is the one section-level metrics cannot: which instructions of the key loop the warps sit on,
and why (a wgmma wait, a named barrier, a fixed-latency dependency, a constant load...). Session 11 used it to find
that the d 128 forward's consumer warps spent ~630 of ~3040 cycles per key tile issuing their wgmmas (descriptor
arithmetic) and ~200 re-reading the window from constant memory (benchmarks/results/variants_h200-20261130-fwd-softmax.json).

On the GPU machine (ncu present; clocks left alone), profile one launch and export the per-instruction table:
    python3 scripts/dev/sass_stalls.py run OUT_PREFIX --kernel-regex fwd --launch-skip 2 -- out/var/bench 8192 none
  writes OUT_PREFIX_sass.csv (and OUT_PREFIX.log); then, anywhere:
    python3 scripts/dev/sass_stalls.py show OUT_PREFIX_sass.csv [--top 40] [--region NAME=0xLO-0xHI ...]
  Addresses in regions are offsets from the kernel's first instruction, as cuobjdump -sass prints them (/*2a90*/).
"""
from __future__ import annotations

import argparse
import csv
import subprocess
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def run(args: argparse.Namespace) -> int:
    report = f"{args.prefix}.ncu-rep"
    cmd = ["ncu", "--clock-control", "none", "-k", f"regex:{args.kernel_regex}", "--launch-skip",
           str(args.launch_skip), "--launch-count", "1", "--section", "SourceCounters", "--section",
           "WarpStateStats", "-f", "-o", args.prefix] + args.command
    with open(f"{args.prefix}.log", "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        print(f"ncu failed (rc {rc}): see {args.prefix}.log", file=sys.stderr)
        return rc
    with open(f"{args.prefix}_sass.csv", "w") as out:
        rc = subprocess.call(["ncu", "--import", report, "--page", "source", "--csv", "--print-source", "sass"],
                             stdout=out)
    print(f"wrote {args.prefix}_sass.csv (rc {rc})")
    return rc


def show(args: argparse.Namespace) -> int:
    rows = list(csv.reader(open(args.csv)))
    header_at = next(i for i, r in enumerate(rows) if SAMPLES in r)
    header, data = rows[header_at], [r for r in rows[header_at + 1:] if len(r) == len(rows[header_at])]
    col = {name: i for i, name in enumerate(header)}
    reasons = [n for n in header if n.startswith("stall_") and "Not Issued" not in n]
    base = int(data[0][col["Address"]], 16)
    total = sum(_number(r[col[SAMPLES]]) for r in data) or 1.0

    def pct(v: float) -> str:
        return f"{100 * v / total:5.1f}%"

    def breakdown(selected: list[list[str]], n: int) -> str:
        sums = sorted(((name, sum(_number(r[col[name]]) for r in selected)) for name in reasons), key=lambda x: -x[1])
        return " ".join(f"{name[6:]}={100 * v / total:.1f}" for name, v in sums[:n] if v > 0)

    print(f"{args.csv}: {len(data)} instructions, {total:.0f} samples")
    print("stall reasons:", breakdown(data, 8))
    for spec in args.region:
        name, span = spec.split("=", 1)
        lo, hi = (int(x, 16) for x in span.split("-"))
        selected = [r for r in data if lo <= int(r[col["Address"]], 16) - base <= hi]
        share = sum(_number(r[col[SAMPLES]]) for r in selected)
        print(f"  {name:28s} {pct(share)}  {len(selected):4d} instructions  {breakdown(selected, 4)}")
    print(f"top {args.top} instructions (offset, share, SASS, reasons):")
    for r in sorted(data, key=lambda r: -_number(r[col[SAMPLES]]))[:args.top]:
        offset = int(r[col["Address"]], 16) - base
        print(f"  {offset:05x} {pct(_number(r[col[SAMPLES]]))} {r[col['Source']].strip()[:64]:64s} {breakdown([r], 3)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    p_run = sub.add_parser("run", help="profile one launch with ncu and export the SASS table (GPU machine)")
    p_run.add_argument("prefix")
    p_run.add_argument("--kernel-regex", default="fwd|bwd")
    p_run.add_argument("--launch-skip", type=int, default=2)
    p_show = sub.add_parser("show", help="summarize an exported table")
    p_show.add_argument("csv")
    p_show.add_argument("--top", type=int, default=30)
    p_show.add_argument("--region", action="append", default=[], help="NAME=0xLO-0xHI (offsets, inclusive)")
    # (the command after '--' is split off by hand: an argparse REMAINDER positional after 'prefix' swallowed the
    #  options written after the prefix, --kernel-regex included, and handed them to ncu)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    command = argv[cut + 1:]
    args = parser.parse_args(argv[:cut])
    if args.mode == "run":
        if not command:
            parser.error("run: give the command to profile after --")
        args.command = command
        return run(args)
    return show(args)


if __name__ == "__main__":
    sys.exit(main())
