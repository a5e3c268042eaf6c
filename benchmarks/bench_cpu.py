"""CPU benchmark: fa2's forward (and forward + backward) against torch.nn.functional.scaled_dot_product_attention.

    python benchmarks/bench_cpu.py             # full table + memory check
    python benchmarks/bench_cpu.py --quick     # few-second smoke run
    python benchmarks/bench_cpu.py --json out.json

Both sides get the same (B, H, S, D) tensors: SDPA directly, fa2 through a zero-copy `.transpose(1, 2)` view, so
neither pays for a layout change. Times are the median of --reps runs after warm-up, fa2 and SDPA alternating; ratio = sdpa / fa2
(> 1: fa2 is faster). FLOPs (docs/performance.md): fwd = 4·B·H·Sq·Sk·D (halved when causal), fwd+bwd = 3.5× fwd.

The memory check runs the fa2 forward at S and 2·S in fresh subprocesses and reports the peak resident memory
added by the call (inputs allocated beforehand): linear growth (ratio ~2) means no S×S buffer.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
# The in-tree package (scripts/dev_build.sh puts the extension there); PYTHONPATH and installed copies come first.
sys.path.append(os.path.join(HERE, "..", "python"))


def load_fa2():
    """Returns (fwd, fwd_bwd) callables on (B, S, H, D) tensors, preferring the python package when it imports."""
    try:
        import fa2  # noqa: F401

        attention = getattr(fa2, "attention", None)
    except Exception:  # the package may be mid-edit; the compiled ops are enough
        attention = None
    import fa2._C  # noqa: F401  (registers torch.ops.fa2.*)

    def fwd(q, k, v, causal):
        return torch.ops.fa2.fwd(q, k, v, None, None, causal, -1, -1, 0.0)[0]

    def fwd_bwd_ops(q, k, v, dout, causal):
        out, lse = torch.ops.fa2.fwd(q, k, v, None, None, causal, -1, -1, 0.0)
        torch.ops.fa2.bwd(dout, q, k, v, out, lse, None, None, causal, -1, -1, 0.0, False, False)

    def fwd_bwd_autograd(q, k, v, dout, causal):
        attention(q, k, v, causal=causal).backward(dout)

    if attention is not None:
        try:  # a smoke call: fall back to the ops if the package is not usable right now
            x = torch.randn(1, 4, 1, 8, requires_grad=True)
            fwd_bwd_autograd(x, x, x, torch.randn(1, 4, 1, 8), False)
            return fwd, fwd_bwd_autograd, "fa2.attention (autograd)"
        except Exception:
            pass
    return fwd, fwd_bwd_ops, "torch.ops.fa2.fwd/bwd"


def median_seconds_interleaved(fn_a, fn_b, reps: int, warmup: int, clock=time.perf_counter) -> tuple[float, float]:
    """Median time of fn_a and of fn_b, run alternately so that load from other processes hits both alike."""
    for _ in range(warmup):
        fn_a()
        fn_b()
    times_a, times_b = [], []
    for _ in range(reps):
        for fn, times in ((fn_a, times_a), (fn_b, times_b)):
            start = clock()
            fn()
            times.append(clock() - start)
    return statistics.median(times_a), statistics.median(times_b)


def bench_case(batch, nheads, seqlen, headdim, causal, dtype, backward, reps, warmup, fa2_fwd, fa2_fwd_bwd, clock):
    torch.manual_seed(0)
    # (B, H, S, D) for SDPA; fa2 reads the same memory as (B, S, H, D) through strides
    q, k, v, dout = (torch.randn(batch, nheads, seqlen, headdim, dtype=dtype) for _ in range(4))
    if not backward:
        def run_fa2():
            fa2_fwd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal)

        def run_sdpa():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        for t in (q, k, v):
            t.requires_grad_(True)

        def run_fa2():
            fa2_fwd_bwd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dout.transpose(1, 2), causal)
            q.grad = k.grad = v.grad = None

        def run_sdpa():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(dout)
            q.grad = k.grad = v.grad = None

    t_fa2, t_sdpa = median_seconds_interleaved(run_fa2, run_sdpa, reps, warmup, clock)
    flops = 4 * batch * nheads * seqlen * seqlen * headdim * (0.5 if causal else 1.0) * (3.5 if backward else 1.0)
    return {
        "batch": batch, "nheads": nheads, "seqlen": seqlen, "headdim": headdim, "causal": causal,
        "dtype": str(dtype).replace("torch.", ""), "pass": "fwd+bwd" if backward else "fwd",
        "fa2_s": t_fa2, "sdpa_s": t_sdpa, "ratio_sdpa_over_fa2": t_sdpa / t_fa2,
        "fa2_gflops": flops / t_fa2 / 1e9,
    }


# ---- memory: peak resident memory added by one fa2 forward, measured in a fresh process -------------------------
_MEMORY_CHILD = r"""
import sys, resource, torch
sys.path.append(sys.argv[2])
import fa2._C
seqlen, batch, nheads, headdim = int(sys.argv[1]), 1, 8, 64
def rss_kib(field):
    for line in open('/proc/self/status'):
        if line.startswith(field):
            return int(line.split()[1])
