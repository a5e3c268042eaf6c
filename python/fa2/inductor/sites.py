"""Finding attention in a normalized ATen graph.

Real code spells attention many ways (``@``/matmul/bmm/einsum, scale on the scores or on q, masks added, filled or
built from arange/tril, softmax in fp32 then cast, GQA through repeat_kv, softcap, transposed or permuted layouts,
dropout: nothing in eval, fa2's dropout_p in training). After Dynamo + AOT autograd with Inductor's decompositions
they all reduce to a few op shapes, so sites are found by walking the graph from each softmax rather than by matching
a list of spellings:

  QK^T   ``bmm(view(q4), view(kT4))`` (a 4D matmul decomposes to expand / [clone] / view / bmm / view)
  scores a chain of: scalar mul/div (scale), div -> tanh -> mul (softcap), add (bias), where (mask), dtype casts
  softmax ``amax / sub / exp / sum / div`` over the last dim (or ``_softmax``)
  PV     ``bmm(view(p), view(v4))``, [view back to 4D]

and each operand is followed back to the tensor fa2 reads (through the matmul's views, and through repeat_kv's
unsqueeze / expand / reshape, so GQA binds the un-repeated K/V). ``scaled_dot_product_attention`` calls appear as
one fused op (plus its backward op in a training graph) and are sites too. A site is only rewritten when the whole
computation is exactly what fa2 computes; otherwise it is recorded with the reason.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch

from ._compat import aten, guard_bool, prims, statically_known_true, sym_expr
from .masks import MaskPlan, MaskTerm, plan_masks, scalar_value

VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
LAYOUT = VIEWS | {aten.clone.default, aten.alias.default, aten.expand.default, aten.permute.default,
                  aten.transpose.int, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
                  aten.squeeze.default, aten.sum.dim_IntList, aten.t.default}
CASTS = {prims.convert_element_type.default, aten._to_copy.default}
PERMUTES = {aten.permute.default, aten.transpose.int, aten.t.default}
_RANDOM = ("rand", "bernoulli", "native_dropout", "inductor_random")   # dropout's mask, in any decomposition

MAX_HEADDIM = 256
CUDA_DTYPES = (torch.float16, torch.bfloat16)
CPU_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _op(name: str, overload: str = "default"):
    packet = getattr(aten, name, None)
    return getattr(packet, overload, None) if packet is not None else None


SDPA_FWD = {op: name for op, name in (
    (_op("_scaled_dot_product_flash_attention_for_cpu"), "cpu_flash"),
    (_op("_scaled_dot_product_flash_attention"), "flash"),
    (_op("_scaled_dot_product_efficient_attention"), "efficient"),
    (_op("_scaled_dot_product_cudnn_attention"), "cudnn"),
    (_op("scaled_dot_product_attention"), "composite"),
) if op is not None}
SDPA_BWD = {op for op in (
    _op("_scaled_dot_product_flash_attention_for_cpu_backward"),
    _op("_scaled_dot_product_flash_attention_backward"),
    _op("_scaled_dot_product_efficient_attention_backward"),
    _op("_scaled_dot_product_cudnn_attention_backward"),
) if op is not None}


# ---- the result ------------------------------------------------------------------------------------------------

@dataclass
class Operand:
    """A tensor fa2 reads, as a node of the graph and how to view it in fa2's (batch, seqlen, heads, dim) layout.

    layout: "bhsd" (B, H, S, D), "bhds" (B, H, D, S: a transposed K), "nsd" / "nds" (3D, heads folded into batch).
    chain: the forward nodes after ``node`` up to the bmm operand (the matmul's and repeat_kv's views), in order."""
    node: torch.fx.Node
    layout: str
    chain: list = field(default_factory=list)
    bmm_operand: torch.fx.Node | None = None


@dataclass
class Site:
    kind: str                          # "matmul" (hand-written) or "sdpa"
    anchor: torch.fx.Node              # the softmax (or the SDPA op): where the site came from
    q: Operand | None = None
    k: Operand | None = None
    v: Operand | None = None
    output: torch.fx.Node | None = None  # its uses get fa2's output
    out_layout: str = "bhsd"
    scale: float | None = None
    softcap: float = 0.0
    mask: MaskPlan | None = None
    topleft_causal: bool = False       # SDPA is_causal (handled by fa2.sdpa)
    internal: set = field(default_factory=set)   # forward nodes that die with the rewrite
    bmm_qk: torch.fx.Node | None = None
    bmm_pv: torch.fx.Node | None = None
    p_operand: torch.fx.Node | None = None
    sdpa_node: torch.fx.Node | None = None
    score_shape: tuple = ()
    scale_tensors: list = field(default_factory=list)   # [(0-d tensor node, "mul" | "div")], applied to q
    dropout_p: float = 0.0             # dropout on the probabilities (training): fa2's dropout_p, fa2's own mask
    # nodes of the P -> PV chain read by something else too (returned attention weights): they and what they need
    # stay in the graph for those readers; the output comes from fa2 (rewrite.py checks that their use gets no
    # gradient that would reach the site's backward)
    weights_sources: list = field(default_factory=list)
    reason: str | None = None          # why it is not rewritten (None: it can be)
    rewritten: bool = False

    def flags(self) -> dict:
        if self.mask is None:
            return {}
        out = {}
        if self.dropout_p:
            out["dropout_p"] = self.dropout_p
        if self.topleft_causal:
            out["causal"] = "top-left"
        elif self.mask.causal:
            out["causal"] = True
        if self.mask.window_left >= 0:
            out["window_left"] = self.mask.window_left
        if self.mask.window_right >= 0:
            out["window_right"] = self.mask.window_right
        if self.softcap:
            out["softcap"] = self.softcap
        if self.scale is not None:
            out["scale"] = round(float(self.scale), 6) if not self.scale_tensors else "tensor"
        if self.mask.document:
            out["varlen"] = "document ids"
        elif self.mask.bias:
            kinds = {"bool" if b[0] in ("keep", "drop") else "float" for b in self.mask.bias}
            out["bias"] = "+".join(sorted(kinds))
            if all(b.key_row or len(shape(b.node) or ()) < 2 or same(shape(b.node)[-2], 1) for b in self.mask.bias):
                out["key_row"] = True   # read as a (..., 1, seqlen_k) padding mask: fa2's cheap key-row bias
        notes = list(self.mask.notes)
        if self.dropout_p:
            notes.append(dropout_note(self.dropout_p))
        if self.weights_sources and self.rewritten:
            notes.append(WEIGHTS_NOTE)
        if notes:
            out["note"] = "; ".join(notes)
        if self.q is not None and self.k is not None:
            hq, hk = _heads(self.q), _heads(self.k)
            if hq is not None and hk is not None and hq != hk:
                out["gqa"] = f"{hq}/{hk}"
        return out


class Reject(Exception):
    pass


# ---- helpers ---------------------------------------------------------------------------------------------------

def val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def shape(node):
    v = val(node)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def same(a, b) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    ea, eb = sym_expr(a), sym_expr(b)
    if ea is not None and eb is not None and ea == eb:
        return True
    try:
        return statically_known_true(a == b)
    except Exception:  # noqa: BLE001
        return False


def same_shape(a, b) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def _heads(op: Operand):
    s = shape(op.node)
    if s is None:
        return None
    return 1 if op.layout in ("nsd", "nds") else s[1]


def is_call(node, targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _last_dim(dims, ndim) -> bool:
    if isinstance(dims, int):
        dims = [dims]
    return len(dims) == 1 and dims[0] % ndim == ndim - 1


def _fwd_users(node, bwd):
    return [u for u in node.users if u not in bwd]


def _is_random(node, depth=6) -> bool:
    """Is a random op (dropout's mask) among the inputs of this node?"""
    seen, stack = set(), [(node, 0)]
    while stack:
        n, d = stack.pop()
        if not isinstance(n, torch.fx.Node) or n in seen or d > depth:
            continue
        seen.add(n)
        if n.op == "call_function" and any(r in str(n.target) for r in _RANDOM):
            return True
        stack.extend((a, d + 1) for a in n.all_input_nodes)
    return False


# ---- softmax ---------------------------------------------------------------------------------------------------

def softmax_at(node):
    """(input, output, nodes) if ``node`` is the output of a softmax over the last dim, else None."""
    if not is_call(node, {aten._softmax.default, aten.div.Tensor}):
        return None
    if node.target == aten._softmax.default:
        x = node.args[0]
        if not _last_dim(node.args[1], len(shape(x) or (0,))):
            return None
        return x, node, [node]
    exp, total = node.args
    if not (is_call(total, {aten.sum.dim_IntList}) and total.args[0] is exp and is_call(exp, {aten.exp.default})):
        return None
    sub = exp.args[0]
    if not is_call(sub, {aten.sub.Tensor}):
        return None
    x, mx = sub.args
    if not (is_call(mx, {aten.amax.default}) and mx.args[0] is x):
        return None
    nd = len(shape(x) or ())
    if not nd or not _last_dim(total.args[1], nd) or not _last_dim(mx.args[1], nd):
        return None
    if not (len(total.args) > 2 and total.args[2]) or not (len(mx.args) > 2 and mx.args[2]):
        return None
    return x, node, [mx, sub, exp, total, node]


# ---- layouts ---------------------------------------------------------------------------------------------------
#
# Between the tensors fa2 reads and the 3D operands of the bmms there are only layout ops (the matmul's expand and
# reshape, einsum's unsqueeze/permute, the user's transposes). A chain of such ops is "order-preserving" when it
# keeps the row-major order of the elements -- views, unsqueeze/squeeze, clones, no-op expands and permutes that
# only move size-1 dims -- so its output is exactly ``input.reshape(output_shape)``, for any sizes.

SHAPE_OPS = VIEWS | {aten.clone.default, aten.alias.default, aten.expand.default, aten.permute.default,
                     aten.transpose.int, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
                     aten.squeeze.default, aten.t.default}


def _perm(node):
    nd = len(shape(node) or ())
    if node.target == aten.permute.default:
        return [d % nd for d in node.args[1]]
    if node.target == aten.t.default:
        return [1, 0] if nd == 2 else [0]
    a, b = node.args[1] % nd, node.args[2] % nd
    perm = list(range(nd))
    perm[a], perm[b] = perm[b], perm[a]
    return perm


def _moved_dims(node):
    """For a permute/transpose: its permutation restricted to the dims of size != 1 (ranks among those dims)."""
    src = shape(node.args[0])
    perm = _perm(node)
    keep = [d for d in perm if not same(src[d], 1)]
    order = sorted(keep)
    return [order.index(d) for d in keep]


def _order_preserving(node) -> bool:
    t = node.target
    if t in VIEWS or t in (aten.clone.default, aten.alias.default, aten.unsqueeze.default, aten.squeeze.dim,
                           aten.squeeze.dims, aten.squeeze.default):
        return True
    if t == aten.expand.default:
        return same_shape(shape(node.args[0]), shape(node))
    if t in PERMUTES:
        moved = _moved_dims(node)
        return moved == sorted(moved)
    return False


def _permute_run(node, bwd):
    """The run of permutes/transposes that starts at ``node`` and continues through sole users, as long as their
    composition keeps the order of the dims of size != 1 (einsum permutes P one way and back: each permute alone
    moves dims, the pair does not); [] if no prefix of the run composes to such an order."""
    src = shape(node.args[0])
    if src is None:
        return []
    acc = list(range(len(src)))  # acc[j]: the source dim at position j
    run, cur = [], node
    while is_call(cur, PERMUTES):
        acc = [acc[d] for d in _perm(cur)]
        run.append(cur)
        keep = [d for d in acc if not same(src[d], 1)]
        if keep == sorted(keep):
            return run
        users = _fwd_users(cur, bwd)
        if len(users) != 1:
            break
        cur = users[0]
    return []


def _swaps_last_two(node) -> bool:
    """A permute/transpose that (ignoring size-1 dims) swaps the last two dims: a matrix transpose."""
    if node.target not in PERMUTES:
        return False
    moved = _moved_dims(node)
    n = len(moved)
    return n >= 2 and moved[:-2] == list(range(n - 2)) and moved[-2:] == [n - 1, n - 2]


def bind_operand(x3, role: str, batch_heads, bwd=frozenset()) -> Operand:
    """The tensor fa2 should read for the 3D bmm operand ``x3``: the furthest tensor upstream that it is a reshape
    of, as (B, H, S, D) [or (B, H, D, S) / a transposed one for K^T]; else x3 itself (3D: heads folded into batch).
    ``batch_heads``: (B, H) when the scores are 4D, for the consistency check. The walk stops at a tensor that is
    also used elsewhere (its gradient is a sum there, which the backward rewrite must not cross)."""
    chain, node, transposed = [x3], x3, False
    best = None
    while is_call(node, SHAPE_OPS) and len(chain) < 16:
        parent = node.args[0]
        if _order_preserving(node):
            pass
        elif not transposed and _swaps_last_two(node):
            transposed = True
        else:
            break
        node = parent
        s4 = shape(node)
        if s4 is not None and len(s4) == 4 and batch_heads is not None and \
                same(s4[0], batch_heads[0]) and same(s4[1], batch_heads[1]):
            best = (node, list(reversed(chain)), transposed)
        chain.append(node)
        if len(_fwd_users(node, bwd)) > 1:
            break
    # MQA written with broadcasting: the matmul expands (B, 1, S, D) over the heads
    if best is not None and role != "q":
        x4, c, tr = best
        if is_call(x4, {aten.expand.default}):
            src = x4.args[0]
            s_in, s_out = shape(src), shape(x4)
            if s_in is not None and len(s_in) == 4 and same(s_in[1], 1) and same(s_in[0], s_out[0]) and \
                    same(s_in[2], s_out[2]) and same(s_in[3], s_out[3]):
                return Operand(src, ("bhsd" if tr else "bhds") if role == "k" else "bhsd", [x4] + c, x3)
    if best is None:
        return Operand(x3, "nds" if role == "k" else "nsd", [], x3)
    x4, c, tr = best
    if role == "k":
        layout = "bhsd" if tr else "bhds"
    else:
        if tr:
            return Operand(x3, "nsd", [], x3)
        layout = "bhsd"
    if layout == "bhsd" and role != "q":
        rep = _repeat_kv_source(x4)
        if rep is not None:
            src, rchain = rep
            return Operand(src, "bhsd", rchain + c, x3)
    return Operand(x4, layout, c, x3)


def _repeat_kv_source(x):
    """If x is repeat_kv(y) = reshape(expand(unsqueeze(y, 2), [B, Hk, n, S, D]), [B, Hk*n, S, D]) (also what
    repeat_interleave on dim 1 decomposes to), return (y, chain)."""
    if not is_call(x, VIEWS):
        return None
    chain = [x]
    inner = x.args[0]
    if is_call(inner, {aten.clone.default}):
        chain.insert(0, inner)
        inner = inner.args[0]
    if not is_call(inner, {aten.expand.default}):
        return None
    chain.insert(0, inner)
    unsq = inner.args[0]
    while is_call(unsq, {aten.slice.Tensor}) and _full_slice(unsq):
        chain.insert(0, unsq)
        unsq = unsq.args[0]
    if not (is_call(unsq, {aten.unsqueeze.default}) and unsq.args[1] % 5 == 2):
        return None
    chain.insert(0, unsq)
    y = unsq.args[0]
    sy, se, sx = shape(y), shape(inner), shape(x)
    if sy is None or se is None or sx is None or len(sy) != 4 or len(se) != 5:
        return None
    if not (same(se[0], sy[0]) and same(se[1], sy[1]) and same(se[3], sy[2]) and same(se[4], sy[3])):
        return None
    if not (same(sx[0], sy[0]) and same(sx[1], se[1] * se[2]) and same(sx[2], sy[2]) and same(sx[3], sy[3])):
        return None
    return y, chain


def _full_slice(node) -> bool:
    start = node.args[2] if len(node.args) > 2 else 0
    end = node.args[3] if len(node.args) > 3 else None
    step = node.args[4] if len(node.args) > 4 else 1
    dim = node.args[1] if len(node.args) > 1 else 0
    size = (shape(node.args[0]) or [None] * 8)[dim]
    return step == 1 and start in (0, None) and (end is None or (isinstance(end, int) and end >= 2 ** 62)
                                                 or same(end, size))


def reshape_chain_down(start, stop_if, bwd, limit=8):
    """Follow ``start``'s single forward user through order-preserving layout ops; returns the list of nodes
    visited (after start) up to the first for which ``stop_if(node)`` holds, or None."""
    chain, cur = [], start
    for _ in range(limit):
        users = _fwd_users(cur, bwd)
        if len(users) != 1 or not is_call(users[0], SHAPE_OPS) or not _order_preserving(users[0]):
            return None
        cur = users[0]
        chain.append(cur)
        if stop_if(cur):
            return chain
    return None


# ---- the score chain ---------------------------------------------------------------------------------------------

QK_MATMULS = {aten.bmm.default, aten.baddbmm.default}


def qk_operands(node):
    """(q3, kT3): the 3-D operands of the QK^T matmul (bmm, or baddbmm, whose ``self`` is an additive bias)."""
    return (node.args[0], node.args[1]) if node.target == aten.bmm.default else (node.args[1], node.args[2])


def _reaches_qk(node, depth=0) -> bool:
    """Does this value come from the QK^T matmul through score-chain ops (and the layout ops of a 4-D matmul or an
    einsum: views, and permutes that keep the order of the dims that are not 1)?"""
    if depth > 16 or not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    if node.target in QK_MATMULS:
        return True
    if node.target in VIEWS | CASTS | {aten.mul.Tensor, aten.div.Tensor, aten.tanh.default, aten.clone.default,
                                       aten.alias.default}:
        return _reaches_qk(node.args[0], depth + 1) or (
            node.target in (aten.mul.Tensor, aten.div.Tensor) and _reaches_qk(node.args[1], depth + 1))
    if node.target in SHAPE_OPS and _order_preserving(node):
        return _reaches_qk(node.args[0], depth + 1)
    if node.target in (aten.add.Tensor, aten.sub.Tensor):
        return _reaches_qk(node.args[0], depth + 1) or _reaches_qk(node.args[1], depth + 1)
    if node.target == aten.where.self:
        return _reaches_qk(node.args[1], depth + 1) or _reaches_qk(node.args[2], depth + 1)
    return False


def _stops(node, depth=0, out=None) -> list:
    """The ops where a walk back from ``node`` towards a matmul stops (for a reason that names them)."""
    out = [] if out is None else out
    if depth > 16 or not isinstance(node, torch.fx.Node) or len(out) > 3:
        return out
    if node.op != "call_function":
        out.append("a graph input" if node.op == "placeholder" else node.op)
    elif node.target in (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.where.self) or \
            node.target in VIEWS | CASTS | {aten.clone.default, aten.alias.default, aten.tanh.default} or \
            (node.target in SHAPE_OPS and _order_preserving(node)):
        for a in node.args:
            if isinstance(a, torch.fx.Node) and _val_is_tensor(a) and len(shape(a) or ()) >= 2:
                _stops(a, depth + 1, out)
    else:
        out.append(_name(node.target).split(".")[0])
    return out


def _val_is_tensor(node) -> bool:
    return isinstance(val(node), torch.Tensor)


def _no_matmul(node) -> Reject:
    stops = sorted(set(_stops(node)))
    where = f" (the scores come from {', '.join(stops)})" if stops else ""
    return Reject(f"the softmax input does not come from a matmul{where}")


def _scalar(arg):
    v = scalar_value(arg)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


@dataclass
class ScoreChain:
    """What lies between QK^T and the softmax: ``scores`` is the (batch..., Sq, Sk) tensor the softmax reads before
    masks and scales (the 4-D view of the matmul's output, or the matmul itself), ``qk`` the matmul, ``scale`` the
    product of the scalar factors of q.k (1.0 when there are none), terms the masks and biases (in score layout, or
    3-D with the heads folded into the batch: MaskTerm.folded), ``nodes`` every op in between."""
    scores: torch.fx.Node
    qk: torch.fx.Node
    scale: float
    softcap: float
    terms: list
    nodes: list
    tensor_scales: list


def score_chain(x) -> ScoreChain:
    """Walk from the softmax input back to QK^T (outside in: the last op applied is met first)."""
    scale, softcap, terms, nodes, tensor_scales = 1.0, 0.0, [], [], []
    inside = None      # None, "scale" or "softcap": what the ops met so far do to everything computed before them
    folded = False     # past a view that split the matmul's (batch, Sq, Sk) into (B, H, Sq, Sk): 3-D terms
    scores = None
    cur = x

    def add_term(term_node, what):
        # A bias added before the scaling is scaled with q.k: fa2 takes it pre-multiplied (exactly the eager sum's
        # terms, in float32 at least); a softcap's tanh cannot be moved past
        if inside == "softcap":
            raise Reject(f"{what} is added before the softcap (tanh): fa2 adds its bias after the softcap")
        if tensor_scales:
            raise Reject(f"{what} is added before a scaling by a tensor")
        if _scalar(term_node) != 0.0:   # (a zero self of baddbmm adds nothing)
            overwritten = any(t.kind == "where" and t.fill != -math.inf for t in terms)
            terms.append(MaskTerm("add", term_node, multiplier=scale, folded=folded, overwritten=overwritten))

    while True:
        if not isinstance(cur, torch.fx.Node) or cur.op != "call_function":
            raise Reject("the softmax input does not come from a matmul")
        t = cur.target
        if t in CASTS or t == aten.clone.default or t == aten.alias.default:
            nodes.append(cur)
            cur = cur.args[0]
            continue
        if t in QK_MATMULS:
            if t == aten.baddbmm.default:
                beta, alpha = cur.kwargs.get("beta", 1), cur.kwargs.get("alpha", 1)
                if not all(isinstance(c, (int, float)) and math.isfinite(c) for c in (alpha, beta)) or alpha == 0:
                    raise Reject(f"baddbmm with beta={beta}, alpha={alpha}")
                if beta != 0:
                    inner_scale = scale
                    scale *= beta
                    add_term(cur.args[0], "baddbmm's bias")
                    scale = inner_scale
                scale *= alpha
            nodes.append(cur)
            scores = scores if scores is not None else cur
            return ScoreChain(scores, cur, scale, softcap, terms, nodes, tensor_scales)
        if t in SHAPE_OPS:
            # the (B*H, Sq, Sk) matmul output reshaped to (B, H, Sq, Sk) (a view, or einsum's views and permutes),
            # before or after the masks / scales / biases applied to it in 3-D
            chain, node = [], cur
            while is_call(node, SHAPE_OPS) and _order_preserving(node):
                chain.append(node)
                node = node.args[0]
            if chain and same_shape(shape(node), shape(cur)):  # viewed away and back (Falcon)
                nodes += chain
                cur = node
                continue
            if not chain or not _reaches_qk(node) or scores is not None:
                raise Reject(f"the scores go through {_name(t)} before the softmax" if not chain else
                             "the scores are reshaped in a way fa2 cannot follow")
            # the matmul's (batch, Sq, Sk) with its batch split into the leading dims: (B, H) for 4-D scores; none
            # for 3-D ones ((H, S, D) inputs); (B, Hk, G) for GQA written with a grouped view of q against
            # (B, Hk, 1, S, D) K/V, whose site runs with the heads folded into the batch (K/V as the matmul
            # expanded them)
            s3, s4 = shape(node), shape(cur)
            if s3 is None or s4 is None or len(s3) != 3 or len(s4) < 3 or not (
                    same(math.prod(s4[:-2]), s3[0]) and same(s4[-2], s3[1]) and same(s4[-1], s3[2])):
                raise Reject("the scores are reshaped in a way fa2 cannot follow")
            nodes += chain
            scores, folded = cur, len(s4) == 4
            cur = node
            continue
        if t in (aten.add.Tensor, aten.sub.Tensor):
            if cur.kwargs.get("alpha", 1) != 1:
                raise Reject("add/sub with alpha in the score computation")
            a, b = cur.args
            ca, cb = _reaches_qk(a), _reaches_qk(b)
            if t == aten.sub.Tensor and cb:
                raise Reject("the scores are subtracted from something")
            if ca and cb:
                raise Reject("two matmul terms are added before the softmax (e.g. a relative-position matmul)")
            if not (ca or cb):
                raise _no_matmul(cur)
            score, bias = (a, b) if ca else (b, a)
            if not isinstance(bias, torch.fx.Node):
                if t == aten.sub.Tensor or bias != 0:
                    raise Reject("a constant is added to the scores")  # softmax-invariant but not worth a case
            else:
                if t == aten.sub.Tensor:
                    raise Reject("a bias is subtracted from the scores")
                add_term(bias, "a bias")
            nodes.append(cur)
            cur = score
            continue
        if t == aten.where.self:
            cond, a, b = cur.args
            va, vb = _scalar(a), _scalar(b)
            dtype = val(cur).dtype
            # a mask applied before a positive scaling (GPT-J) hides the same keys, its fill scaled along
            if inside == "softcap" or tensor_scales or scale <= 0:
                raise Reject("a mask is applied before the " +
                             ("softcap" if inside == "softcap" else "scaling by a tensor" if tensor_scales
                              else "scaling by a negative number"))
            if vb is not None and _reaches_qk(a):
                term, score = MaskTerm("where", cond, keep_if_true=True, fill=vb * scale, dtype=dtype,
                                       folded=folded), a
            elif va is not None and _reaches_qk(b):
                term, score = MaskTerm("where", cond, keep_if_true=False, fill=va * scale, dtype=dtype,
                                       folded=folded), b
            elif _reaches_qk(a) or _reaches_qk(b):
                raise Reject("where() in the score computation fills with a tensor, not a constant (fa2 takes a "
                             "constant fill as a mask, a tensor only when added)")
            else:
                raise _no_matmul(cur)
            terms.append(term)
            nodes.append(cur)
            cur = score
            continue
        if t in (aten.mul.Tensor, aten.div.Tensor):
            a, b = cur.args
            # softcap: mul(tanh(div(s, c)), c)
            if t == aten.mul.Tensor and is_call(a, {aten.tanh.default}) and _scalar(b) is not None:
                inner = a.args[0]
                c = _scalar(b)
                if is_call(inner, {aten.div.Tensor, aten.mul.Tensor}) and _scalar(inner.args[1]) is not None:
                    d = _scalar(inner.args[1])
                    c_in = d if inner.target == aten.div.Tensor else (1.0 / d if d else math.inf)
                    if c > 0 and math.isclose(c, c_in, rel_tol=1e-6):
                        if inside:
                            raise Reject(f"softcap applied twice or after a {inside}")
                        softcap, inside = c, "softcap"
                        nodes += [cur, a, inner]
                        cur = inner.args[0]
                        continue
                raise Reject("tanh in the score computation is not a softcap")
            c = _scalar(b)
            src = a
            if c is None and t == aten.mul.Tensor and _scalar(a) is not None:
                c, src = _scalar(a), b
            if c is None:
                # a one-element tensor: a float Dynamo keeps as an input under dynamic=True, or a temperature
                other, src = (b, a) if not _reaches_qk(b) else (a, b)
                sv = val(other)
                if not (isinstance(other, torch.fx.Node) and isinstance(sv, torch.Tensor) and sv.dim() == 0
                        and sv.is_floating_point()) or _reaches_qk(other) or t == aten.div.Tensor and other is a:
                    raise Reject("the scores are multiplied by a tensor")
                tensor_scales.append((other, "mul" if t == aten.mul.Tensor else "div"))
                inside = inside or "scale"
                nodes.append(cur)
                cur = src
                continue
            if c == 0 or not math.isfinite(c):
                raise Reject(f"the scores are scaled by {c}")
            scale = scale * c if t == aten.mul.Tensor else scale / c
            inside = inside or "scale"
            nodes.append(cur)
            cur = src
            continue
        if t == aten.tanh.default:
            raise Reject("tanh in the score computation is not a softcap")
        raise Reject(f"unsupported op between QK^T and softmax: {_name(t)}")


def _name(target) -> str:
    return str(getattr(target, "__name__", target)).replace("aten.", "")


# ---- matmul-softmax sites -------------------------------------------------------------------------------------

def looks_like_attention(x, p, bwd) -> bool:
    if _reaches_qk(x):
        return True
    cur = p
    for _ in range(6):
        users = _fwd_users(cur, bwd)
        if len(users) != 1:
            return False
        cur = users[0]
        if is_call(cur, {aten.bmm.default}):
            return True
    return False


def matmul_site(anchor, bwd) -> Site | None:
    found = softmax_at(anchor)
    if found is None:
        return None
    x, p, soft_nodes = found
    if not looks_like_attention(x, p, bwd):
        return None
    site = Site("matmul", anchor)
    try:
        _fill_matmul_site(site, x, p, soft_nodes, bwd)
        check_supported(site)
    except Reject as e:
        site.reason = str(e)
    return site


def dropout_note(p: float) -> str:
    return f"dropout p={p:g} \u2192 fa2 dropout_p (fa2's own mask: equal to eager in distribution, not bitwise)"


_RAND = {op for op in (_op("rand"), _op("rand_like")) if op is not None}


def _dropout_mask(node, like):
    """p when ``node`` is F.dropout's keep mask for a tensor shaped like ``like``: ``rand(shape) > p`` (or that cast
    to a float dtype) with one uniform draw per element, 0 < p < 1; else None."""
    if is_call(node, CASTS):
        node = node.args[0]
    if not (is_call(node, {aten.gt.Scalar}) and is_call(node.args[0], _RAND)):
        return None
    p = _scalar(node.args[1])
    rand = node.args[0]
    if p is None or not 0.0 < p < 1.0 or not same_shape(shape(rand), shape(like)):
        return None
    return p


def _scale_of(node, src):
    """The constant that ``node`` multiplies ``src`` by (mul by c, or div by c), else None."""
    if not is_call(node, {aten.mul.Tensor, aten.div.Tensor}) or node.args[0] is not src and (
            node.target == aten.div.Tensor or node.args[1] is not src):
        return None
    c = _scalar(node.args[1] if node.args[0] is src else node.args[0])
    if c is None or c == 0:
        return None
    return c if node.target == aten.mul.Tensor else 1.0 / c


def dropout_at(node, src, bwd):
    """(p, nodes) when ``node`` starts F.dropout(src, p) in training as the decompositions write it (native_dropout:
    ``mul(mul(rand(shape) > p, src), 1 / (1 - p))``; the mask mul and the scaling in either order, the mask cast or
    not, the scaling a div by 1 - p), with ``nodes`` every forward node of it, the dropped tensor last; else None.
    The mask may have other users in the backward only (the old backward, which the rewrite replaces)."""
    if is_call(node, {aten.native_dropout.default}):   # (not decomposed: Inductor's fallback_random)
        return _native_dropout(node, src, bwd)
    first = node
    users = _fwd_users(first, bwd)
    if len(users) != 1:
        return None
    second = users[0]
    p, mask_mul = None, None
    for mul, inner in ((first, src), (second, first)):
        if is_call(mul, {aten.mul.Tensor}) and inner in mul.args:
            other = mul.args[1] if mul.args[0] is inner else mul.args[0]
            if isinstance(other, torch.fx.Node):
                found = _dropout_mask(other, src)
                if found is not None:
                    p, mask_mul = found, (mul, other)
    if p is None:
        return None
    scale = _scale_of(second, first) if mask_mul[0] is first else _scale_of(first, src)
    if scale is None or not math.isclose(scale, 1.0 / (1.0 - p), rel_tol=1e-6):
        return None
    mask = mask_mul[1]
    mask_nodes = [mask] + ([mask.args[0]] if is_call(mask, CASTS) else [])
    gt = mask_nodes[-1]
    mask_nodes.append(gt.args[0])   # the rand
    for n in mask_nodes:
        if any(u not in bwd and u not in mask_nodes and u is not mask_mul[0] for u in n.users):
            return None
    return p, mask_nodes[::-1] + [first, second]


def _native_dropout(node, src, bwd):
    """``native_dropout(src, p, True)``: (p, [it, its output, its mask]) when its output is the one forward use and
    the mask only feeds the old backward."""
    p = _scalar(node.args[1]) if len(node.args) > 1 else None
    train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train")
    if node.args[0] is not src or p is None or not 0.0 < p < 1.0 or train is not True:
        return None
    outs = {u.args[1]: u for u in node.users if u.target is operator.getitem}
    if len(outs) != len(node.users) or 0 not in outs or any(u not in bwd for u in getattr(outs.get(1), "users", ())):
        return None
    return p, [node] + ([outs[1]] if 1 in outs else []) + [outs[0]]


def _is_safe_softmax_fixup(node, p, x) -> bool:
    """``where(all(x == -inf, -1), 0, p)``: ``_safe_softmax`` (SDPA's math path) zeroing rows that see no key --
    which is what fa2 does for such rows anyway."""
    if not (is_call(node, {aten.where.self}) and node.args[2] is p and scalar_value(node.args[1]) == 0):
        return False
    frontier, seen = [node.args[0]], set()
    while frontier:
        n = frontier.pop()
        if n is x:
            return True
        if not isinstance(n, torch.fx.Node) or n in seen or len(seen) > 8 or n.op != "call_function":
            continue
        seen.add(n)
        frontier.extend(n.all_input_nodes)
    return False


WEIGHTS_NOTE = ("the probabilities are also computed for their other reader (returned attention weights: "
                "need_weights=False / output_attentions=False skips that)")
GRAPH_OUTPUT_REASON = (
    "the attention probabilities are an output of the compiled graph: returned as attention weights "
    "(output_attentions=False / need_weights=False does not compute them), or kept alive past a graph break later in "
    "the layer (torch._dynamo.explain(model)(*inputs) lists the breaks; e.g. a mixture of experts whose backward reads "
    "its routing on the host: transformers' experts_implementation=\"batched_mm\" traces whole)")
# (in training the rewrite still pays: fa2's backward, no probabilities kept for it)
WEIGHTS_INFERENCE_REASON = (
    "the attention probabilities are also read (returned attention weights) and this graph has no backward: they are "
    "computed anyway, so fa2 would only add its own attention on top (need_weights=False / output_attentions=False "
    "does not compute them, and fa2 rewrites the site)")
USED_ELSEWHERE_REASON = (
    "the attention probabilities are also used elsewhere (returned as attention weights: "
    "nn.MultiheadAttention(..., need_weights=False) or Hugging Face's output_attentions=False does not compute them, "
    "and fa2 rewrites the site; average_attn_weights makes no difference)")


def _towards_pv(node, users, bwd):
    """The one user of ``node`` that leads to the P V matmul (through casts and reshapes, P its left operand), or
    None: the others read the probabilities for something else (returned attention weights)."""
    found = []
    for u in users:
        prev, cur = node, u
        for _ in range(8):
            if is_call(cur, {aten.bmm.default}):
                if cur.args[0] is prev:
                    found.append(u)
                break
            nxt = _fwd_users(cur, bwd)
            if not (is_call(cur, CASTS) or is_call(cur, SHAPE_OPS) and _order_preserving(cur)) or len(nxt) != 1:
                break
            prev, cur = cur, nxt[0]
    return found[0] if len(found) == 1 else None


def _fill_matmul_site(site: Site, x, p, soft_nodes, bwd):
    # -- P -> PV: the probabilities may be cast and reshaped, nothing else; read by something else too (returned
    # attention weights), that reader keeps them (site.weights_sources) and the output still comes from fa2
    internal = set(soft_nodes)
    cur = p
    while True:
        users = _fwd_users(cur, bwd)
        if len(users) != 1:
            if not users:
                raise Reject("the softmax output is not used")
            main = _towards_pv(cur, users, bwd)
            if main is not None and site.dropout_p:
                raise Reject("the attention probabilities are read after dropout, whose mask fa2 draws itself "
                             "(nn.MultiheadAttention returns the dropped weights): need_weights=False / "
                             "output_attentions=False does not compute them, and fa2 rewrites the site")
            if main is None:
                raise Reject(GRAPH_OUTPUT_REASON if any(u.op == "output" for u in users) else USED_ELSEWHERE_REASON)
            if not bwd:
                raise Reject(WEIGHTS_INFERENCE_REASON)
            site.weights_sources.append(cur)
            users = [main]
        u = users[0]
        if is_call(u, {aten.bmm.default}):
            if u.args[0] is not cur:
                raise Reject("the attention probabilities are the right operand of the matmul")
            break
        if is_call(u, CASTS) or (is_call(u, SHAPE_OPS) and _order_preserving(u)):
            internal.add(u)
            cur = u
            continue
        if _is_safe_softmax_fixup(u, cur, x):
            internal.add(u)
            cur = u
            continue
        run = _permute_run(u, bwd) if is_call(u, PERMUTES) else []
        if run:  # permutes that cancel out (einsum's layout moves)
            internal.update(run)
            cur = run[-1]
            continue
        found = dropout_at(u, cur, bwd)
        if found is not None:
            if site.dropout_p:
                raise Reject("the attention probabilities go through dropout twice")
            site.dropout_p, nodes = found
            internal.update(nodes)
            cur = nodes[-1]
            continue
        if _is_random(u):
            raise Reject("the attention probabilities are multiplied by random numbers in a form fa2 does not read "
                         "as dropout (it reads F.dropout's: keep where rand > p, scale by 1 / (1 - p))")
        if is_call(u, {aten.mul.Tensor}) and same((shape(cur) or (0,))[-1], 1):
            raise Reject("one key (seqlen_k == 1): P V is an outer product, which the decompositions write as a "
                         "broadcasting mul")
        raise Reject(f"the attention probabilities go through {_name(u.target)} before the matmul")
    bmm_pv = u
    internal.add(bmm_pv)
    # -- QK^T and the scores
    chain = score_chain(x)
    scores, bmm_qk, scale, softcap, terms = chain.scores, chain.qk, chain.scale, chain.softcap, chain.terms
    chain_nodes, tensor_scales = chain.nodes, chain.tensor_scales
    internal.update(chain_nodes)
    internal.add(bmm_qk)
    for n in chain_nodes + [bmm_qk]:
        if len(_fwd_users(n, bwd)) > 1 and n is not x:
            raise Reject("the attention scores are also used elsewhere")
    (q3, k3), p3, v3 = qk_operands(bmm_qk), bmm_pv.args[0], bmm_pv.args[1]
    s = shape(scores)
    ps, p3s = shape(p), shape(p3)
    if not (same_shape(ps, s) and same(p3s[0], shape(bmm_qk)[0]) and same(p3s[1], s[-2]) and same(p3s[2], s[-1])):
        raise Reject("the attention probabilities are reshaped in a way fa2 cannot follow")
    # -- operands and output: (B, H, S, D) views if they all are, else the 3D bmm operands
    o3 = bmm_pv
    out, out_layout, four_d = o3, "nsd", len(s) == 4
    if four_d:
        target = (s[0], s[1], s[2], shape(o3)[2])
        chain = reshape_chain_down(o3, lambda n: same_shape(shape(n), target), bwd)
        ops = [bind_operand(q3, "q", s[:2], bwd), bind_operand(k3, "k", s[:2], bwd),
               bind_operand(v3, "v", s[:2], bwd)]
        if chain is None or any(op.layout in ("nsd", "nds") for op in ops):
            four_d = False
        else:
            out, out_layout = chain[-1], "bhsd"
            internal.update(chain)
            site.q, site.k, site.v = ops
    if not four_d:
        site.q, site.k, site.v = (bind_operand(q3, "q", None), bind_operand(k3, "k", None),
                                  bind_operand(v3, "v", None))
    _read_through_upcasts(site, val(out).dtype)
    for opnd in (site.q, site.k, site.v):
        internal.update(opnd.chain)
    site.output, site.out_layout = out, out_layout
    site.bmm_qk, site.bmm_pv, site.p_operand = bmm_qk, bmm_pv, p3
    site.scale, site.softcap, site.scale_tensors = scale, softcap, tensor_scales
    site.score_shape = s
    # (the rows a split padding mask leaves without a key are recomputed in the (batch, seqlen, heads) layout; an
    # added fill's gradient there is linear in q, k, v only without a softcap or a tensor scale)
    allowed = () if out_layout == "nsd" else ("fill", "document") if softcap or tensor_scales else \
        ("fill", "add", "document")
    if site.dropout_p:
        # (the rows a split leaves without a key would be recomputed undropped; eager drops out their uniform
        # average too: the mask stays one bias, under which fa2 averages and drops such rows as eager does)
        allowed = tuple(a for a in allowed if a == "document")
    site.mask = _plan(terms, s, val(x).dtype, allowed)
    if site.mask.document and not document_fits(s, val(x).device):
        site.mask = _plan(terms, s, val(x).dtype, tuple(a for a in allowed if a != "document"))
    fills = [e for e in site.mask.bias if e.kind == "fill"]
    if len(fills) > 1 and any(e.kind == "add" and e.overwritten for e in site.mask.bias):
        raise Reject("a bias added before several finite-valued masks")
    if len(s) > 4 and site.mask.bias:
        raise Reject("a mask on grouped-query (5-D) scores that is not a causal / window band: not supported (fa2 "
                     "reads 4-D masks)")
    site.internal = internal
    # a chain node of an operand may be shared with another consumer (e.g. repeat_kv output reused): then it
    # is not internal
    for opnd in (site.q, site.k, site.v):
        for n in opnd.chain:
            if any(u not in internal and u not in bwd for u in n.users):
                internal.discard(n)
    _check_shapes(site, s)


def _exact_upcast_source(node):
    """x when ``node`` is x cast to a wider floating dtype (bf16 / fp16 -> fp32 / fp64, fp32 -> fp64): every value of
    x is exactly representable after the cast, so reading x instead reads the same numbers."""
    if not is_call(node, CASTS):
        return None
    if node.target == aten._to_copy.default and set(node.kwargs) - {"dtype"}:
        return None
    src = node.args[0]
    a, b = val(src), val(node)
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype.is_floating_point
            and b.dtype.is_floating_point):
        return None
    wider = {torch.float16: (torch.float32, torch.float64), torch.bfloat16: (torch.float32, torch.float64),
             torch.float32: (torch.float64,)}
    return src if b.dtype in wider.get(a.dtype, ()) else None


