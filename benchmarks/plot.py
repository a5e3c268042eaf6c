#!/usr/bin/env python
"""Plots for the benchmark JSON files (bench_attention.py, bench_e2e.py, sustained.py, placement.py,
bench_decode.py); also callable on a saved file.

  python benchmarks/plot.py benchmarks/results/attention_h200-20261204g-grid.json [--out DIR]

Attention: FA-2-paper-style figures, one PNG per (dtype, mask): one panel per pass x (head dim, causal), TFLOP/s
bars per seqlen grouped by implementation; plus the memory plot (peak memory of one fwd+bwd call vs seqlen).
End to end: training throughput (tokens/s) and MFU bars per configuration and way.
Sustained: TFLOP/s back to back at the power cap with the SM clock; placement: each regime's per-rep times.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"fa2": "#d62728", "fa2-nosplit": "#fc9272", "fa2-split": "#cb181d", "fa2-sm80": "#f4a582", "fa2-bwd80": "#fb6a4a", "fa2-bwdnows": "#ef3b2c", "fa2-kbias": "#a50f15", "fa2-kbias-off": "#fcbba1", "fa2-bwd90": "#fb6a4a", "fa2-pipe": "#fddbc7", "fa2-ws": "#67001f", "fa2-wspp": "#b2182b", "fa2-wsov": "#d6604d", "fa2-wsppov": "#8c2d04", "fa2-nobwdpdl": "#e7298a", "torch-fa2": "#1f77b4", "cudnn": "#2ca02c", "efficient": "#9467bd", "math": "#7f7f7f",
          "flex": "#ff7f0e", "sdpa": "#17becf", "fa4": "#000000"}
PASS_LABEL = {"fwd": "forward", "bwd": "backward", "fwdbwd": "forward + backward"}


def _seq_label(s: int) -> str:
    return f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s)


def _hw(env: dict) -> str:
    return env.get("gpu") or f"CPU ({env.get('cpu', '?')}, {env.get('threads', '?')} threads)"


def plot_attention_speed(result: dict, out_dir: str, stem: str) -> list[str]:
    rows = result["measurements"]
    env, tag = result["env"], result["tag"]
    cpu = not env.get("gpu")
    scale, unit = (1000.0, "GFLOP/s") if cpu else (1.0, "TFLOP/s")
    paths = []
    groups = sorted({(r["dtype"], r["mask"]) for r in rows}, key=lambda t: (t[1] != "none", t))
    impl_order = [i for i in COLORS if any(r["impl"] == i for r in rows)]
    for dtype, mask in groups:
        sel = [r for r in rows if r["dtype"] == dtype and r["mask"] == mask]
        passes = [p for p in PASS_LABEL if any(r["pass"] == p for r in sel)]
        panels = sorted({(r["headdim"], r["causal"]) for r in sel}, key=lambda t: (t[1], t[0]))
        impls = [i for i in impl_order if any(r["impl"] == i and r["status"] == "ok" for r in sel)]
        if not impls or not passes:
            continue
        fig, axes = plt.subplots(len(passes), len(panels), squeeze=False,
                                 figsize=(max(7.0, 1.2 + 4.0 * len(panels)), 1.0 + 3.0 * len(passes)))
        cell = {(r["pass"], r["headdim"], r["causal"], r["seqlen"], r["impl"]): r for r in sel}
        for pi, pass_ in enumerate(passes):
            for ci, (D, causal) in enumerate(panels):
                ax = axes[pi][ci]
                seqlens = sorted({r["seqlen"] for r in sel if r["headdim"] == D and r["causal"] == causal})
                width = 0.8 / len(impls)
                top = 0.0
                for ii, impl in enumerate(impls):
                    for si, S in enumerate(seqlens):
                        r = cell.get((pass_, D, causal, S, impl))
                        x = si - 0.4 + width * (ii + 0.5)
                        if r is not None and r["status"] == "ok":
                            val = r["tflops"] * scale
                            top = max(top, val)
                            ax.bar(x, val, width, color=COLORS[impl], label=impl if (si == 0) else None)
                            txt = f"{val:.0f}" if val >= 10 else f"{val:.2g}"
                            if r.get("check", {}).get("ok") is False:
                                txt += "!"
                            ax.text(x, val, txt, ha="center", va="bottom", fontsize=6, rotation=90)
                        elif r is not None:
                            ax.text(x, 0, {"oom": "OOM", "n/a": "n/a", "error": "err", "skipped": "skip"}.get(
                                r["status"], r["status"]), ha="center", va="bottom", fontsize=5, rotation=90,
                                color=COLORS[impl])
                ax.set_ylim(0, top * 1.22 if top > 0 else 1)
                ax.set_xticks(range(len(seqlens)), [_seq_label(s) for s in seqlens])
                ax.set_title(f"{PASS_LABEL[pass_]}, head dim {D}, {'causal' if causal else 'non-causal'}", fontsize=9)
                ax.tick_params(labelsize=7)
                if ci == 0:
                    ax.set_ylabel(f"Speed ({unit})", fontsize=8)
                if pi == len(passes) - 1:
                    ax.set_xlabel("Sequence length", fontsize=8)
        handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[i]) for i in impls]
        height = fig.get_size_inches()[1]
        fig.legend(handles, impls, bbox_to_anchor=(0.5, 1 - 0.42 / height), loc="upper center", ncol=len(impls),
                   fontsize=8, frameon=False)
        mask_txt = {"none": "no mask", "padding": "padding mask (B,1,1,S)", "full": "full bias (B,H,S,S)"}.get(mask, mask)
        fig.suptitle(f"Attention speed, {_hw(env)}, {dtype}, {mask_txt}\n"
                     f"torch {env.get('torch')}, CUDA {env.get('cuda')}, fa2 {env.get('fa2', {}).get('version', '?')} "
                     f"({(env.get('git_commit') or '?')[:8]}), {env.get('date', '')[:10]}", fontsize=9,
                     x=0.01, y=0.995, ha="left")
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / height))
        path = os.path.join(out_dir, f"{stem}_{dtype}_{mask}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_attention_memory(result: dict, out_dir: str, stem: str) -> list[str]:
    rows = result.get("memory") or []
    ok = [r for r in rows if r["status"] == "ok" and r.get("peak_bytes")]  # log axis: drop None and 0
    if not ok:
        return []
    env, tag = result["env"], result["tag"]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for impl in dict.fromkeys(r["impl"] for r in rows):
        pts = sorted((r["seqlen"], r["peak_bytes"] / 2**20) for r in ok if r["impl"] == impl)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=COLORS.get(impl), label=impl)
        fail = [r for r in rows if r["impl"] == impl and r["status"] in ("oom", "error")]
        if fail and pts:
            ax.annotate(f"{fail[0]['status'].upper()} at {_seq_label(fail[0]['seqlen'])}", pts[-1], fontsize=8,
                        xytext=(5, 5), textcoords="offset points", color=COLORS.get(impl))
    r0 = ok[0]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    seqlens = sorted({r["seqlen"] for r in rows})
    ax.set_xticks(seqlens, [_seq_label(s) for s in seqlens])
    ax.set_xlabel("Sequence length")
    ax.set_ylabel("Peak memory above inputs (MiB)")
    what = "CUDA max_memory_allocated" if env.get("gpu") else "RSS high-water mark"
    ax.set_title(f"Memory of one fwd+bwd call (batch 1, {r0['nheads']} heads, D {r0['headdim']}, {r0['dtype']})\n"
                 f"{_hw(env)}, {what}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = os.path.join(out_dir, f"{stem}_memory.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


E2E_LABELS = {"train": ("training step", "Training tokens/s (label: MFU)"),
              "prefill": ("prefill", "Prefill tokens/s (label: MFU)"),
              "generate": ("generation (batch 1, decode)", "Generated tokens/s"),
              "packed": ("padding-free training step (mixed documents)", "Training tokens/s (label: MFU)")}


def plot_e2e(result: dict, out_dir: str, stem: str) -> list[str]:
    """One PNG per mode that has a successful run: tokens/s bars per shape and way (<stem>.png for training, as
    before; <stem>_prefill.png, <stem>_generate.png)."""
    paths = []
    for mode, (what, ylabel) in E2E_LABELS.items():
        rows = [r for r in result["runs"] if r["mode"] == mode]
        if not any(r["status"] == "ok" for r in rows):
            continue
        env = result["env"]
        shapes = list(dict.fromkeys(r["shape"] for r in rows))
        ways = list(dict.fromkeys(r["way"] for r in rows))
        fig, ax = plt.subplots(figsize=(max(6.0, 2.0 + 2.2 * len(shapes)), 4.0))
        width = 0.8 / len(ways)
        colors = {"eager+inductor": "#7f7f7f", "eager+fa2": "#d62728", "sdpa+inductor": "#1f77b4",
                  "hf-fa2+inductor": "#2ca02c", "sdpa+inductor+fa2-sdpa": "#9467bd"}
        others = iter(["#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22"])  # (ways without a color of their own)
        top = 0
        for way in ways:
            colors.setdefault(way, next(others, "#2ca02c"))
        for wi, way in enumerate(ways):
            for si, shape in enumerate(shapes):
                r = next((x for x in rows if x["way"] == way and x["shape"] == shape), None)
                x = si - 0.4 + width * (wi + 0.5)
                if r and r["status"] == "ok":
                    top = max(top, r["tokens_per_s"])
                    ax.bar(x, r["tokens_per_s"], width, color=colors[way], label=way if si == 0 else None)
                    label = f"{r['tokens_per_s'] / 1e3:.1f}k" if r["tokens_per_s"] >= 1e3 else f"{r['tokens_per_s']:.0f}"
                    if isinstance(r.get("mfu"), (int, float)):
                        label += f"\n{100 * r['mfu']:.0f}%"
                    ax.text(x, r["tokens_per_s"], label, ha="center", va="bottom", fontsize=7)
                elif r:
                    ax.text(x, 0, r["status"].upper(), ha="center", va="bottom", fontsize=7, rotation=90)
        ax.set_ylim(0, top * 1.6 if top else 1)  # (room for the legend above the bars)
        ax.set_xticks(range(len(shapes)), shapes)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{result.get('model', {}).get('name', 'model')} {what}, {_hw(env)}, "
                     f"{env.get('date', '')[:10]}", fontsize=9)
        ax.legend(fontsize=8, loc="upper center", ncol=2)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{stem}.png" if mode == "train" else f"{stem}_{mode}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _save_row(fig, axes, ylabel: str, title: str, path: str) -> list[str]:
    """A one-row figure's last steps: the y label and the legend on the first panel, the title, the PNG."""
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def plot_sustained(result: dict, out_dir: str, stem: str) -> list[str]:
    """benchmarks/sustained.py: one panel per (dtype, pass), TFLOP/s back to back per seqlen and implementation (a
    repeated implementation: the mean of its rows), its median SM clock written on each bar."""
    rows = [dict(r, **{"pass": r.get("pass", "fwd")}) for r in result["results"]]  # (the first files: forward only)
    panels = list(dict.fromkeys((r["dtype"], r["pass"]) for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.8), squeeze=False)
    for ax, (dtype, pass_) in zip(axes[0], panels):
        mine = [r for r in rows if r["dtype"] == dtype and r["pass"] == pass_]
        seqlens = sorted({r["seqlen"] for r in mine})
        width = 0.8 / len(impls)
        for ii, impl in enumerate(impls):
            for si, s in enumerate(seqlens):
                got = [r for r in mine if r["impl"] == impl and r["seqlen"] == s]
                if not got:
                    continue
                tf = sum(r["tflops"] for r in got) / len(got)
                mhz = sum(r["sm_clock_mhz"] for r in got) / len(got)
                x = si - 0.4 + width * (ii + 0.5)
                ax.bar(x, tf, width, color=COLORS.get(impl, "#7f7f7f"), label=impl if si == 0 else None)
                ax.text(x, tf, f"{tf:.0f}\n{mhz:.0f}", ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(seqlens)), [_seq_label(s) for s in seqlens])
        ax.set_title(f"{PASS_LABEL.get(pass_, pass_)}, {dtype}", fontsize=9)
        ax.set_ylim(0, 1.2 * max(r["tflops"] for r in mine))
        ax.set_xlabel("Sequence length")
    first = rows[0]
    return _save_row(fig, axes, "TFLOP/s back to back (SM MHz)",
                     f"Kernels back to back at the power cap, {result.get('gpu', '')}, head dim {first['headdim']}, "
                     f"{'causal' if first['causal'] else 'non-causal'}", os.path.join(out_dir, f"{stem}.png"))


