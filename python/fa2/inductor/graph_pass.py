"""The Inductor pass: find every attention site in the ATen joint (or inference) graph and rewrite it into fa2."""
from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass, field

import torch

from . import _compat
from .rewrite import rewrite_site
from .sites import Reject, SDPA_FWD, Site, find_sites

log = logging.getLogger("fa2.inductor")

_SOURCES = ("_compat.py", "masks.py", "sites.py", "rewrite.py", "graph_pass.py")


@dataclass
class SiteRecord:
    """One attention-like site of a compiled graph, as ``fa2.explain`` reports it."""
    module: str
    source: str
    kind: str
    graph: str                  # "training" (joint graph: fwd + bwd rewritten) or "inference"
    rewritten: bool
    flags: dict = field(default_factory=dict)
    reason: str | None = None

    def __str__(self) -> str:
        status = "fa2" if self.rewritten else "kept"
        extra = ", ".join(f"{k}={v}" for k, v in self.flags.items())
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.module or '?'} [{self.source}] {self.kind}/{self.graph}: {status} {extra}{why}"


class Recording(list):
    """The :class:`SiteRecord` of every site the pass saw, plus per graph the fa2 ops it holds afterwards
    (``graphs``: dicts with kind, sites, rewritten, fa2_fwd, fa2_bwd)."""

    def __init__(self):
        super().__init__()
        self.graphs: list[dict] = []


_recorders: list[Recording] = []


@contextlib.contextmanager
def recording():
    """Collect what the pass does inside this block (see :class:`Recording`). Compiles served from the AOT
    autograd / FX graph caches do not run the pass and so record nothing."""
    records = Recording()
    _recorders.append(records)
    try:
        yield records
    finally:
        _recorders.remove(records)


def backward_nodes(graph: torch.fx.Graph) -> set:
    """The backward half of a joint graph: nodes that depend on an incoming gradient, and the forward-side nodes
    that only feed those (saved activations and their views)."""
    seen, stack = set(), [n for n in graph.nodes if _compat.is_tangent(n)]
    while stack:
        n = stack.pop()
        if n in seen or n.op == "output":
            continue
        seen.add(n)
        stack.extend(n.users)
    if not seen:
        return seen
    for n in reversed(graph.nodes):
        if n not in seen and n.op == "call_function" and n.users and all(u in seen for u in n.users):
            seen.add(n)
    return seen


def _has_candidates(graph) -> bool:
    aten = _compat.aten
    for n in graph.nodes:
        if n.op == "call_function" and (n.target in (aten.exp.default, aten._softmax.default)
                                        or n.target in SDPA_FWD):
            return True
    return False


# PyTorch's fused eval fast paths: one op for a whole layer, its attention out of the pass's reach. Reported (kept,
# with the way to expose them) so that fa2.explain does not say "no attention sites found".
_FUSED_LAYERS = {"_transformer_encoder_layer_fwd": "nn.TransformerEncoderLayer",
                 "_native_multi_head_attention": "nn.MultiheadAttention"}


def _record_fused_layers(graph: torch.fx.Graph) -> None:
    if not _recorders:
        return
    records = []
    for n in graph.nodes:
        name = getattr(getattr(n.target, "overloadpacket", None), "__name__", None) if n.op == "call_function" else None
        if name in _FUSED_LAYERS:
            module, source = _origin(n)
            records.append(SiteRecord(module, source, "fused", "inference", False, {},
                                      f"{_FUSED_LAYERS[name]}'s eval fast path (aten.{name}: one op for the layer); "
                                      "torch.backends.mha.set_fastpath_enabled(False) before compiling exposes its "
                                      "attention to fa2"))
    for recorder in _recorders:
        recorder.extend(records)


