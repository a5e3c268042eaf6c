"""The fa2 calls scripts/dev/gpu_profile.sh puts under Nsight Compute: one named case per run, two warm-up calls and
then the profiled one (gpu_profile.sh skips the warm-ups' kernels). 4 x 16 heads x 4096 tokens, bf16, non-causal.
  fwd-d64 / fwd-d64-pad / fwd-d128 / fwd-d128-pad   forward, without / with a (B, 1, 1, S) padding bias (bf16)
  fwd-d64-c1k / fwd-d64-c1k-sinks                   the forward at 16 x 32 heads x 1024 tokens, causal, without / with
                                                    sinks (fp32): the sinks' cost where it is largest (tuning.md "Sinks")
  fwd-d128-varlen                                   fwd-d128's tokens as 4 packed sequences of 4096 (varlen_fwd): the
                                                    varlen kernel beside the dense one (equal lengths)
  bwd-d64 / bwd-d128                                the backward (default instances: sm_90a wgmma on an H100/H200)
  bwd80-d64 / bwd80-d128                            the backward with its sm_90a instances off (fa2.dev option sm90_backward)
  bwd-d256                                          the d 256 backward (its warp-specialized headdim-split kernel)
  cudnn-fwd-d128 / cudnn-bwd-d128 / cudnn-bwd-d256  the same calls through SDPA's cuDNN backend, for a side-by-side
                                                    profile (gpu_profile.sh picks cuDNN's fprop / bprop kernel)
  fa4-fwd-d64 / fa4-fwd-d128 / fa4-bwd-d64 / fa4-bwd-d128
                                                    the same calls through FlashAttention-4 (flash_attn.cute, installed
                                                    from .fa4: docs/performance.md); gpu_profile.sh picks its sm90 kernels
  decode-d64 / decode-d128 / cudnn-decode-d64 / cudnn-decode-d128
                                                    one decode step (seqlen_q 1, GQA 32 / 8, batch 1, a contiguous cache
                                                    of 128k keys): fa2.attention_with_kvcache's decode kernel, and SDPA
                                                    (cuDNN) on (B, H, N, D) views of the same cache
Usage: PYTHONPATH=python python3 scripts/dev/profile_cases.py CASE   (or --list)
"""
from __future__ import annotations

import sys

import torch

import fa2

CASES = ("fwd-d64", "fwd-d64-pad", "fwd-d64-c1k", "fwd-d64-c1k-sinks", "fwd-d128-varlen", "fwd-d128", "fwd-d128-pad", "bwd-d64", "bwd-d128", "bwd80-d64", "bwd80-d128",
         "bwd-d256", "cudnn-fwd-d128", "cudnn-bwd-d128", "cudnn-bwd-d256", "fa4-fwd-d64", "fa4-fwd-d128", "fa4-bwd-d64",
         "fa4-bwd-d128", "decode-d64", "decode-d128", "cudnn-decode-d64", "cudnn-decode-d128")


def decode_step(case, d):
    """Three decode steps (the third profiled): q (1, 1, 32, d) against a (1, 128k, 8, d) bf16 cache."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 1, 32, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k_cache, v_cache = (torch.randn(1, 131072, 8, d, device="cuda", dtype=torch.bfloat16, generator=g)
                        for _ in range(2))
    seqlens = torch.full((1,), 131072, device="cuda", dtype=torch.int32)
    for _ in range(3):
        if case.startswith("cudnn"):
            import torch.nn.functional as F
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                F.scaled_dot_product_attention(q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                                               enable_gqa=True)
        else:
            fa2.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    torch.cuda.synchronize()
    print(f"profile_cases: {case} done")


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in CASES + ("--list",):
        sys.exit(f"usage: profile_cases.py CASE | --list   (CASE: {', '.join(CASES)})")
    if sys.argv[1] == "--list":
        print(" ".join(CASES))
        return
    case = sys.argv[1]
    d = 64 if case.endswith("d64") or "d64-" in case else 256 if case.endswith("d256") else 128
    if "decode" in case:
        decode_step(case, d)
        return
    b, s, h = (16, 1024, 32) if "-c1k" in case else (4, 4096, 16)
    causal = "-c1k" in case
    g = torch.Generator(device="cuda").manual_seed(0)
    sinks = torch.randn(h, device="cuda", generator=g) if case.endswith("-sinks") else None
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    bias = None
    if case.endswith("-pad"):
        bias = torch.zeros(b, 1, 1, s, device="cuda", dtype=torch.bfloat16)
        bias[..., s - 300:] = -float("inf")  # the last 300 keys padded
    if case.startswith("cudnn"):  # SDPA's cuDNN backend on (B, H, S, D) views of the same leaves
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def attention(q, k, v):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
    elif case.startswith("fa4"):  # its compilations (first call) launch nothing that the kernel pattern matches
        from flash_attn.cute import flash_attn_func

        def attention(q, k, v):
            return flash_attn_func(q, k, v)[0]
    else:
        def attention(q, k, v):
            return fa2.attention(q, k, v)
    if "fwd" in case:
        for _ in range(3):
            if case.startswith(("cudnn", "fa4")):
                attention(q, k, v)
            elif case.endswith("-varlen"):
                cu = torch.arange(0, (b + 1) * s, s, device="cuda", dtype=torch.int32)
                torch.ops.fa2.varlen_fwd(*(t.reshape(b * s, h, d) for t in (q, k, v)), cu, cu, s, s)
            else:
                torch.ops.fa2.fwd(q, k, v, bias, causal=causal, sinks=sinks)
    else:
        fa2.dev.set_options(sm90_backward=not case.startswith("bwd80"))
        for t in (q, k, v):
            t.requires_grad_()
        out = attention(q, k, v)
        dout = torch.randn_like(out)
        for _ in range(3):
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize()
    print(f"profile_cases: {case} done")


if __name__ == "__main__":
    main()
