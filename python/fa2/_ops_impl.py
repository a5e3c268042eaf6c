"""Python-side registrations for the ops declared in cpp/ops.cpp: fake kernels, autograd, and the
CompositeImplicitAutograd body of ``fa2::attention``.

Fake kernels derive shapes from the inputs alone (never from kernel tile sizes), so they work with symbolic sizes.
"""
from __future__ import annotations

import contextlib
import threading

import torch
import torch.autograd.forward_ad as forward_ad

from ._rng import draw_rng_state

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
                          ("v", v, "(batch, seqlen_k, nheads_k, headdim_v)")):
        if t.dim() != 4:
            raise ValueError(f"fa2: {name} must have 4 dims {dims}, got {t.dim()} dims with shape {list(t.shape)}")


def _check_devices(q, prefix, **tensors):
    # The fake kernels also run for real inputs mixed with meta tensors (the Meta key wins the dispatch), where the C++
    # checks never see them: the same device rule and message here, or the "result" is an uninitialized CPU tensor.
    for name, t in tensors.items():
        if t is not None and t.device != q.device:
            raise RuntimeError(f"{prefix}: {name} must be on q's device ({q.device}), got {t.device}")


@torch.library.register_fake("fa2::fwd")
def _fwd_fake(q, k, v, attn_bias=None, scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
              dropout_p=0.0, rng_state=None, sinks=None):
    _check_ranks(q, k, v)
    _check_devices(q, "fa2", k=k, v=v, attn_bias=attn_bias, rng_state=rng_state, sinks=sinks)
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, v.shape[3]))  # v's head dim (may differ from q's and k's)
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
    return out, lse


_GRAD_ORDERS = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))


def _grad_like(t):
    # The gradient's layout: t's memory order where t is contiguous in some order of its first three dims (headdim
    # innermost), the first such order of _GRAD_ORDERS, else contiguous: the real kernels' rule (empty_grad_like,
    # cpp/checks.cpp), orders tried in the same sequence.
    for order in _GRAD_ORDERS:
        if t.permute(*order, 3).is_contiguous():
            inverse = [order.index(i) for i in range(3)]
            return t.new_empty([t.shape[i] for i in order] + [t.shape[3]]).permute(*inverse, 3)
    return t.new_empty(t.shape)


@torch.library.register_fake("fa2::bwd")
def _bwd_fake(dout, q, k, v, out, lse, attn_bias=None, scale=None, causal=False, window_left=-1,
              window_right=-1, softcap=0.0, bias_requires_grad=False, deterministic=False, dropout_p=0.0,
              rng_state=None):
    _check_ranks(q, k, v)
    _check_devices(q, "fa2.bwd", dout=dout, k=k, v=v, out=out, lse=lse, attn_bias=attn_bias, rng_state=rng_state)
    dq, dk, dv = _grad_like(q), _grad_like(k), _grad_like(v)
    if bias_requires_grad:
        dbias = attn_bias.new_empty(attn_bias.shape)
    else:
        dbias = q.new_empty((0,))
    return dq, dk, dv, dbias


@torch.library.register_fake("fa2::bwd_with_sinks")
def _bwd_with_sinks_fake(dout, q, k, v, out, lse, sinks, attn_bias=None, scale=None, causal=False, window_left=-1,
                         window_right=-1, softcap=0.0, bias_requires_grad=False, deterministic=False, dropout_p=0.0,
                         rng_state=None):
    _check_devices(q, "fa2.bwd", sinks=sinks)
    grads = _bwd_fake(dout, q, k, v, out, lse, attn_bias, scale, causal, window_left, window_right, softcap,
                      bias_requires_grad, deterministic, dropout_p, rng_state)
    return (*grads, sinks.new_empty(sinks.shape))


# ---- autograd ----------------------------------------------------------------------------------------------

def _setup_context(ctx, inputs, output):
    q, k, v, attn_bias, scale, causal, window_left, window_right, softcap, dropout_p, rng_state, sinks = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, attn_bias, rng_state, sinks)
    ctx.flags = (scale, causal, window_left, window_right, softcap)
    ctx.dropout_p = dropout_p
    ctx.sinks_requires_grad = sinks is not None and sinks.requires_grad
    ctx.bias_requires_grad = (attn_bias is not None and attn_bias.requires_grad
                              and attn_bias.dtype != torch.bool)
    ctx.deterministic = deterministic_enabled()  # the forward's thread's setting (see _state)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, attn_bias, rng_state, sinks = ctx.saved_tensors
    scale, causal, window_left, window_right, softcap = ctx.flags
    if dout is None:
        dout = torch.zeros_like(out)
    elif dout.stride(-1) != 1:
        # Autograd hands e.g. expanded ones (all strides 0) for out.sum(); the kernels read rows of dout directly.
        dout = dout.contiguous()
    deterministic = ctx.deterministic or torch.are_deterministic_algorithms_enabled()
    if ctx.sinks_requires_grad:  # (d sinks from the backward's own row sums)
        dq, dk, dv, dbias, dsinks = torch.ops.fa2.bwd_with_sinks(
            dout, q, k, v, out, lse, sinks, attn_bias, scale, causal, window_left, window_right, softcap,
            ctx.bias_requires_grad, deterministic, ctx.dropout_p, rng_state)
    else:
        dq, dk, dv, dbias = torch.ops.fa2.bwd(
            dout, q, k, v, out, lse, attn_bias, scale, causal, window_left, window_right, softcap,
            ctx.bias_requires_grad, deterministic, ctx.dropout_p, rng_state)
        dsinks = None
    return (dq, dk, dv, (dbias if ctx.bias_requires_grad else None), None, None, None, None, None, None, None,
            dsinks)