q, k, v = (torch.randn(batch, seqlen, nheads, headdim) for _ in range(3))
torch.ops.fa2.fwd(q[:, :64], k[:, :64], v[:, :64], None, None, False, -1, -1, 0.0)  # threads, BLAS buffers
before = rss_kib('VmRSS:')
try:
    open('/proc/self/clear_refs', 'w').write('5')  # reset the high-water mark to the current RSS
    reset = True
except OSError:
    reset = False
out, lse = torch.ops.fa2.fwd(q, k, v, None, None, False, -1, -1, 0.0)
peak = rss_kib('VmHWM:') if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(peak - before)
"""


def memory_check(seqlens):
    rows = []
    python_dir = os.path.join(HERE, "..", "python")
    for seqlen in seqlens:
        res = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, str(seqlen), python_dir],
                             capture_output=True, text=True, check=True)
        extra_mib = int(res.stdout.strip().splitlines()[-1]) / 1024
        out_mib = 1 * seqlen * 8 * 64 * 4 / 2**20
        scores_mib = 1 * 8 * seqlen * seqlen * 4 / 2**20  # what one materialized fp32 score matrix would take
        rows.append({"seqlen": seqlen, "extra_peak_mib": extra_mib, "output_mib": out_mib,
                     "full_scores_mib": scores_mib})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few-second smoke run")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--reps", type=int, default=None, help="timed runs per case (median reported)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory check")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with the process CPU clock instead of the wall clock: on a shared machine, with "
                             "--threads 1, it leaves out the time other processes hold the core")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    fa2_fwd, fa2_fwd_bwd, fa2_path = load_fa2()
    if args.quick:
        cases = [(1, 4, 512, 64, False, torch.float32, False), (1, 4, 512, 64, True, torch.float32, False),
                 (1, 4, 512, 64, True, torch.float32, True)]
        reps, warmup, mem_seqlens = args.reps or 3, 1, [1024, 2048]
    else:
        cases = []
        for causal in (False, True):
            cases += [(1, 8, 2048, 64, causal, torch.float32, False), (4, 8, 512, 64, causal, torch.float32, False),
                      (1, 8, 1024, 128, causal, torch.float32, False), (1, 8, 2048, 64, causal, torch.bfloat16, False),
                      (4, 8, 512, 64, causal, torch.bfloat16, False), (1, 8, 1024, 128, causal, torch.bfloat16, False),
                      (1, 8, 2048, 64, causal, torch.float32, True), (1, 8, 1024, 128, causal, torch.float32, True),
                      (1, 8, 2048, 64, causal, torch.bfloat16, True)]
        reps, warmup, mem_seqlens = args.reps or 7, 2, [4096, 8192]

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fa2 via {fa2_path}, "
          f"{'process CPU' if args.cpu_time else 'wall'} time")
    header = f"{'pass':8} {'dtype':9} {'B':>2} {'H':>3} {'S':>5} {'D':>4} {'causal':>6} | {'fa2 s':>9} {'sdpa s':>9} | {'sdpa/fa2':>8} | {'fa2 GFLOP/s':>11}"
    print(header)
    print("-" * len(header))
    results = []
    for batch, nheads, seqlen, headdim, causal, dtype, backward in cases:
        r = bench_case(batch, nheads, seqlen, headdim, causal, dtype, backward, reps, warmup, fa2_fwd, fa2_fwd_bwd,
                       time.process_time if args.cpu_time else time.perf_counter)
        results.append(r)
        print(f"{r['pass']:8} {r['dtype']:9} {batch:>2} {nheads:>3} {seqlen:>5} {headdim:>4} {str(causal):>6} | "
              f"{r['fa2_s']:9.4f} {r['sdpa_s']:9.4f} | {r['ratio_sdpa_over_fa2']:8.2f} | {r['fa2_gflops']:11.1f}",
              flush=True)

    memory = []
    if not args.no_memory:
        memory = memory_check(mem_seqlens)
        print("\nfa2 forward peak extra memory (B=1, H=8, D=64, fp32; output included):")
        for m in memory:
            print(f"  S={m['seqlen']:>5}: {m['extra_peak_mib']:8.1f} MiB   (output {m['output_mib']:.1f} MiB; "
                  f"one fp32 score matrix would be {m['full_scores_mib']:.0f} MiB)")
        if len(memory) == 2 and memory[0]["extra_peak_mib"] > 0:
            print(f"  growth for 2x seqlen: {memory[1]['extra_peak_mib'] / memory[0]['extra_peak_mib']:.2f}x "
                  f"(linear = 2x, quadratic = 4x)")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "fa2_path": fa2_path,
                       "clock": "process_time" if args.cpu_time else "perf_counter",
                       "results": results, "memory": memory}, f, indent=2)


if __name__ == "__main__":
    main()
