"""What bench_attention.py and bench_e2e.py share: device sync, /proc memory readings, error summaries, the
fa2 import and the environment record written into every result JSON; and what bench_decode.py and
scripts/dev/decode_gpu_check.py share: decode inputs, mean and CUDA-graph timings, the device's copy bandwidth."""
from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def proc_status_kib(key):
    """A /proc/self/status field in KiB (VmRSS, VmHWM), or None where unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def short_error(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:400]


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def import_fa2():
    """fa2 module or None, and the reason it could not be imported."""
    try:
        import fa2
        return fa2, None
    except Exception as e:  # ImportError, or an ABI mismatch message from fa2's loader
        return None, f"import fa2 failed: {type(e).__name__}: {e}"


def environment(device: torch.device, fa2_mod, fa2_err, **extra) -> dict:
    """Date, host, versions, git commit, GPU (or CPU) and fa2's build info; ``extra`` adds fields."""
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "device": str(device), "argv": sys.argv, **extra,
    }
    try:
        out = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        env["git_commit"] = out.stdout.strip() or None
        st = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, timeout=10)
        env["git_dirty"] = bool(st.stdout.strip()) if st.returncode == 0 else None
    except Exception as e:
        env["git_commit"] = f"unknown ({e})"
    # A copy of the working tree whose .git is not the source's (the GPU machine's copy keeps an older HEAD) says
    # which commit it holds through FA2_GIT_COMMIT (set by the caller from the source checkout).
    if os.environ.get("FA2_GIT_COMMIT"):
        env["git_commit_in_copy"], env["git_commit"] = env.get("git_commit"), os.environ["FA2_GIT_COMMIT"]
        env["git_dirty_in_copy"], env["git_dirty"] = env.get("git_dirty"), None  # (against the copy's HEAD)
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(gpu=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                   gpu_memory_gib=round(p.total_memory / 2**30, 1), cudnn=torch.backends.cudnn.version())
        try:
            q = "name,driver_version,clocks.sm,clocks.max.sm,power.limit"
            r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=20)
            env["nvidia_smi"] = r.stdout.strip()
        except Exception:
            pass
    else:
        env["cpu"] = platform.processor() or platform.machine()
        env["threads"] = torch.get_num_threads()
    env["fa2"] = dict(fa2_mod.build_info(), file=fa2_mod.__file__) if fa2_mod is not None else {"error": fa2_err}
    return env


# ---- FLOPs (the FA-2 paper's count) ------------------------------------------------------------------------------

def attention_flops(batch: int, nheads: int, seqlen_q: int, seqlen_k: int, headdim: int, causal: bool,
                    pass_: str) -> float:
    """Forward: Q·Kᵀ and P·V, each 2·Sq·Sk·D per (batch, head) -> 4·B·H·Sq·Sk·D; causal (Sq = Sk) half.
    Backward: five matmuls of the same size (recomputed S, dV, dP, dQ, dK) = 2.5 x forward. fwd+bwd = 3.5 x.
    Masked-out (padding) keys are still counted, as work done: the peers compute them (additive bias); fa2's sm_90a
    forward skips the key tiles whose bias is all -inf (headdims above 64 and the warp-specialized kernels), so its
    padding-mask TFLOP/s count work it did not do (at most the padded 10% of keys, in whole 64/128-key tiles); so
    do its backward ones (the key-row variant skips key blocks whose keys are all padded).
    Causal with seqlen_q != seqlen_k (a chunk of queries against a longer KV cache): only the (query, key) pairs the
    bottom-right-aligned mask lets through (causal_pairs); with seqlen_q == seqlen_k the paper's S²/2."""
    pairs = seqlen_q * seqlen_k
    if causal:
        pairs = pairs / 2 if seqlen_q == seqlen_k else causal_pairs(seqlen_q, seqlen_k)
    fwd = 4.0 * batch * nheads * pairs * headdim
    return {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}[pass_] * fwd


