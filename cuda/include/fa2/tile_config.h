// Forward tile sizes: the one place they are chosen. Everything else (smem layout, fragment counts, grid)
// derives from FwdTileConfig. Plain constexpr C++, usable from host and device code.
#pragma once

// sm_90a instances load Q, K, V with the TMA (1) or with cp.async like the sm80 path (0); a build option
// (FA2_SM90_TMA) so that a wrong result can be pinned to the loads or to the products with one rebuild. Its default
// lives here, beside the tile shapes that depend on it (fwd_tile_shape_wgmma), for every file that includes them.
#ifndef FA2_SM90_TMA
#define FA2_SM90_TMA 1
#endif

namespace fa2 {

// Warp-specialized sm_90a kernels (the forward's, fwd_kernel.cuh, and the backward's, bwd_ws_kernel.cuh): a producer
// warpgroup first, its registers given back (setmaxnreg 24), and consumer warpgroups with the rest.
constexpr int kWsProducerThreads = 128, kWsProducerRegs = 24;
// setmaxnreg.inc blocks until the registers are free: the total must fit the pool the CTA was launched with,
// (64K / threads) rounded down to a multiple of 8 per thread (168 at 384 threads: 64512), not the whole 64K. The
// consumers get the rest, a multiple of 8, at most 240.
constexpr int ws_consumer_regs(int consumer_threads) {
  const int threads = kWsProducerThreads + consumer_threads;
  const int pool = threads * ((64 * 1024 / threads) & ~7);
  const int regs = ((pool - kWsProducerThreads * kWsProducerRegs) / consumer_threads) & ~7;
  return regs < 240 ? regs : 240;
}

struct FwdTileShape {
  int block_m;  // query rows per CTA (split across warps, 16 rows per m16 tile)
  int block_n;  // keys per K/V tile
  int warps;
  int stages;   // 2: K/V tile n-1 loads (cp.async) while tile n computes, one barrier per tile;
                // 1: FA-2's split (V[n] loads during S = Q K[n]^T, K[n-1] during softmax and P V[n])
};

// Starting points from FA-2 (sm80 instruction path). Shared memory per CTA (bytes, b16):
//   (block_m + stages * 2 * block_n) * headdim * 2
// d <= 64: 128x128, d 96/128: 128x64, both double-buffered (<= 96 KB, two CTAs per SM on A100/H100/H200);
// d >= 192: 64x64 single-buffered (72 / 96 KB, 2-3 CTAs per SM; two stages would leave one). Measured against
// torch's FA-2 forward: docs/tuning.md.
constexpr FwdTileShape fwd_tile_shape(int headdim) {
  return headdim <= 64    ? FwdTileShape{128, 128, 4, 2}
         : headdim <= 128 ? FwdTileShape{128, 64, 4, 2}
                          : FwdTileShape{64, 64, 4, 1};
}

// sm_90a (wgmma) variant of the same kernel: two warpgroups of 4 warps, each multiplying its own 64 query rows
// (wgmma's M), so every warp still owns 16 whole rows. 8 warps leave one CTA per SM; the shared memory allows a
// 128-key tile up to d 128 and double-buffered K/V everywhere: (128 + 2 * 2 * block_n) * d * 2 bytes = 160 KB at
// d 128, 192 KB at d 256. A key-row bias (padding masks) has its own lean variants (ScoreMode::kKeyBiasFold).
// d > 192: 80-key tiles (FlashAttention-3's d 256 tile): the per-tile work that does not grow with the keys (row max
// reductions, waits, the turn hand-over) spread over 25% more keys; S, P and O of 64 rows still fit a consumer's 240
// registers under ping-pong, and two stages fit (225 KB). d 256 keeps 64 keys in a build whose sm_90a kernels load
// with cp.async (FA2_SM90_TMA=0: passes of 32 rows, which 80 is not a multiple of).
// d 192: 96-key tiles (two stages: 193 KB; 96 rows split into the cp.async passes): faster than 64-key tiles under
// the overlap schedule, 0 spills. Measurements of both: docs/tuning.md.
constexpr int kFwdWgmmaKeysD256 = FA2_SM90_TMA ? 80 : 64;
constexpr FwdTileShape fwd_tile_shape_wgmma(int headdim) {
  return headdim <= 128 ? FwdTileShape{128, 128, 8, 2}
         : headdim <= 192 ? FwdTileShape{128, 96, 8, 2}
                          : FwdTileShape{128, kFwdWgmmaKeysD256, 8, 2};
}

// The warp-specialized sm_90a kernel without ping-pong at d <= 64 ("wide"): three consumer warpgroups, 192 query rows
// against each 128-key tile (FA-3's d 64 tile), one 512-thread CTA per SM: K/V are read by 1.5x the rows of the
// two-warpgroup tile, and the 160 registers a consumer gets are enough at d 64 (the pipelined kernel needs 128).
// Behind the pipelined kernel at short sequences (docs/tuning.md), so not a default; it serves d <= 64 when "ws"
// is forced (plain calls and key-row biases: fwd_launch_template.cuh). Its results are bitwise those of the
// pipelined kernel: the wider block only adds key tiles fully masked for some rows, which rescale by exactly 1
// (OnlineSoftmax keeps the factor 1 when the max does not move: before a row's first visible key it stays -inf, and
// O is 0) and add p = 0.
constexpr FwdTileShape fwd_tile_shape_wgmma_wide(int /*headdim: d <= 64*/) { return FwdTileShape{192, 128, 12, 2}; }
constexpr bool fwd_wide_warp_specialized(int headdim) { return headdim <= 64; }

// sm_90a with TMA loads: the mbarriers after the tiles: Q, a full and an empty one per K/V stage, Q's empty one, the
// persistent forward's next-tile slot (fwd/shared_storage.cuh, FwdBarriers::next_tile), and, for a two-stage ring with K and V on
// barriers of their own (kSplitKV), V's full and empty ones per stage: 8 x (3 + 4 x 2) = 88 bytes; then a head slot
// per consumer warp (FwdBarriers::tile_head, at most the wide tile's 12 warps): 88 + 48.
constexpr int kFwdMaxConsumerWarps = 12;
constexpr int kFwdSmemBarrierBytes = 88 + 4 * kFwdMaxConsumerWarps;
// A stage's key tile of a key-row bias (<= 4-byte elements), rounded up to 128 bytes: each is a TMA destination,
// which the hardware wants 128-byte aligned (80-key tiles: 320 -> 384). See FwdTileConfig::kSmemBiasTileBytes.
constexpr int fwd_bias_tile_bytes(int block_n) { return (block_n * 4 + 127) / 128 * 128; }
// Stages of the warp-specialized sm_90a forward's K/V ring: three where the shared memory allows, else two. With a
// producer running ahead, a third stage gives its loads a whole extra iteration (ping-pong releases a stage later
// than the plain order). d 128: 32 + 3 x (64 + 0.5) KB = 225.5 KB; d 256 (80-key tiles): two.
constexpr int fwd_ws_stages(FwdTileShape shape, int headdim) {
  const int q_bytes = shape.block_m * headdim * 2, kv_bytes = shape.block_n * headdim * 2;
  const int three_stages = q_bytes + 3 * (2 * kv_bytes + fwd_bias_tile_bytes(shape.block_n)) + kFwdSmemBarrierBytes;
  return three_stages <= 227 * 1024 ? 3 : 2;
}
// With a key-row bias (padding masks) the wide kernel is the default at d 64 from this many keys on (the launcher,
// fwd_launch_template.cuh; d 32 was not measured and keeps the pipelined kernel): it skips whole -inf key tiles, the
// pipelined kernel cannot (its 128 registers); from 8k keys it is the faster one (docs/tuning.md).
constexpr int kWideKeyBiasMinKeys = 8192;
constexpr bool fwd_wide_key_bias_by_default(int headdim, int seqlen_k) {
  return headdim == 64 && seqlen_k >= kWideKeyBiasMinKeys;
}

// How the sm_90a forward schedules its key loop (fwd_kernel.cuh):
//   kPipelined        two warpgroups, one thread issues the next K/V tile's TMA after a CTA barrier per tile;
//   kWarpSpecialized  a producer warpgroup streams K/V into a ring of mbarrier-guarded stages, no CTA barrier;
//   kPingpong         that, with the two consumer warpgroups taking turns issuing their products;
//   kOverlap          that, with P V of tile n-1 in flight during the softmax of tile n (intra-warpgroup overlap);
//   kPingpongOverlap  both (FA-3's d 128 schedule): each consumer warpgroup issues Q K^T of tile n and P V of tile
//                     n-1 in its turn, so the tensor cores alternate between the warpgroups' pairs of products while
//                     the other one runs its softmax.
// kAuto (a runtime setting only: set_sm90_schedule) means sm90_default_schedule(headdim, windowed).
enum class Sm90Schedule : int {
  kAuto = 0, kPipelined = 1, kWarpSpecialized = 2, kPingpong = 3, kOverlap = 4, kPingpongOverlap = 5
};
constexpr bool sm90_schedule_pingpong(Sm90Schedule s) {
  return s == Sm90Schedule::kPingpong || s == Sm90Schedule::kPingpongOverlap;
}
constexpr bool sm90_schedule_overlap(Sm90Schedule s) {
  return s == Sm90Schedule::kOverlap || s == Sm90Schedule::kPingpongOverlap;
}

// The schedule each headdim runs by default, the fastest measured on the H200 (docs/tuning.md): d <= 96 the
// pipelined kernel (two CTAs per SM at d 64; at d 96 and 32 the others were within noise); d 128 the overlap alone
// where no causal mask or window bounds the keys (`windowed` false: every query block sees every key, the persistent
// kernel's tiles all of one length) and ping-pong-overlap otherwise (the overlap alone lost there); d 192 the
// overlap; d 256 ping-pong-overlap (with K and V on barriers of their own: fwd/kernel_traits.cuh, kSplitKV).
constexpr Sm90Schedule sm90_default_schedule(int headdim, bool windowed) {
  return headdim <= 96    ? Sm90Schedule::kPipelined
         : headdim <= 128 ? (windowed ? Sm90Schedule::kPingpongOverlap : Sm90Schedule::kOverlap)
         : headdim <= 192 ? Sm90Schedule::kOverlap
                          : Sm90Schedule::kPingpongOverlap;
}
// d 64 from this many keys on: the wide (192-row) warp-specialized kernel with P V overlapping the softmax beats the
// pipelined default (its K/V traffic per query row is 2/3 of a 128-row tile's, which pays once the key loop is long;
// below it the pipelined kernel's two CTAs per SM win); with a causal mask or window from twice as many (the
// shorter diagonal blocks). Measured on the H100 (docs/tuning.md).
constexpr int kWideOverlapMinKeys = 8192;
constexpr Sm90Schedule sm90_schedule_for_keys(int headdim, bool windowed, int seqlen_k) {
  return headdim == 64 && seqlen_k >= (windowed ? 2 : 1) * kWideOverlapMinKeys ? Sm90Schedule::kOverlap
                                                                              : sm90_default_schedule(headdim, windowed);
}
// The schedule of the warp-specialized key-row bias kernel (padding masks; fwd_launch_template.cuh) where the
// default one is warp-specialized: the default without ping-pong, whose warpgroups' turns count key tiles, so that
// all -inf key tiles can be skipped (fwd/kernel_traits.cuh, kSkipMaskedTiles); and without the overlap where the ring has
// two stages: the staged-bias kernels keep K, V and the bias tile on one barrier pair (a skipped tile releases all
// three), which two stages starve under the overlap schedules (see kSplitKV).
constexpr Sm90Schedule sm90_key_bias_schedule(int headdim) {
  const Sm90Schedule schedule = sm90_default_schedule(headdim, /*windowed=*/true);
  const bool two_stages = fwd_ws_stages(fwd_tile_shape_wgmma(headdim), headdim) == 2;
  return schedule == Sm90Schedule::kPingpong || (sm90_schedule_overlap(schedule) && two_stages)
             ? Sm90Schedule::kWarpSpecialized
         : schedule == Sm90Schedule::kPingpongOverlap ? Sm90Schedule::kOverlap
                                                      : schedule;
}

// Whether the warp-specialized forward runs persistent by default (fwd_kernel.cuh; without a causal mask or window:
// fwd_launch_template.cuh). d 128 gains; at d 256 its O (64 x 256 a warpgroup) stored straight from the registers
// costs more than the tile switch saves; d 64 (wide), 96 and 192 were not measured (docs/tuning.md).
constexpr bool fwd_persistent_headdim(int headdim) { return headdim > 96 && headdim <= 128; }
// Whether the persistent forward's plain overlap kernel (d 128's default without a causal mask or window) also comes
// in clusters of two CTAs that share each K/V tile's L2 read (fwd/tile_scheduler.cuh, kCluster; TMA multicast, each CTA
// loading half the 64-column blocks: an even number of them; FA-3 runs d >= 128 non-causal so). The launcher takes it
// wherever a call allows (fwd_launch_template.cuh); out is bitwise that of the cluster-free kernel, and the halved L2
// reads gain (docs/tuning.md).
// (128: the persistent headdims' one instance, fwd_persistent_headdim, whose two column blocks split between the CTAs)
constexpr bool fwd_cluster_headdim(int headdim) { return headdim == 128; }

// The names set_sm90_schedule / FA2_SM90_SCHEDULE take (index = the enum's value).
constexpr const char* kSm90ScheduleNames[] = {"auto", "pipelined", "ws", "pingpong", "overlap", "pingpong-overlap"};
constexpr const char* sm90_schedule_name(Sm90Schedule s) { return kSm90ScheduleNames[static_cast<int>(s)]; }

template <int kHeadDim_, bool kWgmma_ = false, bool kWide_ = false>
struct FwdTileConfig {
  static constexpr bool kWgmma = kWgmma_;  // sm_90a: S = Q K^T and O += P V by wgmma (one warpgroup per 64 rows)
  static constexpr bool kWide = kWide_;    // the wide warp-specialized shape (TMA loads only)
  static constexpr FwdTileShape kShape = kWide     ? fwd_tile_shape_wgmma_wide(kHeadDim_)
                                         : kWgmma ? fwd_tile_shape_wgmma(kHeadDim_)
                                                  : fwd_tile_shape(kHeadDim_);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kShape.block_m;
  static constexpr int kBlockN = kShape.block_n;
  static constexpr int kNWarps = kShape.warps;
  static constexpr int kStages = kShape.stages;
  static constexpr int kNThreads = kNWarps * 32;
  // CTAs per SM the register allocation must allow (__launch_bounds__'s minimum), for the lean variants (the plain
  // one and a key-row bias): sm_90a at d <= 64 asks for 2, i.e. <= 128 registers a thread, which two CTAs' 82 KB of
  // shared memory allow (unbounded, the plain variant took 130 registers, one CTA per SM, and ran slower:
  // docs/tuning.md). 0 (everything else) leaves the compiler free: an explicit 1 is not the same (the plain
  // variant then took 152).
  static constexpr int min_blocks_per_sm(bool lean) { return lean && kWgmma && kHeadDim_ <= 64 ? 2 : 0; }

