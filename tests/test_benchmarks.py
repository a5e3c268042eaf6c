"""The benchmark grid's bookkeeping (benchmarks/bench_attention.py): the order implementations run in and how --rounds
are merged. CPU only, no kernels."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
bench = pytest.importorskip("bench_attention")


def _cfg(seqlen):
    return bench.Config("bf16", 64, seqlen, 1, 2, False, "none")


def test_passes_time_the_forward_the_replayed_backward_or_both():
    """bench_common.pass_closure, shared by the grid and sustained.py: "fwd" is the call itself, "bwd" runs the
    forward once and replays the backward on its retained graph, "fwdbwd" runs both every time; the gradients are
    those of a plain autograd call. The grid's forward of an implementation without gradients runs detached."""
    common = pytest.importorskip("bench_common")
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    dout = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    forwards = []

    def f(q_, k_, v_):
        forwards.append(1)
        return torch.softmax(q_ @ k_.transpose(-1, -2), -1) @ v_

    want = torch.autograd.grad(f(q, k, v), (q, k, v), dout)
    forwards.clear()
    run = lambda: f(q, k, v)  # noqa: E731
    assert common.pass_closure(run, "fwd", (q, k, v), dout) is run
    bwd = common.pass_closure(run, "bwd", (q, k, v), dout)
    assert len(forwards) == 1
    for _ in range(2):
        for g, w in zip(bwd(), want):
            torch.testing.assert_close(g, w)
    assert len(forwards) == 1  # (replayed, not recomputed)
    both = common.pass_closure(run, "fwdbwd", (q, k, v), dout)
    for _ in range(2):
        for g, w in zip(both(), want):
            torch.testing.assert_close(g, w)
    assert len(forwards) == 3
    assert bench._pass_fn(f, "fwd", q, k, v, True, dout)().requires_grad
    assert not bench._pass_fn(f, "fwd", q, k, v, False, dout)().requires_grad


def test_rounds_alternate_the_implementations_within_a_config():
    a, b = _cfg(128), _cfg(256)
    jobs = bench.ordered_jobs([a, b], ["fa2", "flex", "cudnn"], rounds=3)
    assert jobs == [(a, "fa2"), (a, "cudnn"), (a, "cudnn"), (a, "fa2"), (a, "fa2"), (a, "cudnn"),
                    (b, "fa2"), (b, "cudnn"), (b, "cudnn"), (b, "fa2"), (b, "fa2"), (b, "cudnn"),
                    (a, "flex"), (a, "flex"), (a, "flex"), (b, "flex"), (b, "flex"), (b, "flex")]
    assert bench.ordered_jobs([a], ["fa2", "cudnn"]) == [(a, "fa2"), (a, "cudnn")]


def _row(cfg, impl, ms, status="ok", pass_="fwd"):
    row = dict(impl=impl, **bench.asdict(cfg), **{"pass": pass_, "status": status})
    if status == "ok":
        row.update(ms=ms, flops=2e9, tflops=2e9 / (ms * 1e-3) / 1e12)
    else:
        row.update(reason="out of memory")
    return row


def test_merge_rounds_takes_the_median_round_and_keeps_failures():
    a, b = _cfg(128), _cfg(256)
    rows = [_row(a, "fa2", 3.0), _row(a, "fa2", 1.0), _row(a, "fa2", 2.0), _row(a, "fa2", 5.0, pass_="bwd"),
            _row(b, "fa2", 1.0), _row(b, "fa2", None, status="oom"), _row(a, "cudnn", 4.0)]
    merged = {(r["impl"], r["seqlen"], r["pass"]): r for r in bench.merge_rounds(rows)}
    assert len(merged) == 4
    fwd = merged[("fa2", 128, "fwd")]
    assert fwd["ms"] == 2.0 and fwd["ms_rounds"] == [3.0, 1.0, 2.0]
    assert fwd["tflops"] == pytest.approx(1.0)  # 2e9 FLOP in 2 ms
    assert merged[("fa2", 128, "bwd")]["ms"] == 5.0
    failed = merged[("fa2", 256, "fwd")]
    assert failed["status"] == "oom" and failed["ms_rounds"] == [1.0] and "ms" not in failed
    assert merged[("cudnn", 128, "fwd")]["ms_rounds"] == [4.0]


