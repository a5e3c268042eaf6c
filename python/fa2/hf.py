"""Hugging Face transformers integration: ``attn_implementation="fa2"``.

    import fa2.hf
    fa2.hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fa2")   # or .from_config(...)

transformers calls the attention function with (B, H, S, D) query/key/value (K/V with their own, fewer, heads for
GQA), the mask its mask builder made, and the model's scaling / softcap / sliding window. fa2 reads the (B, H, S, D)
tensors through transposed views (no copies) and does GQA natively (no repeat_kv).

The mask builder registered for "fa2" (``fa2_mask``, with transformers' AttentionMaskInterface, as its
flash-attention integrations register theirs) decides on the host, from sizes and offsets alone, so it gives the
same answer eager and under torch.compile (transformers' SDPA builder always materializes the 4-D mask while
tracing):
- a plain causal (or sliding-window causal) mask whose diagonal is fa2's bottom-right one and no padding: ``None``;
  fa2 runs ``causal=True`` (and the layer's window) and skips the hidden blocks;
- the same over a padded batch: the (B, kv) bool padding mask, True = a real token; fa2 runs ``causal=True`` with a
  (B, 1, 1, kv) key mask (the padding masks' fast kernels), the window from the layer as above;
- anything else (custom mask functions, packed sequences, static caches, bidirectional masks): transformers' SDPA
  mask, (B, 1, q, kv) bool, passed as ``attn_bias``.
"""
from __future__ import annotations

import warnings

import torch

__all__ = ["register", "fa2_attention_forward", "fa2_mask", "fa2_paged_attention_forward"]

NAME = "fa2"

# transformers.masking_utils, resolved once outside any traced call: an import inside fa2_mask breaks the graph
# under torch.compile (Dynamo of torch <= 2.12 refuses the import result, transformers being a lazy module).
_masking_utils = None


def _masking():
    global _masking_utils
    if _masking_utils is None:
        from transformers import masking_utils
        _masking_utils = masking_utils
    return _masking_utils


def register(name: str = NAME) -> None:
    """Register fa2 with transformers' ``AttentionInterface`` (and its mask builder with
    ``AttentionMaskInterface``) under ``name``, and under ``"paged|" + name`` for continuous batching. Idempotent."""
    from transformers import AttentionInterface
    mu = _masking()
    AttentionInterface.register(name, fa2_attention_forward)
    mu.AttentionMaskInterface.register(name, fa2_mask)
    # transformers' continuous batching (generate_batch, PagedAttentionCache) looks for "paged|<name>"
    AttentionInterface.register(f"paged|{name}", fa2_paged_attention_forward)


def _is_host_int(x) -> bool:
    return isinstance(x, (int, torch.SymInt))


def _is_causal_family(mu, mask_function, local_size, config) -> bool:
    """True when mask_function is transformers' plain causal mask, or its sliding-window causal one (whose window the
    layer passes to the attention function as ``sliding_window``, as it does for flash-attention)."""
    if local_size is None:
        return mask_function is mu.causal_mask_function
    # create_sliding_window_causal_mask passes local_size=config.sliding_window; the chunked (attention_chunk_size)
    # and bidirectional (config.is_causal False) builders pass a local_size too, and are left to the 4-D mask
    return (config is not None and getattr(config, "sliding_window", None) == local_size
            and getattr(config, "attention_chunk_size", None) != local_size and getattr(config, "is_causal", True))