def plot_placement(result: dict, out_dir: str, stem: str) -> list[str]:
    """benchmarks/placement.py: one panel per (dtype, pass), each regime's per-rep times of each implementation as
    dots (the spread the grid's rounds see), the median as a bar."""
    rows = result["results"]
    panels = list(dict.fromkeys((r["dtype"], r["pass"]) for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.8 * len(panels), 3.8), squeeze=False)
    for ax, (dtype, pass_) in zip(axes[0], panels):
        mine = [r for r in rows if r["dtype"] == dtype and r["pass"] == pass_]
        impls = list(mine[0]["ms_reps"])
        width = 0.8 / len(impls)
        for ri, r in enumerate(mine):
            for ii, impl in enumerate(impls):
                times = r["ms_reps"][impl]
                x = ri - 0.4 + width * (ii + 0.5)
                ax.scatter([x] * len(times), times, s=9, color=COLORS.get(impl, "#7f7f7f"),
                           label=impl if ri == 0 else None, alpha=0.7)
                ax.hlines(statistics.median(times), x - width / 2, x + width / 2, color=COLORS.get(impl, "#7f7f7f"))
        ax.set_xticks(range(len(mine)), [r["regime"] for r in mine])
        ax.set_title(f"{PASS_LABEL.get(pass_, pass_)}, {dtype}, S={_seq_label(mine[0]['seqlen'])}", fontsize=9)
    return _save_row(fig, axes, "ms per call (each rep's do_bench median)",
                     f"Round-to-round spread by allocator regime, {_hw(result['env'])}, head dim "
                     f"{rows[0]['headdim']}", os.path.join(out_dir, f"{stem}.png"))


