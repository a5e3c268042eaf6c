"""Python-side registrations for the ops declared in cpp/ops.cpp: fake kernels, autograd, and the
CompositeImplicitAutograd body of ``fa2::attention``.

Fake kernels derive shapes from the inputs alone (never from kernel tile sizes), so they work with symbolic sizes.
"""
from __future__ import annotations

import contextlib
import threading

import torch

# fa2.deterministic()'s setting, per thread: read when a call's forward runs and kept with its autograd node, because
# its backward may run on another thread (the autograd engine runs CUDA nodes on a per-device worker thread, where
# this thread's setting is not visible).
_state = threading.local()


def deterministic_enabled() -> bool:
    """True inside ``fa2.deterministic()`` or when ``torch.use_deterministic_algorithms(True)`` is on."""
    return getattr(_state, "deterministic", False) or torch.are_deterministic_algorithms_enabled()


@contextlib.contextmanager
def deterministic(enabled: bool = True):
    """Make the backward of the fa2 calls made inside this block bitwise reproducible (CUDA dQ is then reduced in a
    fixed order), wherever and whenever that backward runs."""
    previous = getattr(_state, "deterministic", False)
    _state.deterministic = enabled
    try:
        yield
    finally:
        _state.deterministic = previous


# ---- fake kernels ------------------------------------------------------------------------------------------

def _check_ranks(q, k, v):
    # Only what the fake kernels need in order to compute shapes; every other check runs in the real kernel's
    # shared C++ checks (cpp/checks.cpp), with these same messages.
    for name, t, dims in (("q", q, "(batch, seqlen_q, nheads, headdim)"), ("k", k, "(batch, seqlen_k, nheads_k, headdim)"),
                          ("v", v, "(batch, seqlen_k, nheads_k, headdim)")):
        if t.dim() != 4:
            raise ValueError(f"fa2: {name} must have 4 dims {dims}, got {t.dim()} dims with shape {list(t.shape)}")


@torch.library.register_fake("fa2::fwd")
def _fwd_fake(q, k, v, attn_bias=None, scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0):
    _check_ranks(q, k, v)
    batch, seqlen_q, nheads, headdim = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, headdim))
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
    return out, lse


@torch.library.register_fake("fa2::bwd")
def _bwd_fake(dout, q, k, v, out, lse, attn_bias=None, scale=None, causal=False, window_left=-1,
              window_right=-1, softcap=0.0, bias_requires_grad=False, deterministic=False):
    _check_ranks(q, k, v)
    dq = q.new_empty(q.shape)
    dk = k.new_empty(k.shape)
    dv = v.new_empty(v.shape)
    if bias_requires_grad:
        dbias = attn_bias.new_empty(attn_bias.shape)
    else:
        dbias = q.new_empty((0,))
    return dq, dk, dv, dbias


# ---- autograd ----------------------------------------------------------------------------------------------

def _setup_context(ctx, inputs, output):
    q, k, v, attn_bias, scale, causal, window_left, window_right, softcap = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, attn_bias)
    ctx.flags = (scale, causal, window_left, window_right, softcap)
    ctx.bias_requires_grad = (attn_bias is not None and attn_bias.requires_grad
                              and attn_bias.dtype != torch.bool)
    ctx.deterministic = deterministic_enabled()  # the forward's thread's setting (see _state)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, attn_bias = ctx.saved_tensors
    scale, causal, window_left, window_right, softcap = ctx.flags
    if dout is None:
        dout = torch.zeros_like(out)
    elif dout.stride(-1) != 1:
        # Autograd hands e.g. expanded ones (all strides 0) for out.sum(); the kernels read rows of dout directly.
        dout = dout.contiguous()
    dq, dk, dv, dbias = torch.ops.fa2.bwd(
        dout, q, k, v, out, lse, attn_bias, scale, causal, window_left, window_right, softcap,
        ctx.bias_requires_grad, ctx.deterministic or torch.are_deterministic_algorithms_enabled())
    return dq, dk, dv, (dbias if ctx.bias_requires_grad else None), None, None, None, None, None


torch.library.register_autograd("fa2::fwd", _backward, setup_context=_setup_context)


# ---- attention = fwd(...)[0], differentiable through fwd's autograd ----------------------------------------

@torch.library.impl("fa2::attention", "CompositeImplicitAutograd")
def _attention(q, k, v, attn_bias=None, scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0):
    return torch.ops.fa2.fwd(q, k, v, attn_bias, scale, causal, window_left, window_right, softcap)[0]
