"""The sm_90a kernels (FA2_CUDA_ARCHS with 90a: the wgmma forward) against the sm80-path kernels of the same build,
on the same inputs: both within the numerics rule, and really two different kernels (fa2.dev option arch_specific_kernels
switches between them). Runs on a compute capability 9.0 GPU with a build that has sm_90a instances."""
from __future__ import annotations

import itertools
import os

import pytest
import torch

import fa2
from fa2.reference import attention_ref
from kernels import cuda_kernel_grids, cuda_kernel_names, cuda_kernel_spans, is_ws_key_row_kernel, switch
from numerics import assert_close_rule, reference_grads
from samples import make_qkv, sample_inputs


def _has_sm90a_build() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and \
        "sm90a" in fa2._C.build_info()["kernels"]


pytestmark = pytest.mark.skipif(not _has_sm90a_build(),
                                reason="needs a compute capability 9.0 GPU and a build with FA2_CUDA_ARCHS including 90a")


def _both_paths(fn):
    """fn() with the sm_90a instances, then with the sm80-path instances of the same build."""
    with switch("arch_specific_kernels", True):
        first = fn()
    with switch("arch_specific_kernels", False):
        second = fn()
    return first, second


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_wgmma_forward_and_sm80_path_both_follow_the_rule(dtype):
    differ = 0
    for s in sample_inputs("cuda", dtype, full=True):
        (out_a, lse_a), (out_b, lse_b) = _both_paths(lambda: torch.ops.fa2.fwd(*s.args()))
        kw = dict(s.kwargs)
        bias = kw.pop("attn_bias", None)
        up = (lambda t: None if t is None else (t.float() if t.dtype != torch.bool else t))  # noqa: E731
        out_hi = attention_ref(s.q.float(), s.k.float(), s.v.float(), up(bias), **kw)
        out_naive = attention_ref(s.q, s.k, s.v, bias, upcast=False, **kw)
        assert_close_rule(f"wgmma out {s}", out_a, out_hi, out_naive, factor=2)
        assert_close_rule(f"sm80-path out {s}", out_b, out_hi, out_naive, factor=2)
        finite = torch.isfinite(lse_b)
        assert torch.equal(torch.isfinite(lse_a), finite), s
        assert torch.allclose(lse_a[finite], lse_b[finite], atol=1e-3, rtol=1e-3), s
        differ += not torch.equal(out_a, out_b)
    assert differ > 0, "the switch changed nothing: the sm_90a instances did not run"


