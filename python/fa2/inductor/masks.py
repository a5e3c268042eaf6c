"""Mask recognition: prove that a mask built in the graph is a causal / sliding-window band.

A mask is interpreted abstractly over the index of each of its dims (counted from the right: -1 is the key index
``j``, -2 the query index ``i``). Integer tensors built from ``arange``/``iota`` are affine in the indices
(:class:`Lin`); comparisons of those give conjunctions of linear constraints ``L >= 0`` (:class:`Pred`); ``where``
over such predicates with constant branches gives :class:`Sel`. ``tril``/``triu``/``masked_fill`` decompose to the
same ops. A predicate whose constraints all have the form ``lo <= j - i <= hi`` is a band and maps exactly onto fa2's
``causal`` / ``window_left`` / ``window_right`` (bottom-right aligned: query i sees keys
``[i + sk - sq - left, i + sk - sq + right]``). Anything that depends on data (a padding mask, a cache position
tensor passed in) is not a band; it is then passed to fa2 as ``attn_bias`` unchanged. Sizes may be symbolic: bounds
are sympy expressions and must simplify to integers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import sympy
import torch

from ._compat import aten, prims, real_mode, sym_expr

_LIFT = getattr(aten, "lift_fresh_copy", None)


# ---- abstract values ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Lin:
    """Integer tensor: const + sum(coef[d] * index_d), d a dim counted from the right (-1 = last)."""
    coef: tuple  # ((dim, int), ...)
    const: sympy.Expr
    ndim: int

    def c(self) -> dict:
        return dict(self.coef)


def _lin(coef: dict, const, ndim: int) -> Lin:
    return Lin(tuple(sorted((d, a) for d, a in coef.items() if a != 0)), sympy.sympify(const), ndim)


@dataclass(frozen=True)
class Pred:
    """Boolean tensor: the conjunction of ``atom >= 0`` over its atoms (no atoms: all True); ``false``: all False.
    ``data``: more factors of the conjunction that are graph tensors (a padding mask read from the inputs), as
    (node, negated) pairs, each right-aligned with the mask and not depending on the query index
    (:func:`query_invariant`): a key-row mask."""
    atoms: tuple = ()
    ndim: int = 0
    false: bool = False
    data: tuple = ()
    doc: tuple = ()     # (ids node, its batch dim's place counted from the right or None): ids[b, i] == ids[b, j]


@dataclass(frozen=True)
class Sel:
    """``where(pred, a, b)`` with scalar a, b."""
    pred: Pred
    a: float
    b: float
    ndim: int


def _remap(value, mapping: dict, ndim: int):
    """Move dims: mapping old dim -> new dim (dims not in mapping must have coefficient 0)."""
    if isinstance(value, Lin):
        coef = {}
        for d, a in value.coef:
            if d not in mapping:
                return None
            coef[mapping[d]] = a
        return _lin(coef, value.const, ndim)
    if isinstance(value, Pred):
        atoms = []
        for atom in value.atoms:
            moved = _remap(atom, mapping, ndim)
            if moved is None:
                return None
            atoms.append(moved)
        for node, _ in value.data:  # (a graph tensor cannot move its dims here: only leading dims may come and go)
            if any(mapping.get(d) != d for d in range(-len(_shape(node) or ()), 0)):
                return None
        doc = []
        for ids, batch_dim in value.doc:
            if mapping.get(-1) != -1 or mapping.get(-2) != -2 or (batch_dim is not None and batch_dim not in mapping):
                return None
            doc.append((ids, None if batch_dim is None else mapping[batch_dim]))
        return Pred(tuple(atoms), ndim, value.false, value.data, tuple(doc))
    if isinstance(value, Sel):
        pred = _remap(value.pred, mapping, ndim)
        return None if pred is None else Sel(pred, value.a, value.b, ndim)
    return None


def _drop_dims(value, dims: set):
    """Zero the coefficients of size-1 dims (their index is always 0)."""
    if isinstance(value, Lin):
        return _lin({d: a for d, a in value.coef if d not in dims}, value.const, value.ndim)
    if isinstance(value, Pred):
        return Pred(tuple(_drop_dims(a, dims) for a in value.atoms), value.ndim, value.false, value.data, value.doc)
    if isinstance(value, Sel):
        return Sel(_drop_dims(value.pred, dims), value.a, value.b, value.ndim)
    return value


def _ndim(value) -> int:
    return value.ndim if isinstance(value, (Lin, Pred, Sel)) else 0


def _lin_add(x: Lin, y: Lin, sign: int = 1) -> Lin:
    coef = x.c()
    for d, a in y.coef:
        coef[d] = coef.get(d, 0) + sign * a
    return _lin(coef, x.const + sign * y.const, max(x.ndim, y.ndim))


def _lin_scale(x: Lin, k: int) -> Lin:
    return _lin({d: a * k for d, a in x.coef}, x.const * k, x.ndim)


def _pred_and(x: Pred, y: Pred) -> Pred:
    return Pred(x.atoms + y.atoms, max(x.ndim, y.ndim), x.false or y.false, x.data + y.data, x.doc + y.doc)


def _pred_not(x: Pred):
    if x.false:
        return Pred((), x.ndim)
    if x.doc:
        return None
    if x.data:
        if len(x.data) == 1 and not x.atoms:
            node, negated = x.data[0]
            return Pred((), x.ndim, data=((node, not negated),))
        return None  # a disjunction
    if not x.atoms:
        return Pred((), x.ndim, True)
    if len(x.atoms) == 1:  # not (L >= 0)  <=>  -L - 1 >= 0 (integers)
        atom = x.atoms[0]
        return Pred((_lin_add(_lin_scale(atom, -1), _lin({}, -1, atom.ndim)),), x.ndim)
    return None  # a disjunction


def _as_pred(value):
    if isinstance(value, Pred):
        return value
    if isinstance(value, Sel):  # a bool tensor made by where(p, True, False)
        if bool(value.a) and not bool(value.b):
            return value.pred
        if not bool(value.a) and bool(value.b):
            return _pred_not(value.pred)
        if bool(value.a) == bool(value.b):
            return Pred((), value.ndim, not bool(value.a))
    return None


# ---- constants in the graph --------------------------------------------------------------------------------

def scalar_value(arg, graph_module=None):
    """The Python number a graph argument stands for (a literal, scalar_tensor, full, a 1-element constant), else
    None."""
    if isinstance(arg, bool):
        return arg
    if isinstance(arg, (int, float)):
        return arg
    if not isinstance(arg, torch.fx.Node):
        return None
    node = arg
    for _ in range(4):
        if node.op == "call_function" and node.target in (aten.clone.default, aten.alias.default,
                                                           prims.convert_element_type.default,
                                                           aten._to_copy.default, aten.expand.default,
                                                           aten.view.default) + ((_LIFT.default,) if _LIFT else ()):
            node = node.args[0]
            if not isinstance(node, torch.fx.Node):
                return None
            continue
        break
    if node.op == "call_function":
        if node.target == aten.scalar_tensor.default:
            return node.args[0]
        if node.target in (aten.full.default, aten.full_like.default):
            return node.args[1]
        if node.target in (aten.zeros_like.default, aten.zeros.default):
            return 0.0
        return None
    if node.op == "get_attr":
        gm = graph_module if graph_module is not None else node.graph.owning_module
        try:
            value = gm
            for part in str(node.target).split("."):
                value = getattr(value, part)
        except AttributeError:
            return None
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_meta:
            try:
                with real_mode():
                    return value.item()
            except Exception:  # noqa: BLE001 - fake or symbolic constant
                return None
    return None


def _shape(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _is_one(x) -> bool:
    return isinstance(x, int) and x == 1 or (isinstance(x, torch.SymInt) and sym_expr(x) == 1)


def _is_id_tensor(node) -> bool:
    """Integer or bool values (ids compared for equality: no NaN, every id equal to itself)."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and not val.is_floating_point() and not val.is_complex()


