"""PyTorch's own SDPA on fa2: ``fa2.enable_sdpa_backend()``, ``fa2.disable_sdpa_backend()``, ``with fa2.sdpa_backend():``.

While enabled, the calls of ``torch.nn.functional.scaled_dot_product_attention`` that take PyTorch's flash-attention
path on CUDA (fp16/bf16, no mask) run fa2's kernels, forward and backward; every other call keeps PyTorch's kernels.
The hook is torch's own: ``torch.nn.attention``'s flash-attention implementation registry (torch >= 2.10; the one its
FlashAttention-4 integration uses), which activates an implementation by registering its kernels for the flash
operators (``aten::_scaled_dot_product_flash_attention`` and its backward) at the CUDA dispatch key. So whatever
reaches those operators runs fa2: F.scaled_dot_product_attention, nn.MultiheadAttention and nn.Transformer's fast
paths, Hugging Face's "sdpa" models (when their mask is None), torch.compile'd graphs (Inductor calls the operator),
and ``torch.distributed.tensor.experimental.context_parallel``'s ring attention, which calls the operator per chunk
and merges the chunks with its log-sum-exp (fa2's is the same natural-log LSE, (B, H, S) float32).

Semantics are the operators' own, which fa2 matches: q/k/v (B, H, S, D), GQA (fewer K/V heads), ``scale`` (None:
D ** -0.5), ``is_causal`` aligned bottom-right as PyTorch's flash kernel; F.scaled_dot_product_attention sends a causal
call here only with as many queries as keys, where that is its top-left ``is_causal``. Outputs and gradients are laid
out as the operators' meta kernels say (``empty_like`` of the input), so compiled graphs' stride checks hold.
Calls fa2 cannot run (dropout: the operator's backward replays PyTorch's own philox mask from the seed and offset its
forward returned, which fa2's generator does not reproduce; the debug mask; a device fa2 has no kernels for) go to the
kernel that was registered before, which ``torch.library.get_kernel`` keeps.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from ._ops_impl import deterministic_enabled

__all__ = ["enable_sdpa_backend", "disable_sdpa_backend", "sdpa_backend", "IMPL_NAME"]

IMPL_NAME = "fa2"  # the name in torch.nn.attention.list_flash_attention_impls()

_FORWARD = "_scaled_dot_product_flash_attention"
_BACKWARD = "_scaled_dot_product_flash_attention_backward"
_FA2_DTYPES = {"cuda": (torch.float16, torch.bfloat16),
               "cpu": (torch.float16, torch.bfloat16, torch.float32, torch.float64)}


def _registry():
    """torch.nn.attention (its flash-attention registry), or a RuntimeError saying the installed torch lacks it."""
    import torch.nn.attention as attention
    if not all(hasattr(attention, f) for f in ("register_flash_attention_impl", "activate_flash_attention_impl",
                                               "current_flash_attention_impl", "list_flash_attention_impls")):
        raise RuntimeError(
            f"fa2.enable_sdpa_backend: torch {torch.__version__} has no flash-attention implementation registry "
            "(torch.nn.attention.register_flash_attention_impl / activate_flash_attention_impl, torch >= 2.10); "
            "upgrade torch, or call fa2.sdpa / fa2.attention directly")
    return attention


# ---- the kernels registered for the flash operators ------------------------------------------------------------

def _runs_on_fa2(query: torch.Tensor, dropout_p: float) -> bool:
    """Whether fa2 takes this call; the forward and the backward of one call decide alike (the backward falls back
    exactly when its forward did, so PyTorch's dropout replays PyTorch's own random mask)."""
    device = query.device.type
    return (dropout_p == 0.0 and query.dtype in _FA2_DTYPES.get(device, ()) and query.dim() == 4
            and query.shape[-1] <= 256
            and torch._C._dispatch_has_kernel_for_dispatch_key("fa2::fwd", device.upper()))


def _laid_out_like(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """t in the memory order of torch.empty_like(ref): what the operator's meta kernel promises (compiled graphs check
    it, size-1 dims aside). fa2's results have it already when ref is a (B, H, S, D) view of a (B, S, H, D) tensor,
    the usual case; otherwise a copy."""
    expected = torch.empty_like(ref, device="meta").stride()  # (torch's own rule; a meta tensor allocates nothing)
    if all(a == b for a, b, size in zip(t.stride(), expected, t.shape) if size != 1):
        return t
    return torch.empty_like(ref).copy_(t)


@functools.cache
def _rng_outputs():
    """(shape, dtype) of the forward's philox seed and offset outputs, as this torch's meta kernel has them (they
    changed across torch versions; compiled graphs check them)."""
    meta = torch.empty(1, 1, 1, 8, device="meta", dtype=torch.float16)
    outputs = torch.ops.aten._scaled_dot_product_flash_attention.default(meta, meta, meta)
    return tuple((tuple(t.shape), t.dtype) for t in outputs[6:8])


def _flash_forward(original, keyset, query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                   *, scale=None):
    if return_debug_mask or not _runs_on_fa2(query, dropout_p):
        return original.call_boxed(keyset, query, key, value, dropout_p, is_causal, return_debug_mask, scale=scale)
    # fa2 reads (B, S, H, D): the transposed views, no copies
    out, lse = torch.ops.fa2.fwd(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), None, scale,
                                 bool(is_causal), -1, -1, 0.0)
    device = query.device
    # (no dropout: the random-number state the operator returns is unused; shapes and dtypes as its meta kernel's)
    philox_seed, philox_offset = (torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in _rng_outputs())
    debug_attn_mask = torch.empty(0, dtype=query.dtype, device=device)
    return (_laid_out_like(out.transpose(1, 2), query), lse, None, None, query.shape[2], key.shape[2],
            philox_seed, philox_offset, debug_attn_mask)


def _flash_backward(original, keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                    max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    if not _runs_on_fa2(query, dropout_p):
        return original.call_boxed(keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                                   max_k, dropout_p, is_causal, philox_seed, philox_offset, scale=scale)
    dout = grad_out.transpose(1, 2)
    if dout.stride(-1) != 1:  # (the kernels read rows of dout; autograd may hand an expanded or permuted gradient)
        dout = dout.contiguous()
    # out / logsumexp may be another kernel's (context parallel merges chunks into them): the same definitions
    dq, dk, dv, _ = torch.ops.fa2.bwd(dout, query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                      out.transpose(1, 2), logsumexp, None, scale, bool(is_causal), -1, -1, 0.0,
                                      False, deterministic_enabled())
    return (_laid_out_like(dq.transpose(1, 2), query), _laid_out_like(dk.transpose(1, 2), key),
            _laid_out_like(dv.transpose(1, 2), value))


class _Registration:
    """The registry's FlashAttentionHandle: fa2's kernels for the flash operators at one dispatch key, and the
    removal that gives the operators back the kernels registered before."""

    def __init__(self, dispatch_key: str = "CUDA"):
        self.dispatch_key = dispatch_key
        self.library = torch.library.Library("aten", "IMPL")
        for name, kernel in ((_FORWARD, _flash_forward), (_BACKWARD, _flash_backward)):
            original = _kernel_before(f"aten::{name}", dispatch_key)
            self.library.impl(name, _bind(kernel, original), dispatch_key, with_keyset=True)

    def remove(self) -> None:
        if self.library is not None:
            destroy = getattr(self.library, "_destroy", None)
            if destroy is not None:
                destroy()
            self.library = None  # (a torch without _destroy drops the registrations with the library object)


def _bind(kernel, original):
    def registered(keyset, *args, **kwargs):
        return kernel(original, keyset, *args, **kwargs)
    return registered


class _NoKernelBefore:
    def __init__(self, op: str, dispatch_key: str):
        self.op, self.dispatch_key = op, dispatch_key

    def call_boxed(self, keyset, *args, **kwargs):
        raise NotImplementedError(f"fa2's SDPA backend cannot run this call of {self.op} (dropout, the debug mask, or "
                                  f"inputs fa2 has no kernel for) and this torch has no {self.dispatch_key} kernel "
                                  "for it to fall back on")


def _kernel_before(op: str, dispatch_key: str):
    """The operator's kernel at dispatch_key as it is now (before fa2 registers its own), for the calls fa2 leaves."""
    get_kernel = getattr(torch.library, "get_kernel", None)
    if get_kernel is None or not torch._C._dispatch_has_kernel_for_dispatch_key(op, dispatch_key):
        return _NoKernelBefore(op, dispatch_key)
    return get_kernel(op, dispatch_key)


