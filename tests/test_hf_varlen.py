"""Hugging Face ``attn_implementation="fa2"`` on packed (padding-free) and padded batches through fa2.varlen_attention.

Packed batches come as transformers' DataCollatorWithFlattening makes them (batch 1, documents end to end, position
ids restarting at 0; with ``return_flash_attn_kwargs=True`` also cu_seq_lens_q/k and max_length_q/k): their logits
and gradients equal each document run alone by the eager model (numerics rule against float64). Padded batches equal
the eager model on the real tokens through both paths (the key-row padding mask and varlen). Compiled: one graph,
varlen in the forward and backward graphs, no recompilation when the document lengths change (dynamic=True).
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fa2
import fa2.hf
import zoo
from numerics import hi_dtype

transformers = pytest.importorskip("transformers")

_CUDA = torch.cuda.is_available()
DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu-float32"),
    pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16", marks=pytest.mark.slow),
    pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16",
                 marks=pytest.mark.skipif(not _CUDA, reason="no CUDA")),
]
DOCUMENT_LENGTHS = (5, 11, 1, 7)  # (a one-token document included)


@pytest.fixture(scope="module", autouse=True)
def _registered():
    fa2.hf.register()


@pytest.fixture
def padded_batches():
    """set_padded_batches for one test, restored after."""
    yield fa2.hf.set_padded_batches
    fa2.hf.set_padded_batches("key_mask")


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket).removeprefix("fa2.")
        if str(func.namespace) == "fa2":
            self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _documents(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, zoo.VOCAB, (n,), generator=g).tolist() for n in lengths]


def _flattened(documents, device, flash_kwargs):
    from transformers import DataCollatorWithFlattening
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)([{"input_ids": d} for d in documents])
    batch.pop("labels")
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _weights(shape, device, seed=7):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device)


def _logits_and_grads(model, calls, weights):
    """calls: list of kwargs; the logits of all calls end to end along the sequence, and the gradients of
    sum(logits * weights) (weights (1, total, vocab))."""
    model.zero_grad(set_to_none=True)
    logits = torch.cat([model(**kw).logits for kw in calls], dim=1)
    (logits.double() * weights.double()).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


def _per_document_reference(name, documents, device, dtype):
    """(hi, naive): the eager model on each document alone, in float64 / the test dtype."""
    out = []
    for ref_dtype in (hi_dtype(dtype), dtype):
        model = zoo.build(name, device, ref_dtype, attn="eager").train()
        weights = _weights((1, sum(map(len, documents)), zoo.VOCAB), device)
        calls = [{"input_ids": torch.tensor([d], device=device)} for d in documents]
        out.append(_logits_and_grads(model, calls, weights))
    return out


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("name,how", [("llama", "position_ids"), ("llama", "flash_kwargs"),
                                      ("llama", "no_cache"),
                                      pytest.param("gemma2", "position_ids", marks=pytest.mark.slow),
                                      pytest.param("mistral", "flash_kwargs", marks=pytest.mark.slow)])
def test_packed_batch_matches_each_document_alone(name, how, device, dtype):
    """A packed batch's logits and gradients are each document's alone (eager), and fa2 ran varlen only: from the
    restarting position ids (default use_cache: transformers builds no packed mask), from cu_seq_lens_q/k
    (return_flash_attn_kwargs=True), or from the sequence ids fa2_mask reads off transformers' packed mask
    (use_cache=False)."""
    documents = _documents(DOCUMENT_LENGTHS)
    batch = _flattened(documents, device, flash_kwargs=how == "flash_kwargs")
    if how == "no_cache":
        batch["use_cache"] = False
    model = zoo.build(name, device, dtype, attn="fa2").train()
    weights = _weights((1, sum(DOCUMENT_LENGTHS), zoo.VOCAB), device)
    with CountOps() as counted:
        got = _logits_and_grads(model, [batch], weights)
    layers = model.config.num_hidden_layers
    assert counted.calls.get("varlen_fwd") == layers and counted.calls.get("varlen_bwd") == layers, counted.calls
    assert "fwd" not in counted.calls and "attention" not in counted.calls, counted.calls
    (want_hi, want_naive) = _per_document_reference(name, documents, device, dtype)
    zoo.assert_model_close(f"{name} {how}: logits", got[0], want_hi[0], want_naive[0], 2)
    zoo.assert_grads_close(f"{name} {how}", got[1], want_hi[1], want_naive[1])


def test_two_packed_rows_without_cache_match_each_document_alone():
    """Two rows, each packed (use_cache=False, eager): transformers' packed mask per row, read by fa2_mask as sequence
    ids; varlen over both rows (a row start always starts a sequence) gives each document's logits alone."""
    lengths = ((5, 11), (9, 7))
    documents = _documents([n for row in lengths for n in row])
    ids = torch.tensor([documents[0] + documents[1], documents[2] + documents[3]])
    position_ids = torch.tensor([list(range(5)) + list(range(11)), list(range(9)) + list(range(7))])
    model = zoo.build("llama", "cpu", torch.float32, attn="fa2").eval()
    with CountOps() as counted, torch.no_grad():
        got = model(input_ids=ids, position_ids=position_ids, use_cache=False).logits
    assert counted.calls.get("varlen_fwd") == model.config.num_hidden_layers, counted.calls
    eager = zoo.build("llama", "cpu", torch.float64, attn="eager").eval()
    with torch.no_grad():
        want = torch.cat([eager(input_ids=torch.tensor([d])).logits for d in documents], dim=1)
    torch.testing.assert_close(got.reshape(1, -1, zoo.VOCAB), want.float(), atol=1e-5, rtol=1e-5)


