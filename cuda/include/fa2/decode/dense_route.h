// Which of fa2.attention's forward calls the decode kernel takes instead of the dense grid (the CUDA glue decides with
// it, and fa2.dev.plan reports it): plain C++, no torch, no CUDA.
#pragma once
#include <cstdint>

#include "fa2/decode/tile_config.h"
#include "fa2/dev_options.h"

namespace fa2 {
namespace decode {

// A bias the decode kernel takes as its key mask: bool, one value per key for every head and query row (each of those
// dims of size 1 or stride 0), unit key stride (a padding mask; a static cache's decoding step).
inline bool bias_is_key_mask(bool bool_dtype, int64_t nheads, int64_t head_stride, int64_t seqlen_q,
                             int64_t row_stride, int64_t seqlen_k, int64_t key_stride) {
  return bool_dtype && (nheads == 1 || head_stride == 0) && (seqlen_q == 1 || row_stride == 0) &&
         (seqlen_k == 1 || key_stride == 1);
}

// Few query rows per kv head (up to kMaxRowsForDenseCalls) and none of what the decode kernel does not take: a bias
// other than a bool key mask (a padding mask broadcast over heads and queries, e.g. a static cache's decoding step),
// dropout, sinks, a value headdim of its own. Option dense_decode off: never. (The kernel may still decline a call's
// layout or headdim; the dense grid then runs it.)
inline bool dense_call_goes_to_decode(int64_t seqlen_q, int64_t nheads, int64_t nheads_k, bool bias_not_key_mask,
                                      bool dropout, bool sinks, bool own_headdim_v, const DevOptions& options) {
  return options.dense_decode && !bias_not_key_mask && !dropout && !sinks && !own_headdim_v && nheads_k > 0 &&
         seqlen_q * (nheads / nheads_k) <= kMaxRowsForDenseCalls;
}

}  // namespace decode
}  // namespace fa2