def causal_pairs(seqlen_q: int, seqlen_k: int) -> int:
    """The (query, key) pairs a causal mask aligned bottom-right keeps: query i sees keys j <= i + seqlen_k - seqlen_q.
    seqlen_q <= seqlen_k: Sq·Sk − Sq·(Sq − 1)/2; longer queries: only the last Sk rows see keys, Sk·(Sk + 1)/2."""
    if seqlen_q > seqlen_k:
        return seqlen_k * (seqlen_k + 1) // 2
    return seqlen_q * seqlen_k - seqlen_q * (seqlen_q - 1) // 2


def pass_closure(run, pass_: str, inputs, dout):
    """The call one measurement of pass_ repeats, for run() -> out computed from the leaves inputs: the forward (run
    itself); the backward alone ("bwd": one forward now, then the backward replayed on its retained graph); or both
    ("fwdbwd"). dout: the output gradient. (bench_attention.py's grid and sustained.py time the same passes.)"""
    if pass_ == "fwd":
        return run
    if pass_ == "bwd":
        out = run()
        return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)
    return lambda: torch.autograd.grad(run(), inputs, dout)


def grid_inputs(seqlen: int, headdim: int, tokens: int, hidden: int, requires_grad: bool = False):
    """The grid's shapes at one seqlen: batch = tokens // seqlen, heads = hidden // headdim; random bf16 q, k, v on the
    GPU in (batch, heads, seqlen, headdim). Returns (q, k, v, batch, nheads)."""
    batch, nheads = tokens // seqlen, hidden // headdim
    q, k, v = (torch.randn(batch, nheads, seqlen, headdim, device="cuda", dtype=torch.bfloat16)
               .requires_grad_(requires_grad) for _ in range(3))
    return q, k, v, batch, nheads


# ---- the GPU's clock during each measurement ---------------------------------------------------------------------

