"""The CUDA decode kernel alone (torch.ops.fa2._decode_attention): a correctness sweep against fp32 math, and a
bandwidth micro-benchmark.

Check (default): contiguous / paged (16, 48, 64, 256) caches, cache_batch_idx, GQA 32/8 and MHA, seqlen_q 1..8 (and
64 rows per kv head), cache lengths 0, 1, tile edges, odd values up to 70k, causal / windows / softcap, headdims
32..256 (80: an instance's predicated columns), bf16 / fp16, num_splits 0 / 1 / 3 / 128. Cases: tests/decode_samples.py;
rule: tests/numerics.py. One line per case (max error, or what failed with shapes), a summary; exit 1 on a failure.

Bench (--bench): decode (seqlen_q 1, bf16) over batch 1..256 x cache 512..128k x d 64/128 x GQA 32/8 (--mha:
32/32), contiguous (--paged N: pages of N keys): bytes of K/V read / time (eager calls, and CUDA-graph replays: the
kernels alone), against the device's copy bandwidth (a 1 GiB torch copy, read + write / time); one line per shape
(--json F: also as JSON).

Usage: PYTHONPATH=python python3 scripts/dev/decode_gpu_check.py [--quick] [--part I/N (every N-th case from the I-th)]
       PYTHONPATH=python python3 scripts/dev/decode_gpu_check.py --bench [--paged N] [--mha] [--quick] [--json F]
       PYTHONPATH=python python3 scripts/dev/decode_gpu_check.py --splits 0,8,16,33,66,128 [--shape D,BATCH,CACHE]
                                                                 [--paged N]   (one shape at each forced num_splits)
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

import fa2  # noqa: F401  (registers torch.ops.fa2.*)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_common import copy_bandwidth, decode_inputs, graph_time_ms, mean_time_ms  # noqa: E402
from decode_samples import cases, run_case  # noqa: E402


def check(quick, part, parts):
    torch.manual_seed(0)
    failed = n = 0
    start = time.time()
    for index, (name, kw) in enumerate(cases(quick)):
        if index % parts != part:
            continue
        n += 1
        try:
            err = run_case(name, **kw)
            print(f"ok    {name}  (max err {err:.3g})")
        except Exception as e:  # noqa: BLE001  (every failure is reported, the sweep goes on)
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {str(e)[:600]}")
    print(f"{n - failed}/{n} decode cases passed in {time.time() - start:.0f} s")
    return failed == 0


def bench(quick, page, json_path, mha):
    h, hk = (32, 32) if mha else (32, 8)
    batches = (1, 16, 256) if quick else (1, 4, 16, 64, 256)
    caches = (512, 8192, 131072) if quick else (512, 2048, 8192, 32768, 131072)
    limit = 16 << 30  # bytes of K + V per shape (MHA: the larger shapes are left out)
    ref_copy = copy_bandwidth(1 << 30)
    print(f"device copy bandwidth (1 GiB, read + write): {ref_copy:.0f} GB/s; cache layout: "
          f"{f'paged, {page} keys a block' if page else 'contiguous'}; GQA {h}/{hk}, seqlen_q 1, bf16")
    print("(graph: CUDA-graph replays, the kernels alone; caches below the 50 MB L2 are partly read from it)")
    print(f"{'d':>4} {'batch':>5} {'cache':>7} {'MB':>8} {'eager us':>9} {'graph us':>9} {'GB/s':>6} {'% copy':>6}")
    rows = []
    for d in (64, 128):
        for batch in batches:
            for n in caches:
                kv_bytes = 2 * batch * n * hk * d * 2
                if kv_bytes > limit:
                    continue
                q, k, v, lens, kw = decode_inputs(batch, n, h, hk, d, page)

                def call():
                    return torch.ops.fa2._decode_attention(q, k, v, lens, **kw)

                eager_ms = mean_time_ms(call, 20)
                ms = graph_time_ms(call, 20)
                gbs = kv_bytes / ms / 1e6
                print(f"{d:>4} {batch:>5} {n:>7} {kv_bytes / 1e6:>8.1f} {eager_ms * 1e3:>9.1f} {ms * 1e3:>9.1f} "
                      f"{gbs:>6.0f} {100 * gbs / ref_copy:>5.0f}%")
                rows.append(dict(headdim=d, batch=batch, cache=n, nheads=h, nheads_k=hk, page=page,
                                 kv_bytes=kv_bytes, eager_us=eager_ms * 1e3, graph_us=ms * 1e3, gbps=gbs,
                                 copy_gbps=ref_copy))
                del q, k, v, kw
    if json_path:
        with open(json_path, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)
        print(f"wrote {json_path}")


def sweep_splits(splits, d, batch, n, page):
    """Achieved bandwidth of one shape (GQA 32/8, bf16) at each forced num_splits (0: the library's choice), CUDA-graph
    replays: to check choose_splits where a shape misses its bandwidth goal."""
    h, hk = 32, 8
    ref_copy = copy_bandwidth(1 << 30)
    q, k, v, lens, kw = decode_inputs(batch, n, h, hk, d, page)
    kv_bytes = 2 * batch * n * hk * d * 2
    print(f"d {d}, batch {batch}, cache {n} ({kv_bytes / 1e6:.1f} MB){f', paged {page}' if page else ''}; "
          f"copy {ref_copy:.0f} GB/s")
    for splits in splits:
        ms = graph_time_ms(lambda: torch.ops.fa2._decode_attention(q, k, v, lens, num_splits=splits, **kw), 20)
        gbs = kv_bytes / ms / 1e6
        print(f"  num_splits {splits:>4}: {ms * 1e3:8.1f} us  {gbs:6.0f} GB/s  {100 * gbs / ref_copy:5.1f}% of copy")


def main():
    quick = "--quick" in sys.argv
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, fa2 kernels: "
          f"{[k for k in fa2._C.build_info()['kernels'].split(',') if k.startswith('decode')]}")
    if "--splits" in sys.argv:  # --splits 0,8,16,33,66,128 [--shape D,BATCH,CACHE] [--paged N]
        splits = [int(x) for x in sys.argv[sys.argv.index("--splits") + 1].split(",")]
        shape = sys.argv[sys.argv.index("--shape") + 1] if "--shape" in sys.argv else "64,1,131072"
        page = int(sys.argv[sys.argv.index("--paged") + 1]) if "--paged" in sys.argv else 0
        sweep_splits(splits, *map(int, shape.split(",")), page)
        return
    if "--bench" in sys.argv:
        page = int(sys.argv[sys.argv.index("--paged") + 1]) if "--paged" in sys.argv else 0
        json_path = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
        bench(quick, page, json_path, mha="--mha" in sys.argv)
        return
    part, parts = (map(int, sys.argv[sys.argv.index("--part") + 1].split("/"))) if "--part" in sys.argv else (0, 1)
    sys.exit(0 if check(quick, part, parts) else 1)


if __name__ == "__main__":
    main()
