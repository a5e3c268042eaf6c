"""Reference attention in plain PyTorch math, with fa2's exact semantics (docs/design.md).

Used by the tests (``upcast=True`` gives the fp32/fp64 reference; ``upcast=False`` the naive low-precision math
that defines the error bound) and by nothing on the fast path.
"""
from __future__ import annotations

import math

import torch


def visibility_mask(seqlen_q: int, seqlen_k: int, causal: bool, window_left: int, window_right: int,
                    device=None) -> torch.Tensor | None:
    """Bool (seqlen_q, seqlen_k), True where query i sees key j (bottom-right aligned), or None if all visible."""
    if causal:
        window_right = 0 if window_right < 0 else min(window_right, 0)
    if window_left < 0 and window_right < 0:
        return None
    i = torch.arange(seqlen_q, device=device).unsqueeze(1)
    j = torch.arange(seqlen_k, device=device).unsqueeze(0)
    diag = i + seqlen_k - seqlen_q
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if window_left >= 0:
        keep &= j >= diag - window_left
    if window_right >= 0:
        keep &= j <= diag + window_right
    return keep


def attention_ref(q, k, v, attn_bias=None, scale=None, causal=False, window_left=-1, window_right=-1,
                  softcap=0.0, upcast=True, return_lse=False, sinks=None):
    """q (B, Sq, H, D), k (B, Sk, Hk, D), v (B, Sk, Hk, Dv) -> (B, Sq, H, Dv); scale defaults to D ** -0.5. upcast:
    compute in fp32 (fp64 stays fp64); else in q's dtype. sinks (H,): each head's extra logit in every row's softmax
    denominator, as given (a key with a zero value; a row that sees no key still outputs 0, lse +inf)."""
    dtype = q.dtype
    compute = (torch.float64 if dtype == torch.float64 else torch.float32) if upcast else dtype
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    if scale is None:
        scale = D ** -0.5
    qh = q.to(compute).transpose(1, 2)                       # (B, H, Sq, D)
    kh = k.to(compute).transpose(1, 2).repeat_interleave(H // Hk, dim=1) if Hk else k.to(compute).transpose(1, 2)
    vh = v.to(compute).transpose(1, 2).repeat_interleave(H // Hk, dim=1) if Hk else v.to(compute).transpose(1, 2)
    s = (qh * scale) @ kh.transpose(-1, -2)                   # (B, H, Sq, Sk)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    keep = visibility_mask(Sq, Sk, causal, window_left, window_right, device=q.device)
    if attn_bias is not None:
        if attn_bias.dtype == torch.bool:
            keep = attn_bias if keep is None else (attn_bias & keep)
        else:
            s = s + attn_bias.to(compute)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    if Sk == 0:
        # No key at all: every row outputs 0. "+ 0 * q.sum()" keeps the result attached to q's graph so autograd
        # returns zero gradients instead of None.
        out = torch.zeros(B, Sq, H, v.shape[-1], dtype=dtype, device=q.device) + 0 * q.sum()
        lse = torch.full((B, H, Sq), math.inf, device=q.device)
        return (out, lse) if return_lse else out
    row_max = s.amax(dim=-1, keepdim=True)
    seen = torch.isfinite(row_max) | torch.isnan(row_max)
    sink = None if sinks is None else sinks.to(compute).view(1, H, 1, 1)
    if sink is not None:
        row_max = torch.maximum(row_max, sink.expand_as(row_max))
    # Rows that see no key: softmax would be 0/0; fa2 defines their output as 0 (and lse as +inf).
    p = torch.exp(s - torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)))
    denom = p.sum(dim=-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink - torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)))
    p = torch.where(seen, p / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.zeros_like(p))
    out = (p @ vh).transpose(1, 2).to(dtype)
    if not return_lse:
        return out
    lse = (torch.log(denom) + row_max).squeeze(-1).float()
    lse = torch.where(seen.squeeze(-1), lse, torch.full_like(lse, math.inf))
    return out, lse


