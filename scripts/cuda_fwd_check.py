"""Correctness sweep of the CUDA forward (torch.ops.fa2.fwd) against fp32 math, for scripts/gpu_check.sh.

Rule (docs/design.md): max|out - ref32| <= 2 * max|out_lowp - ref32| (+ a few fp32 ulps), out_lowp being the same math
done naively in the input dtype; the same rule for lse. Never NaN. Covers causal / window / softcap / bias (float,
q's dtype, bool; broadcast and full) / GQA / odd seqlens / odd headdims / transposed inputs / empty inputs /
rows that see no key. Prints one line per case and a summary; exits 1 on any failure.
Usage: PYTHONPATH=python python3 scripts/cuda_fwd_check.py [--quick] [--probe-errors]
"""
from __future__ import annotations

import math
import sys
import time

import torch

try:
    import fa2  # noqa: F401  (registers torch.ops.fa2.*)
except Exception as e:  # the Python package may be mid-edit; the ops come from fa2._C alone
    print(f"note: 'import fa2' failed ({type(e).__name__}: {e}); loading fa2._C directly")
    import importlib.util
    import glob
    import os

    so = glob.glob(os.path.join(os.path.dirname(__file__), "..", "python", "fa2", "_C*.so"))[0]
    spec = importlib.util.spec_from_file_location("fa2._C", so)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))

ULP32 = 2.0 ** -23