def _whole_slice(node) -> bool:
    """A slice that keeps everything (``x[:, None]`` traces as one under dynamic shapes)."""
    if node.target != aten.slice.Tensor or (len(node.args) > 4 and node.args[4] != 1):
        return False
    inp, out = _shape(node.args[0]), _shape(node)
    return inp is not None and out is not None and len(inp) == len(out) and \
        all(sym_expr(a) is not None and sym_expr(a) == sym_expr(b) for a, b in zip(inp, out))


def _view_inserting_ones(inp, out, dims):
    """The places of ``dims`` of ``inp`` after a view to ``out`` that only inserts or removes size-1 dims (None if it
    does more, or removes one of ``dims``)."""
    if inp is None or out is None:
        return None
    mapping, j = {}, 0
    for d, size in enumerate(inp):
        while j < len(out) and _is_one(out[j]) and not _is_one(size):
            j += 1
        if j < len(out) and sym_expr(out[j]) == sym_expr(size):
            mapping[d] = j
            j += 1
        elif _is_one(size):
            continue
        else:
            return None
    if any(not _is_one(out[k]) for k in range(len(out)) if k not in mapping.values()):
        return None
    return [mapping[d] for d in dims] if all(d in mapping for d in dims) else None


def _is_bool(node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dtype == torch.bool


# Elementwise ops (broadcasting their tensor arguments right-aligned): their result does not depend on an index that
# none of their inputs depends on.
_POINTWISE = {"add", "sub", "rsub", "mul", "div", "neg", "abs", "where", "eq", "ne", "lt", "le", "gt", "ge",
              "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "logical_and", "logical_or", "logical_xor",
              "logical_not", "convert_element_type", "_to_copy", "clone", "alias", "lift_fresh_copy", "masked_fill",
              "minimum", "maximum", "clamp", "clamp_min", "clamp_max", "sign", "exp", "log", "sqrt", "rsqrt", "pow",
              "reciprocal", "fill", "scalar_tensor", "full", "full_like", "zeros_like", "ones_like"}


def query_invariant(node, depth: int = 0, memo: dict | None = None) -> bool:
    """Whether ``node``'s values do not depend on its second-to-last index (the query of a mask), by the graph's
    structure alone: that dim has size 1 (or there is none), or the node broadcasts (expand) or is computed
    elementwise from tensors of which that holds. Then ``node[..., :1, :]`` broadcast over the queries is ``node``."""
    shape = _shape(node)
    if shape is None:
        return isinstance(node, (bool, int, float))
    if len(shape) < 2 or _is_one(shape[-2]):
        return True
    if depth > 32 or node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    memo = {} if memo is None else memo
    if node not in memo:   # (each node once: a mask's graph may share subexpressions)
        memo[node] = False
        memo[node] = _query_invariant_op(node, shape, depth, memo)
    return memo[node]


def _query_invariant_op(node, shape, depth, memo) -> bool:
    name = node.target.overloadpacket.__name__
    if name == "expand":
        src = _shape(node.args[0])
        return src is not None and (len(src) < 2 or _is_one(src[-2]) or query_invariant(node.args[0], depth + 1, memo))
    if name in ("view", "_unsafe_view", "reshape", "unsqueeze", "squeeze"):
        # the last two dims kept as they are: every (query, key) pair keeps its place
        src = _shape(node.args[0])
        return src is not None and len(src) >= 2 and all(sym_expr(a) == sym_expr(b) and sym_expr(a) is not None
                                                          for a, b in zip(src[-2:], shape[-2:])) \
            and query_invariant(node.args[0], depth + 1, memo)
    if name == "slice" and isinstance(node.target, torch._ops.OpOverload):
        return query_invariant(node.args[0], depth + 1, memo)
    if name in _POINTWISE:
        if torch.Tag.nondeterministic_seeded in node.target.tags:
            return False
        return all(query_invariant(a, depth + 1, memo) for a in node.all_input_nodes)
    return False


# ---- the interpreter ---------------------------------------------------------------------------------------

_CMP = {
    aten.le.Tensor: "le", aten.le.Scalar: "le", aten.lt.Tensor: "lt", aten.lt.Scalar: "lt",
    aten.ge.Tensor: "ge", aten.ge.Scalar: "ge", aten.gt.Tensor: "gt", aten.gt.Scalar: "gt",
    aten.eq.Tensor: "eq", aten.eq.Scalar: "eq", aten.ne.Tensor: "ne", aten.ne.Scalar: "ne",
}
_AND = {aten.logical_and.default, aten.bitwise_and.Tensor, aten.__and__.Tensor}
_OR = {aten.logical_or.default, aten.bitwise_or.Tensor, aten.__or__.Tensor}
_NOT = {aten.logical_not.default, aten.bitwise_not.default}
_IDENTITY = {aten.clone.default, aten.alias.default, aten.contiguous.default if hasattr(aten, "contiguous") else None,
             prims.convert_element_type.default, aten._to_copy.default}
_IDENTITY.discard(None)
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}


