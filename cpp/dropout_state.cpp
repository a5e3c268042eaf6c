#include "dropout_state.h"

#include <limits>

namespace fa2 {

void resolve_rng_state(AttentionProblem& p, const at::Tensor& q, const char* op, bool draw) {
  if (p.dropout_p <= 0.0) return;
  if (p.rng_state.has_value() && p.rng_state->defined()) {
    p.rng_state = p.rng_state->contiguous();
    return;
  }
  TORCH_CHECK_VALUE(draw, op, ": dropout_p=", p.dropout_p, " needs rng_state, the (seed, offset) its forward used "
                    "(int64 (2,) on q's device): the backward replays the forward's dropout mask");
  p.rng_state = at::randint(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), {2},
                            q.options().dtype(at::kLong));
}

}  // namespace fa2
