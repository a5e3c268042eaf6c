"""Loads the native extension (which registers torch.ops.fa2.*) with a useful message when it cannot."""
from __future__ import annotations

import json
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
REBUILD_HINT = "rebuild fa2 against the installed torch: pip install --no-build-isolation --force-reinstall --no-deps ."


def recorded_build_info() -> dict:
    """What the build recorded, readable without loading the library (see cmake/build_info.json.in)."""
    try:
        with open(os.path.join(_HERE, "_build_info.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def load_native():
    try:
        from fa2 import _C  # noqa: F401  (importing registers the ops)
    except ImportError as e:
        built = recorded_build_info().get("torch_version", "an unknown torch")
        msg = str(e)
        if "undefined symbol" in msg or "symbol not found" in msg or built != torch.__version__:
            raise ImportError(
                f"fa2's native extension was built against torch {built}, but torch {torch.__version__} is "
                f"installed and the two are not binary compatible ({msg.strip()}). {REBUILD_HINT}"
            ) from e
        raise ImportError(f"fa2's native extension could not be loaded ({msg.strip()}). {REBUILD_HINT}") from e
    return _C
