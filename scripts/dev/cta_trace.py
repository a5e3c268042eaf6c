"""Summarizes CTA timelines written by a -DFA2_CTA_TRACE=1 harness build (cuda/include/fa2/cta_trace.cuh,
scripts/dev/fwd_variant_bench.cu with FA2_TRACE_OUT set): per CTA, where its cycles go between the kernel's marks, and
between CTAs on one SM (launch gaps), for one instrumented kernel's layout (--kernel, default from the file name).

    python3 scripts/dev/cta_trace.py trace_bwd_d128_s1024_none.bin [more.bin ...]

Layout "bwd_ws" (bwd_ws_kernel.cuh): slot 0 clock64 at entry, 1 / 3 globaltimer at entry / exit, 2 the SM, 4 K/V and
the first query block landed, 5 + i the end of query block i (i < 60), 65 the loop's end, 66 the end.
Read on 2026-12-01 (d 128 S 1k, H200, before the staged dK/dV epilogue): ~3.0k cycles to the first loads, first
query block 4.9k, later ones 4.06k, epilogue 11.1k of a CTA's 80.4k.
Layout "fwd_ws" (fwd_kernel.cuh, warp-specialized): slots 0-3 as above, then three blocks of 20 (warpgroup 0's first
and second tile, warpgroup 1's second tile): the tile's start, the start of key iterations 0-16, the loop's end, the
epilogue's end.
Layout "fwd_tiles" (the same built with -DFA2_CTA_TRACE_TILES=1; files trace_fwdtiles_*): slots 0-3 as above, then
for consumer warpgroup w and the CTA's tile i < 20 the three slots 4 + 3 (20 w + i): the tile's start, the key loop's
end (its last P V completed) and the epilogue's end. Summarized per warpgroup (loop, epilogue, epilogue end -> next
tile, tile period) and per CTA: the share of its time in which one warpgroup, or both, sat between its loop's end and
its next tile's start (a "switch": no product of its own in flight).
"""
from __future__ import annotations

import argparse
import os
import statistics
import struct
from collections import defaultdict

CTAS, SLOTS = 4096, 128  # cta_trace.cuh: kCtas, kSlots
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


FWD_TILES = (SLOTS - FIRST_EVENT) // 6  # tiles marked per warpgroup (fwd_kernel.cuh: kTraceTiles)


def fwd_tiles_stats(ctas: list[tuple[int, ...]]) -> dict:
    """The "fwd_tiles" layout's numbers (cycles): per warpgroup the lists loop / epilogue / gap (epilogue end -> next
    tile's start) / period (start -> next start) over every marked tile that has a next one, and, summed over the CTAs
    from each one's first marked tile start to its last such next start (span), the time in which one warpgroup
    (one_switching), or both (both_switching), was between a loop's end and its next tile's start, also as fractions
    of span (switch_share_one / _both)."""
    per_wg = {w: {"loop": [], "epilogue": [], "gap": [], "period": []} for w in (0, 1)}
    one = both = span = 0
    for c in ctas:
        windows, first_starts = [], []  # per warpgroup: (loop end, next start) of each marked tile with a next one
        for w in (0, 1):
            marks = [c[FIRST_EVENT + 3 * (FWD_TILES * w + i):FIRST_EVENT + 3 * (FWD_TILES * w + i) + 3]
                     for i in range(FWD_TILES)]
            marks = [m for m in marks if m[0] != 0 and m[2] != 0]
            if marks:
                first_starts.append(marks[0][0])
            wins = []
            for (s, loop_end, e), nxt in zip(marks, marks[1:]):
                st = per_wg[w]
                st["loop"].append(loop_end - s)
                st["epilogue"].append(e - loop_end)
                st["gap"].append(nxt[0] - e)
                st["period"].append(nxt[0] - s)
                wins.append((loop_end, nxt[0]))
            windows.append(wins)
        if not windows[0] or not windows[1]:
            continue
        # sweep the two warpgroups' switch windows over the CTA's marked stretch
        t0 = min(first_starts)
        t1 = max(w[-1][1] for w in windows)
        events = sorted([(a, +1) for wins in windows for a, _ in wins] + [(b, -1) for wins in windows for _, b in wins])
        depth, last = 0, t0
        for t, d in events:
            if depth == 1:
                one += t - last
            elif depth >= 2:
                both += t - last
            depth, last = depth + d, t
        span += t1 - t0
    return {"wg": per_wg, "one_switching": one, "both_switching": both, "span": span,
            "switch_share_one": one / span if span else 0.0, "switch_share_both": both / span if span else 0.0}


def summarize_fwd_tiles(path: str) -> None:
    ctas = load(path)
    if not ctas:
        print(f"{path}: no CTA wrote its marks")
        return
    stats = fwd_tiles_stats(ctas)
    print(f"{path}: {len(ctas)} CTAs (forward, every tile of both warpgroups)")
    for w, st in stats["wg"].items():
        if not st["period"]:
            continue
        print(f" warpgroup {w}: {len(st['period'])} tiles with a next one")
        for name in ("loop", "epilogue", "gap", "period"):
            print(row(name, st[name]))
    print(f"  one warpgroup switching {100 * stats['switch_share_one']:.1f}% of the CTAs' marked time, both "
          f"{100 * stats['switch_share_both']:.1f}%")
    print(row("entry -> exit (ns)", [c[EXIT_NS] - c[ENTRY_NS] for c in ctas]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--kernel", choices=("bwd_ws", "fwd_ws", "fwd_tiles"), default=None,
                        help="the layout (default: fwd_tiles for trace_fwdtiles_* files, fwd_ws for trace_fwd_*, "
                             "else bwd_ws)")
    args = parser.parse_args()
    for path in args.files:
        name = os.path.basename(path)
        kernel = args.kernel or ("fwd_tiles" if name.startswith("trace_fwdtiles") else
                                 "fwd_ws" if name.startswith("trace_fwd") else "bwd_ws")
        {"fwd_tiles": summarize_fwd_tiles, "fwd_ws": summarize_fwd, "bwd_ws": summarize}[kernel](path)


if __name__ == "__main__":
    main()
