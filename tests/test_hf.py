"""Hugging Face integration: ``fa2.hf.register()`` then ``attn_implementation="fa2"``.

The zoo's models built with attn_implementation="fa2" match the same weights with "eager" (outputs and gradients,
numerics rule against a float32/float64 reference), fa2's op really runs, padding / sliding window / softcap / GQA /
T5's position bias / KV-cache decoding come through, and dropout in training runs fa2's dropout.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fa2
import fa2.hf
from numerics import hi_dtype
import zoo

pytest.importorskip("transformers")

_CUDA = torch.cuda.is_available()
_no_cuda = pytest.mark.skipif(not _CUDA, reason="no CUDA")
DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu-float32"),
    pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16", marks=pytest.mark.slow),
    pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=_no_cuda),
    pytest.param("cuda", torch.float16, id="cuda-float16", marks=_no_cuda),
]


@pytest.fixture(scope="module", autouse=True)
def _registered():
    fa2.hf.register()


class CountFa2(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.fwd = self.bwd = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.fwd += func is torch.ops.fa2.fwd.default
        self.bwd += func is torch.ops.fa2.bwd.default
        return func(*args, **(kwargs or {}))


def _run(model, inputs):
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    zoo.loss_of(out).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return zoo.main_output(out).detach(), grads


def test_register_is_idempotent():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    fa2.hf.register()
    fa2.hf.register()
    assert AttentionInterface._global_mapping["fa2"] is fa2.hf.fa2_attention_forward
    assert "fa2" in AttentionMaskInterface._global_mapping


# The quick run: GQA, softcap with sliding and global layers, padding mask, trained bias; the others in the slow profile.
QUICK_MODELS = {"llama", "gemma2", "bert", "t5"}


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("name", [pytest.param(m.name, marks=() if m.name in QUICK_MODELS else pytest.mark.slow)
                                  for m in zoo.ZOO])
def test_matches_eager(name, device, dtype):
    entry = zoo.ZOO_BY_NAME[name]
    model = zoo.build(name, device, dtype, attn="fa2").train()
    naive = zoo.build(name, device, dtype, attn="eager").train()
    reference = zoo.build(name, device, hi_dtype(dtype), attn="eager").train()
    reference.load_state_dict({k: v.to(hi_dtype(dtype)) for k, v in model.state_dict().items()})
    inputs, hi_inputs = entry.inputs(device, dtype), entry.inputs(device, hi_dtype(dtype))
    with CountFa2() as counted:
        got = _run(model, inputs)
    assert counted.fwd == entry.sites and counted.bwd == entry.sites, (counted.fwd, counted.bwd)
    want_naive, want_hi = _run(naive, inputs), _run(reference, hi_inputs)
    zoo.assert_model_close(f"{name}: output", got[0], want_hi[0], want_naive[0], 2)
    zoo.assert_grads_close(name, got[1], want_hi[1], want_naive[1])


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_left_padding_and_decoding(device, dtype):
    """A padded batch (left padding) and greedy decoding with the KV cache give eager's tokens."""
    model = zoo.build("mistral", device, dtype, attn="fa2").eval()
    eager = zoo.build("mistral", device, dtype, attn="eager").eval()
    ids = zoo._ids(device)[:, :10]
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits
        want = eager(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got[valid].float(), want[valid].float(), atol=tol, rtol=tol)
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    out = model.generate(ids[1:], attention_mask=mask[1:], **kwargs)
    out_eager = eager.generate(ids[1:], attention_mask=mask[1:], **kwargs)
    if dtype == torch.float32:
        assert torch.equal(out, out_eager)


def test_compiles_without_graph_breaks():
    model = zoo.build("gemma2", "cpu", torch.float32, attn="fa2").eval()
    ids = zoo._ids("cpu")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(input_ids=ids).logits, model(input_ids=ids).logits)


def test_sparse_attention_indices_are_refused():
    """DeepSeek-V3.2-style sparse attention passes the keys each query reads (indices=): dense attention would be a
    silent wrong answer."""
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(NotImplementedError, match="sparse attention"):
        fa2.hf.fa2_attention_forward(torch.nn.Module(), q, k, v, None, indices=torch.zeros(1, 4, 2, dtype=torch.long))


