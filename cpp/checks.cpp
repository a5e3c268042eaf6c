#include "checks.h"

#include <c10/util/Exception.h>

#include <array>
#include <cmath>
#include <sstream>

namespace fa2 {
namespace {

std::string shape_str(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

void check_dtype_for_device(const at::Tensor& q) {
  const auto dt = q.scalar_type();
  if (q.is_cuda()) {
    TORCH_CHECK_TYPE(dt == at::kHalf || dt == at::kBFloat16,
                     "fa2: q must be float16 or bfloat16 on CUDA (the kernels accumulate in fp32), got ", dt,
                     "; cast with q.half()/q.bfloat16(), or run float32/float64 on the CPU");
  } else {
    TORCH_CHECK_TYPE(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16 || dt == at::kDouble,
                     "fa2: q must be float32, float16, bfloat16 or float64 on ", q.device().type(), ", got ", dt);
  }
}

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK_VALUE(q.dim() == 4, "fa2: q must have 4 dims (batch, seqlen_q, nheads, headdim), got ", q.dim(),
                    " dims with shape ", shape_str(q));
  TORCH_CHECK_VALUE(k.dim() == 4, "fa2: k must have 4 dims (batch, seqlen_k, nheads_k, headdim), got ", k.dim(),
                    " dims with shape ", shape_str(k));
  TORCH_CHECK_VALUE(v.dim() == 4, "fa2: v must have 4 dims (batch, seqlen_k, nheads_k, headdim_v), got ", v.dim(),
                    " dims with shape ", shape_str(v));
  TORCH_CHECK(k.device() == q.device(), "fa2: k must be on the same device as q (", q.device(), "), got ",
              k.device());
  TORCH_CHECK(v.device() == q.device(), "fa2: v must be on the same device as q (", q.device(), "), got ",
              v.device());
  check_dtype_for_device(q);
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type(), "fa2: k must have q's dtype (", q.scalar_type(), "), got ",
                   k.scalar_type());
  TORCH_CHECK_TYPE(v.scalar_type() == q.scalar_type(), "fa2: v must have q's dtype (", q.scalar_type(), "), got ",
                   v.scalar_type());

  const int64_t batch = q.size(0), headdim = q.size(3);
  TORCH_CHECK_VALUE(k.size(0) == batch && v.size(0) == batch, "fa2: batch size mismatch: q has ", batch,
                    ", k has ", k.size(0), ", v has ", v.size(0));
  TORCH_CHECK_VALUE(k.size(1) == v.size(1), "fa2: k and v must have the same seqlen_k (dim 1), got ", k.size(1),
                    " and ", v.size(1));
  TORCH_CHECK_VALUE(k.size(2) == v.size(2), "fa2: k and v must have the same nheads_k (dim 2), got ", k.size(2),
                    " and ", v.size(2));
  // q and k share a head dim (their dot products); v's may differ (out takes it), as in DeepSeek's MLA (192 and 128)
  TORCH_CHECK_VALUE(k.size(3) == headdim, "fa2: headdim (dim 3) of q and k must match: q has ", headdim, ", k has ",
                    k.size(3), " (v's may differ: v has ", v.size(3), ")");
  TORCH_CHECK_VALUE(headdim >= 1 && headdim <= 256, "fa2: q's headdim must be in [1, 256], got ", headdim);
  TORCH_CHECK_VALUE(v.size(3) >= 1 && v.size(3) <= 256, "fa2: v's headdim (v.size(3)) must be in [1, 256], got ",
                    v.size(3));
  const int64_t nheads = q.size(2), nheads_k = k.size(2);
  TORCH_CHECK_VALUE(nheads_k >= 1 || nheads == 0, "fa2: k must have at least one head, got nheads_k=", nheads_k);
  TORCH_CHECK_VALUE(nheads_k == 0 || nheads % nheads_k == 0,
                    "fa2: nheads (q.size(2)=", nheads, ") must be a multiple of nheads_k (k.size(2)=", nheads_k,
                    ") for GQA/MQA");
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"q", q}, {"k", k}, {"v", v}}) {
    TORCH_CHECK_VALUE(t.stride(3) == 1 || t.size(3) == 1, "fa2: ", name,
                      " must be contiguous in its last dim (stride(-1) == 1), got strides ", t.strides(),
                      "; call .contiguous() on it");
  }
}

void check_flags(std::optional<double> scale, int64_t window_left, int64_t window_right, double softcap) {
  if (scale.has_value()) {
    TORCH_CHECK_VALUE(std::isfinite(*scale), "fa2: scale must be a finite number, got ", *scale);
  }
  TORCH_CHECK_VALUE(window_left >= -1, "fa2: window_left must be >= -1 (-1 = unbounded), got ", window_left);
  TORCH_CHECK_VALUE(window_right >= -1, "fa2: window_right must be >= -1 (-1 = unbounded), got ", window_right);
  TORCH_CHECK_VALUE(std::isfinite(softcap) && softcap >= 0.0,
                    "fa2: softcap must be a finite number >= 0 (0 = off), got ", softcap);
}