def test_one_sequence_keeps_the_dense_kernels():
    """Eager, batch 1, position ids that do not restart: fa2's dense causal call, not varlen."""
    model = zoo.build("llama", "cpu", torch.float32, attn="fa2").eval()
    ids = zoo._ids("cpu")[:1]
    with CountOps() as counted, torch.no_grad():
        model(input_ids=ids)
    assert "varlen_fwd" not in counted.calls and counted.calls.get("fwd") == model.config.num_hidden_layers, \
        counted.calls


def test_sequence_starts_once_per_forward(monkeypatch):
    """The host values of a packed batch (one device sync) are computed once per forward pass, not per layer."""
    calls = []
    compute = fa2.hf._compute_sequence_starts
    monkeypatch.setattr(fa2.hf, "_compute_sequence_starts", lambda *a: calls.append(1) or compute(*a))
    model = zoo.build("llama", "cpu", torch.float32, attn="fa2").eval()
    batch = _flattened(_documents(DOCUMENT_LENGTHS), "cpu", flash_kwargs=False)
    with torch.no_grad():
        model(**batch)
        assert len(calls) == 1
        batch["position_ids"] = batch["position_ids"].clone()  # a new batch: computed again
        model(**batch)
    assert len(calls) == 2


def test_fa2_mask_reads_transformers_packed_mask():
    """fa2_mask's packed form is exactly transformers' packed-sequence ids, for the plain and the sliding-window
    causal masks; another overlay keeps the 4-D mask."""
    from transformers import MistralConfig
    from transformers.masking_utils import (and_masks, causal_mask_function, find_packed_sequence_indices,
                                            packed_sequence_mask_function, sliding_window_causal_mask_function)
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    ids = find_packed_sequence_indices(position_ids)
    packed = packed_sequence_mask_function(ids)
    got = fa2.hf.fa2_mask(1, 9, 9, mask_function=and_masks(causal_mask_function, packed), allow_is_causal_skip=False)
    assert got is ids
    window = dict(local_size=3, config=MistralConfig(sliding_window=3))
    got = fa2.hf.fa2_mask(1, 9, 9, mask_function=and_masks(sliding_window_causal_mask_function(3), packed),
                          allow_is_causal_skip=False, **window)
    assert got is ids
    other = and_masks(causal_mask_function, lambda b, h, q, kv: kv != 2)
    got = fa2.hf.fa2_mask(1, 9, 9, mask_function=and_masks(other, packed), allow_is_causal_skip=False)
    assert got.dim() == 4 and got.dtype == torch.bool


def test_sequence_ids_with_a_position_bias_are_refused():
    """(No model makes both today: T5's decoder builds its mask without position ids.) A silent dense call would
    attend across the packed sequences."""
    q = k = v = torch.randn(1, 2, 4, 8)
    ids = torch.tensor([[0, 0, 1, 1]])
    with pytest.raises(NotImplementedError, match="position bias"):
        fa2.hf.fa2_attention_forward(torch.nn.Module(), q, k, v, ids, position_bias=torch.zeros(1, 2, 4, 4))


