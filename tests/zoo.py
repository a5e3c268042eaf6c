"""A zoo of tiny, randomly initialized Hugging Face models (built from configs: no downloads), each with example
inputs and the number of attention sites its forward has. Shared by tests/test_zoo.py and fa2.demo-like checks.

Dropout probabilities are 0 in ZOO and WILD (their outputs are compared with eager's); DROPOUT holds GPT-2, BERT
and ViT with attention dropout 0.1 (GPT-2's and BERT's default), whose sites become fa2's dropout: equal to eager
only in distribution, so tests/test_inductor_dropout.py checks their statistics and reproducibility under a seed.
Models are built with ``attn_implementation="eager"`` by default: the hand-written matmul/softmax attention
that the "fa2" backend has to find; tests/test_hf.py builds the same models with ``attn_implementation="fa2"``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

BATCH, SEQ, VOCAB = 2, 16, 128


@dataclass
class ZooModel:
    name: str
    build: Callable[[str], torch.nn.Module]    # attn_implementation -> model
    inputs: Callable[[torch.device, torch.dtype], dict]
    sites: int              # attention sites in one forward
    what: str               # what the model exercises
    # The float64 reference computes the softmax in float64 (the models cast the scores to float32 for it, where the
    # float64 mask's minimum becomes -inf: a row that sees no key would be NaN, not eager's uniform average)
    softmax_in_float64: bool = False


def _ids(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g).to(device)


def _gpt2(attn, attn_pdrop=0.0):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4, attn_pdrop=attn_pdrop,
                     resid_pdrop=0.0, embd_pdrop=0.0)
    return GPT2LMHeadModel._from_config(cfg, attn_implementation=attn)


def _llama_like(prefix, attn, **extra):
    """A Llama-shaped decoder of transformers' ``{prefix}ForCausalLM`` (GQA 4 / 2)."""
    import transformers
    cfg = getattr(transformers, f"{prefix}Config")(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, **extra)
    return getattr(transformers, f"{prefix}ForCausalLM")._from_config(cfg, attn_implementation=attn)


def _llama(attn):
    return _llama_like("Llama", attn)


def _mistral(attn):
    return _llama_like("Mistral", attn, sliding_window=5)


def _gemma2(attn):
    from transformers import Gemma2Config, Gemma2ForCausalLM
    cfg = Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                       sliding_window=6, attn_logit_softcapping=20.0, final_logit_softcapping=30.0,
                       query_pre_attn_scalar=16)
    return Gemma2ForCausalLM._from_config(cfg, attn_implementation=attn)


def _bert(attn, attention_probs_dropout_prob=0.0):
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=attention_probs_dropout_prob)
    return BertModel._from_config(cfg, attn_implementation=attn, add_pooling_layer=False)


def _vit(attn, attention_probs_dropout_prob=0.0):
    from transformers import ViTConfig, ViTModel
    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=128, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=attention_probs_dropout_prob)
    return ViTModel._from_config(cfg, attn_implementation=attn, add_pooling_layer=False)


def _t5(attn):
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=1, num_decoder_layers=1,
                   num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                   dropout_rate=0.0, decoder_start_token_id=0)
    return T5ForConditionalGeneration._from_config(cfg, attn_implementation=attn)


def _whisper_encoder(attn):
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    cfg = WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, d_model=64, encoder_layers=1, encoder_attention_heads=4,
                        decoder_layers=1, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                        max_source_positions=16, max_target_positions=32, dropout=0.0, attention_dropout=0.0,
                        activation_dropout=0.0)
    cfg._attn_implementation = attn
    return WhisperEncoder(cfg)


def _causal_lm_inputs(device, dtype):
    ids = _ids(device)
    return {"input_ids": ids, "labels": ids}


def _bert_inputs(device, dtype):
    ids = _ids(device)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long, device=device)
    mask[1, SEQ - 5:] = 0     # right padding on the second sequence
    return {"input_ids": ids, "attention_mask": mask}