def test_merge_rounds_keeps_each_rounds_clock_beside_its_time():
    a = _cfg(128)
    rows = [dict(_row(a, "fa2", ms), sm_mhz=mhz, power_w=w, clock_samples=n)
            for ms, mhz, w, n in ((3.0, 1755, 690, 4), (1.0, 1980, 520, 3))]
    merged = bench.merge_rounds(rows)
    assert len(merged) == 1
    row = merged[0]
    assert row["ms_rounds"] == [3.0, 1.0]
    assert row["sm_mhz_rounds"] == [1755, 1980] and row["power_w_rounds"] == [690, 520]
    assert row["clock_samples_rounds"] == [4, 3]
    assert "sm_mhz" not in row and "power_w" not in row and "clock_samples" not in row  # per round only


class _FakeSmi:
    """nvidia-smi for ClockSampler: terminating it is all the sampler does to the process."""

    def __init__(self):
        self.terminated = False

    def terminate(self):
        self.terminated = True

    def wait(self, timeout=None):
        return 0


def test_clock_sampler_gives_each_window_the_median_of_its_samples():
    import datetime
    import tempfile

    from bench_common import ClockSampler

    sampler = ClockSampler.__new__(ClockSampler)  # no nvidia-smi on a CPU machine: feed it lines
    sampler.samples, sampler.proc, sampler.log = [], _FakeSmi(), tempfile.TemporaryFile(mode="w+")
    sampler.log.write("2026/12/04 07:40:01.000, 1980, 400.5, 3201, 41, 0x0000000000000000\n"
                      "2026/12/04 07:40:01.100, 1755, 690.0, 3201, 52, 0x0000000000000004\n"
                      "2026/12/04 07:40:01.200, 1740, 695.0, [N/A], [N/A], [N/A]\n"
                      "2026/12/04 07:40:01.300, [N/A], 1, 3201, 50, 0x0000000000000004\n2026/12/04 07:4")
    smi = sampler.proc
    samples = sampler.stop()
    assert smi.terminated and [s[1:] for s in samples] == [(1980, 400.5, 3201, 41, "0x0000000000000000"),
                                                           (1755, 690.0, 3201, 52, "0x0000000000000004"),
                                                           (1740, 695.0, None, None, None)]
    assert sampler.stop() == samples  # (once: the context manager's exit after an explicit stop)
    t0 = datetime.datetime(2026, 12, 4, 7, 40, 1, tzinfo=datetime.timezone.utc).timestamp()  # nvidia-smi under TZ=UTC
    assert samples[0][0] == pytest.approx(t0)
    assert sampler.during(t0 + 0.05, t0 + 0.25) == {"sm_mhz": 1747.5, "power_w": 692.5, "mem_mhz": 3201, "temp_c": 52,
                                                    "throttle": ["0x0000000000000004"], "clock_samples": 2}
    assert sampler.during(t0 - 1.0, t0 + 0.01) == {"sm_mhz": 1980, "power_w": 400.5, "mem_mhz": 3201, "temp_c": 41,
                                                   "throttle": ["0x0000000000000000"], "clock_samples": 1}
    assert sampler.during(t0 + 5, t0 + 6) == {"clock_samples": 0}


def test_interleaved_rounds_time_the_implementations_together():
    a, b = _cfg(128), _cfg(256)
    jobs = bench.ordered_jobs([a, b], ["fa2", "flex", "cudnn"], rounds=2, interleave=True)
    assert jobs == [(a, ("fa2", "cudnn")), (a, ("fa2", "cudnn")), (b, ("fa2", "cudnn")), (b, ("fa2", "cudnn")),
                    (a, "flex"), (a, "flex"), (b, "flex"), (b, "flex")]


