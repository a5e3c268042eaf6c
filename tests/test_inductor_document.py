"""The Inductor pass on document masks (issue 47, item 3): ``seq_id[:, None] == seq_id[None, :]`` built in the graph
from per-token sequence ids, optionally and-ed with causal, runs as fa2's varlen (torch.ops.fa2.varlen_fwd, its
backward through fa2.varlen) -- exactly for any ids: sorted runs (packed documents), ids that come back (a document
split in two), one shared id row. Each test checks the pass's report and outputs and gradients against eager and a
float64 reference.
"""
from __future__ import annotations

import pytest
import torch

import fa2.backend  # noqa: F401  (registers the "fa2" and "fa2_eager" backends)
from fa2.inductor.masks import DOCUMENT_NOTE
from test_inductor_patterns import DEVICE_DTYPES, D, H, S, assert_rewritten, check_numerics, run

BATCH = 2


def _ids(kind, device):
    if kind == "sorted":      # packed documents of lengths 4, 1, 8 / 13 (one document)
        ids = torch.tensor([[0] * 4 + [1] + [2] * 8, [5] * 13])
    elif kind == "unsorted":  # ids that come back after another document's
        ids = torch.tensor([[3, 3, 1, 1, 1, 3, 0, 0, 2, 3, 3, 1, 0], [0, 1] * 6 + [0]])
    else:                     # "shared": one (S,) row for the whole batch
        ids = torch.tensor([0] * 6 + [1] * 7)
    return ids.to(device)


def _qkv(device, dtype, hk=H):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(BATCH, h, S, D, generator=g).to(device=device, dtype=dtype) for h in (H, hk, hk)]


def _document(ids, causal):
    ids = ids if ids.dim() == 2 else ids[None]
    keep = ids[:, None, :, None] == ids[:, None, None, :]
    if causal:
        i = torch.arange(ids.shape[-1], device=ids.device)
        keep = keep & (i[None, :] <= i[:, None])
    return keep


def _repeat_kv(x, heads):
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def attn_masked_fill(q, k, v, ids, causal=True):
    k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    s = (q @ k.transpose(-1, -2) * D ** -0.5).masked_fill(~_document(ids, causal), float("-inf"))
    return s.softmax(-1) @ v


def attn_added_min(q, k, v, ids, causal=False):
    zero = torch.zeros((), dtype=q.dtype, device=q.device)
    mask = torch.where(_document(ids, causal), zero, torch.finfo(q.dtype).min)
    return (q @ k.transpose(-1, -2) * D ** -0.5 + mask).softmax(-1) @ v


def attn_packed_hf(q, k, v, ids):
    """transformers' packed_sequence_mask_function: ids[batch_idx, q_idx] == ids[batch_idx, kv_idx] over aranges,
    and-ed with causal, through SDPA."""
    b, s = ids.shape
    bi = torch.arange(b, device=ids.device)[:, None, None, None]
    qi = torch.arange(s, device=ids.device)[None, None, :, None]
    ki = torch.arange(s, device=ids.device)[None, None, None, :]
    keep = (ki <= qi) & (ids[bi, qi] == ids[bi, ki])
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def _varlen(records, causal):
    assert_rewritten(records, varlen="document ids", causal=True if causal else None, bias=None)
    for r in records:
        assert DOCUMENT_NOTE in r.flags.get("note", ""), str(r)


@pytest.mark.parametrize("kind,train", [("unsorted", False), ("unsorted", True), ("sorted", True), ("shared", True),
                                        pytest.param("sorted", False, marks=pytest.mark.slow),
                                        pytest.param("shared", False, marks=pytest.mark.slow)])
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_document_mask_runs_as_varlen(device, dtype, kind, train):
    q, k, v = _qkv(device, dtype, hk=2)
    records, got, naive, hi = run(attn_masked_fill, (q, k, v, _ids(kind, device)), device=device, dtype=dtype,
                                  train=train)
    _varlen(records, causal=True)
    check_numerics(got, naive, hi)


@pytest.mark.parametrize("form", [attn_added_min, attn_packed_hf], ids=lambda f: f.__name__)
def test_document_mask_forms(form):
    """An added finite fill without causal (every query sees itself: no row is empty), and the index-based form of
    transformers' packed-sequence mask through SDPA."""
    records, got, naive, hi = run(form, (*_qkv("cpu", torch.float32), _ids("unsorted", "cpu")), device="cpu",
                                  dtype=torch.float32)
    _varlen(records, causal=form is attn_packed_hf)
    check_numerics(got, naive, hi)


