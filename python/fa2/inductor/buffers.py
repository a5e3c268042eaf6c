"""Causal-mask buffers: GPT-style modules keep their causal mask in a module buffer and slice it per call (nanoGPT and
minGPT register ``tril(ones(block, block))`` and hide ``bias[:, :, :T, :T] == 0``; older GPT-2 code a bool tril).
Dynamo hands module buffers to the backend as graph inputs, so the pass could not see the mask's values and kept it as
a bool bias: correct, but on CUDA the kernels then read the mask everywhere instead of skipping the hidden half
(about twice the work of ``causal=True``).

The fa2 backends therefore read such a buffer's value at compile time: a module buffer (not a parameter) whose every
trailing (rows, cols) slice is the same 0/1 lower triangle (or strict upper one), and that the graph only uses to
hide what a causal mask hides (views of it compared with 0 / 1 or negated, then the mask of masked_fill / where;
never written, returned or used in arithmetic), is replaced in the graph by the ops that build that value
(``tril(ones(shape))``), so the pass recognizes the causal band from its values as it does for masks built in the
graph (and once the site is rewritten, nothing computes it).

A guard around the compiled function keeps that exact: every call compares the buffer argument's identity, storage,
storage offset and version counter with those at compile time (attribute reads, no device work). When the buffer was
modified in place or replaced, its value is checked once: the same triangle -> carry on; anything else -> the
uncompiled graph runs from then on (the same results as eager, at eager speed) and a warning says so. Writes the
version counter does not see (through ``.data[...]`` or a NumPy view) are not seen by the guard either, as they are not
by autograd's checks. The guard holds the buffers by weak reference.
"""
from __future__ import annotations

import copy
import operator
import warnings
import weakref
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


# How the graph uses the buffer, followed through views and conversions of it (which may return the tensor itself):
# negated or compared with 0 / 1 (a new bool tensor, followed in turn), then the mask of a select
# (masked_fill(x, mask, value) hides where mask is true; where(mask, x, y) keeps x there). Anything else (arithmetic,
# a write, the graph's output, an op not listed, a mask combined with another) leaves the buffer alone.
_ALIAS_METHODS = {"view", "view_as", "reshape", "reshape_as", "expand", "expand_as", "transpose", "permute",
                  "unsqueeze", "squeeze", "narrow", "select", "t", "contiguous", "to", "type", "type_as", "bool",
                  "float", "half", "bfloat16", "double", "int", "long", "detach", "flatten", "unflatten"}
_ALIAS_FUNCTIONS = {operator.getitem, torch.reshape, torch.transpose, torch.permute, torch.unsqueeze, torch.squeeze,
                    torch.narrow, torch.select, torch.flatten, torch.t, torch.detach}
_NOT = {("call_method", "logical_not"), ("call_method", "__invert__"), ("call_method", "bitwise_not"),
        ("call_function", operator.invert), ("call_function", torch.logical_not), ("call_function", torch.bitwise_not)}
# comparisons with a constant: for 0/1 values, == 0 and != 1 negate, != 0 and == 1 keep
_COMPARE = {("call_method", "eq"): True, ("call_method", "__eq__"): True, ("call_function", operator.eq): True,
            ("call_function", torch.eq): True, ("call_method", "ne"): False, ("call_method", "__ne__"): False,
            ("call_function", operator.ne): False, ("call_function", torch.ne): False}


def _arg(node: torch.fx.Node, i: int):
    return node.args[i] if len(node.args) > i else None


def _hidden_by_mask_uses(placeholder: torch.fx.Node) -> set | None:
    """For a 0/1 buffer: {False} when every use hides exactly where the buffer is true (masked_fill(x, buf != 0)),
    {True} when every use hides where it is 0 (masked_fill(x, buf == 0), where(buf, x, -inf)), both when both occur,
    None when some use is not such a select (see above), set() when there is none."""
    hidden, seen = set(), set()
    stack = [(placeholder, False)]  # (node, whether its truth is the buffer's negation)
    while stack:
        node, negated = stack.pop()
        if (node, negated) in seen:
            continue
        seen.add((node, negated))
        for user in node.users:
            key = (user.op, user.target)
            first = _arg(user, 0) is node
            if first and (user.op == "call_method" and user.target in _ALIAS_METHODS or
                          user.op == "call_function" and user.target in _ALIAS_FUNCTIONS):
                stack.append((user, negated))
            elif key in _NOT and first:
                stack.append((user, not negated))
            elif key in _COMPARE and len(user.args) == 2 and user.args[1 if first else 0] in (0, 1, 0.0, 1.0, False,
                                                                                             True):
                other = user.args[1 if first else 0]
                stack.append((user, negated != (_COMPARE[key] == (other in (0, False)))))
            elif user.op == "call_method" and user.target in ("masked_fill", "masked_fill_") and \
                    _arg(user, 1) is node and not first:
                hidden.add(negated)
            elif user.op == "call_function" and user.target is torch.masked_fill and _arg(user, 1) is node and \
                    not first:
                hidden.add(negated)
            elif user.op == "call_function" and user.target is torch.where and first and len(user.args) == 3 and \
                    isinstance(user.args[1], (int, float)) != isinstance(user.args[2], (int, float)):
                # where(mask, x, fill) hides where mask is false, where(mask, fill, x) where it is true (the fill a
                # Python number, the other a tensor)
                hidden.add(negated if isinstance(user.args[1], (int, float)) else not negated)
            else:
                return None
    return hidden