  static constexpr int kRowsPerWarp = kBlockM / kNWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;   // m16 tiles per warp
  static constexpr int kNTiles = kBlockN / 8;         // n8 tiles of S per row tile
  static constexpr int kDTiles = kHeadDim / 8;        // n8 tiles of O per row tile
  // Shared-memory tiles are stored in column blocks of 64 b16 (128-byte swizzle) when the headdim allows,
  // else 32 (64-byte swizzle; d = 32, 96): see SwizzledTile.
  static constexpr int kSmemBlockCols = kHeadDim % 64 == 0 ? 64 : 32;

  static constexpr int kSmemQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kSmemKVBytes = kBlockN * kHeadDim * 2;  // one K (or V) tile
  // sm_90a with TMA loads: the mbarriers (and the next-tile slot) after the tiles (kFwdSmemBarrierBytes)
  static constexpr int kSmemBarrierBytes = kWgmma ? kFwdSmemBarrierBytes : 0;
  // sm_90a: a key-row bias (padding masks) travels with its K/V stage, one key tile of it (<= 4-byte elements), so
  // that the products never wait on a global load of it (fwd/kernel_traits.cuh, kStagedBias; fwd_bias_tile_bytes)
  static constexpr int kSmemBiasTileBytes = kWgmma ? fwd_bias_tile_bytes(kBlockN) : 0;
  // the pipelined kernel also keeps each stage's bias tile folded to fp32 once for the CTA (fwd/mainloop_sm90_pipelined.cuh)
  static constexpr int kSmemBiasFoldedBytes = kSmemBiasTileBytes;
  static constexpr int kSmemBytes =
      kSmemQBytes + kStages * (2 * kSmemKVBytes + kSmemBiasTileBytes + kSmemBiasFoldedBytes) + kSmemBarrierBytes;
  // The warp-specialized sm_90a kernel's (fwd_kernel.cuh) K/V ring (fwd_ws_stages)
  static constexpr int kWsStages = kWgmma ? fwd_ws_stages(kShape, kHeadDim) : 2;
  static constexpr int kSmemBytesWs = kSmemQBytes + kWsStages * (2 * kSmemKVBytes + kSmemBiasTileBytes) +
                                      kSmemBarrierBytes;

  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "instantiated headdims are multiples of 32, <= 256");
  static_assert(kBlockM % (16 * kNWarps) == 0, "each warp owns whole m16 tiles");
  static_assert(kBlockN % 16 == 0, "P V consumes keys 16 at a time; S is computed in pairs of n8 tiles");
  static_assert(!kWgmma || (kNWarps % 4 == 0 && kBlockM == 64 * (kNWarps / 4) && kMTiles == 1),
                "wgmma: one warpgroup per 64 query rows, 16 rows per warp");
  static_assert(kStages == 1 || kStages == 2, "single- or double-buffered K/V");
  static_assert((kBlockM * kHeadDim / 8) % kNThreads == 0, "Q tile splits evenly into 16-byte cp.async");
  static_assert(kWide || (kBlockN * kHeadDim / 8) % kNThreads == 0, "K/V tile splits evenly into 16-byte cp.async");
  static_assert(!kWide || kWgmma, "the wide shape is a warp-specialized wgmma one");
  static_assert(kSmemBytes <= 227 * 1024, "fits the opt-in shared memory of sm80/sm90");
  // fp32 accumulator registers per thread: O and S; beyond ~200 the kernel spills.
  static_assert(kMTiles * (kDTiles + kNTiles) * 4 <= 192, "accumulators must stay in registers");
};

}  // namespace fa2
