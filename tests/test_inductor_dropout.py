"""The Inductor pass on attention whose probabilities go through dropout in training (issue 50, item 3).

``F.dropout(softmax(...), p)`` / ``nn.Dropout(p)`` between the softmax and P·V, in training, becomes fa2's
``dropout_p = p`` (docs/design.md, "Inductor pass", dropout). fa2 draws its own mask, so the compiled result equals
eager only in distribution; the tests check: the rewrite (flags, fa2.fwd / fa2.bwd in the graph), the mask's
statistics and values through a probe (v = identity: the output *is* the dropped, rescaled probability matrix),
gradients against eager math that uses the same mask, reproducibility under ``torch.manual_seed`` (outputs and
gradients bitwise), a fresh mask per call (the rng_state is drawn in the graph, not baked in), and p = 0 / eval
unchanged. tests/test_zoo.py runs GPT-2, BERT and ViT with their attention dropout.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fa2.backend  # noqa: F401  (registers the "fa2" and "fa2_eager" backends)
from fa2.inductor import recording
from fa2.inductor._compat import without_aot_cache
from fa2.inductor.sites import dropout_note
from numerics import assert_close_rule, hi_dtype

_CUDA = torch.cuda.is_available()
_no_cuda = pytest.mark.skipif(not _CUDA, reason="no CUDA")
DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu-float32"),
    pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=_no_cuda),
    pytest.param("cuda", torch.float16, id="cuda-float16", marks=_no_cuda),
]
P = 0.25


def attn_f_dropout(q, k, v, p=P):
    return F.dropout((q @ k.transpose(-2, -1) * 0.25).softmax(-1), p=p, training=True) @ v


class AttnModule(torch.nn.Module):
    """nn.Dropout on the probabilities (a float32 softmax cast back, as GPT-2 / BERT write it)."""

    def __init__(self, p=P):
        super().__init__()
        self.drop = torch.nn.Dropout(p)

    def forward(self, q, k, v, p=None):
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
        w = w.softmax(-1, dtype=torch.float32).to(v.dtype)
        return torch.matmul(self.drop(w) if p is None else F.dropout(w, p), v)


def attn_sdpa_dropout(q, k, v, p=P):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=p)


def _causal(s):
    return torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()


def attn_causal_dropout(q, k, v, p=P):
    s = q @ k.transpose(-2, -1) * 0.25
    return F.dropout(s.masked_fill(~_causal(s), float("-inf")).softmax(-1), p=p, training=True) @ v


def attn_document_dropout(q, k, v, ids, p=P):
    """A causal document mask (runs as varlen)."""
    s = q @ k.transpose(-2, -1) * 0.25
    same = (ids[:, None, :, None] == ids[:, None, None, :]) & _causal(s)
    return F.dropout(s.masked_fill(~same, float("-inf")).softmax(-1), p=p, training=True) @ v


def attn_left_padded_dropout(q, k, v, keys, p=P):
    """Causal and a left padding under a finite fill (transformers' eager form): the first queries of the padded row
    see no key, and eager drops out their uniform average: the mask stays one bias (no flags + key-row split)."""
    s = q @ k.transpose(-2, -1) * 0.25
    visible = _causal(s) & keys[:, None, None, :]
    return F.dropout(s.where(visible, torch.finfo(s.dtype).min).softmax(-1), p=p, training=True) @ v


def _ids(b, s, device):
    ids = torch.zeros(b, s, dtype=torch.int64, device=device)
    ids[:, s // 3:] = 1
    ids[-1, s // 2:] = 2
    return ids


def _left_padding(b, s, device):
    keys = torch.ones(b, s, dtype=torch.bool, device=device)
    keys[-1, :5] = False
    return keys


FORMS = {"f_dropout": (attn_f_dropout, None), "nn_dropout": (AttnModule(), None),
         "sdpa": (attn_sdpa_dropout, None), "causal": (attn_causal_dropout, None),
         "document": (attn_document_dropout, _ids), "left_padded": (attn_left_padded_dropout, _left_padding)}


def probe_inputs(device, dtype, b=2, h=4, s=32, seed=0):
    """q, k random; v the identity (head dim = seqlen): the attention output is then P ∘ Z / (1 - p) itself."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, h, s, s, generator=g).to(device=device, dtype=dtype) for _ in range(2))
    v = torch.eye(s).expand(b, h, s, s).to(device=device, dtype=dtype).contiguous()
    return q, k, v


def compiled(fn, backend="fa2_eager"):
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend)


def probs_of(fn, q, k, *extra):
    """Eager's undropped probabilities of the form ``fn`` (float64): the form itself with p = 0 and v the identity."""
    q, k = q.detach().double(), k.detach().double()
    eye = torch.eye(k.shape[-2], dtype=torch.float64, device=k.device).expand(*k.shape[:-1], k.shape[-2])
    with torch.no_grad():
        return fn(q, k, eye, *extra, p=0.0)


