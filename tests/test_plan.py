"""The plans fa2 makes (fa2/plan.h), checked for described GPUs without one: which kernel a call runs, its grid and
its workspace, as the launchers chose them before the plan existed (a table read off their selection logic), and the
development options (fa2.dev) that change them."""
from __future__ import annotations

import pytest

import fa2
import fa2.dev as dev

H100, A100 = "h100", "a100"


def kernel(direction, device, **call):
    p = dev.plan(direction, device=device, **call)
    if "rebuild with FA2_CUDA_ARCHS" in p.get("error", ""):  # (a build without that device's instances)
        pytest.skip(p["error"])
    assert "error" not in p, p
    return p


# (device, call, what the kernel name holds, grid, workspace ints); batch 2, 16 heads, bf16 unless given
FWD_TABLE = [
    # d 128 without a mask: the overlap schedule, persistent (one CTA per SM), in clusters of two
    (H100, dict(seqlen_q=4096, headdim=128), "128, sm90a, plain, bias none, warp-specialized overlap, cluster of 2",
     "(132, 1, 1)", 0),
    # causal: ping-pong-overlap, persistent CTAs taking tiles from a counter in one zeroed int
    (H100, dict(seqlen_q=4096, headdim=128, causal=True),
     "128, sm90a, plain, bias none, warp-specialized pingpong-overlap, tile counter", "(132, 1, 1)", 1),
    # fewer tiles than SMs: one CTA per tile, no counter needed
    (H100, dict(seqlen_q=512, headdim=128, causal=True, batch=1, nheads=4),
     "warp-specialized pingpong-overlap>", "(16, 1, 1)", 0),
    # d 64: pipelined (no warp specialization), one CTA per query block
    (H100, dict(seqlen_q=4096, headdim=64), "64, sm90a, plain, bias none>", "(32, 16, 2)", 0),
    # d 64 from kWideOverlapMinKeys keys (twice that with a causal mask): the wide kernel with the overlap
    (H100, dict(seqlen_q=16384, headdim=64), "64, sm90a, plain, bias none, warp-specialized overlap>",
     "(2752, 1, 1)", 0),
    (H100, dict(seqlen_q=8192, headdim=64, causal=True), "64, sm90a, plain, bias none>", "(64, 16, 2)", 0),
    (H100, dict(seqlen_q=16384, headdim=64, causal=True), "64, sm90a, plain, bias none, warp-specialized overlap>",
     "(2752, 1, 1)", 0),
    # d 64 padding mask: pipelined below kWideKeyBiasMinKeys keys, the wide ws kernel from there
    (H100, dict(seqlen_q=4096, headdim=64, bias="key_row"), "64, sm90a, key-bias-fold, bias same-as-input>",
     "(32, 16, 2)", 0),
    (H100, dict(seqlen_q=8192, headdim=64, bias="key_row"),
     "64, sm90a, key-bias-fold, bias same-as-input, warp-specialized ws>", "(1376, 1, 1)", 0),
    # d 128 padding mask: the key-bias schedule (overlap), not persistent-clustered (only the plain path has those)
    (H100, dict(seqlen_q=4096, headdim=128, bias="key_row", bias_dtype="bool"),
     "128, sm90a, key-bias-fold, bias bool, warp-specialized overlap>", "(132, 1, 1)", 0),
    # a bias varying along queries: folded into S, pipelined
    (H100, dict(seqlen_q=1024, headdim=128, bias="full", bias_dtype="float32"), "128, sm90a, bias-fold, bias float32>",
     "(8, 16, 2)", 0),
    # softcap: the general score path
    (H100, dict(seqlen_q=1024, headdim=128, softcap=30.0), "128, sm90a, general, bias none>", "(8, 16, 2)", 0),
    # d 256: ping-pong-overlap, one tile per CTA (not a persistent headdim)
    (H100, dict(seqlen_q=4096, headdim=256), "256, sm90a, plain, bias none, warp-specialized pingpong-overlap>",
     None, 0),
    # d 96 rounds to its instance; pipelined
    (H100, dict(seqlen_q=1000, headdim=80), "96, sm90a, plain, bias none>", None, 0),
    # A100: the sm80 instance
    (A100, dict(seqlen_q=4096, headdim=128, causal=True), "128, sm80, plain, bias none>", None, 0),
    # varlen (grids of max_seqlen's query blocks): on H100 the sm_90a kernels with each headdim's default schedule,
    # no clusters (a pair's blocks may lie in different sequences), the tile counter for causal lengths
    (H100, dict(seqlen_q=4096, headdim=128, varlen=True),
     "128, sm90a, plain, bias none, warp-specialized overlap, varlen>", "(132, 1, 1)", 0),
    (H100, dict(seqlen_q=4096, headdim=128, causal=True, varlen=True),
     "128, sm90a, plain, bias none, warp-specialized pingpong-overlap, tile counter, varlen>", "(132, 1, 1)", 1),
    (H100, dict(seqlen_q=4096, headdim=64, varlen=True), "64, sm90a, plain, bias none, varlen>", "(32, 16, 2)", 0),
    # d 64 varlen from kWideOverlapMinKeys keys a sequence on average (total_k / batch; twice that with a causal mask):
    # the wide overlap kernel as the dense call takes it
    (H100, dict(seqlen_q=8192, headdim=64, varlen=True),
     "64, sm90a, plain, bias none, warp-specialized overlap, varlen>", "(1376, 1, 1)", 0),
    (H100, dict(seqlen_q=8192, headdim=64, causal=True, varlen=True), "64, sm90a, plain, bias none, varlen>",
     "(64, 16, 2)", 0),
    (H100, dict(seqlen_q=16384, headdim=64, causal=True, varlen=True),
     "64, sm90a, plain, bias none, warp-specialized overlap, varlen>", "(2752, 1, 1)", 0),
    (H100, dict(seqlen_q=1024, headdim=128, softcap=30.0, varlen=True), "128, sm90a, general, bias none, varlen>",
     "(8, 16, 2)", 0),
    (H100, dict(seqlen_q=4096, headdim=256, causal=True, varlen=True),
     "256, sm90a, plain, bias none, warp-specialized pingpong-overlap, varlen>", None, 0),
    (A100, dict(seqlen_q=4096, headdim=128, causal=True, varlen=True), "128, sm80, plain, bias none, varlen>", None,
     0),
]