# The triangles taken: name -> (torch function, diagonal) building it from ones. "triu_strict" is the usual spelling of
# what to hide (triu(ones, 1): the keys after the query).
TRIANGLES = {"tril": (torch.tril, 0), "triu": (torch.triu, 0), "triu_strict": (torch.triu, 1)}


def triangle_kind(t) -> str | None:
    """The TRIANGLES name of ``t`` when every trailing (rows, cols) slice of it is that same 0/1 (False/True) triangle;
    else None. Parameters, tensors that need grad, fake / meta / sparse tensors are None."""
    if not isinstance(t, torch.Tensor) or isinstance(t, torch.nn.Parameter) or t.requires_grad:
        return None
    if torch._subclasses.fake_tensor.is_fake(t) or t.layout != torch.strided or t.is_meta or t.is_complex() or \
            t.dim() < 2 or t.numel() == 0 or t.numel() > MAX_BUFFER_ELEMENTS:
        return None
    with torch.no_grad():
        m = t.reshape(-1, t.shape[-2], t.shape[-1])
        ones = torch.ones(m.shape[-2:], dtype=t.dtype, device=t.device)
        for kind, (build, diagonal) in TRIANGLES.items():
            if bool((m == build(ones, diagonal)).all()):
                return kind
    return None


def _fingerprint(t: torch.Tensor) -> tuple:
    """What the guard compares per call: the storage (a `.data =` replacement changes it), the offset, the version."""
    return t.untyped_storage().data_ptr(), t.storage_offset(), t._version


@dataclass
class _Entry:
    index: int          # position among the graph's inputs
    ref: weakref.ref    # the buffer at compile time
    fingerprint: tuple
    shape: torch.Size
    dtype: torch.dtype
    kind: str
    name: str           # the module buffer (its Dynamo source), for the warning
    accepted: list = field(default_factory=list)  # (weakref, fingerprint) of arguments found to hold the triangle


def take_mask_buffers(gm: torch.fx.GraphModule, example_inputs) -> tuple[torch.fx.GraphModule, list[_Entry]]:
    """``gm`` with its triangular mask buffers replaced by the ops that build them (a new GraphModule over a copy of
    the graph; ``gm`` itself is left as it was), and the entries the guard checks. ``gm`` unchanged and no entries
    when there is no such buffer."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return gm, []
    chosen = []
    for i, (node, t) in enumerate(zip(placeholders, example_inputs)):
        if node.users and _is_module_buffer(node):
            hidden = _hidden_by_mask_uses(node)
            kind = triangle_kind(t) if hidden else None
            # taken where every use hides what a causal mask hides: a tril of ones hiding where it is 0, or a strict
            # triu hiding where it is 1 (the usual [:T, :T] slices then make causal=True; other slices make whatever
            # band the pass reads from the values). A triangle hiding the other side would stay a bias, and the graph
            # would build the whole triangle on every call for nothing.
            if (kind == "tril" and hidden == {True}) or (kind == "triu_strict" and hidden == {False}):
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
        # the buffer's value rebuilt by ops (what triangle_kind found it to be), which the pass evaluates at compile
        # time like any mask built in the graph; a tensor constant would trip AOT autograd's fake-tensor tracing, and a
        # registered buffer would be lifted to an input again
        with graph.inserting_before(first_op):
            ones = graph.call_function(torch.ones, (tuple(t.shape),), {"dtype": t.dtype, "device": t.device})
            build, diagonal = TRIANGLES[kind]
            value = graph.call_function(build, (ones, diagonal))
        ph.replace_all_uses_with(value)
        source = getattr(ph.meta.get("grapharg"), "source", None)
        entries.append(_Entry(i, weakref.ref(t), _fingerprint(t), t.shape, t.dtype, kind,
                              getattr(source, "name", ph.name)))
    new.recompile()
    return new, entries


def guarded(compiled, fallback, entries: list[_Entry]):
    """``compiled`` behind the buffer guard (see the module docstring). ``fallback``: the graph as Dynamo gave it."""
    if not entries:
        return compiled
    state = {"fallen_back": False}

    def still_valid(args) -> bool:
        for e in entries:
            t = args[e.index]
            if (e.ref() is t and _fingerprint(t) == e.fingerprint) or \
                    any(r() is t and _fingerprint(t) == f for r, f in e.accepted):
                continue
            # modified in place or replaced: the graph builds the triangle itself, so the argument must hold it
            if t.shape != e.shape or t.dtype != e.dtype or triangle_kind(t) != e.kind:
                warnings.warn(f"fa2: the causal-mask buffer {e.name} changed after torch.compile took its value as "
                              "a constant; this compiled graph runs uncompiled from now on (torch._dynamo.reset() and "
                              "compile again for speed)", stacklevel=3)
                return False
            if e.ref() is t:
                e.fingerprint = _fingerprint(t)
            else:  # (a few other tensors remembered)
                e.accepted = [(r, f) for r, f in e.accepted if r() is not None and r() is not t][-3:] + \
                    [(weakref.ref(t), _fingerprint(t))]
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
