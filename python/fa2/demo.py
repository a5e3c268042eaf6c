"""``python -m fa2.demo``: an unmodified GPT, compiled with ``backend="fa2"``, against eager.

Builds a small random GPT (a Llama-style model from a transformers config -- GQA, rotary, causal mask made by
transformers -- or, without transformers, a hand-written nanoGPT), shows which attention sites fa2's pass rewrote
(``fa2.explain``), runs forward + backward compiled and eagerly, prints the largest differences and exits non-zero if
they are outside the numerics rule. CUDA in bfloat16 when available, else CPU in float32.
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class NanoGPTBlock(nn.Module):
    """Attention written by hand, as nanoGPT does (no SDPA): the pass has to find it."""

    def __init__(self, dim: int, heads: int, seqlen: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.register_buffer("tril", torch.tril(torch.ones(seqlen, seqlen)).view(1, 1, seqlen, seqlen))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.tril[:, :, :t, :t] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp(self.ln2(x))


class NanoGPT(nn.Module):
    def __init__(self, vocab=256, dim=128, heads=4, layers=2, seqlen=128):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(seqlen, dim)
        self.blocks = nn.ModuleList(NanoGPTBlock(dim, heads, seqlen) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids, labels=None):
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1], device=input_ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()) if labels is not None else None
        return logits, loss


def build(kind: str, layers: int, seqlen: int):
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=seqlen)
        return LlamaForCausalLM._from_config(cfg, attn_implementation="eager")
    return NanoGPT(layers=layers, seqlen=seqlen)


def outputs(result):
    if isinstance(result, tuple):
        return result
    return result.logits, result.loss


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fa2.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["llama", "nanogpt"], default=None,
                        help="llama (needs transformers; the default when it is installed) or nanogpt")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seqlen", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args(argv)
    if args.model is None:
        try:
            import transformers  # noqa: F401
            args.model = "llama"
        except ImportError:
            args.model = "nanogpt"
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)

    import fa2
    import fa2.backend  # noqa: F401  (registers backend="fa2")
    print(f"fa2 {fa2.__version__} | torch {torch.__version__} | {args.model}, {args.layers} layers, "
          f"batch {args.batch} x seqlen {args.seqlen} | {device} {str(dtype).split('.')[-1]}")
    torch.manual_seed(0)
    model = build(args.model, args.layers, args.seqlen).to(device=device, dtype=dtype).train()
    hi = torch.float64 if dtype == torch.float32 else torch.float32
    reference = copy.deepcopy(model).to(hi)
    naive = copy.deepcopy(model)
    ids = torch.randint(0, 256, (args.batch, args.seqlen), device=device)

    start = time.time()
    print("\nAttention sites found by torch.compile(model, backend='fa2'):")
    records = fa2.explain(model, input_ids=ids, labels=ids)
    compiled = torch.compile(model, backend="fa2")

    def step(m):
        m.zero_grad(set_to_none=True)
        logits, loss = outputs(m(input_ids=ids, labels=ids))
        loss.backward()
        grads = {n.removeprefix("_orig_mod."): p.grad.detach().double() for n, p in m.named_parameters()
                 if p.grad is not None}
        return logits.detach().double(), grads

    got = step(compiled)
    print(f"(compiled forward + backward in {time.time() - start:.1f} s)")
    want, base = step(reference), step(naive)

    def err(a, b):
        return (a - b).abs().max().item()

    out_err, out_base = err(got[0], want[0]), err(base[0], want[0])
    grad_err = max(err(got[1][n], want[1][n]) for n in want[1])
    grad_base = max(err(base[1][n], want[1][n]) for n in want[1])
    ok_sites = bool(records) and all(r.rewritten for r in records)
    ok_bwd = any(g["fa2_bwd"] for g in records.graphs)
    floor = 1e-5 if dtype == torch.float32 else 1e-2
    ok_out = out_err <= 2 * out_base + floor
    ok_grad = grad_err <= 3 * grad_base + floor
    print(f"\nmax |out - ref|   fa2 {out_err:.2e}  eager {out_base:.2e}  {'ok' if ok_out else 'MISMATCH'}")
    print(f"max |grad - ref|  fa2 {grad_err:.2e}  eager {grad_base:.2e}  {'ok' if ok_grad else 'MISMATCH'}")
    print(f"(ref: the same model in {str(hi).split('.')[-1]}; rule: fa2 within 2x (output) / 3x (gradients) of "
          "eager's own error)")
    print(f"attention sites rewritten: {sum(r.rewritten for r in records)}/{len(records)}; backward uses fa2.bwd: "
          f"{'yes' if ok_bwd else 'NO'}")
    ok = ok_sites and ok_bwd and ok_out and ok_grad
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