// View attn_bias as (batch, nheads, seqlen_q, seqlen_k), stride 0 on broadcast dims.
at::Tensor broadcast_bias(const at::Tensor& bias, const at::Tensor& q, int64_t seqlen_k) {
  TORCH_CHECK(bias.device() == q.device(), "fa2: attn_bias must be on q's device (", q.device(), "), got ",
              bias.device());
  const auto bt = bias.scalar_type();
  TORCH_CHECK_TYPE(bt == q.scalar_type() || bt == at::kFloat || bt == at::kBool,
                   "fa2: attn_bias must be bool (True = keep), float32 or q's dtype (", q.scalar_type(), "), got ",
                   bt);
  const std::array<int64_t, 4> target{q.size(0), q.size(2), q.size(1), seqlen_k};
  TORCH_CHECK_VALUE(bias.dim() <= 4, "fa2: attn_bias must have at most 4 dims (batch, nheads, seqlen_q, seqlen_k), "
                    "got shape ", shape_str(bias));
  std::vector<int64_t> sizes(4, 1), strides(4, 0);
  const int64_t offset = 4 - bias.dim();
  for (int64_t d = 0; d < bias.dim(); ++d) {
    sizes[d + offset] = bias.size(d);
    strides[d + offset] = bias.stride(d);
  }
  for (int d = 0; d < 4; ++d) {
    TORCH_CHECK_VALUE(sizes[d] == target[d] || sizes[d] == 1,
                      "fa2: attn_bias of shape ", shape_str(bias),
                      " is not broadcastable to (batch, nheads, seqlen_q, seqlen_k) = (", target[0], ", ",
                      target[1], ", ", target[2], ", ", target[3], ")");
    if (sizes[d] == 1) strides[d] = 0;
  }
  return bias.as_strided({target[0], target[1], target[2], target[3]}, strides, bias.storage_offset());
}

// dropout_p, rng_state and sinks: the same rules for every op (a packed varlen q is seen as one batch entry).
void check_dropout_and_sinks(AttentionProblem& p, const at::Tensor& q, double dropout_p,
                             const std::optional<at::Tensor>& rng_state, const std::optional<at::Tensor>& sinks) {
  TORCH_CHECK_VALUE(dropout_p >= 0.0 && dropout_p < 1.0, "fa2: dropout_p must be in [0, 1), got ", dropout_p);
  p.dropout_p = dropout_p;
  if (rng_state.has_value() && rng_state->defined()) {
    const at::Tensor& r = *rng_state;
    TORCH_CHECK_TYPE(r.scalar_type() == at::kLong, "fa2: rng_state must be int64 (seed, offset), got ",
                     r.scalar_type());
    TORCH_CHECK_VALUE(r.dim() == 1 && r.size(0) == 2, "fa2: rng_state must have shape (2,) (seed, offset), got ",
                      shape_str(r));
    TORCH_CHECK(r.device() == q.device(), "fa2: rng_state must be on q's device (", q.device(), "), got ",
                r.device());
    p.rng_state = r;
  }
  if (sinks.has_value() && sinks->defined()) {
    const at::Tensor& s = *sinks;
    TORCH_CHECK_TYPE(s.is_floating_point(), "fa2: sinks must be a floating-point tensor (one logit per query head), "
                     "got ", s.scalar_type());
    TORCH_CHECK_VALUE(s.dim() == 1 && s.size(0) == p.nheads, "fa2: sinks must have shape (nheads,) = (", p.nheads,
                      ",) (one logit per query head), got ", shape_str(s));
    TORCH_CHECK(s.device() == q.device(), "fa2: sinks must be on q's device (", q.device(), "), got ", s.device());
    p.sinks = s;
  }
}

// scale (default headdim^-0.5), softcap, causal and the windows into p (p.batch .. p.seqlen_k, headdim set), folded
// for the kernels; prefix names the op in the scale's error.
void set_score_flags(AttentionProblem& p, const at::Tensor& q, std::optional<double> scale, bool causal,
                     int64_t window_left, int64_t window_right, double softcap, const char* prefix) {
  p.scale = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(p.headdim));
  p.softcap = softcap;
  p.causal = causal;
  // A window side at least as wide as the sequence is the same as none (query i sees j >= i + sk - sq - left, all
  // keys once left >= sk; j <= i + sk - sq + right, all once right >= sq): -1, which also keeps the kernels' index
  // arithmetic (row + sk - sq +- window) far from overflow for any int64 given (INT64_MAX as "unbounded").
  p.window_left = window_left >= p.seqlen_k ? -1 : window_left;
  const int64_t right = window_right >= p.seqlen_q ? -1 : window_right;
  // Causal is the window [.., i + sk - sq]: intersect it with a given right window.
  p.window_right = causal ? (right < 0 ? 0 : std::min<int64_t>(right, 0)) : right;
  // the kernels compute in float32 below float64 (with scale * log2(e) folded): a scale that is finite as a double
  // but not so as a float would turn every score into inf / NaN
  const bool scale_fits = std::isfinite(static_cast<float>(p.scale * 1.4426950408889634));
  TORCH_CHECK_VALUE(q.scalar_type() == at::kDouble || scale_fits, prefix, ": scale must be finite in float32 for ",
                    q.scalar_type(), " inputs, got ", p.scale);
}

}  // namespace

