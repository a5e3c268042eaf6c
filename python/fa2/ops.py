"""The friendly Python API over torch.ops.fa2.*."""
from __future__ import annotations

import torch

from ._ops_impl import refuse_unsupported_autodiff


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_bias: torch.Tensor | None = None,
              scale: float | None = None, causal: bool = False, window_left: int = -1, window_right: int = -1,
              softcap: float = 0.0, dropout_p: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Exact attention, flash-attn layout: q (batch, seqlen_q, nheads, headdim), k (batch, seqlen_k, nheads_k,
    headdim), v (batch, seqlen_k, nheads_k, headdim_v); returns (batch, seqlen_q, nheads, headdim_v). v's head dim may
    differ from q's and k's (DeepSeek's MLA: 192 and 128); ``scale`` defaults to headdim ** -0.5 (q's). ``causal`` is
    bottom-right aligned; see docs/design.md. ``dropout_p``: each attention weight is dropped with that probability
    (the rest scaled by 1 / (1 - p)), random bits from torch's default generator of the device. ``sinks`` (nheads,):
    each head's learned extra logit in the softmax denominator (gpt-oss), differentiable."""
    return torch.ops.fa2.attention(q, k, v, attn_bias, scale, causal, window_left, window_right, softcap, dropout_p,
                                   sinks)


def attention_with_lse(q, k, v, attn_bias=None, scale=None, causal=False, window_left=-1, window_right=-1,
                       softcap=0.0, dropout_p=0.0, sinks=None):
    """Like :func:`attention` but also returns lse (batch, nheads, seqlen_q), float32 (not differentiable; with
    sinks it includes the sink's term)."""
    refuse_unsupported_autodiff(q, k, v, attn_bias, sinks)
    return torch.ops.fa2.fwd(q, k, v, attn_bias, scale, causal, window_left, window_right, softcap, dropout_p, None,
                             sinks)


def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
         dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
         enable_gqa: bool = False) -> torch.Tensor:
    """Drop-in for ``torch.nn.functional.scaled_dot_product_attention``: (..., heads, seqlen, headdim) layout (value's
    headdim may differ from query's and key's: the output takes value's), top-left ``is_causal``, bool (True = take
    part) or float additive ``attn_mask``. No copies of q/k/v: the
    (B, H, S, D) tensors are read through a transposed view. Differences: rows that see no key give 0, not NaN;
    ``dropout_p`` draws fa2's own mask (the statistics of SDPA's, not its random numbers)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() < 2:
            raise ValueError(f"fa2.sdpa: {name} must have at least 2 dims (..., seqlen, headdim), got shape "
                             f"{tuple(t.shape)}")
    if attn_mask is not None and is_causal:
        raise ValueError("fa2.sdpa: attn_mask and is_causal cannot both be set (as in "
                         "F.scaled_dot_product_attention)")
    leads = [t.shape[:-3] for t in (query, key, value)]
    if not leads[0] == leads[1] == leads[2]:
        # batch dims broadcast as in F.sdpa (e.g. one key/value set for every batch entry): stride-0 views
        try:
            lead = torch.broadcast_shapes(*leads)
        except RuntimeError:
            raise ValueError(f"fa2.sdpa: the batch dims of query {tuple(query.shape)}, key {tuple(key.shape)} and "
                             f"value {tuple(value.shape)} do not broadcast") from None
        query, key, value = (t.expand(*lead, *t.shape[-3:]) for t in (query, key, value))
    out_shape = query.shape[:-1] + value.shape[-1:]
    q, k, v = (_to_bhsd(t) for t in (query, key, value))
    if q.shape[1] != k.shape[1] and not enable_gqa:
        raise ValueError(f"fa2.sdpa: query has {q.shape[1]} heads but key has {k.shape[1]}; pass enable_gqa=True "
                         "for grouped-query attention")
    seqlen_q, seqlen_k = q.shape[2], k.shape[2]
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            # (as F.scaled_dot_product_attention: a 0/1 integer mask read as additive would silently add +1)
            raise TypeError(f"fa2.sdpa: attn_mask must be bool (True = take part) or floating point (added to the "
                            f"scores), got {attn_mask.dtype}")
        if attn_mask.dtype != torch.bool and attn_mask.dtype not in (q.dtype, torch.float32):
            attn_mask = attn_mask.to(q.dtype)
        if query.dim() > 4 or attn_mask.dim() > 4:
            # Leading batch dims are flattened into one for q/k/v; broadcast the mask over them first (a view).
            attn_mask = attn_mask.reshape((1,) * max(0, 3 - attn_mask.dim()) + tuple(attn_mask.shape))
            lead = torch.broadcast_shapes(tuple(query.shape[:-3]), tuple(attn_mask.shape[:-3]))
            attn_mask = attn_mask.expand(*lead, *attn_mask.shape[-3:]).reshape((-1,) + tuple(attn_mask.shape[-3:]))
    window_right = -1
    if is_causal:
        # SDPA's causal is top-left aligned (query i sees keys j <= i); fa2's is bottom-right. With seqlen_q >=
        # seqlen_k that is a right window of seqlen_q - seqlen_k; otherwise keys past seqlen_q are never seen,
        # so dropping them (a view) gives exactly top-left causal.
        if seqlen_q >= seqlen_k:
            window_right = seqlen_q - seqlen_k
        else:
            k, v = k[:, :, :seqlen_q], v[:, :, :seqlen_q]
            window_right = 0
    out = torch.ops.fa2.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask, scale,
                                  False, -1, window_right, 0.0, dropout_p)
    return out.transpose(1, 2).reshape(out_shape)


def _to_bhsd(t: torch.Tensor) -> torch.Tensor:
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t.unsqueeze(0)
    if t.dim() > 4:
        return t.reshape((-1,) + tuple(t.shape[-3:]))
    return t