def _read_through_upcasts(site: Site, out_dtype):
    """GPT-J upcasts q and k (after rotary) to float32 and leaves v and the output in bfloat16: eager's scores are
    then the float32 products of bfloat16 values, which is what fa2's kernels compute from the bfloat16 tensors
    (products exact in float32, sums accumulated in float32), and its softmax is float32 as fa2's. So an operand
    that is an exact upcast of a tensor in the dtype of the output is read before the cast; a cast that rounds (a
    narrowing one, or an upcast of a tensor computed in float32) is not looked through."""
    for opnd in (site.q, site.k, site.v):
        if val(opnd.node).dtype == out_dtype:
            continue
        src = _exact_upcast_source(opnd.node)
        if src is None or val(src).dtype != out_dtype:
            return
    for opnd in (site.q, site.k, site.v):
        src = _exact_upcast_source(opnd.node) if val(opnd.node).dtype != out_dtype else None
        if src is not None:
            opnd.chain.insert(0, opnd.node)
            opnd.node = src


def _plan(terms, score_shape, dtype, empty_rows=()) -> MaskPlan:
    plan = plan_masks(terms, score_shape[-2], score_shape[-1], dtype, len(score_shape), empty_rows)
    if isinstance(plan, str):
        raise Reject(plan)
    for entry in plan.bias:
        if entry.kind == "doc":  # (per-token ids, checked against the scores by masks._document_plan)
            continue
        b = shape(entry[1])
        if b is not None and entry.folded:
            b = unfolded_shape(b, score_shape)
        if b is None or len(b) > len(score_shape):
            raise Reject("the mask does not broadcast to the scores")
        for dim_b, dim_s in zip(reversed(b), reversed(score_shape)):
            if not (same(dim_b, 1) or same(dim_b, dim_s)):
                raise Reject("the mask does not broadcast to the scores")
    return plan


