"""The Inductor pass on attention as models nobody on the project picked write it (issue "the compile pass in the
wild"): layouts Inductor chooses, consumers of the output that ``view`` it, baddbmm / einsum scores, upcasts, ALiBi,
need_weights, dynamic shapes, additive relative-position terms, padding and sliding windows, a value head dim of its
own. Each test checks what the pass reported and that outputs and gradients match eager within the numerics rule.
"""
from __future__ import annotations

import copy

import pytest
import torch

import fa2.backend  # noqa: F401  (registers the "fa2" and "fa2_eager" backends)
from fa2.inductor import recording
from fa2.inductor._compat import without_aot_cache
from numerics import assert_close_rule, hi_dtype
from fa2.inductor.sites import WEIGHTS_NOTE
from test_inductor_patterns import B, D, DEVICE_DTYPES, H, S, assert_kept, assert_rewritten, check_numerics, qkv, run


def run_module(module, inputs, *, train, backend="fa2_eager", dtype=torch.float32, dynamic=None):
    """Compile ``module`` and call it on ``inputs`` (a list of tensor tuples: one call each); returns the records and
    checks each call's outputs (every tensor of a returned tuple; the loss reads the first) and in training the
    parameters' gradients against eager and a high-precision copy."""
    module = module.to(dtype).train(train)
    reference = copy.deepcopy(module).to(hi_dtype(dtype))
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend, dynamic=dynamic)

    def step(m, args):
        m.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(train):
            outs = m(*args)
            outs = [o for o in outs if isinstance(o, torch.Tensor)] if isinstance(outs, tuple) else [outs]
            if train:
                weight = torch.randn(outs[0].shape, generator=torch.Generator().manual_seed(1)).to(outs[0].device)
                (outs[0].float() * weight).sum().backward()
        grads = {n.removeprefix("_orig_mod."): p.grad.detach().clone() for n, p in m.named_parameters()
                 if p.grad is not None}
        return [o.detach() for o in outs], grads

    with recording() as records, without_aot_cache():
        got = [step(compiled, args) for args in inputs]
    for i, args in enumerate(inputs):
        naive = step(module, args)
        hi = step(reference, [a.to(hi_dtype(dtype)) if a.is_floating_point() else a for a in args])
        assert len(got[i][0]) == len(hi[0])
        for j, (g, h, n) in enumerate(zip(got[i][0], hi[0], naive[0])):
            assert_close_rule(f"call {i}: out[{j}]", g, h, n, 2)
        assert set(got[i][1]) == set(hi[1])
        for name in hi[1]:
            assert_close_rule(f"call {i}: grad {name}", got[i][1][name], hi[1][name], naive[1][name], 3)
    return records


# ---- layouts: the op's inputs, and the consumers of its output ------------------------------------------------------

