"""Correctness sweep of the CUDA varlen ops (torch.ops.fa2.varlen_fwd / varlen_bwd) against per-sequence fp32 math.

The kernels' own check, independent of the Python API: packed sequences of mixed lengths (0, 1, odd, longer than a
block), causal / windows / softcap, GQA, seqused_k, odd headdims, strided inputs (views of a packed qkv), a max_seqlen
above the longest sequence, the deterministic backward (bitwise repeatable); on Hopper also what the sm_90a forward's
schedules meet (persistent CTAs over many sequences, the tile counter skipping blocks past a sequence's end, 192 / 256
heads, a whole tile past the packed tensor's end). Rule (docs/design.md, tests/numerics.py): max|fa2 - ref32| <= 2x
(out, lse) / 3x (dq, dk, dv) the naive low-precision math's error. One line per case, a summary; exit status 1 on any
failure.
--route sm90a | sm80 | sm90a-wgmma: the varlen kernels on compute capability 9.0 (development option sm90_varlen;
sm90a-wgmma: the sm_90a backward without the warp-specialized kernel; sm90a-dqblocks: with option varlen_dq_blocks;
default: the default options, sm90a there); the kernels each route plans are printed first. The benches take a
comma-separated list (--route sm90a,sm90a-dqblocks: both timed, interleaved).
--bench (--bench-bwd: the backward alone; --dims 64,128,256 the head dims): times varlen against fa2's dense kernel
on the same tokens (equal lengths: batch x S, 16k tokens, hidden 2048; D 64 / 128 / 256, S 512..16k, causal and not),
each pair's calls interleaved call by call (benchmarks/bench_attention.py's time_interleaved); with --route both also
the sm80 route's varlen (and the backward's sm90a-wgmma route). --bench-mixed:
mixed lengths (16k tokens, 64..8k), varlen's useful TFLOP/s against the padded dense call with a key padding mask,
D 64 / 128 / 256. No checks.
Usage: PYTHONPATH=python python3 scripts/dev/varlen_gpu_check.py [--quick] [--device cpu] [--route ROUTE]
                                                                  [--bench | --bench-bwd | --bench-mixed [--route both]]
   (or scripts/gpu_check.sh "scripts/dev/varlen_gpu_check.py")
"""
from __future__ import annotations

import contextlib
import itertools
import sys
from pathlib import Path

import torch

import fa2  # noqa: F401  (registers torch.ops.fa2.*)
from fa2.reference import attention_ref

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from numerics import assert_close_rule  # noqa: E402  (tests/numerics.py: the one numerics rule)