def test_set_padded_batches_checks_its_argument():
    with pytest.raises(ValueError, match="path must be one of"):
        fa2.hf.set_padded_batches("unpad")


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("path", ["key_mask", "varlen"])
@pytest.mark.parametrize("name", ["llama", pytest.param("mistral", marks=pytest.mark.slow)])  # (+ sliding window)
def test_padded_batch_matches_eager(name, path, device, dtype, padded_batches):
    """Left, right and inner padding (a hole): the real tokens' logits and the gradients are eager's through both
    padded paths; the varlen path runs fa2.varlen_fwd / varlen_bwd, except on sliding-window layers (mistral),
    which keep the key mask. (No hole with a window: the reference below, each row's real tokens alone, would count
    the window over real tokens, where transformers counts positions.)"""
    padded_batches(path)
    windowed = getattr(zoo.build(name, "cpu", torch.float32).config, "sliding_window", None) is not None
    ids = zoo._ids(device)[:, :12].repeat(2, 1)[:3]
    mask = torch.ones_like(ids)
    mask[0, :4] = 0   # left
    mask[1, 9:] = 0   # right
    if not windowed:
        mask[2, 5:7] = 0  # a hole
    real = mask.bool()
    weights = torch.zeros(3, 12, zoo.VOCAB, device=device)
    weights[real] = _weights((int(real.sum()), zoo.VOCAB), device)  # only the real tokens' logits count
    inputs = {"input_ids": ids, "attention_mask": mask}
    model = zoo.build(name, device, dtype, attn="fa2").train()
    with CountOps() as counted:
        got = _logits_and_grads(model, [inputs], weights)
    layers = model.config.num_hidden_layers
    want_op = "varlen_fwd" if path == "varlen" and not windowed else "fwd"
    assert counted.calls.get(want_op) == layers, counted.calls
    # The reference: each row's real tokens alone, at the positions the padded batch gives them (eager's own padded
    # batch would do, but its float64 run turns a padded query row that sees no key into NaN, which then spreads)
    refs = []
    positions = torch.arange(12, device=device)
    calls = [{"input_ids": ids[b][real[b]][None], "position_ids": positions[real[b]][None]} for b in range(3)]
    for ref_dtype in (hi_dtype(dtype), dtype):
        eager = zoo.build(name, device, ref_dtype, attn="eager").train()
        refs.append(_logits_and_grads(eager, calls, weights[real][None]))
    zoo.assert_model_close(f"{name} {path}: logits", got[0][real], refs[0][0][0], refs[1][0][0], 2)
    zoo.assert_grads_close(f"{name} {path}", got[1], refs[0][1], refs[1][1])


# ---- torch.compile ---------------------------------------------------------------------------------------------

def _varlen_nodes(graphs):
    ops = {torch.ops.fa2.varlen_fwd.default: "varlen_fwd", torch.ops.fa2.varlen_bwd.default: "varlen_bwd",
           torch.ops.fa2.fwd.default: "fwd", torch.ops.fa2.bwd.default: "bwd"}
    found = {}
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.target in ops:
                found[ops[node.target]] = found.get(ops[node.target], 0) + 1
    return found


@pytest.mark.parametrize("how,dynamic", [("position_ids", False),  # (dynamic shapes: 4x the compile time)
                                         pytest.param("position_ids", True, marks=pytest.mark.slow),
                                         pytest.param("flash_kwargs", True, marks=pytest.mark.slow),
                                         pytest.param("padded", True, marks=pytest.mark.slow)])
def test_compiled_packed_training_step(how, dynamic, padded_batches, monkeypatch):
    """torch.compile of a model trained on a packed (or padded, varlen path) batch: one graph, no graph break, varlen
    in the forward and backward graphs, eager's loss; with dynamic=True, other document lengths (count and total)
    run without recompiling; the position ids are read once per forward pass in the compiled graph too."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    padded_batches("varlen")
    model = zoo.build("llama", "cpu", torch.float32, attn="fa2").train()

    def batch_of(lengths):
        documents = _documents(lengths, seed=len(lengths))
        if how != "padded":
            batch = _flattened(documents, "cpu", flash_kwargs=how == "flash_kwargs")
        else:
            width = max(lengths)
            ids = torch.tensor([d + [0] * (width - len(d)) for d in documents])
            mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
            batch = {"input_ids": ids, "attention_mask": mask}
        batch["labels"] = batch["input_ids"]
        return batch

    first, second = batch_of(DOCUMENT_LENGTHS), batch_of((9, 3, 6, 2, 8))
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    # (not fullgraph=True, which would allow what breaks the graph otherwise: data-dependent output sizes)
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), dynamic=dynamic)
    layers = model.config.num_hidden_layers
    reads = []
    compute = fa2.hf._compute_sequence_starts
    monkeypatch.setattr(fa2.hf, "_compute_sequence_starts", lambda *a: reads.append(1) or compute(*a))
    for batch in (first, second) if dynamic else (first,):
        model.zero_grad(set_to_none=True)
        reads.clear()
        loss = compiled(**batch).loss
        assert len(reads) == (how == "position_ids"), f"{len(reads)} reads of the position ids in one forward pass"
        loss.backward()
        model.zero_grad(set_to_none=True)
        torch.testing.assert_close(loss.detach(), model(**batch).loss.detach())
        counters = torch._dynamo.utils.counters
        assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"], \
            (dict(counters["stats"]), dict(counters["graph_break"]))
        assert len(graphs) == 2, f"{len(graphs)} graphs: a forward and a backward expected, compiled once"
        nodes = _varlen_nodes(graphs)
        assert nodes == {"varlen_fwd": layers, "varlen_bwd": layers}, nodes