# The CUDA kernels' grid takes at most this many sequences (plan.cpp); a document mask runs as batch * seqlen of them
CUDA_MAX_SEQUENCES = 65535


def document_fits(score_shape, device) -> bool:
    """Whether a document mask over these scores may run as varlen (masks._document_plan): on CUDA its
    batch * seqlen sequences (most of them empty) must fit the grid; under dynamic shapes that is a guard."""
    if device.type != "cuda":
        return True
    sequences = score_shape[0] * score_shape[-1]
    if isinstance(sequences, int):
        return sequences <= CUDA_MAX_SEQUENCES
    return guard_bool(sequences <= CUDA_MAX_SEQUENCES)


def unfolded_shape(b, score_shape):
    """The 4-D shape of a 3-D (batch * heads, ...) bias under (B, H, Sq, Sk) scores (None if it is not one)."""
    if len(b) == 3 and len(score_shape) == 4 and same(b[0], 1):
        return (1, 1, b[1], b[2])
    if len(b) == 3 and len(score_shape) == 4 and same(b[0], score_shape[0] * score_shape[1]):
        return (score_shape[0], score_shape[1], b[1], b[2])
    return None


def _fa2_dims(op: Operand):
    """(batch, seqlen, heads, headdim) of an operand as fa2 sees it."""
    s = shape(op.node)
    if op.layout == "bhsd":
        return s[0], s[2], s[1], s[3]
    if op.layout == "bhds":
        return s[0], s[3], s[1], s[2]
    if op.layout == "nsd":
        return s[0], s[1], 1, s[2]
    return s[0], s[2], 1, s[1]   # nds