@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_without_weights(batch_first, train):
    """nn.MultiheadAttention(need_weights=False) takes SDPA and views its output as (S * B, E) after moving S first:
    a view that fa2's differently strided output cannot take (it gets a contiguous copy)."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=batch_first)
    shape = (lambda s: (2, s, 32)) if batch_first else (lambda s: (s, 2, 32))
    x, y = torch.randn(shape(16)), torch.randn(shape(9))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x, y):
            return self.mha(x, y, y, need_weights=False)[0]

    records = run_module(Block(), [(x, y)], train=train)
    assert_rewritten(records)


def test_fa2_ops_carry_their_input_strides():
    """Inductor gives an op that a custom pass inserted whatever input layout it likes unless the node carries the
    fake inputs it was traced with (``eager_input_vals``): SegFormer's q then reached fa2.fwd with its head dim
    strided. Every fa2 op the pass emits carries them, with a contiguous last dim."""
    from fa2.inductor import _compat
    from fa2.inductor.graph_pass import rewrite_attention
    seen = []

    def check(graph):
        sites = rewrite_attention(graph)
        for n in graph.nodes:
            if n.op == "call_function" and n.target in (torch.ops.fa2.fwd.default, torch.ops.fa2.bwd.default):
                args, _ = n.meta["eager_input_vals"]
                tensors = [a for a in args if isinstance(a, torch.Tensor) and a.dim() == 4]
                assert tensors and all(t.stride(-1) == 1 for t in tensors[:3]), n.format_node()
                seen.append(n.target)
        return sites

    def fn(q, k, v):
        return (q @ k.transpose(-1, -2) * 0.25).softmax(-1) @ v
    q, k, v = (t.requires_grad_() for t in qkv("cpu", torch.float32))
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=_compat.aot_eager_with_joint_pass(check))
    compiled(q, k, v).sum().backward()
    assert set(seen) == {torch.ops.fa2.fwd.default, torch.ops.fa2.bwd.default}


# ---- baddbmm and einsum scores, biases before the scaling -------------------------------------------------------

def _alibi_slopes(heads, device):
    return torch.tensor([2 ** (-8 * (i + 1) / heads) for i in range(heads)], device=device)


def attn_bloom(q, k, v):
    """BLOOM: ALiBi as baddbmm's self (batch * heads, 1, Sk), the scores viewed 4-D, a causal -inf mask added, the
    softmax in float32 and cast back, P V with bmm."""
    b, h, s, d = q.shape
    alibi = (_alibi_slopes(h, q.device)[:, None] * torch.arange(s, device=q.device)).repeat(b, 1)[:, None, :]
    scores = alibi.to(q.dtype).baddbmm(batch1=q.reshape(b * h, s, d), batch2=k.reshape(b * h, s, d).transpose(1, 2),
                                       beta=1.0, alpha=d ** -0.5)
    mask = torch.triu(torch.full((s, s), float("-inf"), device=q.device), 1).to(q.dtype)
    p = torch.softmax(scores.view(b, h, s, s) + mask, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.bmm(p.view(b * h, s, s), v.reshape(b * h, s, d)).view(b, h, s, d)


def attn_baddbmm_3d(q, k, v, bias):
    """baddbmm with a full (batch * heads, Sq, Sk) bias and beta != 1, 3-D throughout."""
    b, h, s, d = q.shape
    q3, k3, v3 = q.reshape(b * h, s, d), k.reshape(b * h, s, d), v.reshape(b * h, s, d)
    scores = torch.baddbmm(bias.reshape(b * h, s, s), q3, k3.transpose(1, 2), beta=0.5, alpha=0.25)
    return torch.bmm(scores.softmax(-1), v3).view(b, h, s, d)


def attn_alibi_before_scale(q, k, v):
    """Falcon's ALiBi: the bias added to q.k before the 1/sqrt(d) scaling, the softmax in float32."""
    s = q.shape[2]
    pos = torch.arange(s, device=q.device)
    alibi = _alibi_slopes(q.shape[1], q.device).view(1, -1, 1, 1) * (pos[None, :] - pos[:, None])
    scores = (q @ k.transpose(-1, -2) + alibi.to(q.dtype)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool, device=q.device), 1), float("-inf"))
    return torch.softmax(scores.float(), -1).to(q.dtype) @ v


def attn_bias_before_scale(q, k, v, bias):
    return ((q @ k.transpose(-2, -1) + bias) * 0.25).softmax(-1) @ v


def _triu_drop(s, device):
    return torch.triu(torch.ones(s, s, dtype=torch.bool, device=device), diagonal=1)


def attn_einsum_masked_fill(q, k, v):
    w = torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5
    w = w.masked_fill(_triu_drop(q.shape[2], q.device), float("-inf"))
    return torch.einsum("bhij,bhjd->bhid", w.softmax(-1), v)


def attn_einsum_triu_additive(q, k, v):
    s = q.shape[2]
    w = torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5
    w = w + torch.triu(torch.full((s, s), float("-inf"), device=q.device), diagonal=1).to(q.dtype)
    return torch.einsum("bhij,bhjd->bhid", w.softmax(-1), v)


def attn_einsum_where_min(q, k, v):
    w = torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5
    w = torch.where(~_triu_drop(q.shape[2], q.device), w, torch.finfo(w.dtype).min)
    return torch.einsum("bhij,bhjd->bhid", w.float().softmax(-1).to(q.dtype), v)


WRITTEN = {
    "bloom_baddbmm": (attn_bloom, (), dict(causal=True, bias="float")),
    "baddbmm_3d_beta": (attn_baddbmm_3d, ("bias",), dict(scale=0.25, bias="float")),
    "alibi_before_scale": (attn_alibi_before_scale, (), dict(causal=True, bias="float")),
    "bias_before_scale": (attn_bias_before_scale, ("bias",), dict(scale=0.25, bias="float")),
    "einsum_masked_fill": (attn_einsum_masked_fill, (), dict(causal=True, bias=None)),
    "einsum_triu_additive": (attn_einsum_triu_additive, (), dict(causal=True, bias=None)),
    "einsum_where_min": (attn_einsum_where_min, (), dict(causal=True, bias=None)),
}


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("form", list(WRITTEN))
def test_scores_written_with_baddbmm_einsum_or_a_bias_before_the_scale(form, device, dtype):
    fn, extras, flags = WRITTEN[form]
    args = list(qkv(device, dtype))
    if extras:
        args.append(torch.randn(B, H, S, S, generator=torch.Generator().manual_seed(5)).to(device=device, dtype=dtype))
    records, got, naive, hi = run(fn, args, device=device, dtype=dtype, frozen=(3,) if form == "baddbmm_3d_beta" else ())
    assert_rewritten(records, **flags)
    check_numerics(got, naive, hi)