def rewrite_attention(graph: torch.fx.Graph) -> list[Site]:
    """Rewrite every attention site of ``graph`` that fa2 computes exactly; returns all sites found."""
    _record_fused_layers(graph)
    if not _has_candidates(graph):
        return []
    bwd = backward_nodes(graph)
    training = bool(bwd)
    fake_mode = _compat.fake_mode_of(graph)
    changed = False
    # One site at a time, the graph searched again after each rewrite: a site may read another's output (one
    # attention's result as the next one's q, k or v), and the nodes found for it before would be stale.
    done: list[Site] = []
    settled: set = set()  # anchors of the sites already decided (kept ones stay in the graph and are found again)
    order: dict = {}  # anchor -> the site's place in the graph as first found (the order of the records)
    while True:
        pending = None
        found = find_sites(graph, bwd)
        if not order:
            order = {site.anchor: i for i, site in enumerate(found)}
        for site in found:
            if site.anchor in settled:
                continue
            if site.reason is None and fake_mode is None:
                site.reason = "no fake tensor mode on the graph"
            if site.reason is not None:
                settled.add(site.anchor)
                done.append(site)
            elif pending is None:
                pending = site
        if pending is None:
            break
        settled.add(pending.anchor)
        try:
            rewrite_site(graph, pending, bwd, fake_mode)
            pending.rewritten = True
            changed = True
            bwd = backward_nodes(graph) if training else bwd
        except Reject as e:
            pending.reason = str(e)
            if str(e).startswith("internal error"):
                log.warning("fa2: %s at %s", e, _origin(pending.anchor)[1])
        done.append(pending)
    sites = sorted(done, key=lambda site: order.get(site.anchor, len(order)))
    if changed:
        _compat.stable_topological_sort(graph)
        graph.lint()
    records = []
    for site in sites:
        module, source = _origin(site.anchor)
        record = SiteRecord(module, source, site.kind, "training" if training else "inference", site.rewritten,
                            site.flags() if site.mask is not None else {}, site.reason)
        log.debug("fa2 site: %s", record)
        records.append(record)
    if _recorders:
        counts = {"kind": "training" if training else "inference", "sites": len(sites),
                  "rewritten": sum(s.rewritten for s in sites),
                  "fa2_fwd": sum(n.target in _fa2_ops("fwd", "varlen_fwd") for n in graph.nodes),
                  "fa2_bwd": sum(n.target in _fa2_ops("bwd", "varlen_bwd") for n in graph.nodes)}
        for recorder in _recorders:
            recorder.extend(records)
            recorder.graphs.append(counts)
    return sites


def _fa2_ops(*names) -> set:
    return {getattr(torch.ops.fa2, name).default for name in names if hasattr(torch.ops.fa2, name)}


class Fa2AttentionPass(_compat.CustomGraphPass):
    """Rewrites attention into ``torch.ops.fa2.fwd`` / ``fa2.bwd``. Install it with :func:`fa2.install` or use
    ``torch.compile(backend="fa2")``. Idempotent: a graph it already rewrote has no attention left to find."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        rewrite_attention(graph)

    def uuid(self):
        # The FX graph cache keys on this: the pass's sources, what it emits (fa2's autograd, fa2.sdpa), torch, and
        # the state that changes the emitted graph (deterministic backward, whether the ops take a value head dim of
        # their own).
        from .. import _ops_impl, ops
        here = os.path.dirname(os.path.abspath(__file__))
        from .. import varlen
        files = tuple(os.path.join(here, f) for f in _SOURCES) + (_ops_impl.__file__, ops.__file__, varlen.__file__)
        from .sites import value_headdim_supported
        extra = f"{torch.__version__}|det={_ops_impl.deterministic_enabled()}|vdim={value_headdim_supported()}"
        return _compat.hash_files(files, extra)

    def __repr__(self) -> str:
        return "Fa2AttentionPass()"


class _PassChain(_compat.CustomGraphPass):
    """Two custom passes in one config slot (older torch takes a single pass there)."""

    def __init__(self, passes):
        self.passes = list(passes)

    def __call__(self, graph):
        for p in self.passes:
            p(graph)

    def uuid(self):
        uuids = []
        for p in self.passes:
            uuid = p.uuid() if hasattr(p, "uuid") else None
            if uuid is None:
                return None
            uuids.append(str(uuid))
        return "|".join(uuids)


_PASS = Fa2AttentionPass()


def get_pass() -> Fa2AttentionPass:
    return _PASS


def with_pass(current):
    """The config value that runs fa2's pass after whatever ``current`` holds (unchanged if already there)."""
    passes = _flatten(current)
    if any(isinstance(p, Fa2AttentionPass) for p in passes):
        return current
    if not passes:
        return _PASS
    return _PassChain(passes + [_PASS])


def without_pass(current):
    passes = [p for p in _flatten(current) if not isinstance(p, Fa2AttentionPass)]
    if not passes:
        return None
    return passes[0] if len(passes) == 1 else _PassChain(passes)


def _flatten(value) -> list:
    out = []
    for p in _compat.get_custom_passes(value):
        out.extend(p.passes if isinstance(p, _PassChain) else [p])
    return out


# ---- where a site came from ---------------------------------------------------------------------------------------

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _origin(node) -> tuple[str, str]:
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    module = ""
    if stack:
        entry = list(stack.values())[-1]
        module = _clean_path(entry[0] if isinstance(entry, tuple) else str(entry))
    source = ""
    trace = node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(trace)
    if frames:
        path, line, func = frames[-1]
        source = f"{os.path.basename(path)}:{line} ({func})"
    return module, source


def _clean_path(path: str) -> str:
    path = re.sub(r"^L\['self'\]\.?", "", path)
    path = re.sub(r"^G\['__import_[^']*'\]\.(\w+)", r"G['\1']", path)  # a module global seen through an import
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    path = re.sub(r"getattr\((.*?), '(\w+)'\)", r"\1.\2", path)
    path = re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", path)
    return path.lstrip(".") or "<root>"