class MaskInterpreter:
    """key_rows: a boolean tensor the interpreter cannot model but that does not depend on the query index becomes a
    data factor of a Pred (Pred.data), so that ``band & padding[b, None, None, :]`` splits into the band's flags
    and a key-row mask."""

    def __init__(self, key_rows: bool = False):
        self.memo: dict = {}
        self.key_rows = key_rows

    def value(self, arg):
        if isinstance(arg, torch.fx.Node):
            if arg not in self.memo:
                self.memo[arg] = None  # cycles cannot happen in a DAG; this also bounds recursion on failure
                try:
                    self.memo[arg] = self._eval(arg)
                except (TypeError, ValueError, AttributeError, IndexError, KeyError):
                    self.memo[arg] = None
                if self.memo[arg] is None and self.key_rows and _is_bool(arg) and query_invariant(arg):
                    # a boolean graph tensor (a padding mask read from the inputs) that the query index does not
                    # change: a factor of the mask kept as it is
                    self.memo[arg] = Pred((), len(_shape(arg)), data=((arg, False),))
            return self.memo[arg]
        if isinstance(arg, bool):
            return Pred((), 0, not arg)
        if isinstance(arg, int):
            return _lin({}, arg, 0)
        if isinstance(arg, torch.SymInt):
            return _lin({}, sym_expr(arg), 0)
        return None

    def _scalar_int(self, arg):
        if isinstance(arg, torch.fx.Node):
            val = arg.meta.get("val")
            if isinstance(val, torch.SymInt):
                return _lin({}, sym_expr(val), 0)
        return self.value(arg) if not isinstance(arg, float) else None

    def _eval(self, node: torch.fx.Node):
        if node.op != "call_function":
            return None
        t, args = node.target, node.args
        shape = _shape(node)
        if t == prims.iota.default:
            start = node.kwargs.get("start", 0)
            step = node.kwargs.get("step", 1)
            if sym_expr(step) is None or sym_expr(start) is None:
                return None
            return _lin({-1: int(step)}, sym_expr(start), 1)
        if t in (aten.arange.default, aten.arange.start, aten.arange.start_step):
            if t == aten.arange.default:
                start, step = 0, 1
            else:
                start = args[0]
                step = args[2] if len(args) > 2 else node.kwargs.get("step", 1)
            if sym_expr(start) is None or not isinstance(step, int):
                return None
            return _lin({-1: step}, sym_expr(start), 1)
        if t in (aten.add.Tensor, aten.sub.Tensor, aten.add.Scalar, aten.sub.Scalar):
            x, y = self._scalar_int(args[0]), self._scalar_int(args[1])
            alpha = node.kwargs.get("alpha", 1)
            if isinstance(x, Lin) and isinstance(y, Lin) and isinstance(alpha, int):
                sign = -alpha if t in (aten.sub.Tensor, aten.sub.Scalar) else alpha
                return _lin_add(x, _lin_scale(y, sign))
            return None
        if t in (aten.mul.Tensor, aten.mul.Scalar):
            x, y = self.value(args[0]), self.value(args[1])
            if isinstance(x, Lin) and isinstance(y, Lin):
                if not y.coef and y.const.is_Integer:
                    return _lin_scale(x, int(y.const))
                if not x.coef and x.const.is_Integer:
                    return _lin_scale(y, int(x.const))
                return None
            px, py = _as_pred(x), _as_pred(y)
            if px is not None and py is not None:  # bool * bool
                return _pred_and(px, py)
            return None
        if t == aten.neg.default:
            x = self.value(args[0])
            return _lin_scale(x, -1) if isinstance(x, Lin) else None
        if t in _CMP:
            return self._compare(_CMP[t], args[0], args[1])
        if t in _AND:
            px, py = _as_pred(self.value(args[0])), _as_pred(self.value(args[1]))
            return _pred_and(px, py) if px is not None and py is not None else None
        if t in _OR:
            px, py = _as_pred(self.value(args[0])), _as_pred(self.value(args[1]))
            if px is None or py is None:
                return None
            for a, b in ((px, py), (py, px)):
                if a.false:
                    return b
                if not a.atoms and not a.false and not a.data and not a.doc:
                    return Pred((), max(a.ndim, b.ndim))
            return None
        if t in _NOT:
            x = self.value(args[0])
            if isinstance(x, Sel):
                return Sel(x.pred, not bool(x.a), not bool(x.b), x.ndim)
            px = _as_pred(x)
            return _pred_not(px) if px is not None else None
        if t == aten.full.default:
            size, fill = args[0], args[1]
            dtype = node.kwargs.get("dtype")
            if dtype == torch.bool or isinstance(fill, bool):
                return Pred((), len(size), not bool(fill))
            if isinstance(fill, (int, float)):
                return Sel(Pred((), len(size)), fill, fill, len(size))
            return None
        if t == aten.scalar_tensor.default:
            fill = args[0]
            return Sel(Pred((), 0), fill, fill, 0) if isinstance(fill, (int, float)) else None
        if t == aten.where.self:
            return self._where(node)
        if t in (aten.tril.default, aten.triu.default):
            x = self.value(args[0])
            diagonal = args[1] if len(args) > 1 else node.kwargs.get("diagonal", 0)
            if not isinstance(x, (Sel, Pred)) or sym_expr(diagonal) is None or shape is None or len(shape) < 2:
                return None
            nd = len(shape)
            if t == aten.tril.default:   # keep j <= i + diagonal: i - j + diagonal >= 0
                atom = _lin({-2: 1, -1: -1}, sym_expr(diagonal), nd)
            else:                        # keep j >= i + diagonal: j - i - diagonal >= 0
                atom = _lin({-2: -1, -1: 1}, -sym_expr(diagonal), nd)
            band = Pred((atom,), nd)
            if isinstance(x, Pred):
                return _pred_and(x, band)
            return Sel(_pred_and(x.pred, band), x.a, 0, nd) if x.a == x.b else None
        if t in _IDENTITY or (_LIFT is not None and t == _LIFT.default):
            return self.value(args[0])
        if t == aten.slice.Tensor:
            return self._slice(node)
        if t == aten.constant_pad_nd.default:
            return None   # only meaningful when a slice removes the padding again (see _slice)
        if t == aten.index.Tensor and shape is not None:
            # indexing a tensor that holds one value everywhere (e.g. an all-ones padding mask made in the model)
            x = self.value(args[0])
            if isinstance(x, Pred) and not x.atoms and not x.data and not x.doc:
                return Pred((), len(shape), x.false)
            if isinstance(x, Sel) and x.a == x.b:
                return Sel(Pred((), len(shape)), x.a, x.b, len(shape))
            return None
        if t == aten.unsqueeze.default:
            return self._unsqueeze(self.value(args[0]), args[1])
        if t in (aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default) or t in _VIEWS:
            return self._reshape(node)
        if t == aten.expand.default:
            x = self.value(args[0])
            in_shape = _shape(args[0])
            if x is None or in_shape is None:
                return None
            ones = {d - len(in_shape) for d, s in enumerate(in_shape) if _is_one(s)}
            x = _drop_dims(x, ones)
            nd = len(args[1])
            return _remap(x, {d: d for d in range(-_ndim(x), 0)}, nd)
        if t == aten.permute.default:
            x = self.value(args[0])
            if x is None:
                return None
            nd = _ndim(x)
            dims = [d % nd for d in args[1]]
            mapping = {dims[o] - nd: o - nd for o in range(nd)}
            return _remap(x, mapping, nd)
        if t == aten.transpose.int:
            x = self.value(args[0])
            if x is None:
                return None
            nd = _ndim(x)
            a, b = args[1] % nd - nd, args[2] % nd - nd
            mapping = {d: d for d in range(-nd, 0)}
            mapping[a], mapping[b] = b, a
            return _remap(x, mapping, nd)
        return None

    def _compare(self, op, a, b):
        if op == "eq" and self.key_rows:
            doc = self._same_id(a, b)
            if doc is not None:
                return doc
        x, y = self._scalar_int(a), self._scalar_int(b)
        if isinstance(x, Lin) and isinstance(y, Lin):
            nd = max(x.ndim, y.ndim)
            diff = _lin_add(y, x, -1)  # y - x
            one = _lin({}, 1, nd)
            if op == "le":
                return Pred((diff,), nd)
            if op == "lt":
                return Pred((_lin_add(diff, one, -1),), nd)
            if op == "ge":
                return Pred((_lin_scale(diff, -1),), nd)
            if op == "gt":
                return Pred((_lin_add(_lin_scale(diff, -1), one, -1),), nd)
            if op == "eq":
                return Pred((diff, _lin_scale(diff, -1)), nd)
            return None
        # a 0/1 (or 0/-inf) mask compared with a constant: (mask == 0) etc.
        sel, other = (x, b) if isinstance(x, Sel) else (y, a) if isinstance(y, Sel) else (None, None)
        c = scalar_value(other)
        if sel is None or c is None or op not in ("eq", "ne"):
            return None
        hit_a, hit_b = (sel.a == c), (sel.b == c)
        if op == "ne":
            hit_a, hit_b = not hit_a, not hit_b
        return Sel(sel.pred, hit_a, hit_b, sel.ndim)

    def _same_id(self, a, b):
        """``ids[b, i] == ids[b, j]`` (a document mask: query i and key j in the same sequence) as Pred.doc, when a
        and b read one integer tensor of per-token ids at the query and at the key index."""
        ra, rb = self._token_read(a), self._token_read(b)
        if ra is None or rb is None or ra[0] is not rb[0] or ra[2] != rb[2] or {ra[1], rb[1]} != {-2, -1}:
            return None
        nd = max(len(_shape(a)), len(_shape(b)))
        return Pred((), nd, doc=((ra[0], ra[2]),))

    def _token_read(self, node):
        """(ids, the dim of the result that carries the token index (-2 or -1), the dim that carries ids' batch dim
        or None), both counted from the right, when ``node`` is a 1-D / 2-D integer tensor ``ids`` read with its last
        dim at the query or the key index: unsqueezed (``ids[:, None, :, None]``), or gathered as
        ``ids[batch_arange, position_arange]`` (transformers' packed-sequence mask); else None."""
        shape = _shape(node)
        if shape is None:
            return None
        if node.op == "call_function" and node.target == aten.index.Tensor:
            src, indices = node.args[0], list(node.args[1])
            src_shape = _shape(src)
            if src_shape is None or len(indices) != len(src_shape) or len(indices) not in (1, 2) or \
                    not _is_id_tensor(src):
                return None
            lins = [self.value(i) if isinstance(i, torch.fx.Node) else None for i in indices]
            if not all(isinstance(x, Lin) and len(x.coef) == 1 and x.coef[0][1] == 1 and x.const == 0 for x in lins):
                return None
            token = lins[-1].coef[0][0]
            batch = lins[0].coef[0][0] if len(lins) == 2 else None
            return (src, token, batch) if token in (-2, -1) and batch != token else None
        # unsqueezes / views that insert size-1 dims / expands of size-1 dims, down to ids
        dims, cur = None, node
        path = []
        while isinstance(cur, torch.fx.Node) and cur.op == "call_function" and (cur.target in {
                aten.unsqueeze.default, aten.expand.default, aten.clone.default, aten.alias.default} | _VIEWS
                or _whole_slice(cur)):
            if cur.target != aten.slice.Tensor:
                path.append(cur)
            cur = cur.args[0]
        src_shape = _shape(cur)
        if not path or src_shape is None or len(src_shape) not in (1, 2) or not _is_id_tensor(cur):
            return None
        dims = list(range(len(src_shape)))    # where each dim of ids is in the current tensor (left-aligned)
        for op in reversed(path):
            inp, out = _shape(op.args[0]), _shape(op)
            if op.target == aten.unsqueeze.default:
                at = op.args[1] % len(out)
                dims = [d + 1 if d >= at else d for d in dims]
            elif op.target == aten.expand.default:
                if len(out) != len(inp) or any(sym_expr(out[d]) != sym_expr(inp[d]) for d in dims):
                    return None
            elif op.target in _VIEWS:
                dims = _view_inserting_ones(inp, out, dims)
                if dims is None:
                    return None
        nd = len(shape)
        token, batch = dims[-1] - nd, (dims[0] - nd if len(dims) == 2 else None)
        return (cur, token, batch) if token in (-2, -1) else None

    def _where(self, node):
        cond, a, b = node.args
        p = _as_pred(self.value(cond))
        if p is None:
            return None
        va, vb = scalar_value(a), scalar_value(b)
        sa = self.value(a) if va is None else None
        sb = self.value(b) if vb is None else None
        nd = max(p.ndim, _ndim(sa), _ndim(sb), len(_shape(node) or ()))
        if va is not None and vb is not None:
            return Sel(p, va, vb, nd)
        # nested: where(p, where(q, x, y), y) == where(p and q, x, y)
        if isinstance(sa, Sel) and vb is not None and sa.b == vb:
            return Sel(_pred_and(p, sa.pred), sa.a, vb, nd)
        if isinstance(sb, Sel) and va is not None and sb.a == va:
            # where(p, x, where(q, x, y)) == where(p or q, ...): only when one side is trivial
            q = sb.pred
            if not q.atoms and not q.false and not q.data and not q.doc:
                return Sel(Pred((), nd), va, va, nd)
        if isinstance(sb, Sel) and va is not None and sb.b == va and sb.a != va:
            # where(p, c, where(q, a, c)) == where(not p and q, a, c) (a padding masked_fill'ed onto a causal mask)
            not_p = _pred_not(p)
            if not_p is not None:
                return Sel(_pred_and(not_p, sb.pred), sb.a, va, nd)
        if isinstance(sa, Sel) and sa.a == sa.b and vb is not None:
            return Sel(p, sa.a, vb, nd)
        return None

    def _unsqueeze(self, x, dim):
        if x is None:
            return None
        nd = _ndim(x) + 1
        pos = dim % nd            # position in the output
        new = pos - nd            # its dim counted from the right
        mapping = {d: (d if d > new else d - 1) for d in range(-(nd - 1), 0)}
        return _remap(x, mapping, nd)

    def _reshape(self, node):
        """Views that only add or drop size-1 dims."""
        x = self.value(node.args[0])
        in_shape, out_shape = _shape(node.args[0]), _shape(node)
        if x is None or in_shape is None or out_shape is None:
            return None
        ones = {d - len(in_shape) for d, s in enumerate(in_shape) if _is_one(s)}
        x = _drop_dims(x, ones)
        src = [d - len(in_shape) for d, s in enumerate(in_shape) if not _is_one(s)]
        dst = [d - len(out_shape) for d, s in enumerate(out_shape) if not _is_one(s)]
        if len(src) != len(dst):
            return None
        for s, d in zip(src, dst):
            if sym_expr(in_shape[s]) != sym_expr(out_shape[d]):
                return None
        return _remap(x, dict(zip(src, dst)), len(out_shape))

    def _slice(self, node):
        src = node.args[0]
        if isinstance(src, torch.fx.Node) and src.op == "call_function" and \
                src.target == aten.constant_pad_nd.default:
            # a mask padded for alignment (SDPA's memory-efficient kernel) and sliced back to its size
            inner = src.args[0]
            if _shape(inner) is not None and _shape(node) is not None and \
                    all(sym_expr(a) == sym_expr(b) for a, b in zip(_shape(inner), _shape(node))) and \
                    (node.args[2] if len(node.args) > 2 else 0) in (0, None):
                return self.value(inner)
            return None
        x = self.value(node.args[0])
        in_shape = _shape(node.args[0])
        dim = node.args[1] if len(node.args) > 1 else 0
        start = node.args[2] if len(node.args) > 2 else 0
        step = node.args[4] if len(node.args) > 4 else 1
        if x is None or in_shape is None or step != 1:
            return None
        start_e = sym_expr(start) if start is not None else sympy.Integer(0)
        if start_e is None:
            return None
        d = dim % len(in_shape) - len(in_shape)
        if start_e.is_Integer and int(start_e) < 0:
            start_e = sym_expr(in_shape[d]) + start_e
        if start_e == 0:
            return x
        # index k of the slice is index k + start of the input
        if isinstance(x, Lin):
            return _lin(x.c(), x.const + x.c().get(d, 0) * start_e, x.ndim)
        if isinstance(x, Pred):
            if x.data or x.doc:
                return None
            atoms = tuple(_lin(a.c(), a.const + a.c().get(d, 0) * start_e, a.ndim) for a in x.atoms)
            return Pred(atoms, x.ndim, x.false)
        return None


