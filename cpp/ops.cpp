// The op schemas, declared once. Backends register implementations elsewhere (cpu/, cuda/); fake kernels,
// autograd and the CompositeImplicitAutograd body of `attention` are registered from Python (fa2/_ops_impl.py; the
// forward-only kvcache_fwd's Autograd kernel in C++: cpp/forward_only.cpp).
#include <torch/library.h>

TORCH_LIBRARY(fa2, m) {
  // Forward: out (batch, seqlen_q, nheads, headdim), contiguous; lse float32 (batch, nheads, seqlen_q), natural log,
  // +inf for a query row that sees no key. dropout_p: each weight dropped with that probability, bits from the
  // Philox generator at rng_state = (seed, offset), int64 (2,) on q's device (drawn by the op when not given).
  // sinks (nheads,): each head's extra logit in the softmax denominator (as given: not scaled, not softcapped);
  // lse includes it.
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor? attn_bias=None, float? scale=None, bool causal=False, "
      "int window_left=-1, int window_right=-1, float softcap=0.0, float dropout_p=0.0, Tensor? rng_state=None, "
      "Tensor? sinks=None) -> (Tensor out, Tensor lse)",
      {at::Tag::pt2_compliant_tag});
  // Backward by recomputation from lse. dbias has the shape and dtype of attn_bias when bias_requires_grad,
  // else it is an empty tensor of shape (0,). deterministic=True gives bitwise-reproducible gradients. dropout_p and
  // rng_state as the forward's (the same mask is replayed). No sinks: lse includes them, which is all dq, dk, dv
  // need; d sinks comes from bwd_with_sinks.
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? attn_bias=None, "
      "float? scale=None, bool causal=False, int window_left=-1, int window_right=-1, float softcap=0.0, "
      "bool bias_requires_grad=False, bool deterministic=False, float dropout_p=0.0, Tensor? rng_state=None) "
      "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dbias)",
      {at::Tag::pt2_compliant_tag});
  // The backward of a forward with sinks whose gradient is wanted: bwd's results plus dsinks (like sinks: shape, dtype),
  // d sinks_h = -sum over rows of exp(sinks[h] - lse) * rowsum(dout * out), from the rows' sums the backward computes
  // anyway (bwd keeps its four results: its schema is public).
  m.def(
      "bwd_with_sinks(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor sinks, "
      "Tensor? attn_bias=None, float? scale=None, bool causal=False, int window_left=-1, int window_right=-1, "
      "float softcap=0.0, bool bias_requires_grad=False, bool deterministic=False, float dropout_p=0.0, "
      "Tensor? rng_state=None) -> (Tensor dq, Tensor dk, Tensor dv, Tensor dbias, Tensor dsinks)",
      {at::Tag::pt2_compliant_tag});
  // The user-facing op: differentiable through fwd/bwd.
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, Tensor? attn_bias=None, float? scale=None, bool causal=False, "
      "int window_left=-1, int window_right=-1, float softcap=0.0, float dropout_p=0.0, Tensor? sinks=None) "
      "-> Tensor",
      {at::Tag::pt2_compliant_tag});
  // Variable length (packed sequences), as flash-attn's varlen API: q (total_q, nheads, headdim), k / v (total_k,
  // nheads_k, headdim); sequence b is rows cu_seqlens[b]:cu_seqlens[b+1] (int32, (batch + 1,)); max_seqlen_* size
  // the grid with no host sync; causal and windows align bottom-right per sequence (over seqused_k[b] keys when
  // given). out (total_q, nheads, headdim); lse float32 (nheads, total_q), +inf for a row that sees no key.
  // dropout_p, rng_state and sinks as the padded forward's.
  m.def(
      "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, "
      "SymInt max_seqlen_k, *, Tensor? seqused_k=None, float? scale=None, bool causal=False, int window_left=-1, "
      "int window_right=-1, float softcap=0.0, float dropout_p=0.0, Tensor? sinks=None, Tensor? rng_state=None) "
      "-> (Tensor out, Tensor lse)",
      {at::Tag::pt2_compliant_tag});
  // Varlen backward by recomputation from lse; dq, dk, dv shaped like q, k, v; dsinks like sinks (shape, dtype) when
  // they are given, else empty (0,).
  m.def(
      "varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, *, Tensor? seqused_k=None, float? scale=None, "
      "bool causal=False, int window_left=-1, int window_right=-1, float softcap=0.0, float dropout_p=0.0, "
      "Tensor? sinks=None, bool deterministic=False, Tensor? rng_state=None) "
      "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)",
      {at::Tag::pt2_compliant_tag});
  // KV cache (inference), as flash-attn's flash_attn_with_kvcache. q (batch, seqlen_q, nheads, headdim); k_cache /
  // v_cache contiguous (batch_cache, seqlen_cache, nheads_k, headdim) or paged (num_blocks, block_size, nheads_k,
  // headdim) with block_table int32 (batch, max_blocks). k / v (batch, seqlen_new, nheads_k, headdim), when given,
  // are written into the caches IN PLACE at cache_seqlens[b] ... (rotated first with rotary_cos / rotary_sin), then
  // attention runs over the first cache_seqlens[b] + seqlen_new keys (causal / windows bottom-right over that
  // length). out (batch, seqlen_q, nheads, headdim_v); lse float32 (batch, nheads, seqlen_q). Forward only.
  m.def(
      "kvcache_fwd(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k=None, Tensor? v=None, *, "
      "Tensor? cache_seqlens=None, Tensor? block_table=None, Tensor? cache_batch_idx=None, Tensor? rotary_cos=None, "
      "Tensor? rotary_sin=None, bool rotary_interleaved=False, float? scale=None, bool causal=False, "
      "int window_left=-1, int window_right=-1, float softcap=0.0, int num_splits=0) -> (Tensor out, Tensor lse)",
      {at::Tag::pt2_compliant_tag});
}

// Internal (tests and benchmarks of the CUDA decode kernel alone, cpp/cuda/decode_cuda.cpp): attention of q (batch,
// seqlen_q, nheads, d) over the first seqlens_k[b] keys of a contiguous or paged (block_table) cache, causal / windows
// bottom-right over seqlens_k[b]; raises where the decode kernel does not take the call. CUDA only.
TORCH_LIBRARY_FRAGMENT(fa2, m) {
  m.def(
      "_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seqlens_k, Tensor? block_table=None, "
      "Tensor? cache_batch_idx=None, float? scale=None, bool causal=False, int window_left=-1, "
      "int window_right=-1, float softcap=0.0, int num_splits=0) -> (Tensor out, Tensor lse)");
}