def _vit_inputs(device, dtype):
    g = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g).to(device=device, dtype=dtype)}


def _t5_inputs(device, dtype):
    ids = _ids(device)
    return {"input_ids": ids, "labels": _ids(device, seed=1)[:, : SEQ // 2].contiguous()}


def _whisper_inputs(device, dtype):
    g = torch.Generator().manual_seed(0)
    return {"input_features": torch.randn(BATCH, 16, 32, generator=g).to(device=device, dtype=dtype)}


ZOO = [
    ZooModel("gpt2", _gpt2, _causal_lm_inputs, 2, "causal mask, 1/sqrt(d) scale"),
    ZooModel("llama", _llama, _causal_lm_inputs, 2, "GQA (repeat_kv), fp32 softmax + cast"),
    ZooModel("mistral", _mistral, _causal_lm_inputs, 2, "sliding window"),
    ZooModel("gemma2", _gemma2, _causal_lm_inputs, 2, "softcap, sliding + global layers"),
    ZooModel("bert", _bert, _bert_inputs, 2, "padding mask"),
    ZooModel("vit", _vit, _vit_inputs, 2, "no mask"),
    ZooModel("t5", _t5, _t5_inputs, 3, "learned relative position bias (trained), scale 1"),
    ZooModel("whisper_encoder", _whisper_encoder, _whisper_inputs, 1, "encoder self-attention"),
]


# Models nobody on the project picked (the compile pass "in the wild"): the forms of attention they write, each with
# its own tiny config. Only test_zoo uses them (tests/test_hf.py runs ZOO with attn_implementation="fa2").
def _segformer(attn):
    from transformers import SegformerConfig, SegformerModel
    cfg = SegformerConfig(num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                          patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0)
    return SegformerModel._from_config(cfg, attn_implementation=attn)


def _bloom(attn):
    from transformers import BloomConfig, BloomForCausalLM
    cfg = BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4, attention_dropout=0.0, hidden_dropout=0.0)
    return BloomForCausalLM._from_config(cfg, attn_implementation=attn)


def _falcon(attn):
    from transformers import FalconConfig, FalconForCausalLM
    cfg = FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, multi_query=True,
                       alibi=False, new_decoder_architecture=False, parallel_attn=True, bias=False,
                       attention_dropout=0.0, hidden_dropout=0.0)
    return FalconForCausalLM._from_config(cfg, attn_implementation=attn)


def _gptj(attn):
    from transformers import GPTJConfig, GPTJForCausalLM
    cfg = GPTJConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=64, attn_pdrop=0.0,
                     resid_pdrop=0.0, embd_pdrop=0.0)
    return GPTJForCausalLM._from_config(cfg, attn_implementation=attn)


def _qwen3(attn):
    return _llama_like("Qwen3", attn, head_dim=16)


def _deberta_v2(attn):
    from transformers import DebertaV2Config, DebertaV2Model
    cfg = DebertaV2Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, max_position_embeddings=64, relative_attention=True,
                          pos_att_type=["p2c", "c2p"], position_buckets=16, max_relative_positions=32,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return DebertaV2Model(cfg)


def _qwen2(attn):
    return _llama_like("Qwen2", attn)


def _gemma3(attn):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    cfg = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                           sliding_window=6, layer_types=["sliding_attention", "full_attention"],
                           query_pre_attn_scalar=16, attention_dropout=0.0)
    return Gemma3ForCausalLM._from_config(cfg, attn_implementation=attn)


def _mixtral(attn):
    model = _llama_like("Mixtral", attn, num_local_experts=4, num_experts_per_tok=2, sliding_window=None)
    model.config._experts_implementation = "batched_mm"
    return model