@pytest.mark.parametrize("device, call, name, grid, workspace", FWD_TABLE)
def test_forward_plan_table(device, call, name, grid, workspace):
    call = dict(dict(batch=2, nheads=16), **call)
    p = kernel("fwd", device, **call)
    assert name in p["kernel"], p
    if grid is not None:
        assert p["grid"] == grid, p
    assert p["workspace"].startswith(f"{workspace} int32"), p
    assert p["reasons"], p


BWD_TABLE = [
    # the warp-specialized kernel, its dQ conversion overlapped at d 128
    (H100, dict(seqlen_q=4096, headdim=128), "bwd_ws_kernel<bf16, 128, plain>", dict(dq_overlap="yes")),
    (H100, dict(seqlen_q=4096, headdim=256), "bwd_ws_dsplit_kernel<bf16, 256, plain>", dict(dq_overlap="no")),
    # deterministic: bwd_kernel's wgmma tiles, counters in a zeroed workspace (1 + batch * heads * query blocks)
    (H100, dict(seqlen_q=4096, headdim=128, deterministic=True),
     "bwd_kernel<bf16, 128, sm90a, sm90a wgmma tiles, plain>", dict(zero_workspace=True)),
    # softcap: the score-mod path on the sm80 tiles
    (H100, dict(seqlen_q=1024, headdim=128, softcap=30.0), "bwd_kernel<bf16, 128, sm90a, sm80 tiles, score-mod>", {}),
    # padding mask without its gradient: the ws kernel's key-row variant; with it: the score-mod path
    (H100, dict(seqlen_q=1024, headdim=128, bias="key_row"), "bwd_ws_kernel<bf16, 128, key-row bias>", {}),
    (H100, dict(seqlen_q=1024, headdim=128, bias="key_row", bias_requires_grad=True),
     "bwd_kernel<bf16, 128, sm90a, sm80 tiles, score-mod>", {}),
    # GQA: groups summed in the kernel where the grouped grid fills the GPU (128 CTAs of 132), else fp32
    # accumulators per kv head
    (H100, dict(seqlen_q=4096, headdim=128, nheads_k=2), "bwd_ws_kernel<bf16, 128, plain>",
     dict(gqa_dkv="in kernel", grid="(32, 2, 2)")),
    (H100, dict(seqlen_q=4096, headdim=128, nheads_k=2, batch=1), "bwd_ws_kernel<bf16, 128, plain>",
     dict(gqa_dkv="accumulate", grid="(32, 16, 1)")),
    # GQA without the ws kernel (softcap): fp32 partials per query head
    (H100, dict(seqlen_q=1024, headdim=128, nheads_k=2, softcap=30.0), "score-mod>", dict(gqa_dkv="partials")),
    # A100: the sm80 tiles; d 64's key-row bias does not fit them there: the small tiles
    (A100, dict(seqlen_q=1024, headdim=128), "bwd_kernel<bf16, 128, sm80, sm80 tiles, plain>", {}),
    (A100, dict(seqlen_q=1024, headdim=64), "bwd_kernel<bf16, 64, sm80, sm80 small tiles, plain>", {}),
    # varlen: on H100 the warp-specialized kernels on the plain path (no tail split; the dQ overlap's counts per head
    # over every sequence; GQA as fp32 partials per query head), else bwd_kernel's wgmma tiles (the sm80 ones on the
    # score-mod path); A100 sm80
    (H100, dict(seqlen_q=4096, headdim=128, varlen=True), "bwd_ws_kernel<bf16, 128, plain, varlen>",
     dict(grid="(32, 16, 2)", dq_overlap="yes", tail_split="0 tiles x 1", workspace="16 int32")),
    (H100, dict(seqlen_q=4096, headdim=64, varlen=True), "bwd_ws_kernel<bf16, 64, plain, varlen>",
     dict(dq_overlap="no", tail_split="0 tiles x 1")),
    (H100, dict(seqlen_q=4096, headdim=128, causal=True, varlen=True), "bwd_ws_kernel<bf16, 128, plain, varlen>", {}),
    (H100, dict(seqlen_q=1024, headdim=128, nheads_k=2, varlen=True), "bwd_ws_kernel<bf16, 128, plain, varlen>",
     dict(gqa_dkv="partials", grid="(8, 16, 2)")),
    (H100, dict(seqlen_q=4096, headdim=256, varlen=True), "bwd_ws_dsplit_kernel<bf16, 256, plain, varlen>",
     dict(dq_overlap="no")),
    (H100, dict(seqlen_q=1024, headdim=128, deterministic=True, varlen=True),
     "bwd_kernel<bf16, 128, sm90a, sm90a wgmma tiles, plain, varlen>", {}),
    (H100, dict(seqlen_q=1024, headdim=128, softcap=30.0, nheads_k=2, varlen=True),
     "bwd_kernel<bf16, 128, sm90a, sm80 tiles, score-mod, varlen>", dict(gqa_dkv="partials")),
    (A100, dict(seqlen_q=1024, headdim=128, varlen=True), "bwd_kernel<bf16, 128, sm80, sm80 tiles, plain, varlen>", {}),
    # a headdim without wgmma tiles (96): the sm_90 instance's sm80-path varlen kernel (its sm_90a one has none)
    (H100, dict(seqlen_q=1024, headdim=96, varlen=True), "bwd_kernel<bf16, 96, sm90, sm80 tiles, plain, varlen>", {}),
]


