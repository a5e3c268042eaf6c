"""fa2's compiler integration: an Inductor pass that rewrites attention into fa2 (see docs/design.md, "Inductor pass").

* ``torch.compile(model, backend="fa2")``: Inductor with this pass (fa2.backend).
* :func:`install` / :func:`uninstall`: add / remove the pass for the default ``torch.compile`` backend.
* :func:`fa2.explain`: which attention sites a model has and what happened to each.
"""
from __future__ import annotations

from . import _compat
from .graph_pass import Fa2AttentionPass, SiteRecord, get_pass, recording, rewrite_attention

__all__ = ["install", "uninstall", "installed", "get_pass", "rewrite_attention", "recording", "SiteRecord",
           "Fa2AttentionPass"]


def install() -> None:
    """Run fa2's pass in every ``torch.compile`` with Inductor (the default backend) from now on. Other custom passes
    already in the slot keep running. Calling it twice is harmless. (Only the backends "fa2" and "fa2_eager" read a
    causal mask kept in a module buffer at compile time, fa2.inductor.buffers: here such a mask stays a bool bias, and
    :func:`fa2.explain`, which compiles with ``backend="fa2"``, reports causal=True for it.)"""
    from .graph_pass import with_pass
    config = _compat.inductor_config()
    setattr(config, _compat.JOINT_PRE_PASS, with_pass(getattr(config, _compat.JOINT_PRE_PASS)))


def uninstall() -> None:
    """Undo :func:`install` (leaves other custom passes in place)."""
    from .graph_pass import without_pass
    config = _compat.inductor_config()
    setattr(config, _compat.JOINT_PRE_PASS, without_pass(getattr(config, _compat.JOINT_PRE_PASS)))


def installed() -> bool:
    from .graph_pass import _flatten
    config = _compat.inductor_config()
    return any(isinstance(p, Fa2AttentionPass) for p in _flatten(getattr(config, _compat.JOINT_PRE_PASS)))