def test_baddbmm_bias_that_needs_a_gradient_scaled_by_beta_is_kept():
    """Its gradient is beta times the scores' (a mul the bias-gradient rewrite does not model): kept, exact."""
    args = list(qkv("cpu", torch.float32)) + [torch.randn(B, H, S, S)]
    records, got, naive, hi = run(attn_baddbmm_3d, args, device="cpu", dtype=torch.float32)
    assert_kept(records, "the bias gradient is not recognized")
    check_numerics(got, naive, hi)


def attn_where_tensor_fill(q, k, v, other):
    w = q @ k.transpose(-1, -2) * 0.25
    return torch.where(_triu_drop(q.shape[2], q.device), other, w).softmax(-1) @ v


def attn_scores_from_a_cumsum(q, k, v):
    w = (q @ k.transpose(-1, -2)).cumsum(-1)
    return (w * 0.25 + q.sum()).softmax(-1) @ v


def test_reasons_name_the_real_cause():
    args = list(qkv("cpu", torch.float32)) + [torch.randn(B, H, S, S)]
    records, got, naive, hi = run(attn_where_tensor_fill, args, device="cpu", dtype=torch.float32)
    assert_kept(records, "where() in the score computation fills with a tensor, not a constant")
    check_numerics(got, naive, hi)
    records, got, naive, hi = run(attn_scores_from_a_cumsum, list(qkv("cpu", torch.float32)), device="cpu",
                                  dtype=torch.float32, train=False)
    assert_kept(records, "the softmax input does not come from a matmul (the scores come from cumsum)")


# ---- dtypes: an exact upcast of q and k (GPT-J) ----------------------------------------------------------------------

def attn_gptj_upcast(q, k, v):
    """GPT-J: q and k upcast to float32 after rotary, the causal mask filled with float32's minimum, the softmax in
    float32, the probabilities cast to v's dtype."""
    s = q.shape[2]
    w = torch.matmul(q.to(torch.float32), k.to(torch.float32).transpose(-1, -2))
    keep = torch.tril(torch.ones(s, s, dtype=torch.bool, device=q.device))
    w = torch.where(keep, w, torch.finfo(torch.float32).min) / q.shape[-1] ** 0.5
    return torch.matmul(torch.softmax(w, -1).to(v.dtype), v)


def attn_upcast_then_computed(q, k, v):
    """q upcast and then computed on in float32: its values are no longer bfloat16 ones."""
    w = torch.matmul(q.to(torch.float32) * 1.1, k.to(torch.float32).transpose(-1, -2)) * 0.25
    return torch.matmul(torch.softmax(w, -1).to(v.dtype), v)


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)])
def test_exact_upcast_of_q_and_k_is_read_before_the_cast(dtype):
    records, got, naive, hi = run(attn_gptj_upcast, qkv("cpu", dtype), device="cpu", dtype=dtype)
    assert_rewritten(records, causal=True)
    check_numerics(got, naive, hi)
    records, got, naive, hi = run(attn_upcast_then_computed, qkv("cpu", dtype), device="cpu", dtype=dtype)
    assert_kept(records, "q, k, v dtypes differ")
    check_numerics(got, naive, hi)


# ---- need_weights and one query (SigLIP's pooling head) -------------------------------------------------------------

class _Pool(torch.nn.Module):
    """SigLIP's pooling head: a learned probe (one query) attends over the tokens with nn.MultiheadAttention's
    default need_weights=True, the weights discarded (or used, ``use_weights``)."""

    def __init__(self, use_weights=False, queries=1):
        super().__init__()
        self.probe = torch.nn.Parameter(torch.randn(1, queries, 32))
        self.attention = torch.nn.MultiheadAttention(32, 4, batch_first=True)
        self.use_weights = use_weights

    def forward(self, x):
        out, weights = self.attention(self.probe.expand(x.shape[0], -1, -1), x, x)
        return out + weights.sum(-1, keepdim=True) if self.use_weights else out


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("queries,dtype", [(1, torch.float32), (3, torch.float32), (1, torch.bfloat16)])
def test_pooling_probe_with_unused_weights(queries, dtype, train):
    """One query: autograd's dK and dV are outer products (broadcasting muls after the decompositions; in bf16 of
    operands cast to float32, the product cast back)."""
    torch.manual_seed(0)
    records = run_module(_Pool(queries=queries), [(torch.randn(2, 16, 32, dtype=dtype),)], train=train, dtype=dtype)
    assert_rewritten(records)