@pytest.mark.parametrize("device, call, name, extra", BWD_TABLE)
def test_backward_plan_table(device, call, name, extra):
    call = dict(dict(batch=2, nheads=16), **call)
    p = kernel("bwd", device, **call)
    assert name in p["kernel"], p
    for key, value in extra.items():
        if key == "zero_workspace":
            assert p["workspace"].endswith("(zeroed)"), p
        else:
            assert p[key] == value, (key, p)


def test_backward_programmatic_main_kernel():
    """Option bwd_programmatic_main (on by default): the warp-specialized main kernel (d 64 / 128 / 256, plain path,
    varlen, GQA) becomes the preprocess's programmatic dependent; not behind the row statistics kernel (a key-row
    bias), nor for the other main kernels (deterministic, softcap); none with the option off."""
    base = dict(batch=2, nheads=16, seqlen_q=4096)
    for extra in (dict(headdim=128), dict(headdim=64), dict(headdim=256), dict(headdim=128, varlen=True),
                  dict(headdim=128, nheads_k=2), dict(headdim=128, causal=True)):
        p = kernel("bwd", H100, **base, **extra)
        assert "bwd_ws_" in p["kernel"] and p["programmatic_main"] == "yes", (extra, p)
    for extra in (dict(bias="key_row"), dict(deterministic=True), dict(softcap=30.0)):
        p = kernel("bwd", H100, **base, headdim=128, **extra)
        assert p["programmatic_main"] == "no", (extra, p)
    assert kernel("bwd", A100, **base, headdim=128)["programmatic_main"] == "no"
    with dev.options_override(bwd_programmatic_main=False):
        assert kernel("bwd", H100, headdim=128, **base)["programmatic_main"] == "no"