def fa2_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
             mask_function=None, attention_mask: torch.Tensor | None = None, local_size: int | None = None,
             allow_is_causal_skip: bool = True, **kwargs):
    """transformers' mask builder for "fa2": None (plain causal), a (B, kv) bool padding mask (causal over padding),
    or transformers' sdpa_mask (everything else); see the module's docstring.

    The causal forms are used when transformers allows skipping the mask (``allow_is_causal_skip``: no overlay, no
    packed sequences, not the decoding step of a compiled static cache), the mask function is the plain or
    sliding-window causal one, and the query positions (q_offset + i) and key positions (kv_offset + j) put the
    causal diagonal where fa2's bottom-right ``causal`` puts it: q_offset - kv_offset == kv_length - q_length, with
    offsets known on the host (a static cache's are tensors: its 4-D mask then)."""
    mu = _masking()
    if mask_function is None:
        mask_function = mu.causal_mask_function
    if (allow_is_causal_skip and _is_causal_family(mu, mask_function, local_size, kwargs.get("config"))
            and all(_is_host_int(x) for x in (q_length, kv_length, q_offset, kv_offset))
            and q_offset - kv_offset == kv_length - q_length):
        # None means SDPA's top-left causal to the attention function; it is fa2's bottom-right one only where
        # the two agree (as many keys as queries, or one query): elsewhere (a chunk after cached tokens) the
        # (B, kv) form, all keys real if there is no padding mask
        top_left_is_bottom_right = q_length == kv_length or q_length == 1
        if attention_mask is None:
            if top_left_is_bottom_right:
                return None
            return torch.ones(batch_size, kv_length, dtype=torch.bool, device=kwargs.get("device", "cpu"))
        padding = mu.prepare_padding_mask(attention_mask, kv_length, kv_offset)[:, kv_offset:kv_offset + kv_length]
        padding = padding.bool()
        # no padding at all: plain causal, when the values can be read (as sdpa_mask; never while tracing)
        tracing = mu.is_tracing(padding) if hasattr(mu, "is_tracing") else torch.compiler.is_compiling()
        if top_left_is_bottom_right and not tracing and bool(padding.all()):
            return None
        return padding
    return mu.sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                        kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                        local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, **kwargs)


def fa2_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          is_causal: bool | None = None, sliding_window: int | None = None,
                          softcap: float | None = None, position_bias: torch.Tensor | None = None,
                          **kwargs) -> tuple[torch.Tensor, None]:
    """transformers attention function. query (B, H, Sq, D), key/value (B, Hk, Sk, D); returns ((B, Sq, H, D), None).
    attention_mask: None, fa2_mask's (B, kv) padding form, or a 4-D mask (bool or additive)."""
    if kwargs.get("indices") is not None:  # (DeepSeek-V3.2-style sparse attention: the keys each query reads)
        raise NotImplementedError("fa2 does not support sparse attention (indices): it would compute dense attention")
    if kwargs.get("output_attentions"):
        # (as transformers' sdpa and flash paths: the weights are never materialized; say so rather than return none)
        warnings.warn("fa2 does not return attention weights (output_attentions=True): they are None; use "
                      "attn_implementation=\"eager\" to get them", stacklevel=2)
    # (MLA, DeepSeek-V2/V3: a value head dim other than the query/key one goes to the op as it is; out takes v's)
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # a (B, kv) mask is fa2_mask's causal over padding (bottom-right diagonal checked there): causal with a key
    # mask, whatever the module says (some compute is_causal as "no mask given")
    key_padding = attention_mask is not None and attention_mask.dim() == 2
    if key_padding:
        attention_mask = attention_mask[:, None, None, :]
    # As transformers' SDPA path: the causal flag only when there is no mask (a mask already holds the causal part,
    # and may hold more, e.g. a bidirectional prefix); a single query sees every key.
    causal = (key_padding or (bool(is_causal) and attention_mask is None)) and seqlen_q > 1
    bias = attention_mask
    if bias is not None and bias.shape[-1] > seqlen_k:
        bias = bias[..., :seqlen_k]
    if causal and not key_padding and seqlen_k > seqlen_q:
        # No mask with more keys than queries only happens for the prefill into an empty static cache (fa2_mask
        # gives None only where seqlen_q == seqlen_k or 1): the causal mask is top-left aligned there (the extra keys
        # are empty slots), so drop them, as transformers does.
        key, value = key[:, :, :seqlen_q], value[:, :, :seqlen_q]
        if position_bias is not None:
            position_bias = position_bias[..., :seqlen_q]
        seqlen_k = seqlen_q
    window_left = -1
    if sliding_window is not None and sliding_window > 0 and (attention_mask is None or key_padding):
        # transformers: key j visible iff j > i - sliding_window. Only without a 4-D mask: such a mask already holds
        # the window, at the true cache positions, which fa2's bottom-right anchor would not match (static caches).
        # fa2_mask's None and (B, kv) forms come with the bottom-right diagonal, and the layer passes its window, as
        # it does for flash-attention.
        window_left = sliding_window - 1
    window_right = -1
    if causal and not key_padding and seqlen_q > seqlen_k:  # top-left causal with more queries than keys
        causal, window_right = False, seqlen_q - seqlen_k
        if window_left >= 0:
            window_left -= seqlen_q - seqlen_k
            if window_left < 0:
                raise NotImplementedError("a sliding window shorter than seqlen_q - seqlen_k with no mask")
    if position_bias is not None:
        # T5: a learned additive bias; a bool mask hides keys on top of it
        if bias is None:
            bias = position_bias
        elif bias.dtype == torch.bool:
            # added as transformers adds its float mask (the dtype's minimum): a row that sees no key (a fully padded
            # encoder row) averages uniformly as in eager, and the bias gets eager's gradient there too
            zero = position_bias.new_zeros(())
            bias = position_bias + torch.where(bias, zero, zero + torch.finfo(position_bias.dtype).min)
        else:
            bias = position_bias + bias
    if bias is not None and bias.dtype != torch.bool and bias.dtype not in (query.dtype, torch.float32):
        bias = bias.to(query.dtype)
    # dropout: the layer's attention dropout (transformers passes 0.0 in eval mode); gpt-oss's learned sinks (s_aux,
    # (H,)): an extra logit in each row's softmax denominator, as its eager attention
    out = torch.ops.fa2.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), bias, scaling,
                                  causal, window_left, window_right, float(softcap or 0.0), float(dropout or 0.0),
                                  kwargs.get("s_aux"))
    return out, None