def _check_shapes(site: Site, score_shape):
    bq, sq, hq, dq = _fa2_dims(site.q)
    bk, sk, hk, dk = _fa2_dims(site.k)
    bv, sv, hv, dv = _fa2_dims(site.v)
    if not (same(bq, bk) and same(bq, bv)):
        raise Reject("q, k and v have different batch sizes")
    if not same(sk, sv):
        raise Reject("k and v have different sequence lengths")
    if not same(hk, hv):
        raise Reject("k and v have different numbers of heads")
    if not same(dq, dk):
        raise Reject("q and k have different head dims")
    if not same(dq, dv) and not value_headdim_supported():
        raise Reject(f"the value head dim ({dv}) differs from the query/key head dim ({dq}) and the installed fa2 "
                     "ops take one head dim for q, k and v")
    if not (isinstance(hq, int) and isinstance(hk, int) and hk > 0 and hq % hk == 0):
        if not same(hq, hk):
            raise Reject("the number of query heads is not a multiple of the number of key/value heads")
    if not (same(score_shape[-2], sq) and same(score_shape[-1], sk)):
        raise Reject("the scores do not have the shape (seqlen_q, seqlen_k)")


_VALUE_HEADDIM: list = []


def value_headdim_supported() -> bool:
    """Whether the installed ops take v with a head dim of its own (MLA: out then has v's head dim): one tiny CPU
    call, made once."""
    if not _VALUE_HEADDIM:
        from ._compat import real_mode
        try:
            with real_mode(), torch.no_grad():
                q = torch.ones(1, 2, 1, 8)
                out, _ = torch.ops.fa2.fwd(q, q, torch.ones(1, 2, 1, 4))
            _VALUE_HEADDIM.append(tuple(out.shape) == (1, 2, 1, 4))
        except (RuntimeError, ValueError, TypeError):
            _VALUE_HEADDIM.append(False)
    return _VALUE_HEADDIM[0]