class _SiglipVisionWithPooler(torch.nn.Module):
    """SigLIP's vision tower with its pooling head (a learned probe through nn.MultiheadAttention with the default
    need_weights=True, the weights discarded); the pooled vector is appended to the last hidden state so that the
    zoo's loss and comparisons read it too."""

    def __init__(self, attn):
        super().__init__()
        from transformers import SiglipVisionConfig, SiglipVisionModel
        cfg = SiglipVisionConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=2, num_attention_heads=4, attention_dropout=0.0,
                                 vision_use_head=True)
        self.model = SiglipVisionModel._from_config(cfg, attn_implementation=attn)

    def forward(self, pixel_values):
        from transformers.modeling_outputs import BaseModelOutput
        out = self.model(pixel_values=pixel_values)
        return BaseModelOutput(last_hidden_state=torch.cat([out.last_hidden_state, out.pooler_output[:, None]], 1))


def _left_padded_inputs(device, dtype):
    """A batch padded on the left, as for generation: the first rows of the second sequence see no key (eager
    averages v over every key there), the loss reads every position (those rows' gradients count too)."""
    ids = _ids(device)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long, device=device)
    mask[1, :5] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids}


def _segformer_inputs(device, dtype):
    g = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=g).to(device=device, dtype=dtype)}


WILD = [
    ZooModel("segformer", _segformer, _segformer_inputs, 2, "k / v through a stride-2 conv (Inductor's layouts)"),
    ZooModel("bloom", _bloom, _causal_lm_inputs, 2, "baddbmm scores with ALiBi as self, fp32 softmax cast back"),
    ZooModel("falcon", _falcon, _causal_lm_inputs, 2, "MQA, scores viewed 3-D and back"),
    ZooModel("gptj", _gptj, _causal_lm_inputs, 2, "q / k upcast to fp32 for rotary, v in the model's dtype"),
    ZooModel("qwen3", _qwen3, _causal_lm_inputs, 2, "GQA, q / k norms"),
    ZooModel("deberta_v2", _deberta_v2, _bert_inputs, 2, "c2p / p2c relative-position terms as a bias"),
    ZooModel("mixtral", _mixtral, _causal_lm_inputs, 2, "mixture of experts (batched_mm: the default grouped_mm's "
             "backward reads its routing on the host, a graph break that leaves P an output) around GQA attention"),
    ZooModel("llama_left_padded", _llama, _left_padded_inputs, 2, "causal + a key padding mask from attention_mask",
             softmax_in_float64=True),
    ZooModel("mistral_left_padded", _mistral, _left_padded_inputs, 2, "sliding window + key padding",
             softmax_in_float64=True),
    ZooModel("qwen2_left_padded", _qwen2, _left_padded_inputs, 2, "causal + key padding",
             softmax_in_float64=True),
    ZooModel("gemma3_left_padded", _gemma3, _left_padded_inputs, 2, "a sliding and a global layer, key padding",
             softmax_in_float64=True),
    ZooModel("siglip", _SiglipVisionWithPooler, _vit_inputs, 3, "pooling head: nn.MultiheadAttention with "
             "need_weights=True (weights discarded), one learned query"),
]

# Attention dropout 0.1 (GPT-2's and BERT's default; ViTConfig's default is 0.0, 0.1 is a common fine-tuning setting),
# the other dropouts 0 so that the statistics are the attention's: rewritten into fa2's dropout, checked for
# statistics and seeded reproducibility, not equality with eager.
ATTENTION_DROPOUT = 0.1
DROPOUT = [
    ZooModel("gpt2_dropout", lambda attn: _gpt2(attn, attn_pdrop=ATTENTION_DROPOUT), _causal_lm_inputs, 2,
             "causal mask, attn_pdrop"),
    ZooModel("bert_dropout", lambda attn: _bert(attn, attention_probs_dropout_prob=ATTENTION_DROPOUT), _bert_inputs,
             2, "padding mask, attention_probs_dropout_prob"),
    ZooModel("vit_dropout", lambda attn: _vit(attn, attention_probs_dropout_prob=ATTENTION_DROPOUT), _vit_inputs, 2,
             "no mask, attention_probs_dropout_prob"),
]
ZOO_BY_NAME = {m.name: m for m in ZOO + WILD + DROPOUT}


