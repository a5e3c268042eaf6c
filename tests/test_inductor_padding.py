"""The Inductor pass on padding masks built in the graph (issue 52: left-padded decoders, Gemma-3's sliding window):
``band(i, j) & padding[b, j]`` becomes causal / window flags plus a key-row mask, exactly -- including the rows that
see no key, which eager (a finite fill) averages uniformly over every key -- and a mask whose data depends on the query
stays one bias. Each test checks the pass's report and outputs and gradients against eager and a float64 reference.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fa2.backend  # noqa: F401  (registers the "fa2" and "fa2_eager" backends)
from fa2.inductor.masks import EMPTY_ROWS_NOTE, KEY_ROW_SPLIT
from test_inductor_patterns import DEVICE_DTYPES, D, H, S, assert_rewritten, check_numerics, run

BATCH = 3


def _padding(device):
    """Sequence 0 unpadded, 1 left-padded by 5 (its first rows see no key under causal), 2 all padding."""
    pad = torch.ones(BATCH, S, dtype=torch.long, device=device)
    pad[1, :5] = 0
    pad[2] = 0
    return pad


def _qkv(device, dtype, hk=H):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(BATCH, h, S, D, generator=g).to(device=device, dtype=dtype) for h in (H, hk, hk)]


def _band(s, device, window=None):
    """transformers' causal (and sliding-window) mask function over the positions, (1, 1, s, s) bool."""
    i = torch.arange(s, device=device)
    keep = i[None, :] <= i[:, None]
    if window is not None:
        keep = keep & (i[None, :] > i[:, None] - window)
    return keep[None, None]


def _hf_mask(pad, s, window=None):
    # (masking_utils: the padding read as padding_mask[batch_idx, kv_idx], and-ed with the band)
    return _band(s, pad.device, window) & pad.bool()[:, None, None, :]


def _additive(mask, dtype):
    """where(mask, 0, finfo.min) in ``dtype`` (transformers' eager_mask)."""
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.finfo(dtype).min)


def _repeat_kv(x, heads):
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def attn_eager_added(q, k, v, pad, window=None):
    """transformers' eager attention: where(mask, 0, finfo.min) added to the scores, softmax in float32 (float64 for
    the reference: float64's minimum is -inf in float32)."""
    mask = _additive(_hf_mask(pad, q.shape[-2], window), q.dtype)
    k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    s = q @ k.transpose(-1, -2) * D ** -0.5 + mask
    return F.softmax(s, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype) @ v


def attn_masked_fill(q, k, v, pad):
    """The scores overwritten by the dtype's minimum where the mask hides a key (no gradient there)."""
    s = (q @ k.transpose(-1, -2) * D ** -0.5).masked_fill(~_hf_mask(pad, q.shape[-2]), torch.finfo(q.dtype).min)
    return s.softmax(-1) @ v


def attn_sdpa_bool(q, k, v, pad):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_hf_mask(pad, q.shape[-2]))


def attn_expand_mask(q, k, v, pad):
    """transformers' older _prepare_4d_causal_attention_mask: a float causal mask, the padding inverted in float
    and masked_fill'ed onto it."""
    s, dtype, fmin = q.shape[-2], q.dtype, torch.finfo(q.dtype).min
    i = torch.arange(s, device=q.device)
    causal = torch.full((s, s), fmin, dtype=dtype, device=q.device).masked_fill(i < (i + 1).view(s, 1), 0)
    expanded = pad[:, None, None, :].expand(pad.shape[0], 1, s, s).to(dtype)
    inverted = 1.0 - expanded
    inverted = inverted.masked_fill(inverted.to(torch.bool), fmin)
    mask = causal[None, None].expand(pad.shape[0], 1, s, s).masked_fill(inverted.bool(), fmin)
    return (q @ k.transpose(-1, -2) * D ** -0.5 + mask).softmax(-1) @ v


def attn_shared_key_padding(q, k, v, pad):
    """One (seqlen,) padding for the whole batch, converted before it is broadcast."""
    keep = pad[1].bool()
    mask = _band(q.shape[-2], q.device) & keep[None, None, None, :]
    return (q @ k.transpose(-1, -2) * D ** -0.5).masked_fill(~mask, torch.finfo(q.dtype).min).softmax(-1) @ v


