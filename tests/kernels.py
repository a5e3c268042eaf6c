"""Test helpers for the CUDA kernels: fa2's development switches held for a block, and which kernels a call ran."""
from __future__ import annotations

import contextlib

import torch

import fa2


@contextlib.contextmanager
def switch(name, value):
    """The development option `name` (fa2.dev) set to value inside the block, restored after it."""
    with fa2.dev.options_override(**{name: value}):
        yield


def cuda_kernel_names(fn):
    """Names of the CUDA kernels fn() launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _cuda_kernel_events(fn):
    """The kernel events of torch.profiler's chrome trace of fn(), in launch order."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
            events = json.load(trace)["traceEvents"]
    return sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])


def cuda_kernel_grids(fn):
    """(name, grid) of each CUDA kernel fn() launches, the grid as [x, y, z] (torch.profiler's trace)."""
    return [(e["name"], e.get("args", {}).get("grid")) for e in _cuda_kernel_events(fn)]


def cuda_kernel_spans(fn):
    """(name, start, end) of each CUDA kernel fn() launches, in microseconds on the GPU's clock (torch.profiler's
    trace), in launch order."""
    return [(e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in _cuda_kernel_events(fn)]


def kernel_template_args(name):
    """The top-level template arguments of the kernel in a demangled name ("void ns::k<A, B<C, D>, true>(...)" ->
    ["A", "B<C, D>", "true"]): tests read a flag by its position, whatever flags later come after it."""
    start = name.index("<")
    args, depth, current = [], 0, ""
    for ch in name[start + 1:]:
        if ch == "<":
            depth += 1
        elif ch == ">":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            args.append(current.strip())
            current = ""
        else:
            current += ch
    return args + [current.strip()]


def is_ws_key_row_kernel(name):
    """Whether name is a warp-specialized backward kernel's key-row bias variant (bwd_ws_kernel / bwd_ws_dsplit_kernel
    <T, Cfg, kKeyBias, ...>)."""
    return "bwd_ws_" in name and kernel_template_args(name)[2] == "true"
