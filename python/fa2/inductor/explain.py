"""``fa2.explain(model, *args, **kwargs)``: which attention sites a model has and what fa2's pass did with each."""
from __future__ import annotations

import itertools
import sys

import torch

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
    from ._compat import without_aot_cache

    # a backend object of its own: Dynamo reuses a graph compiled before for the same code with the same backend,
    # and the pass would not run (the model compiled or explained already: "no attention sites found")
    def explain_backend(gm, example_inputs):
        return backend.fa2_backend(gm, example_inputs)
    # ... and a caller whose code object is new on every call: Dynamo keeps its compiled entries on the code object
    # it intercepts, so compiling the model itself left one entry per explain on model.forward's code (its own
    # backend each time) until the recompile limit (8) made the next explain run eagerly and find nothing. The
    # model is traced inline from the caller; the entries go with the caller's code when explain returns.
    compiled = torch.compile(_fresh_caller(), backend=explain_backend)
    with recording() as records, without_aot_cache():
        compiled(model, args, kwargs)
    print(format_table(records), file=sys.stdout)
    return records


_CALLERS = itertools.count()


def _fresh_caller():
    """``lambda model, args, kwargs: model(*args, **kwargs)`` with a code object of its own (compiled anew)."""
    namespace: dict = {}
    source = "def explain_call(model, args, kwargs):\n    return model(*args, **kwargs)\n"
    exec(compile(source, f"<fa2.explain call {next(_CALLERS)}>", "exec"), namespace)
    return namespace["explain_call"]


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
