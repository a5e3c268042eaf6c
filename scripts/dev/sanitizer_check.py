"""A small grid of fa2 CUDA forward+backward calls for compute-sanitizer (memcheck / racecheck / initcheck):
   python scripts/dev/sanitizer_check.py --tools memcheck,racecheck     # re-runs itself under each tool
   compute-sanitizer --tool memcheck python scripts/dev/sanitizer_check.py
Sizes are small (the tools slow kernels down 10-100x) but cover tails, every flag, GQA, bias, odd headdims.
FA2_SANITIZER_CASES="i,j": only those cases of CASES (indices)."""
import os
import subprocess
import sys

if len(sys.argv) > 2 and sys.argv[1] == "--tools":
    status = 0
    for tool in sys.argv[2].split(","):
        cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "1", sys.executable, os.path.abspath(__file__)]
        print("==", " ".join(cmd), flush=True)
        status |= subprocess.run(cmd).returncode
    sys.exit(status)

import torch  # noqa: E402

import fa2  # noqa: E402

CASES = [
    dict(shape=(1, 97, 131, 2, 1, 64), flags=dict(causal=True)),
    dict(shape=(2, 65, 65, 2, 2, 128), flags=dict(window_left=16, window_right=3)),
    dict(shape=(1, 33, 77, 4, 2, 59), flags=dict(softcap=5.0), bias=(1, 1, 1, 77)),
    dict(shape=(1, 70, 50, 2, 2, 256), flags=dict(causal=True), bias=(1, 2, 70, 50)),
    dict(shape=(1, 1, 200, 2, 2, 96), flags={}),
    dict(shape=(1, 129, 129, 2, 2, 32), flags=dict(causal=True), bool_bias=True),
    # plain, many key tiles (the sm_90a stage ring wraps: the warp-specialized producer waits on released stages)
    dict(shape=(1, 300, 1100, 2, 1, 128), flags={}),
    dict(shape=(1, 130, 700, 2, 1, 256), flags={}),  # d 256: two stages, 80-key tiles (K, V split: ping-pong-overlap)
    dict(shape=(1, 130, 700, 2, 1, 192), flags=dict(causal=True)),  # d 192: the same with 96-key tiles
    dict(shape=(1, 400, 700, 2, 1, 64), flags={}),  # d 64: six key tiles (the wide warp-specialized ring wraps)
    # d 128 without a mask in clusters of two (an even number of query blocks a head: the pair's CTAs multicast K/V
    # into each other's ring and release its stages to both; with FA2_DEV_OPTIONS=persistent_forward_ctas=3, one pair of CTAs
    # taking every block, the ring's phases carried across blocks)
    dict(shape=(2, 256, 1100, 2, 1, 128), flags={}),
    # bottom-right causal with seqlen_q > seqlen_k: whole query blocks see no key (the kernels' early exit)
    dict(shape=(1, 300, 20, 2, 2, 64), flags=dict(causal=True)),
    # the same at d 128: with FA2_DEV_OPTIONS=persistent_forward_ctas=3 (gpu_validate's persistent sanitizer steps) the tile-counter
    # forward, CTAs 1 and 2 starting on blocks without keys
    dict(shape=(2, 600, 100, 2, 2, 128), flags=dict(causal=True)),
    # key-row biases with 16-byte aligned rows: loaded into the K/V stages by the TMA on sm_90a (pipelined at d 64, the
    # warp-specialized defaults at d 128 / 256), the tile that crosses seqlen_k read from global memory
    dict(shape=(2, 130, 400, 2, 2, 64), flags={}, bias=(2, 1, 1, 400)),
    dict(shape=(2, 100, 640, 2, 2, 128), flags=dict(causal=True), bias=(2, 1, 1, 640)),
    dict(shape=(1, 90, 520, 2, 1, 256), flags={}, bias=(1, 1, 1, 520)),
    # padding masks with whole key tiles of 0 (run unbiased) and of -inf (skipped above d 64 on sm_90a), the second
    # batch all padded
    dict(shape=(2, 130, 656, 2, 2, 64), flags={}, padding=True),
    dict(shape=(2, 100, 656, 2, 2, 128), flags={}, padding=True),
    dict(shape=(2, 90, 656, 2, 1, 256), flags=dict(causal=True), padding=True),
    dict(shape=(2, 90, 656, 2, 1, 192), flags={}, padding=True),
    # the warp-specialized backward (sm_90a, d 64 / 128 / 256; the plain cases and padding masks above run it too): a
    # window, GQA, query tails (odd seqlen_q: the row statistics' boxes start below the block)
    dict(shape=(2, 68, 130, 4, 2, 128), flags=dict(window_left=16, window_right=3)),
    dict(shape=(2, 133, 200, 4, 2, 256), flags=dict(causal=True)),  # (d 256: the headdim-split kernel)
    dict(shape=(1, 200, 330, 2, 2, 256), flags={}),  # (d 256 without GQA: T dK, dV, not fp32 partials; a key tail)
    dict(shape=(3, 131, 150, 2, 1, 64), flags={}),
    # its last wave split (fa2.dev option bwd_tail_split=1: the default splits only longer query ranges; fewer tiles
    # than SMs: every tile run as pieces over its query blocks, fp32 dK / dV added into the workspace, the last piece
    # storing the sums; bwd_tail_split_plan), a key tail in a split tile
    dict(shape=(1, 400, 300, 2, 2, 128), flags={}, tail_split=True),
    dict(shape=(1, 530, 300, 2, 2, 64), flags={}, tail_split=True),
    # GQA 4:1 with a padding mask (gpu_validate's sanitize-gqa step has each CTA sum the group: the ring runs on
    # across the group's heads), and causal 3:1 with more queries than keys
    dict(shape=(2, 140, 300, 8, 2, 64), flags={}, padding=True),
    dict(shape=(2, 200, 150, 6, 2, 128), flags=dict(causal=True)),
    # the backward's key-row variant on the sm80 tiles (d 96: no wgmma config; the default)
    dict(shape=(2, 70, 300, 2, 2, 96), flags={}, padding=True),
    # dropout (its Philox bits per fragment group, forward and the backward's replay) with tails, GQA, a bias; sinks
    # (folded in the forward's epilogue, d sinks from the backward's row sums)
    dict(shape=(2, 97, 131, 4, 2, 64), flags=dict(causal=True, dropout_p=0.1)),
    dict(shape=(1, 130, 300, 2, 1, 128), flags=dict(dropout_p=0.2), bias=(1, 1, 1, 300)),
    dict(shape=(1, 70, 200, 2, 2, 256), flags=dict(window_left=32, window_right=0, dropout_p=0.1)),
    dict(shape=(2, 100, 260, 4, 2, 128), flags=dict(causal=True), sinks=True),
    dict(shape=(2, 65, 300, 2, 2, 64), flags={}, sinks=True, padding=True),
]
# varlen: (lengths_q, lengths_k, heads, kv heads, headdim, flags): tile edges, empty sequences, GQA, one sequence
# spanning the tensors (the dense kernels), dropout and sinks
VARLEN_CASES = [
    ([128, 1, 0, 129, 255, 300], [128, 1, 9, 129, 255, 300], 4, 2, 128, dict(causal=True)),
    ([1, 127, 0, 200], [5, 127, 3, 260], 2, 2, 64, {}),
    ([90, 0, 131], [90, 17, 131], 2, 1, 256, dict(window_left=20, window_right=0)),
    ([70, 33], [70, 45], 2, 2, 96, dict(causal=True)),
    ([130, 60], [140, 60], 4, 2, 64, dict(dropout_p=0.1, causal=True)),
    ([300], [300], 4, 2, 128, dict(causal=True)),  # (one spanning sequence: the dense kernels)
    ([100, 37], [120, 37], 4, 4, 128, dict(sinks=True)),
]
# FA2_SANITIZER_CASES="i,j,..": only those cases (indices into CASES), e.g. a new one on its own under every tool
if os.environ.get("FA2_SANITIZER_CASES"):
    CASES = [CASES[int(i)] for i in os.environ["FA2_SANITIZER_CASES"].split(",")]
