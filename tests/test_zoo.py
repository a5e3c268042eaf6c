"""The zoo: tiny Hugging Face models with eager attention, compiled with ``backend="fa2"``.

For each model, inference (no_grad) and a training step (loss.backward()): every attention site found in the compiled
graphs is rewritten into fa2 (the pass's report, and the fa2.fwd / fa2.bwd ops counted in the rewritten graphs: the
backward uses fa2.bwd), and outputs and gradients match eager within the numerics rule (docs/design.md) against a
float32/float64 reference.
"""
from __future__ import annotations

import copy

import pytest
import torch

import fa2.backend  # noqa: F401  (registers backend="fa2")
from fa2.inductor import recording
from fa2.inductor._compat import without_aot_cache
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


def _grads(model):
    return {name.removeprefix("_orig_mod."): p.grad.detach().clone() for name, p in model.named_parameters()
            if p.grad is not None}


def _step(model, inputs, train: bool):
    model.zero_grad(set_to_none=True)
    if not train:
        with torch.no_grad():
            return zoo.main_output(model(**inputs)).detach(), {}
    out = model(**inputs)
    zoo.loss_of(out).backward()
    return zoo.main_output(out).detach(), _grads(model)


def _check(got, naive, hi, what):
    zoo.assert_model_close(f"{what}: output", got[0], hi[0], naive[0], 2)
    zoo.assert_grads_close(what, got[1], hi[1], naive[1])


# On the CPU, Inductor's code generation (C++ compiled by the host compiler) is most of a zoo model's test: the quick run
# checks the pass on QUICK_MODELS with backend="fa2_eager" (test_zoo_model_pass_only) and leaves test_zoo_model
# (backend="fa2", every model) to the slow profile; real code generation stays in the quick run through test_api's
# and test_inductor_patterns' compile tests.
QUICK_MODELS = ["llama", "gemma2", "bert"]  # GQA; softcap with sliding and global layers; padding mask


@pytest.mark.slow
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("name", [m.name for m in zoo.ZOO])
def test_zoo_model(name, device, dtype):
    _check_zoo_model(name, device, dtype, backend="fa2")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["fa2_eager", "fa2"])
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("name", [m.name for m in zoo.WILD])
def test_wild_model(name, device, dtype, backend):
    """The models nobody on the project picked (zoo.WILD: SegFormer's conv-strided k / v under Inductor's layouts,
    BLOOM's baddbmm + ALiBi, Falcon's MQA, GPT-J's fp32 q / k, Qwen3, DeBERTa-v2's relative-position bias): every
    site rewritten, forward and backward, and within the numerics rule."""
    _check_zoo_model(name, device, dtype, backend=backend)


@pytest.mark.parametrize("name", QUICK_MODELS)
def test_zoo_model_pass_only(name):
    """test_zoo_model's checks with backend="fa2_eager": the same pass, no code generation."""
    _check_zoo_model(name, "cpu", torch.float32, backend="fa2_eager")


LEFT_PADDED = {"llama_left_padded": {}, "mistral_left_padded": {"window_left": 4}, "qwen2_left_padded": {},
               "gemma3_left_padded": {}}


