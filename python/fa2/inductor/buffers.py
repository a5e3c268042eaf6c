"""Causal-mask buffers: GPT-style modules keep their causal mask in a module buffer and slice it per call (nanoGPT and
minGPT register ``tril(ones(block, block))`` and hide ``bias[:, :, :T, :T] == 0``; older GPT-2 code a bool tril).
Dynamo hands module buffers to the backend as graph inputs, so the pass could not see the mask's values and kept it as
a bool bias: correct, but on CUDA the kernels then read the mask everywhere instead of skipping the hidden half
(about twice the work of ``causal=True``).

The fa2 backends therefore read such a buffer's value at compile time: a module buffer (not a parameter) whose every
trailing (rows, cols) slice is the same 0/1 lower or upper triangle is replaced in the graph by the ops that build
that value (``tril(ones(shape))`` and the like), so the pass recognizes the band from its values as it does for masks built in
the graph (and once the site is rewritten, nothing computes it). A guard around the compiled function keeps that
exact: every call compares the buffer argument's identity and version counter with those at compile time (two
attribute reads). When the buffer was modified in place or replaced, its value is checked once: the same triangle ->
carry on; anything else -> the uncompiled graph runs from then on (the same results as eager, at eager speed) and a
warning says so.
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field

import torch

# Buffers larger than this are not inspected (the check reads the whole buffer once, at compile time).
MAX_BUFFER_ELEMENTS = 1 << 26


def _is_module_buffer(node: torch.fx.Node) -> bool:
    """Whether a Dynamo graph input is a module buffer (its source passes through a module's ``_buffers``)."""
    source = getattr(node.meta.get("grapharg"), "source", None)
    while source is not None:
        if getattr(source, "member", None) == "_buffers":
            return True
        source = getattr(source, "base", None)
    return False


# The triangles taken: name -> (torch function, diagonal) building it from ones. "triu_strict" is the usual spelling of
# what to hide (triu(ones, 1): the keys after the query).
TRIANGLES = {"tril": (torch.tril, 0), "triu": (torch.triu, 0), "triu_strict": (torch.triu, 1)}


def triangle_kind(t) -> str | None:
    """The TRIANGLES name of ``t`` when every trailing (rows, cols) slice of it is that same 0/1 (False/True) triangle;
    else None. Parameters, tensors that need grad and fake tensors are None."""
    if not isinstance(t, torch.Tensor) or isinstance(t, torch.nn.Parameter) or t.requires_grad:
        return None
    if torch._subclasses.fake_tensor.is_fake(t) or t.is_complex() or t.dim() < 2 or t.numel() == 0 or \
            t.numel() > MAX_BUFFER_ELEMENTS:
        return None
    with torch.no_grad():
        m = t.reshape(-1, t.shape[-2], t.shape[-1])
        ones = torch.ones(m.shape[-2:], dtype=t.dtype, device=t.device)
        for kind, (build, diagonal) in TRIANGLES.items():
            if bool((m == build(ones, diagonal)).all()):
                return kind
    return None


@dataclass
class _Entry:
    index: int              # position among the graph's inputs
    tensor: torch.Tensor    # the buffer at compile time
    version: int
    kind: str
    name: str               # the module buffer (its Dynamo source), for the warning
    accepted: list = field(default_factory=list)  # (tensor, version) of replacements found to hold the same triangle


def take_mask_buffers(gm: torch.fx.GraphModule, example_inputs) -> tuple[torch.fx.GraphModule, list[_Entry]]:
    """``gm`` with its triangular module buffers read through constant nodes (a new GraphModule over a copy of the
    graph; ``gm`` itself is left as it was), and the entries the guard checks. ``gm`` unchanged and no entries when
    there is no such buffer."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return gm, []
    chosen = []
    for i, (node, t) in enumerate(zip(placeholders, example_inputs)):
        if node.users and _is_module_buffer(node):
            kind = triangle_kind(t)
            if kind is not None:
                chosen.append((i, kind))
    if not chosen:
        return gm, []
    graph = copy.deepcopy(gm.graph)
    new = torch.fx.GraphModule(gm, graph)
    new_placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first_op = next(n for n in graph.nodes if n.op != "placeholder")
    entries = []
    for i, kind in chosen:
        t, ph = example_inputs[i], new_placeholders[i]
        # the buffer's value rebuilt by ops (tril / triu of ones: what the check above found it to be), which the
        # pass evaluates at compile time like any mask built in the graph; a tensor constant would trip AOT
        # autograd's fake-tensor tracing, and a registered buffer would be lifted to an input again
        with graph.inserting_before(first_op):
            ones = graph.call_function(torch.ones, (tuple(t.shape),), {"dtype": t.dtype, "device": t.device})
            build, diagonal = TRIANGLES[kind]
            value = graph.call_function(build, (ones, diagonal))
        ph.replace_all_uses_with(value)
        source = getattr(ph.meta.get("grapharg"), "source", None)
        entries.append(_Entry(i, t, t._version, kind, getattr(source, "name", ph.name)))
    new.recompile()
    return new, entries


def guarded(compiled, fallback, entries: list[_Entry]):
    """``compiled`` behind the buffer guard (see the module docstring), with ``compiled``'s calling convention (a
    boxed compiled function takes the argument list itself). ``fallback``: the graph without the constant buffers."""
    if not entries:
        return compiled
    state = {"fallen_back": False}

    def still_valid(args) -> bool:
        for e in entries:
            t = args[e.index]
            if (t is e.tensor and t._version == e.version) or any(t is a and t._version == v for a, v in e.accepted):
                continue
            # modified in place or replaced: the graph builds the triangle itself, so the argument must hold it
            if t.shape != e.tensor.shape or t.dtype != e.tensor.dtype or triangle_kind(t) != e.kind:
                warnings.warn(f"fa2: the causal-mask buffer {e.name} changed after torch.compile took its value as "
                              "a constant; this compiled graph runs uncompiled from now on (torch._dynamo.reset() and "
                              "compile again for speed)", stacklevel=3)
                return False
            if t is e.tensor:
                e.version = t._version
            else:  # (a few replacements remembered by identity and version)
                e.accepted = [(a, v) for a, v in e.accepted if a is not t][-3:] + [(t, t._version)]
        return True

    def run(*args):
        # (Dynamo calls the compiled function with the graph's inputs unpacked; a boxed caller passes their list)
        inputs = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        if not state["fallen_back"] and not still_valid(inputs):
            state["fallen_back"] = True
        if state["fallen_back"]:
            return fallback(*inputs)
        return compiled(*args)

    run._boxed_call = getattr(compiled, "_boxed_call", False)
    return run
