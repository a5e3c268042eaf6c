"""python -m fa2: an environment report (like python -m torch.utils.collect_env).
python -m fa2 plan [options]: the plan fa2 makes for a described call (kernel, grid, shared memory, workspace and why).
"""
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
            from fa2 import dev
            try:
                opts = dev.options()
                schedule = opts["sm90_schedule"]
            except ValueError as e:  # FA2_DEV_OPTIONS is malformed: the kernels will say so too
                opts, schedule = dev.default_options(), f"invalid ({e})"
            tables = dev.tuning_tables()
            hopper = "sm90a" in info["kernels"] and opts["arch_specific_kernels"]
            for i in range(torch.cuda.device_count()):
                cap = torch.cuda.get_device_capability(i)
                if cap < (8, 0):
                    paths.append(f"cuda:{i} unsupported (sm_{cap[0]}{cap[1]} < sm_80)")
                elif cap == (9, 0) and hopper:
                    backward = "sm_90a wgmma" if opts["sm90_backward"] else "sm80-instruction kernels"
                    ws_dims = [d for d in tables["sm90_ws_backward_headdims"] if f"hdim{d}_sm90a" in info["kernels"]]
                    if opts["sm90_backward"] and opts["sm90_ws_backward"] and ws_dims:
                        backward += " (warp-specialized at " + ", ".join(f"d{d}" for d in ws_dims) + ")"
                    paths.append(f"cuda:{i} forward sm_90a kernels (wgmma, TMA; schedule {schedule}), "
                                 f"backward {backward} (fp16/bf16)")
                else:
                    paths.append(f"cuda:{i} sm80-instruction kernels (fp16/bf16)")
            def default(d):  # causal / windowed calls' default, and the other one where they differ
                windowed, full = tables["sm90_default_schedule"][d]
                return f"d{d} {windowed}" + (f" ({full} without a causal mask or window)" if full != windowed else "")
            rows.append(("sm_90a forward schedule", f"{schedule} (option sm90_schedule; auto: "
                         + ", ".join(default(d) for d in (64, 128, 192, 256)) + ")"))
            rows.append(("d128 forward clusters", ("pairs of CTAs sharing K/V loads without a causal mask or window "
                                                   "(option fwd_cluster=0: one CTA at a time)" if opts["fwd_cluster"]
                                                   else "one CTA at a time (switched off: option fwd_cluster)")))
            rows.append(("padding-mask backward", ("key-row variant (option key_bias_backward=0: general bias path)"
                                                   if opts["key_bias_backward"]
                                                   else "general bias path (switched off: option key_bias_backward)")))
            ungrouped = ("fp32 accumulators per kv head where the ws backward runs, else fp32 partials per query head"
                         if opts["bwd_gqa_accumulate"]
                         else "fp32 partials per query head (option bwd_gqa_accumulate=0)")
            grouping = {-1: f"where the grouped grid fills the GPU, else {ungrouped}",
                        0: f"never: {ungrouped}", 1: "always where the ws backward runs"}
            rows.append(("GQA backward groups", grouping.get(opts["bwd_gqa_grouping"], "?")
                         + " (option bwd_gqa_grouping=0 / 1)"))
            split = {-1: "where its tiles have the query blocks it was measured to pay at; no mask, bias or GQA",
                     0: "never", 1: "wherever its cost model gains; no mask, bias or GQA"}
            rows.append(("ws backward last-wave split", split.get(opts["bwd_tail_split"], "?")
                         + " (option bwd_tail_split=0 / 1)"))
            rows.append(("development options", "fa2.dev / FA2_DEV_OPTIONS (docs/development.md: Options and plans); "
                                                "python -m fa2 plan --help"))
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


def plan_main(argv) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m fa2 plan", description="fa2's plan of a described call")
    parser.add_argument("--direction", choices=("fwd", "bwd", "both"), default="both")
    parser.add_argument("--device", default=None, help="h100, h200, a100, l40 (default: the current GPU)")
    for name, default in (("batch", 1), ("seqlen-q", 4096), ("seqlen-k", None), ("nheads", 16), ("nheads-k", None),
                          ("headdim", 128), ("headdim-v", None), ("window-left", -1), ("window-right", -1)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--softcap", type=float, default=0.0)
    parser.add_argument("--bias", choices=("none", "key_row", "full"), default="none")
    parser.add_argument("--bias-dtype", choices=("same", "float32", "bool"), default="same")
    parser.add_argument("--options", default="", help="development options, key=value,... (as FA2_DEV_OPTIONS)")
    args = parser.parse_args(argv)
    import torch  # noqa: F401
    from fa2 import dev

    if args.options:
        dev.set_options(**dict(item.split("=", 1) for item in args.options.split(",") if item))
    call = {k: v for k, v in vars(args).items() if k not in ("direction", "device", "options") and v is not None}
    for direction in (("fwd", "bwd") if args.direction == "both" else (args.direction,)):
        p = dev.plan(direction, device=args.device, **call)
        print("forward:" if direction == "fwd" else "backward:")
        for key, value in p.items():
            if key != "reasons":
                print(f"  {key}: {value}")
        for reason in p.get("reasons", []):
            print(f"  why: {reason}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "plan":
        raise SystemExit(plan_main(sys.argv[2:]))
    raise SystemExit(main())