def test_wgmma_training_step_matches_sm80_path():
    q, k, v = (torch.randn(2, 777, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)

    def step():
        out = fa2.attention(q, k, v, causal=True)
        return (out.detach(),) + torch.autograd.grad(out, (q, k, v), dout)

    a, b = _both_paths(step)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = attention_ref(*leaves, causal=True)
    ref_grads = torch.autograd.grad(ref, leaves, dout.float())
    for name, x, y, r in zip(("out", "dq", "dk", "dv"), a, b, (ref.detach(),) + ref_grads):
        err_a = ((x.float() - r).norm() / r.norm()).item()
        err_b = ((y.float() - r).norm() / r.norm()).item()
        assert err_a < 2 * err_b + 1e-3, f"{name}: wgmma path {err_a:.2e} vs sm80 path {err_b:.2e} relative error"


# fwd_kernel<T, D, 901, mode, bias, warp_specialized, pingpong, overlap, tile_counter, cluster, ...>: each sm_90a
# schedule's flags as they stand in the kernel's name, the two flags after them either way (tile_counter: the
# tile-counter twin runs causal / windowed calls with more query blocks than SMs; cluster: d 128's overlap kernel runs
# calls without a causal mask or window in clusters of two)
KERNEL_SUFFIX = {"pipelined": ", false, false, false, ", "ws": ", true, false, false, ",
                 "pingpong": ", true, true, false, ", "overlap": ", true, false, true, ",
                 "pingpong-overlap": ", true, true, true, "}


def _key_row_bias(b, sk, dtype, kind, gen, misaligned=False):
    """A (b, 1, 1, sk) bias of the given kind ("same": the input dtype, "fp32", "bool"); misaligned: a view one
    element into a longer row, so that the rows do not start 16-byte aligned."""
    n = sk + (1 if misaligned else 0)
    if kind == "bool":
        row = torch.rand(b, 1, 1, n, device="cuda", generator=gen) > 0.3
    else:
        row = torch.randn(b, 1, 1, n, device="cuda", generator=gen).to(dtype if kind == "same" else torch.float32)
        row[..., -5:] = torch.finfo(row.dtype).min
    return row[..., 1:] if misaligned else row


def _schedule_calls(dtype):
    """(fa2.fwd arguments, a label, the extra call's flags) for the schedule tests: every sample without softcap (plain and with
    each bias kind), extra plain shapes (key ranges long enough for a warp-specialized producer to wait on released
    stages, query blocks that see no key, every instantiated headdim), and key-row biases at the headdims whose
    default schedule is warp-specialized and at d 64 (the wide kernel when "ws" is forced), with key tiles all full or
    not, aligned rows or not."""
    samples = [s for s in sample_inputs("cuda", dtype, full=True) if not s.kwargs.get("softcap")]
    calls = [(s.args(), str(s), {}) for s in samples]
    gen = torch.Generator(device="cuda").manual_seed(5)
    extra = [((1, 300, 1100, 2, 1, 128), {}), ((1, 300, 1100, 2, 1, 128), {"causal": True}),
             ((2, 260, 700, 4, 2, 96), {}), ((1, 500, 900, 2, 2, 32), {"window_left": 300, "window_right": 0}),
             ((1, 300, 20, 2, 2, 64), {"causal": True}),  # bottom-right causal: rows 0..279 see no key
             ((1, 200, 700, 2, 1, 256), {}), ((1, 150, 500, 2, 2, 192), {"causal": True}),
             # d 256 (two stages; K and V on barriers of their own in the overlap schedules): exactly two key tiles,
             # causal with query blocks that see no key, a window over several tiles
             ((1, 130, 160, 2, 1, 256), {}), ((1, 300, 160, 2, 1, 256), {"causal": True}),
             ((1, 200, 900, 2, 2, 256), {"window_left": 250, "window_right": 0})]
    for kind, sk, misaligned in [("same", 1024, False), ("fp32", 1100, False), ("bool", 640, False),
                                 ("same", 640, True)]:
        for d, causal in [(128, False), (128, True), (256, False), (192, True), (64, False), (64, True)]:
            extra.append(((2, 200, sk, 4, 2, d), {"causal": causal, "bias": (kind, misaligned)}))
    for shape, flags in extra:
        q, k, v = make_qkv(*shape, dtype=dtype, device="cuda")
        bias = None
        if "bias" in flags:
            kind, misaligned = flags["bias"]
            bias = _key_row_bias(shape[0], shape[2], dtype, kind, gen, misaligned=misaligned).expand(
                shape[0], shape[3], shape[1], shape[2])
        calls.append(((q, k, v, bias, None, flags.get("causal", False), flags.get("window_left", -1),
                       flags.get("window_right", -1), 0.0), f"{shape} {flags}", flags))
    return calls


@pytest.fixture
def dense_forward_only():
    """Decode-shaped calls (few query rows per kv head) on the dense kernels too, not the decode kernel (option
    dense_decode): for tests of the dense forward's schedules over samples that include such shapes."""
    with switch("dense_decode", False):
        yield


@pytest.mark.usefixtures("dense_forward_only")
@pytest.mark.parametrize("schedule", ["ws", "pingpong", "overlap", "pingpong-overlap", "auto"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sm90_schedules_equal_the_pipelined_forward(dtype, schedule):
    """The sm_90a forward's schedules (fa2.dev option sm90_schedule; tile_config.h) run the same products and softmax as
    the pipelined kernel, only scheduled differently: bitwise the same out and lse on every call, plain or with a
    bias (forced warp-specialized schedules serve the plain path; a key-row bias with aligned rows runs each
    headdim's key-bias schedule (its default without ping-pong), its bias staged in shared memory, except that a forced "ws" at d <= 64 runs the wide
    warp-specialized kernel), including query blocks that see no key. And they really are other kernels: a forced
    schedule at every instantiated headdim of the plain path, fa2.dev.sm90_key_bias_schedule
    for aligned key-row biases (wide "ws" at d <= 64 when forced), and the pipelined kernel for a misaligned one."""
    calls = _schedule_calls(dtype)
    assert len(calls) > 30
    with switch("sm90_schedule", schedule):
        scheduled = [torch.ops.fa2.fwd(*args) for args, _, _ in calls]
        plain_by_headdim, key_bias = {}, []  # plain: by (headdim, windowed: causal or a window)
        for args, _, flags in calls:
            d = -(-args[0].shape[-1] // 32) * 32  # the instantiated headdim that serves it (32 .. 256)
            windowed = bool(args[5]) or args[6] >= 0 or args[7] >= 0
            if args[3] is None and (d, windowed) not in plain_by_headdim:
                plain_by_headdim[(d, windowed)] = args
            elif "bias" in flags:
                key_bias.append((d, flags["bias"][1], args))
        names = {d: cuda_kernel_names(lambda a=a: torch.ops.fa2.fwd(*a)) for d, a in plain_by_headdim.items()}
        bias_names = [(d, misaligned, cuda_kernel_names(lambda a=a: torch.ops.fa2.fwd(*a)))
                      for d, misaligned, a in key_bias]
    with switch("sm90_schedule", "pipelined"):
        pipelined = [torch.ops.fa2.fwd(*args) for args, _, _ in calls]
    assert {d for d, _ in names} >= {32, 64, 96, 128, 192, 256}, sorted(names)
    assert {(128, False), (128, True)} <= set(names), sorted(names)  # (d 128's two defaults)
    for (d, windowed), kernels in names.items():
        want = KERNEL_SUFFIX[fa2.dev.sm90_default_schedule(d, windowed) if schedule == "auto" else schedule]
        assert any("fwd_kernel<" in n and want in n for n in kernels), (schedule, d, windowed, kernels)
    # key-row biases: each headdim's key-bias schedule, except that a forced "ws" at d <= 64 (default pipelined) runs
    # the wide warp-specialized kernel; misaligned rows the pipelined kernel
    for d, misaligned, kernels in bias_names:
        if misaligned:
            want = "pipelined"
        elif schedule == "ws" and d <= 64:
            want = "ws"
        else:
            want = fa2.dev.sm90_key_bias_schedule(d)
        assert any("fwd_kernel<" in n and KERNEL_SUFFIX[want] in n for n in kernels), (schedule, d, misaligned, kernels)
    for (_, what, _), (out_s, lse_s), (out, lse) in zip(calls, scheduled, pipelined):
        assert torch.equal(out_s, out), f"out differs by {(out_s.float() - out.float()).abs().max().item()}: {what}"
        assert torch.equal(lse_s, lse), f"lse differs: {what}"


@pytest.mark.parametrize("schedule", ["ws", "pingpong", "overlap", "pingpong-overlap", "auto"])
def test_sm90_persistent_forward_equals_one_cta_per_query_block(schedule):
    """The warp-specialized forward is persistent (fwd_kernel.cuh: a grid of at most one CTA per SM, each taking every
    grid-th query block, its producer loading the next block's K/V and Q while the consumers finish the current one).
    It is persistent at the headdims tile_config.h's fwd_persistent_headdim names (d 97-128; elsewhere the cap is
    ignored and every kernel takes one query block per CTA, so only those headdims' calls are compared). With the grid
    cut to 1 and 3 CTAs (fa2.dev option persistent_forward_ctas, on every call, causal too: at the default schedule
    causal and windowed calls run the tile-counter kernel, their CTAs claiming blocks from a counter,
    the plan's workspace_ints; the other schedules' CTAs take every grid-th block), so that one CTA
    runs many query blocks back to back (the K/V ring's and Q's barrier phases, the ping-pong turns, skipped all-padded
    key tiles and blocks that see no key carried from one block to the next), and with the default grid, out and lse
    are bitwise those of one CTA per query block: on the schedule tests' calls (plain and key-row biases at every
    headdim) and on shapes with more query blocks than SMs, bf16 and fp16. The padding masks' rows are 16-byte
    aligned (the TMA stages them: the warp-specialized kernels) and pad whole key tiles (which they skip)."""
    persistent_headdim = lambda d: 96 < d <= 128  # noqa: E731  (tile_config.h, fwd_persistent_headdim)
    calls = [args for args, _, _ in _schedule_calls(torch.bfloat16) if persistent_headdim(args[0].shape[-1])]
    assert calls, "the schedule tests' calls include persistent headdims"
    gen = torch.Generator(device="cuda").manual_seed(9)
    for shape, causal, with_bias, dtype in [
            ((2, 2000, 2000, 8, 2, 128), False, False, torch.bfloat16),
            ((2, 2000, 2000, 8, 2, 128), True, False, torch.float16),
            ((1, 2500, 900, 8, 8, 128), True, False, torch.bfloat16),  # bottom-right causal: blocks see no key
            ((1, 3000, 1000, 4, 4, 120), True, False, torch.bfloat16),  # a headdim below the instance's
            ((2, 1100, 1280, 8, 8, 128), False, True, torch.float16),
            ((2, 1100, 1280, 8, 8, 128), True, True, torch.bfloat16)]:
        q, k, v = make_qkv(*shape, dtype=dtype, device="cuda", generator=gen)
        bias = None
        if with_bias:
            keep = torch.ones(shape[0], 1, 1, shape[2], dtype=torch.bool, device="cuda")
            keep[0, ..., 700:] = False  # key tiles from 768 on all padded (skipped where the schedule skips them)
            keep[1, ..., 100:300] = False  # and keys inside a row
            bias = keep.expand(shape[0], shape[3], shape[1], shape[2])
        calls.append((q, k, v, bias, None, causal, -1, -1, 0.0))
    with switch("sm90_schedule", schedule):
        with switch("persistent_forward_ctas", 0):
            want = [torch.ops.fa2.fwd(*args) for args in calls]
        for ctas in (1, 3, -1):
            with switch("persistent_forward_ctas", ctas):
                got = [torch.ops.fa2.fwd(*args) for args in calls]
            for i, ((out, lse), (out_w, lse_w)) in enumerate(zip(got, want)):
                assert torch.equal(out, out_w), (ctas, i, (out.float() - out_w.float()).abs().max().item())
                assert torch.equal(lse, lse_w), (ctas, i)


def test_sm90_causal_forward_is_persistent_with_a_tile_counter():
    """A causal d 128 forward with more query blocks than SMs runs persistent on sm_90a (one CTA per SM at most, the
    CTAs claiming blocks from a counter the glue zeroes: the plan's workspace), and its out / lse are bitwise those of
    one CTA per query block (the same per-block arithmetic; test_sm90_persistent_forward_equals_one_cta_per_query_block
    covers more shapes and caps)."""
    if "fwd_bf16_hdim128_sm90a" not in fa2._C.build_info()["kernels"]:
        pytest.skip("this build has no sm_90a forward for headdim 128")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = make_qkv(4, 2048, 2048, 16, 16, 128, dtype=torch.bfloat16, device="cuda", generator=gen)
    with switch("sm90_schedule", "pingpong-overlap"):  # (d 128's default: FA2_SM90_SCHEDULE may force another)
        kernels = [(name, g) for name, g in cuda_kernel_grids(lambda: fa2.attention(q, k, v, causal=True))
                   if "fwd_kernel" in name]
        # (fwd_kernel<..., warp_specialized, pingpong, overlap, tile_counter, cluster, varlen, dropout>)
        assert len(kernels) == 1 and kernels[0][0].endswith(
            ", true, true, true, true, false, false, false>(fa2::AttentionParams, fa2::sm90::FwdTensorMaps)"), kernels
        assert kernels[0][1][0] <= sms and kernels[0][1][1:] == [1, 1], kernels
        got = torch.ops.fa2.fwd(q, k, v, None, None, True, -1, -1, 0.0)
        with switch("persistent_forward_ctas", 0):
            kernels = [(name, g) for name, g in cuda_kernel_grids(
                lambda: torch.ops.fa2.fwd(q, k, v, None, None, True, -1, -1, 0.0)) if "fwd_kernel" in name]
            assert ", true, true, true, false, false, false, false>(" in kernels[0][0], kernels
            assert kernels[0][1][0] == 4 * 16 * 16, kernels  # (one CTA per query block)
            want = torch.ops.fa2.fwd(q, k, v, None, None, True, -1, -1, 0.0)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_sm90_tile_counter_forward_with_blocks_that_see_no_key():
    """Causal with seqlen_q >> seqlen_k (bottom-right: most query blocks see no key) and more blocks than SMs: CTAs
    whose first block sees no key must still take every later block from the producer's announcement (a race: the
    consumers once read the announcement slot before it was written). Fresh inputs each round, so that a block left
    unwritten keeps a wrong value; out / lse bitwise those of one CTA per query block."""
    if "fwd_bf16_hdim128_sm90a" not in fa2._C.build_info()["kernels"]:
        pytest.skip("this build has no sm_90a forward for headdim 128")
    gen = torch.Generator(device="cuda").manual_seed(12)
    with switch("sm90_schedule", "pingpong-overlap"):
        for _ in range(8):
            q = torch.randn(4, 2048, 16, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            k, v = (torch.randn(4, 128, 16, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
            names = cuda_kernel_names(lambda: torch.ops.fa2.fwd(q, k, v, None, None, True, -1, -1, 0.0))
            assert any(n.endswith(", true, true, true, true, false, false, false>(fa2::AttentionParams, "
                                  "fa2::sm90::FwdTensorMaps)") for n in names), names
            got = torch.ops.fa2.fwd(q, k, v, None, None, True, -1, -1, 0.0)
            with switch("persistent_forward_ctas", 0):
                want = torch.ops.fa2.fwd(q, k, v, None, None, True, -1, -1, 0.0)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_sm90_forward_in_clusters_of_two_equals_single_ctas():
    """d 128 without a causal mask or window runs its persistent overlap kernel in clusters of two CTAs
    (fwd_kernel.cuh, kCluster: the pair takes two query blocks of one head, each CTA's producer loads half of every
    K/V tile's column blocks and multicasts them into both CTAs' ring; each consumer warp releases a stage to both
    producers). Where the launcher allows it (an even number of query blocks per head) the kernel is the cluster one:
    persistent (more tiles than SMs: at most one CTA per SM, an even count; a cap of 3 CTAs runs 2) or one tile per CTA
    (fewer tiles than SMs, or the persistent grid off: the grid is the tile count); elsewhere (odd blocks, a cap of 1
    CTA, causal) the cluster-free one. Either way out and lse are bitwise those with clusters off
    (fa2.dev option fwd_cluster(False)): the same arithmetic per block. Shapes: seqlen not a multiple of the block, GQA (a
    pair's K/V head shared), many tiles per pair (the ring's phases carried over), bf16 and fp16."""
    if "fwd_bf16_hdim128_sm90a" not in fa2._C.build_info()["kernels"]:
        pytest.skip("this build has no sm_90a forward for headdim 128")
    assert fa2.dev.options()["fwd_cluster"], "on by default (is FA2_NO_FWD_CLUSTER set?)"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(31)
    # (shape (b, sq, sk, h, hk, d), causal, dtype, persistent CTAs cap (-1: one per SM, 0: off), whether clusters
    # apply)
    cases = [((2, 2000, 2000, 8, 2, 128), False, torch.bfloat16, -1, True),   # 16 blocks a head, GQA
             ((4, 4096, 4096, 16, 16, 128), False, torch.float16, -1, True),  # 2048 blocks
             ((1, 1024, 3000, 4, 4, 120), False, torch.bfloat16, 3, True),    # capped: 2 CTAs; d below 128
             ((1, 512, 1000, 2, 2, 128), False, torch.bfloat16, -1, True),    # 8 blocks: one a CTA
             ((2, 2048, 2048, 8, 8, 128), False, torch.float16, 0, True),     # persistent off: one a CTA
             ((2, 1100, 1280, 8, 8, 128), False, torch.bfloat16, -1, False),  # 9 blocks a head: odd
             ((2, 1024, 1024, 4, 4, 128), False, torch.bfloat16, 1, False),   # one CTA
             ((2, 2048, 2048, 8, 8, 128), True, torch.bfloat16, -1, False)]   # causal: the tile-counter kernel
    with switch("sm90_schedule", "auto"):
        for shape, causal, dtype, ctas, clustered in cases:
            q, k, v = make_qkv(*shape, dtype=dtype, device="cuda", generator=gen)
            call = lambda: torch.ops.fa2.fwd(q, k, v, None, None, causal, -1, -1, 0.0)  # noqa: E731
            with switch("persistent_forward_ctas", ctas):
                kernels = [(n, g) for n, g in cuda_kernel_grids(call) if "fwd_kernel" in n]
                got = call()
                with switch("fwd_cluster", False):
                    kernels_off = [n for n, _ in cuda_kernel_grids(call) if "fwd_kernel" in n]
                    want = call()
            what = (shape, causal, dtype, ctas)
            assert len(kernels) == 1 and len(kernels_off) == 1, (what, kernels, kernels_off)
            name, grid = kernels[0]
            # (fwd_kernel<..., warp_specialized, pingpong, overlap, tile_counter, cluster, varlen, dropout>)
            assert name.endswith(", true, false, true, false, true, false, false>(fa2::AttentionParams, "
                                 "fa2::sm90::FwdTensorMaps)") == clustered, (what, name)
            assert kernels_off[0].endswith(", false, false, false>(fa2::AttentionParams, fa2::sm90::FwdTensorMaps)"), \
                kernels_off
            if clustered:
                tiles = -(-shape[1] // 128) * shape[3] * shape[0]
                expected = 2 if ctas == 3 else tiles if ctas == 0 or tiles <= sms else None
                if expected is not None:
                    assert grid == [expected, 1, 1], (what, grid)
                else:
                    assert 2 <= grid[0] <= sms and grid[1:] == [1, 1], (what, grid)
            assert torch.equal(got[0], want[0]), (what, (got[0].float() - want[0].float()).abs().max().item())
            assert torch.equal(got[1], want[1]), what


@pytest.mark.parametrize("d", [64, 128, 256])
def test_tile_order_tail_changes_no_result(d):
    """Launches whose blocks have causal lengths start the blocks of their last (batch, head) pairs longest first
    across those heads (fa2/tile_order.h: rank-major, where the rest of the launch goes head by head), so that the
    longest blocks do not start last. The order changes which CTA runs which tile, never a tile's arithmetic: out,
    lse, dK and dV are bitwise those of the head-major order throughout (fa2.dev option tile_order_tail(False)); dQ, fp32
    sums added by the key blocks' CTAs in another order, within a rounding of its bf16 / fp16 result, and so dK, dV
    with GQA where the group is not summed in one CTA (fp32 accumulators per kv head that each query head's CTAs add
    into: GqaDkv::kAccumulate, params.h; the order of those additions is not fixed even in one tile order). Shapes with a
    tail that covers some heads and leaves others head-major (64 (batch, head) pairs of 8-16 blocks: tails of 32-59;
    fewer blocks than SMs), bottom-right causal with seqlen_q != seqlen_k, a window bounded on the right only, GQA;
    the sm_90a forward kernels (d 128: the tile-counter one) and the warp-specialized backward (the tail at d 128 /
    256; the d 64 one keeps blockIdx's order, where the switch must change nothing either)."""
    assert fa2.dev.options()["tile_order_tail"], "on by default (FA2_NO_TILE_ORDER_TAIL unset)"
    gen = torch.Generator(device="cuda").manual_seed(21)
    cases = [((4, 1000, 1000, 16, 16), dict(causal=True), torch.bfloat16),
             ((2, 1500, 700, 32, 8), dict(causal=True), torch.float16),  # (query blocks that see no key)
             ((4, 900, 1100, 16, 4), dict(window_left=-1, window_right=64), torch.bfloat16)]
    for (b, sq, sk, h, hk), kw, dtype in cases:
        q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device="cuda", generator=gen, requires_grad=True)
        dout = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=gen)

        def run():
            out, lse = torch.ops.fa2.fwd(q.detach(), k.detach(), v.detach(), None, None, kw.get("causal", False),
                                         kw.get("window_left", -1), kw.get("window_right", -1), 0.0)
            grads = torch.autograd.grad(fa2.attention(q, k, v, **kw), (q, k, v), dout)
            return (out, lse) + grads

        with switch("tile_order_tail", False):
            want = run()
        got = run()
        what = f"d {d} {(b, sq, sk, h, hk)} {kw}"
        for name, x, y in zip(("out", "lse", "dq", "dk", "dv"), got, want):
            if name == "dq" or (name in ("dk", "dv") and h != hk):
                tol = 2 ** -6 * y.float().abs().max().item()
                assert (x.float() - y.float()).abs().max().item() <= tol, (what, name)
            else:
                assert torch.equal(x, y), (what, name, (x.float() - y.float()).abs().max().item())


def test_sm90_schedule_setting():
    """fa2.dev option sm90_schedule takes the six names and rejects others with a clear error (the setting unchanged)."""
    before = fa2.dev.options()["sm90_schedule"]
    try:
        for name in ("pipelined", "ws", "pingpong", "overlap", "pingpong-overlap", "auto"):
            fa2.dev.set_options(sm90_schedule=name)
            assert fa2.dev.options()["sm90_schedule"] == name
        with pytest.raises(ValueError, match="unknown sm_90a schedule 'fast'"):
            fa2.dev.set_options(sm90_schedule="fast")
        assert fa2.dev.options()["sm90_schedule"] == "auto"
    finally:
        fa2.dev.set_options(sm90_schedule=before)
    for windowed in (False, True):
        assert fa2.dev.sm90_default_schedule(64, windowed) == "pipelined"
    # d 128: ping-pong-overlap where a causal mask or window makes query blocks' key ranges unequal, the overlap alone
    # where they are all the keys (tile_config.h)
    assert fa2.dev.sm90_default_schedule(128, True) == "pingpong-overlap"
    assert fa2.dev.sm90_default_schedule(128, False) == "overlap"
    assert fa2.dev.sm90_key_bias_schedule(128) == "overlap"  # (the tiles a padding mask hides are skipped)
    # d 192 (96-key tiles) and 256 (80-key tiles): the overlap schedules (d 256 with ping-pong), whose two K/V stages
    # need K and V on barriers of their own (the staged-bias kernels keep one pair: warp-specialized there)
    for d, schedule in ((192, "overlap"), (256, "pingpong-overlap")):
        for windowed in (False, True):
            assert fa2.dev.sm90_default_schedule(d, windowed) == schedule, d
        assert fa2.dev.sm90_key_bias_schedule(d) == "ws", d


@pytest.mark.parametrize("d", [32, 64, 128, 256])
def test_sm90_backward_is_wgmma_by_default_and_follows_the_rule(d):
    """The backward's sm_90a instances (wgmma products at these headdims, plain path) are the default on this GPU
    (unless FA2_DISABLE_SM90_BACKWARD is set, as gpu_validate.sh's tests-bwd80 step does to test the sm80-path
    backward); fa2.dev option sm90_backward(False) runs the sm80-path one. With them, the kernel that runs is the wgmma
    one and its gradients follow the rule against the fp32 reference, causal or not, with query/key tails and GQA."""
    if f"bwd_bf16_hdim{d}_sm90a" not in fa2._C.build_info()["kernels"]:
        pytest.skip(f"this build has no sm_90a backward for headdim {d} (FA2_HEADDIMS)")
    if not fa2.dev.environment_sets("sm90_backward"):
        assert fa2.dev.options()["sm90_backward"]
    for causal in (False, True):
        q, k, v = make_qkv(2, 333, 461, 4, 2, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        dout = torch.randn(2, 333, 4, d, device="cuda", dtype=torch.bfloat16)
        out = fa2.attention(q, k, v, causal=causal)
        with switch("sm90_backward", False):
            names_off = cuda_kernel_names(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        with switch("sm90_backward", True):
            names = cuda_kernel_names(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
            grads = torch.autograd.grad(out, (q, k, v), dout)
        # bwd_kernel<T, BwdTileConfig<..., whole_block_mask, kWgmma = true>, 901, kScoreMod = false, kKeyBias = false,
        # kVarlen = false, kDropout = false>,
        # or at the warp-specialized kernel's headdims (unless switched off) bwd_ws_kernel<T, BwdWsTileConfig<d>>
        if d in WS_BACKWARD_HEADDIMS and fa2.dev.options()["sm90_ws_backward"]:
            assert any("bwd_ws_" in n for n in names), names
        else:
            assert any("bwd_kernel<" in n and ", true>, 901, false, false, false, false>(" in n for n in names), names
        assert not any("bwd_kernel<" in n and ", true>, 901, false, false, false, false>(" in n for n in names_off), names_off
        assert any("bwd_kernel<" in n for n in names_off), names_off
        grads_hi, grads_lo = reference_grads(
            lambda leaves, up: attention_ref(*leaves, causal=causal, upcast=up), (q, k, v), dout)
        for name, g, g_hi, g_lo in zip(("dq", "dk", "dv"), grads, grads_hi, grads_lo):
            assert_close_rule(f"{name} d {d} causal {causal}", g, g_hi, g_lo, factor=3)


WS_BACKWARD_HEADDIMS = tuple(fa2.dev.tuning_tables()["sm90_ws_backward_headdims"])  # (bwd_tile_config.h, bwd_ws_headdim)


def require_ws_backward(d):
    """Skips unless the warp-specialized backward runs at headdim d here: this build has the sm_90a backward instance
    and neither FA2_DISABLE_SM90_BACKWARD (gpu_validate.sh's tests-bwd80 step) nor FA2_DISABLE_SM90_WS_BACKWARD
    (tests-bwd-nows) is set; then both switches must be on (their defaults)."""
    if f"bwd_bf16_hdim{d}_sm90a" not in fa2._C.build_info()["kernels"]:
        pytest.skip(f"this build has no sm_90a backward for headdim {d} (FA2_HEADDIMS)")
    for name in ("sm90_backward", "sm90_ws_backward"):
        if fa2.dev.environment_sets(name):
            pytest.skip(f"the environment sets the development option {name}")
    assert fa2.dev.options()["sm90_backward"] and fa2.dev.options()["sm90_ws_backward"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", WS_BACKWARD_HEADDIMS)
def test_sm90_ws_backward_follows_the_rule_as_the_wgmma_kernel_does(d, dtype):
    """The warp-specialized backward (bwd_ws_kernel.cuh: producer thread + TMA, transposed scores, dQ from both
    warpgroups' dS^T) runs by default at its headdims on the plain path, and its gradients follow the rule against
    the fp32 reference, as do those of bwd_kernel.cuh's wgmma instance (set_sm90_ws_backward(False)), on: query / key
    tails (332 / 461, and seqlen_q 333 / 255: the row statistics' boxes start below the block, at a multiple of 4
    rows), GQA and not (dK, dV stored from the fragments as fp32 partials, or staged through shared memory),
    a headdim below the instance's (d - 8),
    causal with more queries than keys (rows that see nothing), sliding windows (key blocks no query sees), one query
    block, many stages of the ring (1000)."""
    require_ws_backward(d)
    g = torch.Generator(device="cuda").manual_seed(5)
    cases = [  # (batch, seqlen_q, seqlen_k, heads, heads_k, headdim, causal, window_left, window_right)
        (2, 332, 461, 4, 2, d, False, -1, -1),
        (2, 332, 461, 4, 2, d, True, -1, -1),
        (2, 333, 461, 4, 2, d, False, -1, -1),
        (3, 255, 200, 2, 1, d, True, -1, -1),
        (1, 3, 50, 1, 1, d, False, -1, -1),  # (fewer rows in all than one statistics box's alignment)
        (1, 460, 333, 2, 2, d - 8, True, -1, -1),
        (2, 1000, 1000, 2, 1, d, False, -1, -1),
        (1, 700, 900, 3, 3, d, False, 100, 0),
        (1, 44, 300, 2, 2, d, False, 30, 17),
        (3, 64, 128, 2, 2, d, True, -1, -1),
        (2, 332, 461, 4, 4, d, False, -1, -1),  # without GQA: dK, dV staged in shared memory (a key tail)
    ]
    for b, sq, sk, h, hk, hd, causal, wl, wr in cases:
        q, k, v = make_qkv(b, sq, sk, h, hk, hd, dtype=dtype, device="cuda", requires_grad=True, generator=g)
        dout = torch.randn(b, sq, h, hd, device="cuda", dtype=dtype, generator=g)
        kw = dict(causal=causal, window_left=wl, window_right=wr)
        out = fa2.attention(q, k, v, **kw)
        names = cuda_kernel_names(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        assert any("bwd_ws_" in n for n in names), names
        grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        with switch("sm90_ws_backward", False):
            names_off = cuda_kernel_names(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
            grads_off = torch.autograd.grad(out, (q, k, v), dout)
        assert not any("bwd_ws_" in n for n in names_off), names_off
        grads_hi, grads_lo = reference_grads(
            lambda leaves, up: attention_ref(*leaves, **kw, upcast=up), (q, k, v), dout)
        case = f"{(b, sq, sk, h, hk, hd, causal, wl, wr)}"
        for name, g_ws, g_off, g_hi, g_lo in zip(("dq", "dk", "dv"), grads, grads_off, grads_hi, grads_lo):
            assert torch.isfinite(g_ws).all(), f"{name} {case}"
            assert_close_rule(f"ws {name} {case}", g_ws, g_hi, g_lo, factor=3)
            assert_close_rule(f"wgmma {name} {case}", g_off, g_hi, g_lo, factor=3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
def test_sm90_ws_backward_splits_its_last_wave(d, dtype):
    """Where the warp-specialized backward's grid ends in a partial wave (tiles = key blocks x heads x batch not a
    multiple of the SMs; no causal mask or window, no bias, no GQA), the last wave's tiles may each run as several CTAs
    over consecutive parts of the tile's query blocks (fa2/tile_order.h, tail_split; bwd_ws_kernel.cuh): a 1-D grid of
    the whole tiles then the pieces, as fa2.dev.bwd_tail_split_plan says; the pieces add their fp32 dK, dV into the
    workspace and the last of a tile's pieces stores the sums. By default (set_bwd_tail_split(-1)) only where a tile
    has the query blocks it was measured to pay at (bwd_tile_config.h, kTailSplitMinQueryBlocks: 4096 queries at d 64,
    8192 at d 128); with 1 wherever the cost model gains, as here on small shapes. Against 0 (one CTA per tile, a
    (key blocks, heads, batch) grid): dK and dV of the tiles that are not split bitwise equal, of the split ones and dQ
    (sums in another order) within a rounding; all follow the rule against the fp32 reference. Shapes: fewer tiles than
    SMs (every tile split), full waves then a partial one, query and key tails (the last key block's rows past seqlen_k
    in a split tile), seqlen_q != seqlen_k."""
    require_ws_backward(d)
    if not fa2.dev.environment_sets("bwd_tail_split"):
        assert fa2.dev.options()["bwd_tail_split"] == -1, "auto by default (FA2_BWD_TAIL_SPLIT unset)"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    block_n = 128  # (BwdWsTileConfig's keys per tile at d 64 / 128)
    min_queries = 4096 if d == 64 else 8192  # (kTailSplitMinQueryBlocks x kBlockM)
    # the default's threshold (a plan only: 4 tiles of 512 keys, fewer than the SMs)
    with switch("bwd_tail_split", -1):
        assert fa2.dev.bwd_tail_split_plan(1, 1, 1, min_queries, 512, d)[1] > 1
        assert fa2.dev.bwd_tail_split_plan(1, 1, 1, min_queries - 128, 512, d)[1] == 1
    with switch("bwd_tail_split", 1):
        assert fa2.dev.bwd_tail_split_plan(1, 1, 1, min_queries - 128, 512, d)[1] > 1
    g = torch.Generator(device="cuda").manual_seed(23)
    cases = [(1, 1000, 1000, 3), (2, 533, 461, 4), (1, 1037, 700, 5), (2, 1024, 520, sms // 10 + 6)]
    for b, sq, sk, h in cases:
        case = f"d {d} {(b, sq, sk, h)}"
        with switch("bwd_tail_split", -1):  # (below the default's threshold)
            assert fa2.dev.bwd_tail_split_plan(b, h, h, sq, sk, d)[1] == 1, case
        with switch("bwd_tail_split", 1):
            tiles, pieces, grid_tiles = fa2.dev.bwd_tail_split_plan(b, h, h, sq, sk, d)
        key_blocks = (sk + block_n - 1) // block_n
        assert pieces > 1 and 0 < tiles < sms and grid_tiles == key_blocks * h * b, (case, tiles, pieces, grid_tiles)
        q, k, v = make_qkv(b, sq, sk, h, h, d, dtype=dtype, device="cuda", requires_grad=True, generator=g)
        dout = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
        out = fa2.attention(q, k, v)

        def ws_grid():
            grids = cuda_kernel_grids(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
            ws = [grid for name, grid in grids if "bwd_ws_" in name]
            assert len(ws) == 1, (case, grids)
            return ws[0]

        with switch("bwd_tail_split", 1):
            assert ws_grid() == [grid_tiles - tiles + tiles * pieces, 1, 1], case
            grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        with switch("bwd_tail_split", 0):
            assert fa2.dev.bwd_tail_split_plan(b, h, h, sq, sk, d)[1] == 1
            assert ws_grid() == [key_blocks, h, b], case
            grads_off = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        # the split tiles' keys: tile t = key block + key_blocks (head + h batch), the last `tiles` of them
        t = torch.arange(grid_tiles, device="cuda").view(b, h, key_blocks)
        split_keys = (t >= grid_tiles - tiles).repeat_interleave(block_n, dim=2)[..., :sk].transpose(1, 2)  # (b, sk, h)
        grads_hi, grads_lo = reference_grads(lambda leaves, up: attention_ref(*leaves, upcast=up), (q, k, v), dout)
        for name, got, off, g_hi, g_lo in zip(("dq", "dk", "dv"), grads, grads_off, grads_hi, grads_lo):
            assert_close_rule(f"split {name} {case}", got, g_hi, g_lo, factor=3)
            assert_close_rule(f"unsplit {name} {case}", off, g_hi, g_lo, factor=3)
            tol = 2 ** -6 * off.float().abs().max().item()
            assert (got.float() - off.float()).abs().max().item() <= tol, (case, name)
            if name != "dq":
                assert bool(split_keys.any()) and not bool(split_keys.all()) or tiles == grid_tiles, case
                assert torch.equal(got[~split_keys], off[~split_keys]), (case, name, "tiles not split")
                assert not torch.equal(got[split_keys], torch.zeros_like(got[split_keys])), (case, name)


def _ws_backward_grid_and_peak(out, inputs, dout, mode, accumulate=True):
    """With fa2.dev option bwd_gqa_grouping(mode) and set_bwd_gqa_accumulate(accumulate): the gradients of one backward,
    the grid of its warp-specialized kernel (None where another ran) and the backward's peak memory above what was
    allocated before it."""
    with switch("bwd_gqa_grouping", mode), switch("bwd_gqa_accumulate", accumulate):
        grids = cuda_kernel_grids(lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True))
        torch.cuda.synchronize()
        # (the bytes requested, not the blocks handed out: a cached block larger than a request by less than the
        # allocator splits off counts whole, and segments that earlier tests' live tensors keep can hold such
        # blocks, so that the allocated peak depended on the tests run before: up to ~10 MB in the full suite)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_stats()["requested_bytes.all.current"]
        grads = torch.autograd.grad(out, inputs, dout, retain_graph=True)
        torch.cuda.synchronize()
        peak = torch.cuda.memory_stats()["requested_bytes.all.peak"] - base
    ws = [grid for name, grid in grids if "bwd_ws_" in name]
    return grads, (ws[0] if ws else None), peak


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", WS_BACKWARD_HEADDIMS)
def test_sm90_ws_backward_sums_gqa_groups_in_its_ctas(d, dtype):
    """GQA / MQA on the warp-specialized backward. With set_bwd_gqa_grouping(1) each CTA takes a (key block, kv
    head) and runs the query blocks of its group's heads one after another (bwd_ws_kernel.cuh, and at d 256
    bwd_ws_dsplit_kernel.cuh, whose warpgroup 1 adds its dQ a step late: across a head change the previous head's;
    ws_groups_gqa): its grid has nheads_k heads, dK and dV are summed in its registers and stored like k, and the
    backward allocates no fp32 partials per query head (its peak memory is below the partials' by at least 90% of their
    2 B Sk H d 4 bytes). With 0, or with a bias that differs per head either way, the grid has nheads heads, and each
    query head's CTAs add their dK, dV into fp32 accumulators per kv head (set_bwd_gqa_accumulate(True), the default:
    GqaDkv::kAccumulate, red.global.add; peak memory below the partials' by 90% of the difference, 2 B Sk (H - Hk) d 4
    bytes) or store fp32 partials per query head (False). All three follow the rule
    against the fp32 reference on: ratios 2 / 3 / 4 / 8 / 16 and MQA, query / key tails, causal with more queries than
    keys, a sliding window (key blocks no query sees), headdims below the instance's (d - 8, and d - 4: padded by the
    glue), q / k / v as transposed views of (B, H, S, D) storage, few query rows (1 and 5: the
    statistics boxes and dQ rows span heads), a padding mask shared by the heads ((B, 1, 1, Sk): the key-row bias
    variant, a whole padded key block) and a bias per head ((B, H, 1, Sk))."""
    require_ws_backward(d)
    g = torch.Generator(device="cuda").manual_seed(11)
    cases = [  # (batch, seqlen_q, seqlen_k, heads, heads_k, headdim, causal, window_left, window_right, bias)
        (2, 332, 461, 4, 2, d, False, -1, -1, None),
        (2, 332, 461, 8, 2, d, True, -1, -1, None),
        (1, 700, 900, 8, 1, d, False, 100, 0, None),
        (3, 255, 200, 6, 2, d, True, -1, -1, None),
        (3, 5, 300, 8, 1, d, False, -1, -1, None),
        (1, 1, 129, 16, 1, d, False, -1, -1, None),
        (1, 460, 333, 4, 2, d - 8, True, -1, -1, None),
        (2, 261, 656, 8, 2, d, False, -1, -1, "shared"),
        (2, 261, 656, 8, 1, d, True, -1, -1, "shared"),
        (2, 200, 300, 4, 2, d, False, -1, -1, "per_head"),
        (2, 300, 400, 8, 2, d - 4, False, -1, -1, None),  # (headdim padded by the glue: dK, dV narrowed after)
        (2, 300, 400, 8, 2, d, True, -1, -1, None, "bhsd"),  # (transposed (B, H, S, D) storage: dK, dV by strides)
    ]
    for b, sq, sk, h, hk, hd, causal, wl, wr, bias_kind, *layout in cases:
        q, k, v = make_qkv(b, sq, sk, h, hk, hd, dtype=dtype, device="cuda", requires_grad=True, generator=g,
                           layout=layout[0] if layout else "bshd")
        dout = torch.randn(b, sq, h, hd, device="cuda", dtype=dtype, generator=g)
        bias = None
        if bias_kind is not None:
            shape = (b, 1, 1, sk) if bias_kind == "shared" else (b, h, 1, sk)
            keep = torch.rand(shape, device="cuda", generator=g) > 0.2
            keep[..., :8] = True          # (every row sees a key: the reference has no NaN rows)
            keep[..., 128:256] = False    # a whole key block of the kernel
            bias = torch.randn(shape, device="cuda", generator=g).to(dtype).masked_fill(~keep, float("-inf"))
        kw = dict(causal=causal, window_left=wl, window_right=wr)
        out = fa2.attention(q, k, v, bias, **kw)
        case = f"{(b, sq, sk, h, hk, hd, causal, wl, wr, bias_kind, *layout)}"
        grads_1, grid_1, peak_1 = _ws_backward_grid_and_peak(out, (q, k, v), dout, 1)
        grads_a, grid_a, peak_a = _ws_backward_grid_and_peak(out, (q, k, v), dout, 0, accumulate=True)
        grads_0, grid_0, peak_0 = _ws_backward_grid_and_peak(out, (q, k, v), dout, 0, accumulate=False)
        assert grid_1 is not None and grid_a is not None and grid_0 is not None, case
        partials = 2 * b * sk * h * (-(-hd // 8) * 8) * 4
        accumulators = partials // h * hk
        assert grid_0[1] == h and grid_a[1] == h, (case, grid_0, grid_a)
        assert peak_a + 0.9 * (partials - accumulators) <= peak_0, (case, peak_a, peak_0, partials)
        if bias_kind != "per_head":
            assert grid_1[1] == hk, (case, grid_1)
            assert peak_1 + 0.9 * partials <= peak_0, (case, peak_1, peak_0, partials)
        else:
            assert grid_1[1] == h, (case, grid_1)

        def reference(leaves, up):  # (the fp32 reference with the bias upcast)
            return attention_ref(*leaves, bias.float() if up and bias is not None else bias, **kw, upcast=up)
        grads_hi, grads_lo = reference_grads(reference, (q, k, v), dout)
        for name, g_1, g_a, g_0, g_hi, g_lo in zip(("dq", "dk", "dv"), grads_1, grads_a, grads_0, grads_hi, grads_lo):
            assert torch.isfinite(g_1).all() and torch.isfinite(g_a).all(), f"{name} {case}"
            assert_close_rule(f"grouped {name} {case}", g_1, g_hi, g_lo, factor=3)
            assert_close_rule(f"accumulated {name} {case}", g_a, g_hi, g_lo, factor=3)
            assert_close_rule(f"partials {name} {case}", g_0, g_hi, g_lo, factor=3)


def test_gqa_backward_groups_by_default_where_the_grouped_grid_fills_the_gpu():
    """By default (bwd_gqa_grouping -1) a GQA backward at d 128 sums each group in its CTAs where the grouped grid
    (ceil(seqlen_k / 128) x nheads_k x batch CTAs) still fills the GPU (bwd_tile_config.h): without a causal mask its
    waves at least 95% full (CTAs / (waves x SMs), kBwdGqaGroupMinWaveFill), with one at least 6 CTAs per SM
    (kBwdGqaGroupMinWavesCausal); elsewhere one CTA per query head, adding into fp32 accumulators per kv head (by
    default; its peak memory then that of set_bwd_gqa_accumulate(True), below the partials'). The cases cover both outcomes
    on an H100 / H200 (132 SMs): 256 CTAs in two 97% full waves, 18 CTAs, causal 1024 and 256 CTAs."""
    require_ws_backward(128)
    assert fa2.dev.options()["bwd_gqa_grouping"] == -1
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = [(2, 2048, 32, 8, False), (1, 2304, 16, 1, False), (4, 4096, 32, 8, True), (2, 2048, 32, 8, True)]
    outcomes = []
    for b, s, h, hk, causal in cases:
        ctas = b * -(-s // 128) * hk
        waves = -(-ctas // sms)
        grouped = ctas >= 6 * sms if causal else ctas >= 0.95 * waves * sms
        outcomes.append(grouped)
        q, k, v = make_qkv(b, s, s, h, hk, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        dout = torch.randn_like(q)
        out = fa2.attention(q, k, v, causal=causal)
        grads, grid, peak = _ws_backward_grid_and_peak(out, (q, k, v), dout, -1)
        grads_0, _, peak_0 = _ws_backward_grid_and_peak(out, (q, k, v), dout, 0, accumulate=False)
        _, _, peak_a = _ws_backward_grid_and_peak(out, (q, k, v), dout, 0, accumulate=True)
        case = (b, s, h, hk, causal, ctas, sms)
        assert grid[1] == (hk if grouped else h), (case, grid)
        partials = 2 * b * s * h * 128 * 4
        accumulators = partials // h * hk
        if grouped:
            assert peak + 0.9 * partials <= peak_0, (case, peak, peak_0, partials)
        else:
            assert abs(peak - peak_a) < 0.1 * partials, (case, peak, peak_a, partials)
            assert peak + 0.9 * (partials - accumulators) <= peak_0, (case, peak, peak_0, partials)
        for name, g_auto, g_0 in zip(("dq", "dk", "dv"), grads, grads_0):
            # (the two differ in the order of fp32 sums only, then one rounding to bf16: dK / dV's over the group, dQ's
            # reduce-adds, whose order no two runs share)
            tol = dict(rtol=2 ** -7, atol=1e-3 * g_0.abs().max().item())
            torch.testing.assert_close(g_auto.float(), g_0.float(), **tol, msg=f"{name} {case}")
    if sms == 132:
        assert outcomes == [True, False, True, False]


@pytest.mark.parametrize("programmatic_main", [False, True])
@pytest.mark.parametrize("gqa_grouping", [-1, 1])
@pytest.mark.parametrize("d", WS_BACKWARD_HEADDIMS)
def test_sm90_ws_backward_dq_conversion_overlapping_the_main_kernel_waits_for_each_head(d, gqa_grouping,
                                                                                       programmatic_main):
    """Behind the warp-specialized backward, at the headdims that take it (sm90_ws_backward_dq_overlap_headdims:
    bwd_tile_config.h, kOverlapDqConversion), the dQ conversion is a programmatic dependent launch: it may start while
    the main kernel's last CTAs run, and converts a head's rows once every main-kernel CTA of that head has counted
    itself finished (ws_key_block_done; bwd_launch_template.cuh). The gradients follow the rule where a conversion
    CTA's rows span several heads (seqlen_q 1, 5, 17 with 8 heads, 3 batches; GQA), where some main-kernel CTAs have
    no query block (a window) or every key padded (they count too), and on a grid of several waves (4 x 16 heads x 1k:
    512 CTAs at d 128), where the conversion is seen to start before the main kernel ends (torch.profiler's spans; at
    the other headdims after it), as do those of the deterministic mode's kernels (conversion after them). With
    gqa_grouping 1 the GQA cases' CTAs each sum their group (ws_groups_gqa) and count every query head of it. With
    option bwd_programmatic_main the main kernel itself is the preprocess's programmatic dependent (it may start before
    the preprocess has zeroed dq_accum and the counts, and waits for it: ws_start), the same rule."""
    require_ws_backward(d)
    overlap_dims = fa2.dev.tuning_tables()["sm90_ws_backward_dq_overlap_headdims"]
    assert overlap_dims == [128], overlap_dims  # (what was measured to pay: bwd_tile_config.h)
    g = torch.Generator(device="cuda").manual_seed(11)
    cases = [  # (batch, seqlen_q, seqlen_k, heads, heads_k, causal, window_left, window_right, padded keys)
        (3, 1, 300, 8, 8, False, -1, -1, None),
        (3, 5, 300, 8, 2, True, -1, -1, None),     # (causal)
        (3, 17, 40, 8, 4, False, -1, -1, None),
        (2, 200, 700, 8, 8, False, 60, 0, None),   # (a window: key blocks no query sees)
        (2, 130, 520, 4, 4, False, -1, -1, (128, 384)),  # (every key of key blocks 1-2 padded)
        (4, 1024, 1024, 16, 16, False, -1, -1, None),
    ]
    with switch("bwd_gqa_grouping", gqa_grouping), switch("bwd_programmatic_main", programmatic_main):
        for b, sq, sk, h, hk, causal, wl, wr, padded in cases:
            q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=torch.bfloat16, device="cuda", requires_grad=True,
                               generator=g)
            dout = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
            bias = None
            if padded is not None:
                bias = torch.ones(b, 1, 1, sk, device="cuda", dtype=torch.bool)
                bias[..., padded[0]:padded[1]] = False
            kw = dict(attn_bias=bias, causal=causal, window_left=wl, window_right=wr)
            case = f"{(b, sq, sk, h, hk, d, causal, wl, wr, padded)}"
            out = fa2.attention(q, k, v, **kw)
            grads = []  # (of the profiled backward: the one whose overlap is checked)
            spans = cuda_kernel_spans(
                lambda: grads.extend(torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)))
            main = [s for s in spans if "bwd_ws_" in s[0]]
            convert = [s for s in spans if "bwd_convert_dq_kernel" in s[0]]
            assert len(main) == 1 and len(convert) == 1, (case, [s[0] for s in spans])
            if d not in overlap_dims:
                ended = f"{case}: the conversion started before the main kernel ended {spans}"
                assert convert[0][1] >= main[0][2] - 1.0, ended
            elif b * h * sq * sk >= 4 * 16 * 1024 * 1024:  # (several waves of main-kernel CTAs)
                assert convert[0][1] < main[0][2], f"{case}: the conversion started after the main kernel's end {spans}"
            with fa2.deterministic():
                grads_after = torch.autograd.grad(out, (q, k, v), dout)
            grads_hi, grads_lo = reference_grads(
                lambda leaves, up: attention_ref(*leaves, **kw, upcast=up), (q, k, v), dout)
            for name, g_ws, g_after, g_hi, g_lo in zip(("dq", "dk", "dv"), grads, grads_after, grads_hi, grads_lo):
                assert torch.isfinite(g_ws).all(), f"{name} {case}"
                assert_close_rule(f"overlapped {name} {case}", g_ws, g_hi, g_lo, factor=3)
                assert_close_rule(f"after {name} {case}", g_after, g_hi, g_lo, factor=3)


@pytest.mark.parametrize("d", WS_BACKWARD_HEADDIMS)
def test_sm90_ws_backward_programmatic_main_kernel(d):
    """Option bwd_programmatic_main on every path of the warp-specialized backward whose kernel it launches as the
    preprocess's dependent (that kernel may start before dq_accum, D, the counts and the tail split's sums are zeroed
    or written, and waits for them): plain and causal, the tail split forced (bwd_tail_split 1), GQA with fp32
    accumulators and in-kernel groups, varlen, and dropout (d 64 / 128: option sm90_ws_dropout). Gradients within the
    rule (dropout: equal to the option off, same seed, up to the fp32 reduce-adds' order), the plan names it."""
    require_ws_backward(d)
    g = torch.Generator(device="cuda").manual_seed(17)
    cases = [  # (batch, seqlen, heads, heads_k, causal, options)
        (2, 1000, 8, 8, False, {}),
        (2, 777, 8, 8, True, {}),
        (8, 1024, 16, 16, False, {"bwd_tail_split": 1}),
        (1, 2048, 16, 2, False, {"bwd_gqa_grouping": 0}),
        (4, 512, 16, 4, True, {"bwd_gqa_grouping": 1}),
    ]
    with switch("bwd_programmatic_main", True):
        plan = fa2.dev.plan("bwd", batch=2, nheads=8, seqlen_q=1000, headdim=d)
        assert plan["programmatic_main"] == "yes" and "bwd_ws_" in plan["kernel"], plan
        for b, s, h, hk, causal, options in cases:
            q, k, v = make_qkv(b, s, s, h, hk, d, dtype=torch.bfloat16, device="cuda", requires_grad=True, generator=g)
            dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
            with fa2.dev.options_override(**options):
                grads = torch.autograd.grad(fa2.attention(q, k, v, causal=causal), (q, k, v), dout)
            grads_hi, grads_lo = reference_grads(
                lambda leaves, up: attention_ref(*leaves, causal=causal, upcast=up), (q, k, v), dout)
            case = f"{(b, s, h, hk, d, causal, options)}"
            for name, got, hi, lo in zip(("dq", "dk", "dv"), grads, grads_hi, grads_lo):
                assert_close_rule(f"programmatic main {name} {case}", got, hi, lo, factor=3)
        # varlen: the packed sequences' kernel
        lengths = [300, 1, 0, 1024, 77]
        cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device="cuda")
        q, k, v = (torch.randn(sum(lengths), 8, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                   for _ in range(3))
        dout = torch.randn_like(q)
        runs = []
        for on in (True, False):
            with switch("bwd_programmatic_main", on):
                out = fa2.varlen_attention(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
                runs.append(torch.autograd.grad(out, (q, k, v), dout))
        for name, a, b_ in zip(("dq", "dk", "dv"), *runs):
            torch.testing.assert_close(a, b_, atol=2e-2, rtol=2e-2, msg=f"varlen {name}: option on / off")
        # dropout (the ws dropout backward at d 64 / 128): the same keep mask under one seed, on and off
        if d in (64, 128):
            q, k, v = make_qkv(4, 1024, 1024, 8, 8, d, dtype=torch.bfloat16, device="cuda", requires_grad=True,
                               generator=g)
            dout = torch.randn_like(q)
            runs = []
            for on in (True, False):
                with switch("bwd_programmatic_main", on):
                    torch.manual_seed(5)
                    out = fa2.attention(q, k, v, dropout_p=0.1)
                    runs.append(torch.autograd.grad(out, (q, k, v), dout))
            for name, a, b_ in zip(("dq", "dk", "dv"), *runs):
                torch.testing.assert_close(a, b_, atol=2e-2, rtol=2e-2, msg=f"dropout {name}: option on / off")


@pytest.mark.parametrize("hk", [2, 4])
@pytest.mark.parametrize("kind", ["bool", "same", "fp32"])
@pytest.mark.parametrize("d", WS_BACKWARD_HEADDIMS)
def test_sm90_ws_backward_padding_mask_follows_the_rule(d, kind, hk):
    """A key-row bias (padding masks; no dbias) on the warp-specialized backward (bwd_ws_kernel.cuh, kKeyBias): P
    against bwd_row_stats_kernel's statistics, each thread's keys' bias in registers, key blocks whose every key is
    padded skipped. Gradients follow the rule against the fp32 reference and agree with bwd_kernel.cuh's key-row
    variant (set_sm90_ws_backward(False)), causal or not, with a whole padded key block (keys 128-255), a padded tail,
    scattered padding, finite bias values ("same" / "fp32"), GQA and not (hk 4: dK, dV staged in shared memory); a
    batch whose every key is padded gets zero gradients from both."""
    require_ws_backward(d)
    if not fa2.dev.options()["key_bias_backward"]:
        pytest.skip("the key-row bias variant is switched off (FA2_DISABLE_KEY_BIAS_BWD)")
    g = torch.Generator(device="cuda").manual_seed(7)
    b, sq, sk, h = 3, 261, 700, 4  # (seqlen_q odd: the statistics' boxes start below the block)
    keep = torch.rand(b, 1, 1, sk, device="cuda", generator=g) > 0.3
    keep[0, ..., :] = True
    keep[0, ..., 128:256] = False  # a whole key block of the kernel
    keep[0, ..., 600:] = False     # and the tail
    keep[2] = False                # every key of the last batch
    if kind == "bool":
        bias = keep
    else:
        dtype = torch.bfloat16 if kind == "same" else torch.float32
        bias = (torch.randn(b, 1, 1, sk, device="cuda", generator=g) * 2).to(dtype).masked_fill(~keep, float("-inf"))
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=torch.bfloat16, device="cuda", requires_grad=True, generator=g)
    dout = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    for causal in (False, True):
        out = fa2.attention(q, k, v, attn_bias=bias, causal=causal)
        names = cuda_kernel_names(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        assert any(is_ws_key_row_kernel(n) for n in names), names
        grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        with switch("sm90_ws_backward", False):
            grads_off = torch.autograd.grad(out, (q, k, v), dout)
        for name, g_ws, g_off in zip(("dq", "dk", "dv"), grads, grads_off):
            assert torch.isfinite(g_ws).all(), name
            assert torch.equal(g_ws[2], torch.zeros_like(g_ws[2])), f"{name}: the all-padded batch"
            assert torch.equal(g_off[2], torch.zeros_like(g_off[2])), f"{name}: the all-padded batch (wgmma)"
        # the reference on the batches that see keys (a row with none is NaN there)
        sub = [t[:2].detach() for t in (q, k, v)]
        ref_bias = bias[:2] if kind == "bool" else bias[:2].float()
        leaf_hi = [t.float().requires_grad_() for t in sub]
        grads_hi = torch.autograd.grad(attention_ref(*leaf_hi, ref_bias, causal=causal), leaf_hi, dout[:2].float())
        leaf_lo = [t.clone().requires_grad_() for t in sub]
        lo_bias = bias[:2] if kind == "bool" else bias[:2].to(torch.bfloat16)
        grads_lo = torch.autograd.grad(attention_ref(*leaf_lo, lo_bias, causal=causal, upcast=False), leaf_lo, dout[:2])
        for name, g_ws, g_off, g_hi, g_lo in zip(("dq", "dk", "dv"), grads, grads_off, grads_hi, grads_lo):
            assert_close_rule(f"ws {name} {kind} causal {causal}", g_ws[:2], g_hi, g_lo, factor=3)
            assert_close_rule(f"wgmma {name} {kind} causal {causal}", g_off[:2], g_hi, g_lo, factor=3)


@pytest.mark.parametrize("d", WS_BACKWARD_HEADDIMS)
def test_sm90_ws_backward_is_not_used_where_it_does_not_apply(d):
    """Deterministic mode, softcap, a general (per query and key) bias and a broadcast
    (stride-0) dout keep bwd_kernel.cuh's kernels (and stay correct: the other tests run them); the warp-specialized
    one takes the plain path and its key-row bias variant, not deterministic, with TMA-addressable tensors."""
    if f"bwd_bf16_hdim{d}_sm90a" not in fa2._C.build_info()["kernels"]:
        pytest.skip(f"this build has no sm_90a backward for headdim {d} (FA2_HEADDIMS)")
    q, k, v = make_qkv(1, 256, 256, 2, 2, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    dout = torch.randn_like(q)
    bias = torch.randn(1, 2, 256, 256, device="cuda", dtype=torch.bfloat16)
    calls = [("softcap", (q, k, v), lambda: fa2.attention(q, k, v, softcap=5.0)),
             ("bias", (q, k, v), lambda: fa2.attention(q, k, v, attn_bias=bias))]
    for what, inputs, fn in calls:
        out = fn()
        names = cuda_kernel_names(lambda: torch.autograd.grad(out, inputs, torch.randn_like(out)))
        assert any("bwd_kernel<" in n for n in names) and not any("bwd_ws_" in n for n in names), (what, names)
    with fa2.deterministic():
        out = fa2.attention(q, k, v)
        names = cuda_kernel_names(lambda: torch.autograd.grad(out, (q, k, v), dout))
    assert any("bwd_kernel<" in n for n in names) and not any("bwd_ws_" in n for n in names), names
    # a broadcast dout (head stride 0: the gradient of out.sum(dim=2)), which the TMA cannot address: the wgmma
    # kernel, with the gradients of the same values made contiguous (which the warp-specialized one takes)
    out = fa2.attention(q, k, v)
    dout_b = torch.randn(1, 256, 1, d, device="cuda", dtype=torch.bfloat16).expand(1, 256, 2, d)
    names = cuda_kernel_names(lambda: torch.autograd.grad(out, (q, k, v), dout_b, retain_graph=True))
    assert any("bwd_kernel<" in n for n in names) and not any("bwd_ws_" in n for n in names), names
    grads_b = torch.autograd.grad(out, (q, k, v), dout_b, retain_graph=True)
    grads_c = torch.autograd.grad(out, (q, k, v), dout_b.contiguous())
    for g_b, g_c in zip(grads_b, grads_c):
        torch.testing.assert_close(g_b, g_c, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("schedule", ["auto", "ws"])
@pytest.mark.parametrize("kind", ["same", "fp32", "bool"])
@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
def test_padding_tiles_skipped_or_unbiased_give_the_materialized_result(d, kind, schedule):
    """A key-row bias staged by the TMA (aligned rows): key tiles whose bias is all 0 run as unbiased ones, tiles whose
    bias is all -inf (bool False) are skipped (warp-specialized kernels and headdims above 64; fwd_kernel.cuh,
    KeyTileKind), the rest start S from the bias. Bitwise the same out and lse as the same values materialized as a
    (B, H, Sq, Sk) bias (which reads every tile), with whole tiles of each kind at the start, the middle and the end
    of the key range, a batch whose every key is padded (out 0, lse +inf) and one with no padding, causal or not.
    "ws" forced: the wide warp-specialized kernel at d 64 (the other headdims keep their default)."""
    b, sq, sk, h, hk = 3, 200, 1008, 4, 2  # 1008 keys: 16-byte aligned rows for every bias dtype
    g = torch.Generator(device="cuda").manual_seed(11)
    dtype = torch.bfloat16
    bias_dtype = torch.bool if kind == "bool" else (dtype if kind == "same" else torch.float32)
    keep = torch.ones(b, 1, 1, sk, dtype=torch.bool, device="cuda")
    keep[0, ..., 128:256] = False  # a padded tile in the middle
    keep[0, ..., 640:] = False     # and the tail
    keep[1] = False                # every key padded
    if kind == "bool":
        row = keep.clone()
        row[0, ..., 256:384] = torch.rand(1, 1, 128, device="cuda", generator=g) > 0.3  # a mixed tile
    else:
        row = torch.zeros(b, 1, 1, sk, device="cuda", dtype=bias_dtype).masked_fill(~keep, float("-inf"))
        row[0, ..., 256:384] = torch.randn(1, 1, 128, device="cuda", generator=g).to(bias_dtype)  # a mixed tile
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype=dtype, device="cuda", generator=g)
    want = KERNEL_SUFFIX["ws" if schedule == "ws" and d <= 64 else fa2.dev.sm90_key_bias_schedule(d)]
    for causal in (False, True):
        args = lambda bias: (q, k, v, bias, None, causal, -1, -1, 0.0)
        with switch("sm90_schedule", schedule):
            names = cuda_kernel_names(lambda: torch.ops.fa2.fwd(*args(row.expand(b, h, sq, sk))))
            out, lse = torch.ops.fa2.fwd(*args(row.expand(b, h, sq, sk)))
        assert any("fwd_kernel<" in n and ", 901, (fa2::fwd::ScoreMode)3," in n and want in n for n in names), names
        out_m, lse_m = torch.ops.fa2.fwd(*args(row.expand(b, h, sq, sk).contiguous()))
        assert torch.equal(out, out_m), f"causal {causal}: max diff {(out.float() - out_m.float()).abs().max().item()}"
        assert torch.equal(lse, lse_m), f"causal {causal}: lse differs"
        assert torch.equal(out[1], torch.zeros_like(out[1])) and bool(torch.isinf(lse[1]).all())
    # one batch: any key count keeps the rows aligned, so the last tile's valid keys can end inside a lane's bytes
    # of the vote (1001 keys); the keys from 640 on padded
    row1 = row[:1, ..., :1001].clone()
    row1[..., 640:] = False if kind == "bool" else float("-inf")
    q1, k1, v1 = q[:1], k[:1, :1001], v[:1, :1001]
    with switch("sm90_schedule", schedule):
        out, lse = torch.ops.fa2.fwd(q1, k1, v1, row1.expand(1, h, sq, 1001), None, False, -1, -1, 0.0)
    out_m, lse_m = torch.ops.fa2.fwd(q1, k1, v1, row1.expand(1, h, sq, 1001).contiguous(), None, False, -1, -1, 0.0)
    assert torch.equal(out, out_m) and torch.equal(lse, lse_m), "1001 keys"


@pytest.mark.parametrize("kind", ["same", "bool"])
def test_padding_tiles_long_key_rows_take_the_wide_kernel_at_d64(kind):
    """At d 64 a key-row bias over at least kWideKeyBiasMinKeys (8192) keys runs the wide warp-specialized kernel by
    default (tile_config.h: it skips whole -inf tiles, the 128-register pipelined kernel cannot), fewer keys the
    pipelined one, and a forced "pipelined" schedule keeps it: the kernel that ran, and out / lse bitwise those of the
    same bias materialized, with padded tiles at the end and a batch whose keys are all padded. (8176 keys: rows still
    16-byte aligned for a bool bias, which the TMA staging needs; at 8184 a bool bias takes the general bias path.)
    d 32 (not measured) keeps the pipelined kernel."""
    b, sq, h = 2, 130, 2
    g = torch.Generator(device="cuda").manual_seed(5)
    for d, sk, schedule, want in [(64, 8192, "auto", "ws"), (64, 8176, "auto", "pipelined"),
                                  (64, 8192, "pipelined", "pipelined"), (32, 8192, "auto", "pipelined")]:
        q, k, v = make_qkv(b, sq, sk, h, h, d, dtype=torch.bfloat16, device="cuda", generator=g)
        keep = torch.ones(b, 1, 1, sk, dtype=torch.bool, device="cuda")
        keep[0, ..., sk - 1000:] = False
        keep[1] = False
        row = keep if kind == "bool" else torch.zeros(b, 1, 1, sk, device="cuda", dtype=torch.bfloat16).masked_fill(
            ~keep, float("-inf"))
        args = lambda bias: (q, k, v, bias, None, False, -1, -1, 0.0)
        with switch("sm90_schedule", schedule):
            names = cuda_kernel_names(lambda: torch.ops.fa2.fwd(*args(row.expand(b, h, sq, sk))))
            out, lse = torch.ops.fa2.fwd(*args(row.expand(b, h, sq, sk)))
        assert any("fwd_kernel<" in n and ", 901, (fa2::fwd::ScoreMode)3," in n and KERNEL_SUFFIX[want] in n
                   for n in names), (d, sk, schedule, names)
        out_m, lse_m = torch.ops.fa2.fwd(*args(row.expand(b, h, sq, sk).contiguous()))
        assert torch.equal(out, out_m) and torch.equal(lse, lse_m), (d, sk, schedule)
        assert torch.equal(out[1], torch.zeros_like(out[1])) and bool(torch.isinf(lse[1]).all())


@pytest.mark.parametrize("d", [64, 128])
def test_padding_tiles_heavy_rows_stay_heavy_on_later_tiles(d):
    """A row made heavy by one key tile (its visible keys all at the bias dtype's minimum, as Hugging Face pads) must
    stay on the heavy-row update for the tiles after it, even where those hold no such bias (the pipelined d 64 kernel
    decides per tile which update a tile needs): with scale 1 (scale * log2(e) > 1) the ordinary update of a heavy max
    gives NaN. Keys are visited from the last tile down: 256.. (finfo.min: rows heavy), 128.. (-inf, not skipped at
    d 64), 0.. (bias 0: the rows' real keys). out and lse bitwise those of the same bias materialized, and within the
    rule against the fp32 reference."""
    b, sq, sk, h = 2, 100, 384, 2
    g = torch.Generator(device="cuda").manual_seed(13)
    q, k, v = make_qkv(b, sq, sk, h, h, d, dtype=torch.bfloat16, device="cuda", generator=g)
    row = torch.zeros(b, 1, 1, sk, device="cuda", dtype=torch.bfloat16)
    row[..., 128:256] = float("-inf")
    row[..., 256:] = torch.finfo(torch.bfloat16).min
    row[1, ..., :128] = torch.finfo(torch.bfloat16).min  # batch 1: every visible key at the minimum (uniform)
    args = lambda bias: (q, k, v, bias, 1.0, False, -1, -1, 0.0)
    out, lse = torch.ops.fa2.fwd(*args(row.expand(b, h, sq, sk)))
    out_m, lse_m = torch.ops.fa2.fwd(*args(row.expand(b, h, sq, sk).contiguous()))
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert torch.equal(out, out_m) and torch.equal(lse, lse_m)
    ref_hi = attention_ref(q.float(), k.float(), v.float(), row.float(), scale=1.0)
    ref_lo = attention_ref(q, k, v, row, scale=1.0, upcast=False)
    assert_close_rule(f"out d {d}", out, ref_hi, ref_lo, 2)


@pytest.mark.parametrize("d", [128, 192, 256])
def test_sm90_forward_at_key_tile_edges_follows_the_rule(d):
    """Key counts around the forward's key tile (128 keys at d 128, 96 at d 192, 80 at d 256: tile_config.h) and its
    multiples, with few and many queries, plain, causal (bottom-right), a window and a padding mask whose rows end
    mid-tile: out within the rule against the fp32 reference, every schedule's default kernel (no tile is assumed a
    power of two)."""
    g = torch.Generator(device="cuda").manual_seed(5)
    dtype = torch.bfloat16
    tile = {128: 128, 192: 96, 256: 80}[d]
    for sk in (1, tile - 1, tile, tile + 1, 2 * tile + 1, 3 * tile - 1):
        for sq in (1, 77, 130):
            q, k, v = make_qkv(2, sq, sk, 2, 1, d, dtype=dtype, device="cuda", generator=g)
            pad = torch.zeros(2, 1, 1, sk, dtype=dtype, device="cuda")
            pad[1, ..., max(1, sk - tile // 2):] = float("-inf")  # batch 1: the last half tile of keys padded
            for mask in ("none", "causal", "window", "padding"):
                kw = dict(causal=mask == "causal", window_left=33 if mask == "window" else -1,
                          window_right=7 if mask == "window" else -1)
                bias = pad.expand(2, 2, sq, sk) if mask == "padding" else None
                out, _ = torch.ops.fa2.fwd(q, k, v, bias, None, kw["causal"], kw["window_left"], kw["window_right"],
                                           0.0)
                up = None if bias is None else bias.float()
                ref_hi = attention_ref(q.float(), k.float(), v.float(), up, **kw)
                ref_naive = attention_ref(q, k, v, bias, upcast=False, **kw)
                assert_close_rule(f"d {d} sq {sq} sk {sk} {mask}", out, ref_hi, ref_naive, factor=2)