def test_attention_weights_that_are_used_say_how_to_drop_them():
    torch.manual_seed(0)
    records = run_module(_Pool(use_weights=True), [(torch.randn(2, 16, 32),)], train=True)
    assert_kept(records, "need_weights=False")


def _attn_returning_weights(q, k, v):
    p = (q @ k.transpose(-1, -2) * 0.25).softmax(-1)
    return p @ v, p


def test_probabilities_that_leave_the_graph_name_the_graph_output():
    """Probabilities that are an output of the compiled graph and get a gradient there (returned in training, or
    alive past a graph break: Mixtral's default grouped_mm experts break the graph in training) are kept, with a
    reason that says so."""
    torch._dynamo.reset()
    q, k, v = (torch.randn(2, 4, 8, 16, requires_grad=True) for _ in range(3))
    with recording() as records, without_aot_cache():
        out, p = torch.compile(_attn_returning_weights, backend="fa2_eager")(q, k, v)
        (out.sum() + p[..., 0].sum()).backward()
    assert_kept(records, "an output of the compiled graph")
    want_out, want_p = _attn_returning_weights(q, k, v)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(p, want_p)


def test_probabilities_returned_in_inference_keep_the_site():
    """In inference the returned probabilities are computed anyway: the site stays as it was (fa2 would add its own
    attention on top), the reason says so, and the results are eager's."""
    torch._dynamo.reset()
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    with recording() as records, without_aot_cache():
        out, p = torch.compile(_attn_returning_weights, backend="fa2_eager")(q, k, v)
    assert_kept(records, "has no backward")
    hi = _attn_returning_weights(*(t.double() for t in (q, k, v)))
    naive = _attn_returning_weights(q, k, v)
    assert_close_rule("out", out, hi[0], naive[0], 2)
    assert_close_rule("p", p, hi[1], naive[1], 2)


def _attn_plus_probabilities(q, k, v):
    """P's gradient from the output's own ("+ p", with seqlen_k == head dim) enters the softmax's backward through
    the same incoming gradient as P V's."""
    p = (q @ k.transpose(-1, -2) * 0.25).softmax(-1)
    return p @ v + p


def _attn_plus_squared_probabilities(q, k, v):
    p = (q @ k.transpose(-1, -2) * 0.25).softmax(-1)
    return p @ v + (p * p).sum(-1, keepdim=True)


@pytest.mark.parametrize("fn", [_attn_plus_probabilities, _attn_plus_squared_probabilities])
def test_probabilities_differentiated_elsewhere_keep_the_site(fn):
    """A second use of P that autograd differentiates adds to P's gradient: dropping it with the old backward would
    be a wrong gradient, so the site is kept (in inference too: P is computed for that use anyway)."""
    args = qkv("cpu", torch.float32, sq=S, sk=D)
    records, got, naive, hi = run(fn, args, device="cpu", dtype=torch.float32)
    assert_kept(records, "that use is differentiated")
    check_numerics(got, naive, hi)
    records, got, naive, hi = run(fn, args, device="cpu", dtype=torch.float32, train=False)
    assert_kept(records, "has no backward")
    check_numerics(got, naive, hi)


# ---- nn.MultiheadAttention's default need_weights=True --------------------------------------------------------------

