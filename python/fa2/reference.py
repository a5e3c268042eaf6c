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