def assert_dropout_rewritten(records, p=P, n=1):
    assert len(records) == n, [str(r) for r in records]
    for r in records:
        assert r.rewritten and r.flags.get("dropout_p") == p, str(r)
        assert dropout_note(p) in r.flags.get("note", ""), str(r)
    for g in records.graphs:
        assert g["fa2_fwd"] == g["rewritten"]
        if g["kind"] == "training":
            assert g["fa2_bwd"] == g["rewritten"], "the backward must use fa2.bwd"


def kept_mask(out, probs, p, what):
    """The keep mask Z read off a probe's output (out = P ∘ Z / (1 - p)): every entry must be 0 or the rescaled
    probability (within the output dtype's rounding), and Z is where it is not 0."""
    # (the output's rounding: P in float32 from the kernel's exp, rounded once more to a half type)
    tol = max(2 * torch.finfo(out.dtype).eps, 64 * torch.finfo(torch.float32).eps)
    out, want = out.double(), probs / (1 - p)
    kept = out != 0
    rel = ((out - want).abs() / want.clamp_min(1e-30))[kept & (probs > 0)]
    assert rel.numel() == 0 or rel.max().item() <= tol, f"{what}: a kept weight is not P / (1 - p): {rel.max():.3g}"
    assert not (kept & (probs == 0)).any(), f"{what}: a masked-out weight came back"
    return kept


def assert_kept_fraction(kept, where, p, what):
    """The fraction of kept weights (among ``where``) is 1 - p within 5 standard deviations of a binomial."""
    n = int(where.sum())
    frac = (kept & where).sum().item() / n
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(frac - (1 - p)) <= 5 * sigma, \
        f"{what}: kept {frac:.4f} of {n} weights, expected {1 - p} ± {5 * sigma:.4f}"


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("form", list(FORMS))
def test_dropout_site_rewritten_with_its_probability(form, device, dtype):
    """The site becomes fa2 with dropout_p = p (fa2.explain's flags and note; fa2.fwd / fa2.bwd in the graph), the
    probe's output is the rescaled probabilities with fa2's mask, about 1 - p of them kept; masked keys stay 0."""
    from fa2.inductor.masks import KEY_ROW_SPLIT
    fn, extra = FORMS[form]
    fn = fn.to(device) if isinstance(fn, torch.nn.Module) else fn
    q, k, v = probe_inputs(device, dtype)
    extra = (extra(q.shape[0], q.shape[2], device),) if extra else ()
    for x in (q, k, v):
        x.requires_grad_(True)
    with recording() as records, without_aot_cache():
        out = compiled(fn)(q, k, v, *extra)
        out.sum().backward()
    assert_dropout_rewritten(records)
    if form == "document":
        assert records[0].flags.get("varlen") == "document ids", str(records[0])
    if form == "left_padded":
        assert KEY_ROW_SPLIT not in records[0].flags.get("note", ""), str(records[0])
    probs = probs_of(fn, q, k, *extra)
    kept = kept_mask(out.detach(), probs, P, form)
    assert_kept_fraction(kept, probs > 0, P, form)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES[:2])
def test_undecomposed_native_dropout(device, dtype):
    """Inductor's fallback_random keeps native_dropout as one op (its mask an output for the backward): the same
    rewrite, the same statistics."""
    from torch._inductor import config
    q, k, v = probe_inputs(device, dtype)
    for x in (q, k, v):
        x.requires_grad_(True)
    with config.patch(fallback_random=True), recording() as records, without_aot_cache():
        out = compiled(attn_f_dropout)(q, k, v)
        out.sum().backward()
    assert_dropout_rewritten(records)
    probs = probs_of(attn_f_dropout, q, k)
    assert_kept_fraction(kept_mask(out.detach(), probs, P, "native_dropout"), probs > 0, P, "native_dropout")