def test_dropout_in_training_runs_and_is_reproducible():
    """attention_dropout in training goes to fa2's dropout: reproducible under a seed (logits and gradients), a
    different draw with another seed; eval mode is dropout-free."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=zoo.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.1)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="fa2").train()

    def run(seed):
        torch.manual_seed(seed)
        logits = model(input_ids=zoo._ids("cpu")).logits
        return logits, torch.autograd.grad(logits.square().sum(), model.model.layers[0].self_attn.q_proj.weight)[0]

    (a, ga), (b, gb), (c, _) = run(1), run(1), run(2)
    assert torch.equal(a, b) and torch.equal(ga, gb)
    assert not torch.equal(a, c)
    model.eval()
    with torch.no_grad():
        torch.manual_seed(1)
        e1 = model(input_ids=zoo._ids("cpu")).logits
        torch.manual_seed(2)
        assert torch.equal(e1, model(input_ids=zoo._ids("cpu")).logits)   # eval: no dropout


def test_sliding_window_with_a_mask_uses_the_mask_only():
    """A mask from transformers already holds the window at the true cache positions; fa2's bottom-right window
    anchor would be wrong for a static cache (query at position 3 of a 16-slot cache)."""
    import fa2.hf
    from fa2.reference import attention_ref

    q = torch.randn(1, 2, 1, 8)
    k = torch.randn(1, 2, 16, 8)
    v = torch.randn(1, 2, 16, 8)
    mask = torch.zeros(1, 1, 1, 16, dtype=torch.bool)
    mask[..., 2:4] = True                      # sliding_window=2 at position 3: keys 2 and 3
    module = torch.nn.Module()
    module.is_causal = True
    out, _ = fa2.hf.fa2_attention_forward(module, q, k, v, mask, scaling=8 ** -0.5, sliding_window=2)
    ref = attention_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
    assert torch.allclose(out, ref, atol=1e-5)


class CaptureFa2Fwd(TorchDispatchMode):
    """The (attn_bias shape, causal) of every fa2.fwd call."""
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.fa2.fwd.default:
            bias = args[3] if len(args) > 3 else (kwargs or {}).get("attn_bias")
            causal = args[5] if len(args) > 5 else (kwargs or {}).get("causal", False)
            self.calls.append((None if bias is None else tuple(bias.shape), bool(causal)))
        return func(*args, **(kwargs or {}))


def _materialize(form, batch, q_length, kv_length, sliding_window=None):
    """The (B, 1, q, kv) bool mask fa2_attention_forward runs for a None / (B, kv) form of fa2_mask: causal
    bottom-right (key j visible iff j <= i + kv - q), the layer's window, the key padding."""
    i = torch.arange(q_length)[:, None] + kv_length - q_length
    j = torch.arange(kv_length)[None, :]
    visible = j <= i
    if sliding_window is not None:
        visible = visible & (j > i - sliding_window)
    visible = visible.expand(batch, 1, q_length, kv_length)
    return visible if form is None else visible & form[:, None, None, :]