for dtype in (torch.bfloat16, torch.float16):
    for case in CASES:
        b, sq, sk, h, hk, d = case["shape"]
        q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
        bias = None
        if "bias" in case:
            bias = torch.randn(case["bias"], device="cuda", dtype=dtype, requires_grad=True)
        elif case.get("padding"):
            bias = torch.zeros(b, 1, 1, sk, device="cuda", dtype=dtype)
            bias[0, ..., 128:256] = bias[0, ..., sk * 3 // 4:] = bias[1] = float("-inf")
        elif case.get("bool_bias"):
            bias = torch.rand(b, h, sq, sk, device="cuda") > 0.2
        sinks = torch.randn(h, device="cuda", requires_grad=True) if case.get("sinks") else None
        split_before = fa2.dev.options()["bwd_tail_split"]  # (FA2_DEV_OPTIONS', or the default)
        if case.get("tail_split"):
            fa2.dev.set_options(bwd_tail_split=1)
        out = fa2.attention(q, k, v, bias, sinks=sinks, **case["flags"])
        grads = torch.autograd.grad(out, [t for t in (q, k, v, bias, sinks) if t is not None and t.requires_grad],
                                    torch.randn_like(out))
        fa2.dev.set_options(bwd_tail_split=split_before)
        with fa2.deterministic():
            out = fa2.attention(q, k, v, bias, sinks=sinks, **case["flags"])
            torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    for lengths_q, lengths_k, h, hk, d, flags in VARLEN_CASES:
        flags = dict(flags)
        sinks = torch.randn(h, device="cuda", requires_grad=True) if flags.pop("sinks", False) else None
        cu_q, cu_k = (torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32,
                                   device="cuda") for lens in (lengths_q, lengths_k))
        q = torch.randn(sum(lengths_q), h, d, device="cuda", dtype=dtype, requires_grad=True)
        k, v = (torch.randn(sum(lengths_k), hk, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
        out = fa2.varlen_attention(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), sinks=sinks, **flags)
        torch.autograd.grad(out, [t for t in (q, k, v, sinks) if t is not None], torch.randn_like(out))
torch.cuda.synchronize()
print("sanitizer_check: ran", 2 * (len(CASES) + len(VARLEN_CASES)), "cases")