@pytest.mark.parametrize("backend", ["fa2_eager", pytest.param("fa2", marks=pytest.mark.slow)])
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_dropout_gradients_match_eager_with_the_same_mask(device, dtype, backend):
    """The gradients of the compiled site equal eager math that applies the mask fa2 drew (read off the probe's
    output), within the numerics rule against a float64 reference with that mask: the backward replays the
    forward's mask (with Inductor too: its partitioner saves the drawn rng_state rather than drawing again)."""
    q, k, v = probe_inputs(device, dtype, seed=1)
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(q.shape, generator=g).to(device)
    ins = [x.clone().requires_grad_(True) for x in (q, k, v)]
    with recording() as records, without_aot_cache():
        torch.manual_seed(3)
        out = compiled(attn_f_dropout, backend)(*ins)
        (out.float() * weight).sum().backward()
    assert_dropout_rewritten(records)
    kept = kept_mask(out.detach(), probs_of(attn_f_dropout, q, k), P, "probe")

    def same_mask(target):
        xs = [x.detach().to(target).requires_grad_(True) for x in (q, k, v)]
        o = ((xs[0] @ xs[1].transpose(-2, -1) * 0.25).softmax(-1) * kept.to(target) / (1 - P)) @ xs[2]
        (o.float() * weight).sum().backward()
        return o.detach(), [x.grad for x in xs]

    (naive_out, naive), (hi_out, hi) = same_mask(dtype), same_mask(hi_dtype(dtype))
    assert_close_rule("out", out.detach(), hi_out, naive_out, 2)
    for name, x, h, n in zip("qkv", ins, hi, naive):
        assert_close_rule(f"grad {name}", x.grad, h, n, 3)