def test_fa2_mask_forms_mean_sdpas_mask():
    """fa2_mask gives None / a (B, kv) padding mask for plain and sliding-window causal masks whose diagonal is fa2's
    bottom-right one (offsets on the host), transformers' 4-D sdpa mask otherwise; what fa2 runs for each form is
    exactly sdpa_mask's materialized mask."""
    from transformers import LlamaConfig, MistralConfig
    from transformers.masking_utils import (bidirectional_mask_function, causal_mask_function, sdpa_mask,
                                            sliding_window_causal_mask_function)
    pad = torch.ones(2, 10, dtype=torch.bool)
    pad[0, :3] = False
    pad14 = torch.ones(2, 14, dtype=torch.bool)
    pad14[0, :3] = False
    ones14 = torch.ones(2, 14, dtype=torch.bool)
    sliding = dict(mask_function=sliding_window_causal_mask_function(4), local_size=4,
                   config=MistralConfig(sliding_window=4))
    cases = [  # (kwargs, the form: "none", "padding" or "sdpa")
        (dict(q_length=10, kv_length=10), "none"),
        (dict(q_length=10, kv_length=10, attention_mask=torch.ones(2, 10, dtype=torch.bool)), "none"),
        (dict(q_length=10, kv_length=10, attention_mask=pad), "padding"),                  # prefill, no cache
        (dict(q_length=4, kv_length=14, q_offset=10, attention_mask=pad14), "padding"),    # a chunk after 10 cached
        (dict(q_length=4, kv_length=14, q_offset=10, attention_mask=ones14), "padding"),   # (all keys real)
        (dict(q_length=4, kv_length=14, q_offset=10), "padding"),                          # (no 2-D mask given)
        (dict(q_length=1, kv_length=14, q_offset=13, attention_mask=pad14), "padding"),    # decoding
        (dict(q_length=1, kv_length=14, q_offset=13, attention_mask=pad14, allow_is_causal_skip=False), "sdpa"),
        (dict(q_length=10, kv_length=10, attention_mask=pad, **sliding), "padding"),
        (dict(q_length=10, kv_length=10, **sliding), "none"),
        (dict(q_length=4, kv_length=6, q_offset=10, kv_offset=8, attention_mask=pad14, **sliding), "padding"),
        (dict(q_length=10, kv_length=16, attention_mask=torch.ones(2, 16, dtype=torch.bool),   # static cache
              allow_is_causal_skip=False), "sdpa"),
        (dict(q_length=10, kv_length=16, q_offset=torch.tensor(0), attention_mask=pad14), "sdpa"),  # tensor offset
        (dict(q_length=10, kv_length=10, attention_mask=pad, mask_function=lambda b, h, q, kv: kv <= q + 1), "sdpa"),
        (dict(q_length=10, kv_length=10, attention_mask=pad, mask_function=bidirectional_mask_function), "sdpa"),
        (dict(q_length=10, kv_length=10, attention_mask=pad, local_size=4,                # chunked attention
              mask_function=sliding_window_causal_mask_function(4),
              config=LlamaConfig(sliding_window=4, attention_chunk_size=4)), "sdpa"),
        (dict(q_length=10, kv_length=10, attention_mask=pad, local_size=4,                # window not the config's
              mask_function=sliding_window_causal_mask_function(4), config=MistralConfig(sliding_window=8)), "sdpa"),
    ]
    for kwargs, want_form in cases:
        got = fa2.hf.fa2_mask(2, **kwargs)
        form = "none" if got is None else "padding" if got.dim() == 2 else "sdpa"
        assert form == want_form, (kwargs, form)
        sdpa_kwargs = {k: v for k, v in kwargs.items() if k != "allow_is_causal_skip"}
        want = sdpa_mask(batch_size=2, allow_is_causal_skip=False, **sdpa_kwargs)
        if form == "sdpa":
            assert torch.equal(got, sdpa_mask(batch_size=2, **kwargs)), kwargs
            continue
        window = kwargs.get("local_size")
        assert torch.equal(_materialize(got, 2, kwargs["q_length"], kwargs["kv_length"], window), want), kwargs
        assert kwargs.get("mask_function", causal_mask_function) is causal_mask_function or window is not None


def test_a_padding_mask_is_causal_whatever_the_module_says():
    """Some modules compute is_causal as "no mask given" (False with a mask): fa2_mask's (B, kv) form still runs
    causal (its bottom-right diagonal checked), with the key mask."""
    from fa2.reference import attention_ref
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    pad = torch.ones(2, 6, dtype=torch.bool)
    pad[0, :2] = False
    mask = fa2.hf.fa2_mask(2, 6, 6, attention_mask=pad)
    assert mask.shape == (2, 6)
    module = torch.nn.Module()
    module.is_causal = False
    with CaptureFa2Fwd() as captured:
        out, _ = fa2.hf.fa2_attention_forward(module, q, k, v, mask, scaling=0.5, is_causal=False)
    assert captured.calls == [((2, 1, 1, 6), True)], captured.calls
    want = attention_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), _materialize(mask, 2, 6, 6),
                         scale=0.5)
    torch.testing.assert_close(out, want)


def test_a_padding_mask_gets_the_layers_window():
    """A sliding-window layer over a padded batch: the (B, kv) form plus the layer's window is transformers'
    sliding-window mask (sdpa_mask's), keys outside the window hidden."""
    from transformers import MistralConfig
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function
    from fa2.reference import attention_ref
    q, k, v = (torch.randn(2, 2, 8, 8) for _ in range(3))
    pad = torch.ones(2, 8, dtype=torch.bool)
    pad[0, :2] = False
    kwargs = dict(mask_function=sliding_window_causal_mask_function(3), local_size=3, attention_mask=pad,
                  config=MistralConfig(sliding_window=3))
    mask = fa2.hf.fa2_mask(2, 8, 8, **kwargs)
    assert mask.shape == (2, 8)
    with CaptureFa2Fwd() as captured:
        out, _ = fa2.hf.fa2_attention_forward(torch.nn.Module(), q, k, v, mask, scaling=0.5, sliding_window=3)
    assert captured.calls == [((2, 1, 1, 8), True)], captured.calls
    want_mask = sdpa_mask(batch_size=2, q_length=8, kv_length=8, allow_is_causal_skip=False, **kwargs)
    want = attention_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), want_mask, scale=0.5)
    torch.testing.assert_close(out, want)