def check_supported(site: Site):
    """What the fa2 kernels accept: device, dtype, head dim."""
    vq, vk, vv, vo = val(site.q.node), val(site.k.node), val(site.v.node), val(site.output)
    dtype = vq.dtype
    if vk.dtype != dtype or vv.dtype != dtype:
        raise Reject(f"q, k, v dtypes differ ({vq.dtype}, {vk.dtype}, {vv.dtype})")
    if vo.dtype != dtype:
        raise Reject(f"the attention output is {vo.dtype} but q is {dtype}")
    device = vq.device
    if vk.device != device or vv.device != device:
        raise Reject("q, k, v are on different devices")
    if device.type == "cuda":
        if dtype not in CUDA_DTYPES:
            raise Reject(f"{dtype} on CUDA (fa2's CUDA kernels take float16/bfloat16)")
    elif device.type == "cpu":
        if dtype not in CPU_DTYPES:
            raise Reject(f"{dtype} on CPU")
    else:
        raise Reject(f"device {device.type} has no fa2 kernel")
    _check_headdim(_fa2_dims(site.q)[3])
    if not same(_fa2_dims(site.q)[3], _fa2_dims(site.v)[3]):
        _check_headdim(_fa2_dims(site.v)[3])
    for entry in (site.mask.bias if site.mask else []):
        b = val(entry[1])
        if b.device != device:
            raise Reject("the mask is on another device")
        if entry.kind == "add" and not b.dtype.is_floating_point:
            raise Reject(f"an additive {b.dtype} mask")