def test_run_jobs_times_several_implementations_on_the_same_inputs():
    cfg = bench.Config("fp32", 16, 32, 1, 2, False, "none")
    rows = bench.run_jobs(cfg, ["math", "sdpa"], ["fwd", "bwd", "fwdbwd"], None, torch.device("cpu"), 1, 2)
    assert sorted((r["impl"], r["pass"]) for r in rows) == sorted(
        (i, p) for i in ("math", "sdpa") for p in ("fwd", "bwd", "fwdbwd"))
    for r in rows:
        assert r["status"] == "ok" and r["ms"] > 0 and r["check"]["ok"] is True, r
        assert len(r["window"]) == 2 and r["window"][0] <= r["window"][1]  # (what --clocks reads)


def test_switched_sets_fa2s_switches_for_one_implementation_and_restores_them():
    state = {"bwd_tail_split": -1}

    class _C:
        bwd_tail_split = staticmethod(lambda: state["bwd_tail_split"])
        set_bwd_tail_split = staticmethod(lambda value: state.update(bwd_tail_split=value))

    fake = type("fa2", (), {"_C": _C})
    with bench.switched("fa2-nosplit", fake):
        assert state["bwd_tail_split"] == 0
    assert state["bwd_tail_split"] == -1
    with pytest.raises(RuntimeError), bench.switched("fa2-split", fake):
        assert state["bwd_tail_split"] == 1
        raise RuntimeError
    assert state["bwd_tail_split"] == -1
    with bench.switched("cudnn", fake):  # no switches
        assert state["bwd_tail_split"] == -1
    import fa2  # (a build with fa2.dev: its options)

    before = fa2.dev.options()
    with bench.switched("fa2-nosplit", fa2), pytest.raises(RuntimeError):
        assert fa2.dev.options()["bwd_tail_split"] == 0
        raise RuntimeError
    assert fa2.dev.options() == before


def test_a_failing_implementation_does_not_take_its_peers_rows_with_it(monkeypatch):
    """--interleave times a config's implementations in one burst; where one of them fails there, each is timed
    alone, so that only the failing one gets an error row (as when each had its own burst)."""
    make_call = bench.make_call
    calls = {"n": 0}

    def flaky_make_call(impl, cfg, bias, fa2_mod, device):
        f, to_bhsd = make_call(impl, cfg, bias, fa2_mod, device)
        if impl != "sdpa":
            return f, to_bhsd

        def f_flaky(q, k, v):
            calls["n"] += 1
            if calls["n"] > 1:  # the first call (the check) works, the timed ones do not
                raise RuntimeError("boom")
            return f(q, k, v)
        return f_flaky, to_bhsd

    monkeypatch.setattr(bench, "make_call", flaky_make_call)
    cfg = bench.Config("fp32", 16, 32, 1, 2, False, "none")
    rows = bench.run_jobs(cfg, ["math", "sdpa"], ["fwd"], None, torch.device("cpu"), 1, 2)
    by_impl = {r["impl"]: r for r in rows}
    assert len(rows) == 2 and by_impl["math"]["status"] == "ok" and by_impl["math"]["ms"] > 0
    assert by_impl["sdpa"]["status"] == "error" and "boom" in by_impl["sdpa"]["reason"]


def test_fa4_is_listed_and_says_why_it_is_not_measured(monkeypatch):
    """FlashAttention-4 is an implementation of the grid (--impls fa4); where it cannot run (a CPU run, or a GPU
    machine without flash_attn.cute) its rows are n/a with the reason and the install command, its peers measured."""
    assert "fa4" in bench.IMPLS
    monkeypatch.setattr(bench, "_FA4", {})
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # (import flash_attn.cute raises ImportError)
    fa4, why = bench.import_fa4(torch.device("cuda"))
    assert fa4 is None and "flash_attn.cute is not importable" in why and "bash .fa4/install.sh .fa4" in why
    cfg = bench.Config("fp32", 16, 32, 1, 2, False, "none")
    with pytest.raises(RuntimeError, match="not importable"):
        bench.make_call("fa4", cfg, None, None, torch.device("cuda"))
    rows = bench.run_jobs(cfg, ["math", "fa4"], ["fwd", "fwdbwd"], None, torch.device("cpu"), 1, 2)
    by = {(r["impl"], r["pass"]): r for r in rows}
    assert len(rows) == 4 and by[("math", "fwd")]["status"] == "ok" and by[("math", "fwdbwd")]["status"] == "ok"
    for p_ in ("fwd", "fwdbwd"):
        assert by[("fa4", p_)]["status"] == "n/a" and "CUDA GPUs only" in by[("fa4", p_)]["reason"]


