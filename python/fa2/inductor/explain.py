"""``fa2.explain(model, *args, **kwargs)``: which attention sites a model has and what fa2's pass did with each."""
from __future__ import annotations

import inspect
import itertools
import sys

import torch

from ._compat import (compile_isolated, drop_compiled_entries, dynamo_code_snapshot, is_compiled_module,
                      recompile_limit_patch, without_aot_cache)
from .graph_pass import SiteRecord, recording

__all__ = ["explain", "format_table"]


def explain(model, *args, **kwargs) -> list[SiteRecord]:
    """Compile ``model`` with ``backend="fa2"``, run it once on ``(*args, **kwargs)`` and report every attention-like
    site found in the compiled graphs: where it came from (module path, source line), whether it became fa2, the
    flags inferred (causal, window, softcap, scale, bias, GQA) and, if it was not rewritten, why.

    The model runs as it is (train/eval mode, grad mode): in training mode with grad enabled the joint
    forward+backward graph is what gets rewritten. Returns the list of :class:`SiteRecord` (with ``.graphs``: the
    fa2.fwd / fa2.bwd ops in each rewritten graph) and prints a table."""
    from .. import backend  # noqa: F401  (registers "fa2")

    # a backend object of its own: Dynamo reuses a graph compiled before for the same code with the same backend,
    # and the pass would not run (the model compiled or explained already: "no attention sites found")
    def explain_backend(gm, example_inputs):
        return backend.fa2_backend(gm, example_inputs)
    # ... and a caller whose code object is new on every call: Dynamo keeps its compiled entries on the code object
    # it intercepts, so compiling the model itself left one entry per explain on model.forward's code (its own
    # backend each time) until the recompile limit (8) made the next explain run eagerly and find nothing. The
    # model is traced inline from the caller, whose entries go with its code when explain returns. After a graph
    # break Dynamo still compiles the model's own frames: their entries are dropped afterwards where explain made the
    # only ones (a model the user compiled keeps its own), and the limit is raised while explain runs.
    # (isolate_recompiles where torch has it: explain's entries do not count toward a compiled model's limit)
    caller, call_args = _fresh_caller(model, args)
    compiled = compile_isolated(caller, explain_backend)
    before = dynamo_code_snapshot()
    try:
        with recording() as records, without_aot_cache(), recompile_limit_patch(1 << 20):
            compiled(*call_args, **kwargs)
    finally:
        for key, (code, entries) in dynamo_code_snapshot().items():
            # (keyed by id: `before` holds its codes, so an id seen there is the same code)
            if entries and not before.get(key, (None, 0))[1]:
                drop_compiled_entries(code)
    print(format_table(records), file=sys.stdout)
    return records


_CALLERS = itertools.count()


def _fresh_caller(model, args):
    """(a function with a code object of its own that calls ``model``, the arguments to call it with), written so
    that the model's modules keep the names Dynamo gives them when the model itself is compiled: a module (or a
    method of one) as ``self``, a function's arguments under its own parameter names."""
    if is_compiled_module(model):  # torch.compile(module): explain the module
        model = model._orig_mod
    namespace: dict = {}
    # (self positional-only: a keyword argument named self goes to the model)
    if isinstance(model, torch.nn.Module):
        source, call_args = "def explain_call(self, /, *args, **kwargs):\n    return self(*args, **kwargs)\n", (model,)
    elif (inspect.ismethod(model) and isinstance(model.__self__, torch.nn.Module) and model.__name__.isidentifier()
          and getattr(model.__self__, model.__name__, None) == model):  # (not a mangled / rebound name)
        source = f"def explain_call(self, /, *args, **kwargs):\n    return self.{model.__name__}(*args, **kwargs)\n"
        call_args = (model.__self__,)
    else:
        source, call_args = _mirrored_caller_source(model, namespace), (model,)
    exec(compile(source, f"<fa2.explain call {next(_CALLERS)}>", "exec"), namespace)
    return namespace["explain_call"], call_args + tuple(args)


def _mirrored_caller_source(fn, namespace: dict) -> str:
    """``def explain_call(fn, <fn's parameters>): return fn(<them>)`` (defaults from ``namespace``), or a plain
    ``(*args, **kwargs)`` forwarder where fn has no usable signature."""
    generic = "def explain_call(__fa2_fn, /, *args, **kwargs):\n    return __fa2_fn(*args, **kwargs)\n"
    try:  # (the callable's own signature, not a functools.wraps target's: the call goes to the callable)
        params = list(inspect.signature(fn, follow_wrapped=False).parameters.values())
    except (TypeError, ValueError):
        return generic
    names = [p.name for p in params]
    if any(not n.isidentifier() or n.startswith("__fa2_") for n in names):
        return generic
    decl, call = [], []
    kinds = inspect.Parameter
    for p in params:
        default = ""
        if p.default is not p.empty:
            namespace.setdefault("__fa2_defaults", {})[p.name] = p.default
            default = f"=__fa2_defaults[{p.name!r}]"
        if p.kind == kinds.VAR_POSITIONAL:
            decl.append(f"*{p.name}")
            call.append(f"*{p.name}")
        elif p.kind == kinds.VAR_KEYWORD:
            decl.append(f"**{p.name}")
            call.append(f"**{p.name}")
        elif p.kind == kinds.KEYWORD_ONLY:
            if not any(q.kind == kinds.VAR_POSITIONAL for q in params) and "*" not in decl:
                decl.append("*")
            decl.append(p.name + default)
            call.append(f"{p.name}={p.name}")
        else:
            decl.append(p.name + default)
            call.append(p.name)
        if p.kind == kinds.POSITIONAL_ONLY and (params.index(p) + 1 == len(params) or
                                                params[params.index(p) + 1].kind != kinds.POSITIONAL_ONLY):
            decl.append("/")
    # __fa2_fn positional-only (a keyword argument of that name goes to fn): joins fn's own positional-only group
    head = "__fa2_fn, " if "/" in decl else "__fa2_fn, /, "
    return f"def explain_call({head}{', '.join(decl)}):\n    return __fa2_fn({', '.join(call)})\n"


def format_table(records: list[SiteRecord]) -> str:
    if not records:
        return ("fa2.explain: no attention sites found (in the graphs Dynamo compiled: where a model has attention, "
                "a graph break may have left it uncompiled; torch._dynamo.explain(model)(*inputs) lists them)")
    rows = [("#", "module", "source", "graph", "fa2", "flags / reason")]
    for i, r in enumerate(records):
        flags = ", ".join(f"{k}={v}" for k, v in r.flags.items())
        detail = flags if r.rewritten else f"{r.reason}" + (f" [{flags}]" if flags else "")
        rows.append((str(i), r.module or "?", r.source or "?", r.graph, "yes" if r.rewritten else "NO", detail))
    widths = [max(len(row[c]) for row in rows) for c in range(5)]
    lines = []
    for j, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[c]) for c, cell in enumerate(row[:5])) + "  " + row[5])
        if j == 0:
            lines.append("-" * (sum(widths) + 2 * 5 + len(row[5])))
    done = sum(r.rewritten for r in records)
    lines.append(f"fa2: {done}/{len(records)} attention sites rewritten")
    return "\n".join(lines)
