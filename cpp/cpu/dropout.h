// The CPU kernel's dropout: the keep mask of a tile from the Philox bits the CUDA kernels use (fa2/philox.h), so a
// call gives the same mask on either device, and the forward's and the backward's tiles (of any size) agree.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "checks.h"
#include "fa2/philox.h"

namespace fa2::cpu {
namespace {

// A call's dropout as the CPU kernels apply it: weights are kept with probability 1 - p and scaled by 1 / (1 - p).
struct CpuDropout {
  bool enabled = false;
  DropoutRng rng;
  double keep_scale = 1.0;  // 1 / (1 - p)
  int64_t batch0 = 0;       // the batch coordinate of the problem's batch element 0 (a varlen run's first sequence)
  int64_t nheads = 0;

  // rng_state: the problem's (checked: int64 (2,) on the CPU); batch0 as above.
  static CpuDropout from(const AttentionProblem& p, int64_t batch0) {
    CpuDropout d;
    d.enabled = p.dropout_p > 0.0;
    if (!d.enabled) return d;
    TORCH_CHECK(p.rng_state.has_value(), "fa2: dropout_p > 0 needs rng_state (the op draws it when not given)");
    const int64_t* state = p.rng_state->const_data_ptr<int64_t>();
    d.rng.seed = static_cast<uint64_t>(state[0]);
    d.rng.offset = static_cast<uint64_t>(state[0 + p.rng_state->stride(0)]);
    d.rng.keep_threshold = dropout_keep_threshold(p.dropout_p);
    d.keep_scale = 1.0 / (1.0 - p.dropout_p);
    d.batch0 = batch0;
    d.nheads = p.nheads;
    return d;
  }

  // keep (rows, cols; row stride ld): 1 where weight (b, h, i0 + r, j0 + c) is kept. Each Philox call's four pairs
  // of keys of one row are read from it (its other row, i ^ 8, may lie outside the tile: computed again there).
  void keep_tile(int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0, int64_t cols, uint8_t* keep,
                 int64_t ld) const {
    const uint64_t head_counter = dropout_head_counter(rng, batch0 + b, nheads, h);
    const int64_t j_end = j0 + cols;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      uint8_t* keep_row = keep + r * ld - j0;
      for (int64_t block = j0 & ~int64_t(15); block < j_end; block += 16) {
        for (int64_t pair = 0; pair < 8; pair += 2) {  // keys block + pair + {0, 1, 8, 9}: one group
          const PhiloxBits bits = dropout_group_bits(rng, head_counter, i, block + pair);
          for (const int64_t j : {block + pair, block + pair + 1, block + pair + 8, block + pair + 9}) {
            if (j >= j0 && j < j_end) keep_row[j] = dropout_draw(bits, i, j) < rng.keep_threshold;
          }
        }
      }
    }
  }
};

// row[j] = keep[j] ? row[j] * keep_scale : 0 (dst may be row itself).
template <typename acc_t>
void apply_keep_row(const acc_t* row, const uint8_t* keep, int64_t cols, acc_t keep_scale, acc_t* dst) {
  for (int64_t j = 0; j < cols; ++j) dst[j] = keep[j] ? row[j] * keep_scale : acc_t(0);
}

}  // namespace
}  // namespace fa2::cpu
