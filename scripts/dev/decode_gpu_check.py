"""The CUDA decode kernel alone (torch.ops.fa2._decode_attention): a correctness sweep against fp32 math, and a
bandwidth micro-benchmark.

Check (default): contiguous / paged (16, 48, 64, 256) caches, cache_batch_idx, GQA 32/8 and MHA, seqlen_q 1..8 (and
64 rows per kv head), cache lengths 0, 1, tile edges, odd values up to 70k, causal / windows / softcap, headdims
32..256 (80: an instance's predicated columns), bf16 / fp16, num_splits 0 / 1 / 3 / 128. Cases: tests/decode_samples.py;
rule: tests/numerics.py. One line per case (max error, or what failed with shapes), a summary; exit 1 on a failure.

Bench (--bench): decode (seqlen_q 1, bf16) over batch 1..256 x cache 512..128k x d 64/128 x GQA 32/8, contiguous
(--paged N: pages of N keys): bytes of K/V read / time, against a torch copy of the same bytes on the device
(read + write / time), one line per shape.

Usage: PYTHONPATH=python python3 scripts/dev/decode_gpu_check.py [--quick] [--bench [--paged N] [--quick]]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import fa2  # noqa: F401  (registers torch.ops.fa2.*)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from decode_samples import cases, run_case  # noqa: E402


def check(quick):
    torch.manual_seed(0)
    failed = n = 0
    start = time.time()
    for name, kw in cases(quick):
        n += 1
        try:
            err = run_case(name, **kw)
            print(f"ok    {name}  (max err {err:.3g})")
        except Exception as e:  # noqa: BLE001  (every failure is reported, the sweep goes on)
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {str(e)[:600]}")
    print(f"{n - failed}/{n} decode cases passed in {time.time() - start:.0f} s")
    return failed == 0


def time_ms(fn, iters):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def copy_bandwidth(nbytes):
    """GB/s of a device copy of nbytes (read + write counted)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 20)
    return 2 * nbytes / ms / 1e6


def bench(quick, page):
    h, hk = 32, 8
    batches = (1, 16, 256) if quick else (1, 4, 16, 64, 256)
    caches = (512, 8192, 131072) if quick else (512, 2048, 8192, 32768, 131072)
    limit = 16 << 30  # bytes of K + V per shape
    ref_copy = copy_bandwidth(1 << 30)
    print(f"device copy bandwidth (1 GiB, read + write): {ref_copy:.0f} GB/s")
    print(f"{'d':>4} {'batch':>5} {'cache':>7} {'MB':>8} {'us':>9} {'GB/s':>7} {'copy GB/s':>9} {'% copy':>6}")
    for d in (64, 128):
        for batch in batches:
            for n in caches:
                kv_bytes = 2 * batch * n * hk * d * 2
                if kv_bytes > limit:
                    continue
                q = torch.randn(batch, 1, h, d, device="cuda", dtype=torch.bfloat16)
                kw = {}
                if page:
                    blocks = batch * (n // page)
                    k = torch.randn(blocks, page, hk, d, device="cuda", dtype=torch.bfloat16)
                    kw["block_table"] = torch.randperm(blocks, device="cuda").to(torch.int32).view(batch, -1)
                else:
                    k = torch.randn(batch, n, hk, d, device="cuda", dtype=torch.bfloat16)
                v = torch.randn_like(k)
                lens = torch.full((batch,), n, dtype=torch.int32, device="cuda")
                ms = time_ms(lambda: torch.ops.fa2._decode_attention(q, k, v, lens, **kw), 20)
                gbs = kv_bytes / ms / 1e6
                copy = copy_bandwidth(kv_bytes) if kv_bytes >= (1 << 20) else float("nan")
                print(f"{d:>4} {batch:>5} {n:>7} {kv_bytes / 1e6:>8.1f} {ms * 1e3:>9.1f} {gbs:>7.0f} {copy:>9.0f} "
                      f"{100 * gbs / ref_copy:>5.0f}%")
                del q, k, v, kw


def main():
    quick = "--quick" in sys.argv
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, fa2 kernels: "
          f"{[k for k in fa2._C.build_info()['kernels'].split(',') if k.startswith('decode')]}")
    if "--bench" in sys.argv:
        page = int(sys.argv[sys.argv.index("--paged") + 1]) if "--paged" in sys.argv else 0
        bench(quick, page)
        return
    sys.exit(0 if check(quick) else 1)


if __name__ == "__main__":
    main()