AttentionProblem check_fwd_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const std::optional<at::Tensor>& attn_bias, std::optional<double> scale,
                                  bool causal, int64_t window_left, int64_t window_right, double softcap,
                                  double dropout_p, const std::optional<at::Tensor>& rng_state,
                                  const std::optional<at::Tensor>& sinks) {
  check_qkv(q, k, v);
  check_flags(scale, window_left, window_right, softcap);
  AttentionProblem p;
  p.batch = q.size(0);
  p.seqlen_q = q.size(1);
  p.nheads = q.size(2);
  p.headdim = q.size(3);
  p.headdim_v = v.size(3);
  p.seqlen_k = k.size(1);
  p.nheads_k = k.size(2);
  set_score_flags(p, q, scale, causal, window_left, window_right, softcap, "fa2");
  if (attn_bias.has_value() && attn_bias->defined()) {
    p.bias = broadcast_bias(*attn_bias, q, p.seqlen_k);
  }
  check_dropout_and_sinks(p, q, dropout_p, rng_state, sinks);
  return p;
}

AttentionProblem check_bwd_inputs(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                  const std::optional<at::Tensor>& attn_bias, std::optional<double> scale,
                                  bool causal, int64_t window_left, int64_t window_right, double softcap,
                                  bool bias_requires_grad, double dropout_p,
                                  const std::optional<at::Tensor>& rng_state, const std::optional<at::Tensor>& sinks) {
  AttentionProblem p = check_fwd_inputs(q, k, v, attn_bias, scale, causal, window_left, window_right, softcap,
                                        dropout_p, rng_state, sinks);
  const std::array<int64_t, 4> out_shape{p.batch, p.seqlen_q, p.nheads, p.headdim_v};
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"dout", dout}, {"out", out}}) {
    TORCH_CHECK_VALUE(t.sizes() == at::IntArrayRef(out_shape), "fa2.bwd: ", name,
                      " must have shape (batch, seqlen_q, nheads, headdim_v) = ", at::IntArrayRef(out_shape),
                      " (q's with v's headdim), got ", shape_str(t));
    TORCH_CHECK(t.device() == q.device(), "fa2.bwd: ", name, " must be on q's device (", q.device(), "), got ",
                t.device());
    TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), "fa2.bwd: ", name, " must have q's dtype (",
                     q.scalar_type(), "), got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.numel() == 0 || t.stride(3) == 1 || t.size(3) == 1, "fa2.bwd: ", name,
                      " must be contiguous in its last dim, got strides ", t.strides());
  }
  TORCH_CHECK_VALUE(lse.dim() == 3 && lse.size(0) == p.batch && lse.size(1) == p.nheads && lse.size(2) == p.seqlen_q,
                    "fa2.bwd: lse must have shape (batch, nheads, seqlen_q) = (", p.batch, ", ", p.nheads, ", ",
                    p.seqlen_q, "), got ", shape_str(lse));
  TORCH_CHECK_TYPE(lse.scalar_type() == at::kFloat, "fa2.bwd: lse must be float32, got ", lse.scalar_type());
  TORCH_CHECK(lse.device() == q.device(), "fa2.bwd: lse must be on q's device (", q.device(), "), got ",
              lse.device());
  if (bias_requires_grad) {
    TORCH_CHECK_VALUE(p.bias.has_value(), "fa2.bwd: bias_requires_grad=True needs an attn_bias");
    TORCH_CHECK_TYPE(attn_bias->scalar_type() != at::kBool,
                     "fa2.bwd: a bool attn_bias has no gradient (bias_requires_grad must be False)");
  }
  return p;
}

at::Tensor empty_grad_like(const at::Tensor& input) {
  // the orders of (batch, seqlen, heads) tried, outermost first: the first that the input is contiguous in wins
  static constexpr int64_t kOrders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  for (const auto& o : kOrders) {
    if (input.permute({o[0], o[1], o[2], 3}).is_contiguous()) {
      int64_t inverse[3];
      for (int64_t i = 0; i < 3; ++i) inverse[o[i]] = i;
      return at::empty({input.size(o[0]), input.size(o[1]), input.size(o[2]), input.size(3)}, input.options())
          .permute({inverse[0], inverse[1], inverse[2], 3});
    }
  }
  return at::empty(input.sizes(), input.options());
}

at::Tensor reduce_dbias(const at::Tensor& dbias_full, const at::Tensor& attn_bias) {
  // Sum over every dim the bias was broadcast along, then restore the bias's own shape and dtype.
  const int64_t offset = 4 - attn_bias.dim();
  std::vector<int64_t> reduce_dims;
  for (int64_t d = 0; d < 4; ++d) {
    const int64_t given = d < offset ? 1 : attn_bias.size(d - offset);
    if (given == 1 && dbias_full.size(d) != 1) reduce_dims.push_back(d);
  }
  at::Tensor r = reduce_dims.empty() ? dbias_full : dbias_full.sum(reduce_dims, /*keepdim=*/true);
  return r.reshape(attn_bias.sizes()).to(attn_bias.scalar_type());
}

