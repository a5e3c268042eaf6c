"""Hugging Face transformers integration: ``attn_implementation="fa2"``.

    import fa2.hf
    fa2.hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fa2")   # or .from_config(...)

transformers calls the attention function with (B, H, S, D) query/key/value (K/V with their own, fewer, heads for
GQA), the mask it built, and the model's scaling / softcap / sliding window. fa2 reads the (B, H, S, D) tensors
through transposed views (no copies), does GQA natively (no repeat_kv), and takes the mask as a bool ``attn_bias``.
The masks come from fa2's mask builder (``fa2_mask``, registered for "fa2"): None when the mask is plain causal (fa2
runs ``causal=True`` and skips the hidden blocks); for a causal mask with padding whose causal part is fa2's
bottom-right one (no cache, or a cache that ends where the queries end), the (batch, kv_length) padding mask alone, as
transformers' flash-attention builder returns it -- fa2 runs ``causal=True`` with a (B, 1, 1, kv_length) key mask,
the padding masks' fast kernels; anything else transformers' SDPA builder's boolean (B, 1, q, kv) mask (True = attend).
"""
from __future__ import annotations

import torch

__all__ = ["register", "fa2_attention_forward"]

NAME = "fa2"


def register(name: str = NAME) -> None:
    """Register fa2 with transformers' ``AttentionInterface`` (and its mask builder with
    ``AttentionMaskInterface``) under ``name``. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(name, fa2_attention_forward)
    AttentionMaskInterface.register(name, fa2_mask)


def fa2_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
             mask_function=None, attention_mask: torch.Tensor | None = None, local_size: int | None = None,
             allow_is_causal_skip: bool = True, **kwargs):
    """transformers' mask builder for "fa2". A plain causal mask over a 2-D padding mask, whose query positions
    (q_offset + i) and key positions (kv_offset + j) put the causal diagonal where fa2's bottom-right ``causal`` puts it
    (q_offset - kv_offset == kv_length - q_length), comes back as the (batch_size, kv_length) bool padding mask alone
    (None when nothing is padded); fa2_attention_forward runs it as ``causal=True`` plus a key mask. Any other mask
    (sliding / chunked / packed / bidirectional patterns, a static cache's extra slots, no padding mask) is
    transformers' sdpa_mask: a boolean (batch_size, 1, q_length, kv_length) mask or None."""
    from transformers import masking_utils as mu
    if mask_function is None:
        mask_function = mu.causal_mask_function
    prepare = getattr(mu, "prepare_padding_mask", None)
    ignore = getattr(mu, "_ignore_causal_mask_sdpa", None)
    if (mask_function is mu.causal_mask_function and local_size is None and prepare is not None and ignore is not None
            and attention_mask is not None and attention_mask.dim() == 2
            and q_offset - kv_offset == kv_length - q_length):
        padding = prepare(attention_mask, kv_length, kv_offset)[:, kv_offset:kv_offset + kv_length].bool()
        if allow_is_causal_skip and ignore(padding, q_length, kv_length, q_offset, kv_offset, None):
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
    """
    if dropout:
        raise NotImplementedError(
            f"fa2 has no attention dropout, got dropout={dropout} (module in training mode with attention_dropout > 0): "
            "set the config's attention dropout to 0 or use model.eval()")
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("fa2 does not support attention sinks (s_aux)")
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # A (batch, kv_length) padding mask (fa2_mask's, for a causal mask with bottom-right diagonal; or one a model
    # passes as it would to flash-attention): these keys hidden, the module's causality on top, as flash-attention
    # reads such a mask.
    key_padding = attention_mask is not None and attention_mask.dim() == 2
    if key_padding:
        attention_mask = attention_mask[:, None, None, :]
    # As transformers' SDPA path: the causal flag only when there is no mask (a mask already holds the causal part,
    # and may hold more, e.g. a bidirectional prefix) or a padding mask; a single query sees every key.
    causal = bool(is_causal) and (attention_mask is None or key_padding) and seqlen_q > 1
    bias = attention_mask
    if bias is not None and bias.shape[-1] > seqlen_k:
        bias = bias[..., :seqlen_k]
    if causal and not key_padding and seqlen_k > seqlen_q:
        # No mask with more keys than queries only happens for the prefill into an empty static cache: the causal
        # mask is top-left aligned there (the extra keys are empty slots), so drop them, as transformers does.
        # (fa2_mask's padding masks come with the bottom-right diagonal checked: a cache's past keys are real.)
        key, value = key[:, :, :seqlen_q], value[:, :, :seqlen_q]
        if position_bias is not None:
            position_bias = position_bias[..., :seqlen_q]
        seqlen_k = seqlen_q
    window_left = -1
    if sliding_window is not None and sliding_window > 0 and (attention_mask is None or key_padding):
        # transformers: key j visible iff j > i - sliding_window. Only without a mask: a given mask already holds
        # the window, at the true cache positions, which fa2's bottom-right anchor would not match (static or
        # padded caches).
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
            bias = torch.where(bias, position_bias, float("-inf"))
        else:
            bias = position_bias + bias
    if bias is not None and bias.dtype != torch.bool and bias.dtype not in (query.dtype, torch.float32):
        bias = bias.to(query.dtype)
    out = torch.ops.fa2.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), bias, scaling,
                                  causal, window_left, window_right, float(softcap or 0.0))
    return out, None