class _SelfAttention(torch.nn.Module):
    """nn.MultiheadAttention with its default need_weights=True (F.multi_head_attention_forward's bmm path), the
    weights then ``use``d: "discard" (SigLIP's pooling head), "return" (a second output), "detach" (read in the
    forward only), "loss" (in the first output, so differentiated)."""

    def __init__(self, use, average=True, dropout=0.0):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(32, 4, dropout=dropout, batch_first=True)
        self.use, self.average = use, average

    def forward(self, x):
        out, weights = self.attention(x, x, x, average_attn_weights=self.average)
        weights = weights if self.average else weights.mean(1)
        if self.use == "return":
            return out, weights
        if self.use == "detach":
            return out * weights.detach().amax(-1, keepdim=True)
        if self.use == "loss":
            return out + weights.sum(-1, keepdim=True) * weights[..., :1]
        return out


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("use", ["discard", "return", "detach", "loss"])
def test_multihead_attention_weights_read_in_the_forward_only(use, train):
    """need_weights=True (the default): in training, weights that nothing differentiates (detached) stay in the graph
    for their readers and the output comes from fa2, forward and backward; weights that are differentiated (returned
    or in the loss) keep the site, and the reason says how to drop them. In inference weights that are read keep the
    site (they are computed anyway: fa2 would add work), discarded ones do not."""
    torch.manual_seed(0)
    differentiated = train and use in ("return", "loss")
    records = run_module(_SelfAttention(use), [(torch.randn(2, 16, 32),)], train=train)
    if differentiated:
        assert_kept(records, "need_weights=False")
        return
    if not train and use != "discard":
        assert_kept(records, "has no backward")
        return
    assert_rewritten(records)
    assert (WEIGHTS_NOTE in records[0].flags.get("note", "")) == (use != "discard"), str(records[0])


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_multihead_attention_weights_per_head(train):
    """average_attn_weights=False returns P itself (viewed 4-D): the same as the average."""
    torch.manual_seed(0)
    records = run_module(_SelfAttention("detach" if train else "return", average=False),
                         [(torch.randn(2, 16, 32),)], train=train)
    if train:
        assert_rewritten(records)
    else:
        assert_kept(records, "has no backward")
    records = run_module(_SelfAttention("loss", average=False), [(torch.randn(2, 16, 32),)], train=True)
    assert_kept(records, "average_attn_weights makes no difference")


def test_multihead_attention_weights_after_dropout_are_kept():
    """nn.MultiheadAttention returns the weights after dropout: fa2 draws its own mask, so the site is kept."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    module = _SelfAttention("detach", dropout=0.1).train()
    with recording() as records, without_aot_cache():
        torch.compile(module, backend="fa2_eager")(torch.randn(2, 16, 32)).sum().backward()
    assert_kept(records, "read after dropout")


def test_siglip_pooling_head():
    """transformers' SiglipMultiheadAttentionPoolingHead (nn.MultiheadAttention's need_weights=True, a repeated
    probe: one query, the weights discarded) on a tiny config: rewritten, inference and training."""
    siglip = pytest.importorskip("transformers.models.siglip.modeling_siglip")
    config = siglip.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4)
    torch.manual_seed(0)
    for train in (False, True):
        records = run_module(siglip.SiglipMultiheadAttentionPoolingHead(config), [(torch.randn(2, 16, 32),)],
                             train=train)
        assert_rewritten(records)


# ---- dynamic shapes: the recompile after a new sequence length ------------------------------------------------------

class _GqaDecoderAttention(torch.nn.Module):
    """Attention as Qwen3 / Mixtral write it: repeat_kv as ``x[:, :, None].expand().reshape()``, a causal mask built
    from the sequence length, the softmax in float32 and cast back."""

    def __init__(self, dim=32, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim)

    @staticmethod
    def repeat_kv(x, n):
        b, h, s, d = x.shape
        return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        n = self.heads // self.kv_heads
        k, v = self.repeat_kv(k, n), self.repeat_kv(v, n)
        w = q @ k.transpose(2, 3) * self.head_dim ** -0.5
        mask = torch.full((s, s), torch.finfo(w.dtype).min, dtype=w.dtype, device=x.device).triu(1)
        p = torch.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        return (p @ v).transpose(1, 2).reshape(b, s, -1)


@pytest.mark.parametrize("device,dtype", [
    ("cpu", torch.float32), ("cpu", torch.bfloat16),
    pytest.param("cuda", torch.bfloat16, marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))])
def test_gqa_training_keeps_the_rewrite_after_the_dynamic_recompile(device, dtype):
    """Called at 16, 24, 20 tokens in training: the second call recompiles with a symbolic length, where repeat_kv's
    full slice traces as slice / slice_scatter in the backward; every graph is rewritten, fa2.bwd included (fp32 and
    bf16: the same rewrite on every device and dtype)."""
    torch.manual_seed(0)
    inputs = [(torch.randn(2, s, 32, device=device, dtype=dtype),) for s in (16, 24, 20)]
    records = run_module(_GqaDecoderAttention().to(device), inputs, train=True, dtype=dtype)
    assert len(records.graphs) == 2, records.graphs
    assert_rewritten(records, n=2, causal=True, gqa="4/2")


# ---- relative-position terms as an additive bias (DeBERTa-v2) -------------------------------------------------------

def attn_disentangled(q, k, v, pos):
    """DeBERTa-v2's disentangled attention, 3-D with the heads folded into the batch: content-to-position and
    position-to-content scores (matmuls with the relative-position embeddings, gathered by relative distance) added
    to q.k before the 4-D view; q scaled before the matmul."""
    b, h, s, d = q.shape
    q3, k3, v3 = (t.reshape(b * h, s, d) for t in (q, k, v))
    pos3 = pos.expand(b, h, -1, d).reshape(b * h, -1, d)
    q3 = q3 / (3 * d) ** 0.5
    rel = (torch.arange(s, device=q.device)[:, None] - torch.arange(s, device=q.device)[None, :]).clamp(-4, 4) + 4
    c2p = torch.gather(torch.bmm(q3, pos3.transpose(1, 2)), -1, rel.expand(b * h, s, s))
    p2c = torch.gather(torch.bmm(k3, pos3.transpose(1, 2) / (3 * d) ** 0.5), -1, rel.expand(b * h, s, s))
    scores = (torch.bmm(q3, k3.transpose(1, 2)) + (c2p + p2c.transpose(1, 2))).view(b, h, s, s)
    return torch.bmm(scores.softmax(-1).view(b * h, s, s), v3).view(b, h, s, d)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_disentangled_relative_position_terms_are_a_bias(device, dtype):
    """The terms depend on q and k themselves: their gradient flows through fa2's bias gradient."""
    args = list(qkv(device, dtype)) + [torch.randn(1, 1, 9, 16, generator=torch.Generator().manual_seed(3)).to(
        device=device, dtype=dtype)]
    records, got, naive, hi = run(attn_disentangled, args, device=device, dtype=dtype)
    assert_rewritten(records, bias="float")
    check_numerics(got, naive, hi)