def test_fa4_gets_flash_layout_views_and_its_output_compares_with_fa2s(monkeypatch):
    """fa4's call: flash_attn_func on (B, S, H, D) views of the grid's (B, H, S, D) inputs, its out the first of
    (out, lse); masks are refused with a reason. compare_with_fa2 records a peer's difference from fa2's sample."""
    seen = {}

    def fake_flash_attn_func(q, k, v, softmax_scale=None, causal=False):
        seen.update(shape=tuple(q.shape), causal=causal, contiguous_last=q.stride(-1) == 1)
        s = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) * q.shape[-1] ** -0.5
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        out = (torch.softmax(s, -1) @ v.transpose(1, 2)).transpose(1, 2)
        return out, torch.logsumexp(s, -1)

    monkeypatch.setattr(bench, "_FA4", {"result": (fake_flash_attn_func, None)})
    cfg = bench.Config("fp64", 8, 5, 2, 3, True, "none")
    q, k, v, _ = bench.make_inputs(cfg, torch.device("cpu"))
    f, to_bhsd = bench.make_call("fa4", cfg, None, None, torch.device("cuda"))
    out = f(q, k, v)
    assert seen == {"shape": (2, 5, 3, 8), "causal": True, "contiguous_last": True} and out.shape == (2, 5, 3, 8)
    ref, _ = bench.reference(cfg, q, k, v, None, torch.zeros(2, 3, 5, 8, dtype=torch.float64))
    torch.testing.assert_close(to_bhsd(out)[:1, :2].float(), ref)
    with pytest.raises(RuntimeError, match="no additive attn_bias"):
        bench.make_call("fa4", cfg, torch.zeros(2, 1, 1, 5), None, torch.device("cuda"))

    sample = (torch.ones(1, 2, 5, 8), [torch.ones(1, 2, 5, 8)] * 3)
    ready = {"fa2": (None, True, None, {}, None, sample),
             "fa4": (None, True, None, {}, None, (sample[0] * 1.5, [sample[1][0], sample[1][1] * 0.5, sample[1][2]]))}
    bench.compare_with_fa2(ready)
    assert "vs_fa2" not in ready["fa2"][3]
    assert ready["fa4"][3]["vs_fa2"] == {"out_rel_diff": pytest.approx(0.5), "grad_rel_diff": pytest.approx(0.5)}


def test_bars_read_a_grid():
    """benchmarks/bars.py: issue 8's bars off a grid JSON (a made-up one: one cell below, one that did not run)."""
    import bars

    def row(impl, d, s, causal, mask, pass_, tflops, status="ok", **extra):
        return dict(impl=impl, dtype="bf16", headdim=d, seqlen=s, causal=causal, mask=mask, status=status,
                    tflops=tflops, **{"pass": pass_}, **extra)

    rows = []
    for d in (64, 128, 256):
        for p in ("fwd", "bwd", "fwdbwd"):
            rows += [row("fa2", d, 2048, False, "none", p, 110), row("cudnn", d, 2048, False, "none", p, 100)]
            rows += [row("fa2", d, 1024, False, "none", p, 10), row("cudnn", d, 1024, False, "none", p, 100)]
    rows += [row("fa2", 128, 16384, False, "none", "fwd", 705, ms_rounds=[2.0, 1.9]),
             row("cudnn", 128, 16384, False, "none", "fwd", 710, ms_rounds=[1.98, 1.919])]
    rows += [row("fa2", 64, 2048, False, "padding", "fwd", 150), row("cudnn", 64, 2048, False, "padding", "fwd", 0,
                                                                      status="error")]
    got = bars.bars({"measurements": rows})
    fwd = got["1 forward"]
    assert not fwd["met"] and fwd["cells"] == 4 and fwd["range"] == (0.992, 1.1)  # (S=1k is not in the bar)
    assert fwd["below"] == [(("bf16", 128, 16384, False, "none", "fwd"), 0.9929)]  # (705 / 710, rounded down)
    # (paired rounds: cuDNN's ms / fa2's, round by round; one straddles 1)
    assert fwd["rounds"] == {("bf16", 128, 16384, False, "none", "fwd"): [0.99, 1.01]}
    assert got["2 forward+backward"]["rounds"] == {}
    assert got["2 forward+backward"]["met"] and got["2 forward+backward"]["range"] == (1.1, 1.1)
    assert not got["3 padding mask"]["met"] and got["3 padding mask"]["missing"] == [
        ("bf16", 64, 2048, False, "padding", "fwd")]
    assert got["4 stretch"] == {"met": True, "tflops": {"bf16": 705}}


