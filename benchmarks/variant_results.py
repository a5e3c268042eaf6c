"""Turns the text output of scripts/dev/fwd_variant_bench.cu runs (scripts/dev/fwd_variants.sh, or a device call's own
loop) into a results JSON and a PNG, so that A/B numbers quoted in commits and notes live under benchmarks/results/.

Input: lines "== <label> ..." open a section (the label is the first word after "=="; "(round N)" or "rN" after it
is the round), followed by the harness's lines "d <D> S <S> mask <mask> <fwd|bwd> <TFLOP/s> TFLOP/s [checksum ...]".
FLOPs (the harness's): forward 4 B H S^2 D per call (halved for causal cases, masks "<mask>/c"), backward 2.5x that
(padded keys counted); B H S = 16k tokens x 2048 / D heads, bf16, sm_90a.
Usage: python benchmarks/variant_results.py OUT.json --title T --gpu G --commit C [--note N] FILE [FILE ...]
  (each FILE may be "label-prefix=path": its section labels get the prefix)
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict

LINE = re.compile(r"^d\s+(\d+)\s+S\s+(\d+)\s+mask\s+(\S+)\s+(fwd|bwd)\s+([\d.]+)\s+TFLOP/s")
HEADER = re.compile(r"^==\s+(.+?)\s*$")
ROUND = re.compile(r"\(round (\d+)\)|\br(\d+)$")


def parse(path: str, prefix: str = "") -> list[dict]:
    rows, label, rnd = [], None, 1
    with open(path) as f:
        for line in f:
            line = line.rstrip()
            h = HEADER.match(line)
            if h:
                text = h.group(1)
                r = ROUND.search(text)
                rnd = int(r.group(1) or r.group(2)) if r else 1
                # (a leading "d128 " names the headdim, which the lines carry: left out so that the same variant at
                # several headdims shares one label and colour)
                label = prefix + re.sub(r"^d\d+\s+", "", ROUND.sub("", text).strip())
                continue
            m = LINE.match(line)
            if m and label is not None:
                d, s, mask, direction, tflops = m.groups()
                rows.append({"label": label, "round": rnd, "headdim": int(d), "seqlen": int(s), "mask": mask,
                             "pass": direction, "tflops": float(tflops)})
    return rows


def plot(rows: list[dict], title: str, png: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = defaultdict(list)  # (d, pass, mask, S) -> {label: [tflops]}
    for r in rows:
        groups[(r["headdim"], r["pass"], r["mask"], r["seqlen"])].append(r)
    keys = sorted(groups)
    labels = sorted({r["label"] for r in rows}, key=lambda x: [r["label"] for r in rows].index(x))
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(min(18, max(8, 0.35 * len(keys) * len(labels))), 4.5))
    for i, label in enumerate(labels):
        ys = []
        for k in keys:
            vals = [r["tflops"] for r in groups[k] if r["label"] == label]
            ys.append(statistics.mean(vals) if vals else 0.0)
        ax.bar([j + i * width for j in range(len(keys))], ys, width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))])
    ax.set_xticklabels([f"d{d} {p}\n{m} {s // 1024}k" for d, p, m, s in keys], fontsize=7)
    ax.set_ylabel("TFLOP/s (mean of rounds)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--title", required=True)
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    rows = []
    for spec in args.files:
        prefix, _, path = spec.rpartition("=")
        rows += parse(path, prefix + " " if prefix else "")
    if not rows:
        raise SystemExit("no harness lines found")
    doc = {"kind": "fwd_variant_bench", "title": args.title, "gpu": args.gpu, "git_commit": args.commit,
           "note": args.note,
           "flops": "forward 4 B H S^2 D per call, backward 2.5x that; B = 16384 / S, H = 2048 / D; bf16, non-causal",
           "measurements": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    plot(rows, args.title, args.out.rsplit(".", 1)[0] + ".png")
    print(f"wrote {args.out} ({len(rows)} measurements) and its .png")


if __name__ == "__main__":
    main()
