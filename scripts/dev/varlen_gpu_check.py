"""Correctness sweep of the CUDA varlen ops (torch.ops.fa2.varlen_fwd / varlen_bwd) against per-sequence fp32 math.

The kernels' own check, independent of the Python API: packed sequences of mixed lengths (0, 1, odd, longer than a
block), causal / windows / softcap, GQA, seqused_k, odd headdims, strided inputs (views of a packed qkv), a max_seqlen
above the longest sequence, the deterministic backward (bitwise repeatable). Rule (docs/design.md, tests/numerics.py):
max|fa2 - ref32| <= 2x (out, lse) / 3x (dq, dk, dv) the naive low-precision math's error. One line per case, a summary;
exit status 1 on any failure.
Usage: PYTHONPATH=python python3 scripts/dev/varlen_gpu_check.py [--quick] [--device cpu]
   (or scripts/gpu_check.sh "scripts/dev/varlen_gpu_check.py")
"""
from __future__ import annotations

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


def main():
    quick = "--quick" in sys.argv
    dev = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    torch.manual_seed(0)
    failed = 0
    n = 0
    for name, kw in cases(quick):
        n += 1
        try:
            run_case(name, **kw, dev=dev)
            print(f"ok    {name}")
        except Exception as e:  # noqa: BLE001  (every failure is reported, the sweep goes on)
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {str(e)[:300]}")
    print(f"{n - failed}/{n} varlen cases passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
