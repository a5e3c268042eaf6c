"""The one place that touches private Inductor / Dynamo / AOT-autograd APIs.

Those APIs move between releases (fa2 supports torch 2.11, the GPU machine, and 2.13, CI). Everything else in
fa2.inductor imports what it needs from here, so a torch upgrade is fixed in this file alone. Every name below was
checked on 2.13; the fallbacks cover the spellings of 2.11.
"""
from __future__ import annotations

import hashlib
import importlib
from typing import Any, Callable

import torch

aten = torch.ops.aten
prims = torch.ops.prims

# The Inductor config fields the pass is installed in (runs on the normalized ATen joint graph, before Inductor's
# own pattern passes, including its attention fusion).
JOINT_PRE_PASS = "joint_custom_pre_pass"


def inductor_config():
    return importlib.import_module("torch._inductor.config")


# ---- CustomGraphPass -----------------------------------------------------------------------------------------

try:  # torch >= 2.4
    from torch._inductor.custom_graph_pass import CustomGraphPass
except ImportError:  # pragma: no cover - older torch
    class CustomGraphPass:  # type: ignore[no-redef]
        def __call__(self, graph):
            raise NotImplementedError

        def uuid(self):
            return None


def hash_files(paths: tuple[str, ...], extra: str = "") -> str:
    """Content hash of source files, for CustomGraphPass.uuid() (what Inductor's get_hash_for_files does)."""
    hasher = hashlib.sha256(extra.encode())
    for path in paths:
        with open(path, "rb") as f:
            hasher.update(f.read())
    return hasher.hexdigest()


def get_custom_passes(value) -> list:
    """The passes held by a custom-pass config field (None, one pass, or a list on newer torch)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


# ---- Dynamo backends -----------------------------------------------------------------------------------------

class _LazyEntryPoint:
    """Stands in for an importlib entry point in Dynamo's backend table: ``lookup_backend`` calls ``load()`` and
    registers the result itself, so registering this way never collides with the ``torch_dynamo_backends`` entry
    point of an installed fa2 (both load the same function)."""

    def __init__(self, module: str, attr: str):
        self.module, self.attr = module, attr

    def load(self):
        return getattr(importlib.import_module(self.module), self.attr)


def register_backend_lazily(name: str, module: str, attr: str) -> None:
    """Make ``torch.compile(backend=name)`` find ``module.attr`` without importing it now."""
    try:
        from torch._dynamo.backends import registry
        if name in registry._BACKENDS or name in registry._COMPILER_FNS:
            return
        registry._BACKENDS[name] = _LazyEntryPoint(module, attr)
    except (ImportError, AttributeError):  # pragma: no cover - registry layout changed: register eagerly
        from torch._dynamo import register_backend, list_backends
        if name not in list_backends(exclude_tags=()):
            register_backend(compiler_fn=_LazyEntryPoint(module, attr).load(), name=name)


def compile_fx(gm, example_inputs, config_patches: dict[str, Any]):
    from torch._inductor.compile_fx import compile_fx as _compile_fx
    return _compile_fx(gm, example_inputs, config_patches=config_patches)


def inductor_mode_options(mode: str | None) -> dict[str, Any]:
    if not mode or mode == "default":
        return {}
    from torch._inductor import list_mode_options
    return dict(list_mode_options(mode))


def aot_eager_with_joint_pass(graph_pass: Callable[[torch.fx.Graph], None]):
    """A Dynamo backend that runs AOT autograd with Inductor's decompositions, applies ``graph_pass`` where Inductor
    would (the joint graph before partitioning; the forward graph in inference), then runs the graphs eagerly.
    It sees the same graphs as the pass does under Inductor, without Inductor's code generation: for debugging
    and for fast tests of the pass."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    def partition(joint_module, joint_inputs, **kwargs):
        graph_pass(joint_module.graph)
        joint_module.graph.lint()
        joint_module.recompile()
        return min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)

    def inference_compiler(gm, example_inputs):
        graph_pass(gm.graph)
        gm.graph.lint()
        gm.recompile()
        return make_boxed_func(gm)

    def compiler(gm, example_inputs):
        return make_boxed_func(gm)

    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler, inference_compiler=inference_compiler,
                        partition_fn=partition, decompositions=select_decomp_table(),
                        keep_inference_input_mutations=True)


# ---- graph helpers -------------------------------------------------------------------------------------------

def is_tangent(node: torch.fx.Node) -> bool:
    """A joint graph's incoming gradient (AOT autograd names them tangents_*)."""
    return node.op == "placeholder" and str(node.target).startswith("tangents")


def fake_mode_of(graph: torch.fx.Graph):
    from torch._guards import detect_fake_mode
    vals = [n.meta.get("val") for n in graph.nodes if n.op == "placeholder"]
    return detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])