def packed_reference(q, k, v, cu_q, cu_k, used_k, scale, causal, wl, wr, softcap, upcast):
    """fa2.reference.attention_ref per sequence: out (total_q, h, d), lse (h, total_q)."""
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        q0, q1, k0 = cu_q[b], cu_q[b + 1], cu_k[b]
        k1 = k0 + used_k[b]
        o, l = attention_ref(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], scale=scale, causal=causal,
                             window_left=wl, window_right=wr, softcap=softcap, upcast=upcast, return_lse=True)
        outs.append(o[0])
        lses.append(l[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def run_case(name, lens_q, lens_k, h, hk, d, dtype, causal=False, wl=-1, wr=-1, softcap=0.0, seqused=None,
             strided=False, extra_max=0, backward=True, deterministic=False, dev="cuda"):
    total_q, total_k = sum(lens_q), sum(lens_k)
    cu_q = [0]
    cu_k = [0]
    for a, b in zip(lens_q, lens_k):
        cu_q.append(cu_q[-1] + a)
        cu_k.append(cu_k[-1] + b)
    used = list(lens_k) if seqused is None else seqused
    if strided and total_q == total_k and h == hk:  # q, k, v as views of one packed (total, 3, h, d) tensor
        qkv = torch.randn(total_q, 3, h, d, device=dev, dtype=dtype)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    else:
        q = torch.randn(total_q, h, d, device=dev, dtype=dtype)
        k = torch.randn(total_k, hk, d, device=dev, dtype=dtype)
        v = torch.randn(total_k, hk, d, device=dev, dtype=dtype)
    scale = d ** -0.5
    cu_q_t = torch.tensor(cu_q, dtype=torch.int32, device=dev)
    cu_k_t = torch.tensor(cu_k, dtype=torch.int32, device=dev)
    used_t = None if seqused is None else torch.tensor(seqused, dtype=torch.int32, device=dev)
    max_q, max_k = max(lens_q + [0]) + extra_max, max(lens_k + [0]) + extra_max
    kw = dict(seqused_k=used_t, scale=scale, causal=causal, window_left=wl, window_right=wr, softcap=softcap)
    out, lse = torch.ops.fa2.varlen_fwd(q, k, v, cu_q_t, cu_k_t, max_q, max_k, **kw)
    # references: fp32 math and the naive math in the input dtype, with autograd for the gradients
    leaves32 = [t.detach().float().requires_grad_(backward) for t in (q, k, v)]
    leaves_lo = [t.detach().clone().requires_grad_(backward) for t in (q, k, v)]
    ref32, lse32 = packed_reference(*leaves32, cu_q, cu_k, used, scale, causal, wl, wr, softcap, upcast=True)
    ref_lo, _ = packed_reference(*leaves_lo, cu_q, cu_k, used, scale, causal, wl, wr, softcap, upcast=False)
    assert_close_rule(f"{name} out", out, ref32.detach(), ref_lo.detach(), 2)
    seen = torch.isfinite(lse32)
    assert torch.equal(torch.isinf(lse), ~seen), f"{name} lse: +inf exactly where a row sees no key"
    if seen.any():
        err = (lse[seen] - lse32[seen]).abs().max().item()
        assert err <= 1e-3 * max(1.0, lse32[seen].abs().max().item()), f"{name} lse: max err {err:.3g}"
    if not backward:
        return
    dout = torch.randn_like(out)
    grads = torch.ops.fa2.varlen_bwd(dout, q, k, v, out, lse, cu_q_t, cu_k_t, max_q, max_k, **kw,
                                     dropout_p=0.0, sinks=None, deterministic=deterministic)
    g32 = torch.autograd.grad(ref32, leaves32, dout.float(), allow_unused=True)
    g_lo = torch.autograd.grad(ref_lo, leaves_lo, dout, allow_unused=True)
    for gname, got, hi, lo, leaf in zip(("dq", "dk", "dv"), grads[:3], g32, g_lo, (q, k, v)):
        hi = torch.zeros_like(leaf, dtype=torch.float32) if hi is None else hi
        lo = torch.zeros_like(leaf) if lo is None else lo
        assert got.shape == leaf.shape, f"{name} {gname}: shape {tuple(got.shape)}"
        assert_close_rule(f"{name} {gname}", got, hi, lo, 3)
    if deterministic:
        again = torch.ops.fa2.varlen_bwd(dout, q, k, v, out, lse, cu_q_t, cu_k_t, max_q, max_k, **kw,
                                         dropout_p=0.0, sinks=None, deterministic=True)
        for gname, a, b in zip(("dq", "dk", "dv"), grads[:3], again[:3]):
            assert torch.equal(a, b), f"{name} {gname}: deterministic mode not bitwise repeatable"


def cases(quick):
    mixed_q = [1, 97, 0, 300, 64, 17]
    mixed_k = [5, 97, 33, 260, 64, 0]
    heads = [(4, 4), (8, 2)]
    dims = [64, 128] if quick else [32, 59, 64, 96, 111, 128, 192, 256]
    for dtype in (torch.bfloat16, torch.float16) if not quick else (torch.bfloat16,):
        for d in dims:
            for h, hk in heads:
                yield f"{dtype} d{d} h{h}/{hk} plain", dict(lens_q=mixed_q, lens_k=mixed_k, h=h, hk=hk, d=d,
                                                            dtype=dtype)
                yield f"{dtype} d{d} h{h}/{hk} causal", dict(lens_q=mixed_q, lens_k=mixed_k, h=h, hk=hk, d=d,
                                                             dtype=dtype, causal=True)
            yield f"{dtype} d{d} window", dict(lens_q=mixed_q, lens_k=mixed_k, h=4, hk=4, d=d, dtype=dtype, wl=40,
                                               wr=7)
            yield f"{dtype} d{d} causal softcap", dict(lens_q=mixed_q, lens_k=mixed_k, h=4, hk=2, d=d, dtype=dtype,
                                                       causal=True, softcap=30.0)
    d = 128
    yield "seqused_k causal", dict(lens_q=[50, 200, 3], lens_k=[80, 260, 9], h=4, hk=2, d=d, dtype=torch.bfloat16,
                                   causal=True, seqused=[60, 130, 0])
    yield "seqused_k plain", dict(lens_q=[50, 200, 3], lens_k=[80, 260, 9], h=4, hk=4, d=d, dtype=torch.bfloat16,
                                  seqused=[80, 1, 9])
    yield "strided qkv causal", dict(lens_q=[130, 7, 300], lens_k=[130, 7, 300], h=4, hk=4, d=d,
                                     dtype=torch.bfloat16, causal=True, strided=True)
    yield "max_seqlen above the longest", dict(lens_q=[70, 20], lens_k=[90, 20], h=2, hk=2, d=d,
                                               dtype=torch.bfloat16, causal=True, extra_max=300)
    yield "deterministic causal", dict(lens_q=[333, 1, 129], lens_k=[333, 64, 129], h=4, hk=2, d=d,
                                       dtype=torch.bfloat16, causal=True, deterministic=True)
    yield "deterministic window softcap", dict(lens_q=[200, 90], lens_k=[250, 90], h=4, hk=4, d=64,
                                               dtype=torch.float16, wl=33, wr=0, softcap=20.0, deterministic=True)
    yield "every sequence empty of keys", dict(lens_q=[5, 9], lens_k=[0, 0], h=2, hk=2, d=64, dtype=torch.bfloat16)
    yield "long", dict(lens_q=[4096, 1000, 3000], lens_k=[4096, 1000, 3000], h=8, hk=8, d=128,
                       dtype=torch.bfloat16, causal=True)
    # the sm_90a forward's schedules: persistent CTAs (d 128, more tiles than SMs) without and with the tile counter,
    # many short sequences (most tiles of max_seqlen's grid past their sequence's end), lengths at and around the
    # 128-row tile, the last sequence's tile running past the packed tensor's end, 192 / 256 heads
    edges = [128, 1, 129, 255, 256, 127, 0, 3000]
    for causal in (False, True):
        tag = "causal" if causal else "plain"
        yield f"persistent long {tag}", dict(lens_q=[4096, 1000, 3000, 1], lens_k=[4096, 1000, 3000, 7], h=8, hk=2,
                                             d=128, dtype=torch.bfloat16, causal=causal, backward=False)
        yield f"many short + one long {tag}", dict(lens_q=[(7 * i) % 41 for i in range(120)] + [2500],
                                                   lens_k=[(5 * i) % 37 + 1 for i in range(120)] + [2600], h=4, hk=4,
                                                   d=128, dtype=torch.bfloat16, causal=causal, backward=False)
        yield f"tile edges d128 {tag}", dict(lens_q=edges, lens_k=edges[::-1], h=4, hk=4, d=128,
                                             dtype=torch.float16, causal=causal, backward=False)
        for d in (64, 192, 256):
            yield f"tile edges d{d} {tag}", dict(lens_q=edges, lens_k=edges, h=4, hk=2, d=d, dtype=torch.bfloat16,
                                                 causal=causal, backward=False)
    yield "persistent seqused_k window", dict(lens_q=[2000, 1500, 64], lens_k=[2100, 1600, 64],
                                              seqused=[1900, 1600, 0], h=8, hk=8, d=128, dtype=torch.bfloat16,
                                              wl=300, wr=0, backward=False)


# (sm90a-wgmma: the sm_90a varlen backward without the warp-specialized kernel, bwd_kernel.cuh's wgmma tiles)
ROUTES = {"sm90a": {"sm90_varlen": True}, "sm80": {"sm90_varlen": False},
          "sm90a-wgmma": {"sm90_varlen": True, "sm90_ws_backward": False},
          "sm90a-dqblocks": {"sm90_varlen": True, "varlen_dq_blocks": True}}


def route_options(route):
    """The development options of a route (None: the process's options as they are)."""
    return contextlib.nullcontext() if route is None else fa2.dev.options_override(**ROUTES[route])


def print_planned_kernels(route):
    """The kernels the current GPU's plans name for a few varlen calls (which route really runs)."""
    for direction in ("fwd", "bwd"):
        for d in (64, 128, 192, 256):
            for causal in (False, True):
                with route_options(route):
                    p = fa2.dev.plan(direction, varlen=True, batch=4, nheads=8, seqlen_q=2048, headdim=d,
                                     causal=causal)
                print(f"plan {direction} d{d} causal={causal}: {p.get('kernel', p.get('error'))}")


def bench(route, backward, dims=(64, 128, 256)):
    """varlen (equal lengths) against the dense kernel on the same tokens, the forward (or the backward alone),
    interleaved call by call; ratio = dense ms / varlen ms."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_attention import time_interleaved  # noqa: E402  (benchmarks/ on the path just above)

    # (the backward's "both" also times the sm_90a route without the warp-specialized backward)
    both = ["sm90a", "sm90a-wgmma", "sm80"] if backward else ["sm90a", "sm80"]
    routes = both if route == "both" else (route or "sm90a").split(",")
    tokens, hidden = 16384, 2048
    print(("backward" if backward else "forward") + f", bf16, {tokens} tokens, hidden {hidden}")
    for r in routes:
        with route_options(r):
            plan = fa2.dev.plan("bwd" if backward else "fwd", varlen=True, batch=8, nheads=16, seqlen_q=2048,
                                headdim=dims[-1])
        print(f"route {r}: {plan.get('kernel', plan.get('error'))} (d {dims[-1]})")
    print(f"{'D':>4} {'S':>5} {'causal':>6} {'dense ms':>9} " + " ".join(f"{'varlen ' + r:>13} {'ratio':>6}"
                                                                        for r in routes))
    for d in dims:
        for s_len in (512, 1024, 2048, 4096, 8192, 16384):  # (16k: one sequence, which runs the dense kernels)
            for causal in (False, True):
                b, h = tokens // s_len, hidden // d
                q, k, v, dout = (torch.randn(b, s_len, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                cu = torch.arange(0, (b + 1) * s_len, s_len, dtype=torch.int32, device="cuda")
                qp, kp, vp, doutp = (t.view(b * s_len, h, d) for t in (q, k, v, dout))
                out, lse = torch.ops.fa2.fwd(q, k, v, causal=causal)
                outp, lsep = torch.ops.fa2.varlen_fwd(qp, kp, vp, cu, cu, s_len, s_len, causal=causal)
                lens = (cu, cu, s_len, s_len)
                if backward:
                    def dense():
                        return torch.ops.fa2.bwd(dout, q, k, v, out, lse, causal=causal)

                    def call():
                        return torch.ops.fa2.varlen_bwd(doutp, qp, kp, vp, outp, lsep, *lens, causal=causal)
                else:
                    def dense():
                        return torch.ops.fa2.fwd(q, k, v, causal=causal)

                    def call():
                        return torch.ops.fa2.varlen_fwd(qp, kp, vp, *lens, causal=causal)
                fns = {"dense": (dense, contextlib.nullcontext)}
                for r in routes:
                    fns[r] = (call, lambda r=r: route_options(r))
                t = time_interleaved(fns, torch.device("cuda"), warmup_ms=50, rep_ms=300)
                row = " ".join(f"{t[r]:13.4f} {t['dense'] / t[r]:6.3f}" for r in routes)
                print(f"{d:4d} {s_len:5d} {str(causal):>6} {t['dense']:9.4f} {row}", flush=True)


def mixed_lengths(tokens, lo, hi, gen):
    """Lengths drawn uniformly from lo..hi until they fill `tokens` (the last one cut to fit)."""
    lengths = []
    while sum(lengths) < tokens:
        lengths.append(min(int(torch.randint(lo, hi + 1, (1,), generator=gen)), tokens - sum(lengths)))
    return lengths


def bench_mixed(route):
    """Mixed lengths (16k tokens, lengths 64..8k, seeded), the forward: varlen's useful TFLOP/s (the FLOPs of the real
    lengths) against the padded dense call on the same batch (a key padding mask, so that it computes the same
    rows), interleaved call by call."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_attention import time_interleaved  # noqa: E402  (benchmarks/ on the path just above)

    routes = ["sm90a", "sm80"] if route == "both" else [route or "sm90a"]
    gen = torch.Generator().manual_seed(0)
    tokens, hidden = 16384, 2048
    print(f"forward, bf16, {tokens} tokens of lengths 64..8192, hidden {hidden}; TFLOP/s of the real lengths")
    print(f"{'D':>4} {'causal':>6} {'seqs':>4} {'padded':>7} " + " ".join(f"{'varlen ' + r:>13} {'x pad':>6}"
                                                                      for r in routes))
    for d in (64, 128, 256):
        for causal in (False, True):
            lens = mixed_lengths(tokens, 64, 8192, gen)
            b, h, s_max = len(lens), hidden // d, max(lens)
            qp, kp, vp = (torch.randn(tokens, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
            pad = [torch.zeros(b, s_max, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
            keep = torch.zeros(b, 1, 1, s_max, dtype=torch.bool, device="cuda")
            for i, (start, n) in enumerate(zip(cu.tolist(), lens)):
                for dst, src in zip(pad, (qp, kp, vp)):
                    dst[i, :n] = src[start:start + n]
                keep[i, ..., :n] = True
            flops = sum(4.0 * n * n * d * h / (2 if causal else 1) for n in lens)

            def padded():
                return torch.ops.fa2.fwd(*pad, attn_bias=keep, causal=causal)

            def varlen():
                return torch.ops.fa2.varlen_fwd(qp, kp, vp, cu, cu, s_max, s_max, causal=causal)
            fns = {"padded": (padded, contextlib.nullcontext)}
            for r in routes:
                fns[r] = (varlen, lambda r=r: route_options(r))
            t = time_interleaved(fns, torch.device("cuda"), warmup_ms=50, rep_ms=300)
            tf = {k: flops / (ms * 1e-3) / 1e12 for k, ms in t.items()}
            row = " ".join(f"{tf[r]:13.1f} {t['padded'] / t[r]:6.2f}" for r in routes)
            print(f"{d:4d} {str(causal):>6} {b:4d} {tf['padded']:7.1f} {row}", flush=True)


def main():
    quick = "--quick" in sys.argv
    dev = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    route = sys.argv[sys.argv.index("--route") + 1] if "--route" in sys.argv else None
    if "--bench" in sys.argv or "--bench-bwd" in sys.argv:
        dims = sys.argv[sys.argv.index("--dims") + 1] if "--dims" in sys.argv else "64,128,256"
        bench(route, backward="--bench-bwd" in sys.argv, dims=tuple(int(d) for d in dims.split(",")))
        return
    if "--bench-mixed" in sys.argv:
        bench_mixed(route)
        return
    if dev == "cuda":
        print_planned_kernels(route)
    torch.manual_seed(0)
    failed = 0
    n = 0
    for name, kw in cases(quick):
        n += 1
        try:
            with route_options(route):
                run_case(name, **kw, dev=dev)
            print(f"ok    {name}")
        except Exception as e:  # noqa: BLE001  (every failure is reported, the sweep goes on)
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {str(e)[:300]}")
    print(f"{n - failed}/{n} varlen cases passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
