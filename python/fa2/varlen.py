"""Variable-length (packed) attention: the public ``fa2.varlen_attention``, and the Python-side registrations of
``fa2::varlen_fwd`` / ``fa2::varlen_bwd`` (declared in cpp/ops.cpp): fake kernels and autograd.

Semantics (docs/design.md, Variable length): q (total_q, nheads, headdim), k / v (total_k, nheads_k, headdim);
sequence b is rows cu_seqlens[b]:cu_seqlens[b+1]; causal and windows align bottom-right per sequence.
"""
from __future__ import annotations

import torch

from ._rng import draw_rng_state
from ._ops_impl import _check_devices, _grad_like, deterministic_enabled, refuse_unsupported_autodiff

_VARLEN_FWD = torch.ops.fa2.varlen_fwd.default
_VARLEN_BWD = torch.ops.fa2.varlen_bwd.default


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *,
                     seqused_k: torch.Tensor | None = None, scale: float | None = None, causal: bool = False,
                     window_left: int = -1, window_right: int = -1, softcap: float = 0.0, dropout_p: float = 0.0,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Exact attention over packed sequences, as flash-attn's ``flash_attn_varlen_func``.

    q (total_q, nheads, headdim), k / v (total_k, nheads_k, headdim); ``cu_seqlens_q`` / ``cu_seqlens_k`` int32
    (batch + 1,), starting at 0, non-decreasing: sequence b is rows ``cu_seqlens[b]:cu_seqlens[b+1]``.
    ``max_seqlen_q`` / ``max_seqlen_k``: Python ints (or SymInts) at least the longest sequence's length (no host
    sync is needed to size the work). ``seqused_k`` (int32 (batch,)): only the first ``seqused_k[b]`` keys of sequence
    b are used. Causal and windows align bottom-right per sequence (over the keys used). GQA, softcap, headdim 1..256.
    Returns out (total_q, nheads, headdim); differentiable in q, k, v and ``sinks`` ((nheads,): each head's extra
    logit in the softmax denominator, as fa2.attention's). ``dropout_p``: as fa2.attention's (sequence b takes batch
    coordinate b in the mask). ``torch.ops.fa2.varlen_fwd`` also returns lse (nheads, total_q), float32 (including
    the sink), +inf for a row that sees no key."""
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, torch.Tensor):
            raise TypeError(f"fa2.varlen_attention: {name} must be a Python int (or SymInt), got a tensor; "
                            "compute it once on the host (e.g. int(lengths.max())), as flash-attn's varlen API "
                            "takes it")
    refuse_unsupported_autodiff(q, k, v, sinks)
    rng_state = draw_rng_state(q.device) if dropout_p > 0 else None  # (as fa2.attention's)
    return torch.ops.fa2.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    seqused_k=seqused_k, scale=scale, causal=causal, window_left=window_left,
                                    window_right=window_right, softcap=softcap, dropout_p=dropout_p, sinks=sinks,
                                    rng_state=rng_state)[0]


# ---- fake kernels: shapes from the inputs alone (SymInt-safe) ----------------------------------------------------

def _check_varlen_ranks(q, k, v):
    # Only what the fake kernels need to compute shapes; every other check runs in the real kernels' shared C++
    # checks (cpp/checks.cpp, check_varlen_fwd_inputs), with these same messages.
    for name, t, dims in (("q", q, "(total_q, nheads, headdim)"), ("k", k, "(total_k, nheads_k, headdim)"),
                          ("v", v, "(total_k, nheads_k, headdim)")):
        if t.dim() != 3:
            raise ValueError(f"fa2.varlen: {name} must have 3 dims {dims}, got {t.dim()} dims with shape "
                             f"{list(t.shape)}")


@torch.library.register_fake("fa2::varlen_fwd")
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, seqused_k=None,
                     scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0, dropout_p=0.0,
                     sinks=None, rng_state=None):
    _check_varlen_ranks(q, k, v)
    _check_devices(q, "fa2.varlen", k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                   seqused_k=seqused_k, sinks=sinks, rng_state=rng_state)
    total_q, nheads, _ = q.shape
    out = q.new_empty((total_q, nheads, v.shape[-1]))
    lse = q.new_empty((nheads, total_q), dtype=torch.float32)
    return out, lse


def _packed_grad_like(t):
    # the padded ops' gradient layout rule (empty_grad_like, cpp/checks.cpp) on the packed tensor seen as batch 1
    return _grad_like(t.unsqueeze(0)).squeeze(0)


@torch.library.register_fake("fa2::varlen_bwd")
def _varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     seqused_k=None, scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                     dropout_p=0.0, sinks=None, deterministic=False, rng_state=None):
    _check_varlen_ranks(q, k, v)
    _check_devices(q, "fa2.varlen_bwd", dout=dout, k=k, v=v, out=out, lse=lse, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, sinks=sinks, rng_state=rng_state)
    dsinks = q.new_empty((0,)) if sinks is None else sinks.new_empty(sinks.shape)
    return _packed_grad_like(q), _packed_grad_like(k), _packed_grad_like(v), dsinks


# ---- autograd ------------------------------------------------------------------------------------------------------
# torch.library.register_autograd refuses ops with keyword-only Tensor arguments (seqused_k, sinks), so, as for the
# padded ops (_ops_impl._register_autograd), the Autograd kernels are registered directly. The dispatcher hands a
# Python kernel the keyword-only arguments as kwargs (those left at their defaults may be missing); the tensors among
# them (seqused_k, sinks, rng_state) go to the autograd.Function as inputs (sinks gets a gradient).

_lib = torch.library.Library("fa2", "FRAGMENT")  # (kept with the module: its registrations live as long as it does)


def _keyword_defaults(op):
    return {a.name: a.default_value for a in op._schema.arguments if a.kwarg_only}


_FWD_KEYWORDS = _keyword_defaults(_VARLEN_FWD)
_BWD_KEYWORDS = _keyword_defaults(_VARLEN_BWD)
_FWD_NUM_POSITIONAL = sum(not a.kwarg_only for a in _VARLEN_FWD._schema.arguments)


class _VarlenFwdFunction(torch.autograd.Function):
    # apply(keyset, flags, *positional, seqused_k, sinks, rng_state): flags are the non-tensor keyword arguments
    @staticmethod
    def forward(ctx, keyset, flags, *args):
        positional, (seqused_k, sinks, rng_state) = args[:-3], args[-3:]
        out, lse = _below_autograd_kw(_VARLEN_FWD, keyset, positional,
                                      dict(flags, seqused_k=seqused_k, sinks=sinks, rng_state=rng_state))
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = positional
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, sinks, rng_state)
        ctx.max_seqlens = (max_seqlen_q, max_seqlen_k)
        ctx.flags = flags
        ctx.deterministic = deterministic_enabled()  # the forward's thread's setting (see _ops_impl._state)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, sinks, rng_state = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        elif dout.stride(-1) != 1:
            # autograd hands e.g. expanded ones (all strides 0) for out.sum(); the kernels read rows of dout directly
            dout = dout.contiguous()
        dq, dk, dv, dsinks = torch.ops.fa2.varlen_bwd(
            dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.max_seqlens, seqused_k=seqused_k, sinks=sinks,
            deterministic=ctx.deterministic or torch.are_deterministic_algorithms_enabled(), rng_state=rng_state,
            **ctx.flags)
        num_positional_rest = _FWD_NUM_POSITIONAL - 3  # cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
        return ((None, None, dq, dk, dv) + (None,) * num_positional_rest
                + (None, dsinks if sinks is not None else None, None))


def _below_autograd_kw(op, keyset, args, kwargs):
    with torch._C._AutoDispatchBelowAutograd():
        return op.redispatch(keyset & torch._C._after_autograd_keyset, *args, **kwargs)


def _varlen_fwd_autograd(keyset, *args, **kwargs):
    keywords = dict(_FWD_KEYWORDS, **kwargs)
    tensors = [keywords.pop(name) for name in ("seqused_k", "sinks", "rng_state")]
    if torch.is_grad_enabled() and torch._C._any_requires_grad(*args, *tensors):
        if keywords["dropout_p"] > 0 and tensors[2] is None:  # (the state the backward replays, drawn here)
            tensors[2] = draw_rng_state(args[0].device)
        return _VarlenFwdFunction.apply(keyset, keywords, *args, *tensors)
    return _below_autograd_kw(_VARLEN_FWD, keyset, args, kwargs)


# fa2::varlen_bwd has no derivative: a gradient of its gradients (create_graph=True, then another grad) must fail
# loudly, not come back as zeros.
class _VarlenBwdFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, keyset, kwargs, *args):
        return _below_autograd_kw(_VARLEN_BWD, keyset, args, kwargs)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("fa2: double backward (a gradient of fa2's gradients: create_graph=True then another "
                           "grad, gradient penalties, Hessians) is not supported; fa2.varlen_bwd has no derivative")


def _varlen_bwd_autograd(keyset, *args, **kwargs):
    if torch.is_grad_enabled() and torch._C._any_requires_grad(*args, *kwargs.values()):
        return _VarlenBwdFunction.apply(keyset, kwargs, *args)
    return _below_autograd_kw(_VARLEN_BWD, keyset, args, kwargs)


_lib.impl("varlen_fwd", _varlen_fwd_autograd, "Autograd", with_keyset=True)
_lib.impl("varlen_bwd", _varlen_bwd_autograd, "Autograd", with_keyset=True)
