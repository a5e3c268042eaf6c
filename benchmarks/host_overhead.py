"""Host time per attention call: fa2 against PyTorch's SDPA.

Why: bench_attention.py times each call with triton's do_bench (CUDA events around one call, the L2 flushed before
it). When the host needs longer to issue a call than the GPU needs for the flush and the call, the GPU waits for the
launches and the events time the host; in training the same host time is lost wherever the GPU runs ahead of it.

--device cpu (runs anywhere): host microseconds per call at a tiny shape, where the CPU kernels' own work is a few
  microseconds: forward with and without requires_grad inputs, and forward + backward (torch.autograd.grad).
--device cuda, for one shape:
  enqueue_us  host time to issue one call while the GPU is held busy (torch.cuda._sleep in front), so nothing waits
  gpu_us      GPU time per call, back to back (CUDA events around n calls, no flush)
  bench_us    do_bench's median, as the grid measures (needs triton)
Usage: python benchmarks/host_overhead.py [--device cpu|cuda] [--dim 128] [--seqlen 1024] [--causal] [--dtype bf16]
       [--impls fa2,cudnn,torch-fa2] [--no-grad]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

SDPA = {"cudnn": "CUDNN_ATTENTION", "torch-fa2": "FLASH_ATTENTION", "sdpa": None}


def make_call(impl, q, k, v, causal):
    """f() running impl on the (B, H, S, D) tensors q, k, v."""
    if impl == "fa2":
        import fa2
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (as bench_attention.py: flash-attn layout views)
        return lambda: fa2.attention(qt, kt, vt, causal=causal).transpose(1, 2)
    if SDPA[impl] is None:  # whichever backend SDPA picks (the CPU has one)
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, SDPA[impl])

    def call():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return call


def host_us(fn, n=1000, rounds=3):
    """Best of rounds of the mean host time per call over n calls (after a warm-up)."""
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def cpu_report(impls, causal):
    torch.set_num_threads(1)
    q, k, v = (torch.randn(1, 1, 8, 16).requires_grad_() for _ in range(3))
    dout = torch.randn(1, 1, 8, 16)
    print(f"CPU host time per call (us), (1, 1, 8, 16) float32, causal {causal}, torch {torch.__version__}")
    print(f"{'impl':10s} {'fwd':>8s} {'fwd grad':>9s} {'fwd+bwd':>8s}")
    for impl in impls:
        fn = make_call(impl, q, k, v, causal)
        with torch.no_grad():
            fwd = host_us(fn)
        fwd_grad = host_us(fn)
        fwd_bwd = host_us(lambda: torch.autograd.grad(fn(), (q, k, v), dout))
        print(f"{impl:10s} {fwd:8.1f} {fwd_grad:9.1f} {fwd_bwd:8.1f}")


def enqueue_us(fn, n):
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # ~1 s of GPU time in front: every launch below only queues
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def gpu_us(fn, n):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(1e8))  # (so that the host runs ahead of the first call)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n * 1e3


def cuda_report(args):
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    b, h = args.tokens // args.seqlen, args.hidden // args.dim
    q, k, v = (torch.randn(b, h, args.seqlen, args.dim, device="cuda", dtype=dtype).requires_grad_(not args.no_grad)
               for _ in range(3))
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    flops = 4 * b * h * args.seqlen ** 2 * args.dim / (2 if args.causal else 1)
    print(f"{torch.cuda.get_device_name()}: B {b} H {h} S {args.seqlen} D {args.dim} causal {args.causal} "
          f"{args.dtype} requires_grad {not args.no_grad}")
    for impl in args.impls.split(","):
        fn = make_call(impl, q, k, v, args.causal)
        fn()
        host = min(enqueue_us(fn, args.n) for _ in range(3))
        gpu = min(gpu_us(fn, args.n) for _ in range(3))
        bench = do_bench(fn, warmup=5, rep=20, return_mode="median") * 1e3 if do_bench else float("nan")
        print(f"{impl:10s} enqueue {host:7.1f} us  gpu {gpu:7.1f} us ({flops / gpu / 1e6:5.0f} TFLOP/s)  "
              f"do_bench {bench:7.1f} us ({flops / bench / 1e6:5.0f} TFLOP/s)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--impls", help="fa2,sdpa on the CPU; fa2,cudnn,torch-fa2 on CUDA (default)")
    p.add_argument("--n", type=int, default=50, help="calls per CUDA measurement")
    p.add_argument("--no-grad", action="store_true", help="CUDA: inputs without requires_grad (the grid's require it)")
    args = p.parse_args(argv)
    if args.device == "cpu":
        cpu_report((args.impls or "fa2,sdpa").split(","), args.causal)
    else:
        args.impls = args.impls or "fa2,cudnn,torch-fa2"
        cuda_report(args)


if __name__ == "__main__":
    main()
