// The order in which a launch's tiles start: `blocks` blocks (query blocks in the forward, key blocks in the
// backward) of each of `heads` (batch, head) pairs, numbered t = 0, 1, .. in the order they start (a grid's CTAs by
// their linear blockIdx, x fastest, as the hardware starts them; the persistent forward's tiles as its CTAs take
// them). Plain C++ (host and device), no torch.
//
// Head-major (all blocks of one head, longest first, then the next head) keeps the CTAs that run at once on a few
// heads, which then share that head's K / V (forward) or Q / dO (backward) in L2. With blocks of unequal length
// (causal: the forward's last query block sees every key, its first one key block; the backward's first key block
// is seen by every query block) it starts the last heads' longest blocks among the last tiles of the launch, and
// they run on after the rest of the GPU has run out of work: a greedy model of the H200's 132 SMs loses 5-7% at
// d 128 / 256, S 1k-8k, 16k tokens (one CTA per SM). So the last `tail` heads go rank-major instead (their longest
// blocks first, all of those heads at once), the tail sized so that its work outlasts its longest block
// (tile_order_tail); the same model then loses 0.2-1.5%. rank: a block's place in its head by length, 0 the longest.
// Measured faster in the forward (d 64 / 128 / 256) and backward (d 128 / 256) up to 64 blocks a head; at 128 blocks
// a head, where the model's loss is under 0.5%, the tail lost (its heads' K / V or Q / dO no longer shared in L2 by
// the CTAs running at once, we think), so above half as many blocks as slots there is none (docs/tuning-fwd.md).
// The d 64 backward kernel is compiled without it (bwd_tile_config.h, kTileOrderTail).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FA2_TILE_ORDER_FN __host__ __device__ constexpr
#else
#define FA2_TILE_ORDER_FN constexpr
#endif

namespace fa2 {

struct TileOrder {
  int blocks;  // per head
  int heads;   // batch * nheads
  int tail;    // the last `tail` heads rank-major (0: head-major throughout); <= heads

  template <typename Index>
  FA2_TILE_ORDER_FN void at(Index t, int& bh, int& rank) const {
    const Index head_major = Index(heads - tail) * blocks;
    if (t < head_major) {
      bh = int(t / blocks);
      rank = int(t - Index(bh) * blocks);
    } else {
      const Index u = t - head_major;
      rank = int(u / tail);
      bh = heads - tail + int(u - Index(rank) * tail);
    }
  }
};

// The tail for `blocks` blocks per head of causal lengths (rank r: about blocks - r units) on `slots` CTAs at once:
// its work, tail * blocks (blocks + 1) / 2 units, twice the slots' share of the longest block (slots * blocks); none
// above slots / 2 blocks a head (see above).
FA2_TILE_ORDER_FN int tile_order_tail(int blocks, int heads, int slots) {
  if (blocks <= 1 || slots <= 0 || 2 * blocks > slots) return 0;
  const int64_t tail = (4 * int64_t(slots) + blocks) / (int64_t(blocks) + 1);  // ceil(4 slots / (blocks + 1))
  return tail < heads ? int(tail) : heads;
}

// The split of a launch's last partial wave (the warp-specialized backward's: bwd_tail_split_plan): `tiles`
// tiles of equal length (`query_blocks` steps each: no causal lengths) on `slots` CTAs at once (one per SM) run in
// tiles / slots full waves and a last one of rest = tiles % slots tiles, during which slots - rest SMs idle (at 16k
// tokens about 3% of the launch: 64 of 132 SMs through the last of 16 waves at d 128, 128 through the last of 32 at
// d 64). Split into k CTAs of a tile's
// query blocks each, the last `rest` tiles take ceil(rest k / slots) rounds of 1 / k of a tile, plus each piece's
// own cost (its K / V load, the pipeline's fill, its fp32 dK / dV added and counted, the last piece's sums read
// back), about piece_overhead_blocks steps: {tiles: rest, pieces: k} for the k that costs least, where that saves
// at least min_gain of the launch; else {0, 1}. (Where it paid on the H200: bwd_tile_config.h,
// kTailSplitMinQueryBlocks, with this function's compile-time checks.)
struct TailSplit {
  int tiles;
  int pieces;
};
struct TailSplitTuning {
  int max_pieces;
  int min_piece_blocks;          // query blocks a piece has at least
  double piece_overhead_blocks;  // a piece's own cost, in steps (query blocks)
  double min_gain;               // of the launch's time
};
FA2_TILE_ORDER_FN TailSplit tail_split(int64_t tiles, int query_blocks, int slots, const TailSplitTuning& tuning) {
  if (tiles <= 0 || slots <= 0 || query_blocks <= 0) return TailSplit{0, 1};
  const int64_t full_waves = tiles / slots;
  const int rest = int(tiles % slots);
  if (rest == 0) return TailSplit{0, 1};
  double best = 1.0;  // the last wave's time in tiles' times, unsplit
  int best_pieces = 1;
  for (int k = 2; k <= tuning.max_pieces && k * tuning.min_piece_blocks <= query_blocks; ++k) {
    const int64_t rounds = (int64_t(rest) * k + slots - 1) / slots;
    const double cost = double(rounds) / k + double(rounds) * tuning.piece_overhead_blocks / query_blocks;
    if (cost < best) best = cost, best_pieces = k;
  }
  if (best_pieces == 1 || (1.0 - best) < tuning.min_gain * double(full_waves + 1)) return TailSplit{0, 1};
  return TailSplit{rest, best_pieces};
}

// (compile-time check: every (head, block) pair exactly once, for a few shapes)
constexpr bool tile_order_is_a_permutation(int blocks, int heads, int tail) {
  bool seen[64] = {};
  const TileOrder order{blocks, heads, tail};
  for (int t = 0; t < blocks * heads; ++t) {
    int bh = -1, rank = -1;
    order.at(t, bh, rank);
    if (bh < 0 || bh >= heads || rank < 0 || rank >= blocks || seen[bh * blocks + rank]) return false;
    seen[bh * blocks + rank] = true;
  }
  return true;
}
static_assert(tile_order_is_a_permutation(5, 7, 0) && tile_order_is_a_permutation(5, 7, 3) &&
                  tile_order_is_a_permutation(5, 7, 7) && tile_order_is_a_permutation(8, 8, 1) &&
                  tile_order_is_a_permutation(1, 9, 9),
              "TileOrder::at visits every tile once");
static_assert(tile_order_tail(16, 128, 132) == 32 && tile_order_tail(64, 8, 132) == 8 &&
                  tile_order_tail(1, 4, 132) == 0 && tile_order_tail(67, 64, 132) == 0,
              "tile_order_tail");

}  // namespace fa2