@pytest.mark.parametrize("attn", ["eager", pytest.param("sdpa", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", [n if n == "gemma3_left_padded" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in LEFT_PADDED])
def test_left_padded_decoder_gets_flags_and_a_key_row_mask(name, attn):
    """Issue 52: a left-padded batch's mask (transformers' masking_utils: the band and-ed with attention_mask read per
    key) reaches fa2 as causal / window flags and a key-row mask, not one float bias; the rows that see no key (the
    padding) keep eager's result, inference and training (the loss reads every position)."""
    from fa2.inductor.masks import KEY_ROW_SPLIT
    records = _check_zoo_model(name, "cpu", torch.float32, backend="fa2_eager", attn=attn)
    for r in records:
        assert r.flags.get("causal") is True and r.flags.get("key_row") is True, str(r)
        assert KEY_ROW_SPLIT in r.flags.get("note", ""), str(r)
        for key, value in LEFT_PADDED[name].items():
            assert r.flags.get(key) == value, str(r)
    if name == "gemma3_left_padded":  # its sliding layer (window 6) and its global one
        assert {r.flags.get("window_left") for r in records} == {5, None}, [str(r) for r in records]


def _check_zoo_model(name, device, dtype, backend, attn="eager"):
    entry = zoo.ZOO_BY_NAME[name]
    model = zoo.build(name, device, dtype, attn=attn)
    model.train()
    reference = copy.deepcopy(model).to(hi_dtype(dtype))
    inputs = entry.inputs(device, dtype)
    hi_inputs = entry.inputs(device, hi_dtype(dtype))

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with recording() as records, without_aot_cache():
        got_inf = _step(compiled, inputs, train=False)
        got_train = _step(compiled, inputs, train=True)

    # every attention site of every compiled graph is fa2, forward and backward
    by_graph = {"inference": [r for r in records if r.graph == "inference"],
                "training": [r for r in records if r.graph == "training"]}
    for kind, sites in by_graph.items():
        assert len(sites) == entry.sites, f"{kind}: expected {entry.sites} sites, found {[str(r) for r in sites]}"
        assert all(r.rewritten for r in sites), [str(r) for r in sites if not r.rewritten]
    for graph in records.graphs:
        assert graph["fa2_fwd"] == graph["rewritten"]
        if graph["kind"] == "training":
            assert graph["fa2_bwd"] == graph["rewritten"], "the backward must use fa2.bwd"
    assert sum(g["fa2_bwd"] for g in records.graphs) == entry.sites

    naive_inf, naive_train = _step(model, inputs, train=False), _step(model, inputs, train=True)
    with zoo.reference_precision(name):
        hi_inf, hi_train = _step(reference, hi_inputs, train=False), _step(reference, hi_inputs, train=True)
    _check(got_inf, naive_inf, hi_inf, f"{name} inference")
    _check(got_train, naive_train, hi_train, f"{name} training")
    return records


@pytest.mark.slow  # (dynamic shapes through the pass: test_inductor_patterns, test_api in the quick run)
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES[:1] + DEVICE_DTYPES[2:3])
def test_zoo_dynamic_shapes(device, dtype):
    """dynamic=True: still rewritten, and a new sequence length reuses the graph (the pass adds no guards)."""
    from torch._dynamo.utils import counters
    model = zoo.build("llama", device, dtype).eval()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="fa2", dynamic=True)
    with recording() as records, without_aot_cache(), torch.no_grad():
        for seqlen in (12, 20, 29):
            ids = torch.randint(0, zoo.VOCAB, (zoo.BATCH, seqlen), device=device)
            got = compiled(input_ids=ids).logits
            ref = model(input_ids=ids).logits
            torch.testing.assert_close(got.float(), ref.float(), atol=2e-2 if dtype != torch.float32 else 1e-4,
                                       rtol=1e-2 if dtype != torch.float32 else 1e-4)
    assert records and all(r.rewritten for r in records), [str(r) for r in records]
    assert all(r.flags.get("causal") is True for r in records)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


@pytest.mark.parametrize("name", ["llama", "bert", pytest.param("t5", marks=pytest.mark.slow)])
def test_zoo_sdpa_implementation(name):
    """attn_implementation="sdpa": the scaled_dot_product_attention calls (fused op, or SDPA's math path with T5's
    trained bias) become fa2 too. backend="fa2_eager": the same pass, no code generation."""
    entry = zoo.ZOO_BY_NAME[name]
    model = zoo.build(name, "cpu", torch.float32, attn="sdpa").train()
    reference = copy.deepcopy(model).double()
    inputs, hi_inputs = entry.inputs("cpu", torch.float32), entry.inputs("cpu", torch.float64)
    torch._dynamo.reset()
    with recording() as records, without_aot_cache():
        got = _step(torch.compile(model, backend="fa2_eager"), inputs, train=True)
    assert len(records) == entry.sites and all(r.rewritten for r in records), [str(r) for r in records]
    assert sum(g["fa2_bwd"] for g in records.graphs) == entry.sites
    _check(got, _step(model, inputs, train=True), _step(reference, hi_inputs, train=True), f"{name} sdpa")