@pytest.mark.slow  # (HF under torch.compile: test_compiles_without_graph_breaks in the quick run)
def test_padded_batch_compiles_without_graph_breaks():
    """Under torch.compile the 4-D mask is used as it is (nothing noted while tracing): no graph break, eager's result."""
    model = zoo.build("llama", "cpu", torch.float32, attn="fa2").eval()
    ids = zoo._ids("cpu")[:, :10]
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        got, want = compiled(input_ids=ids, attention_mask=mask).logits, model(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid])


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_padded_batch_runs_causal_with_a_key_mask(device, dtype):
    """A left-padded batch on a model without sliding windows (llama): fa2 runs causal=True with a (B, 1, 1, S) key
    mask (the padding masks' fast kernels) in the forward, the backward and while decoding with the cache, and gives
    eager's outputs on the real tokens, its gradients, and its greedy tokens."""
    model = zoo.build("llama", device, dtype, attn="fa2").train()
    eager = zoo.build("llama", device, dtype, attn="eager").train()
    ids = zoo._ids(device)[:, :10]
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    # the loss only from logits at real tokens (a padded query row sees no key: fa2 gives 0 there, eager an average)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:][mask[:, :-1] == 0] = -100
    inputs = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    with CaptureFa2Fwd() as captured:
        got = _run(model, inputs)
    assert captured.calls and all(c == ((ids.shape[0], 1, 1, ids.shape[1]), True) for c in captured.calls), \
        captured.calls
    want = _run(eager, inputs)
    valid = mask.bool()
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got[0][valid].float(), want[0][valid].float(), atol=tol, rtol=tol)
    for name, g in got[1].items():
        torch.testing.assert_close(g.float(), want[1][name].float(), atol=10 * tol, rtol=10 * tol, msg=name)
    model.eval(), eager.eval()
    kwargs = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    with CaptureFa2Fwd() as captured:
        out = model.generate(ids, attention_mask=mask, **kwargs)
    decode = [c for c in captured.calls if c[0] is not None and c[0][-1] > ids.shape[1]]  # steps after the prompt
    assert decode and all(c[0][1:3] == (1, 1) for c in decode), captured.calls
    if dtype == torch.float32:
        assert torch.equal(out, eager.generate(ids, attention_mask=mask, **kwargs))


def _from_config(cfg_cls, model_cls, attn, **kw):
    torch.manual_seed(0)
    return model_cls._from_config(cfg_cls(**kw), attn_implementation=attn).eval()


def test_mla_value_head_dim_differs_from_query_head_dim():
    """DeepSeek-V3 (MLA): q/k head dim 24, v head dim 8, given to the op as they are (a value head dim of its own)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    cfg = dict(vocab_size=100, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
               n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
               qk_nope_head_dim=16, v_head_dim=8, n_group=1, topk_group=1, max_position_embeddings=64)
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    got = _from_config(DeepseekV3Config, DeepseekV3ForCausalLM, "fa2", **cfg)
    want = _from_config(DeepseekV3Config, DeepseekV3ForCausalLM, "eager", **cfg)
    with torch.no_grad(), CountFa2() as counted:
        out = got(input_ids=ids, attention_mask=mask).logits
    assert counted.fwd == 2
    with torch.no_grad():
        ref = want(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(out[mask.bool()], ref[mask.bool()], atol=1e-5, rtol=1e-5)


def test_t5_fully_padded_encoder_row_matches_eager():
    """T5's position bias with a bool mask: a fully padded encoder row averages uniformly, as eager's additive mask
    makes it (it was 0 with -inf)."""
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = dict(vocab_size=100, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, dropout_rate=0.0,
               decoder_start_token_id=0, pad_token_id=0)
    ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(1))
    dec = torch.randint(3, 100, (2, 4), generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[1] * 6, [0] * 6])
    with torch.no_grad():
        got = _from_config(T5Config, T5ForConditionalGeneration, "fa2", **cfg)(
            input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        want = _from_config(T5Config, T5ForConditionalGeneration, "eager", **cfg)(
            input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_output_attentions_warns_that_there_are_none():
    model = zoo.build("mistral", "cpu", torch.float32, attn="fa2").eval()
    with pytest.warns(UserWarning, match="fa2 does not return attention weights"), torch.no_grad():
        out = model(input_ids=zoo._ids("cpu")[:, :6], output_attentions=True)
    assert not any(a is not None for a in (out.attentions or ()))


# ---- torch.compile: one graph, and fa2 gets causal=True (no materialized causal mask), forward and backward ----------

@pytest.fixture
def dynamo_takes_only_plain_modules(monkeypatch):
    """Dynamo up to torch 2.12 breaks the graph at an import in traced code whose result is not exactly a module
    ("Bad import result": transformers is a lazy module); the same rule here, whatever the installed torch does."""
    import builtins
    import types
    import torch._dynamo.symbolic_convert as symbolic_convert

    def import_plain_modules_only(*args, **kwargs):
        value = builtins.__import__(*args, **kwargs)
        if type(value) is not types.ModuleType:
            raise ImportError(f"import result is a {type(value).__name__}, not a plain module")
        return value
    monkeypatch.setattr(symbolic_convert, "__import__", import_plain_modules_only, raising=False)


def _fa2_calls_of(graphs):
    """(attn_bias shape or None, causal, window_left) of every fa2.fwd / fa2.bwd node of the captured graphs."""
    calls = {"fwd": [], "bwd": []}
    for gm in graphs:
        for node in gm.graph.nodes:
            kind = {torch.ops.fa2.fwd.default: "fwd", torch.ops.fa2.bwd.default: "bwd"}.get(node.target)
            if kind is None:
                continue
            schema = node.target._schema.arguments
            bound = {a.name: a.default_value for a in schema if a.has_default_value()}
            bound.update(zip((a.name for a in schema), node.args))
            bound.update(node.kwargs)
            bias = bound["attn_bias"]
            calls[kind].append((None if bias is None else tuple(bias.meta["val"].shape), bound["causal"],
                                bound["window_left"]))
    return calls


def _compiled_fa2_calls(fn, *args, **kwargs):
    """Runs torch.compile(fn) with an AOTAutograd backend that keeps the forward and backward graphs; returns fn's
    result and the fa2 calls in those graphs."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)
    torch._dynamo.reset()
    result = torch.compile(fn, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))(*args, **kwargs)
    return result, graphs


