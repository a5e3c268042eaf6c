"""Decode-kernel cases (torch.ops.fa2._decode_attention) and their check against fa2.reference: shared by
tests/test_decode_cuda.py and scripts/dev/decode_gpu_check.py.

A case builds q and a contiguous or paged KV cache (blocks in a shuffled order, the rest of the pool random), the
per-sequence key counts, and compares out / lse with the fp32 reference over each sequence's first seqlens_k[b] keys
(tests/numerics.py's rule: 2x the naive low-precision error; lse +inf exactly where a row sees no key)."""
from __future__ import annotations

import torch

from fa2.reference import attention_ref
from numerics import assert_close_rule


def build_case(lens, seqlen_q, h, hk, d, dtype, page=0, capacity=None, cache_batch_idx=False, dev="cuda",
               seed=0):
    """q (B, sq, h, d); caches contiguous (B', capacity, hk, d) or paged (blocks, page, hk, d) with a block table."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    batch = len(lens)
    capacity = capacity or max(max(lens), 1)
    q = torch.randn(batch, seqlen_q, h, d, generator=g).to(dev, dtype)
    kw = {}
    if page:
        blocks_per_seq = -(-capacity // page)
        n_blocks = batch * blocks_per_seq + 3  # spare blocks nobody uses
        k_cache = torch.randn(n_blocks, page, hk, d, generator=g).to(dev, dtype)
        v_cache = torch.randn(n_blocks, page, hk, d, generator=g).to(dev, dtype)
        table = torch.randperm(n_blocks, generator=g)[: batch * blocks_per_seq].view(batch, blocks_per_seq)
        kw["block_table"] = table.to(dev, torch.int32)
    else:
        rows = batch + 2 if cache_batch_idx else batch
        k_cache = torch.randn(rows, capacity, hk, d, generator=g).to(dev, dtype)
        v_cache = torch.randn(rows, capacity, hk, d, generator=g).to(dev, dtype)
        if cache_batch_idx:
            kw["cache_batch_idx"] = torch.randperm(rows, generator=g)[:batch].to(dev, torch.int32)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    return q, k_cache, v_cache, seqlens, kw


def sequence_keys(cache, b, n, kw):
    """The first n keys (n, hk, d) of sequence b's cache rows."""
    if "block_table" in kw:
        page = cache.shape[1]
        blocks = kw["block_table"][b, : -(-n // page)].long()
        return cache[blocks].reshape(-1, *cache.shape[2:])[:n]
    row = int(kw["cache_batch_idx"][b]) if "cache_batch_idx" in kw else b
    return cache[row, :n]


def reference(q, k_cache, v_cache, lens, kw, scale, causal, wl, wr, softcap, upcast):
    outs, lses = [], []
    for b, n in enumerate(lens):
        kb, vb = sequence_keys(k_cache, b, n, kw), sequence_keys(v_cache, b, n, kw)
        o, l = attention_ref(q[b : b + 1], kb[None], vb[None], scale=scale, causal=causal, window_left=wl,
                             window_right=wr, softcap=softcap, upcast=upcast, return_lse=True)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)


def run_case(name, lens, seqlen_q, h, hk, d, dtype, page=0, capacity=None, cache_batch_idx=False, causal=False,
             wl=-1, wr=-1, softcap=0.0, num_splits=0, dev="cuda"):
    """Runs one case through fa2._decode_attention and asserts it against the reference; returns the max error."""
    q, k_cache, v_cache, seqlens, kw = build_case(lens, seqlen_q, h, hk, d, dtype, page, capacity, cache_batch_idx,
                                                  dev)
    scale = d ** -0.5
    out, lse = torch.ops.fa2._decode_attention(q, k_cache, v_cache, seqlens, scale=scale, causal=causal,
                                               window_left=wl, window_right=wr, softcap=softcap,
                                               num_splits=num_splits, **kw)
    shape = f"{name}: q {tuple(q.shape)} cache {tuple(k_cache.shape)} lens {lens[:8]}{'...' if len(lens) > 8 else ''}"
    ref32, lse32 = reference(q, k_cache, v_cache, lens, kw, scale, causal, wl, wr, softcap, upcast=True)
    ref_lo, _ = reference(q, k_cache, v_cache, lens, kw, scale, causal, wl, wr, softcap, upcast=False)
    assert out.shape == q.shape and lse.shape == (q.shape[0], h, seqlen_q), f"{shape}: shapes {out.shape} {lse.shape}"
    err, _ = assert_close_rule(f"{shape} out", out, ref32, ref_lo, 2)
    seen = torch.isfinite(lse32)
    bad = (torch.isinf(lse) & (lse > 0)) != ~seen
    assert not bad.any(), (f"{shape} lse: +inf where a row sees no key, else finite; differs at "
                           f"{bad.nonzero()[:4].tolist()}")
    if seen.any():
        lerr = (lse[seen] - lse32[seen]).abs().max().item()
        assert lerr <= 1e-3 * max(1.0, lse32[seen].abs().max().item()), f"{shape} lse: max err {lerr:.3g}"
    return err


def mixed_lengths(capacity):
    """Per-sequence key counts up to capacity: 0, 1, tile edges and odd values."""
    base = [0, 1, 17, 63, 64, 65, 127, 129, 1000, 4097]
    return [n for n in base if n <= capacity] + [capacity]


def cases(quick):
    """(name, kwargs) of the sweep; quick: a subset that runs in well under a minute."""
    dtypes = (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16)
    dims = (64, 128, 256) if quick else (64, 80, 128, 256, 32, 96, 192)
    for dtype in dtypes:
        for d in dims:
            for h, hk in ((32, 8), (8, 8)):
                for sq in (1, 2, 4, 8):
                    if quick and sq not in (1, 4):
                        continue
                    tag = f"{str(dtype)[6:]} d{d} h{h}/{hk} sq{sq}"
                    yield f"{tag} contiguous", dict(lens=mixed_lengths(4100), seqlen_q=sq, h=h, hk=hk, d=d,
                                                     dtype=dtype)
                    yield f"{tag} causal", dict(lens=mixed_lengths(700), seqlen_q=sq, h=h, hk=hk, d=d, dtype=dtype,
                                                causal=True)
            yield f"{str(dtype)[6:]} d{d} window softcap", dict(lens=mixed_lengths(900), seqlen_q=4, h=32, hk=8, d=d,
                                                                dtype=dtype, wl=70, wr=2, softcap=30.0)
    d, dt = 128, torch.bfloat16
    for page in (16, 64, 256):
        for sq, causal in ((1, False), (4, True)):
            yield f"paged {page} sq{sq} causal={causal}", dict(lens=mixed_lengths(3000), seqlen_q=sq, h=32, hk=8,
                                                                d=d, dtype=dt, page=page, causal=causal)
    yield "paged 48 (not a power of 2)", dict(lens=[5, 48, 97, 1000], seqlen_q=2, h=8, hk=2, d=64, dtype=dt, page=48)
    yield "cache_batch_idx", dict(lens=[3, 200, 0, 77], seqlen_q=1, h=16, hk=4, d=d, dtype=dt, cache_batch_idx=True)
    yield "capacity above every length", dict(lens=[10, 300], seqlen_q=1, h=8, hk=8, d=d, dtype=dt, capacity=5000)
    for splits in (1, 3, 128):
        yield f"num_splits {splits}", dict(lens=mixed_lengths(3000), seqlen_q=2, h=32, hk=8, d=d, dtype=dt,
                                           num_splits=splits, causal=True)
    yield "window only (left 0, right 0)", dict(lens=[1, 50, 500], seqlen_q=8, h=8, hk=8, d=d, dtype=dt, wl=0, wr=0)
    yield "seqlen_q above seqlen_k (causal rows with no key)", dict(lens=[0, 1, 3, 9], seqlen_q=8, h=8, hk=2, d=d,
                                                                     dtype=dt, causal=True)
    yield "64 rows per kv head (GQA 8 x sq 8)", dict(lens=[1, 333, 2049], seqlen_q=8, h=16, hk=2, d=d, dtype=dt,
                                                     causal=True)
    yield "every length 0", dict(lens=[0, 0], seqlen_q=1, h=8, hk=8, d=d, dtype=dt)
    yield "128 rows per kv head (2 row blocks), paged 16 causal", dict(lens=[1, 70, 3000], seqlen_q=8, h=16, hk=1, d=d,
                                                                      dtype=dt, page=16, causal=True)
    yield "256 rows per kv head (4 row blocks), GQA 8 x sq 32 causal", dict(lens=[31, 32, 2500], seqlen_q=32, h=16,
                                                                          hk=2, d=d, dtype=dt, causal=True)
    yield "100 rows (a partial row block), window", dict(lens=[5, 999], seqlen_q=25, h=8, hk=2, d=64, dtype=dt, wl=40,
                                                         wr=3, num_splits=3)
    if not quick:
        yield "long 70k GQA", dict(lens=[70001, 12345], seqlen_q=1, h=32, hk=8, d=d, dtype=dt)
        yield "long 70k paged 256 sq4 causal", dict(lens=[69999], seqlen_q=4, h=32, hk=8, d=d, dtype=dt, page=256,
                                                    causal=True)
        yield "long 70k d256 fp16 splits 1", dict(lens=[70000], seqlen_q=1, h=8, hk=8, d=256, dtype=torch.float16,
                                                  num_splits=1)