@contextlib.contextmanager
def reference_precision(name: str):
    """Run the high-precision reference of zoo model ``name`` under this (see ZooModel.softmax_in_float64)."""
    if not ZOO_BY_NAME[name].softmax_in_float64:
        yield
        return
    functional = torch.nn.functional
    softmax = functional.softmax

    def softmax_keeping_float64(x, dim=None, _stacklevel=3, dtype=None):
        if x.dtype == torch.float64 and dtype is not None:
            dtype = torch.float64
        return softmax(x, dim=dim, dtype=dtype)

    functional.softmax = softmax_keeping_float64
    try:
        yield
    finally:
        functional.softmax = softmax


def build(name: str, device, dtype, seed: int = 0, attn: str = "eager") -> torch.nn.Module:
    """The model with its random weights (the same for every ``attn`` implementation, given the seed)."""
    torch.manual_seed(seed)
    model = ZOO_BY_NAME[name].build(attn)
    return model.to(device=device, dtype=dtype)


def loss_of(output) -> torch.Tensor:
    """A scalar to backpropagate from any of the zoo's outputs. The encoders' is a fixed random projection of the
    last hidden state, sum(h * w) with w ~ N(0, 1): every hidden unit gets an O(1) gradient. (A norm of h would not
    do: the encoders end in LayerNorm, whose output's mean square is ~1 whatever the weights, so such a loss has
    ~0 gradient everywhere and the test would compare rounding noise.)"""
    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(hidden.shape, generator=g).to(hidden.device)
    return (hidden.float() * w).sum()


def main_output(output) -> torch.Tensor:
    for name in ("logits", "last_hidden_state"):
        value = getattr(output, name, None)
        if value is not None:
            return value
    return output[0]


def assert_model_close(name, got, ref_hi, ref_naive, factor, scale=0.0):
    """The numerics rule (docs/design.md) for a whole model's output or gradient: float32 by the max error; in half
    precision by the norm of the error, since a few ReLU/GELU inputs that round across zero differently in any
    two low-precision runs flip whole terms of a weight gradient, with a floor of 1e-3 (a quarter of a bf16 ulp)
    of max(|ref_hi|, ``scale``). Never NaN."""
    from numerics import assert_close_rule
    assert not torch.isnan(got).any(), f"{name}: NaN"
    if got.dtype in (torch.float32, torch.float64):
        return assert_close_rule(name, got, ref_hi, ref_naive, factor)
    got, ref_hi, ref_naive = (t.double() for t in (got, ref_hi, ref_naive))
    err, naive_err = (got - ref_hi).norm().item(), (ref_naive - ref_hi).norm().item()
    bound = factor * naive_err + 1e-3 * max(ref_hi.norm().item(), scale)
    assert err <= bound, f"{name}: |fa2 - ref| = {err:.3g} > {factor} x |naive - ref| = {naive_err:.3g} (+floor)"
    return err, bound


def assert_grads_close(what, got, ref_hi, ref_naive):
    """assert_model_close for every parameter's gradient (dicts by name), with the norm of the gradients of the
    parameter's module (weight and bias together) as the scale of the floor. Why: FA-2's backward takes
    D = rowsum(dO * O) from the stored, rounded output, so each row of dS sums to dO . (O - round(O)) instead of
    exactly 0. A gradient that is zero by symmetry (BERT's key bias: adding q . b to a whole row of scores leaves
    the softmax unchanged) collects exactly that rounding while the naive math stays near 0; its natural scale is
    the key projection's weight gradient, not its own ~0."""
    assert set(got) == set(ref_hi), f"{what}: parameters with gradients differ"
    module_norm: dict[str, float] = {}
    for key, grad in ref_hi.items():
        module = key.rpartition(".")[0]
        module_norm[module] = (module_norm.get(module, 0.0) ** 2 + grad.double().norm().item() ** 2) ** 0.5
    for key in got:
        assert_model_close(f"{what}: grad {key}", got[key], ref_hi[key], ref_naive[key], 3,
                           scale=module_norm[key.rpartition(".")[0]])


