"""Hugging Face transformers integration: ``attn_implementation="fa2"``.

    import fa2.hf
    fa2.hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fa2")   # or .from_config(...)

transformers calls the attention function with (B, H, S, D) query/key/value (K/V with their own, fewer, heads for
GQA), the mask it built, and the model's scaling / softcap / sliding window. fa2 reads the (B, H, S, D) tensors
through transposed views (no copies), does GQA natively (no repeat_kv), and takes the mask as a bool ``attn_bias``.
The masks are those of transformers' SDPA builder (``fa2_mask`` wraps it, registered for "fa2"): boolean (B, 1, q, kv),
True = attend, or None when the mask is plain causal (fa2 runs ``causal=True`` and skips the hidden blocks). Models
get exactly the masks they get with "sdpa". For a causal mask over padding whose diagonal is fa2's bottom-right one
(no cache, or a dynamic cache that ends where the queries end), fa2_mask also remembers which keys are padded: when
that very mask object reaches fa2_attention_forward (not sliced or copied on the way, not under torch.compile), fa2
runs ``causal=True`` with a (B, 1, 1, kv) key mask, the padding masks' fast kernels, instead of the 4-D mask (the same
keys visible).
"""
from __future__ import annotations

import warnings
import weakref

import torch

__all__ = ["register", "fa2_attention_forward", "fa2_mask"]

NAME = "fa2"


def register(name: str = NAME) -> None:
    """Register fa2 with transformers' ``AttentionInterface`` (and its mask builder with
    ``AttentionMaskInterface``) under ``name``. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(name, fa2_attention_forward)
    AttentionMaskInterface.register(name, fa2_mask)


# fa2_mask's note of the 4-D masks that are a causal mask (fa2's bottom-right diagonal) over padding: id(mask) ->
# (a weak reference to the mask, its version counter then, its (B, kv) padding). An entry leaves with its mask (the
# weak reference's callback), so an id is never matched against a later tensor; a mask changed in place since (its
# version moved) is not matched either.
_CAUSAL_OVER_PADDING: dict = {}


def _note_causal_over_padding(mask: torch.Tensor, padding: torch.Tensor) -> None:
    key = id(mask)
    _CAUSAL_OVER_PADDING[key] = (weakref.ref(mask, lambda _, key=key: _CAUSAL_OVER_PADDING.pop(key, None)),
                                 mask._version, padding)


def _padding_of(mask) -> torch.Tensor | None:
    """The (B, kv) padding of a mask fa2_mask built as causal over padding (this very object), else None."""
    if mask is None or torch.compiler.is_compiling():
        return None
    entry = _CAUSAL_OVER_PADDING.get(id(mask))
    return entry[2] if entry is not None and entry[0]() is mask and entry[1] == mask._version else None


def fa2_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
             mask_function=None, attention_mask: torch.Tensor | None = None, local_size: int | None = None,
             allow_is_causal_skip: bool = True, **kwargs):
    """transformers' mask builder for "fa2": transformers' sdpa_mask, unchanged. When that mask is a plain causal mask
    over a 2-D padding mask whose query positions (q_offset + i) and key positions (kv_offset + j) put the causal
    diagonal where fa2's bottom-right ``causal`` puts it (q_offset - kv_offset == kv_length - q_length, offsets known
    on the host), the padding is noted for fa2_attention_forward (eager execution only)."""
    from transformers import masking_utils as mu
    if mask_function is None:
        mask_function = mu.causal_mask_function
    mask = mu.sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                        kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                        local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, **kwargs)
    prepare = getattr(mu, "prepare_padding_mask", None)
    if (isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.dtype == torch.bool
            and not torch.compiler.is_compiling()
            and mask_function is mu.causal_mask_function and local_size is None and prepare is not None
            and isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2
            and all(isinstance(x, int) for x in (q_length, kv_length, q_offset, kv_offset))  # (a static cache: tensors)
            and q_offset - kv_offset == kv_length - q_length):
        padding = prepare(attention_mask, kv_length, kv_offset)[:, kv_offset:kv_offset + kv_length].bool()
        if padding.shape == (mask.shape[0], mask.shape[-1]):
            _note_causal_over_padding(mask, padding)
    return mask


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
    if kwargs.get("indices") is not None:  # (DeepSeek-V3.2-style sparse attention: the keys each query reads)
        raise NotImplementedError("fa2 does not support sparse attention (indices): it would compute dense attention")
    if kwargs.get("output_attentions"):
        # (as transformers' sdpa and flash paths: the weights are never materialized; say so rather than return none)
        warnings.warn("fa2 does not return attention weights (output_attentions=True): they are None; use "
                      "attn_implementation=\"eager\" to get them", stacklevel=2)
    head_dim_v = value.shape[-1]
    if query.shape[-1] != head_dim_v:
        # MLA (DeepSeek-V2/V3): the value head dim differs from the query/key one. fa2 takes one headdim: the smaller
        # side is padded with zeros (no change to the scores when q/k are padded: the scale is fixed first, from
        # the query's own headdim; zero columns of v give zero columns of out, sliced off).
        scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
        width = max(query.shape[-1], head_dim_v)
        pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[-1])) if t.shape[-1] < width else t  # noqa: E731
        query, key, value = pad(query), pad(key), pad(value)
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # a mask fa2_mask noted as causal over padding: the padding as a key mask, and the causal flag (whatever the
    # module says: some compute is_causal as "no mask given")
    padding = _padding_of(attention_mask)
    key_padding = padding is not None
    if key_padding:
        attention_mask = padding[:, None, None, :]
    # As transformers' SDPA path: the causal flag only when there is no mask (a mask already holds the causal part,
    # and may hold more, e.g. a bidirectional prefix); a single query sees every key.
    causal = (key_padding or (bool(is_causal) and attention_mask is None)) and seqlen_q > 1
    bias = attention_mask
    if bias is not None and bias.shape[-1] > seqlen_k:
        bias = bias[..., :seqlen_k]
    if causal and not key_padding and seqlen_k > seqlen_q:
        # No mask with more keys than queries only happens for the prefill into an empty static cache: the causal
        # mask is top-left aligned there (the extra keys are empty slots), so drop them, as transformers does.
        # (a noted causal-over-padding mask comes with the bottom-right diagonal checked: a cache's past keys are real)
        key, value = key[:, :, :seqlen_q], value[:, :, :seqlen_q]
        if position_bias is not None:
            position_bias = position_bias[..., :seqlen_q]
        seqlen_k = seqlen_q
    window_left = -1
    if sliding_window is not None and sliding_window > 0 and attention_mask is None:
        # transformers: key j visible iff j > i - sliding_window. Only without a mask: a given mask already holds
        # the window, at the true cache positions, which fa2's bottom-right anchor would not match (static or
        # padded caches); a noted causal-over-padding mask holds none (as its 4-D form, which SDPA reads alone).
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
    out = torch.ops.fa2.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), bias, scaling,
                                  causal, window_left, window_right, float(softcap or 0.0))
    if out.shape[-1] != head_dim_v:
        out = out[..., :head_dim_v]
    return out, None
