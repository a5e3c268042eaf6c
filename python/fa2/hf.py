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
- packed sequences that transformers detected from the position ids (no cache; eager mode, where the mask function
  can be read): the (B, S) integer sequence ids of its packed-sequence mask;
- anything else (custom mask functions, packed sequences under torch.compile, static caches, bidirectional masks):
  transformers' SDPA mask, (B, 1, q, kv) bool, passed as ``attn_bias``.

Packed (padding-free) batches run ``fa2.varlen_attention``, as transformers' flash-attention integrations run
``flash_attn_varlen_func``: from the ``cu_seq_lens_q`` / ``cu_seq_lens_k`` / ``max_length_q`` / ``max_length_k``
keyword arguments (``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``), from the sequence ids above, or
from position ids that restart (batch 1, ``DataCollatorWithFlattening``'s default). Padded batches run the key-row
padding kernel, or varlen over the padded layout with ``set_padded_batches("varlen")`` (docs/integrations.md).
"""
from __future__ import annotations

import warnings

import torch

__all__ = ["register", "fa2_attention_forward", "fa2_mask", "fa2_paged_attention_forward", "set_padded_batches"]

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
    sequence_ids = _packed_sequence_ids(mu, mask_function, local_size, kwargs.get("config"))
    if sequence_ids is not None and attention_mask is None and q_offset == 0 and kv_offset == 0 \
            and q_length == kv_length and tuple(sequence_ids.shape) == (batch_size, q_length):
        return sequence_ids
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
    if position_bias is not None and _is_sequence_ids(attention_mask):
        raise NotImplementedError("fa2: packed sequences (transformers' packed-sequence mask) with a position bias")
    if position_bias is None:
        out = _varlen_forward(query, key, value, attention_mask, scaling, is_causal, sliding_window, softcap, dropout,
                              kwargs)
        if out is not None:
            return out, None
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


# ---- packed and padded batches through varlen ----------------------------------------------------------------------
# (fa2_attention_forward hands these batches to _varlen_forward before its padded-attention path.)

PADDED_BATCHES = ("key_mask", "varlen")
_padded_batches = "key_mask"


def set_padded_batches(path: str) -> None:
    """How ``attn_implementation="fa2"`` runs a padded batch with as many queries as keys (training, prefill):
    ``"key_mask"`` (the default): fa2's attention with ``causal=True`` and a (B, 1, 1, S) key mask;
    ``"varlen"``: each row's real tokens moved to its front, ``fa2.varlen_attention`` over 2 * B segments (a row's
    tokens, then its padding, which sees no key), the output moved back; sliding-window layers keep the key mask.
    Read while tracing: set it before torch.compile traces the model."""
    global _padded_batches
    if path not in PADDED_BATCHES:
        raise ValueError(f"fa2.hf.set_padded_batches: path must be one of {PADDED_BATCHES}, got {path!r}")
    _padded_batches = path


class _PerForward:
    """The last value computed from a tensor, reused while that tensor is unchanged: every layer of a forward pass gets
    the same position ids / padding mask, so what needs the host (a device sync) is computed once per forward pass.
    Unchanged = the same storage (kept alive here, so its address cannot be handed to another tensor), offset, shape,
    strides and version counter; inference tensors have no version counter and are not kept."""

    def __init__(self):
        self._source, self._key, self._value = None, None, None

    @staticmethod
    def _key_of(tensor, extra):
        return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride(),
                tensor.dtype, tensor.device, tensor._version, extra)

    def get(self, tensor, extra, compute):
        if tensor.is_inference() or tensor.numel() == 0:
            return compute()
        try:
            key = self._key_of(tensor, extra)
        except (RuntimeError, NotImplementedError):  # no real storage (fake / functional tensors while tracing)
            return compute()
        if self._source is None or self._key != key:
            self._source, self._key, self._value = tensor, key, compute()
        return self._value


_starts_per_forward = _PerForward()


@torch.library.custom_op("fa2_hf::sequence_starts", mutates_args=())
def _sequence_starts(source: torch.Tensor, positions: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequences of a (B, S) tensor of position ids (``positions``: a sequence starts where the id is not the
    previous one + 1, transformers' find_packed_sequence_indices rule) or of sequence ids (a sequence starts where the
    id changes), its rows end to end (a row always starts a sequence). Returns (starts, longest): starts int32 (n,),
    the first token of each sequence in the flattened (B * S) order; longest, an empty (max length, 0) tensor whose
    first size carries the longest sequence's length as an int (under torch.compile an unbacked SymInt: no
    recompilation when the lengths change). One device sync per forward pass (_PerForward)."""
    return tuple(t.clone() for t in _starts_per_forward.get(source, positions,
                                                             lambda: _compute_sequence_starts(source, positions)))


@_sequence_starts.register_fake
def _sequence_starts_fake(source, positions):
    ctx = torch.library.get_ctx()
    count, longest = _data_dependent_size(ctx, source.numel()), _data_dependent_size(ctx, source.shape[-1])
    return source.new_empty((count,), dtype=torch.int32), source.new_empty((longest, 0), dtype=torch.int8)


