"""Attention over a KV cache (inference): the public ``fa2.attention_with_kvcache``, and the Python-side registrations
of ``fa2::kvcache_fwd`` (declared in cpp/ops.cpp): its fake kernel (its Autograd kernel, forward only, is C++'s:
cpp/forward_only.cpp).

Semantics (docs/design.md, KV cache), as flash-attn's ``flash_attn_with_kvcache``: the new keys / values are written
into the caches in place at ``cache_seqlens[b]``, then attention runs over each sequence's first
``cache_seqlens[b] + seqlen_new`` keys.
"""
from __future__ import annotations

import torch

from ._ops_impl import _check_devices


def attention_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           k: torch.Tensor | None = None, v: torch.Tensor | None = None, *,
                           cache_seqlens: torch.Tensor | int | None = None, block_table: torch.Tensor | None = None,
                           cache_batch_idx: torch.Tensor | None = None, rotary_cos: torch.Tensor | None = None,
                           rotary_sin: torch.Tensor | None = None, rotary_interleaved: bool = False,
                           scale: float | None = None, causal: bool = False, window_left: int = -1,
                           window_right: int = -1, softcap: float = 0.0, num_splits: int = 0,
                           return_lse: bool = False):
    """Attention of q over a KV cache, appending new keys / values first, as flash-attn's ``flash_attn_with_kvcache``.

    q (batch, seqlen_q, nheads, headdim). Caches: contiguous (batch_cache, seqlen_cache, nheads_k, headdim), or paged
    (num_blocks, block_size, nheads_k, headdim) with ``block_table`` int32 (batch, max_blocks_per_seq), block_size a
    multiple of 16. ``cache_seqlens`` int32 (batch,) or an int: the keys already in the cache (None: the whole cache).
    ``k`` / ``v`` (batch, seqlen_new, nheads_k, headdim), when given, are written into the caches **in place** at
    positions ``cache_seqlens[b] ...`` (k rotated first when ``rotary_cos`` / ``rotary_sin`` (seqlen_ro, rotary_dim / 2)
    are given; q is rotated at the same positions: at ``cache_seqlens[b] + i`` when causal or windowed, else every row
    at ``cache_seqlens[b]``; ``rotary_interleaved`` pairs dims (2j, 2j + 1) instead of (j, j + rotary_dim / 2)). Then
    attention runs over the first ``cache_seqlens[b] + seqlen_new`` keys of each sequence, causal / windows aligned
    bottom-right over that length. ``cache_batch_idx`` int32 (batch,): the cache row of each batch element
    (contiguous caches). GQA, softcap, ``scale`` (default headdim ** -0.5) as :func:`fa2.attention`. ``num_splits``:
    0 = chosen by the library, 1 = no split-KV. Returns out (batch, seqlen_q, nheads, headdim), and lse float32
    (batch, nheads, seqlen_q) with ``return_lse``.

    Forward only (inference): calling it with inputs that require grad under grad mode raises (flash-attn returns
    outputs that silently carry no gradient). Input values that would need a device-to-host sync to read
    (cache_seqlens, block_table, cache_batch_idx on CUDA) are checked on CPU tensors only; see docs/design.md."""
    if isinstance(cache_seqlens, bool):
        raise TypeError("fa2.attention_with_kvcache: cache_seqlens must be an int32 tensor (batch,), an int or None, "
                        "got a bool")
    if isinstance(cache_seqlens, (int, torch.SymInt)):
        if isinstance(cache_seqlens, int):
            _check_int_cache_seqlens(cache_seqlens, k_cache, k, block_table)
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    out, lse = torch.ops.fa2.kvcache_fwd(
        q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, block_table=block_table,
        cache_batch_idx=cache_batch_idx, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
        rotary_interleaved=rotary_interleaved, scale=scale, causal=causal, window_left=window_left,
        window_right=window_right, softcap=softcap, num_splits=num_splits)
    return (out, lse) if return_lse else out


def _check_int_cache_seqlens(cache_seqlens: int, k_cache, k, block_table) -> None:
    # An int is known on the host: checked here on every device (the C++ checks read a tensor's values only on the
    # CPU), with the C++ checks' messages.
    if cache_seqlens < 0:
        raise ValueError(f"fa2.attention_with_kvcache: cache_seqlens must be >= 0, got {cache_seqlens}")
    if k is None or k_cache.dim() != 4 or (block_table is not None and block_table.dim() != 2):
        return  # (nothing appended, or shapes the C++ checks reject with their own message)
    capacity = k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)
    if cache_seqlens + k.shape[1] > capacity:
        raise ValueError(f"fa2.attention_with_kvcache: the cache is too short: cache_seqlens + seqlen_new = "
                         f"{cache_seqlens} + {k.shape[1]} keys, the cache holds {capacity}")


# ---- fake kernel: shapes from the inputs alone (SymInt-safe); the caches are mutated, nothing to do for them -------

@torch.library.register_fake("fa2::kvcache_fwd")
def _kvcache_fwd_fake(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None, block_table=None,
                      cache_batch_idx=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=False, scale=None,
                      causal=False, window_left=-1, window_right=-1, softcap=0.0, num_splits=0):
    # Only what the shapes need; every other check runs in the real kernels' shared C++ checks (cpp/checks.cpp,
    # check_kvcache_inputs), with these same messages.
    for name, t, dims in (("q", q, "(batch, seqlen_q, nheads, headdim)"),
                          ("v_cache", v_cache, "(batch_cache, seqlen_cache, nheads_k, headdim)")):
        if t.dim() != 4:
            raise ValueError(f"fa2.attention_with_kvcache: {name} must have 4 dims {dims}, got {t.dim()} dims with "
                             f"shape {list(t.shape)}")
    _check_devices(q, "fa2.attention_with_kvcache", k_cache=k_cache, v_cache=v_cache, k=k, v=v,
                   cache_seqlens=cache_seqlens, block_table=block_table, cache_batch_idx=cache_batch_idx,
                   rotary_cos=rotary_cos, rotary_sin=rotary_sin)
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, v_cache.shape[3]))
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
    return out, lse


# (Autograd: forward only, an error where an input requires grad under grad mode: registered in C++,
# cpp/forward_only.cpp, for its host time in every decode step)