@pytest.mark.parametrize("name,padded", [("llama", False), pytest.param("llama", True, marks=pytest.mark.slow),
                                         pytest.param("mistral", False, marks=pytest.mark.slow)])
def test_compiled_training_step_has_one_graph_and_runs_causal(name, padded, dynamo_takes_only_plain_modules):
    """torch.compile of a training step of attn_implementation="fa2": one graph (torch._dynamo.explain), and every
    fa2 call, forward and backward, gets causal=True with no materialized mask: attn_bias None without padding, the
    (B, 1, 1, S) key mask with padding, the layer's window on sliding-window models; the loss is eager's."""
    entry = zoo.ZOO_BY_NAME[name]
    model = zoo.build(name, "cpu", torch.float32, attn="fa2").train()
    ids = zoo._ids("cpu")
    inputs = {"input_ids": ids, "labels": ids}
    if padded:
        mask = torch.ones_like(ids)
        mask[0, :3] = 0
        inputs["attention_mask"] = mask
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(**inputs)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        [b.reason for b in explained.break_reasons]

    def step(**kw):
        loss = model(**kw).loss
        loss.backward()
        return loss.detach()
    loss, graphs = _compiled_fa2_calls(step, **inputs)
    calls = _fa2_calls_of(graphs)
    window = model.config.sliding_window - 1 if getattr(model.config, "sliding_window", None) else -1
    want = ((ids.shape[0], 1, 1, ids.shape[1]) if padded else None, True, window)
    assert len(calls["fwd"]) == entry.sites and len(calls["bwd"]) == entry.sites, calls
    assert all(c == want for c in calls["fwd"] + calls["bwd"]), (want, calls)
    model.zero_grad(set_to_none=True)
    torch.testing.assert_close(loss, model(**inputs).loss.detach())


@pytest.mark.slow  # (the quick run: the training step above)
def test_compiled_generation_runs_causal_without_a_mask(dynamo_takes_only_plain_modules):
    """Greedy generation with the model's forward compiled (dynamic cache): no fa2 call gets a materialized mask
    (generate passes an all-ones attention_mask, which fa2_mask cannot read while tracing: at most the (B, 1, 1, kv)
    key mask), the prompt's is causal; eager's tokens."""
    model = zoo.build("llama", "cpu", torch.float32, attn="fa2").eval()
    ids = zoo._ids("cpu")[:, :8]
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(ids, **kwargs)
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)
    torch._dynamo.reset()
    forward = model.forward
    model.forward = torch.compile(forward, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    try:
        with torch.no_grad():
            got = model.generate(ids, **kwargs)
    finally:
        model.forward = forward
    assert torch.equal(got, want)
    calls = _fa2_calls_of(graphs)["fwd"]
    assert calls and all((bias is None or bias[1:3] == (1, 1)) and window == -1 for bias, _, window in calls), calls
    assert any(causal for _, causal, _ in calls), calls  # the prompt (8 queries): causal
