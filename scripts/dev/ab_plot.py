"""Plot of an A/B run (scripts/dev/ab_library.py's JSON): head / base per cell, one panel per pass, cells grouped by
(dtype, headdim, mask, causal) along x with seqlen within each group; 0.99 and 1.0 drawn.
Usage: python3 scripts/dev/ab_plot.py ab_library_TAG.json [out.png]   (matplotlib)
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path, out=None):
    d = json.load(open(path))
    rows = d["rows"]
    passes = list(dict.fromkeys(r["pass"] for r in rows))
    groups = list(dict.fromkeys((r["dtype"], r["headdim"], r["mask"], r["causal"]) for r in rows))
    fig, axes = plt.subplots(len(passes), 1, figsize=(14, 3.2 * len(passes)), sharex=True)
    for ax, pass_ in zip(axes, passes):
        xs, ys, lo, hi, labels = [], [], [], [], []
        x = 0
        for g in groups:
            cells = [r for r in rows if (r["dtype"], r["headdim"], r["mask"], r["causal"]) == g and r["pass"] == pass_]
            for r in sorted(cells, key=lambda r: r["seqlen"]):
                xs.append(x)
                ys.append(r["ratio"])
                lo.append(r["ratio"] - min(r["ratio_rounds"]))
                hi.append(max(r["ratio_rounds"]) - r["ratio"])
                x += 1
            labels.append((x - len(cells) / 2 - 0.5, f"{g[0]} d{g[1]}\n{'causal' if g[3] else g[2]}"))
            x += 1
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", ms=3, capsize=2)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.axhline(0.99, color="red", lw=0.8, ls="--")
        ax.set_ylabel(f"{pass_}\nhead / base")
        ax.set_ylim(min(0.95, min(ys) - 0.01), max(1.05, max(ys) + 0.01))
    axes[-1].set_xticks([p for p, _ in labels])
    axes[-1].set_xticklabels([t for _, t in labels], fontsize=7)
    fig.suptitle(f"{d['gpu']}: head / base, interleaved call by call, median of the rounds (bars: min / max); "
                 "seqlen 1k..16k within each group", fontsize=9)
    fig.tight_layout()
    out = out or path.replace(".json", ".png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