def attn_document_and_window(q, k, v, ids):
    i = torch.arange(ids.shape[-1], device=ids.device)
    keep = _document(ids, True) & (i[None, :] > i[:, None] - 3)
    return (q @ k.transpose(-1, -2) * D ** -0.5).masked_fill(~keep, float("-inf")).softmax(-1) @ v


def attn_float_ids(q, k, v, ids):
    ids = ids.float()
    keep = ids[:, None, :, None] == ids[:, None, None, :]
    return (q @ k.transpose(-1, -2) * D ** -0.5).masked_fill(~keep, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("form", [attn_document_and_window, attn_float_ids], ids=lambda f: f.__name__)
def test_document_masks_that_stay_a_bias(form):
    """A window counts positions, which grouping the tokens by id moves; float ids may be NaN (a token that is not
    even its own document): both stay one bias, results unchanged."""
    records, got, naive, hi = run(form, (*_qkv("cpu", torch.float32), _ids("sorted", "cpu")), device="cpu",
                                  dtype=torch.float32)
    assert_rewritten(records, varlen=None, bias="bool")
    check_numerics(got, naive, hi)


def test_document_mask_under_dynamic_shapes():
    """dynamic=True: new lengths and new ids reuse the graph (cu_seqlens has the static length batch * seqlen + 1)."""
    from torch._dynamo.utils import counters
    from fa2.inductor import recording
    from fa2.inductor._compat import without_aot_cache
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(attn_masked_fill, backend="fa2_eager", dynamic=True)
    g = torch.Generator().manual_seed(3)
    with recording() as records, without_aot_cache():
        for seqlen in (13, 21, 17):
            q, k, v = (torch.randn(BATCH, H, seqlen, D, generator=g).requires_grad_() for _ in range(3))
            ids = torch.randint(0, 4, (BATCH, seqlen), generator=g)
            got = compiled(q, k, v, ids)
            grads = torch.autograd.grad(got.sum(), (q, k, v))
            want = attn_masked_fill(q, k, v, ids)
            want_grads = torch.autograd.grad(want.sum(), (q, k, v))
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            for a, b in zip(grads, want_grads):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert records and all(r.flags.get("varlen") == "document ids" for r in records), [str(r) for r in records]
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_document_mask_on_cuda_fits_the_grid():
    """On CUDA the varlen grid takes at most 65535 sequences and a document mask makes batch * seqlen of them: past
    that the mask stays a bias (no device needed to check the rule)."""
    from fa2.inductor.sites import CUDA_MAX_SEQUENCES, document_fits
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert document_fits((4, 8, 2048, 2048), cuda)
    assert not document_fits((2, 8, CUDA_MAX_SEQUENCES, CUDA_MAX_SEQUENCES), cuda)
    assert document_fits((2, 8, CUDA_MAX_SEQUENCES, CUDA_MAX_SEQUENCES), cpu)


def main(argv=None) -> int:
    """python tests/test_inductor_document.py [--batch B --seqlen S --docs N]: on CUDA, forward + backward time of a
    causal document mask compiled with backend="fa2", as varlen (the rewrite) and as the bias it was before."""
    import argparse
    from unittest import mock

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--docs", type=int, default=8)
    args = parser.parse_args(argv)
    import fa2.inductor.sites as sites
    from fa2.inductor._compat import without_aot_cache
    b, s, h = args.batch, args.seqlen, args.heads
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, s, 128, generator=g).to("cuda", torch.bfloat16).requires_grad_() for _ in range(3))
    lengths = torch.randint(1, 2 * s // args.docs, (b, 4 * args.docs), generator=g)   # (enough to cover s)
    ids = torch.stack([torch.repeat_interleave(torch.arange(lengths.shape[1]), lengths[i])[:s] for i in range(b)])
    ids = ids.cuda()
    results = {}
    for name, fits in (("varlen", sites.document_fits), ("bias", lambda *a: False)):
        torch._dynamo.reset()
        # (no graph caches: both compiles have the same graph and pass)
        with mock.patch.object(sites, "document_fits", fits), without_aot_cache(), \
                torch._inductor.config.patch(fx_graph_cache=False):
            fn = torch.compile(attn_masked_fill, backend="fa2")
            for _ in range(3):
                fn(q, k, v, ids).sum().backward()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            fn(q, k, v, ids).sum().backward()
        end.record()
        torch.cuda.synchronize()
        results[name] = start.elapsed_time(end) / 10
        out = fn(q, k, v, ids)
        results[name + "_out"] = out.float()
    err = (results["varlen_out"] - results["bias_out"]).abs().max().item()
    print(f"batch {b} seqlen {s} heads {h} docs/row ~{args.docs}: fwd+bwd varlen {results['varlen']:.3f} ms, "
          f"bias {results['bias']:.3f} ms, max |varlen - bias| {err:.2e}")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