void check_compute_capability(int major, int minor, const std::string& device, const std::string& device_name) {
  TORCH_CHECK(major >= 8, "fa2: the CUDA kernels need compute capability 8.0 or newer (Ampere, Ada, Hopper); ", device,
              " is ", device_name, " with compute capability ", major, ".", minor);
}

}  // namespace fa2

// ---- variable length (packed sequences) ---------------------------------------------------------------------------

namespace fa2 {
namespace {

constexpr const char* kVarlen = "fa2.varlen";

void check_varlen_ranks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  for (const auto& [name, t, layout] :
       {std::tuple<const char*, const at::Tensor&, const char*>{"q", q, "(total_q, nheads, headdim)"},
        {"k", k, "(total_k, nheads_k, headdim)"},
        {"v", v, "(total_k, nheads_k, headdim)"}}) {
    TORCH_CHECK_VALUE(t.dim() == 3, kVarlen, ": ", name, " must have 3 dims ", layout, ", got ", t.dim(),
                      " dims with shape ", shape_str(t));
  }
  TORCH_CHECK_VALUE(k.size(0) == v.size(0), kVarlen, ": k and v must have the same total_k (dim 0), got ", k.size(0),
                    " and ", v.size(0));
  TORCH_CHECK_VALUE(k.size(1) == v.size(1), kVarlen, ": k and v must have the same nheads_k (dim 1), got ", k.size(1),
                    " and ", v.size(1));
  TORCH_CHECK_VALUE(k.size(2) == q.size(2), kVarlen, ": k must have q's headdim (dim 2: ", q.size(2), "), got ",
                    k.size(2));
  const int64_t nheads = q.size(1), nheads_k = k.size(1);
  TORCH_CHECK_VALUE(nheads_k == 0 ? nheads == 0 : nheads % nheads_k == 0, kVarlen, ": nheads (q.size(1)=", nheads,
                    ") must be a multiple of nheads_k (k.size(1)=", nheads_k, ") for GQA/MQA");
}

// dtype int32, one dim of `length` entries, contiguous, on q's device: what a kernel reads by pointer.
void check_int32_vector(const char* name, const at::Tensor& t, const at::Tensor& q, int64_t length,
                        const char* meaning) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, kVarlen, ": ", name, " must be int32, got ", t.scalar_type(),
                   "; convert with ", name, ".int()");
  TORCH_CHECK_VALUE(t.dim() == 1, kVarlen, ": ", name, " must have 1 dim ", meaning, ", got shape ", shape_str(t));
  TORCH_CHECK(t.device() == q.device(), kVarlen, ": ", name, " must be on q's device (", q.device(), "), got ",
              t.device());
  if (length >= 0) {
    TORCH_CHECK_VALUE(t.size(0) == length, kVarlen, ": ", name, " must have ", length, " entries ", meaning,
                      ", got ", t.size(0));
  }
  TORCH_CHECK_VALUE(t.is_contiguous(), kVarlen, ": ", name, " must be contiguous, got strides ", t.strides());
}

// The values of cu_seqlens (a CPU tensor): 0 first, non-decreasing, `total` last, no sequence longer than max_seqlen
// (unless lengths_used is given: then those are the lengths max_seqlen bounds, checked by the caller).
void check_cu_seqlens_values(const char* name, const at::Tensor& cu, int64_t total, const char* total_name,
                             int64_t max_seqlen, const char* max_name, bool check_max) {
  const int32_t* c = cu.const_data_ptr<int32_t>();
  const int64_t batch = cu.size(0) - 1;
  TORCH_CHECK_VALUE(c[0] == 0, kVarlen, ": ", name, " must start at 0, got ", name, "[0] = ", c[0]);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = int64_t{c[b + 1]} - c[b];
    TORCH_CHECK_VALUE(length >= 0, kVarlen, ": ", name, " must be non-decreasing, got ", name, "[", b, "] = ", c[b],
                      " > ", name, "[", b + 1, "] = ", c[b + 1]);
    TORCH_CHECK_VALUE(!check_max || length <= max_seqlen, kVarlen, ": ", max_name, " (", max_seqlen,
                      ") must be at least the longest sequence; sequence ", b, " has ", length, " rows (", name,
                      "[", b, "] = ", c[b], ", ", name, "[", b + 1, "] = ", c[b + 1], ")");
  }
  TORCH_CHECK_VALUE(c[batch] == total, kVarlen, ": the last entry of ", name, " must equal ", total_name, " = ",
                    total, ", got ", name, "[", batch, "] = ", c[batch]);
}

