"""The "fa2" torch.compile backend: Inductor with fa2's attention pass.

``torch.compile(model, backend="fa2")`` works after ``import fa2.backend`` (and through the ``torch_dynamo_backends``
entry point when fa2 is installed). ``mode=`` and ``options=`` are Inductor's and pass through unchanged.
``backend="fa2_eager"`` runs the same pass but no Inductor code generation (AOT autograd + eager): for debugging a
rewrite and for fast tests. Both take a module's triangular causal-mask buffer (nanoGPT's ``tril``) as a compile-time
constant behind a guard (fa2.inductor.buffers), so that such a mask becomes ``causal=True``.
"""
from __future__ import annotations

from typing import Any

from .inductor import _compat
from .inductor.buffers import guarded, take_mask_buffers

__all__ = ["fa2_backend", "fa2_eager_backend"]


def fa2_backend(gm, example_inputs, mode: str | None = None, options: dict[str, Any] | None = None, **kwargs):
    """Dynamo backend: compile ``gm`` with Inductor, with fa2's pass in ``joint_custom_pre_pass``."""
    from .inductor.graph_pass import with_pass
    config = _compat.inductor_config()
    known = config.get_config_copy()
    for key in {**(options or {}), **kwargs}:
        if key not in known:  # (Inductor's own check runs in torch.compile, which cannot see a custom backend's)
            raise RuntimeError(f"fa2: unexpected optimization option {key!r}: options= takes Inductor's settings "
                               "(torch._inductor.config, e.g. 'max_autotune', 'triton.cudagraphs')")
    patches = {**_compat.inductor_mode_options(mode), **(options or {}), **kwargs}
    current = patches.get(_compat.JOINT_PRE_PASS, getattr(config, _compat.JOINT_PRE_PASS))
    patches[_compat.JOINT_PRE_PASS] = with_pass(current)
    graph, entries = take_mask_buffers(gm, example_inputs)
    return guarded(_compat.compile_fx(graph, example_inputs, config_patches=patches), gm, entries)


def fa2_eager_backend(gm, example_inputs, **_ignored):
    """Dynamo backend: AOT autograd with Inductor's decompositions and fa2's pass, graphs run eagerly."""
    from .inductor.graph_pass import rewrite_attention
    graph, entries = take_mask_buffers(gm, example_inputs)
    return guarded(_compat.aot_eager_with_joint_pass(rewrite_attention)(graph, example_inputs), gm, entries)


_compat.register_backend_lazily("fa2", __name__, "fa2_backend")
_compat.register_backend_lazily("fa2_eager", __name__, "fa2_eager_backend")
