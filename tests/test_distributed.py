"""A DDP training step of a small model compiled with backend="fa2": two processes (NCCL on two GPUs, or gloo on
the CPU), every attention site rewritten in each rank, gradients all-reduced and equal to the single-process
gradient of the mean loss over both ranks' batches."""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch(rank: int, device):
    import zoo
    g = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(0, zoo.VOCAB, (zoo.BATCH, 24), generator=g).to(device)
    return {"input_ids": ids, "labels": ids}


def _worker(rank: int, port: int, kind: str, out_dir: str):
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    import zoo
    from torch.nn.parallel import DistributedDataParallel as DDP

    import fa2.backend  # noqa: F401  (registers the "fa2" backend)
    from fa2.inductor import recording
    from fa2.inductor._compat import without_aot_cache

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = kind == "nccl"
    dist.init_process_group(kind, rank=rank, world_size=WORLD)
    try:
        device = torch.device(f"cuda:{rank}" if cuda else "cpu")
        if cuda:
            torch.cuda.set_device(device)
        dtype = torch.bfloat16 if cuda else torch.float32
        model = zoo.build("llama", device, dtype).train()  # same seed: the same weights on every rank
        ddp = DDP(model, device_ids=[rank] if cuda else None)
        compiled = torch.compile(ddp, backend="fa2")
        with recording() as records, without_aot_cache():
            compiled(**_batch(rank, device)).loss.backward()
        train = [r for r in records if r.graph == "training"]
        torch.save({"sites": len(train), "rewritten": sum(r.rewritten for r in train),
                    "fa2_bwd": sum(g["fa2_bwd"] for g in records.graphs),
                    "grads": {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()
                              if p.grad is not None}},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gloo", "nccl"])
def test_ddp_training_step_compiled_with_fa2(kind, tmp_path):
    import zoo
    if kind == "nccl" and torch.cuda.device_count() < WORLD:
        pytest.skip(f"needs {WORLD} CUDA GPUs")
    if not dist.is_available() or (kind == "gloo" and not dist.is_gloo_available()):
        pytest.skip(f"torch.distributed with {kind} is not available")
    mp.spawn(_worker, args=(_free_port(), kind, str(tmp_path)), nprocs=WORLD, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for r, res in enumerate(results):
        assert res["sites"] == zoo.ZOO_BY_NAME["llama"].sites == res["rewritten"], (r, res["sites"], res["rewritten"])
        assert res["fa2_bwd"] == res["sites"], f"rank {r}: the backward must use fa2.bwd"
    grads = [res["grads"] for res in results]
    assert set(grads[0]) == set(grads[1]) and grads[0]
    for name in grads[0]:  # all-reduced: every rank holds the same gradient
        assert torch.equal(grads[0][name], grads[1][name]), name

    # single process, eager attention, fp32: the gradient of the mean of both ranks' losses (what DDP averages)
    model = zoo.build("llama", "cpu", torch.float32).train()
    loss = sum(model(**_batch(r, "cpu")).loss for r in range(WORLD)) / WORLD
    loss.backward()
    tol = 1e-4 if kind == "gloo" else 3e-2  # bf16 on the GPUs
    for name, p in model.named_parameters():
        want, got = p.grad, grads[0][name]
        err = ((got - want).norm() / want.norm().clamp_min(1e-12)).item()
        assert err < tol, f"{name}: relative error {err:.2e} against the single-process gradient"
