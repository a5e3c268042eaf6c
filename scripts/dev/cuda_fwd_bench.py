"""Forward speed of fa2 (torch.ops.fa2.fwd) against torch's FlashAttention-2 (SDPA, FLASH_ATTENTION backend),
for scripts/gpu_check.sh. The FA-2 paper's grid: 16k tokens (batch = 16384 / seqlen), hidden 2048
(nheads = 2048 / headdim), bf16; forward FLOPs = 4 * B * H * S^2 * D, half of it when causal.
Timing: triton.testing.do_bench (median ms), fresh random inputs, both in the same run; reported as ratios.
Also fa2 with a (B, 1, 1, S) float key-padding bias against fa2 unmasked (bar: >= 0.9).
Usage: PYTHONPATH=python python3 scripts/dev/cuda_fwd_bench.py [--quick] [--json PATH]
"""
from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

try:
    import fa2  # noqa: F401
except Exception as e:  # noqa: BLE001
    print(f"note: 'import fa2' failed ({type(e).__name__}: {e}); loading fa2._C directly")
    import glob
    import importlib.util
    import os

    so = glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "python", "fa2", "_C*.so"))[0]
    spec = importlib.util.spec_from_file_location("fa2._C", so)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def main():
    quick = "--quick" in sys.argv
    dtype = torch.bfloat16
    seqlens = [1024, 4096, 16384] if quick else [1024, 2048, 4096, 8192, 16384]
    rows = []
    print(f"{'D':>4} {'S':>6} {'causal':>6} | {'fa2':>7} {'torchFA2':>8} {'ratio':>6} | {'fa2+pad':>7} {'ratio':>6}")
    for d in (64, 128):
        h = 2048 // d
        for s in seqlens:
            b = max(1, 16384 // s)
            for causal in (False, True):
                q = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
                k = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
                v = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
                qt, kt, vt = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                ms_fa2 = do_bench(lambda: torch.ops.fa2.fwd(q, k, v, None, None, causal, -1, -1, 0.0),
                                  warmup=25, rep=100)
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    ms_ref = do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                                      warmup=25, rep=100)
                row = dict(d=d, s=s, b=b, h=h, causal=causal, fa2_tflops=tflops(flops, ms_fa2),
                           torch_fa2_tflops=tflops(flops, ms_ref))
                row["ratio"] = row["fa2_tflops"] / row["torch_fa2_tflops"]
                pad = ""
                if not causal and s <= 8192:
                    bias = torch.zeros(b, 1, 1, s, device="cuda")
                    bias[..., s - s // 8:] = float("-inf")  # padded keys; the rest visible
                    ms_pad = do_bench(lambda: torch.ops.fa2.fwd(q, k, v, bias, None, False, -1, -1, 0.0),
                                      warmup=25, rep=100)
                    row["fa2_pad_tflops"] = tflops(flops, ms_pad)
                    row["pad_ratio"] = ms_fa2 / ms_pad
                    pad = f"{row['fa2_pad_tflops']:7.1f} {row['pad_ratio']:6.2f}"
                rows.append(row)
                print(f"{d:4d} {s:6d} {str(causal):>6} | {row['fa2_tflops']:7.1f} {row['torch_fa2_tflops']:8.1f} "
                      f"{row['ratio']:6.2f} | {pad}", flush=True)
                del q, k, v, qt, kt, vt
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, dtype=str(dtype), rows=rows),
                      f, indent=1)
    worst = min(r["ratio"] for r in rows)
    print(f"cuda_fwd_bench: worst fa2 / torch FA-2 ratio {worst:.2f}")


if __name__ == "__main__":
    main()