// seqused_k's values (CPU): 0 <= seqused_k[b] <= the length of key sequence b, and <= max_seqlen_k.
void check_seqused_k_values(const at::Tensor& seqused_k, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_k) {
  const int32_t* used = seqused_k.const_data_ptr<int32_t>();
  const int32_t* c = cu_seqlens_k.const_data_ptr<int32_t>();
  for (int64_t b = 0; b < seqused_k.size(0); ++b) {
    const int64_t length = int64_t{c[b + 1]} - c[b];
    TORCH_CHECK_VALUE(used[b] >= 0 && used[b] <= length, kVarlen, ": seqused_k[", b, "] must be in [0, ", length,
                      "] (the keys of sequence ", b, " in cu_seqlens_k), got ", used[b]);
    TORCH_CHECK_VALUE(used[b] <= max_seqlen_k, kVarlen, ": max_seqlen_k (", max_seqlen_k,
                      ") must be at least every seqused_k entry, got seqused_k[", b, "] = ", used[b]);
  }
}

}  // namespace

VarlenProblem check_varlen_fwd_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                      int64_t max_seqlen_q, int64_t max_seqlen_k,
                                      const std::optional<at::Tensor>& seqused_k, std::optional<double> scale,
                                      bool causal, int64_t window_left, int64_t window_right, double softcap,
                                      double dropout_p, const std::optional<at::Tensor>& sinks,
                                      const std::optional<at::Tensor>& rng_state) {
  check_varlen_ranks(q, k, v);
  // Heads, headdim, dtypes, devices, strides, flags: the padded ops' checks, on the packed tensors seen as one
  // sequence each (which also folds the windows against the totals).
  VarlenProblem vp;
  vp.problem = check_fwd_inputs(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), std::nullopt, scale, causal,
                                window_left, window_right, softcap, dropout_p, rng_state, sinks);
  vp.total_q = q.size(0);
  vp.total_k = k.size(0);

  check_int32_vector("cu_seqlens_q", cu_seqlens_q, q, -1, "(batch + 1,)");
  check_int32_vector("cu_seqlens_k", cu_seqlens_k, q, -1, "(batch + 1,)");
  TORCH_CHECK_VALUE(cu_seqlens_q.size(0) >= 1, kVarlen, ": cu_seqlens_q must have batch + 1 >= 1 entries, got 0");
  TORCH_CHECK_VALUE(cu_seqlens_k.size(0) == cu_seqlens_q.size(0), kVarlen,
                    ": cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got ",
                    cu_seqlens_q.size(0), " and ", cu_seqlens_k.size(0));
  const int64_t batch = cu_seqlens_q.size(0) - 1;
  const bool has_seqused = seqused_k.has_value() && seqused_k->defined();
  if (has_seqused) check_int32_vector("seqused_k", *seqused_k, q, batch, "(batch,)");
  TORCH_CHECK_VALUE(max_seqlen_q >= 0, kVarlen, ": max_seqlen_q must be >= 0, got ", max_seqlen_q);
  TORCH_CHECK_VALUE(max_seqlen_k >= 0, kVarlen, ": max_seqlen_k must be >= 0, got ", max_seqlen_k);

  vp.values_checked = cu_seqlens_q.is_cpu();
  if (vp.values_checked) {
    check_cu_seqlens_values("cu_seqlens_q", cu_seqlens_q, vp.total_q, "total_q (q.size(0))", max_seqlen_q,
                            "max_seqlen_q", /*check_max=*/true);
    check_cu_seqlens_values("cu_seqlens_k", cu_seqlens_k, vp.total_k, "total_k (k.size(0))", max_seqlen_k,
                            "max_seqlen_k", /*check_max=*/!has_seqused);
    if (has_seqused) check_seqused_k_values(*seqused_k, cu_seqlens_k, max_seqlen_k);
  }
  vp.problem.batch = batch;
  vp.problem.seqlen_q = max_seqlen_q;
  vp.problem.seqlen_k = max_seqlen_k;
  vp.cu_seqlens_q = cu_seqlens_q;
  vp.cu_seqlens_k = cu_seqlens_k;
  if (has_seqused) vp.seqused_k = *seqused_k;
  return vp;
}