def varlen_attention_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k=None, scale=None, causal=False,
                         window_left=-1, window_right=-1, softcap=0.0, upcast=True, return_lse=False, sinks=None):
    """Packed sequences (fa2.varlen_attention's semantics), one sequence at a time through attention_ref: q
    (total_q, H, D), k / v (total_k, Hk, D); sequence b is rows cu_seqlens[b]:cu_seqlens[b+1], of which the first
    seqused_k[b] keys are used when given. Returns out (total_q, H, D) and, with return_lse, lse (H, total_q)."""
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    used = None if seqused_k is None else seqused_k.tolist()
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        keys_end = cu_k[b + 1] if used is None else cu_k[b] + used[b]
        o, lse = attention_ref(q[cu_q[b]:cu_q[b + 1]].unsqueeze(0), k[cu_k[b]:keys_end].unsqueeze(0),
                               v[cu_k[b]:keys_end].unsqueeze(0), None, scale, causal, window_left, window_right,
                               softcap, upcast=upcast, return_lse=True, sinks=sinks)
        outs.append(o[0])
        lses.append(lse[0])
    nheads = q.shape[1]
    # "+ the sum of an empty slice" (0) keeps q, k, v in the graph: zero gradients, not None, where no sequence uses
    # them (no batch, or no key at all)
    attach = q[:0].sum() + k[:0].sum() + v[:0].sum()
    if outs:
        out = torch.cat(outs) + attach.to(outs[0].dtype)
        lse = torch.cat(lses, dim=1)
    else:
        out = q.new_zeros(0, nheads, v.shape[-1]) + attach.to(q.dtype)
        lse = torch.zeros(nheads, 0, device=q.device)
    return (out, lse) if return_lse else out


def rotary_ref(x, cos, sin, positions, interleaved=False):
    """x (B, S, H, D) with its first rotary_dim = 2 * cos.shape[1] dims rotated, row i of batch element b at position
    positions[b, i] (int64 (B, S)): pairs (j, j + rotary_dim / 2), or (2j, 2j + 1) when interleaved, by the angle
    whose cos / sin are cos / sin[position, j]. Computed in fp32 (fp64 for fp64), returned in x's dtype."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    rotary_dim = 2 * cos.shape[1]
    c, s = (t[positions].to(compute).unsqueeze(2) for t in (cos, sin))  # (B, S, 1, rotary_dim / 2)
    rotated = x[..., :rotary_dim].to(compute)
    x1, x2 = (rotated[..., 0::2], rotated[..., 1::2]) if interleaved else rotated.chunk(2, dim=-1)
    out1, out2 = x1 * c - x2 * s, x1 * s + x2 * c
    rotated = torch.stack((out1, out2), dim=-1).flatten(-2) if interleaved else torch.cat((out1, out2), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., rotary_dim:]), dim=-1)


def kvcache_attention_ref(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                          cache_batch_idx=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=False,
                          scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0, upcast=True):
    """fa2.attention_with_kvcache's semantics on copies of the caches: the append (k rotated), q rotated, then
    attention_ref per batch element over its first cache_seqlens[b] + seqlen_new keys. Returns (out, lse, k_cache,
    v_cache), the caches as they are after the call; cache_seqlens an int32 tensor, an int or None."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    batch, seqlen_q = q.shape[:2]
    seqlen_new = 0 if k is None else k.shape[1]
    paged = block_table is not None
    block_size = k_cache.shape[1]
    capacity = block_table.shape[1] * block_size if paged else k_cache.shape[1]
    if cache_seqlens is None:
        cached = [capacity] * batch
    elif isinstance(cache_seqlens, int):
        cached = [cache_seqlens] * batch
    else:
        cached = cache_seqlens.tolist()
    first = torch.tensor(cached, dtype=torch.long, device=q.device)[:, None]
    if rotary_cos is not None:
        per_row = causal or window_left >= 0 or window_right >= 0
        rows = torch.arange(seqlen_q, device=q.device)[None]
        q = rotary_ref(q, rotary_cos, rotary_sin, first + (rows if per_row else 0 * rows), rotary_interleaved)
        k = rotary_ref(k, rotary_cos, rotary_sin, first + torch.arange(seqlen_new, device=q.device)[None],
                       rotary_interleaved)
    outs, lses = [], []
    for b in range(batch):
        keys = cached[b] + seqlen_new
        if paged:
            blocks = block_table[b].tolist()
            for i in range(seqlen_new):
                position = cached[b] + i
                k_cache[blocks[position // block_size], position % block_size] = k[b, i]
                v_cache[blocks[position // block_size], position % block_size] = v[b, i]
            used = blocks[:(keys + block_size - 1) // block_size]
            seq_k = k_cache[used].flatten(0, 1)[:keys]
            seq_v = v_cache[used].flatten(0, 1)[:keys]
        else:
            row = b if cache_batch_idx is None else int(cache_batch_idx[b])
            if seqlen_new:
                k_cache[row, cached[b]:keys] = k[b]
                v_cache[row, cached[b]:keys] = v[b]
            seq_k, seq_v = k_cache[row, :keys], v_cache[row, :keys]
        out, lse = attention_ref(q[b:b + 1], seq_k[None], seq_v[None], None, scale, causal, window_left, window_right,
                                 softcap, upcast=upcast, return_lse=True)
        outs.append(out)
        lses.append(lse)
    if not outs:
        return (q.new_zeros(0, seqlen_q, q.shape[2], v_cache.shape[3]),
                torch.zeros(0, q.shape[2], seqlen_q, device=q.device), k_cache, v_cache)
    return torch.cat(outs), torch.cat(lses), k_cache, v_cache
