"""Hugging Face integration: ``fa2.hf.register()`` then ``attn_implementation="fa2"``.

The zoo's models built with attn_implementation="fa2" match the same weights with "eager" (outputs and gradients,
numerics rule against a float32/float64 reference), fa2's op really runs, padding / sliding window / softcap / GQA /
T5's position bias / KV-cache decoding come through, and dropout in training is refused loudly.
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


def test_dropout_in_training_is_refused():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=zoo.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.1)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="fa2").train()
    with pytest.raises(NotImplementedError, match="dropout"):
        model(input_ids=zoo._ids("cpu"))
    model.eval()
    model(input_ids=zoo._ids("cpu"))   # eval: no dropout, fine


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


def test_fa2_mask_is_sdpas_and_notes_only_bottom_right_causal_over_padding():
    """fa2_mask returns transformers' sdpa_mask unchanged; it notes the padding (fa2: causal=True + a key mask) exactly
    when the mask is plain causal over padding with fa2's bottom-right diagonal, with host-side offsets."""
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function
    # (transformers hands the builders bool padding masks)
    pad = torch.ones(2, 10, dtype=torch.bool)
    pad[0, :3] = False
    pad14 = torch.ones(2, 14, dtype=torch.bool)
    pad14[0, :3] = False
    noted = [dict(q_length=10, kv_length=10, attention_mask=pad),                    # prefill, no cache
             dict(q_length=4, kv_length=14, q_offset=10, attention_mask=pad14),      # a chunk after 10 cached tokens
             dict(q_length=1, kv_length=14, q_offset=13, attention_mask=pad14,       # decoding (a mask even for 1 query)
                  allow_is_causal_skip=False)]
    not_noted = [dict(q_length=10, kv_length=10, attention_mask=torch.ones(2, 10, dtype=torch.bool)),  # no padding
                 dict(q_length=10, kv_length=16, attention_mask=torch.ones(2, 16, dtype=torch.bool),  # static cache
                      allow_is_causal_skip=False),
                 dict(q_length=10, kv_length=10, attention_mask=pad, local_size=4,
                      mask_function=sliding_window_causal_mask_function(4)),
                 dict(q_length=10, kv_length=10, attention_mask=pad, mask_function=lambda b, h, q, kv: kv <= q + 1),
                 dict(q_length=4, kv_length=14, q_offset=torch.tensor(10), attention_mask=pad14)]  # a tensor offset
    for kwargs, want_noted in [(k, True) for k in noted] + [(k, False) for k in not_noted]:
        got = fa2.hf.fa2_mask(2, **kwargs)
        want = sdpa_mask(batch_size=2, **kwargs)
        assert (got is None and want is None) or torch.equal(got, want), kwargs
        padding = fa2.hf._padding_of(got)
        assert (padding is not None) == want_noted, kwargs
        if want_noted:
            assert torch.equal(padding, kwargs["attention_mask"][:, -kwargs["kv_length"]:].bool())
            assert fa2.hf._padding_of(got.clone()) is None  # only that very object
            changed = got.contiguous()
            fa2.hf._note_causal_over_padding(changed, padding)
            changed[0, 0, -1, 0] = True  # changed in place after the note: not matched
            assert fa2.hf._padding_of(changed) is None


def test_a_noted_mask_is_causal_whatever_the_module_says():
    """Some modules compute is_causal as "no mask given" (False with a mask): a noted causal-over-padding mask still
    runs causal, as its 4-D form would."""
    from fa2.reference import attention_ref
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    pad = torch.ones(2, 6, dtype=torch.bool)
    pad[0, :2] = False
    mask = fa2.hf.fa2_mask(2, 6, 6, attention_mask=pad)
    assert fa2.hf._padding_of(mask) is not None
    module = torch.nn.Module()
    module.is_causal = False
    with CaptureFa2Fwd() as captured:
        out, _ = fa2.hf.fa2_attention_forward(module, q, k, v, mask, scaling=0.5, is_causal=False)
    assert captured.calls == [((2, 1, 1, 6), True)], captured.calls
    want = attention_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, scale=0.5)
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


def test_a_noted_mask_gets_no_window_from_the_layer():
    """A noted causal-over-padding mask holds no window (it was built without one): a sliding_window the layer passes
    alongside is ignored, as the SDPA path reads its 4-D form alone."""
    from fa2.reference import attention_ref
    q, k, v = (torch.randn(2, 2, 8, 8) for _ in range(3))
    pad = torch.ones(2, 8, dtype=torch.bool)
    pad[0, :2] = False
    mask = fa2.hf.fa2_mask(2, 8, 8, attention_mask=pad)
    assert fa2.hf._padding_of(mask) is not None
    out, _ = fa2.hf.fa2_attention_forward(torch.nn.Module(), q, k, v, mask, scaling=0.5, sliding_window=3)
    want = attention_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, scale=0.5)
    torch.testing.assert_close(out, want)


def _from_config(cfg_cls, model_cls, attn, **kw):
    torch.manual_seed(0)
    return model_cls._from_config(cfg_cls(**kw), attn_implementation=attn).eval()


def test_mla_value_head_dim_differs_from_query_head_dim():
    """DeepSeek-V3 (MLA): q/k head dim 24, v head dim 8; fa2 pads the smaller side and slices the output."""
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