def test_backward_tail_split_threshold():
    """The ws backward splits its last partial wave from kTailSplitMinQueryBlocks query blocks (auto), anywhere the
    cost model gains with bwd_tail_split=1, never with 0; no split under a causal mask."""
    for d, min_queries in ((64, 32 * 128), (128, 128 * 64)):
        assert dev.bwd_tail_split_plan(1, 1, 1, min_queries, 512, d, device=H100)[1] > 1
        assert dev.bwd_tail_split_plan(1, 1, 1, min_queries - 128, 512, d, device=H100)[1] == 1
        with dev.options_override(bwd_tail_split=1):
            assert dev.bwd_tail_split_plan(1, 1, 1, min_queries - 128, 512, d, device=H100)[1] > 1
        with dev.options_override(bwd_tail_split=0):
            assert dev.bwd_tail_split_plan(1, 1, 1, min_queries, 512, d, device=H100)[1] == 1
        assert dev.bwd_tail_split_plan(1, 1, 1, min_queries, 512, d, causal=True, device=H100)[1] == 1


def test_d64_warp_specialized_schedules_run_the_wide_tiles():
    """At d 64 every warp-specialized schedule runs the wide tiles (192 query rows, three consumer warpgroups and the
    producer): with ping-pong the three take turns in a ring (fwd/pingpong.cuh)."""
    call = dict(batch=2, nheads=16, seqlen_q=4096, headdim=64)
    for schedule in ("ws", "pingpong", "overlap", "pingpong-overlap"):
        with dev.options_override(sm90_schedule=schedule):
            p = kernel("fwd", H100, **call)
        assert f"warp-specialized {schedule}>" in p["kernel"], p
        assert p["block"] == "512 threads" and p["grid"] == "(704, 1, 1)", p  # 22 query blocks of 192 x 32 heads


def test_options_change_the_plan():
    call = dict(batch=2, nheads=16, seqlen_q=4096, headdim=128)
    with dev.options_override(sm90_schedule="pingpong", fwd_cluster=False):
        assert "warp-specialized pingpong>" in kernel("fwd", H100, **call)["kernel"]
    with dev.options_override(fwd_cluster=False):
        assert "cluster" not in kernel("fwd", H100, **call)["kernel"]
    with dev.options_override(persistent_forward_ctas=0):
        p = kernel("fwd", H100, causal=True, **call)
        assert "tile counter" not in p["kernel"] and p["grid"] == "(1024, 1, 1)", p
    with dev.options_override(persistent_forward_ctas=3):
        assert kernel("fwd", H100, **call)["grid"] == "(3, 1, 1)"  # (a cluster grid is cut to pairs at launch)
        assert kernel("fwd", H100, causal=True, **call)["grid"] == "(3, 1, 1)"
    with dev.options_override(arch_specific_kernels=False):
        assert ", sm90, plain" in kernel("fwd", H100, **call)["kernel"]
    # varlen: the sm80 path's kernels on Hopper with sm90_varlen off; a forced schedule is not a varlen one
    with dev.options_override(sm90_varlen=False):
        assert "128, sm90, plain, bias none, varlen>" in kernel("fwd", H100, varlen=True, **call)["kernel"]
        assert "128, sm90, sm80 tiles, plain, varlen>" in kernel("bwd", H100, varlen=True, **call)["kernel"]
    with dev.options_override(sm90_backward=False):
        assert "128, sm90, sm80 tiles, plain, varlen>" in kernel("bwd", H100, varlen=True, **call)["kernel"]
    with dev.options_override(sm90_schedule="pingpong"):
        assert "warp-specialized overlap, varlen>" in kernel("fwd", H100, varlen=True, **call)["kernel"]
    with dev.options_override(sm90_backward=False):
        assert "bwd_kernel<bf16, 128, sm90, sm80 tiles, plain>" in kernel("bwd", H100, **call)["kernel"]
    with dev.options_override(sm90_ws_backward=False):
        assert "bwd_kernel<bf16, 128, sm90a, sm90a wgmma tiles, plain>" in kernel("bwd", H100, **call)["kernel"]
        assert "bwd_kernel<bf16, 128, sm90a, sm90a wgmma tiles, plain, varlen>" in kernel("bwd", H100, varlen=True,
                                                                                          **call)["kernel"]
    with dev.options_override(key_bias_backward=False):
        assert "score-mod" in kernel("bwd", H100, bias="key_row", **call)["kernel"]
    with dev.options_override(bwd_small_tiles=True):
        assert "small tiles" in kernel("bwd", A100, **call)["kernel"]
    with dev.options_override(bwd_gqa_grouping=0):
        assert kernel("bwd", H100, nheads_k=2, **call)["gqa_dkv"] == "accumulate"
    with dev.options_override(bwd_gqa_grouping=0, bwd_gqa_accumulate=False):
        assert kernel("bwd", H100, nheads_k=2, **call)["gqa_dkv"] == "partials"
    with dev.options_override(tile_order_tail=False):
        assert kernel("fwd", H100, causal=True, **call)["tile_order_tail"] == "0"