def reference(q, k, v, bias, scale, causal, wl, wr, softcap, dtype):
    """Attention in `dtype` (fp32 for the reference, q's dtype for the naive low-precision one). (B, S, H, D)."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    qt, kt, vt = (t.transpose(1, 2).to(dtype) for t in (q, k, v))
    if hk != h:
        kt = kt.repeat_interleave(h // hk, dim=1)
        vt = vt.repeat_interleave(h // hk, dim=1)
    s = torch.matmul(qt, kt.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        if bias.dtype == torch.bool:
            s = s.masked_fill(~bias, float("-inf"))
        else:
            s = s + bias.to(dtype)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    if causal:
        wr = 0 if wr < 0 else min(wr, 0)
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if wr >= 0:
        visible &= j <= i + sk - sq + wr
    if wl >= 0:
        visible &= j >= i + sk - sq - wl
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s.float(), dim=-1)  # (B, H, Sq), +inf convention below
    seen = torch.isfinite(lse)
    p = torch.softmax(s, dim=-1)
    p = torch.where(seen[..., None], p, torch.zeros_like(p))
    out = torch.matmul(p, vt).transpose(1, 2)
    lse = torch.where(seen, lse, torch.full_like(lse, float("inf")))
    return out, lse


def max_err(a, b):
    if a.numel() == 0:
        return 0.0
    a, b = a.double(), b.double()
    both_inf = torch.isinf(a) & torch.isinf(b) & (a.sign() == b.sign())
    d = torch.where(both_inf, torch.zeros_like(a), (a - b).abs())
    return d.max().item()


def make(shape, dtype, transposed=False):
    if transposed:  # (B, H, S, D) storage viewed as (B, S, H, D): any strides, no copy
        b, s, h, d = shape
        return torch.randn(b, h, s, d, device="cuda", dtype=dtype).transpose(1, 2)
    return torch.randn(shape, device="cuda", dtype=dtype)


def run_case(name, dtype, b, sq, sk, h, hk, d, causal=False, wl=-1, wr=-1, softcap=0.0, bias_kind=None,
             scale=None, transposed=False):
    q = make((b, sq, h, d), dtype, transposed)
    k = make((b, sk, hk, d), dtype, transposed)
    v = make((b, sk, hk, d), dtype, transposed)
    bias = None
    if bias_kind == "pad_f32":  # (B, 1, 1, Sk) float key padding
        bias = torch.zeros(b, 1, 1, sk, device="cuda")
        bias[..., sk - max(1, sk // 5):] = float("-inf") if sk > 1 else 0.0
        bias += torch.randn_like(bias) * 0.1
    elif bias_kind == "pad_lowp":
        bias = torch.randn(b, 1, 1, sk, device="cuda", dtype=dtype)
    elif bias_kind == "full_f32":
        bias = torch.randn(b, h, sq, sk, device="cuda") * 2
    elif bias_kind == "full_lowp":
        bias = torch.randn(b, h, sq, sk, device="cuda", dtype=dtype)
    elif bias_kind == "bcast_f32":  # (Sq, Sk) broadcast over batch and heads
        bias = torch.randn(sq, sk, device="cuda")
    elif bias_kind == "bool":
        bias = torch.rand(1, h, sq, sk, device="cuda") > 0.3
        if sq > 2:
            bias[:, :, 1, :] = False  # a row that sees nothing
    elif bias_kind == "pad_bool":
        bias = torch.ones(b, 1, 1, sk, device="cuda", dtype=torch.bool)
        bias[..., sk // 2:] = False
    elif bias_kind == "transposed_f32":  # column stride != 1
        bias = torch.randn(b, h, sk, sq, device="cuda").transpose(-1, -2)
    sc = scale if scale is not None else d ** -0.5
    try:
        out, lse = torch.ops.fa2.fwd(q, k, v, bias, scale, causal, wl, wr, softcap)
    except RuntimeError as e:
        if "no CUDA forward kernel" in str(e) or "no CUDA forward" in str(e):
            return "skip", str(e).splitlines()[0]
        raise
    torch.cuda.synchronize()
    ref_out, ref_lse = reference(q, k, v, bias, sc, causal, wl, wr, softcap, torch.float32)
    low_out, low_lse = reference(q, k, v, bias, sc, causal, wl, wr, softcap, dtype)
    ok = True
    msgs = []
    if torch.isnan(out).any() or torch.isnan(lse).any():
        ok = False
        msgs.append("NaN")
    if out.shape != (b, sq, h, d) or lse.shape != (b, h, sq) or not out.is_contiguous():
        ok = False
        msgs.append(f"shape/layout {tuple(out.shape)} {tuple(lse.shape)} contiguous={out.is_contiguous()}")
    e_out, e_low = max_err(out, ref_out), max_err(low_out, ref_out)
    bound = 2 * e_low + 4 * ULP32 * max(1.0, ref_out.abs().max().item() if ref_out.numel() else 0.0)
    if e_out > bound:
        ok = False
    e_lse, e_lse_low = max_err(lse, ref_lse), max_err(low_lse, ref_lse)
    # lse of the naive low-precision math is computed in fp32 from low-precision scores; floor at 1e-3 relative.
    finite = ref_lse[torch.isfinite(ref_lse)]
    lse_bound = 2 * e_lse_low + 1e-3 * max(1.0, finite.abs().max().item() if finite.numel() else 0.0)
    if e_lse > lse_bound:
        ok = False
    inf_mismatch = (torch.isinf(lse) != torch.isinf(ref_lse)).any().item() if lse.numel() else False
    if inf_mismatch:
        ok = False
        msgs.append("lse inf pattern differs")
    return ("ok" if ok else "FAIL"), (f"out {e_out:.2e} <= {bound:.2e}  lse {e_lse:.2e} <= {lse_bound:.2e} "
                                      + " ".join(msgs))


def cases(quick):
    B = [
        # name, b, sq, sk, h, hk, d, kwargs
        ("basic", 2, 128, 128, 4, 4, 64, {}),
        ("causal", 2, 256, 256, 4, 4, 64, dict(causal=True)),
        ("odd seqlens", 1, 97, 211, 3, 3, 128, {}),
        ("odd causal sq<sk", 1, 97, 211, 3, 3, 128, dict(causal=True)),
        ("causal sq>sk (empty rows)", 1, 300, 77, 2, 2, 64, dict(causal=True)),
        ("seqlen 1 / 1025, GQA", 2, 1, 1025, 4, 2, 64, {}),
        ("GQA 4:1 causal", 1, 1025, 1025, 8, 2, 128, dict(causal=True)),
        ("MQA", 2, 200, 333, 4, 1, 64, {}),
        ("headdim 59", 1, 333, 333, 2, 2, 59, dict(causal=True)),
        ("headdim 111", 1, 257, 190, 2, 2, 111, {}),
        ("headdim 8", 2, 64, 64, 2, 2, 8, {}),
        ("headdim 32", 1, 129, 129, 2, 2, 32, dict(causal=True)),
        ("headdim 96", 1, 77, 300, 4, 1, 96, {}),
        ("headdim 192", 1, 200, 300, 2, 2, 192, dict(causal=True)),
        ("headdim 256", 1, 256, 512, 2, 2, 256, {}),
        ("headdim 256 causal odd", 1, 301, 157, 2, 1, 256, dict(causal=True)),
        ("window 32/16", 1, 512, 512, 2, 2, 64, dict(wl=32, wr=16)),
        ("window left only", 1, 400, 300, 2, 2, 128, dict(wl=50)),
        ("window + causal", 1, 500, 500, 2, 2, 64, dict(causal=True, wl=100)),
        ("window 0/0", 1, 130, 130, 2, 2, 64, dict(wl=0, wr=0)),
        ("softcap", 2, 200, 200, 2, 2, 64, dict(softcap=5.0)),
        ("softcap causal d128", 1, 333, 333, 2, 2, 128, dict(softcap=2.0, causal=True)),
        ("pad bias f32", 2, 256, 256, 4, 4, 64, dict(bias_kind="pad_f32")),
        ("pad bias f32 d128 odd", 2, 177, 255, 4, 2, 128, dict(bias_kind="pad_f32")),
        ("full bias lowp", 1, 150, 170, 2, 2, 64, dict(bias_kind="full_lowp")),
        ("bcast bias f32 causal", 1, 150, 170, 2, 2, 128, dict(bias_kind="bcast_f32", causal=True)),
        ("bool bias (empty row)", 1, 100, 130, 2, 2, 64, dict(bias_kind="bool")),
        ("pad bool", 2, 128, 200, 2, 2, 128, dict(bias_kind="pad_bool")),
        ("transposed bias + softcap", 1, 90, 110, 2, 2, 64, dict(bias_kind="transposed_f32", softcap=3.0)),
        ("full bias f32 odd rows", 1, 177, 100, 2, 1, 64, dict(bias_kind="full_f32")),
        ("pad bias + negative scale", 2, 70, 90, 2, 2, 128, dict(bias_kind="pad_f32", scale=-0.1)),
        ("bool bias + softcap causal", 1, 150, 120, 2, 2, 128, dict(bias_kind="bool", softcap=4.0, causal=True)),
        ("pad bias lowp window", 2, 300, 300, 2, 2, 64, dict(bias_kind="pad_lowp", wl=40, wr=7)),
        ("custom scale", 1, 128, 128, 2, 2, 64, dict(scale=0.3)),
        ("negative scale", 1, 100, 100, 2, 2, 64, dict(scale=-0.2)),
        ("zero scale causal", 1, 100, 100, 2, 2, 64, dict(scale=0.0, causal=True)),
        ("transposed q/k/v", 2, 300, 300, 4, 4, 128, dict(transposed=True)),
        ("transposed causal GQA", 2, 257, 257, 4, 2, 64, dict(transposed=True, causal=True)),
        ("big", 2, 2048, 2048, 8, 8, 128, dict(causal=True)),
        ("seqlen_k 0", 1, 10, 0, 2, 2, 64, {}),
        ("seqlen_q 0", 1, 0, 10, 2, 2, 64, {}),
    ]
    return B[:12] if quick else B


PROBES = {
    # Bad input must raise a Python exception, never crash the process (run in a subprocess each).
    "cuda dtype mismatch": "q = torch.randn(1, 8, 2, 64, device='cuda', dtype=torch.float16); "
                           "torch.ops.fa2.fwd(q, q.bfloat16(), q, None, None, False, -1, -1, 0.0)",
    "cuda bad window": "q = torch.randn(1, 8, 2, 64, device='cuda', dtype=torch.float16); "
                       "torch.ops.fa2.fwd(q, q, q, None, None, False, -5, -1, 0.0)",
    "cpu dtype mismatch": "q = torch.randn(1, 8, 2, 64); torch.ops.fa2.fwd(q, q.double(), q, None, None, False, -1, -1, 0.0)",
    "python-level error": "raise RuntimeError('expected')",
}


def probe_errors():
    import subprocess
    import os
    here = os.path.abspath(__file__)
    n_crash = 0
    for name, code in PROBES.items():
        prog = (f"import sys, runpy; sys.argv = ['x', '--noop']; g = runpy.run_path({here!r}, run_name='probe'); "
                f"import torch\ntry:\n    {code}\n    print('NO ERROR')\n"
                f"except Exception as e:\n    print('raised', type(e).__name__, str(e).splitlines()[0][:150])")
        r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120)
        out = (r.stdout.strip().splitlines() or [""])[-1]
        crashed = r.returncode != 0
        n_crash += crashed
        print(f"{'CRASH' if crashed else 'ok':5s} probe {name:22s} rc={r.returncode} {out} {r.stderr.strip()[-300:] if crashed else ''}",
              flush=True)
    return n_crash


def main():
    quick = "--quick" in sys.argv
    if "--probe-errors" in sys.argv:
        sys.exit(1 if probe_errors() else 0)
    torch.manual_seed(0)
    n_fail = n_ok = n_skip = 0
    t0 = time.time()
    for dtype in (torch.float16, torch.bfloat16):
        for name, b, sq, sk, h, hk, d, kw in cases(quick):
            try:
                status, msg = run_case(name, dtype, b, sq, sk, h, hk, d, **kw)
            except Exception as e:  # noqa: BLE001
                status, msg = "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0]}"
            tag = str(dtype).replace("torch.", "")
            print(f"{status:4s} {tag:8s} {name:28s} b{b} sq{sq} sk{sk} h{h}/{hk} d{d} {kw}  {msg}", flush=True)
            n_fail += status == "FAIL"
            n_ok += status == "ok"
            n_skip += status == "skip"
    print(f"cuda_fwd_check: {n_ok} ok, {n_fail} failed, {n_skip} skipped (headdim not built) "
          f"in {time.time() - t0:.1f} s")
    sys.exit(1 if n_fail else 0)


if __name__ == "__main__":
    main()