def _check_headdim(headdim):
    if not isinstance(headdim, int):
        # dynamic=True makes even the head dim symbolic: guard on the kernel's limit (a model whose head dim
        # then grows past it recompiles, and is not rewritten)
        if not guard_bool(headdim <= MAX_HEADDIM):
            raise Reject(f"head dim {headdim} > {MAX_HEADDIM}")
    elif headdim > MAX_HEADDIM:
        raise Reject(f"head dim {headdim} > {MAX_HEADDIM}")


# ---- SDPA sites -------------------------------------------------------------------------------------------------

def _sdpa_args(node) -> dict:
    schema = node.target._schema
    out = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            out[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
    return out


def sdpa_site(node, bwd) -> Site | None:
    if not is_call(node, SDPA_FWD) or node in bwd:
        return None
    site = Site("sdpa", node, sdpa_node=node)
    try:
        args = _sdpa_args(node)
        q, k, v = args["query"], args["key"], args["value"]
        for t in (q, k, v):
            if len(shape(t) or ()) != 4:
                raise Reject("SDPA inputs are not 4D")
        site.dropout_p = float(args.get("dropout_p", 0.0) or 0.0)
        if not 0.0 <= site.dropout_p < 1.0:
            raise Reject(f"SDPA with dropout_p={site.dropout_p}")
        mask = args.get("attn_mask", args.get("attn_bias"))
        site.q, site.k, site.v = Operand(q, "bhsd"), Operand(k, "bhsd"), Operand(v, "bhsd")
        if SDPA_FWD[node.target] == "composite":
            site.output = node
        else:
            outs = [u for u in node.users if u.target is operator.getitem and u.args[1] == 0]
            if len(outs) != 1:
                raise Reject("unexpected SDPA graph")
            site.output = outs[0]
        for u in node.users:
            if u.target is operator.getitem and u.args[1] != 0 and \
                    any(w not in bwd and w.target not in SDPA_BWD for w in u.users):
                raise Reject("the SDPA op's extra outputs (logsumexp, ...) are used")
        site.internal = {node, site.output} | {u for u in node.users}
        site.scale = args.get("scale")
        site.topleft_causal = bool(args.get("is_causal", False))
        sq, sk = shape(q)[2], shape(k)[2]
        terms = []
        if mask is not None:
            mv = val(mask)
            if mv.dtype == torch.bool:
                terms.append(MaskTerm("where", mask, keep_if_true=True, fill=-math.inf))
            else:
                terms.append(MaskTerm("add", mask))
        plan = plan_masks(terms, sq, sk, val(q).dtype, 4, ("fill", "add", "document"))
        if not isinstance(plan, str) and plan.document and \
                not document_fits((shape(q)[0], shape(q)[1], sq, sk), val(q).device):
            plan = plan_masks(terms, sq, sk, val(q).dtype, 4, ("fill", "add"))
        if isinstance(plan, str):
            raise Reject(plan)
        site.mask = plan
        _check_shapes(site, (shape(q)[0], shape(q)[1], sq, sk))
        check_supported(site)
    except Reject as e:
        site.reason = str(e)
    return site


def find_sites(graph: torch.fx.Graph, bwd: set) -> list[Site]:
    sites = []
    for node in graph.nodes:
        if node.op != "call_function" or node in bwd:
            continue
        site = matmul_site(node, bwd) if node.target in (aten.div.Tensor, aten._softmax.default) else \
            sdpa_site(node, bwd) if node.target in SDPA_FWD else None
        if site is not None:
            sites.append(site)
    return sites
