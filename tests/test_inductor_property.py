"""A property of the Inductor pass: attention modules built at random from the ways people write it -- QK^T by
matmul / bmm / baddbmm / einsum; the scale on the scores (mul or div) or on q; the softmax in float32 and cast back;
masks by masked_fill, where or addition (causal, or a key padding); GQA by repeat_kv or expand; dropout in eval;
sequence lengths of their own -- are every one rewritten into fa2, and the compiled module equals eager within the
numerics rule (outputs, and the inputs' gradients in training). Few examples in the quick profile (FA2_CI=1), more
in the slow one.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import fa2.backend  # noqa: F401  (registers the "fa2_eager" backend)
from test_inductor_patterns import assert_rewritten, check_numerics, run

EXAMPLES = 6 if os.environ.get("FA2_CI") == "1" else 40
HEADS, HEAD_DIM = 4, 8


def build(form):
    """The attention function ``form`` describes: fn(q, k, v, pad) with q (B, H, Sq, D), k / v (B, Hk, Sk, D) and
    pad a (B, Sk) bool key mask (True = keep) that only the padding masks read."""
    qk, scale_at, fp32, mask, gqa, dropout = (form[k] for k in ("qk", "scale_at", "fp32", "mask", "gqa", "dropout"))

    def fn(q, k, v, pad):
        b, h, sq, d = q.shape
        hk, sk = k.shape[1], k.shape[2]
        if gqa == "repeat_kv":
            k, v = (x[:, :, None].expand(b, hk, h // hk, sk, d).reshape(b, h, sk, d) for x in (k, v))
        elif gqa == "repeat_interleave":
            k, v = (x.repeat_interleave(h // hk, dim=1) for x in (k, v))
        scale = d ** -0.5
        if scale_at == "q":
            q = q * scale
        # the additive mask (B or 1, 1, Sq, Sk) and the bool keep mask (..., Sq, Sk) this form uses
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq) if mask.startswith("causal") \
            else pad[:, None, None, :]
        additive = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill(~keep, float("-inf"))
        if qk == "matmul":
            s = q @ k.transpose(-2, -1)
        elif qk == "einsum":
            s = torch.einsum("bhqd,bhkd->bhqk", q, k)
        else:
            q3, k3 = q.reshape(b * h, sq, d), k.reshape(b * h, sk, d).transpose(1, 2)
            if qk == "baddbmm" and mask.endswith("add"):
                self_ = additive.expand(b, h, sq, sk).reshape(b * h, sq, sk)
                s = torch.baddbmm(self_, q3, k3, alpha=scale if scale_at == "mul" else 1.0).view(b, h, sq, sk)
            else:
                s = (torch.baddbmm(torch.zeros(1, 1, sk, dtype=q.dtype, device=q.device), q3, k3)
                     if qk == "baddbmm" else torch.bmm(q3, k3)).view(b, h, sq, sk)
        if scale_at == "mul" and not (qk == "baddbmm" and mask.endswith("add")):
            s = s * scale
        elif scale_at == "div":
            s = s / d ** 0.5
        if mask.endswith("masked_fill"):
            s = s.masked_fill(~keep, float("-inf"))
        elif mask.endswith("where_min"):
            s = torch.where(keep, s, torch.finfo(s.dtype).min)
        elif mask.endswith("add") and qk != "baddbmm":
            s = s + additive
        p = torch.softmax(s, -1, dtype=torch.float32).to(q.dtype) if fp32 else s.softmax(-1)
        if dropout:
            p = F.dropout(p, 0.1, training=False)
        if qk in ("bmm", "baddbmm"):
            return torch.bmm(p.reshape(b * h, sq, sk), v.reshape(b * h, sk, d)).view(b, h, sq, d)
        if qk == "einsum":
            return torch.einsum("bhqk,bhkd->bhqd", p, v)
        return p @ v
    return fn


forms = st.fixed_dictionaries({
    "qk": st.sampled_from(["matmul", "bmm", "baddbmm", "einsum"]),
    "scale_at": st.sampled_from(["mul", "div", "q"]),
    "fp32": st.booleans(),
    "mask": st.sampled_from(["none", "causal_masked_fill", "causal_where_min", "causal_add", "padding_masked_fill",
                             "padding_add"]),
    "gqa": st.sampled_from(["none", "repeat_kv", "repeat_interleave"]),
    "dropout": st.booleans(),
    "train": st.booleans(),
})


@settings(max_examples=EXAMPLES)
@given(form=forms, sq=st.integers(1, 19), extra_keys=st.integers(0, 9), batch=st.integers(1, 2), seed=st.integers(0, 99))
def test_random_attention_modules_are_rewritten_and_exact(form, sq, extra_keys, batch, seed):
    # (a causal row always sees a key: Sk >= Sq, bottom-right aligned; one key is a broadcasting mul, not a matmul,
    # after the decompositions: test_single_key_is_kept_with_the_reason)
    sk = max(2, sq + extra_keys)
    hk = HEADS if form["gqa"] == "none" else HEADS // 2
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, HEADS, sq, HEAD_DIM, generator=g)
    k, v = (torch.randn(batch, hk, sk, HEAD_DIM, generator=g) for _ in range(2))
    pad = torch.ones(batch, sk, dtype=torch.bool)
    pad[-1, sk - torch.randint(0, sk, (), generator=g).item():] = False   # left keys kept: every row sees one
    records, got, naive, hi = run(build(form), (q, k, v, pad), device="cpu", dtype=torch.float32,
                                  train=form["train"])
    # (one query sees every key under a bottom-right causal mask: the flag or none are the same)
    causal = form["mask"].startswith("causal")
    assert_rewritten(records, **({} if sq == 1 and causal else {"causal": True if causal else None}))
    check_numerics(got, naive, hi)


def test_single_key_is_kept_with_the_reason():
    q, k, v = torch.randn(1, HEADS, 3, HEAD_DIM), torch.randn(1, HEADS, 1, HEAD_DIM), torch.randn(1, HEADS, 1, HEAD_DIM)
    form = dict(qk="matmul", scale_at="mul", fp32=False, mask="none", gqa="none", dropout=False)
    records, got, naive, hi = run(build(form), (q, k, v, torch.ones(1, 1, dtype=torch.bool)), device="cpu",
                                  dtype=torch.float32, train=False)
    assert records and not records[0].rewritten and "one key (seqlen_k == 1)" in records[0].reason, records
    check_numerics(got, naive, hi)