# ---- the public switches ------------------------------------------------------------------------------------------

def _register_with_torch(attention) -> None:
    if IMPL_NAME not in attention.list_flash_attention_impls():
        attention.register_flash_attention_impl(IMPL_NAME, register_fn=_Registration)


def enable_sdpa_backend() -> None:
    """Run PyTorch's flash-attention SDPA path (forward and backward) on fa2's kernels, until
    :func:`disable_sdpa_backend`. Idempotent. Raises RuntimeError when the installed torch has no
    flash-attention implementation registry."""
    attention = _registry()
    _register_with_torch(attention)
    if attention.current_flash_attention_impl() != IMPL_NAME:
        attention.activate_flash_attention_impl(IMPL_NAME)


def disable_sdpa_backend() -> None:
    """Give PyTorch's flash-attention SDPA path back its own kernels. Does nothing when fa2's backend is not on."""
    attention = _registry()
    if attention.current_flash_attention_impl() != IMPL_NAME:
        return
    restore = getattr(attention, "restore_flash_attention_impl", None)
    if restore is not None:
        restore()
        return
    # The registry's first version (torch 2.10) has no restore: remove fa2's registrations and its record of them.
    from torch.nn.attention import _registry as registry
    handle = registry._FLASH_ATTENTION_HANDLES.pop(IMPL_NAME, None)
    if handle is not None:
        handle.remove()
    registry._FLASH_ATTENTION_ACTIVE = None


@contextlib.contextmanager
def sdpa_backend():
    """``with fa2.sdpa_backend():`` enables fa2's SDPA backend inside the block and puts back what was active
    before (nothing, fa2, or another registered implementation) when it ends."""
    attention = _registry()
    before = attention.current_flash_attention_impl()
    enable_sdpa_backend()
    try:
        yield
    finally:
        if before is None:
            disable_sdpa_backend()
        elif before != IMPL_NAME:
            attention.activate_flash_attention_impl(before)