def test_cta_trace_reads_every_tile_of_both_warpgroups():
    """scripts/dev/cta_trace.py's "fwd_tiles" layout (fwd_kernel.cuh with FA2_CTA_TRACE_TILES): per warpgroup the loop,
    epilogue, gap and period of each tile that has a next one, and the share of a CTA's time in which one or both
    warpgroups sat between a loop's end and the next tile's start. A made-up CTA: warpgroup 0's tiles start at 0 /
    1000 / 2000 (loop end +800, epilogue end +900), warpgroup 1's at 100 / 1150 (loop end +850, epilogue end +950)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "dev"))
    import cta_trace

    cta = [0] * cta_trace.SLOTS
    cta[cta_trace.ENTRY_NS], cta[cta_trace.EXIT_NS] = 1, 2

    def mark(w, i, start, loop, epi):
        base = cta_trace.FIRST_EVENT + 3 * (cta_trace.FWD_TILES * w + i)
        cta[base:base + 3] = [start, start + loop, start + epi]

    for i, start in enumerate((10, 1010, 2010)):
        mark(0, i, start, 800, 900)
    for i, start in enumerate((110, 1160)):
        mark(1, i, start, 850, 950)
    stats = cta_trace.fwd_tiles_stats([tuple(cta)])
    assert stats["wg"][0] == {"loop": [800, 800], "epilogue": [100, 100], "gap": [100, 100], "period": [1000, 1000]}
    assert stats["wg"][1] == {"loop": [850], "epilogue": [100], "gap": [100], "period": [1050]}
    # switch windows: wg 0 [810, 1010], [1810, 2010]; wg 1 [960, 1160]; span 10 .. 2010
    assert stats["span"] == 2000
    assert stats["both_switching"] == 1010 - 960
    assert stats["one_switching"] == (960 - 810) + (1160 - 1010) + (2010 - 1810)
    assert stats["switch_share_both"] == pytest.approx(50 / 2000)


def test_causal_flops_count_the_pairs_a_bottom_right_mask_keeps():
    """bench_common.attention_flops: a causal chunk of queries against a longer cache counts the (query, key) pairs
    the bottom-right mask keeps (query i sees keys j <= i + Sk - Sq); equal lengths keep the FA-2 paper's S²/2."""
    common = pytest.importorskip("bench_common")
    for seqlen_q, seqlen_k in ((2, 4), (3, 3), (5, 2), (128, 4096), (1, 7)):
        keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool).tril(seqlen_k - seqlen_q)
        want = keep.sum().item() if seqlen_q != seqlen_k else seqlen_q * seqlen_k / 2
        assert common.attention_flops(2, 3, seqlen_q, seqlen_k, 8, True, "fwd") == 4 * 2 * 3 * 8 * want
    assert common.attention_flops(1, 1, 128, 4096, 1, False, "fwd") == 4 * 128 * 4096


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_bench_decode_runs_every_implementation_on_the_cpu(tmp_path):
    """benchmarks/bench_decode.py --device cpu with tiny sizes: decode rows of fa2, SDPA (its backend recorded) and
    flex on a contiguous and a paged cache, each checked against fa2's output and fp32 math; FA-4 n/a with the
    reason; prefill rows of the dense and KV-cache calls with their TFLOP/s over the dense one; the JSON and PNGs."""
    bench_decode = pytest.importorskip("bench_decode")
    result = bench_decode.main(["--device", "cpu", "--batches", "2", "--caches", "32", "--paged", "0,16",
                                "--prefill-q", "16", "--prefill-k", "48", "--out", str(tmp_path), "--tag", "t"])
    decode = {(r["page"], r["impl"]): r for r in result["decode"]}
    assert len(decode) == 8 and decode[(16, "fa4")]["status"] == "n/a" and "CUDA" in decode[(16, "fa4")]["reason"]
    for page in (0, 16):
        for impl in ("fa2", "sdpa", "flex"):
            r = decode[(page, impl)]
            assert r["status"] == "ok" and r["timing"] == "eager" and r["gbps"] > 0, r
            assert r["check_ok"] and r["max_diff_vs_baseline"] < 0.05 and r["kv_bytes"] == 4 * 2 * 32 * 8 * 64
        assert "scaled_dot_product" in decode[(page, "sdpa")]["backend"]
    prefill = {r["impl"]: r for r in result["prefill"]}
    assert set(prefill) == {"fa2-dense", "fa2-kvcache", "fa2-kvcache-append", "fa2-kvcache-paged"}
    for r in prefill.values():
        assert r["status"] == "ok" and r["check_ok"] and r["flops"] == 4 * 32 * 128 * (16 * 48 - 16 * 15 // 2)
    for impl in ("fa2-kvcache", "fa2-kvcache-paged"):
        assert prefill[impl]["vs_dense"] > 0 and prefill[impl]["max_diff_vs_baseline"] == 0, impl
    import importlib.util
    pngs = ["kvcache_t_decode.png", "kvcache_t_prefill.png"] if importlib.util.find_spec("matplotlib") else []
    assert sorted(os.listdir(tmp_path)) == ["kvcache_t.json"] + pngs  # (plot.py needs matplotlib: the bench extra)


def test_bench_decode_flags_a_wrong_output_and_skips_past_its_budget():
    bench_decode = pytest.importorskip("bench_decode")
    ref = torch.randn(2, 1, 4, 8)
    rows = [{"impl": "fa2"}, {"impl": "sdpa"}]
    bench_decode.check(rows, {"fa2": ref.bfloat16(), "sdpa": (ref + 1).bfloat16()}, ref)
    assert rows[0]["check_ok"] and not rows[1]["check_ok"] and rows[1]["max_diff_vs_baseline"] > 0.9
    skipped = bench_decode.run_section([(0, 64, 1, 512)], None, deadline=0,
                                       describe=lambda s: dict(section="decode", cache=s[3], impl="*"))
    assert skipped == [{"section": "decode", "cache": 512, "impl": "*", "status": "skipped", "reason": "time budget"}]


def test_bench_varlen_cpu_smoke_writes_checked_rows(tmp_path):
    """benchmarks/bench_varlen.py --device cpu --quick: fa2.varlen_attention and the padded dense call on the same
    packed batches, each pass timed, both checked against fp32 math and the padded one against fa2; the JSON holds the
    batches (filling the tokens exactly) and rows whose FLOPs are the real lengths'; the PNG is drawn."""
    import importlib.util
    import json

    bench_varlen = pytest.importorskip("bench_varlen")
    pytest.importorskip("fa2")
    result = bench_varlen.main(["--device", "cpu", "--quick", "--out", str(tmp_path), "--tag", "t"])
    saved = json.loads((tmp_path / "varlen_peers_t.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(result["rows"]))
    drawn = importlib.util.find_spec("matplotlib") is not None  # (plot.py needs matplotlib: the bench extra)
    assert (tmp_path / "varlen_peers_t.png").exists() == drawn
    assert set(saved["batches"]) == {"loguniform/192", "equal/192"}
    assert all(sum(lengths) == 192 for lengths in saved["batches"].values())
    assert saved["batches"]["equal/192"] == [48] * 4
    assert {(r["impl"], r["mix"], r["causal"], r["pass"]) for r in saved["rows"]} == {
        (i, m, c, p) for i in ("fa2", "padded") for m in ("loguniform", "equal") for c in (False, True)
        for p in ("fwd", "fwdbwd")}
    for r in saved["rows"]:
        lengths = saved["batches"][f"{r['mix']}/{r['tokens']}"]
        want = sum(4.0 * n * n * r["nheads"] * r["headdim"] for n in lengths) / (2 if r["causal"] else 1)
        assert r["status"] == "ok" and r["ms"] > 0, r
        assert r["flops"] == pytest.approx(want * (3.5 if r["pass"] == "fwdbwd" else 1.0))
        assert r["check"]["ok"] is True and "grad_rel_err" in r["check"], r
        if r["impl"] == "padded":
            assert r["check"]["vs_fa2"]["out_max_abs"] < 1e-5 and r["check"]["vs_fa2"]["grad_max_abs"] < 1e-5


def test_bench_varlen_peer_calls_and_reasons(monkeypatch):
    """The peers' entry points, on the CPU: SDPA on jagged nested views returns the packed rows (run through the MATH
    backend, which takes non-causal nested calls on the CPU); PyTorch's varlen_attn gets causal in this torch's
    spelling (is_causal, or window_size (-1, 0)) and enable_gqa where it has it; FA-4 off a GPU is n/a with the reason; every mix fills the tokens."""
    torch_varlen = pytest.importorskip("torch.nn.attention.varlen")
    bench_varlen = pytest.importorskip("bench_varlen")
    fa2 = pytest.importorskip("fa2")
    for mix in bench_varlen.MIXES:
        lengths = bench_varlen.draw_lengths(mix, 1000, 8, 300, 64)
        assert sum(lengths) == 1000 and max(lengths) <= 300 and min(lengths[:-1]) >= 8, (mix, lengths)
    cfg = bench_varlen.Config("loguniform", 192, "fp32", 16, 2, 2, False)
    batch = bench_varlen.Batch(cfg, bench_varlen.draw_lengths("loguniform", 192, 4, 64, 48), torch.device("cpu"))
    want = fa2.varlen_attention(batch.q, batch.k, batch.v, batch.cu_seqlens, batch.cu_seqlens, batch.max_seqlen,
                                batch.max_seqlen)
    got = bench_varlen.cudnn_nested_call(batch, backend="MATH")(batch.q, batch.k, batch.v)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    calls = []

    def older(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False):
        calls.append({"is_causal": is_causal})
        return q

    def newer(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1), enable_gqa=False):
        calls.append({"window_size": window_size, "enable_gqa": enable_gqa})
        return q

    def causal_batch(nheads_k):
        return bench_varlen.Batch(bench_varlen.Config("equal", 96, "fp32", 16, 4, nheads_k, True), [48, 48],
                                  torch.device("cpu"))
    monkeypatch.setattr(torch_varlen, "varlen_attn", older)
    mha, gqa = causal_batch(4), causal_batch(2)
    for batch_ in (mha, gqa):  # (a signature without enable_gqa gets the fewer KV heads as they are)
        bench_varlen.torch_varlen_call(batch_)(batch_.q, batch_.k, batch_.v)
    monkeypatch.setattr(torch_varlen, "varlen_attn", newer)
    for batch_ in (mha, gqa):
        bench_varlen.torch_varlen_call(batch_)(batch_.q, batch_.k, batch_.v)
    assert calls == [{"is_causal": True}, {"is_causal": True}, {"window_size": (-1, 0), "enable_gqa": False},
                     {"window_size": (-1, 0), "enable_gqa": True}]
    rows = bench_varlen.run_config(cfg, batch.lengths, ["fa2", "fa4"], ["fwd"], fa2, torch.device("cpu"), 1, 2)
    by = {r["impl"]: r for r in rows}
    assert by["fa2"]["status"] == "ok" and by["fa4"]["status"] == "n/a" and "CUDA GPUs only" in by["fa4"]["reason"]