class ClockSampler:
    """nvidia-smi sampling one GPU's SM clock and power draw every interval_ms in the background; at the end each
    measurement's wall-clock window gets the median of the samples inside it. A context manager: the sampling stops
    on the way out, whatever happened (stop() is then a no-op).

    Why: on an H200 a burst of one kernel can run at the boost clock or, once the 700 W cap bites, 10% slower, and two
    peers timed seconds apart may land in different states (the 2026-12-04 grid: both fa2's and cuDNN's D=128 backward
    rounds at S=8k fell into ~4.6 and ~5.1 ms groups). With the clock beside each round the states can be told apart.
    Samples carry nvidia-smi's own timestamps, taken in UTC (TZ=UTC) and parsed as such, so neither the file's
    buffering nor the machine's time zone shifts them. gpu: nvidia-smi's -i (an index, "GPU-<uuid>", a PCI bus id);
    without it a machine with several GPUs would mix their samples."""

    # (the memory clock, temperature and throttle reasons too: the D=128 backward's ~10% groups of rounds did not
    # follow the SM clock, 2026-12-04; these may say what they follow)
    FIELDS = "timestamp,clocks.sm,power.draw,clocks.mem,temperature.gpu,clocks_throttle_reasons.active"

    def __init__(self, interval_ms: int = 25, gpu: str | None = None):
        # into a file, not a pipe: nobody reads a pipe until the end, and once its 64 KiB buffer is full (~40 s of
        # samples) nvidia-smi blocks and the later measurements get none
        self.log = tempfile.TemporaryFile(mode="w+")
        gpu_arg = ["-i", gpu] if gpu else []
        fields = self.FIELDS
        # a field this nvidia-smi does not know fails the whole query (and -lms would then write nothing): try once
        probe = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"] + gpu_arg,
                               capture_output=True, text=True, timeout=20)
        if probe.returncode != 0:
            fields = "timestamp,clocks.sm,power.draw"
        cmd = ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", f"-lms={interval_ms}"]
        self.proc = subprocess.Popen(cmd + gpu_arg, stdout=self.log, stderr=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "TZ": "UTC"})
        self.samples: list[tuple] = []  # (unix time, SM MHz, W, memory MHz | None, °C | None, reasons | None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def stop(self) -> list[tuple]:
        """Ends the sampling (once); returns (unix time, SM MHz, W, memory MHz, °C, throttle reasons) per sample, the
        last three None where nvidia-smi gave none ("[N/A]")."""
        if self.proc is None:
            return self.samples
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:  # (the samples written so far still count)
            self.proc.kill()
        self.proc = None
        self.log.seek(0)
        for line in self.log.read().splitlines():
            parts = [x.strip() for x in line.split(",")]
            try:
                t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").replace(
                    tzinfo=datetime.timezone.utc).timestamp()
                sample = (t, float(parts[1]), float(parts[2]))
            except (ValueError, IndexError):  # a partial last line, "[N/A]" for the SM clock or the power
                continue
            optional = parts[3:6] + [None] * (6 - len(parts))
            self.samples.append(sample + (_number(optional[0]), _number(optional[1]),
                                          optional[2] if optional[2] and optional[2][:1] == "0" else None))
        self.log.close()
        return self.samples

    def during(self, t0: float, t1: float) -> dict:
        """Of the samples in [t0, t1] (unix times): the median SM clock, power, memory clock and temperature (the last
        two where nvidia-smi gave them), the throttle reasons seen (sorted, "0x0..0" = none) and how many there were."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if not inside:
            return {"clock_samples": 0}
        out = {"sm_mhz": statistics.median(s[1] for s in inside), "power_w": statistics.median(s[2] for s in inside)}
        for key, i in (("mem_mhz", 3), ("temp_c", 4)):
            values = [s[i] for s in inside if s[i] is not None]
            if values:
                out[key] = statistics.median(values)
        reasons = sorted({s[5] for s in inside if s[5]})
        if reasons:
            out["throttle"] = reasons
        out["clock_samples"] = len(inside)
        return out


def _number(text):
    """float(text), or None for what nvidia-smi writes where it has no value ("[N/A]", "N/A", "")."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def nvidia_smi_id(device) -> str | None:
    """The -i that names this CUDA device to nvidia-smi ("GPU-<uuid>"), or None where torch does not say."""
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return f"GPU-{uuid}" if uuid else None


# ---- decode: inputs, timings, the device's copy bandwidth (bench_decode.py, scripts/dev/decode_gpu_check.py) -------

def mean_time_ms(fn, iters: int, device=torch.device("cuda")) -> float:
    """Mean ms per call of `iters` back-to-back calls after one untimed call (CUDA events around the burst on a GPU,
    time.perf_counter on the CPU)."""
    fn()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) * 1e3 / iters
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def graph_time_ms(fn, iters: int) -> float:
    """Per call, replaying `iters` calls captured in one CUDA graph: the kernels' time without the host's per-call
    cost (which bounds eager calls on small caches)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    return mean_time_ms(graph.replay, 3) / iters


def copy_bandwidth(nbytes: int, device=torch.device("cuda")) -> float:
    """GB/s of a device copy of nbytes (read + write counted)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    ms = mean_time_ms(lambda: dst.copy_(src), 20, device)
    return 2 * nbytes / ms / 1e6


def decode_inputs(batch, n, h, hk, d, page, device="cuda"):
    """A decode step's bf16 inputs: q (batch, 1, h, d); k / v caches of n keys per sequence, contiguous or paged (page
    keys a block, the blocks shuffled: kw holds the block table); every sequence's length n."""
    q = torch.randn(batch, 1, h, d, device=device, dtype=torch.bfloat16)
    kw = {}
    if page:
        blocks = batch * (n // page)
        k = torch.randn(blocks, page, hk, d, device=device, dtype=torch.bfloat16)
        kw["block_table"] = torch.randperm(blocks, device=device).to(torch.int32).view(batch, -1)
    else:
        k = torch.randn(batch, n, hk, d, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = torch.full((batch,), n, dtype=torch.int32, device=device)
    return q, k, v, lens, kw
