"""Which kernels cuDNN's SDPA runs on this GPU (name, duration, grid, block, shared memory, registers) for a few
shapes of the benchmark grid (bf16, 16k tokens, hidden 2048), forward + backward, read from the torch profiler's trace.
Run on a GPU machine: python3 scripts/dev/cudnn_kernels.py
(benchmarks/results/profile_h200-20261201-cudnn-kernels.json holds its H200 output.)"""
import json
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.profiler import profile, ProfilerActivity


def run(S, D, causal):
    B, H = 16384 // S, 2048 // D
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(3):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            o.sum().backward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            o.sum().backward()
            torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
            ev = json.load(trace)["traceEvents"]
    print(f"== S {S} D {D} causal {causal}")
    for e in ev:
        name = e.get("name", "")
        if e.get("cat") == "kernel" and ("cudnn" in name or "sdpa" in name.lower() or "flash" in name.lower()):
            a = e.get("args", {})
            print(f"  {e['dur']:8.1f} us grid {a.get('grid')} block {a.get('block')} smem {a.get('shared memory')} "
                  f"regs {a.get('registers per thread')} {name[:110]}")


if __name__ == "__main__":
    for S, D, c in [(1024, 128, True), (2048, 128, False), (16384, 128, False), (1024, 256, False), (1024, 64, False)]:
        run(S, D, c)
