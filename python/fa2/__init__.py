"""fa2: FlashAttention-2 for PyTorch.

Three ways in:
  * ``torch.compile(model, backend="fa2")`` rewrites every attention site of an unmodified model into fa2;
  * ``fa2.attention(q, k, v, ...)`` / ``torch.ops.fa2.attention`` (flash-attn layout) and ``fa2.sdpa(...)``
    (a drop-in for F.scaled_dot_product_attention);
  * Hugging Face: ``fa2.hf.register()`` then ``attn_implementation="fa2"``;
and PyTorch's own SDPA on fa2: ``fa2.enable_sdpa_backend()`` / ``fa2.disable_sdpa_backend()`` / ``with fa2.sdpa_backend():``.
"""
from __future__ import annotations

import torch  # noqa: F401  (torch must be loaded before the extension)

from ._loader import load_native as _load_native

_C = _load_native()

from . import _ops_impl  # noqa: E402,F401  (fake kernels, autograd, composite attention)
from ._ops_impl import deterministic  # noqa: E402
from .ops import attention, attention_with_lse, sdpa  # noqa: E402
from .varlen import varlen_attention  # noqa: E402  (also registers varlen_fwd / varlen_bwd's fake kernels, autograd)
from . import _decode  # noqa: E402,F401  (the internal _decode_attention op's fake kernel)
from .kvcache import attention_with_kvcache  # noqa: E402  (also registers kvcache_fwd's fake kernel, autograd)
from . import backend as _backend  # noqa: E402,F401  (registers torch.compile(backend="fa2"); Inductor loads lazily)
from ._sdpa_backend import disable_sdpa_backend, enable_sdpa_backend, sdpa_backend  # noqa: E402

__version__ = _C.build_info()["version"]

__all__ = ["attention", "attention_with_lse", "sdpa", "varlen_attention", "attention_with_kvcache", "deterministic",
           "explain", "install", "uninstall", "enable_sdpa_backend", "disable_sdpa_backend", "sdpa_backend",
           "build_info", "__version__"]


def build_info() -> dict:
    """What this build of fa2 contains: version, torch it was built against, CUDA archs, kernel instances."""
    return dict(_C.build_info())


def __getattr__(name):
    # The compiler integration imports Inductor internals; load it only when asked for.
    if name in ("explain",):
        from .inductor.explain import explain
        return explain
    if name in ("install", "uninstall"):
        from . import inductor
        return getattr(inductor, name)
    if name in ("hf", "reference", "inductor", "demo", "dev"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'fa2' has no attribute {name!r}")