# ---- bands ---------------------------------------------------------------------------------------------------

@dataclass
class Band:
    """Query i sees key j iff lo <= j - i <= hi (None: unbounded), for i < sq, j < sk."""
    lo: sympy.Expr | None = None
    hi: sympy.Expr | None = None
    finite_fill: bool = False     # masked entries got a finite (dtype-min) value, not -inf

    def flags(self, sq, sk):
        """(causal, window_left, window_right) for fa2, or a reason string."""
        offset = sympy.simplify(sk - sq)
        left = right = None
        if self.hi is not None:
            right = sympy.simplify(self.hi - offset)
            if not right.is_Integer:
                return f"the mask's upper diagonal ({self.hi}) is not a constant offset from seqlen_k - seqlen_q"
            right = int(right)
            if right < 0:
                return "the mask hides the bottom-right diagonal (top-left causal with seqlen_q < seqlen_k)"
        if self.lo is not None:
            left = sympy.simplify(offset - self.lo)
            if not left.is_Integer:
                return f"the mask's lower diagonal ({self.lo}) is not a constant offset from seqlen_k - seqlen_q"
            left = int(left)
            if left < 0:
                return "the mask's window is left of the diagonal"
        if self.finite_fill:
            # A finite fill gives a row that sees no key a uniform average, fa2 gives 0: only rewrite when no row is
            # empty: every row i has a key j in [i + lo, i + hi] within [0, sk).
            if self.hi is not None and not _provably_nonneg(self.hi):
                return "some query rows see no key (masked with a finite value)"
            if self.lo is not None and not _provably_nonneg(offset - self.lo):
                return "some query rows see no key (masked with a finite value)"
        causal = right == 0
        return causal, (-1 if left is None else left), (-1 if right is None or causal else right)