def measure(name: str, device, dtype, backend: str = "fa2") -> dict:
    """Compile one zoo model with ``backend``, run inference and a training step, and measure it against eager and a
    high-precision reference: sites found / rewritten, fa2.bwd in the backward, max errors (fa2 and eager)."""
    import copy

    from fa2.inductor import recording
    from fa2.inductor._compat import without_aot_cache
    from numerics import hi_dtype

    entry = ZOO_BY_NAME[name]
    model = build(name, device, dtype).train()
    reference = copy.deepcopy(model).to(hi_dtype(dtype))
    inputs, hi_inputs = entry.inputs(device, dtype), entry.inputs(device, hi_dtype(dtype))

    def step(m, inp, train):
        m.zero_grad(set_to_none=True)
        if not train:
            with torch.no_grad():
                return main_output(m(**inp)).detach().double(), {}
        out = m(**inp)
        loss_of(out).backward()
        return main_output(out).detach().double(), {n.removeprefix("_orig_mod."): p.grad.detach().double()
                                                    for n, p in m.named_parameters() if p.grad is not None}

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with recording() as records, without_aot_cache():
        got = [step(compiled, inputs, False), step(compiled, inputs, True)]
    naive = [step(model, inputs, False), step(model, inputs, True)]
    with reference_precision(name):
        hi = [step(reference, hi_inputs, False), step(reference, hi_inputs, True)]

    def err(a, b):
        return (a - b).abs().max().item()

    train = [r for r in records if r.graph == "training"]
    return {
        "model": name, "sites": len(train), "rewritten": sum(r.rewritten for r in train),
        "rewritten_inference": sum(r.rewritten for r in records if r.graph == "inference"),
        "fa2_bwd": sum(g["fa2_bwd"] for g in records.graphs),
        "out_err": max(err(got[i][0], hi[i][0]) for i in range(2)),
        "out_err_eager": max(err(naive[i][0], hi[i][0]) for i in range(2)),
        "grad_err": max(err(got[1][1][k], hi[1][1][k]) for k in hi[1][1]),
        "grad_err_eager": max(err(naive[1][1][k], hi[1][1][k]) for k in hi[1][1]),
        "flags": "; ".join(sorted({", ".join(f"{k}={v}" for k, v in r.flags.items()) for r in train})),
    }


def main(argv=None) -> int:
    """python tests/zoo.py [--device D] [--dtype T[,T]] [--backend B] [--models M[,M]]: the zoo table."""
    import argparse
    import time

    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(m.name for m in ZOO))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--backend", default="fa2")
    args = parser.parse_args(argv)
    dtypes = (args.dtype or ("bfloat16,float16" if args.device == "cuda" else "float32,bfloat16")).split(",")
    import fa2.backend  # noqa: F401
    print(f"torch {torch.__version__}, {args.device}, backend={args.backend}")
    print("| model | dtype | sites | rewritten (train/inf) | fa2.bwd | max err out fa2 (eager) | "
          "max err grad fa2 (eager) | flags |")
    print("|---|---|---|---|---|---|---|---|")
    ok = True
    for dtype_name in dtypes:
        for name in args.models.split(","):
            start = time.time()
            r = measure(name, args.device, getattr(torch, dtype_name), args.backend)
            good = r["rewritten"] == r["sites"] == r["rewritten_inference"] == r["fa2_bwd"] == ZOO_BY_NAME[name].sites
            ok &= good
            print(f"| {name} | {dtype_name} | {r['sites']} | {r['rewritten']}/{r['rewritten_inference']} | "
                  f"{r['fa2_bwd']} | {r['out_err']:.1e} ({r['out_err_eager']:.1e}) | "
                  f"{r['grad_err']:.1e} ({r['grad_err_eager']:.1e}) | {r['flags']} |"
                  f"{'' if good else ' NOT ALL REWRITTEN'} ({time.time() - start:.0f} s)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    import sys
    sys.exit(main())