def _data_dependent_size(ctx, upper):
    """An unbacked SymInt in [0, upper]. ctx.new_dynamic_size() makes Dynamo break the graph unless fullgraph=True or
    capture_dynamic_output_shape_ops is set; these sizes only size cu_seqlens and carry max_seqlen (nothing branches
    on them), so they are made directly, as torch's own device_mesh ops make theirs."""
    shape_env = getattr(ctx, "_shape_env", None)
    if shape_env is None:
        return ctx.new_dynamic_size()  # (no symbolic shapes: its usual error)
    from torch.fx.experimental.symbolic_shapes import _constrain_range_for_size
    size = shape_env.create_unbacked_symint()
    _constrain_range_for_size(size, min=0, max=upper if isinstance(upper, int) else None)
    return size


def _compute_sequence_starts(source, positions):
    if source.dim() != 2:
        raise ValueError(f"fa2.hf: position / sequence ids must be (batch, seqlen), got shape {list(source.shape)}")
    ids = source.cpu()  # (the one sync: the sizes are needed on the host)
    new = torch.ones(ids.shape, dtype=torch.bool)
    step = 1 if positions else 0
    new[:, 1:] = ids[:, 1:] != ids[:, :-1] + step
    starts = new.reshape(-1).nonzero().reshape(-1)
    lengths = torch.diff(starts, append=starts.new_full((1,), ids.numel()))
    longest = int(lengths.max()) if lengths.numel() else 0
    return (starts.to(device=source.device, dtype=torch.int32),
            torch.empty((longest, 0), dtype=torch.int8, device=source.device))


def _cu_seqlens_of(source, positions):
    """(cu_seqlens int32 (n + 1,), max_seqlen) of the sequences of a (B, S) id tensor (see _sequence_starts)."""
    starts, longest = torch.ops.fa2_hf.sequence_starts(source, positions)
    return torch.cat([starts, starts.new_full((1,), source.numel())]), longest.shape[0]


def _host_int(value, bound):
    """A max length as an int: as given, or from a tensor (transformers' own cu_seqlens helpers make one): its value
    in eager mode (a sync), the bound (total tokens: valid, no sync) under torch.compile."""
    if not isinstance(value, torch.Tensor):
        return value
    return bound if torch.compiler.is_compiling() else int(value.max())


def _padded_layout(padding):
    """For a (B, S) bool padding mask (True = a real token): the flat row order that moves each row's real tokens to
    its front (order kept), its inverse, and the varlen segments of that order: row b's real tokens, then its padding
    (seqused_k 0: sees no key, outputs 0)."""
    batch, seqlen = padding.shape
    order = torch.argsort((~padding).to(torch.uint8), dim=-1, stable=True)
    row_start = torch.arange(batch, device=padding.device)[:, None] * seqlen
    gather = (order + row_start).reshape(-1)
    scatter = (torch.argsort(order, dim=-1) + row_start).reshape(-1)
    real = padding.sum(-1, dtype=torch.int32)
    segments = torch.stack([real, seqlen - real], dim=-1).reshape(-1)
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(segments, 0, dtype=torch.int32), (1, 0))
    seqused_k = torch.stack([real, torch.zeros_like(real)], dim=-1).reshape(-1)
    return gather, scatter, cu_seqlens, seqused_k


_padded_per_forward = _PerForward()


def _is_sequence_ids(mask) -> bool:
    """fa2_mask's packed form: (B, S) integer sequence ids (its padding form is bool, transformers' masks 4-D)."""
    return (mask is not None and mask.dim() == 2 and not mask.dtype.is_floating_point and mask.dtype != torch.bool)


def _packed_sequences(query, key, attention_mask, kwargs):
    """(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) when the batch is packed, else None."""
    batch, seqlen_q, seqlen_k = query.shape[0], query.shape[2], key.shape[2]
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    sequence_ids = _is_sequence_ids(attention_mask)
    if all(x is not None for x in (cu_q, cu_k, max_q, max_k)):
        # (DataCollatorWithFlattening(return_flash_attn_kwargs=True)): as transformers' flash-attention path
        if attention_mask is not None and not sequence_ids:
            if attention_mask.dim() == 4:
                return None  # (a mask transformers built: it holds the packing, and may hold more)
            raise ValueError("fa2: a padding attention_mask together with cu_seq_lens_q / cu_seq_lens_k (packed "
                             "sequences): pass one or the other")
        if seqlen_q != seqlen_k:
            raise NotImplementedError(f"fa2: packed sequences (cu_seq_lens_q / cu_seq_lens_k) with cached keys "
                                      f"({seqlen_k} keys for {seqlen_q} queries)")
        total_q, total_k = batch * seqlen_q, batch * seqlen_k
        return (cu_q.to(torch.int32), cu_k.to(torch.int32), _host_int(max_q, total_q), _host_int(max_k, total_k))
    if sequence_ids:  # fa2_mask's packed form
        cu, longest = _cu_seqlens_of(attention_mask, positions=False)
        return cu, cu, longest, longest
    position_ids = kwargs.get("position_ids")
    if (attention_mask is None and batch == 1 and seqlen_q == seqlen_k and seqlen_q > 1
            and isinstance(position_ids, torch.Tensor) and tuple(position_ids.shape) == (1, seqlen_q)):
        # Packed position ids (DataCollatorWithFlattening's default): batch 1, as transformers' flash-attention path.
        # Eager mode looks (once per forward pass) and keeps the dense kernels for one sequence; a compiled graph
        # cannot look, so it runs varlen, one sequence or several.
        cu, longest = _cu_seqlens_of(position_ids, positions=True)
        if not torch.compiler.is_compiling() and cu.shape[0] == 2:
            return None
        return cu, cu, longest, longest
    return None


