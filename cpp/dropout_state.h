// A call's dropout state on the host: the rng_state the kernels read (docs/design.md, Dropout; fa2/philox.h).
#pragma once
#include <ATen/ATen.h>

#include "checks.h"

namespace fa2 {

// With p.dropout_p > 0, makes p.rng_state the call's (seed, offset): the one given (int64 (2,) on q's device, as
// checked; contiguous), or, where `draw` (a forward) and none was given, a fresh one drawn from torch's default
// generator of q's device, as python/fa2/_rng.py draws it (torch.randint over the int64 range). A backward (draw
// false) without one raises: it has to replay its forward's mask. `op` names the caller in the message.
void resolve_rng_state(AttentionProblem& p, const at::Tensor& q, const char* op, bool draw);

}  // namespace fa2