def attn_query_padding(q, k, v, pad):
    """The padding and-ed on the queries too: the mask depends on the query through data, so it stays a bias."""
    p = pad.bool()
    mask = _band(q.shape[-2], q.device) & p[:, None, :, None] & p[:, None, None, :]
    return (q @ k.transpose(-1, -2) * D ** -0.5 + _additive(mask, q.dtype)).softmax(-1) @ v


def attn_softcap_added(q, k, v, pad):
    s = q @ k.transpose(-1, -2) * D ** -0.5
    s = torch.tanh(s / 20.0) * 20.0 + _additive(_hf_mask(pad, q.shape[-2]), q.dtype)
    return s.softmax(-1) @ v


def _split(records, causal=True, **flags):
    assert_rewritten(records, causal=causal, key_row=True, **flags)
    for r in records:
        assert KEY_ROW_SPLIT in r.flags.get("note", ""), str(r)


@pytest.mark.parametrize("window,train", [(None, True), (4, True), (4, False),
                                          pytest.param(None, False, marks=pytest.mark.slow)])
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_left_padded_eager_mask_becomes_flags_and_a_key_row(device, dtype, window, train):
    """Hugging Face's eager mask of a left-padded batch (GQA): causal (and a window), a bool key row, and the rows that
    see no key -- a left-padded query, a sequence that is all padding -- averaged over every key as eager does, with
    eager's gradients there."""
    q, k, v = _qkv(device, dtype, hk=2)
    records, got, naive, hi = run(lambda q, k, v, pad: attn_eager_added(q, k, v, pad, window),
                                  (q, k, v, _padding(device)), device=device, dtype=dtype, train=train)
    _split(records, **({"window_left": window - 1} if window else {}))
    assert all(EMPTY_ROWS_NOTE in r.flags["note"] for r in records)
    check_numerics(got, naive, hi)


@pytest.mark.parametrize("form", [attn_masked_fill, attn_sdpa_bool, attn_expand_mask, attn_shared_key_padding],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_other_padding_mask_forms_split(form, device, dtype):
    """masked_fill by the minimum (rows that see no key: eager's uniform average, no gradient to q, k), SDPA's bool
    mask (those rows 0 in both), transformers' older float form (a padding inverted and filled onto a causal mask)."""
    records, got, naive, hi = run(form, (*_qkv(device, dtype), _padding(device)), device=device, dtype=dtype)
    _split(records)
    # (eager SDPA gives 0 on a row that sees no key, as fa2; on CUDA PyTorch's cuDNN path fills the bool mask with
    # -65504 first, so eager's rows without a key average uniformly there and the pass keeps that)
    if form is attn_sdpa_bool and device == "cpu":
        assert all(EMPTY_ROWS_NOTE not in r.flags["note"] for r in records)
    check_numerics(got, naive, hi)


def attn_cudnn_bool_fill(q, k, v, pad):
    """What PyTorch's cuDNN SDPA path makes of a bool mask before the kernel, in any half dtype: where(mask, 0, -65504)
    added to the scores (float16's minimum, also in bfloat16)."""
    fill = torch.where(_hf_mask(pad, q.shape[-2]), torch.zeros((), dtype=q.dtype), torch.tensor(-65504.0, dtype=q.dtype))
    return (q @ k.transpose(-1, -2) * D ** -0.5 + fill).softmax(-1) @ v


def test_cudnn_style_bool_fill_splits_in_bfloat16():
    """The -65504 fill hides keys in bfloat16 as in float16 (it is what the GPU's SDPA graph holds for a bool mask in
    bf16): causal + key row, the rows that see no key averaged as eager does; within the rule against eager."""
    records, got, naive, hi = run(attn_cudnn_bool_fill, (*_qkv("cpu", torch.bfloat16), _padding("cpu")), device="cpu",
                                  dtype=torch.bfloat16)
    _split(records)
    assert all(EMPTY_ROWS_NOTE in r.flags["note"] for r in records)
    check_numerics(got, naive, hi)


@pytest.mark.parametrize("form", [attn_query_padding, attn_softcap_added], ids=lambda f: f.__name__)
def test_padding_masks_that_do_not_split_stay_one_bias(form):
    """A mask whose data depends on the query (it is not a key row), and an added finite fill under a softcap (the
    uniform rows' gradient is not linear there): one bias, no flags, results unchanged."""
    records, got, naive, hi = run(form, (*_qkv("cpu", torch.float32), _padding("cpu")), device="cpu",
                                  dtype=torch.float32)
    assert_rewritten(records, causal=None, bias="float")
    check_numerics(got, naive, hi)
    assert not math.isnan(got[0].abs().max().item())
