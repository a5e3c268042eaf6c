"""Fake kernel of the internal ``fa2::_decode_attention`` op (the CUDA decode kernel alone, for tests and
benchmarks; the public entry point is ``fa2.attention_with_kvcache``): out shaped like q (contiguous), lse float32
(batch, nheads, seqlen_q)."""
from __future__ import annotations

import torch


@torch.library.register_fake("fa2::_decode_attention")
def _decode_attention_fake(q, k_cache, v_cache, seqlens_k, block_table=None, cache_batch_idx=None, scale=None,
                           causal=False, window_left=-1, window_right=-1, softcap=0.0, num_splits=0):
    if q.dim() != 4:
        raise ValueError(f"fa2._decode_attention: q must be (batch, seqlen_q, nheads, d), got shape {list(q.shape)}")
    batch, seqlen_q, nheads, _ = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
    return out, lse
