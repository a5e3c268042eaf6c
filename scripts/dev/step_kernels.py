"""The CUDA kernels of one call and their times (torch.profiler, the kernels' own time per call), to see where a step's
time goes before changing a kernel:
  --backward   a training step (forward + backward, bf16, 16k tokens, hidden 2048) of fa2 beside FlashAttention-4
               (flash_attn.cute, where installed: docs/performance.md) at D 128 S 16k / 2k causal, D 64 S 16k / 8k
               causal: whether fa2's gap to FA-4 is in the main backward kernel or around it (docs/fa4-study.md,
               item 1); or the given cases instead, D:S[:c] each (c: causal), e.g. --backward 128:2048 128:2048:c
  --forward    the forward's kernels of one call (bf16, 16k tokens, hidden 2048) at D 64 / 128, S 1k / 2k, causal
               both: without sinks, with sinks (learned, fp32) and varlen on the same tokens (equal lengths): where the
               sinks' cost (0.96-0.98 of fa2 without them at 1k causal, docs/tuning.md "Sinks") and varlen's gap at
               D 128 (0.96 of dense) lie, in the kernel or around it
  --decode     one decode step (fa2.attention_with_kvcache, seqlen_q 1, GQA 32 / 8, bf16, a contiguous cache) at the
               shapes where fa2 trails cuDNN: which kernels a step launches (decode, combine, anything else) and each
               one's time
Usage: PYTHONPATH=python python3 scripts/dev/step_kernels.py --backward [D:S[:c] ...] | --forward | --decode
"""
from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

import fa2


def kernel_table(fn, calls, label):
    """fn() warmed up, then `calls` calls profiled: each CUDA kernel's time per call, longest first."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    print(f"== {label}")
    rows = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    for e in sorted(rows, key=lambda e: -e.self_device_time_total)[:8]:
        print(f"  {e.self_device_time_total / calls:9.1f} us/call  x{e.count / calls:<4.1f} {e.key[:100]}")


def backward(cases):
    try:
        from flash_attn.cute import flash_attn_func
    except ImportError as e:
        flash_attn_func = None
        print(f"(FA-4 not importable: {e})")
    for d, s, causal in cases or ((128, 16384, False), (128, 2048, True), (64, 16384, False), (64, 8192, True)):
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        g = torch.randn_like(q)
        impls = [("fa2", lambda: fa2.attention(q, k, v, causal=causal))]
        if flash_attn_func is not None:
            impls.append(("fa4", lambda: flash_attn_func(q, k, v, causal=causal)[0]))
        for name, f in impls:
            kernel_table(lambda: torch.autograd.grad(f(), (q, k, v), g), 5, f"{name} D{d} S{s} causal={causal}")


def forward():
    for d in (64, 128):
        for s in (1024, 2048):
            for causal in (False, True):
                b, h = 16384 // s, 2048 // d
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                sinks = torch.randn(h, device="cuda", requires_grad=True)
                packed = [t.reshape(b * s, h, d) for t in (q, k, v)]
                cu = torch.arange(0, (b + 1) * s, s, device="cuda", dtype=torch.int32)
                for name, f in (("plain", lambda: fa2.attention(q, k, v, causal=causal)),
                                ("sinks", lambda: fa2.attention(q, k, v, causal=causal, sinks=sinks)),
                                ("varlen", lambda: fa2.varlen_attention(*packed, cu, cu, s, s, causal=causal))):
                    with torch.no_grad():
                        kernel_table(f, 20, f"fwd D{d} S{s} causal={causal} {name}")


def decode():
    for d, batch, n in ((64, 1, 512), (64, 1, 8192), (128, 16, 512), (64, 256, 512), (64, 1, 131072),
                        (128, 1, 131072)):
        q = torch.randn(batch, 1, 32, d, device="cuda", dtype=torch.bfloat16)
        k_cache, v_cache = (torch.randn(batch, n, 8, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        seqlens = torch.full((batch,), n, device="cuda", dtype=torch.int32)
        kernel_table(lambda: fa2.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens), 20,
                     f"decode D{d} batch {batch} cache {n}")


def main():
    if "--backward" in sys.argv:
        cases = [tuple(int(x) for x in a.split(":")[:2]) + (a.endswith(":c"),) for a in sys.argv[2:]]
        backward(cases)
    elif "--forward" in sys.argv:
        forward()
    elif "--decode" in sys.argv:
        decode()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