def test_options_namespace():
    defaults = dev.default_options()
    assert defaults == {"arch_specific_kernels": True, "sm90_schedule": "auto", "persistent_forward_ctas": -1,
                        "fwd_cluster": True, "tile_order_tail": True, "sm90_backward": True, "sm90_ws_backward": True,
                        "key_bias_backward": True, "bwd_small_tiles": False, "bwd_gqa_grouping": -1,
                        "bwd_gqa_accumulate": True, "bwd_tail_split": -1, "cpu_bf16_gemm": True,
                        "sm90_varlen": True, "sm90_dropout": True, "sm90_ws_dropout": True,
                        "dense_decode": True, "bwd_programmatic_main": True,
                        "varlen_stage_masks": True, "varlen_dq_blocks": True, "paged_kv_in_place": True,
                        "cpu_head_tiles": True, "cpu_key_splits": -1}
    before = dev.options()
    with dev.options_override(sm90_schedule="ws", bwd_tail_split=1):
        assert dev.options()["sm90_schedule"] == "ws" and dev.options()["bwd_tail_split"] == 1
    assert dev.options() == before
    with pytest.raises(ValueError, match="unknown sm_90a schedule 'fast'"):
        dev.set_options(sm90_schedule="fast")
    with pytest.raises(ValueError, match="unknown development option 'nope'"):
        dev.set_options(nope=1)
    with pytest.raises(ValueError, match="bad value"):
        dev.set_options(bwd_tail_split=2)
    assert dev.options() == before  # (all or nothing)
    assert dev.sm90_default_schedule(128, True) == "pingpong-overlap"
    assert dev.sm90_default_schedule(128, False) == "overlap"
    assert dev.tuning_tables()["sm90_ws_backward_headdims"] == [64, 128, 256]