VarlenProblem check_varlen_bwd_inputs(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                      const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                      int64_t max_seqlen_q, int64_t max_seqlen_k,
                                      const std::optional<at::Tensor>& seqused_k, std::optional<double> scale,
                                      bool causal, int64_t window_left, int64_t window_right, double softcap,
                                      double dropout_p, const std::optional<at::Tensor>& sinks,
                                      const std::optional<at::Tensor>& rng_state) {
  VarlenProblem vp = check_varlen_fwd_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                             seqused_k, scale, causal, window_left, window_right, softcap, dropout_p,
                                             sinks, rng_state);
  const int64_t nheads = vp.problem.nheads;
  const std::array<int64_t, 3> out_shape{vp.total_q, nheads, v.size(2)};
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"dout", dout}, {"out", out}}) {
    TORCH_CHECK_VALUE(t.sizes() == at::IntArrayRef(out_shape), "fa2.varlen_bwd: ", name,
                      " must have shape (total_q, nheads, headdim) = (", out_shape[0], ", ", out_shape[1], ", ",
                      out_shape[2], "), got ", shape_str(t));
    TORCH_CHECK(t.device() == q.device(), "fa2.varlen_bwd: ", name, " must be on q's device (", q.device(),
                "), got ", t.device());
    TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), "fa2.varlen_bwd: ", name, " must have q's dtype (",
                     q.scalar_type(), "), got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.numel() == 0 || t.stride(2) == 1 || t.size(2) == 1, "fa2.varlen_bwd: ", name,
                      " must be contiguous in its last dim, got strides ", t.strides());
  }
  TORCH_CHECK_VALUE(lse.dim() == 2 && lse.size(0) == nheads && lse.size(1) == vp.total_q,
                    "fa2.varlen_bwd: lse must have shape (nheads, total_q) = (", nheads, ", ", vp.total_q, "), got ",
                    shape_str(lse));
  TORCH_CHECK_TYPE(lse.scalar_type() == at::kFloat, "fa2.varlen_bwd: lse must be float32, got ", lse.scalar_type());
  TORCH_CHECK(lse.device() == q.device(), "fa2.varlen_bwd: lse must be on q's device (", q.device(), "), got ",
              lse.device());
  return vp;
}

}  // namespace fa2

// ---- KV cache (inference) -----------------------------------------------------------------------------------------

namespace fa2 {
namespace {

constexpr const char* kKvcache = "fa2.attention_with_kvcache";

bool is_given(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// A 4-d operand: q's dtype and device, contiguous in its last dim (the rows are read and written through strides).
void check_kvcache_operand(const char* name, const at::Tensor& t, const at::Tensor& q, const char* layout) {
  TORCH_CHECK_VALUE(t.dim() == 4, kKvcache, ": ", name, " must have 4 dims ", layout, ", got ", t.dim(),
                    " dims with shape ", shape_str(t));
  TORCH_CHECK(t.device() == q.device(), kKvcache, ": ", name, " must be on q's device (", q.device(), "), got ",
              t.device());
  TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), kKvcache, ": ", name, " must have q's dtype (",
                   q.scalar_type(), "), got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.stride(3) == 1 || t.size(3) == 1, kKvcache, ": ", name,
                    " must be contiguous in its last dim (stride(-1) == 1), got strides ", t.strides());
}

// An index tensor the kernels read by pointer: int32, `shape`, contiguous, on q's device.
void check_kvcache_index(const char* name, const at::Tensor& t, const at::Tensor& q, at::IntArrayRef shape,
                         const char* meaning) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, kKvcache, ": ", name, " must be int32, got ", t.scalar_type(),
                   "; convert with ", name, ".int()");
  TORCH_CHECK(t.device() == q.device(), kKvcache, ": ", name, " must be on q's device (", q.device(), "), got ",
              t.device());
  TORCH_CHECK_VALUE(t.sizes() == shape, kKvcache, ": ", name, " must have shape ", meaning, " = ", shape, ", got ",
                    shape_str(t));
  TORCH_CHECK_VALUE(t.is_contiguous(), kKvcache, ": ", name, " must be contiguous, got strides ", t.strides());
}

void check_kvcache_rotary(KvcacheProblem& kp, const at::Tensor& q, const std::optional<at::Tensor>& k,
                          const std::optional<at::Tensor>& cache_seqlens, const std::optional<at::Tensor>& cos,
                          const std::optional<at::Tensor>& sin) {
  TORCH_CHECK_VALUE(is_given(cos) == is_given(sin), kKvcache, ": rotary_cos and rotary_sin must be given together, "
                    "got rotary_cos=", is_given(cos) ? "a tensor" : "None", ", rotary_sin=",
                    is_given(sin) ? "a tensor" : "None");
  if (!is_given(cos)) return;
  TORCH_CHECK_VALUE(is_given(k) && is_given(cache_seqlens), kKvcache, ": rotary_cos / rotary_sin rotate the new keys "
                    "at their positions: pass k, v and cache_seqlens with them (as flash-attn)");
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"rotary_cos", *cos}, {"rotary_sin", *sin}}) {
    TORCH_CHECK_VALUE(t.dim() == 2, kKvcache, ": ", name, " must have 2 dims (seqlen_ro, rotary_dim / 2), got shape ",
                      shape_str(t));
    TORCH_CHECK(t.device() == q.device(), kKvcache, ": ", name, " must be on q's device (", q.device(), "), got ",
                t.device());
    TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), kKvcache, ": ", name, " must have q's dtype (",
                     q.scalar_type(), "), got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.stride(1) == 1 || t.size(1) == 1, kKvcache, ": ", name,
                      " must be contiguous in its last dim, got strides ", t.strides());
  }
  TORCH_CHECK_VALUE(cos->sizes() == sin->sizes(), kKvcache,
                    ": rotary_cos and rotary_sin must have the same shape, got ", shape_str(*cos), " and ",
                    shape_str(*sin));
  kp.rotary_dim = 2 * cos->size(1);
  TORCH_CHECK_VALUE(kp.rotary_dim > 0 && kp.rotary_dim % 16 == 0 && kp.rotary_dim <= kp.problem.headdim, kKvcache,
                    ": the rotary dim (2 * rotary_cos.size(1)) must be a multiple of 16 in [16, headdim = ",
                    kp.problem.headdim, "], got ", kp.rotary_dim);
  TORCH_CHECK_VALUE(cos->size(0) >= kp.capacity, kKvcache, ": rotary_cos / rotary_sin must have a row for every "
                    "position of the cache (seqlen_ro >= ", kp.capacity, ", the cache's capacity), got seqlen_ro = ",
                    cos->size(0));
  kp.rotary_cos = *cos;
  kp.rotary_sin = *sin;
}

