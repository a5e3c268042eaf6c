"""Runs small fa2 CUDA calls one per subprocess, so a crash (segfault, abort) is pinned to one case instead of
taking a whole pytest session down. For the first crashing case, prints a native backtrace via cuda-gdb when
available. Usage: python scripts/dev/gpu_probe.py"""
from __future__ import annotations

import shutil
import subprocess
import sys

PRELUDE = """
import os, torch, fa2
dev = os.environ.get('FA2_PROBE_DEVICE', 'cuda')
bf = torch.bfloat16 if dev == 'cuda' else torch.float32
def qkv(b, sq, sk, h, hk, d, dt=bf, grad=False):
    mk = lambda s, hh: torch.randn(b, s, hh, d, device=dev, dtype=dt).requires_grad_(grad)
    return mk(sq, h), mk(sk, hk), mk(sk, hk)
"""

CASES = {
    "ok": "q,k,v = qkv(1, 64, 64, 2, 2, 64); fa2.attention(q, k, v)",
    "err fp32 on cuda": "q = torch.randn(1, 4, 2, 16, device=dev); fa2.attention(q, q, q)",
    "err dtype mismatch": "q,k,v = qkv(1, 8, 8, 2, 2, 16); fa2.attention(q, k.half(), v)",
    "err window": "q,k,v = qkv(1, 8, 8, 2, 2, 16); fa2.attention(q, k, v, window_left=-5)",
    "err device": "q,k,v = qkv(1, 8, 8, 2, 2, 16); fa2.attention(q, k.cpu(), v.cpu())",
    "headdim 1": "q,k,v = qkv(1, 17, 17, 3, 3, 1, grad=True); fa2.attention(q, k, v).sum().backward()",
    "batch 0": "q,k,v = qkv(0, 5, 5, 2, 2, 16, grad=True); fa2.attention(q, k, v).sum().backward()",
    "seqlen_q 0": "q,k,v = qkv(1, 0, 5, 2, 2, 16, grad=True); fa2.attention(q, k, v).sum().backward()",
    "seqlen_k 0": "q,k,v = qkv(1, 5, 0, 2, 2, 16, grad=True); fa2.attention(q, k, v).sum().backward()",
    "headdim 256 odd": "q,k,v = qkv(2, 3, 7, 4, 2, 256, grad=True); fa2.attention(q, k, v).sum().backward()",
    "bias 2d": "q,k,v = qkv(1, 97, 113, 2, 2, 64, grad=True); b = torch.randn(97, 113, device=dev, dtype=bf, requires_grad=True); fa2.attention(q, k, v, b).sum().backward()",
    "bias padding": "q,k,v = qkv(2, 97, 113, 2, 2, 64, grad=True); b = torch.zeros(2, 1, 1, 113, device=dev, dtype=bf); fa2.attention(q, k, v, b).sum().backward()",
    "sum backward (stride-0 dout)": "q,k,v = qkv(2, 64, 64, 4, 2, 64, grad=True); fa2.attention(q, k, v, causal=True).sum().backward()",
    "deterministic": "q,k,v = qkv(2, 193, 257, 4, 2, 64, grad=True)\nwith fa2.deterministic():\n    fa2.attention(q, k, v, causal=True).sum().backward()",
    "opcheck fwd": "q,k,v = qkv(1, 33, 65, 2, 1, 64, grad=True); torch.library.opcheck(torch.ops.fa2.fwd.default, (q, k, v))",
    "compile": "q,k,v = qkv(2, 64, 64, 4, 2, 64, grad=True); torch.compile(fa2.attention, fullgraph=True)(q, k, v, causal=True).sum().backward()",
}


def main() -> int:
    crashed = []
    for name, body in CASES.items():
        code = PRELUDE + body + "\n(torch.cuda.synchronize() if dev == 'cuda' else None); print('PROBE-OK')"
        r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True,
                           timeout=300)
        if r.returncode == 0:
            verdict = "ok"
        elif r.returncode < 0:
            verdict = f"CRASH (signal {-r.returncode})"
            crashed.append((name, code, r.stderr))
        else:
            last = [l for l in r.stderr.strip().splitlines() if l.strip()][-1:] or ["?"]
            verdict = f"exception: {last[0][:160]}"
        print(f"{name:<30} {verdict}", flush=True)
    for name, code, err in crashed[:1]:
        print(f"\n=== first crash: {name}\n{err[-3000:]}")
        if shutil.which("cuda-gdb"):
            with open("/tmp/fa2_probe_case.py", "w") as f:
                f.write(code)
            bt = subprocess.run(["cuda-gdb", "-q", "-batch", "-ex", "run", "-ex", "bt 25", "--args", sys.executable,
                                 "/tmp/fa2_probe_case.py"], capture_output=True, text=True, timeout=300)
            lines = [l for l in bt.stdout.splitlines() if l.startswith("#") or "signal" in l.lower()]
            print("\n".join(lines[:40]))
    print(f"gpu_probe: {len(crashed)} crashing case(s)")
    return 1 if crashed else 0


if __name__ == "__main__":
    raise SystemExit(main())