@pytest.mark.parametrize("backend", ["fa2_eager", pytest.param("fa2", marks=pytest.mark.slow)])
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_dropout_reproducible_under_a_seed_and_fresh_per_call(device, dtype, backend):
    """The same torch.manual_seed gives bitwise the same compiled output and gradients; a second call without
    reseeding draws another mask (the rng_state is drawn in the graph on every call, not a constant of it)."""
    q, k, v = probe_inputs(device, dtype, s=16)
    fn = compiled(AttnModule().to(device).train(), backend)

    def step():
        ins = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out = fn(*ins)
        out.float().square().sum().backward()
        return out.detach(), [x.grad for x in ins]

    with recording() as records, without_aot_cache():
        torch.manual_seed(7)
        first, again = step(), step()
        torch.manual_seed(7)
        replay = step()
    assert all(r.rewritten and r.flags.get("dropout_p") == P for r in records), [str(r) for r in records]
    assert torch.equal(first[0], replay[0]), "the same seed must give the same output"
    for a, b in zip(first[1], replay[1]):
        assert torch.equal(a, b), "the same seed must give the same gradients"
    assert not torch.equal(first[0] != 0, again[0] != 0), "two calls drew the same mask"


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_dropout_mean_over_seeds_is_eagers_undropped_output(device, dtype):
    """Identical in expectation: the mean of the compiled output over many calls approaches eager's output without
    dropout, within 5 standard errors of the per-element spread (random q, k, v)."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 16, 16, generator=g).to(device=device, dtype=dtype) for _ in range(3))
    fn = compiled(attn_f_dropout)
    with torch.no_grad(), recording() as records, without_aot_cache():
        torch.manual_seed(5)
        samples = torch.stack([fn(q, k, v).double() for _ in range(200)])
    assert_dropout_rewritten(records)
    want = probs_of(attn_f_dropout, q, k) @ v.double()
    stderr = samples.std(0) / math.sqrt(samples.shape[0])
    z = (samples.mean(0) - want) / (stderr + 1e-3 * want.abs().max())
    assert z.abs().max().item() < 5.5, f"max |z| {z.abs().max():.2f}: the mean is not the undropped output"
    assert samples.std(0).mean() > 0.05 * want.abs().mean(), "no randomness: dropout not applied"


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES[:2])
@pytest.mark.parametrize("mode", ["p0_train", "eval"])
def test_no_dropout_is_unchanged(mode, device, dtype):
    """p = 0 in training and nn.Dropout in eval: rewritten without dropout_p, equal to eager within the rule."""
    module = AttnModule(0.0 if mode == "p0_train" else P).to(device)
    module.train(mode == "p0_train")
    q, k, v = probe_inputs(device, dtype, s=16, seed=6)
    g = torch.Generator().manual_seed(8)
    weight = torch.randn(q.shape, generator=g).to(device)

    def run(f, target):
        xs = [x.detach().to(target).requires_grad_(True) for x in (q, k, v)]
        o = f(*xs)
        (o.float() * weight).sum().backward()
        return o.detach(), [x.grad for x in xs]

    with recording() as records, without_aot_cache():
        got = run(compiled(module), dtype)
    assert records and all(r.rewritten and "dropout_p" not in r.flags for r in records), [str(r) for r in records]
    naive, hi = run(module, dtype), run(module.to(hi_dtype(dtype)), hi_dtype(dtype))
    assert_close_rule("out", got[0], hi[0], naive[0], 2)
    for i in range(3):
        assert_close_rule(f"grad {i}", got[1][i], hi[1][i], naive[1][i], 3)


def attn_row_dropout(q, k, v):
    p = (q @ k.transpose(-2, -1) * 0.25).softmax(-1)
    keep = torch.rand(p.shape[:-1] + (1,), device=p.device) > 0.5   # one draw per row: not F.dropout's mask
    return (p * keep * 2.0) @ v


def attn_wrong_scale(q, k, v):
    p = (q @ k.transpose(-2, -1) * 0.25).softmax(-1)
    return (p * (torch.rand_like(p) > 0.5)) @ v   # kept without the 1 / (1 - p) rescaling


@pytest.mark.parametrize("fn", [attn_row_dropout, attn_wrong_scale], ids=["per_row_mask", "unscaled_mask"])
def test_random_masks_that_are_not_dropout_are_kept(fn):
    q, k, v = (x.requires_grad_(True) for x in probe_inputs("cpu", torch.float32, s=8))
    with recording() as records, without_aot_cache():
        compiled(fn)(q, k, v).sum().backward()
    assert records and not any(r.rewritten for r in records), [str(r) for r in records]
    assert all("random numbers" in (r.reason or "") for r in records), [str(r) for r in records]


# ---- the zoo: GPT-2, BERT, ViT with attention dropout (zoo.DROPOUT) -------------------------------------------------

def _zoo_step(model, inputs, train=True):
    """(main output, loss, parameter gradients) of one step of a zoo model."""
    import zoo
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(train):
        out = model(**inputs)
        loss = zoo.loss_of(out)
        if train:
            loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return zoo.main_output(out).detach(), loss.detach(), grads


ZOO_DROPOUT = ["bert_dropout", pytest.param("gpt2_dropout", marks=pytest.mark.slow),
               pytest.param("vit_dropout", marks=pytest.mark.slow)]


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES[:2])
@pytest.mark.parametrize("name", ZOO_DROPOUT)
def test_zoo_attention_dropout(name, device, dtype):
    """Every attention site of a model that trains with attention dropout becomes fa2 with dropout_p = 0.1, in the
    training and in the no-grad graph; the same seed gives bitwise the same outputs and gradients, the next call
    another draw; the loss over many seeds has eager's mean and spread (two-sample, 5 standard errors); eval mode
    matches eager within the numerics rule."""
    import zoo
    entry = zoo.ZOO_BY_NAME[name]
    model = zoo.build(name, device, dtype).train()
    inputs = entry.inputs(device, dtype)
    torch._dynamo.reset()
    fn = torch.compile(model, backend="fa2_eager")
    with recording() as records, without_aot_cache():
        torch.manual_seed(11)
        first = _zoo_step(fn, inputs)
        again = _zoo_step(fn, inputs)
        torch.manual_seed(11)
        replay = _zoo_step(fn, inputs)
        _zoo_step(fn, inputs, train=False)
    for kind in ("training", "inference"):
        sites = [r for r in records if r.graph == kind]
        assert len(sites) == entry.sites, f"{kind}: {[str(r) for r in sites]}"
        assert all(r.rewritten and r.flags.get("dropout_p") == zoo.ATTENTION_DROPOUT for r in sites), \
            [str(r) for r in sites]
    assert sum(g["fa2_bwd"] for g in records.graphs) == entry.sites
    assert torch.equal(first[0], replay[0]) and torch.equal(first[1], replay[1]), "same seed, other output"
    assert first[2].keys() == replay[2].keys() and all(torch.equal(first[2][n], replay[2][n]) for n in first[2])
    assert not torch.equal(first[0], again[0]), "two calls drew the same masks"

    # statistics of the loss: compiled (fa2's masks) against eager (PyTorch's), each over its own seeds
    n = 24
    with torch.no_grad():
        got = torch.stack([_zoo_step(fn, inputs, train=False)[1].double() for _ in range(n)])
        want = torch.stack([_zoo_step(model, inputs, train=False)[1].double() for _ in range(n)])
    se = math.sqrt(got.var().item() / n + want.var().item() / n)
    assert abs(got.mean().item() - want.mean().item()) <= 5 * se, \
        f"loss mean {got.mean():.5g} (fa2) vs {want.mean():.5g} (eager), standard error {se:.3g}"
    ratio = got.std().item() / want.std().item()
    # (the log of a ratio of two 24-sample standard deviations has a spread of about 0.3: 1/3 .. 3 is > 3.5 of them)
    assert 1 / 3 < ratio < 3, f"loss spread fa2 / eager = {ratio:.3g}: the dropout is not the same in distribution"

    # eval: no dropout, the same result as eager
    model.eval()
    torch._dynamo.reset()
    with torch.no_grad():
        got_eval = torch.compile(model, backend="fa2_eager")(**inputs)
        naive = model(**inputs)
        hi = zoo.build(name, device, hi_dtype(dtype)).eval()(**entry.inputs(device, hi_dtype(dtype)))
    zoo.assert_model_close(f"{name} eval", zoo.main_output(got_eval), zoo.main_output(hi), zoo.main_output(naive), 2)