// The values of cache_seqlens, cache_batch_idx and block_table (CPU tensors): every key a sequence holds after the
// append lies inside the cache.
void check_kvcache_values(const KvcacheProblem& kp) {
  const int32_t* seqlens = kp.cache_seqlens ? kp.cache_seqlens->const_data_ptr<int32_t>() : nullptr;
  const int32_t* batch_idx = kp.cache_batch_idx ? kp.cache_batch_idx->const_data_ptr<int32_t>() : nullptr;
  const int32_t* table = kp.block_table ? kp.block_table->const_data_ptr<int32_t>() : nullptr;
  for (int64_t b = 0; b < kp.problem.batch; ++b) {
    const int64_t cached = seqlens != nullptr ? seqlens[b] : kp.capacity;
    TORCH_CHECK_VALUE(cached >= 0, kKvcache, ": cache_seqlens[", b, "] must be >= 0, got ", cached);
    TORCH_CHECK_VALUE(cached + kp.seqlen_new <= kp.capacity, kKvcache, ": the cache is too short for sequence ", b,
                      ": cache_seqlens[", b, "] + seqlen_new = ", cached, " + ", kp.seqlen_new,
                      " keys, the cache holds ", kp.capacity,
                      kp.paged ? " (max_blocks_per_seq * block_size)" : " (seqlen_cache, k_cache.size(1))");
    if (batch_idx != nullptr) {
      TORCH_CHECK_VALUE(batch_idx[b] >= 0 && batch_idx[b] < kp.batch_cache, kKvcache, ": cache_batch_idx[", b,
                        "] must be in [0, ", kp.batch_cache, ") (k_cache.size(0)), got ", batch_idx[b]);
    }
    if (table != nullptr) {
      const int64_t used_blocks = (cached + kp.seqlen_new + kp.block_size - 1) / kp.block_size;
      for (int64_t j = 0; j < used_blocks; ++j) {
        const int64_t block = table[b * kp.max_blocks + j];
        TORCH_CHECK_VALUE(block >= 0 && block < kp.batch_cache, kKvcache, ": block_table[", b, ", ", j, "] = ", block,
                          " is out of range: the paged cache has ", kp.batch_cache, " blocks (k_cache.size(0))");
      }
    }
  }
}

}  // namespace