def test_environment_options_are_read_once(tmp_path):
    """FA2_DEV_OPTIONS (and the older single variables) set the options in a fresh process; a malformed one is an
    error that names it."""
    import os
    import subprocess
    import sys

    code = "import fa2, fa2.dev as d; print(d.options()['sm90_schedule'], d.options()['fwd_cluster'], " \
           "d.options()['sm90_backward'], d.options()['cpu_bf16_gemm'])"
    env = dict(os.environ, FA2_DEV_OPTIONS="sm90_schedule=pingpong, fwd_cluster=0", FA2_DISABLE_SM90_BACKWARD="1",
               FA2_CPU_BF16_GEMM="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["pingpong", "False", "False", "False"]
    env = dict(os.environ, FA2_DEV_OPTIONS="sm90_schedule=fast")
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "FA2_DEV_OPTIONS" in bad.stderr and "fast" in bad.stderr


def test_explain_plan_and_cli(capsys):
    import torch

    q = torch.randn(1, 2048, 8, 128, dtype=torch.bfloat16)
    text = dev.explain_plan(q, q, q, causal=True, device=H100)
    assert "forward:" in text and "backward:" in text and "kernel: fwd_kernel<bf16, 128, sm90a" in text, text
    assert "why: schedule: pingpong-overlap" in text, text
    from fa2.__main__ import plan_main

    assert plan_main(["--device", "a100", "--headdim", "64", "--direction", "fwd"]) == 0
    out = capsys.readouterr().out
    if "rebuild with FA2_CUDA_ARCHS" in out:  # (a build without the A100's instances, e.g. FA2_CUDA_ARCHS=90;90a)
        pytest.skip(out)
    assert "kernel: fwd_kernel<bf16, 64, sm80, plain, bias none>" in out


def test_forward_plan_says_when_the_decode_kernel_takes_the_call():
    """fa2.attention's decode-shaped calls (up to 64 query rows per kv head; no bias but a bool key mask, no dropout,
    sinks or value headdim of its own) go to the decode kernel (option dense_decode): the forward plan says so; varlen
    calls never."""
    decode = dict(batch=4, nheads=32, nheads_k=8, seqlen_q=1, seqlen_k=32768, headdim=128)
    assert kernel("fwd", H100, **decode)["decode_kernel"] is True
    assert kernel("fwd", H100, **dict(decode, seqlen_q=16))["decode_kernel"] is True   # 64 rows a kv head
    assert kernel("fwd", H100, **dict(decode, seqlen_q=17))["decode_kernel"] is False  # 68
    assert kernel("fwd", H100, **decode, bias="key_row", bias_dtype="bool")["decode_kernel"] is True  # a padding mask
    for other in (dict(bias="key_row"), dict(bias="key_row", bias_dtype="float32"), dict(bias="full", bias_dtype="bool"),
                  dict(dropout_p=0.1), dict(sinks=True), dict(headdim_v=64), dict(varlen=True)):
        assert kernel("fwd", H100, **decode, **other)["decode_kernel"] is False, other
    with dev.options_override(dense_decode=False):
        assert kernel("fwd", H100, **decode)["decode_kernel"] is False


def test_decode_splits():
    """The decode kernel's split of the KV length (decode/shape.h) where the caller leaves it to the library: at most
    two CTAs an SM to fill (a third and fourth added no bandwidth), whole key tiles a split, none where batch x kv
    heads already fill the GPU; the counts the H100 sweeps found fastest (batch 1, GQA 32 / 8: d 64 at 512 / 8k /
    128k keys 8 / 32 / 33 splits; d 128 batch 16 at 512 keys 2); a requested count clamped to the key tiles."""
    def splits(**call):
        return dev.plan("decode", H100, **call)["num_splits"]

    gqa = dict(nheads=32, nheads_k=8)
    assert splits(batch=1, seqlen_k=512, headdim=64, **gqa) == 8
    assert splits(batch=1, seqlen_k=8192, headdim=64, **gqa) == 32
    assert splits(batch=1, seqlen_k=131072, headdim=64, **gqa) == 33
    assert splits(batch=16, seqlen_k=512, headdim=128, **gqa) == 2
    assert splits(batch=256, seqlen_k=8192, headdim=64, **gqa) == 1
    assert splits(batch=1, seqlen_k=100, headdim=64, num_splits=16, **gqa) == 2  # (two tiles of 64 keys)
    p = dev.plan("decode", H100, batch=1, seqlen_k=8192, headdim=64, **gqa)
    assert p["ctas_per_split"] * p["num_splits"] <= 2 * 132 and p["row_blocks"] == 1, p
    assert "decline" in dev.plan("decode", H100, batch=1, seqlen_q=9, nheads=32, nheads_k=1, seqlen_k=64)


def test_varlen_forward_stage_masks_option():
    """Option varlen_stage_masks (on by default): the plan marks the warp-specialized varlen forward's stage masks
    (params.varlen_stage_masks); never for a dense call, a kernel that is not warp-specialized, or the sm80
    path."""
    call = dict(batch=4, nheads=16, seqlen_q=2048, headdim=128)
    assert kernel("fwd", H100, varlen=True, **call)["stage_masks"] == "yes"
    with dev.options_override(varlen_stage_masks=False):
        assert kernel("fwd", H100, varlen=True, **call)["stage_masks"] == "no"
    with dev.options_override(varlen_stage_masks=True):
        for extra in (dict(), dict(causal=True), dict(window_left=100, window_right=0), dict(headdim=256)):
            p = kernel("fwd", H100, varlen=True, **dict(call, **extra))
            assert p["stage_masks"] == ("yes" if "warp-specialized" in p["kernel"] else "no"), (extra, p)
        assert kernel("fwd", H100, varlen=True, **call)["stage_masks"] == "yes"
        assert kernel("fwd", H100, **call)["stage_masks"] == "no"
        assert kernel("fwd", A100, varlen=True, **call)["stage_masks"] == "no"
        assert kernel("fwd", H100, varlen=True, softcap=20.0, **call)["stage_masks"] == "no"