def plot_decode(result: dict, out_dir: str, stem: str) -> list[str]:
    """scripts/dev/decode_gpu_check.py --bench: one panel per head dim, the achieved bandwidth (K/V bytes read / CUDA
    graph replay time) as a share of the device's copy bandwidth against the cache's size, one line per batch."""
    rows = result["rows"]
    dims = sorted({r["headdim"] for r in rows})
    fig, axes = plt.subplots(1, len(dims), figsize=(4.2 * len(dims), 3.8), squeeze=False)
    for ax, d in zip(axes[0], dims):
        for batch in sorted({r["batch"] for r in rows if r["headdim"] == d}):
            mine = sorted((r for r in rows if r["headdim"] == d and r["batch"] == batch), key=lambda r: r["kv_bytes"])
            ax.plot([r["kv_bytes"] / 1e6 for r in mine], [100 * r["gbps"] / r["copy_gbps"] for r in mine], "o-",
                    label=f"batch {batch}")
        ax.axhline(85, color="#999999", lw=0.8, ls="--")
        ax.axvline(64, color="#cccccc", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_xlabel("K/V cache read (MB)")
        ax.set_title(f"head dim {d}, GQA {rows[0]['nheads']}/{rows[0]['nheads_k']}", fontsize=9)
    return _save_row(fig, axes, "% of device copy bandwidth",
                     f"Decode (seqlen_q 1, bf16, {result.get('layout', '')} cache), {result.get('device', '')}",
                     os.path.join(out_dir, f"{stem}.png"))


def plot_varlen(result: dict, out_dir: str, stem: str) -> list[str]:
    """A varlen JSON (benchmarks/results/varlen_*): equal lengths, dense time / varlen time per seqlen (forward and
    backward panels, one bar group per head dim and causal); mixed lengths, useful TFLOP/s of varlen and the padded
    dense call."""
    rows = result["equal_lengths"]
    panels = list(dict.fromkeys(r["direction"] for r in rows)) + (["mixed"] if result.get("mixed") else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        if panel == "mixed":
            mixed = result["mixed"]
            labels = [f"d{r['headdim']}{' c' if r['causal'] else ''}" for r in mixed]
            for i, (key, name) in enumerate((("padded_tflops", "padded dense"), ("varlen_sm80_tflops", "varlen sm80"),
                                              ("varlen_sm90a_tflops", "varlen sm90a"))):
                ax.bar([x - 0.3 + 0.2 * (i + 0.5) for x in range(len(mixed))], [r[key] for r in mixed], 0.2,
                       label=name)
            ax.set_xticks(range(len(mixed)), labels)
            ax.set_ylabel("TFLOP/s of the real lengths")
            ax.set_title("mixed lengths 64..8k, forward", fontsize=9)
            ax.legend(fontsize=7)
            continue
        mine = [r for r in rows if r["direction"] == panel]
        for d, causal in dict.fromkeys((r["headdim"], r["causal"]) for r in mine):
            line = [r for r in mine if r["headdim"] == d and r["causal"] == causal]
            ax.plot([_seq_label(r["seqlen"]) for r in line], [r["ratio_sm90a"] for r in line], "o-",
                    label=f"d{d}{' causal' if causal else ''}")
        ax.axhline(0.98, color="#999999", lw=0.8, ls="--")
        ax.set_title(f"equal lengths, {panel}: dense ms / varlen ms (sm90a route)", fontsize=9)
        ax.set_xlabel("Sequence length")
    return _save_row(fig, axes, "dense / varlen", f"Varlen, {result.get('device', '')}, {result.get('dtype', '')}",
                     os.path.join(out_dir, f"{stem}.png"))


KVCACHE_MARKERS = "osv^D<>p"
PREFILL_COLORS = {"fa2-dense": "#7f7f7f", "fa2-kvcache": "#d62728", "fa2-kvcache-append": "#fc9272",
                  "fa2-kvcache-paged": "#9467bd"}


def plot_kvcache(result: dict, out_dir: str, stem: str) -> list[str]:
    """benchmarks/bench_decode.py: <stem>_decode.png, one panel per (cache layout, head dim), each implementation's
    achieved bandwidth as a share of the device's copy bandwidth against the K/V bytes read (a marker and a line per
    batch size); <stem>_prefill.png, TFLOP/s per chunk x cache and implementation (fa2-kvcache over fa2-dense on the
    bars)."""
    return _plot_kvcache_decode(result, out_dir, stem) + _plot_kvcache_prefill(result, out_dir, stem)


def _plot_kvcache_decode(result: dict, out_dir: str, stem: str) -> list[str]:
    rows = [r for r in result["decode"] if r["status"] == "ok"]
    if not rows:
        return []
    pages, dims = sorted({r["page"] for r in rows}), sorted({r["headdim"] for r in rows})
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(len(pages), len(dims), figsize=(max(8.0, 4.4 * len(dims)), 3.4 * len(pages) + 1.0),
                             squeeze=False)
    for (pi, page), (di, d) in ((p, q) for p in enumerate(pages) for q in enumerate(dims)):
        ax = axes[pi][di]
        for impl in impls:
            for bi, batch in enumerate(batches):
                line = sorted((r for r in rows if (r["impl"], r["page"], r["headdim"], r["batch"]) ==
                               (impl, page, d, batch)), key=lambda r: r["kv_bytes"])
                ax.plot([r["kv_bytes"] / 1e6 for r in line], [r["pct_copy"] for r in line], lw=0.9,
                        marker=KVCACHE_MARKERS[bi % len(KVCACHE_MARKERS)], ms=4, color=COLORS.get(impl, "#7f7f7f"))
        ax.axhline(85, color="#999999", lw=0.8, ls="--")
        ax.axvline(64, color="#cccccc", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_title(f"{'paged, ' + str(page) + ' keys a block' if page else 'contiguous'}, head dim {d}", fontsize=9)
        ax.set_xlabel("K/V cache read (MB)", fontsize=8)
        ax.set_ylabel("% of device copy bandwidth", fontsize=8)
    handles = [plt.Line2D([], [], color=COLORS.get(i, "#7f7f7f"), lw=2) for i in impls]
    handles += [plt.Line2D([], [], color="#444444", marker=KVCACHE_MARKERS[i % len(KVCACHE_MARKERS)], ls="")
                for i in range(len(batches))]
    height = fig.get_size_inches()[1]
    fig.legend(handles, impls + [f"batch {b}" for b in batches], loc="upper center", ncol=min(len(handles), 9),
               fontsize=7, frameon=False, bbox_to_anchor=(0.5, 1 - 0.5 / height))
    r0, env = rows[0], result["env"]
    fig.suptitle(f"Decode (seqlen_q 1, bf16, heads {r0['nheads']}/{r0['nheads_k']}), {_hw(env)}\n"
                 f"device copy {result['copy_gbps']:.0f} GB/s (read + write), torch {env.get('torch')}, "
                 f"{env.get('date', '')[:10]}", fontsize=9, x=0.01, y=0.995, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.7 / height))
    path = os.path.join(out_dir, f"{stem}_decode.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def _plot_kvcache_prefill(result: dict, out_dir: str, stem: str) -> list[str]:
    rows = [r for r in result["prefill"] if r["status"] == "ok"]
    if not rows:
        return []
    shapes = list(dict.fromkeys((r["seqlen_q"], r["cache"]) for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(shapes), 3.8))
    width = 0.8 / len(impls)
    for ii, impl in enumerate(impls):
        for si, shape in enumerate(shapes):
            r = next((x for x in rows if (x["impl"], x["seqlen_q"], x["cache"]) == (impl, *shape)), None)
            if r is None:
                continue
            x = si - 0.4 + width * (ii + 0.5)
            ax.bar(x, r["tflops"], width, color=PREFILL_COLORS.get(impl, COLORS.get(impl, "#2ca02c")),
                   label=impl if si == 0 else None)
            if "vs_dense" in r:
                ax.text(x, r["tflops"], f"{r['vs_dense']:.2f}x", ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_xticks(range(len(shapes)), [f"q {_seq_label(q)}\nkv {_seq_label(k)}" for q, k in shapes], fontsize=7)
    ax.set_ylim(0, 1.2 * max(r["tflops"] for r in rows))
    r0 = rows[0]
    return _save_row(fig, [[ax]], "TFLOP/s (unmasked work)",
                     f"Chunked prefill, causal, bf16, D {r0['headdim']}, heads {r0['nheads']}/{r0['nheads_k']}, "
                     f"batch {r0['batch']}, {_hw(result['env'])}", os.path.join(out_dir, f"{stem}_prefill.png"))


def plot_all(result: dict, out_dir: str, stem: str | None = None) -> list[str]:
    """PNGs named <stem>_... (default: the name the benchmark gave its JSON, attention_<tag> / e2e_<tag>)."""
    os.makedirs(out_dir, exist_ok=True)
    if result.get("kind") == "e2e":
        return plot_e2e(result, out_dir, stem or f"e2e_{result['tag']}")
    if result.get("kind") == "kvcache":
        return plot_kvcache(result, out_dir, stem or f"kvcache_{result['tag']}")
    if result.get("kind") == "dropout":
        return plot_dropout(result, out_dir, stem or "dropout")
    if result.get("kind") == "varlen_peers":
        return plot_varlen_peers(result, out_dir, stem or f"varlen_peers_{result['tag']}")
    if result.get("kind") == "padded_paths":
        return plot_padded_paths(result, out_dir, stem or "padded_paths")
    if result.get("kind") in ("decode", "varlen"):
        plot = plot_decode if result["kind"] == "decode" else plot_varlen
        return plot(result, out_dir, stem or result["kind"])
    if result.get("kind") in ("sustained", "placement"):  # (their JSON names no tag: stem from the file name)
        plot = plot_sustained if result["kind"] == "sustained" else plot_placement
        return plot(result, out_dir, stem or result["kind"])
    if "fa2_path" in result and "results" in result:  # benchmarks/bench_cpu.py (its JSON names no kind: the file's)
        return plot_cpu(result, out_dir, stem or "cpu")
    stem = stem or f"attention_{result['tag']}"
    return plot_attention_speed(result, out_dir, stem) + plot_attention_memory(result, out_dir, stem)


def plot_cpu(result: dict, out_dir: str, stem: str) -> list[str]:
    """benchmarks/bench_cpu.py: one panel per pass, SDPA's time over fa2's (> 1: fa2 faster) per shape, a bar per
    (dtype, causal)."""
    rows = result["results"]
    passes = list(dict.fromkeys(r["pass"] for r in rows))
    fig, axes = plt.subplots(1, len(passes), figsize=(5.0 * len(passes), 3.6), squeeze=False)
    for ax, pass_ in zip(axes[0], passes):
        here = [r for r in rows if r["pass"] == pass_]
        shapes = list(dict.fromkeys((r["batch"], r["nheads"], r["seqlen"], r["headdim"]) for r in here))
        series = list(dict.fromkeys((r["dtype"], r["causal"]) for r in here))
        width = 0.8 / max(1, len(series))
        for si, (dtype, causal) in enumerate(series):
            for xi, shape in enumerate(shapes):
                r = next((x for x in here if (x["batch"], x["nheads"], x["seqlen"], x["headdim"]) == shape
                          and x["dtype"] == dtype and x["causal"] == causal), None)
                if r:
                    ax.bar(xi - 0.4 + width * (si + 0.5), r["ratio_sdpa_over_fa2"], width, color=f"C{si}",
                           label=f"{dtype}{', causal' if causal else ''}" if xi == 0 else None)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(shapes)), [f"{b}x{h}x{sq}\nD {d}" for b, h, sq, d in shapes], fontsize=8)
        ax.set_title(pass_, fontsize=9)
    return _save_row(fig, axes, "SDPA time / fa2 time (> 1: fa2 faster)",
                     f"CPU, fa2 against SDPA, torch {result.get('torch', '?')}, {result.get('threads', '?')} threads",
                     os.path.join(out_dir, f"{stem}.png"))


def plot_padded_paths(result: dict, out_dir: str, stem: str) -> list[str]:
    """benchmarks/padded_paths.py: one panel per (shape, pass), the varlen path's speed against the key-row mask's
    (key_mask ms / varlen ms: > 1, varlen faster) per padding fraction, one bar per (head dim, padding side)."""
    rows, env = result["rows"], result["env"]
    panels = list(dict.fromkeys((f"{r['seqlen']}x{r['batch']}", r["pass_"]) for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (shape, pass_) in zip(axes[0], panels):
        here = [r for r in rows if f"{r['seqlen']}x{r['batch']}" == shape and r["pass_"] == pass_]
        pads = sorted({r["pad"] for r in here})
        series = list(dict.fromkeys((r["headdim"], r["side"]) for r in here))
        width = 0.8 / max(1, len(series))
        for si, (d, side) in enumerate(series):
            for pi, pad in enumerate(pads):
                r = next((x for x in here if x["headdim"] == d and x["side"] == side and x["pad"] == pad), None)
                if r:
                    ax.bar(pi - 0.4 + width * (si + 0.5), r["varlen_speedup"], width, color=f"C{si}",
                           label=f"D {d}, {side}" if pi == 0 else None)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(pads)), [f"pad {p:.0%}" for p in pads])
        ax.set_title(f"{shape}, {pass_}", fontsize=9)
    return _save_row(fig, axes, "key_mask ms / varlen ms (> 1: varlen faster)",
                     f"Padded batches: fa2.hf's two paths, {_hw(env)}, {env.get('date', '')[:10]}",
                     os.path.join(out_dir, f"{stem}.png"))


def plot_varlen_peers(result: dict, out_dir: str, stem: str) -> list[str]:
    """benchmarks/bench_varlen.py: one panel per (pass, batch mix and tokens), useful TFLOP/s (the real lengths) of
    each implementation per (head dim, heads, causal); a bar that did not run shows its status."""
    rows, env = result["rows"], result["env"]
    scale, unit = (1.0, "TFLOP/s") if env.get("gpu") else (1000.0, "GFLOP/s")
    passes = [p for p in PASS_LABEL if any(r["pass"] == p for r in rows)]
    batches = list(dict.fromkeys((r["mix"], r["tokens"]) for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    colors = {"torch": COLORS["torch-fa2"], "padded": "#7f7f7f"}
    fig, axes = plt.subplots(len(passes), len(batches), figsize=(1.5 + 4.2 * len(batches), 0.8 + 3.2 * len(passes)),
                             squeeze=False)
    for (pi, pass_), (bi, (mix, tokens)) in itertools.product(enumerate(passes), enumerate(batches)):
        ax, mine = axes[pi][bi], [r for r in rows if r["pass"] == pass_ and (r["mix"], r["tokens"]) == (mix, tokens)]
        groups = list(dict.fromkeys((r["headdim"], r["nheads"], r["nheads_k"], r["causal"]) for r in mine))
        width = 0.8 / len(impls)
        for (gi, group), (ii, impl) in itertools.product(enumerate(groups), enumerate(impls)):
            r = next((x for x in mine if x["impl"] == impl and
                      (x["headdim"], x["nheads"], x["nheads_k"], x["causal"]) == group), None)
            x = gi - 0.4 + width * (ii + 0.5)
            color = colors.get(impl, COLORS.get(impl, "#17becf"))
            if r is not None and r["status"] == "ok":
                ax.bar(x, r["tflops"] * scale, width, color=color, label=impl if gi == 0 else None)
            elif r is not None:
                ax.text(x, 0, r["status"], ha="center", va="bottom", fontsize=5, rotation=90, color=color)
        ax.set_xticks(range(len(groups)), [f"d{d}{f' {h}/{hk}' if h != hk else ''}{' c' if c else ''}"
                                           for d, h, hk, c in groups], fontsize=7)
        ax.set_title(f"{PASS_LABEL[pass_]}, {mix}, {_seq_label(tokens)} tokens", fontsize=9)
    return _save_row(fig, axes, f"{unit} of the real lengths",
                     f"Varlen attention, {_hw(env)}, {result.get('dtype', '')}, torch {env.get('torch')}, "
                     f"{env.get('date', '')[:10]}", os.path.join(out_dir, f"{stem}.png"))


def plot_dropout(result: dict, out_dir: str, stem: str) -> list[str]:
    """benchmarks/bench_dropout.py: TFLOP/s (the undropped attention's FLOPs) per implementation, one panel per head
    dim, a bar group per (seqlen, causal)."""
    rows = result["rows"]
    dims = sorted({r["headdim"] for r in rows})
    impls = list(rows[0]["tflops"])
    fig, axes = plt.subplots(1, len(dims), figsize=(6.0 * len(dims), 3.8), squeeze=False)
    for ax, d in zip(axes[0], dims):
        mine = [r for r in rows if r["headdim"] == d]
        width = 0.8 / len(impls)
        for i, impl in enumerate(impls):
            ax.bar([x + i * width for x in range(len(mine))], [r["tflops"].get(impl) or 0 for r in mine], width,
                   label=impl)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(mine))])
        ax.set_xticklabels([f"{r['seqlen'] // 1024}k{' c' if r['causal'] else ''}" for r in mine], fontsize=8)
        ax.set_title(f"head dim {d}", fontsize=9)
    return _save_row(fig, axes, "TFLOP/s", f"Dropout, {result.get('pass_', '')} bf16, {result.get('device', '')}"
                     " (c: causal)", os.path.join(out_dir, f"{stem}.png"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="+")
    p.add_argument("--out", help="folder for the PNGs (default: next to the JSON)")
    args = p.parse_args()
    for path in args.json:
        with open(path) as f:
            result = json.load(f)
        stem = os.path.splitext(os.path.basename(path))[0]  # a renamed JSON keeps its PNGs apart
        for png in plot_all(result, args.out or os.path.dirname(os.path.abspath(path)), stem):
            print("wrote", png)


if __name__ == "__main__":
    main()