def _provably_nonneg(expr) -> bool:
    expr = sympy.simplify(expr)
    if expr.is_Integer:
        return int(expr) >= 0
    return bool(expr.is_nonnegative)


def band_of(pred: Pred, sq, sk, score_ndim: int):
    """The band a predicate describes over (i = dim -2, j = dim -1), or a reason string."""
    if pred.false:
        return "the mask hides every key"
    lo = hi = None
    sq_e, sk_e = sym_expr(sq), sym_expr(sk)
    if sq_e is None or sk_e is None:
        return "unknown sequence lengths"
    for atom in pred.atoms:
        coef = atom.c()
        if any(d not in (-1, -2) for d in coef):
            return "the mask depends on the batch or head index"
        a_i, a_j, c = coef.get(-2, 0), coef.get(-1, 0), atom.const
        if a_i == 0 and a_j == 0:
            if _provably_nonneg(c):
                continue
            return "the mask is not a causal/window band"
        if a_i == -a_j:
            k = a_j
            if k > 0:      # k (j - i) + c >= 0  =>  j - i >= -c / k
                bound = -c / k if k == 1 else (sympy.ceiling(-c / k) if c.is_Integer else None)
                if bound is None:
                    return "non-integer diagonal"
                lo = bound if lo is None else _tighter(lo, bound, max)
                if lo is None:
                    return "incomparable diagonals"
            else:          # -k' (j - i) + c >= 0  =>  j - i <= c / k'
                kk = -k
                bound = c / kk if kk == 1 else (sympy.floor(c / kk) if c.is_Integer else None)
                if bound is None:
                    return "non-integer diagonal"
                hi = bound if hi is None else _tighter(hi, bound, min)
                if hi is None:
                    return "incomparable diagonals"
            continue
        # a constraint on i or j alone holds everywhere only if its minimum over the ranges is >= 0
        low = c + (a_i * (sq_e - 1) if a_i < 0 else 0) + (a_j * (sk_e - 1) if a_j < 0 else 0)
        if _provably_nonneg(low):
            continue
        return "the mask is not a causal/window band"
    return Band(lo, hi)


def _static_int(x):
    """x as a Python int when it is one (an int, or a SymInt whose expression is an integer), else None."""
    if isinstance(x, int):
        return x
    e = sym_expr(x)
    return int(e) if e is not None and getattr(e, "is_Integer", False) else None


def _tighter(x, y, pick):
    """max/min of two bounds that differ by an integer (None if they are not comparable)."""
    d = sympy.simplify(x - y)
    if not d.is_Integer:
        return None
    if pick is max:
        return x if int(d) >= 0 else y
    return x if int(d) <= 0 else y


# ---- the mask terms of one attention site ---------------------------------------------------------------------

NEG_LARGE = -1e30  # a fill at or below this (or dtype.min) hides a key exactly as -inf does for rows with a key


# float16's minimum / 2: in bfloat16 too, a fill at or below it hides a key. PyTorch's cuDNN SDPA path turns a bool
# mask into where(mask, 0, -65504) whatever the dtype, and the same model must get the same rewrite on every device
# (a hidden key's weight exp(fill + s - max) is 0 in float32 unless the row's scores spread over ~32000).
HALF_HIDING_BOUND = torch.finfo(torch.float16).min / 2


def hiding_bound(dtype) -> float:
    """The largest value that hides a key (-inf included): NEG_LARGE, or a floating dtype's minimum / 2 above it
    (for bfloat16 float16's: HALF_HIDING_BOUND)."""
    if dtype == torch.bfloat16:
        return HALF_HIDING_BOUND
    if dtype is not None and dtype.is_floating_point:
        return max(NEG_LARGE, torch.finfo(dtype).min / 2)
    return NEG_LARGE


def is_hiding_value(value, dtype) -> bool:
    if value is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    return value <= hiding_bound(dtype)


@dataclass
class MaskTerm:
    """One mask/bias contribution found between QK^T and softmax.

    kind "add": ``scores + node`` (float additive); kind "where": ``where(node, scores, fill)`` (keep_if_true) or
    ``where(node, fill, scores)``."""
    kind: str
    node: torch.fx.Node
    keep_if_true: bool = True
    fill: float | None = None
    dtype: torch.dtype | None = None   # of the filled scores (a fill is judged against that dtype's range)
    multiplier: float = 1.0            # "add" before a scaling: the scale it is multiplied by along with q.k
    folded: bool = False               # 3-D, the heads folded into the batch, under 4-D scores (BLOOM's baddbmm)
    overwritten: bool = False          # "add" before a finite-fill where(): hidden keys hold the fill, not it


class BiasEntry(NamedTuple):
    """One part of fa2's attn_bias. kind "add": float additive; "keep" / "drop": bool, True = keep / hide; "fill": a
    bool whose hidden keys got the finite value ``fill`` (the dtype's minimum) in the scores' dtype ``dtype``,
    turned into a float 0/fill bias (rewrite._bias). ``multiplier``: "add" scaled with the scores; ``folded``: 3-D,
    (batch * heads, ...) of 4-D scores (rewrite._bias unfolds it); ``overwritten``: "add" applied before a finite
    fill, which replaces it (value and gradient) at the keys it hides."""
    kind: str
    node: torch.fx.Node
    keep_if_true: bool = True
    fill: float | None = None
    dtype: torch.dtype | None = None
    multiplier: float = 1.0
    folded: bool = False
    overwritten: bool = False
    key_row: bool = False      # the same for every query (query_invariant): read as node[..., :1, :]


