"""Dropout's random state: the draw of a call's ``rng_state`` and a Python mirror of the kernels' mask.

``rng_state`` is an int64 ``(2,)`` tensor ``(seed, offset)`` on q's device: the key and the counter base of the
Philox4x32-7 generator the kernels use (cuda/include/fa2/philox.h, which documents the mapping from
(batch, head, query, key) to bits). It is drawn with ``torch.randint`` from torch's default generator of q's device:
that consumes the generator (``torch.manual_seed`` reproduces a call, forward and backward, and consecutive calls get
independent masks), is an ordinary op under ``torch.compile`` (traced into the graph, no graph break) and is safe
during CUDA graph capture (the CUDA generator's capture support), and the kernels read the state from device memory,
so a captured graph replays with fresh draws. The backward gets the same tensor from the forward's autograd context.
"""
from __future__ import annotations

import torch

_INT64_MIN, _INT64_MAX = -2 ** 63, 2 ** 63 - 1


def draw_rng_state(device) -> torch.Tensor:
    """A fresh ``(seed, offset)`` from torch's default generator of ``device``: int64 ``(2,)`` on ``device``."""
    return torch.randint(_INT64_MIN, _INT64_MAX, (2,), dtype=torch.int64, device=device)


# ---- the mirror of cuda/include/fa2/philox.h (tests and reference implementations) ---------------------------------

_M32 = 0xFFFFFFFF
DROPOUT_ROUNDS = 7  # philox.h's kDropoutPhiloxRounds


def _philox4x32(x, y, z, w, k0: int, k1: int, rounds: int = DROPOUT_ROUNDS):
    # int64 tensors holding uint32 values; products of two uint32 wrap in int64 but keep their low 64 bits, which is
    # all mulhi / mullo need.
    for _ in range(rounds):
        p0 = x * 0xD2511F53
        p1 = z * 0xCD9E8D57
        hi0, lo0 = (p0 >> 32) & _M32, p0 & _M32
        hi1, lo1 = (p1 >> 32) & _M32, p1 & _M32
        x, y, z, w = hi1 ^ y ^ k0, lo1, hi0 ^ w ^ k1, lo0
        k0 = (k0 + 0x9E3779B9) & _M32
        k1 = (k1 + 0xBB67AE85) & _M32
    return x, y, z, w


def philox4x32(counter, key, rounds: int = DROPOUT_ROUNDS):
    """Philox4x32 of one counter (four uint32 ints) and key (two): four uint32 ints (the known-answer tests)."""
    x, y, z, w = (torch.tensor([c], dtype=torch.int64) for c in counter)
    return tuple(int(t) for t in _philox4x32(x, y, z, w, key[0] & _M32, key[1] & _M32, rounds))


def keep_threshold(dropout_p: float) -> int:
    """A 16-bit draw is kept iff it is below this: round((1 - p) * 65536)."""
    return int((1.0 - dropout_p) * 65536.0 + 0.5)


def dropout_keep_mask(rng_state: torch.Tensor, batch: int, nheads: int, seqlen_q: int, seqlen_k: int,
                      dropout_p: float, *, batch_index=None) -> torch.Tensor:
    """The kernels' keep mask, bool ``(batch, nheads, seqlen_q, seqlen_k)`` on the CPU, computed as they do.
    ``batch_index``: the batch coordinates of the rows (default 0 .. batch - 1; a varlen sequence ``b`` uses ``b``)."""
    seed, offset = (int(v) & 0xFFFFFFFFFFFFFFFF for v in rng_state.cpu().tolist())
    b = torch.arange(batch, dtype=torch.int64) if batch_index is None else torch.as_tensor(batch_index).long()
    h = torch.arange(nheads, dtype=torch.int64)
    i = torch.arange(seqlen_q, dtype=torch.int64)
    j = torch.arange(seqlen_k, dtype=torch.int64)
    # (batch, nheads, 1, 1): the 64-bit head counter offset + batch * nheads + head, as two uint32 halves
    head = b.view(-1, 1, 1, 1) * nheads + h.view(1, -1, 1, 1)
    counter_lo = (head + (offset & _M32)) & _M32
    carry = (head + (offset & _M32)) >> 32
    counter_hi = ((offset >> 32) + carry) & _M32
    key_group = (j >> 4) * 4 + ((j & 7) >> 1)
    query_group = (i >> 4) * 8 + (i & 7)
    # one Philox call per group (8 weights), then each weight's group gathered
    kg = torch.arange(int(key_group.max()) + 1 if seqlen_k else 0, dtype=torch.int64).view(1, 1, 1, -1)
    qg = torch.arange(int(query_group.max()) + 1 if seqlen_q else 0, dtype=torch.int64).view(1, 1, -1, 1)
    shape = (len(b), nheads, qg.shape[2], kg.shape[3])
    words = _philox4x32(kg.expand(shape), qg.expand(shape), counter_lo.expand(shape), counter_hi.expand(shape),
                           seed & _M32, seed >> 32)
    words = [w[:, :, query_group][:, :, :, key_group] for w in words]  # (batch, nheads, seqlen_q, seqlen_k)
    slot = (((i >> 3) & 1) * 4).view(-1, 1) + (((j >> 3) & 1) * 2 + (j & 1)).view(1, -1)  # (seqlen_q, seqlen_k)
    word = torch.where(slot < 2, words[0], torch.where(slot < 4, words[1], torch.where(slot < 6, words[2], words[3])))
    draw = (word >> (16 * (slot & 1))) & 0xFFFF
    return draw < keep_threshold(dropout_p)
