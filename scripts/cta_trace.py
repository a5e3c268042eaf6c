"""Summarizes CTA timelines written by a -DFA2_CTA_TRACE=1 harness build (cuda/include/fa2/cta_trace.cuh,
scripts/fwd_variant_bench.cu with FA2_TRACE_OUT set): per CTA, where its cycles go between the kernel's marks, and
between CTAs on one SM (launch gaps), for one instrumented kernel's layout (--kernel, default from the file name).

    python3 scripts/cta_trace.py trace_bwd_d128_s1024_none.bin [more.bin ...]

Layout "bwd_ws" (bwd_ws_kernel.cuh): slot 0 clock64 at entry, 1 / 3 globaltimer at entry / exit, 2 the SM, 4 K/V and
the first query block landed, 5 + i the end of query block i (i < 60), 65 the loop's end, 66 the end.
Read on 2026-12-01 (d 128 S 1k, H200, before the staged dK/dV epilogue): ~3.0k cycles to the first loads, first
query block 4.9k, later ones 4.06k, epilogue 11.1k of a CTA's 80.4k.
Layout "fwd_ws" (fwd_kernel.cuh, warp-specialized): slots 0-3 as above, then three blocks of 20 (warpgroup 0's first
and second tile, warpgroup 1's second tile): the tile's start, the start of key iterations 0-16, the loop's end, the
epilogue's end.
"""
from __future__ import annotations

import argparse
import statistics
import struct
from collections import defaultdict

CTAS, SLOTS = 4096, 72  # cta_trace.cuh: kCtas, kSlots
ENTRY, ENTRY_NS, SM, EXIT_NS, FIRST_EVENT = 0, 1, 2, 3, 4
LANDED, BLOCK0, BLOCKS = FIRST_EVENT, FIRST_EVENT + 1, 60
LOOP_END, END = BLOCK0 + BLOCKS, BLOCK0 + BLOCKS + 1


def load(path: str) -> list[tuple[int, ...]]:
    with open(path, "rb") as f:
        data = f.read()
    values = struct.unpack(f"{len(data) // 8}Q", data)
    ctas = [values[i * SLOTS:(i + 1) * SLOTS] for i in range(len(values) // SLOTS)]
    return [c for c in ctas if c[ENTRY_NS] != 0 and c[EXIT_NS] != 0]


def row(name: str, xs: list[float]) -> str:
    xs = sorted(xs)
    return (f"  {name:24s} mean {statistics.mean(xs):10.0f}  median {statistics.median(xs):10.0f}  "
            f"p10 {xs[len(xs) // 10]:10.0f}  p90 {xs[9 * len(xs) // 10]:10.0f}")


def summarize(path: str) -> None:
    ctas = load(path)
    if not ctas:
        print(f"{path}: no CTA wrote its marks")
        return
    # query blocks seen by each CTA: the marks written (a CTA with more than BLOCKS has only the first BLOCKS)
    blocks = [sum(1 for i in range(BLOCKS) if c[BLOCK0 + i] != 0) for c in ctas]
    print(f"{path}: {len(ctas)} CTAs, query blocks per CTA {min(blocks)}-{max(blocks)} (first {BLOCKS} marked)")
    full = [(c, n) for c, n in zip(ctas, blocks) if n >= 3]
    print(row("entry -> loads landed", [c[LANDED] - c[ENTRY] for c in ctas]))
    if full:
        print(row("first query block", [c[BLOCK0] - c[LANDED] for c, _ in full]))
        print(row("middle blocks (mean)", [(c[BLOCK0 + n - 2] - c[BLOCK0]) / (n - 2) for c, n in full]))
        print(row("last marked block", [c[BLOCK0 + n - 1] - c[BLOCK0 + n - 2] for c, n in full]))
    print(row("loop end -> end", [c[END] - c[LOOP_END] for c in ctas]))
    print(row("entry -> end (cycles)", [c[END] - c[ENTRY] for c in ctas]))
    ns = [c[EXIT_NS] - c[ENTRY_NS] for c in ctas]
    print(row("entry -> exit (ns)", ns))
    by_sm: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for c in ctas:
        by_sm[c[SM]].append((c[ENTRY_NS], c[EXIT_NS]))
    gaps = []
    for spans in by_sm.values():
        spans.sort()
        gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:])]
    t0, t1 = min(c[ENTRY_NS] for c in ctas), max(c[EXIT_NS] for c in ctas)
    print(f"  span {(t1 - t0) / 1e3:.1f} us over {len(by_sm)} SMs, {len(ctas) / len(by_sm):.1f} CTAs an SM; "
          f"gap between CTAs on an SM: median {statistics.median(gaps) / 1e3 if gaps else 0:.2f} us; "
          f"clock {statistics.mean(c[END] - c[ENTRY] for c in ctas) / statistics.mean(ns):.2f} cycles / ns")


FWD_TILE_SLOTS, FWD_ITERS = 20, 17


def summarize_fwd(path: str) -> None:
    ctas = load(path)
    if not ctas:
        print(f"{path}: no CTA wrote its marks")
        return
    print(f"{path}: {len(ctas)} CTAs (forward)")
    for name, block in (("wg 0, tile 0", 0), ("wg 0, tile 1", 1), ("wg 1, tile 1", 2)):
        base = FIRST_EVENT + block * FWD_TILE_SLOTS
        traced = [c for c in ctas if c[base] != 0 and c[base + FWD_ITERS + 2] != 0]
        if not traced:
            continue
        iters = [sum(1 for i in range(FWD_ITERS) if c[base + 1 + i] != 0) for c in traced]
        n = min(iters)
        print(f" {name}: {len(traced)} CTAs, key iterations marked {n}-{max(iters)}")
        print(row("start -> iteration 0", [c[base + 1] - c[base] for c in traced]))
        print(row("iteration 0", [c[base + 2] - c[base + 1] for c in traced]))
        if n >= 3:
            print(row("iterations 1.. (mean)", [(c[base + n] - c[base + 2]) / (n - 2) for c in traced]))
        if n < FWD_ITERS:  # the whole loop was marked: its last iteration and the after-loop P V
            print(row("last iteration -> loop end", [c[base + FWD_ITERS + 1] - c[base + n] for c in traced]))
        print(row("epilogue", [c[base + FWD_ITERS + 2] - c[base + FWD_ITERS + 1] for c in traced]))
        print(row("tile (start -> epilogue end)", [c[base + FWD_ITERS + 2] - c[base] for c in traced]))
        if block == 0:
            nxt = [c for c in traced if c[base + FWD_TILE_SLOTS] != 0]
            if nxt:
                print(row("epilogue end -> next tile", [c[base + FWD_TILE_SLOTS] - c[base + FWD_ITERS + 2]
                                                        for c in nxt]))
    ns = [c[EXIT_NS] - c[ENTRY_NS] for c in ctas]
    print(row("entry -> exit (ns)", ns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--kernel", choices=("bwd_ws", "fwd_ws"), default=None,
                        help="the layout (default: fwd_ws for trace_fwd_* files, else bwd_ws)")
    args = parser.parse_args()
    for path in args.files:
        kernel = args.kernel or ("fwd_ws" if "trace_fwd" in path else "bwd_ws")
        (summarize_fwd if kernel == "fwd_ws" else summarize)(path)


if __name__ == "__main__":
    main()