@dataclass
class MaskPlan:
    causal: bool = False
    window_left: int = -1
    window_right: int = -1
    # Rows that see no key under the flags and the key-row masks, where eager's finite fill makes every score the
    # fill: eager averages v uniformly over all keys there, fa2 under the flags gives 0 (rewrite._empty_row_fixup).
    # "add": the fill was added (eager differentiates that uniform softmax through q.k); "fill": the scores were
    # overwritten (no gradient to q, k); None: no such rows.
    empty_rows: str | None = None
    # A document mask (per-token sequence ids, the bias entry of kind "doc" holds them): run as varlen
    document: bool = False
    # what is passed as attn_bias (BiasEntry)
    bias: list = field(default_factory=list)
    notes: list = field(default_factory=list)


# A mask that depends on no graph input is a constant of the compiled graph (Hugging Face's inference graphs build
# their causal mask from iota with a packed-sequence check on positions that are themselves iota: no placeholder, but
# through cumsum / index / cat, which the symbolic interpreter does not model). Such a mask is evaluated once at
# compile time, on the CPU, and its exact values compared with the band they would have to be. Bounds: every
# intermediate (and seqlen_q x seqlen_k) at most MAX_CONSTANT_MASK_ELEMENTS elements (intermediates are freed after
# their last use), at most MAX_CONSTANT_MASK_NODES nodes; the result is cached on the node (one mask serves every
# layer of a model).
MAX_CONSTANT_MASK_ELEMENTS = 1 << 27  # (8k x 8k x 2: a few hundred MB of host memory at most, once per graph)
MAX_CONSTANT_MASK_NODES = 400
_BAND_CACHE = "fa2_constant_band"
RECOGNIZED_CONSTANT = "mask recognized from its compile-time value"


def _ancestors(node: torch.fx.Node):
    """The nodes `node` is computed from (itself included), or None when there are too many."""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if len(seen) > MAX_CONSTANT_MASK_NODES:
            return None
        torch.fx.node.map_arg((n.args, n.kwargs), lambda a: stack.append(a))
    return seen


# Ops that only move or select floating-point values (no arithmetic): a float mask built with these from scalars has
# the same 0 / hiding entries whatever precision Inductor's kernel computes in (a conversion keeps 0 at 0 and a
# hiding value hiding).
_FLOAT_SELECT_OPS = {"where", "expand", "view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "permute",
                     "transpose", "clone", "alias", "slice", "select", "index", "cat", "_to_copy",
                     "convert_element_type", "lift_fresh_copy", "full", "full_like", "zeros", "zeros_like", "ones",
                     "ones_like", "masked_fill", "scalar_tensor", "contiguous"}
# The aten / prims ops a compile-time mask may be computed with: deterministic functions of their inputs with the
# same result on the CPU as on the GPU (no custom op, which may read state; no empty*, whose memory is
# uninitialized; no scatter / index_put / sort / topk, whose duplicates or ties may resolve differently).
_CONSTANT_MASK_OPS = _FLOAT_SELECT_OPS | {
    "iota", "arange", "add", "sub", "mul", "neg", "abs", "remainder", "fmod", "floor_divide", "div", "clamp",
    "clamp_min", "clamp_max", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "bitwise_and", "bitwise_or",
    "bitwise_xor", "bitwise_not", "logical_and", "logical_or", "logical_xor", "logical_not", "cumsum", "flip", "stack",
    "tril", "triu", "sum", "any", "all", "amax", "amin", "max", "min", "squeeze_copy", "unsqueeze_copy",
    "expand_copy", "view_copy", "permute_copy", "slice_copy", "select_copy", "_local_scalar_dense", "sign", "diff"}


def _evaluable(n: torch.fx.Node) -> bool:
    """Whether n may be evaluated at compile time as part of root's value: a constant or a deterministic, non-mutating
    op with a static, bounded shape. A floating-point result must come from an op that only selects or moves values
    (_FLOAT_SELECT_OPS), or be a scalar: the mask's values are then exact (integer / bool arithmetic, then selects
    between scalars), whatever precision Inductor's kernel would compute in."""
    if n.op == "get_attr":
        return True
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return False
    if n.target.namespace not in ("aten", "prims") or n.target.overloadpacket.__name__ not in _CONSTANT_MASK_OPS:
        return False
    # (random ops are not in the list; the tag check guards an overload of a listed name that would draw)
    if torch.Tag.nondeterministic_seeded in n.target.tags or n.target._schema.is_mutable:
        return False
    val = n.meta.get("val")
    if isinstance(val, torch.Tensor):
        if not all(isinstance(x, int) for x in val.shape) or val.numel() > MAX_CONSTANT_MASK_ELEMENTS:
            return False
        return not val.is_floating_point() or val.numel() <= 1 or \
            n.target.overloadpacket.__name__ in _FLOAT_SELECT_OPS
    return isinstance(val, (int, float, bool))  # (no val: unknown, not evaluated)


def constant_value(node: torch.fx.Node, graph_module=None):
    """The real (CPU) tensor `node` computes when it is a compile-time constant (_evaluable throughout: no graph
    input, no random op), else None."""
    nodes = _ancestors(node)
    if nodes is None or not all(_evaluable(n) for n in nodes):
        return None
    gm = graph_module if graph_module is not None else node.graph.owning_module
    order = [n for n in node.graph.nodes if n in nodes]  # topological
    last_use = {}
    for i, n in enumerate(order):
        torch.fx.node.map_arg((n.args, n.kwargs), lambda a: last_use.__setitem__(a, i))
    env: dict = {}
    cpu = torch.device("cpu")
    try:
        with real_mode(), torch.no_grad():
            for i, n in enumerate(order):
                if n.op == "get_attr":
                    value = gm
                    for part in str(n.target).split("."):
                        value = getattr(value, part)
                    if not isinstance(value, torch.Tensor) or value.is_meta:
                        return None
                    env[n] = value.detach().to(cpu)
                else:
                    args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: env[a])
                    if "device" in kwargs:
                        kwargs = dict(kwargs, device=cpu)
                    env[n] = n.target(*args, **kwargs)
                for a in [a for a, j in last_use.items() if j == i and a is not node]:
                    env.pop(a, None)  # no later use: free it
    except Exception:  # noqa: BLE001 - an op that cannot run here (or its value cannot be read): the mask stays a bias
        return None
    value = env.get(node)
    return value if isinstance(value, torch.Tensor) else None


def constant_band(node: torch.fx.Node, sq, sk, keep_if_true: bool = True):
    """The Band a compile-time constant mask is, exactly, or None. A bool mask keeps its True entries (False ones
    with keep_if_true=False); a float one adds 0 (kept) or hides (-inf, or a value at or below NEG_LARGE or its dtype's
    min / 2: Band.finite_fill when any hidden value is finite). Every leading (batch, head) slice must be the same."""
    if not (isinstance(sq, int) and isinstance(sk, int)) or sq * sk > MAX_CONSTANT_MASK_ELEMENTS:
        return None
    key = (sq, sk, keep_if_true)
    cache = node.meta.setdefault(_BAND_CACHE, {})
    if key not in cache:
        band = None
        value = constant_value(node)
        if value is not None and value.dim() >= 2 and value.shape[-2] in (1, sq) and value.shape[-1] in (1, sk):
            with real_mode(), torch.no_grad():  # (real tensors: inside Inductor's fake mode otherwise)
                band = _band_of_values(value, sq, sk, keep_if_true)
        cache[key] = band
    band = cache[key]
    return None if band is None else Band(band.lo, band.hi, band.finite_fill)  # (callers set finite_fill on theirs)


