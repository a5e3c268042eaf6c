#!/usr/bin/env python
"""End-to-end benchmark: a GPT-style (Llama-architecture) model trained and run for inference three ways.

Ways (``--ways``; default: the first four), each a Hugging Face model built from a LlamaConfig with random weights:
  eager+inductor   attn_implementation="eager" (matmul -> softmax -> matmul), torch.compile(model)
  eager+fa2        the same unmodified eager model, torch.compile(model, backend="fa2") (``import fa2`` registers
                   the backend, which rewrites the attention sites into fa2 ops in forward and backward)
  sdpa+inductor    attn_implementation="sdpa" (F.scaled_dot_product_attention), torch.compile(model)
  hf-fa2+inductor  attn_implementation="fa2" (fa2.hf: the fa2 op called by transformers), torch.compile(model)
  hf-fa2-padvarlen+inductor  as hf-fa2+inductor with fa2.hf.set_padded_batches("varlen"): padded batches
                   (prefill with ``--pad``) through varlen rather than the key-row padding mask; only when named
  sdpa+inductor+fa2-sdpa  as sdpa+inductor, inside ``fa2.sdpa_backend()`` (PyTorch's flash SDPA path on fa2); only
                   when named in --ways. (Under torch.compile transformers hands SDPA a materialized mask, which takes
                   PyTorch's memory-efficient or cuDNN kernel, not the flash path: the attention ops column shows it)

Modes (``--modes``):
  train     one training step = forward + loss + backward + fused AdamW step; bf16 weights; random token ids
  prefill   forward only, no grad, no KV cache, logits of the last position only
            (``--pad F``: a left-padded batch, row b with round(F * S * b / (B - 1)) padding tokens, passed as the
            attention_mask; tokens/s still counts every position, real_tokens_per_s only the unpadded ones)
  generate  greedy generation (batch ``--gen-batch``, default 1): Hugging Face generate with a static KV cache, its
            decoding step compiled with the way's backend (the prompt's prefill inside generate runs uncompiled, as
            transformers does); ``--gen-cache dynamic``: the dynamic cache instead, generate uncompiled (transformers
            compiles only static-cache decoding), the attention as the way's attn_implementation calls it
  packed    padding-free training: one training step (as train) on mixed documents filling SEQLEN x BATCH tokens
            (lengths log-uniform in 64..2048, seeded; the last cut to fit), laid out per ``--packed-ways``:
              fa2-packed         attn_implementation="fa2", the documents end to end in one row with
                                 DataCollatorWithFlattening's position ids + cu_seq_lens_q/k, max_length_q/k
                                 (return_flash_attn_kwargs=True): fa2.varlen_attention
              fa2-packed-posids  the same with the position ids alone (the default collator): fa2 derives the
                                 sequences from them once per forward pass
              fa2-padded         attn_implementation="fa2", one document per row, right-padded to the longest:
                                 fa2's key-row padding mask (the default padded path)
              fa2-padded-varlen  the same batch through fa2.hf.set_padded_batches("varlen")
              sdpa-padded        attn_implementation="sdpa" on the padded batch (flash-attn's own packed way,
                                 "flash_attention_2", is not installable here)
            all torch.compile(model) with Inductor. tokens/s counts the documents' tokens (not padding); model
            TFLOP/s counts attention over the real lengths (sum of len^2 / total in place of S); the first loss of
            every way is the same documents' loss (a check that the layouts agree)

Model (default, ~1.1B parameters, TinyLlama's shape): hidden 2048, 22 layers, 32 heads, 4 KV heads (GQA),
intermediate 5632, vocab 32000, untied embeddings. Shapes (``--shapes SEQLENxBATCH``): 2048x4 and 8192x1.
``--quick``: a tiny model (2 layers, hidden 256) for a smoke run; with ``--device cpu`` also tiny shapes.

Reported per case: tokens/s (median step), model TFLOP/s and MFU (FLOP counts below), peak memory, the first
call's time (compilation), graphs compiled and graph breaks, and which attention kernels ran (profiler op
counts of one extra step). Every failure (OOM, a backend that is missing or raises) is recorded with its reason.

Usage:
  python benchmarks/bench_e2e.py                               # all modes, both shapes (long: ~15 compilations)
  python benchmarks/bench_e2e.py --modes train --time-budget 270
  python benchmarks/bench_e2e.py --device cpu --quick          # smoke test
  python benchmarks/bench_e2e.py --modes packed --shapes 2048x4  # padding-free training (issue 47)
  python benchmarks/bench_e2e.py --modes prefill --pad 0.5 --shapes 2048x4 \
      --ways hf-fa2+inductor,hf-fa2-padvarlen+inductor          # the two padded paths
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import re
import signal
import statistics
import sys
import time

import torch
import torch._dynamo
import torch._dynamo.utils

import bench_common
from bench_common import import_fa2, is_oom, proc_status_kib, short_error, sync

HERE = os.path.dirname(os.path.abspath(__file__))

WAYS = {  # name: (attn_implementation, torch.compile backend)
    "eager+inductor": ("eager", "inductor"),
    "eager+fa2": ("eager", "fa2"),
    "sdpa+inductor": ("sdpa", "inductor"),
    "hf-fa2+inductor": ("fa2", "inductor"),
    "sdpa+inductor+fa2-sdpa": ("sdpa", "inductor"),
    "hf-fa2-padvarlen+inductor": ("fa2", "inductor"),
}
SDPA_ON_FA2_WAYS = {"sdpa+inductor+fa2-sdpa"}  # run inside fa2.sdpa_backend()
PADDED_VARLEN_WAYS = {"hf-fa2-padvarlen+inductor"}  # run with fa2.hf.set_padded_batches("varlen")
PACKED_WAYS = {  # mode packed: name -> (attn_implementation, batch layout, fa2.hf padded path)
    "fa2-packed": ("fa2", "packed", "key_mask"),
    "fa2-packed-posids": ("fa2", "packed-posids", "key_mask"),
    "fa2-padded": ("fa2", "padded", "key_mask"),
    "fa2-padded-varlen": ("fa2", "padded", "varlen"),
    "sdpa-padded": ("sdpa", "padded", "key_mask"),
}
DEFAULT_WAYS = ("eager+inductor", "eager+fa2", "sdpa+inductor", "hf-fa2+inductor")  # the comparison the README quotes
MODES = ("train", "prefill", "generate", "packed")
DEFAULT_MODES = ("train", "prefill", "generate")
MODEL_FULL = dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                  intermediate_size=5632, vocab_size=32000)
MODEL_QUICK = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=688, vocab_size=32000)
PROFILES = {  # (device, quick) -> defaults
    ("cuda", False): dict(shapes="2048x4,8192x1", steps=10, warmup=3, gen_prompt=512, gen_tokens=128),
    ("cuda", True): dict(shapes="2048x4,8192x1", steps=5, warmup=2, gen_prompt=128, gen_tokens=32),
    ("cpu", False): dict(shapes="512x2,1024x1", steps=3, warmup=1, gen_prompt=64, gen_tokens=16),
    ("cpu", True): dict(shapes="128x2,256x1", steps=3, warmup=1, gen_prompt=32, gen_tokens=8),
}
# Operators whose calls show which attention kernel ran (counted with the profiler over one step).
ATTN_OP = re.compile(r"fa2::|scaled_dot_product|flash_attention|efficient_attention|cudnn_attention|flex_attention")


# ---- FLOPs ------------------------------------------------------------------------------------------------

def param_counts(model) -> dict:
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings().weight.numel()
    return {"all": total, "non_embedding": total - embed, "layers": total - embed - head}


def train_flops_per_token(n_params: int, n_layers: int, d_model: int, seqlen: int) -> float:
    """6·N + 12·L·d·S (Kaplan et al. 2020; PaLM appendix B; the FA-2 paper's GPT numbers).
    6·N: every weight does a multiply-add per token in the forward (2 FLOPs) and two in the backward (4).
    12·L·d·S: attention's Q·Kᵀ and P·V, 2·S·d multiply-adds per token per layer in the forward (4·S·d FLOPs),
    x3 for forward + backward; counted over all S keys (not halved for causal), as the FA-2 paper does.
    N here = ALL parameters, input embedding and LM head included, as docs/performance.md's H200 anchors counts them
    (its 450 TFLOP/s at 58.4k tokens/s implies N = 1.10e9); the JSON also has the non-embedding figure."""
    return 6 * n_params + 12 * n_layers * d_model * seqlen


def prefill_flops_per_token(n_layer_params: int, n_layers: int, d_model: int, seqlen: int) -> float:
    """2·N_layers + 4·L·d·S: the forward part of the count above. N_layers = parameters of the decoder layers
    only: the embedding is a lookup, and the LM head runs on one position per sequence (logits_to_keep=1)."""
    return 2 * n_layer_params + 4 * n_layers * d_model * seqlen


# ---- environment, memory, helpers ---------------------------------------------------------------------------

def environment(device) -> dict:
    import transformers
    return bench_common.environment(device, *import_fa2(), transformers=transformers.__version__)


class Memory:
    """CUDA: peak allocated bytes since reset (weights, grads, optimizer state and activations: everything the
    case holds). CPU: resident-set high-water mark since reset minus the RSS at the case's start (coarse)."""

    def __init__(self, device):
        self.device = device
        self.base = proc_status_kib("VmRSS") if device.type == "cpu" else 0

    def reset(self):
        sync(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                self.base = None

    def peak_gib(self):
        sync(self.device)
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**30
        hwm = proc_status_kib("VmHWM")
        return None if hwm is None or self.base is None else max(0, hwm - self.base) / 2**20


def cleanup(device):
    """Between cases: forget compiled code (fresh Dynamo state per case, no recompile limits, no backend
    mixing) and give memory back. The on-disk Inductor caches stay, so an identical graph compiles faster."""
    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def dynamo_stats() -> dict:
    from torch._dynamo.utils import counters
    return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


def attention_ops(fn) -> dict:
    """Which attention operators one call of fn dispatches, with counts (CPU-side profiler: op names only)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key: e.count for e in prof.key_averages() if ATTN_OP.search(e.key)}


# ---- model ------------------------------------------------------------------------------------------------

def build_model(attn: str, model_kwargs: dict, device, max_positions: int):
    from transformers import AutoModelForCausalLM, LlamaConfig
    if attn == "fa2":
        import fa2.hf
        fa2.hf.register()  # attn_implementation="fa2"
    config = LlamaConfig(**model_kwargs, max_position_embeddings=max_positions, tie_word_embeddings=False)
    torch.manual_seed(0)  # the same weights for every way
    with torch.device(device):  # initialize on the device: fast, and no host copy of 1.1B parameters
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.bfloat16)
    return model


def ensure_backend(backend: str):
    """Fail early, with a clear reason, when a torch.compile backend does not exist."""
    if backend == "fa2":
        import fa2  # noqa: F401
        try:
            import fa2.backend  # noqa: F401  (registers the "fa2" torch.compile backend; also an entry point)
        except ImportError:
            pass  # lookup_backend below says what is missing
    try:
        torch._dynamo.lookup_backend(backend)
    except Exception as e:
        raise RuntimeError(f"torch.compile backend {backend!r} is not registered ({short_error(e)})") from None


def compile_model(model, backend: str):
    ensure_backend(backend)
    # Static shapes: each case has one shape; no dynamic-shape kernels in the comparison.
    return torch.compile(model, backend=backend, dynamic=False)


def maybe_explain(model, ids, enabled: bool):
    if not enabled:
        return None
    try:
        import fa2
        return str(fa2.explain(model, ids))[:4000]
    except Exception as e:  # fa2.explain may not exist yet
        return f"unavailable: {short_error(e)}"


# ---- cases ------------------------------------------------------------------------------------------------

def timed(fn, n: int, device) -> list[float]:
    times = []
    for _ in range(n):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def run_train(way, seqlen, batch, args, device, model_kwargs) -> dict:
    attn, backend = WAYS[way]
    mem = Memory(device)
    model = build_model(attn, model_kwargs, device, max(seqlen, 8192))
    gen = torch.Generator(device=device).manual_seed(1)
    ids = torch.randint(0, model_kwargs["vocab_size"], (batch, seqlen), device=device, generator=gen)
    result = measure_training(model, backend, {"input_ids": ids, "labels": ids}, batch * seqlen, seqlen, mem, args,
                              device, model_kwargs)
    result["explain"] = maybe_explain(model, ids, args.explain and backend == "fa2")
    return result


def measure_training(model, backend, inputs, tokens, attention_span, mem, args, device, model_kwargs) -> dict:
    """One compiled training step on inputs (forward + loss + backward + fused AdamW step), timed. tokens: the
    tokens a step trains on (tokens/s); attention_span: the keys per token of the FLOP count (S; for documents of
    lengths l_i, sum(l_i^2) / sum(l_i)); mem: the case's Memory, made before the model."""
    counts = param_counts(model)
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        fused = True
    except Exception:  # fused AdamW missing for this device/dtype: the default implementation
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        fused = False
    cmodel = compile_model(model, backend)
    losses = []

    def step():
        loss = cmodel(**inputs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    t0 = time.perf_counter()
    step()  # compiles forward and backward
    sync(device)
    first_s = time.perf_counter() - t0
    for _ in range(args.warmup - 1):
        step()
    mem.reset()
    times = timed(step, args.steps, device)
    peak = mem.peak_gib()
    stats = dynamo_stats()
    ops = attention_ops(step)
    L, d = model_kwargs["num_hidden_layers"], model_kwargs["hidden_size"]
    step_s = statistics.median(times)
    tokens_per_s = tokens / step_s
    flops_tok = train_flops_per_token(counts["all"], L, d, attention_span)
    tflops = tokens_per_s * flops_tok / 1e12
    return dict(status="ok", step_ms=1e3 * step_s, tokens_per_s=tokens_per_s, flops_per_token=flops_tok,
                tflops=tflops, mfu=tflops / args.peak_tflops,
                tflops_nonembed=tokens_per_s * train_flops_per_token(counts["non_embedding"], L, d,
                                                                      attention_span) / 1e12,
                peak_gib=peak, first_call_s=first_s, fused_adamw=fused, params=counts,
                loss_first=float(losses[0]), loss_last=float(losses[-1]), attention_ops=ops,
                step_times_ms=[1e3 * t for t in times], **stats)


# ---- padding-free training (mode packed) ------------------------------------------------------------------------

def document_lengths(total: int, seed: int = 0, shortest: int = 64, longest: int = 2048) -> list[int]:
    """Mixed documents filling total tokens: lengths log-uniform in [shortest, longest], the last one cut to fit."""
    g = torch.Generator().manual_seed(seed)
    lengths = []
    while sum(lengths) < total:
        u = float(torch.rand((), generator=g))
        length = int(math.exp(math.log(shortest) + u * (math.log(longest) - math.log(shortest))))
        lengths.append(min(length, total - sum(lengths)))
    return lengths


def documents_batch(layout: str, lengths: list[int], vocab: int, device) -> dict:
    """The documents as model inputs. packed / packed-posids: one row end to end with DataCollatorWithFlattening's
    fields (position ids restarting at 0, each document's first label -100; packed adds cu_seq_lens_q/k and
    max_length_q/k); padded: one document per row, right-padded to the longest, padding labelled -100."""
    g = torch.Generator().manual_seed(4)
    docs = [torch.randint(0, vocab, (n,), generator=g) for n in lengths]
    if layout == "padded":
        width = max(lengths)
        ids = torch.zeros(len(docs), width, dtype=torch.long)
        mask = torch.zeros(len(docs), width, dtype=torch.long)
        for row, doc in enumerate(docs):
            ids[row, :len(doc)], mask[row, :len(doc)] = doc, 1
        batch = dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    else:
        ids = torch.cat(docs)[None]
        labels = torch.cat([torch.cat([torch.tensor([-100]), doc[1:]]) for doc in docs])[None]
        batch = dict(input_ids=ids, labels=labels, position_ids=torch.cat([torch.arange(n) for n in lengths])[None])
        if layout == "packed":
            cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            batch.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths), max_length_k=max(lengths))
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def run_packed(way, seqlen, batch, args, device, model_kwargs) -> dict:
    attn, layout, padded_path = PACKED_WAYS[way]
    lengths = document_lengths(seqlen * batch)
    mem = Memory(device)
    model = build_model(attn, model_kwargs, device, max(seqlen, 8192))
    inputs = documents_batch(layout, lengths, model_kwargs["vocab_size"], device)
    with padded_batches(padded_path if attn == "fa2" else None):
        span = sum(n * n for n in lengths) / sum(lengths)
        result = measure_training(model, "inductor", inputs, sum(lengths), span, mem, args, device, model_kwargs)
    slots = inputs["input_ids"].numel()
    return dict(result, documents=len(lengths), longest=max(lengths), token_slots=slots,
                padding_fraction=1 - sum(lengths) / slots)


@contextlib.contextmanager
def padded_batches(path):
    """fa2.hf.set_padded_batches(path) for one case (None: leave it), the default restored after."""
    if path is None:
        yield
        return
    import fa2.hf
    fa2.hf.set_padded_batches(path)
    try:
        yield
    finally:
        fa2.hf.set_padded_batches("key_mask")


def run_prefill(way, seqlen, batch, args, device, model_kwargs) -> dict:
    attn, backend = WAYS[way]
    mem = Memory(device)
    model = build_model(attn, model_kwargs, device, max(seqlen, 8192))
    model.eval()
    counts = param_counts(model)
    cmodel = compile_model(model, backend)
    gen = torch.Generator(device=device).manual_seed(2)
    ids = torch.randint(0, model_kwargs["vocab_size"], (batch, seqlen), device=device, generator=gen)
    mask = left_padding_mask(batch, seqlen, args.pad, device)
    extra = {} if mask is None else {"attention_mask": mask}

    @torch.no_grad()
    def fwd():
        return cmodel(input_ids=ids, use_cache=False, logits_to_keep=1, **extra).logits

    t0 = time.perf_counter()
    logits = fwd()
    sync(device)
    first_s = time.perf_counter() - t0
    if not torch.isfinite(logits).all():
        raise RuntimeError("non-finite logits")
    for _ in range(args.warmup - 1):
        fwd()
    mem.reset()
    times = timed(fwd, args.steps, device)
    peak = mem.peak_gib()
    stats = dynamo_stats()
    ops = attention_ops(fwd)
    L, d = model_kwargs["num_hidden_layers"], model_kwargs["hidden_size"]
    step_s = statistics.median(times)
    tokens_per_s = batch * seqlen / step_s
    flops_tok = prefill_flops_per_token(counts["layers"], L, d, seqlen)
    tflops = tokens_per_s * flops_tok / 1e12
    real = int(mask.sum()) if mask is not None else batch * seqlen
    return dict(status="ok", step_ms=1e3 * step_s, tokens_per_s=tokens_per_s, real_tokens_per_s=real / step_s,
                pad=args.pad, flops_per_token=flops_tok,
                tflops=tflops, mfu=tflops / args.peak_tflops, peak_gib=peak, first_call_s=first_s, params=counts,
                attention_ops=ops, step_times_ms=[1e3 * t for t in times], **stats)


def left_padding_mask(batch: int, seqlen: int, pad: float, device):
    """None without padding; else a (batch, seqlen) int64 attention_mask (1 = token), left-padded: row b starts with
    round(pad * seqlen * b / (batch - 1)) padding positions (row 0 none, the last row pad * seqlen)."""
    if not pad:
        return None
    if not 0 < pad < 1:
        raise ValueError(f"--pad must be in [0, 1), got {pad}")
    mask = torch.ones(batch, seqlen, dtype=torch.long, device=device)
    for b in range(batch):
        mask[b, :round(pad * seqlen * b / max(batch - 1, 1))] = 0
    return mask


def run_generate(way, prompt_len, new_tokens, batch, args, device, model_kwargs) -> dict:
    from transformers.generation import CompileConfig
    attn, backend = WAYS[way]
    mem = Memory(device)
    model = build_model(attn, model_kwargs, device, max(prompt_len + new_tokens, 8192))
    model.eval()
    ensure_backend(backend)
    # transformers compiles the decoding step itself when the KV cache is static; give it the way's backend.
    # The same mode for every way (default None: no CUDA graphs; fa2's backend passes Inductor's modes through).
    cc = CompileConfig(backend=backend, mode=args.gen_mode, dynamic=False, fullgraph=False)
    cc._compile_all_devices = True  # also compile on the CPU (smoke runs)
    gen = torch.Generator(device=device).manual_seed(3)
    prompt = torch.randint(0, model_kwargs["vocab_size"], (batch, prompt_len), device=device, generator=gen)
    cache = dict(cache_implementation="static", compile_config=cc) if args.gen_cache == "static" else {}

    def generate(n):
        # min_new_tokens = n: an EOS from the random model does not end the run early.
        return model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, **cache)

    t0 = time.perf_counter()
    out = generate(new_tokens)  # compiles the decoding step
    sync(device)
    first_s = time.perf_counter() - t0
    if out.shape[1] != prompt_len + new_tokens:
        raise RuntimeError(f"generated {out.shape[1] - prompt_len} tokens, expected {new_tokens}")
    mem.reset()
    t_full = statistics.median(timed(lambda: generate(new_tokens), max(2, args.steps // 3), device))
    t_one = statistics.median(timed(lambda: generate(1), 2, device))  # prompt prefill + first token
    peak = mem.peak_gib()
    stats = dynamo_stats()
    ops = attention_ops(lambda: generate(4))
    decode_s = max(t_full - t_one, 1e-9) / max(1, new_tokens - 1)
    return dict(status="ok", tokens_per_s=batch / decode_s, decode_ms_per_token=1e3 * decode_s, cache=args.gen_cache,
                prefill_plus_first_ms=1e3 * t_one, total_ms=1e3 * t_full, peak_gib=peak, first_call_s=first_s,
                generated=out[0, prompt_len:prompt_len + 16].tolist(), attention_ops=ops, **stats)


def run_case(case, args, device, model_kwargs) -> dict:
    mode, way = case["mode"], case["way"]
    torch._dynamo.utils.counters.clear()
    t0 = time.perf_counter()
    result, err = None, None
    try:
        with sdpa_backend_for(way), padded_batches("varlen" if way in PADDED_VARLEN_WAYS else None):
            if mode == "train":
                result = run_train(way, case["seqlen"], case["batch"], args, device, model_kwargs)
            elif mode == "prefill":
                result = run_prefill(way, case["seqlen"], case["batch"], args, device, model_kwargs)
            elif mode == "packed":
                result = run_packed(way, case["seqlen"], case["batch"], args, device, model_kwargs)
            else:
                result = run_generate(way, case["seqlen"], case["new_tokens"], case["batch"], args, device,
                                      model_kwargs)
    except Exception as e:  # record and go on; leave the except block so the traceback frees its tensors
        err = ("oom" if is_oom(e) else "n/a" if _is_unavailable(e) else "error", short_error(e))
    cleanup(device)
    if err is not None:
        result = dict(status=err[0], reason=err[1])
    return dict(case, **result, case_s=round(time.perf_counter() - t0, 1))


def sdpa_backend_for(way: str):
    """fa2.sdpa_backend() for the ways that run PyTorch's SDPA on fa2, else nothing."""
    if way not in SDPA_ON_FA2_WAYS:
        return contextlib.nullcontext()
    import fa2
    return fa2.sdpa_backend()


def _is_unavailable(e) -> bool:
    text = str(e)
    return isinstance(e, (ImportError, ModuleNotFoundError)) or "not registered" in text \
        or "InvalidBackend" in type(e).__name__ or "Invalid backend" in text


# ---- report -----------------------------------------------------------------------------------------------

def print_table(runs, peak_tflops, file=sys.stdout):
    head = ["mode", "shape", "way", "status", "tokens/s", "TFLOP/s", "MFU", "peak GiB", "1st call s",
            "graphs/breaks", "attention ops (per call)"]
    lines = []
    for r in runs:
        ok = r["status"] == "ok"
        ops = ", ".join(f"{k.split('::')[-1] if 'fa2' not in k else k}x{v}" for k, v in
                        sorted((r.get("attention_ops") or {}).items())) if ok else r.get("reason", "")[:70]
        lines.append([r["mode"], r["shape"], r["way"], r["status"],
                      f"{r['tokens_per_s']:,.0f}" if ok else "-",
                      f"{r['tflops']:.3g}" if ok and "tflops" in r else "-",
                      f"{100 * r['mfu']:.2g}%" if ok and "mfu" in r else "-",
                      f"{r['peak_gib']:.3g}" if ok and r.get("peak_gib") is not None else "-",
                      f"{r['first_call_s']:.0f}" if ok else "-",
                      f"{r.get('graphs', '-')}/{r.get('graph_breaks', '-')}" if ok else "-",
                      ops or "(none: matmul + softmax)"])
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(head)]
    print(f"\nmodel TFLOP/s: train 6N+12·L·d·S per token (N = all params), prefill 2N_layers+4·L·d·S; "
          f"MFU vs {peak_tflops} TFLOP/s; generate: decode tokens/s (every sequence of the batch)", file=file)
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)), file=file)
    for l in lines:
        print("  ".join(c.ljust(w) for c, w in zip(l, widths)), file=file)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="tiny model (2 layers, hidden 256): a smoke run")
    p.add_argument("--ways", default=",".join(DEFAULT_WAYS), help=",".join(WAYS))
    p.add_argument("--modes", default=",".join(DEFAULT_MODES), help=",".join(MODES))
    p.add_argument("--packed-ways", default=",".join(PACKED_WAYS), help="mode packed: " + ",".join(PACKED_WAYS))
    p.add_argument("--shapes", help="SEQLENxBATCH list for train and prefill (default 2048x4,8192x1)")
    p.add_argument("--steps", type=int, help="timed steps per case (median reported)")
    p.add_argument("--warmup", type=int, help="untimed steps, the first of which compiles")
    p.add_argument("--gen-prompt", type=int, help="generation prompt length")
    p.add_argument("--gen-tokens", type=int, help="new tokens per generation")
    p.add_argument("--gen-batch", type=int, default=1, help="generation batch (the prompts: random tokens)")
    p.add_argument("--gen-cache", default="static", choices=("static", "dynamic"),
                   help="generation's KV cache: static (decoding step compiled) or dynamic (uncompiled)")
    p.add_argument("--gen-mode", default=None, help="torch.compile mode of the decoding step, e.g. "
                   "reduce-overhead (CUDA graphs); default none")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="for MFU (H100/H200 dense bf16: 989)")
    p.add_argument("--explain", action="store_true", help="also record fa2.explain(model) for the fa2 way")
    p.add_argument("--pad", type=float, default=0.0,
                   help="prefill: left-pad the batch (fraction of the last row padded; others linearly less)")
    p.add_argument("--time-budget", type=float, default=0,
                   help="seconds; no new case starts after this (0 = no limit)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--tag")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--check", action="store_true",
                   help="exit with status 1 when a case did not run (a smoke test: CI)")
    args = p.parse_args(argv)

    def stop(signum, frame):  # a time limit's SIGTERM (timeout(1)): stop like Ctrl-C, writing what was measured
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available (use --device cpu)")
    device = torch.device(args.device)
    for k, v in PROFILES[(device.type, args.quick)].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    ways, modes = [w.strip() for w in args.ways.split(",")], [m.strip() for m in args.modes.split(",")]
    packed_ways = [w.strip() for w in args.packed_ways.split(",")]
    for name, vals, allowed in (("ways", ways, WAYS), ("modes", modes, MODES),
                                ("packed-ways", packed_ways, PACKED_WAYS)):
        if any(v not in allowed for v in vals):
            p.error(f"--{name}: choose from {list(allowed)}")
    shapes = [tuple(int(x) for x in s.lower().split("x")) for s in args.shapes.split(",")]
    model_kwargs = MODEL_QUICK if args.quick else MODEL_FULL
    env = environment(device)
    hw = env.get("gpu", "cpu").replace("NVIDIA", "").strip().split()[0].lower() if device.type == "cuda" else "cpu"
    tag = args.tag or f"{hw}-{datetime.date.today():%Y%m%d}" + ("-quick" if args.quick else "")
    print(f"fa2 end-to-end benchmark on {env.get('gpu') or env.get('cpu')}: torch {torch.__version__}, "
          f"transformers {env['transformers']}, fa2 {env['fa2'].get('version', env['fa2'].get('error'))}", flush=True)

    # Cases in order of importance (a time budget cuts from the end): training, prefill, generation, packed.
    cases = []
    for mode in MODES:
        if mode not in modes:
            continue
        if mode == "generate":
            for way in ways:
                cases.append(dict(mode=mode, way=way, seqlen=args.gen_prompt, batch=args.gen_batch,
                                  new_tokens=args.gen_tokens,
                                  shape=f"{args.gen_prompt}+{args.gen_tokens}x{args.gen_batch}"))
            continue
        for seqlen, batch in shapes:
            for way in packed_ways if mode == "packed" else ways:
                cases.append(dict(mode=mode, way=way, seqlen=seqlen, batch=batch, shape=f"{seqlen}x{batch}"))

    t_start = time.monotonic()
    runs = []
    try:
        from tqdm import tqdm
        it = tqdm(cases, unit="case", file=sys.stderr, mininterval=1 if sys.stderr.isatty() else 30)
    except ImportError:
        it = cases
    try:
        for case in it:
            if hasattr(it, "set_description"):
                it.set_description(f"{case['mode']} {case['shape']} {case['way']}")
            if args.time_budget and time.monotonic() - t_start > args.time_budget:
                runs.append(dict(case, status="skipped", reason="time budget"))
                continue
            r = run_case(case, args, device, model_kwargs)
            runs.append(r)
            msg = (f"{r['tokens_per_s']:,.0f} tokens/s" if r["status"] == "ok" else f"{r['status']}: "
                   f"{r.get('reason', '')[:120]}")
            print(f"  {case['mode']:8s} {case['shape']:10s} {case['way']:15s} {msg}  ({r['case_s']} s)",
                  file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("interrupted: writing what was measured", file=sys.stderr)

    env["elapsed_s"] = round(time.monotonic() - t_start, 1)
    result = {"kind": "e2e", "tag": tag, "env": env,
              "model": dict(name=("tiny Llama (quick)" if args.quick else "Llama 1.1B"), **model_kwargs,
                            dtype="bfloat16", optimizer="AdamW (fused)"),
              "flops": {"train_per_token": "6*N + 12*L*d*S, N = all parameters",
                        "train_per_token_nonembed": "6*N_nonembedding + 12*L*d*S (tflops_nonembed)",
                        "prefill_per_token": "2*N_layers + 4*L*d*S", "peak_tflops": args.peak_tflops},
              "settings": dict(steps=args.steps, warmup=args.warmup, shapes=args.shapes, pad=args.pad,
                               packed_ways=args.packed_ways, gen_prompt=args.gen_prompt,
                               gen_tokens=args.gen_tokens, gen_batch=args.gen_batch, gen_cache=args.gen_cache,
                               compile="torch.compile(model, backend, dynamic=False)"),
              "runs": runs}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"e2e_{tag}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    pngs = []
    if not args.no_plot:
        try:
            sys.path.insert(0, HERE)
            import plot
            pngs = plot.plot_all(result, args.out)
        except Exception as e:
            print(f"plotting failed: {type(e).__name__}: {e}", file=sys.stderr)
    print_table(runs, args.peak_tflops)
    print(f"\nwrote {path}" + "".join(f"\nwrote {x}" for x in pngs) + f"\n({env['elapsed_s']} s)")
    failed = [f"{r['mode']} {r['shape']} {r['way']}: {r['status']}" for r in runs if r["status"] != "ok"]
    if args.check and (failed or len(runs) < len(cases)):
        sys.exit("bench_e2e --check: " + ("; ".join(failed) or "interrupted"))
    return result


if __name__ == "__main__":
    main()