# Autograd kernels. torch.library.register_autograd would register the same structure, but its kernel costs host
# time on every call: it rebuilds the defaults the dispatcher strips off the arguments with
# torch._library.utils.fill_defaults, which reads schema.arguments (a fresh list of bindings) once per argument, and
# checks the schema for out= arguments: these kernels read the defaults once, a fraction of its host time per call
# (docs/tuning.md). (The same private torch hooks as register_autograd's own kernel.)
def _below_autograd(op, keyset, args):
    with torch._C._AutoDispatchBelowAutograd():
        return op.redispatch(keyset & torch._C._after_autograd_keyset, *args)


def _register_autograd(op, function):
    """op's Autograd kernel: function (an autograd.Function taking (keyset, *args)) where a tensor argument requires
    grad under grad mode, else op's next kernel."""
    assert not any(a.kwarg_only for a in op._schema.arguments), f"{op} takes its arguments positionally"

    def kernel(keyset, *args):
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            return function.apply(keyset, *args)
        return _below_autograd(op, keyset, args)
    _lib.impl(op._schema.name.split("::")[1], kernel, "Autograd", with_keyset=True)


_lib = torch.library.Library("fa2", "FRAGMENT")  # (kept with the module: its registrations live as long as it does)
_FWD = torch.ops.fa2.fwd.default
_FWD_DEFAULTS = tuple(a.default_value for a in _FWD._schema.arguments)
_DROPOUT_P, _RNG_STATE = (next(i for i, a in enumerate(_FWD._schema.arguments) if a.name == name)
                          for name in ("dropout_p", "rng_state"))


class _FwdFunction(torch.autograd.Function):
    # (apply's first input is the dispatch keyset: ctx.needs_input_grad[i + 1] is argument i's; _backward reads none)
    @staticmethod
    def forward(ctx, keyset, *args):
        ctx.num_args = len(args)
        # dropout without rng_state (a direct fa2.fwd call): the state drawn here, so that the backward replays it
        if len(args) > _DROPOUT_P and args[_DROPOUT_P] > 0 and (len(args) <= _RNG_STATE or args[_RNG_STATE] is None):
            args = args[:_DROPOUT_P + 1] + (draw_rng_state(args[0].device),) + args[_RNG_STATE + 1:]
        output = _below_autograd(_FWD, keyset, args)
        # (the dispatcher passes fewer arguments when the trailing ones are their defaults)
        _setup_context(ctx, args + _FWD_DEFAULTS[len(args):], output)
        return output

    @staticmethod
    def backward(ctx, dout, dlse):
        return (None, *_backward(ctx, dout, dlse)[:ctx.num_args])


_register_autograd(_FWD, _FwdFunction)


# fa2::bwd has no derivative: differentiating fa2's gradients again (create_graph=True, then a second grad: gradient
# penalties, Hessian-vector products) must fail loudly, not give zeros (without an autograd kernel it would be
# treated as a constant).
class _BwdFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, keyset, *args):
        return _below_autograd(torch.ops.fa2.bwd.default, keyset, args)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("fa2: double backward (a gradient of fa2's gradients: create_graph=True then another "
                           "grad, gradient penalties, Hessians) is not supported; fa2's backward has no derivative")


_register_autograd(torch.ops.fa2.bwd.default, _BwdFunction)


def refuse_unsupported_autodiff(*tensors) -> None:
    """Raise for the autodiff modes fa2 has no formula for, instead of a silently zero or missing result: forward mode
    (torch.autograd.forward_ad dual tensors, torch.func.jvp / jacfwd) and torch.func's gradient transforms (grad,
    vjp, jacrev, hessian: they cannot run fa2's registered backward). Reverse mode (backward(), torch.autograd.grad)
    and torch.func.vmap work. (Skipped while Dynamo traces: it cannot follow the functorch queries.)"""
    if torch.compiler.is_compiling():
        return
    if forward_ad._current_level >= 0 and any(
            t is not None and forward_ad.unpack_dual(t).tangent is not None for t in tensors):
        raise NotImplementedError("fa2: forward-mode AD (torch.func.jvp / jacfwd, torch.autograd.forward_ad) is not "
                                  "supported: fa2 has no forward derivative; use reverse mode (.backward(), "
                                  "torch.autograd.grad)")
    interpreter = torch._C._functorch.peek_interpreter_stack()
    if interpreter is not None and interpreter.key() == torch._C._functorch.TransformType.Grad:
        raise NotImplementedError("fa2: torch.func.grad / vjp / jacrev / hessian are not supported (fa2's backward "
                                  "is a registered op, which these transforms cannot run); use .backward() or "
                                  "torch.autograd.grad")


# ---- attention = fwd(...)[0], differentiable through fwd's autograd ----------------------------------------

@torch.library.impl("fa2::attention", "CompositeImplicitAutograd")
def _attention(q, k, v, attn_bias=None, scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
               dropout_p=0.0, sinks=None):
    refuse_unsupported_autodiff(q, k, v, attn_bias, sinks)
    # dropout: a fresh (seed, offset) from torch's default generator of q's device (fa2/_rng.py), saved by fwd's
    # autograd for the backward
    rng_state = draw_rng_state(q.device) if dropout_p > 0 else None
    return torch.ops.fa2.fwd(q, k, v, attn_bias, scale, causal, window_left, window_right, softcap, dropout_p,
                             rng_state, sinks)[0]
