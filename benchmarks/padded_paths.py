"""Padded batches under Hugging Face ``attn_implementation="fa2"``: the key-row padding mask against varlen.

fa2.hf runs a padded batch (a (B, S) attention_mask, as many queries as keys: training, prefill) either through fa2's
attention with ``causal=True`` and a (B, 1, 1, S) key mask (``"key_mask"``, the default) or through
``fa2.varlen_attention`` over the rows' real tokens moved to their fronts (``"varlen"``: a gather of q, k, v, varlen
over 2 * B segments whose padding segments see no key, a scatter of the output). This times both through
``fa2.hf.fa2_attention_forward`` itself, as a Hugging Face layer calls it (inputs in its (B, H, S, D) views of
(B, S, H, D) memory, GQA), interleaved call by call (bench_attention.time_interleaved), forward and forward+backward,
over padding fractions, padding sides and head dims. Row b of a batch has round(pad * S * b / (B - 1)) padding
tokens (row 0 none, the last row pad * S), as bench_e2e.py's --pad.

The varlen path's layout (two argsorts and a cumsum of the mask) is computed once per forward pass and shared by the
layers (fa2.hf._PerForward), so the timed calls reuse it; ``layout_ms`` is its own time, to add once per forward.
Usage: python benchmarks/padded_paths.py [--shapes 2048x4,4096x2] [--pads 0.1,0.3,0.5] [--dims 64,128]
       [--sides left,right] [--passes fwd,fwdbwd] [--out FILE.json]       (--device cpu: a smoke run)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os

import torch

import bench_attention as bench
from bench_common import environment, import_fa2, pass_closure
from bench_e2e import padded_batches

HERE = os.path.dirname(os.path.abspath(__file__))
PATHS = ("key_mask", "varlen")


def padding_mask(batch: int, seqlen: int, pad: float, side: str, device) -> torch.Tensor:
    """(batch, seqlen) bool, True = a real token; row b padded by round(pad * seqlen * b / (batch - 1)) on side."""
    mask = torch.ones(batch, seqlen, dtype=torch.bool, device=device)
    for b in range(batch):
        n = round(pad * seqlen * b / max(batch - 1, 1))
        if side == "left":
            mask[b, :n] = False
        elif n:
            mask[b, seqlen - n:] = False
    return mask


def layer_inputs(batch, seqlen, nheads, nheads_k, headdim, dtype, device):
    """q (B, H, S, D) and k, v (B, Hk, S, D) as a Hugging Face layer hands them over: views of (B, S, H, D) memory."""
    def one(heads):
        return torch.randn(batch, seqlen, heads, headdim, device=device, dtype=dtype).transpose(1, 2)
    return tuple(t.requires_grad_() for t in (one(nheads), one(nheads_k), one(nheads_k)))


def run_config(fa2_hf, shape, pad, side, headdim, pass_, args, device) -> dict:
    seqlen, batch = shape
    nheads, nheads_k = args.hidden // headdim, args.kv_heads
    q, k, v = layer_inputs(batch, seqlen, nheads, nheads_k, headdim, torch.bfloat16 if device.type == "cuda"
                           else torch.float32, device)
    mask = padding_mask(batch, seqlen, pad, side, device)
    module = torch.nn.Module()
    dout = torch.randn(batch, seqlen, nheads, headdim, device=device, dtype=q.dtype)

    def call():
        return fa2_hf.fa2_attention_forward(module, q, k, v, mask, scaling=headdim ** -0.5)[0]
    row = dict(seqlen=seqlen, batch=batch, pad=pad, side=side, headdim=headdim, nheads=nheads, nheads_k=nheads_k,
               pass_=pass_, real_tokens=int(mask.sum()))
    fns = {path: (pass_closure(call, pass_, (q, k, v), dout), lambda path=path: padded_batches(path))
           for path in PATHS}
    if device.type == "cuda":
        row.update({f"{p}_ms": t for p, t in bench.time_interleaved(fns, device, 10, args.rep_ms).items()})
    else:
        for path, (fn, ctx) in fns.items():
            with ctx():
                row[f"{path}_ms"] = bench.time_ms(fn, device, 0, args.rep_ms)
    row["layout_ms"] = bench.time_ms(lambda: fa2_hf._padded_layout(mask), device, 5, args.rep_ms / 4)
    row["varlen_speedup"] = row["key_mask_ms"] / row["varlen_ms"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--shapes", help="SEQLENxBATCH list (default 2048x4,4096x2; cpu 64x3)")
    ap.add_argument("--pads", default="0.1,0.3,0.5", help="padding of the last row, as a fraction of S")
    ap.add_argument("--sides", default="left,right")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--passes", default="fwd,fwdbwd")
    ap.add_argument("--hidden", type=int, default=2048, help="query heads = hidden / head dim")
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument("--out", help="JSON file (default benchmarks/results/padded_paths_<gpu>-<date>.json)")
    args = ap.parse_args()
    device = torch.device(args.device)
    fa2_mod, fa2_err = import_fa2()
    if fa2_mod is None:
        raise SystemExit(f"fa2 is not importable: {fa2_err}")
    import fa2.hf as fa2_hf
    shapes = [tuple(int(x) for x in s.split("x")) for s in (args.shapes or ("2048x4,4096x2" if device.type == "cuda"
                                                                              else "64x3")).split(",")]
    rows = []
    for shape in shapes:
        for headdim in (int(d) for d in args.dims.split(",")):
            for pad in (float(p) for p in args.pads.split(",")):
                for side in args.sides.split(","):
                    for pass_ in args.passes.split(","):
                        row = run_config(fa2_hf, shape, pad, side, headdim, pass_, args, device)
                        rows.append(row)
                        print(f"S {shape[0]:5d} x {shape[1]}  D {headdim:3d}  pad {pad:.2f} {side:5s} {pass_:6s}  "
                              f"key_mask {row['key_mask_ms']:.3f} ms  varlen {row['varlen_ms']:.3f} ms  "
                              f"(x{row['varlen_speedup']:.2f})  layout {row['layout_ms']:.3f} ms", flush=True)
    env = environment(device, fa2_mod, fa2_err)
    hw = env.get("gpu", "cpu").replace("NVIDIA", "").strip().split()[0].lower() if device.type == "cuda" else "cpu"
    out = args.out or os.path.join(HERE, "results", f"padded_paths_{hw}-{datetime.date.today():%Y%m%d}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"kind": "padded_paths", "env": env, "rows": rows}, f, indent=1, default=str)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