def _band_of_values(value: torch.Tensor, sq: int, sk: int, keep_if_true: bool):
    finite_fill = False
    if value.dtype == torch.bool:
        keep = value if keep_if_true else ~value
    elif value.is_floating_point():
        hide = value <= hiding_bound(value.dtype)
        keep = value == 0
        if not bool((keep | hide).all()):
            return None
        finite_fill = bool((hide & torch.isfinite(value)).any())
    else:
        return None
    keep = keep.reshape(-1, keep.shape[-2], keep.shape[-1])
    if not bool((keep == keep[:1]).all()):
        return None  # depends on the batch or head
    keep = keep[0].expand(sq, sk)
    # each row's kept keys: one interval [first, last] (count == last - first + 1), or none (argmax gives the first
    # maximum: no sq x sk index grid, only byte-sized copies)
    count = keep.sum(1)
    if not bool(count.any()):
        return None
    first = keep.to(torch.uint8).argmax(1)
    last = (sk - 1) - keep.flip(1).to(torch.uint8).argmax(1)
    rows = count > 0
    if not bool((count[rows] == last[rows] - first[rows] + 1).all()):
        return None
    i = torch.arange(sq)
    lo, hi = int((first - i)[rows].min()), int((last - i)[rows].max())  # the band: lo <= j - i <= hi
    # exactly that band: every row keeps [max(0, i + lo), min(sk - 1, i + hi)] (empty where that is)
    want_first, want_last = (i + lo).clamp(min=0), (i + hi).clamp(max=sk - 1)
    want_rows = want_first <= want_last
    if not bool((want_rows == rows).all()) or not bool((first[rows] == want_first[rows]).all()) or \
            not bool((last[rows] == want_last[rows]).all()):
        return None
    return Band(None if lo <= -(sq - 1) else sympy.Integer(lo), None if hi >= sk - 1 else sympy.Integer(hi),
                finite_fill)


def plan_masks(terms: list[MaskTerm], sq, sk, score_dtype, score_ndim: int, empty_rows: tuple = ()
               ) -> MaskPlan | str:
    """Turn the mask terms of a site into fa2 flags (bands) and an attn_bias (everything else), exactly.

    A term that is a band and-ed with boolean tensors that do not depend on the query (a padding mask read from the
    inputs) is split into the band's flags and those tensors as key-row masks. With a finite fill (Hugging Face's
    eager masks: 0 / dtype.min added) a row that then sees no key is eager's uniform average over all keys, which
    the replacement recomputes (MaskPlan.empty_rows), for the kinds of fill the site allows (``empty_rows``: "add"
    only without softcap or tensor scale, where that average's gradient through q.k is linear in q, k, v)."""
    split = _split_key_rows(terms, sq, sk, score_ndim, empty_rows)
    if split is None and "document" in empty_rows:
        split = _document_plan(terms, sq, sk, score_ndim)
    if split is not None:
        return split
    interp = MaskInterpreter(key_rows=True)
    bands: list[tuple] = []   # (band, the bias entry to fall back to, the key-row entries that go with the band)
    bias: list[tuple] = []
    notes: list[str] = []
    for term in terms:
        if term.kind == "add":
            entry = BiasEntry("add", term.node, multiplier=term.multiplier, folded=term.folded,
                              overwritten=term.overwritten)
            # A term scaled with the scores (added before the scaling): a 0 / -inf mask is the same mask times any
            # positive scale, so it may still be a band; a finite fill or any other bias (ALiBi's) is scaled: a bias
            scaled = term.multiplier != 1.0
            if scaled and not term.multiplier > 0:
                bias.append(entry)
                continue
            value = interp.value(term.node)
            dtype = _dtype(term.node)
            band, keys = None, []
            if isinstance(value, Sel) and {_kind(value.a, dtype), _kind(value.b, dtype)} == {"zero", "hide"}:
                zero_first = _kind(value.a, dtype) == "zero"
                pred = value.pred if zero_first else _pred_not(value.pred)
                fill = value.b if zero_first else value.a
                # where(cond, 0, -inf) is a bool mask in disguise: pass the bool (1 byte instead of 4)
                where = _strip(term.node)
                if fill == -math.inf and is_call_where(where) and _bool_node(where.args[0]):
                    keep_if_true = scalar_value(where.args[1]) == 0
                    entry = BiasEntry("keep" if keep_if_true else "drop", where.args[0], folded=term.folded)
                band, keys = _band_and_keys(pred, sq, sk, score_ndim, term.folded)
                if keys and fill != -math.inf:
                    band, keys = None, []    # (a finite fill splits only alone: _split_key_rows)
                if isinstance(band, Band):
                    band.finite_fill = fill != -math.inf
            if not isinstance(band, Band):
                band = constant_band(term.node, _static_int(sq), _static_int(sk))  # (its finite_fill from the values)
                if band is not None:
                    notes.append(RECOGNIZED_CONSTANT)
            if isinstance(band, Band) and scaled and band.finite_fill:
                band = None
            if isinstance(band, Band):
                bias.extend(keys)
                if band.lo is None and band.hi is None:
                    continue      # hides nothing (but its key-row masks): adds 0 everywhere else
                bands.append((band, entry, keys))
                continue
            bias.append(entry)
            continue
        # where(cond, scores, fill) / where(cond, fill, scores)
        if not is_hiding_value(term.fill, term.dtype or score_dtype):
            return (f"masked_fill/where with value {term.fill}: only -inf or the dtype's minimum hide a key "
                    "exactly")
        if term.fill == -math.inf:
            entry = BiasEntry("keep" if term.keep_if_true else "drop", term.node, folded=term.folded)
        else:
            entry = BiasEntry("fill", term.node, term.keep_if_true, term.fill, term.dtype or score_dtype,
                              folded=term.folded)
        pred = _where_pred(interp, term)
        band, keys = _band_and_keys(pred, sq, sk, score_ndim, term.folded) if pred is not None else (None, [])
        if keys and term.fill != -math.inf:
            band, keys = None, []
        if not isinstance(band, Band):
            band = constant_band(term.node, _static_int(sq), _static_int(sk), term.keep_if_true)
            if band is not None:
                notes.append(RECOGNIZED_CONSTANT)
        if isinstance(band, Band):
            bias.extend(keys)
            if band.lo is None and band.hi is None:
                continue
            band.finite_fill = term.fill != -math.inf
            bands.append((band, entry, keys))
            continue
        bias.append(entry)

    plan = MaskPlan(bias=bias, notes=notes)
    if not bands:
        return _read_key_rows(plan)

    def as_bias(note):
        split_keys = [k for _, _, keys in bands for k in keys]
        plan.bias = [e for e in bias if not any(e is k for k in split_keys)] + [entry for _, entry, _ in bands]
        plan.notes = [n for n in plan.notes if n != RECOGNIZED_CONSTANT] + [note]
        return _read_key_rows(plan)

    if len(bands) + len(bias) > 1 and any(b.finite_fill for b, _, _ in bands):
        # A finite fill gives a row that sees no key a uniform average over all keys; split into flags plus other
        # terms that is not reproducible, so keep these masks as attn_bias.
        return as_bias("mask kept as attn_bias: finite-valued causal/window mask combined with another mask")
    lo = hi = None
    for band, _, _ in bands:
        if band.lo is not None:
            lo = band.lo if lo is None else _tighter(lo, band.lo, max)
            if lo is None:
                return as_bias("mask kept as attn_bias: incomparable diagonals")
        if band.hi is not None:
            hi = band.hi if hi is None else _tighter(hi, band.hi, min)
            if hi is None:
                return as_bias("mask kept as attn_bias: incomparable diagonals")
    flags = Band(lo, hi, any(b.finite_fill for b, _, _ in bands)).flags(sq, sk)
    if isinstance(flags, str):
        return as_bias(f"mask kept as attn_bias: {flags}")
    plan.causal, plan.window_left, plan.window_right = flags
    if any(keys for _, _, keys in bands):
        plan.notes.append(KEY_ROW_SPLIT)
    return _read_key_rows(plan)