KvcacheProblem check_kvcache_inputs(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                    const std::optional<at::Tensor>& k, const std::optional<at::Tensor>& v,
                                    const std::optional<at::Tensor>& cache_seqlens,
                                    const std::optional<at::Tensor>& block_table,
                                    const std::optional<at::Tensor>& cache_batch_idx,
                                    const std::optional<at::Tensor>& rotary_cos,
                                    const std::optional<at::Tensor>& rotary_sin, bool rotary_interleaved,
                                    std::optional<double> scale, bool causal, int64_t window_left,
                                    int64_t window_right, double softcap, int64_t num_splits) {
  TORCH_CHECK_VALUE(q.dim() == 4, kKvcache, ": q must have 4 dims (batch, seqlen_q, nheads, headdim), got ", q.dim(),
                    " dims with shape ", shape_str(q));
  check_dtype_for_device(q);
  check_kvcache_operand("q", q, q, "(batch, seqlen_q, nheads, headdim)");
  KvcacheProblem kp;
  kp.paged = is_given(block_table);
  const char* cache_layout = kp.paged ? "(num_blocks, block_size, nheads_k, headdim)"
                                      : "(batch_cache, seqlen_cache, nheads_k, headdim)";
  check_kvcache_operand("k_cache", k_cache, q, cache_layout);
  check_kvcache_operand("v_cache", v_cache, q, cache_layout);
  AttentionProblem& p = kp.problem;
  p.batch = q.size(0), p.seqlen_q = q.size(1), p.nheads = q.size(2), p.headdim = q.size(3);
  p.nheads_k = k_cache.size(2), p.headdim_v = v_cache.size(3);
  TORCH_CHECK_VALUE(k_cache.size(3) == p.headdim, kKvcache, ": k_cache's headdim (dim 3) must be q's (", p.headdim,
                    "), got ", k_cache.size(3));
  TORCH_CHECK_VALUE(v_cache.sizes().slice(0, 3) == k_cache.sizes().slice(0, 3), kKvcache,
                    ": v_cache must have k_cache's first three dims ", k_cache.sizes().slice(0, 3), ", got ",
                    shape_str(v_cache));
  TORCH_CHECK_VALUE(p.headdim >= 1 && p.headdim <= 256 && p.headdim_v >= 1 && p.headdim_v <= 256, kKvcache,
                    ": headdims must be in [1, 256], got q / k_cache ", p.headdim, ", v_cache ", p.headdim_v);
  TORCH_CHECK_VALUE(p.nheads_k >= 1 && p.nheads % p.nheads_k == 0, kKvcache, ": nheads (q.size(2) = ", p.nheads,
                    ") must be a multiple of nheads_k (k_cache.size(2) = ", p.nheads_k, ") for GQA/MQA");

  TORCH_CHECK_VALUE(is_given(k) == is_given(v), kKvcache, ": k and v (the new keys and values) must be given "
                    "together, got k=", is_given(k) ? "a tensor" : "None", ", v=", is_given(v) ? "a tensor" : "None");
  if (is_given(k)) {
    check_kvcache_operand("k", *k, q, "(batch, seqlen_new, nheads_k, headdim)");
    check_kvcache_operand("v", *v, q, "(batch, seqlen_new, nheads_k, headdim_v)");
    kp.seqlen_new = k->size(1);
    const std::array<int64_t, 4> k_shape{p.batch, kp.seqlen_new, p.nheads_k, p.headdim};
    const std::array<int64_t, 4> v_shape{p.batch, kp.seqlen_new, p.nheads_k, p.headdim_v};
    TORCH_CHECK_VALUE(k->sizes() == at::IntArrayRef(k_shape), kKvcache, ": k must have shape (batch, seqlen_new, "
                      "nheads_k, headdim) = ", at::IntArrayRef(k_shape), " (q's batch and headdim, k_cache's heads), "
                      "got ", shape_str(*k));
    TORCH_CHECK_VALUE(v->sizes() == at::IntArrayRef(v_shape), kKvcache, ": v must have shape (batch, seqlen_new, "
                      "nheads_k, headdim_v) = ", at::IntArrayRef(v_shape), " (k's, with v_cache's headdim), got ",
                      shape_str(*v));
  }

  kp.batch_cache = k_cache.size(0);
  if (kp.paged) {
    TORCH_CHECK_VALUE(block_table->dim() == 2, kKvcache, ": block_table must have 2 dims (batch, max_blocks_per_seq), "
                      "got shape ", shape_str(*block_table));
    check_kvcache_index("block_table", *block_table, q, {p.batch, block_table->size(1)}, "(batch, max_blocks_per_seq)");
    TORCH_CHECK_VALUE(!is_given(cache_batch_idx), kKvcache, ": cache_batch_idx cannot be used with a paged cache "
                      "(block_table already says where each sequence's keys are)");
    kp.block_size = k_cache.size(1);
    TORCH_CHECK_VALUE(kp.block_size > 0 && kp.block_size % 16 == 0, kKvcache, ": the paged cache's block size "
                      "(k_cache.size(1)) must be a positive multiple of 16, got ", kp.block_size);
    kp.max_blocks = block_table->size(1);
    kp.capacity = kp.max_blocks * kp.block_size;
    kp.block_table = *block_table;
  } else {
    kp.capacity = k_cache.size(1);
    if (is_given(cache_batch_idx)) {
      check_kvcache_index("cache_batch_idx", *cache_batch_idx, q, {p.batch}, "(batch,)");
      kp.cache_batch_idx = *cache_batch_idx;
    } else {
      TORCH_CHECK_VALUE(kp.batch_cache >= p.batch, kKvcache, ": k_cache must have a row per batch element without "
                        "cache_batch_idx: k_cache.size(0) = ", kp.batch_cache, " < batch = ", p.batch);
    }
  }
  if (is_given(cache_seqlens)) {
    check_kvcache_index("cache_seqlens", *cache_seqlens, q, {p.batch}, "(batch,)");
    kp.cache_seqlens = *cache_seqlens;
  } else {
    TORCH_CHECK_VALUE(kp.seqlen_new == 0, kKvcache, ": cache_seqlens=None means every position of the cache holds a "
                      "key: there is no room to append k (", kp.seqlen_new, " new rows); pass cache_seqlens");
  }
  check_kvcache_rotary(kp, q, k, cache_seqlens, rotary_cos, rotary_sin);
  kp.rotary_interleaved = rotary_interleaved;

  check_flags(scale, window_left, window_right, softcap);
  TORCH_CHECK_VALUE(num_splits >= 0, kKvcache, ": num_splits must be >= 0 (0 = chosen by the library), got ",
                    num_splits);
  p.seqlen_k = kp.capacity;  // (sides folded against the most keys a sequence can have)
  set_score_flags(p, q, scale, causal, window_left, window_right, softcap, kKvcache);
  kp.rotary_q_per_row = p.window_left >= 0 || p.window_right >= 0;

  kp.values_checked = q.is_cpu();
  if (kp.values_checked) check_kvcache_values(kp);
  return kp;
}

}  // namespace fa2