def _varlen_forward(query, key, value, attention_mask, scaling, is_causal, sliding_window, softcap, dropout, kwargs):
    """Packed batches, and padded ones when set_padded_batches("varlen"), through fa2.varlen_attention: the output
    (B, Sq, H, Dv); None for every other batch (fa2_attention_forward's paths)."""
    from .varlen import varlen_attention
    batch, nheads, seqlen_q, _ = query.shape
    nheads_k, seqlen_k = key.shape[1], key.shape[2]
    window_left = sliding_window - 1 if sliding_window is not None and sliding_window > 0 else -1
    flags = dict(scale=scaling, softcap=float(softcap or 0.0), dropout_p=float(dropout or 0.0),
                 sinks=kwargs.get("s_aux"))  # (gpt-oss's sinks, as the padded path passes them)

    def packed_rows():  # (total, heads, head dim): views when the (B, H, S, D) tensors are (B, S, H, D) in memory
        return (query.transpose(1, 2).reshape(batch * seqlen_q, nheads, query.shape[-1]),
                key.transpose(1, 2).reshape(batch * seqlen_k, nheads_k, key.shape[-1]),
                value.transpose(1, 2).reshape(batch * seqlen_k, nheads_k, value.shape[-1]))
    if (_padded_batches == "varlen" and attention_mask is not None and attention_mask.dtype == torch.bool
            and attention_mask.dim() == 2 and seqlen_q == seqlen_k and seqlen_q > 1 and window_left < 0):
        # fa2_mask's padding form: causal over each row's real tokens. Not with a window: transformers' window counts
        # positions, and a row with padding inside (not only at its ends) would get it over its real tokens.
        layout = (_padded_layout(attention_mask) if torch.compiler.is_compiling() else
                  _padded_per_forward.get(attention_mask, None, lambda: _padded_layout(attention_mask)))
        gather, scatter, cu_seqlens, seqused_k = layout
        q, k, v = (t.index_select(0, gather) for t in packed_rows())
        out = varlen_attention(q, k, v, cu_seqlens, cu_seqlens, seqlen_q, seqlen_k, seqused_k=seqused_k, causal=True,
                               window_left=window_left, **flags)
        return out.index_select(0, scatter).view(batch, seqlen_q, nheads, -1)
    packed = _packed_sequences(query, key, attention_mask, kwargs)
    if packed is None:
        return None
    q, k, v = packed_rows()
    causal = bool(is_causal)
    # transformers' flash path: a bidirectional layer's window reaches both ways
    window_right = -1 if causal or window_left < 0 else window_left
    out = varlen_attention(q, k, v, *packed, causal=causal, window_left=window_left, window_right=window_right,
                           **flags)
    return out.view(batch, seqlen_q, nheads, -1)


_mask_function_codes = None  # (and_masks' function's code, packed_sequence_mask_function's function's code)


def _closure_of(fn) -> dict:
    return dict(zip(fn.__code__.co_freevars, (cell.cell_contents for cell in fn.__closure__ or ())))


def _packed_sequence_ids(mu, mask_function, local_size, config):
    """The (B, S) sequence ids of transformers' packed-sequence mask when mask_function is exactly
    ``and_masks(<causal, or the config's sliding-window causal>, packed_sequence_mask_function(ids))`` (transformers
    found restarting position ids, with no cache); else None. Read from the mask function's closure, which Dynamo
    cannot read: in eager mode only (compiled, such a mask stays transformers' 4-D mask)."""
    global _mask_function_codes
    if torch.compiler.is_compiling() or not callable(mask_function):
        return None
    if _mask_function_codes is None:
        _mask_function_codes = (mu.and_masks(mu.causal_mask_function).__code__,
                                mu.packed_sequence_mask_function(torch.zeros(1, 1)).__code__)
    and_code, packed_code = _mask_function_codes
    if getattr(mask_function, "__code__", None) is not and_code:
        return None
    parts = _closure_of(mask_function).get("mask_functions", ())
    if len(parts) != 2 or getattr(parts[1], "__code__", None) is not packed_code:
        return None
    if not _is_causal_family(mu, parts[0], local_size, config):
        return None
    ids = _closure_of(parts[1]).get("packed_sequence_mask")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        return None
    return ids