def decomposition_table():
    from torch._inductor.decomposition import select_decomp_table
    return select_decomp_table()


def make_fx_trace(fn: Callable, args: list) -> torch.fx.GraphModule:
    """Trace ``fn`` to a normalized ATen graph with Inductor's decompositions (as pattern_matcher.fwd_only does);
    ``args`` are fake tensors of the graph being rewritten, so symbolic sizes stay symbolic."""
    from torch.fx.experimental.proxy_tensor import make_fx
    try:
        from torch._dispatch.python import enable_python_dispatcher
    except ImportError:  # pragma: no cover
        import contextlib
        enable_python_dispatcher = contextlib.nullcontext
    with enable_python_dispatcher():
        gm = make_fx(fn, decomposition_table(), tracing_mode="real")(*args)
    gm.graph.eliminate_dead_code()
    return gm


def stable_topological_sort(graph: torch.fx.Graph) -> None:
    try:
        from torch._inductor.pattern_matcher import stable_topological_sort as _sort
    except ImportError:  # pragma: no cover
        from torch.fx.passes.tools_common import legalize_graph
        legalize_graph(graph.owning_module)
        return
    _sort(graph)


def statically_known_true(x) -> bool:
    try:
        from torch.fx.experimental.symbolic_shapes import statically_known_true as _skt
    except ImportError:  # pragma: no cover
        from torch.fx.experimental.symbolic_shapes import is_concrete_bool
        return is_concrete_bool(x) and bool(x)
    return _skt(x)


def sym_expr(x):
    """A sympy expression for an int / SymInt (None if it is neither)."""
    import sympy
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return sympy.Integer(x)
    if isinstance(x, torch.SymInt):
        return x.node.expr
    return None


def real_mode():
    """A context in which real tensors compute for real even inside Inductor's fake-tensor mode (reading a
    constant's value)."""
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
    except ImportError:  # pragma: no cover
        import contextlib
        return contextlib.nullcontext()
    return unset_fake_temporarily()


def without_aot_cache():
    """A context in which AOT autograd's cache is off, so the joint-graph passes really run (what inspects the pass's
    work needs that: a cache hit replays the compiled artifact). Inductor's FX graph cache stays on."""
    import contextlib
    stack = contextlib.ExitStack()
    try:
        import torch._functorch.config as functorch_config
        if hasattr(functorch_config, "enable_autograd_cache"):
            stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    except ImportError:  # pragma: no cover
        pass
    return stack


def guard_bool(x) -> bool:
    """The value of a SymBool, recording a guard on it (plain bools pass through)."""
    return bool(x)


# ---- Dynamo's compiled-code cache (fa2.explain cleans up after itself) ------------------------------------------

def dynamo_code_snapshot() -> dict:
    """{id(code): (code, number of compiled entries)} for every code object Dynamo has intercepted so far, by
    identity (code objects compare equal by content: two explain callers, or a class redefined in a notebook, would
    collapse into one key); {} where this torch does not expose them (explain then leaves its entries, as
    torch.compile would)."""
    try:
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
        from torch._dynamo.convert_frame import input_codes
        codes = [ref() for ref in list(input_codes.seen)]
    except (ImportError, AttributeError, TypeError):
        return {}
    return {id(c): (c, len(_debug_get_cache_entry_list(c))) for c in codes if c is not None}


def compile_isolated(fn, backend):
    """torch.compile(fn, backend=backend) whose recompiles are counted apart from other compilations of the same code
    (isolate_recompiles, torch >= 2.12; plain torch.compile before): fa2.explain's entries must not push a model the
    user compiled toward its recompile limit."""
    try:
        return torch.compile(fn, backend=backend, isolate_recompiles=True)
    except TypeError:  # pragma: no cover - older torch
        return torch.compile(fn, backend=backend)


def is_compiled_module(obj) -> bool:
    """Whether obj is what torch.compile(module) returns (its module is ``obj._orig_mod``)."""
    optimized = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
    optimized = getattr(optimized, "OptimizedModule", None)
    return optimized is not None and isinstance(obj, optimized)


def drop_compiled_entries(code) -> None:
    """Forget what Dynamo compiled for ``code`` (every entry; the next call recompiles)."""
    try:
        from torch._C._dynamo.eval_frame import reset_code
    except ImportError:  # pragma: no cover - other torch versions
        return
    reset_code(code)


def recompile_limit_patch(limit: int):
    """A config patch raising Dynamo's per-code recompile limit (recompile_limit; cache_size_limit before 2.6)."""
    import torch._dynamo.config as dynamo_config
    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    return dynamo_config.patch(**{name: max(limit, getattr(dynamo_config, name))})
