"""python -m fa2: an environment report (like python -m torch.utils.collect_env)."""
from __future__ import annotations

import platform
import sys


def main() -> int:
    import torch

    rows = [("python", sys.version.split()[0]), ("platform", platform.platform()),
            ("torch", torch.__version__), ("torch CUDA", str(torch.version.cuda))]
    cuda_ok = torch.cuda.is_available()
    rows.append(("CUDA available", str(cuda_ok)))
    if cuda_ok:
        for i in range(torch.cuda.device_count()):
            cap = torch.cuda.get_device_capability(i)
            rows.append((f"GPU {i}", f"{torch.cuda.get_device_name(i)} (sm_{cap[0]}{cap[1]})"))
    try:
        import fa2
        info = fa2.build_info()
        rows += [("fa2", info["version"]), ("fa2 built against torch", info["torch_version"]),
                 ("fa2 built with CUDA", f"{info['with_cuda']} (torch CUDA '{info['torch_cuda']}')"),
                 ("fa2 CUDA archs", info["cuda_archs"] if info["with_cuda"] else "-"),
                 ("fa2 CUDA kernels", (f"{len(info['kernels'].split(','))} instances" if info["kernels"] else "none"))]
        paths = ["CPU kernel (float32/float64/bfloat16/float16)"]
        if info["with_cuda"] and cuda_ok:
            from fa2 import _C
            try:
                schedule = _C.sm90_schedule()
            except ValueError as e:  # FA2_SM90_SCHEDULE names no schedule: the forward will say so too
                schedule = f"invalid ({e})"
            hopper = "sm90a" in info["kernels"] and _C.arch_specific_kernels()
            for i in range(torch.cuda.device_count()):
                cap = torch.cuda.get_device_capability(i)
                if cap < (8, 0):
                    paths.append(f"cuda:{i} unsupported (sm_{cap[0]}{cap[1]} < sm_80)")
                elif cap == (9, 0) and hopper:
                    backward = "sm_90a wgmma" if _C.sm90_backward() else "sm80-instruction kernels"
                    ws_dims = [d for d in _C.sm90_ws_backward_headdims() if f"hdim{d}_sm90a" in info["kernels"]]
                    if _C.sm90_backward() and _C.sm90_ws_backward() and ws_dims:
                        backward += " (warp-specialized at " + ", ".join(f"d{d}" for d in ws_dims) + ")"
                    paths.append(f"cuda:{i} forward sm_90a kernels (wgmma, TMA; schedule {schedule}), "
                                 f"backward {backward} (fp16/bf16)")
                else:
                    paths.append(f"cuda:{i} sm80-instruction kernels (fp16/bf16)")
            def default(d):  # causal / windowed calls' default, and the other one where they differ
                windowed, full = _C.sm90_default_schedule(d, True), _C.sm90_default_schedule(d, False)
                return f"d{d} {windowed}" + (f" ({full} without a causal mask or window)" if full != windowed else "")
            rows.append(("sm_90a forward schedule", f"{schedule} (FA2_SM90_SCHEDULE; auto: "
                         + ", ".join(default(d) for d in (64, 128, 192, 256)) + ")"))
            rows.append(("d128 forward clusters", ("pairs of CTAs sharing K/V loads without a causal mask or window "
                                                   "(FA2_NO_FWD_CLUSTER=1: one CTA at a time)" if _C.fwd_cluster()
                                                   else "one CTA at a time (switched off: FA2_NO_FWD_CLUSTER)")))
            rows.append(("padding-mask backward", ("key-row variant (FA2_DISABLE_KEY_BIAS_BWD=1: general bias path)"
                                                   if _C.key_bias_backward()
                                                   else "general bias path (switched off: FA2_DISABLE_KEY_BIAS_BWD)")))
            ungrouped = ("fp32 accumulators per kv head where the ws backward runs, else fp32 partials per query head"
                         if _C.bwd_gqa_accumulate() else "fp32 partials per query head (FA2_BWD_GQA_NO_ACCUMULATE)")
            grouping = {-1: f"where the grouped grid fills the GPU, else {ungrouped}",
                        0: f"never: {ungrouped}", 1: "always where the ws backward runs"}
            rows.append(("GQA backward groups", grouping.get(_C.bwd_gqa_grouping(), "?")
                         + " (FA2_BWD_GQA_GROUPING=0 / 1)"))
            split = {-1: "where its tiles have the query blocks it was measured to pay at; no mask, bias or GQA",
                     0: "never", 1: "wherever its cost model gains; no mask, bias or GQA"}
            rows.append(("ws backward last-wave split", split.get(_C.bwd_tail_split(), "?")
                         + " (FA2_BWD_TAIL_SPLIT=0 / 1)"))
        elif cuda_ok:
            paths.append("CUDA present but fa2 was built without CUDA kernels")
        rows.append(("active paths", "; ".join(paths)))
    except ImportError as e:
        rows.append(("fa2", f"NOT LOADABLE: {e}"))
    try:
        import transformers
        rows.append(("transformers", transformers.__version__))
    except ImportError:
        rows.append(("transformers", "not installed"))
    width = max(len(k) for k, _ in rows)
    for k, val in rows:
        print(f"{k:<{width}} : {val}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