def fa2_paged_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                attention_mask=None, cache=None, cu_seq_lens_q=None, cu_seq_lens_k=None,
                                max_seqlen_q=None, max_seqlen_k=None, block_table=None,
                                **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' continuous batching ("paged|fa2"), as its flash_paged integration: query / key / value (1, heads,
    tokens, D) packed over the batch's requests. A batch of decode steps (block_table given) runs
    fa2.attention_with_kvcache on the paged cache, which appends each request's token itself; other batches append
    through the cache, which reads every request's keys back packed, and run fa2.varlen_attention (causal per
    request). Returns ((tokens, heads, D), None)."""
    import fa2
    if cache is None:
        raise ValueError("fa2: \"paged|fa2\" needs transformers' paged attention cache (continuous batching: "
                         "model.generate_batch); use attn_implementation=\"fa2\" for a standard forward")
    window_left = module.sliding_window - 1 if getattr(module, "sliding_window", None) else -1
    if isinstance(cu_seq_lens_k, dict):
        layer_type = "full_attention" if window_left < 0 else "sliding_attention"
        cu_seq_lens_k, max_seqlen_k = cu_seq_lens_k[layer_type], max_seqlen_k[layer_type]
    if block_table is None:
        key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx,
                                  read_index=kwargs["read_index"], write_index=kwargs["write_index"])
        out = fa2.varlen_attention(query.transpose(1, 2).squeeze(0), key, value, cu_seq_lens_q.int(),
                                   cu_seq_lens_k.int(), max_seqlen_q, max_seqlen_k, scale=module.scaling, causal=True,
                                   window_left=window_left)
        return out, None
    group, layer_in_group = cache.layer_index_to_group_indices[module.layer_idx]
    cache_shape = (-1, cache.block_size, cache.num_key_value_heads, cache.head_dim)
    k_cache = cache.key_cache[layer_in_group].view(cache_shape)
    v_cache = cache.value_cache[layer_in_group].view(cache_shape)
    # one token per request: (requests, 1, heads, D); each request's keys so far end at cu_seq_lens_k[b + 1]
    query, key, value = (t.permute(2, 0, 1, 3) for t in (query, key, value))
    requests = key.shape[0]
    cache_seqlens = (cu_seq_lens_k[1:requests + 1] - cu_seq_lens_k[:requests] - 1).int()
    out = fa2.attention_with_kvcache(query.contiguous(), k_cache, v_cache, key, value, cache_seqlens=cache_seqlens,
                                     block_table=block_table[group], scale=module.scaling, causal=True,
                                     window_left=window_left)
    return out.squeeze(1), None
