// What happens to a tile of scores between S = scale·Q Kᵀ and the softmax, as small policy structs:
// softcap, then the additive/boolean bias, then the sliding-window (causal) mask. Shared by forward and backward
// so both see exactly the same scores.
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "checks.h"
#include "cpu/row_ops.h"

namespace fa2::cpu {
namespace {

// Query i sees key j iff  i + offset - window_left <= j <= i + offset + window_right  (offset = seqlen_k - seqlen_q,
// -1 = unbounded side; causal is already window_right = 0). Both bounds grow with i, which makes block ranges easy.
struct WindowMask {
  int64_t seqlen_q, seqlen_k, window_left, window_right;

  int64_t offset() const { return seqlen_k - seqlen_q; }
  // First/last key query i sees, clipped to [0, seqlen_k); the row sees nothing when first > last.
  int64_t first_key(int64_t i) const {
    return window_left < 0 ? 0 : std::max<int64_t>(0, i + offset() - window_left);
  }
  int64_t last_key(int64_t i) const {
    return window_right < 0 ? seqlen_k - 1 : std::min<int64_t>(seqlen_k - 1, i + offset() + window_right);
  }
  // First/last query that sees key j, clipped to [0, seqlen_q).
  int64_t first_query(int64_t j) const {
    return window_right < 0 ? 0 : std::max<int64_t>(0, j - offset() - window_right);
  }
  int64_t last_query(int64_t j) const {
    return window_left < 0 ? seqlen_q - 1 : std::min<int64_t>(seqlen_q - 1, j - offset() + window_left);
  }
  // True when every query of [q_begin, q_end) sees every key of [k_begin, k_end): no mask to apply.
  bool covers(int64_t q_begin, int64_t q_end, int64_t k_begin, int64_t k_end) const {
    return first_key(q_end - 1) <= k_begin && last_key(q_begin) >= k_end - 1;
  }
};

// attn_bias as the checks hand it over: a (batch, nheads, seqlen_q, seqlen_k) view with stride 0 on broadcast dims.
struct BiasView {
  const char* data = nullptr;  // null: no bias
  at::ScalarType dtype = at::kFloat;
  int64_t itemsize = 0, stride_b = 0, stride_h = 0, stride_q = 0, stride_k = 0;

  static BiasView from(const std::optional<at::Tensor>& bias) {
    BiasView view;
    if (!bias.has_value()) return view;
    view.data = static_cast<const char*>(bias->data_ptr());
    view.dtype = bias->scalar_type();
    view.itemsize = static_cast<int64_t>(bias->element_size());
    view.stride_b = bias->stride(0);
    view.stride_h = bias->stride(1);
    view.stride_q = bias->stride(2);
    view.stride_k = bias->stride(3);
    return view;
  }
  bool defined() const { return data != nullptr; }

  // s[c] += bias[b, h, i, k_begin + c] (float bias), or s[c] = -inf where bias is False (bool bias).
  template <typename acc_t>
  void apply_row(acc_t* s, int64_t n, int64_t b, int64_t h, int64_t i, int64_t k_begin) const {
    const char* row = data + (b * stride_b + h * stride_h + i * stride_q + k_begin * stride_k) * itemsize;
    switch (dtype) {
      case at::kBool: return apply_typed(s, n, reinterpret_cast<const bool*>(row));
      case at::kFloat: return apply_typed(s, n, reinterpret_cast<const float*>(row));
      case at::kDouble: return apply_typed(s, n, reinterpret_cast<const double*>(row));
      case at::kBFloat16: return apply_typed(s, n, reinterpret_cast<const at::BFloat16*>(row));
      case at::kHalf: return apply_typed(s, n, reinterpret_cast<const at::Half*>(row));
      default: TORCH_INTERNAL_ASSERT(false, "fa2: unexpected attn_bias dtype ", dtype);
    }
  }

 private:
  template <typename acc_t, typename bias_t>
  void apply_typed(acc_t* s, int64_t n, const bias_t* bias) const {
    constexpr acc_t kMasked = -std::numeric_limits<acc_t>::infinity();
    // stride 0 (broadcast over keys) and 1 (dense) get their own loops so the compiler can vectorize them
    if constexpr (std::is_same_v<bias_t, bool>) {
      if (stride_k == 0) {
        if (!bias[0]) std::fill(s, s + n, kMasked);
      } else {
        for (int64_t c = 0; c < n; ++c) s[c] = bias[c * stride_k] ? s[c] : kMasked;
      }
    } else if (stride_k == 1) {
      for (int64_t c = 0; c < n; ++c) s[c] += static_cast<acc_t>(bias[c]);
    } else if (stride_k == 0) {
      const acc_t value = static_cast<acc_t>(bias[0]);
      for (int64_t c = 0; c < n; ++c) s[c] += value;
    } else {
      for (int64_t c = 0; c < n; ++c) s[c] += static_cast<acc_t>(bias[c * stride_k]);
    }
  }
};

// Everything applied to raw scores s = scale·q·k before the softmax, in the documented order.
template <typename acc_t>
struct ScoreMods {
  acc_t softcap;  // 0 = off
  BiasView bias;
  WindowMask window;

  static ScoreMods from(const AttentionProblem& p) {
    return {static_cast<acc_t>(p.softcap), BiasView::from(p.bias),
            WindowMask{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right}};
  }

  // Modifies the (rows x cols) tile s (leading dim ld) of queries [q_begin, ..) and keys [k_begin, ..) of head
  // (b, h). dtanh (same layout, optional) receives d softcap(s)/ds for the backward.
  void apply(acc_t* s, int64_t ld, int64_t b, int64_t h, int64_t q_begin, int64_t rows, int64_t k_begin,
             int64_t cols, acc_t* dtanh) const {
    const bool needs_mask = !window.covers(q_begin, q_begin + rows, k_begin, k_begin + cols);
    if (softcap == 0 && !bias.defined() && !needs_mask) return;
    constexpr acc_t kMasked = -std::numeric_limits<acc_t>::infinity();
    for (int64_t r = 0; r < rows; ++r) {
      acc_t* row = s + r * ld;
      const int64_t i = q_begin + r;
      if (softcap > 0) softcap_row(row, cols, softcap, dtanh == nullptr ? nullptr : dtanh + r * ld);
      if (bias.defined()) bias.apply_row(row, cols, b, h, i, k_begin);
      if (needs_mask) {
        // visible columns of this row: [first, last] relative to k_begin, possibly empty
        const int64_t first = std::clamp<int64_t>(window.first_key(i) - k_begin, 0, cols);
        const int64_t last = std::clamp<int64_t>(window.last_key(i) - k_begin + 1, first, cols);
        std::fill(row, row + first, kMasked);
        std::fill(row + last, row + cols, kMasked);
      }
    }
  }
};

}  // namespace
}  // namespace fa2::cpu