# ---- a value head dim of its own (MLA) ------------------------------------------------------------------------------

def attn_mla(q, k, v):
    """DeepSeek-V3's multi-head latent attention after up-projection: q and k carry a rotary part (head dim 24 =
    16 + 8), v has head dim 16; causal; the softmax in float32."""
    s = q.shape[2]
    w = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
    w = w + torch.full((s, s), float("-inf"), device=q.device, dtype=w.dtype).triu(1)
    return torch.matmul(torch.softmax(w, -1, dtype=torch.float32).to(q.dtype), v)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_value_headdim_of_its_own(device, dtype):
    """Rewritten when the installed ops take v.size(-1) != q.size(-1) (fa2.inductor.sites.value_headdim_supported,
    a probe call made once); otherwise kept, saying so."""
    from fa2.inductor.sites import value_headdim_supported
    q, k, _ = qkv(device, dtype, d=24)
    v = qkv(device, dtype, d=16, seed=1)[2]
    records, got, naive, hi = run(attn_mla, (q, k, v), device=device, dtype=dtype)
    check_numerics(got, naive, hi)
    if not value_headdim_supported():
        assert_kept(records, "the installed fa2 ops take one head dim for q, k and v")
        pytest.skip("the installed fa2 ops take one head dim for q, k and v (their value head dim comes with the "
                    "ops' own change): checked that the site is kept, with that reason")
    assert_rewritten(records, causal=True)


def attn_bias_then_finite_fill(q, k, v, bias, keep):
    """DeBERTa's order: a bias that needs a gradient added, then masked_fill with the dtype's minimum by a (query and
    key) padding mask, so that padded query rows see no key: there eager's scores are the fill alone and the bias
    gets no gradient."""
    s = q @ k.transpose(-1, -2) * 0.25 + bias
    return s.masked_fill(~keep, torch.finfo(s.dtype).min).softmax(-1) @ v


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_bias_overwritten_by_a_finite_fill_gets_no_gradient_there(device, dtype):
    pad = torch.ones(B, S, dtype=torch.bool, device=device)
    pad[1, S - 4:] = False
    keep = (pad[:, None, :, None] & pad[:, None, None, :])
    args = list(qkv(device, dtype)) + [torch.randn(B, H, S, S, generator=torch.Generator().manual_seed(7)).to(
        device=device, dtype=dtype), keep]
    records, got, naive, hi = run(attn_bias_then_finite_fill, args, device=device, dtype=dtype)
    assert_rewritten(records, bias="float")
    check_numerics(got, naive, hi)