KEY_ROW_SPLIT = "mask split into causal / window flags and a key-row padding mask"
EMPTY_ROWS_NOTE = "rows that see no key get eager's uniform average over all keys (its finite fill)"


DOCUMENT_NOTE = ("document mask (per-token sequence ids) run as varlen: tokens grouped by id (a stable sort per row: "
                 "exact whether or not the ids come as sorted runs), one sequence per id (cu_seqlens of static "
                 "length batch * seqlen + 1, no host sync)")


def _document_plan(terms, sq, sk, score_ndim):
    """A single mask term ``ids[b, i] == ids[b, j]`` (optionally and-ed with causal) over 4-D self-attention scores,
    as MaskPlan.document (rewrite._document_attention), else None. Exact for any ids: a stable sort by id makes
    every id one run, each run a sequence of varlen, and keeps the order of the tokens of a sequence, which is all
    that causal reads; every query sees at least itself, so no row is empty whatever the fill."""
    if len(terms) != 1 or terms[0].folded or score_ndim != 4 or not _same_size(sq, sk):
        return None
    found = _kept_keys(terms[0])
    pred = found[0] if found is not None else None
    if pred is None or len(pred.doc) != 1 or pred.data or pred.false:
        return None
    ids, batch_dim = pred.doc[0]
    ids_shape = _shape(ids)
    if batch_dim not in (None, -4) or not _same_size(ids_shape[-1], sq):
        return None
    band = band_of(Pred(pred.atoms, pred.ndim), sq, sk, score_ndim)
    if not isinstance(band, Band):
        return None
    flags = band.flags(sq, sk)
    if isinstance(flags, str) or flags[1:] != (-1, -1):
        return None   # (a window counts positions, which the sort moves: only causal, which reads their order)
    return MaskPlan(causal=flags[0], bias=[BiasEntry("doc", ids)], notes=[DOCUMENT_NOTE], document=True)


def _same_size(a, b) -> bool:
    ea, eb = sym_expr(a), sym_expr(b)
    return ea is not None and eb is not None and sympy.simplify(ea - eb) == 0


def _kept_keys(term):
    """(the keys a mask term keeps as a Pred (data factors and document ids read), its fill, "add" or "fill") for an
    unscaled 0 / hiding-value term added to the scores or a where() with a hiding fill, else None."""
    interp = MaskInterpreter(key_rows=True)
    if term.kind == "add":
        value = interp.value(term.node)
        dtype = _dtype(term.node)
        if term.multiplier != 1.0 or not isinstance(value, Sel) or \
                {_kind(value.a, dtype), _kind(value.b, dtype)} != {"zero", "hide"}:
            return None
        zero_first = _kind(value.a, dtype) == "zero"
        return (value.pred if zero_first else _pred_not(value.pred)), (value.b if zero_first else value.a), "add"
    if not is_hiding_value(term.fill, term.dtype):
        return None
    return _where_pred(interp, term), term.fill, "fill"


def _where_pred(interp, term):
    """The keys a where() term keeps, as a Pred (masked_fill(~mask, fill) keeps ``mask``: the negation is read
    through, since a band and-ed with a key row has no negation of its own)."""
    node, keep_if_true = term.node, term.keep_if_true
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _NOT:
        node, keep_if_true = node.args[0], not keep_if_true
    pred = _as_pred(interp.value(node))
    return _pred_not(pred) if pred is not None and not keep_if_true else pred


def _band_and_keys(pred, sq, sk, score_ndim, folded):
    """(band, key-row entries) of a predicate: its affine atoms as a Band (or a reason string), its data factors
    (Pred.data) as bool entries read one query row each; (reason, []) where data factors cannot be split off."""
    if pred is None or pred.doc:   # (a document mask is no band: _document_plan, or the term stays a bias)
        return None, []
    keys = [BiasEntry("drop" if negated else "keep", node, key_row=True) for node, negated in pred.data]
    if keys and folded:
        return "a key-row mask under folded (batch * heads) scores", []
    return band_of(Pred(pred.atoms, pred.ndim, pred.false), sq, sk, score_ndim), keys


def _read_key_rows(plan: MaskPlan) -> MaskPlan:
    """Entries whose values do not depend on the query index (query_invariant: a padding mask broadcast over the
    queries) are read one query row each: fa2's kernels take a (..., 1, seqlen_k) bias as a cheap key-row bias."""
    plan.bias = [e._replace(key_row=True) if e.kind != "doc" and not e.key_row and not e.folded
                 and len(_shape(e.node) or ()) >= 2
                 and not _is_one(_shape(e.node)[-2]) and query_invariant(e.node) else e for e in plan.bias]
    return plan


def _split_key_rows(terms, sq, sk, score_ndim, allowed):
    """The plan for a single finite-fill term that is a band and-ed with key-row masks (Hugging Face's eager mask of a
    padded batch: ``where(causal & padding[b, None, None, :], 0, finfo.min)`` added to the scores), else None:
    the band's flags, the key-row masks as bool entries, and MaskPlan.empty_rows for the rows that see no key."""
    if len(terms) != 1 or terms[0].folded:
        return None
    found = _kept_keys(terms[0])
    if found is None or found[2] not in allowed:
        return None
    pred, fill, how = found
    if pred is None or not pred.data or fill == -math.inf:
        return None
    band, keys = _band_and_keys(pred, sq, sk, score_ndim, False)
    if not isinstance(band, Band) or (band.lo is None and band.hi is None):
        return None    # (no band: the fill read one key row per query is eager's own computation, _read_key_rows)
    flags = band.flags(sq, sk)
    if isinstance(flags, str):
        return None
    plan = MaskPlan(bias=keys, notes=[KEY_ROW_SPLIT, EMPTY_ROWS_NOTE], empty_rows=how)
    plan.causal, plan.window_left, plan.window_right = flags
    return plan


def is_call_where(node) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target == aten.where.self


def _dtype(node):
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return v.dtype if isinstance(v, torch.Tensor) else None


def _kind(value, dtype=None) -> str:
    if value is None or isinstance(value, bool):
        return "other"
    if value == 0:
        return "zero"
    if is_hiding_value(value, dtype):
        return "hide"
    return "other"


def _strip(node):
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in (
            aten.expand.default, aten.clone.default, aten.alias.default):
        node = node.args[0]
    return node


def _bool_node(node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dtype == torch.bool
