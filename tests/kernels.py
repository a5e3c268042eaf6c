"""Test helpers for the CUDA kernels: fa2's development switches held for a block, and which kernels a call ran."""
from __future__ import annotations

import contextlib

import torch

import fa2


@contextlib.contextmanager
def switch(name, value):
    """fa2._C.set_<name>(value) inside the block, the previous value restored after it."""
    before = getattr(fa2._C, name)()
    getattr(fa2._C, "set_" + name)(value)
    try:
        yield
    finally:
        getattr(fa2._C, "set_" + name)(before)


def cuda_kernel_names(fn):
    """Names of the CUDA kernels fn() launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def cuda_kernel_grids(fn):
    """(name, grid) of each CUDA kernel fn() launches, the grid as [x, y, z] (torch.profiler's trace)."""
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
    return [(e["name"], e.get("args", {}).get("grid")) for e in events if e.get("cat") == "kernel"]
