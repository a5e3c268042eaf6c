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
// d >= 192: 64x64 single-buffered (72 / 96 KB, 2-3 CTAs per SM; two stages would leave one).
// Measured on the H200 (2026-11-29, bf16, 16k tokens, hidden 2048, S 1k..16k): d 64 1.08-1.15x and d 128
// 1.00-1.06x torch's FA-2 forward, causal and not (scripts/cuda_fwd_bench.py).
constexpr FwdTileShape fwd_tile_shape(int headdim) {
  return headdim <= 64    ? FwdTileShape{128, 128, 4, 2}
         : headdim <= 128 ? FwdTileShape{128, 64, 4, 2}
                          : FwdTileShape{64, 64, 4, 1};
}

// sm_90a (wgmma) variant of the same kernel: two warpgroups of 4 warps, each multiplying its own 64 query rows
// (wgmma's M), so every warp still owns 16 whole rows. 8 warps leave one CTA per SM; the shared memory allows a
// 128-key tile up to d 128 and double-buffered K/V everywhere: (128 + 2 * 2 * block_n) * d * 2 bytes = 160 KB at
// d 128, 192 KB at d 256. Measured on the H200 (2026-11-30, bf16/fp16, 16k tokens, hidden 2048, S 1k..16k, with
// TMA loads): forward 1.35-2.1x torch's FA-2, 1.0-1.10x cuDNN at d 64, 0.72-0.96x at d 128 and 256
// (benchmarks/results/attention_h200-20261130-sm90a.json). At d 64 the plain variant takes 128 registers (two CTAs
// per SM), the bias-fold variants 155-192 (one CTA per SM: with a padding bias 0.55-0.6x of the plain speed). The
// registers went to the loads of a bias that varies along queries; a key-row bias (padding masks) has its own
// variant, held to 128 registers (min_blocks_per_sm): 0.68-0.71x of the plain speed; with its bias tile loaded by
// the TMA with K/V and folded to fp32 once per CTA, 0.80-0.89x (d 128: 0.83-0.94x, d 256: 0.92-0.96x of the
// warp-specialized defaults; 2026-11-30, S 1k-16k, benchmarks/results/attention_h200-20261130-ws.json). With tiles
// of all-0 bias run unbiased and (above d 64) all -inf ones skipped: d 64 0.79-0.87x, d 128 0.99-1.08x, d 256
// 1.02-1.10x (bf16, last 10% of keys padded; attention_h200-20261130-grid-wgmma-bwd.json). At d 64, with the softmax's
// heavy-row branch only on tiles that hold such a bias and zero-bias tiles multiplied as plain ones (fwd_kernel.cuh),
// and the wide kernel from 8k keys (kWideKeyBiasMinKeys): 0.86-0.96x from S 1k, 0.95-1.00x from 8k
// (attention_h200-20261130-final.json, -d64pad-default.json).
// d > 192: 80-key tiles (FlashAttention-3's d 256 tile): the per-tile work that does not grow with the keys (row max
// reductions, waits, the turn hand-over) spread over 25% more keys; S (40), P and O (128) of 64 rows still fit a
// consumer's 240 registers under ping-pong (0 spills; the overlap schedules, which keep P_prev too, spill 12-16 B), and
// two stages fit: 64 + 2 x 80 KB + bias and barriers = 225 KB. d 256 keeps 64 keys in a build whose sm_90a kernels
// load with cp.async (FA2_SM90_TMA=0: passes of 32 rows, which 80 is not a multiple of).
// d 192: 96-key tiles (two stages: 48 + 2 x 72 KB + bias and barriers = 193 KB; 96 rows split into the cp.async
// passes) under the overlap schedule, against 64-key tiles warp-specialized (H200, bf16, scripts/fwd_variant_bench.cu,
// 2 rounds, variants_h200-20261201-fwd-d192-96keys-2.json): +4.2 / +5.8 / +7.4 / +9.6% at S 1k / 2k / 4k / 16k
// non-causal (683 TFLOP/s at 16k), +2.1 / +8.5 / +9.0 / +12.7% causal; with a padding bias (warp-specialized, see
// sm90_key_bias_schedule) +4.8 / +3.7 / +5.6 / +9.2%, causal +0.8..+5.7%. 0 spills.
constexpr int kFwdWgmmaKeysD256 = FA2_SM90_TMA ? 80 : 64;
constexpr FwdTileShape fwd_tile_shape_wgmma(int headdim) {
  return headdim <= 128 ? FwdTileShape{128, 128, 8, 2}
         : headdim <= 192 ? FwdTileShape{128, 96, 8, 2}
                          : FwdTileShape{128, kFwdWgmmaKeysD256, 8, 2};
}

// The warp-specialized sm_90a kernel without ping-pong at d <= 64 ("wide"): three consumer warpgroups, 192 query rows
// against each 128-key tile (FA-3's d 64 tile), one 512-thread CTA per SM: K/V are read by 1.5x the rows of the
// two-warpgroup tile, and the 160 registers a consumer gets are enough at d 64 (the pipelined kernel needs 128).
// Measured (bf16, S 2k-16k, attention_h200-20261130-wide64.json): 0.79-1.05x the pipelined kernel (behind at 2k,
// ahead at 16k non-causal), so not a default; it serves d <= 64 when "ws" is forced (plain calls and key-row biases:
// fwd_launch_template.cuh). The schedules table below is of the two-warpgroup version. Its results are bitwise those
// of the pipelined kernel: the wider block only adds key tiles fully masked for some rows, which rescale by exactly 1
// (OnlineSoftmax keeps the factor 1 when the max does not move: before a row's first visible key it stays -inf, and
// O is 0) and add p = 0.
constexpr FwdTileShape fwd_tile_shape_wgmma_wide(int /*headdim: d <= 64*/) { return FwdTileShape{192, 128, 12, 2}; }
constexpr bool fwd_wide_warp_specialized(int headdim) { return headdim <= 64; }

// sm_90a with TMA loads: the mbarriers after the tiles: Q, a full and an empty one per K/V stage, Q's empty one, the
// persistent forward's next-tile slot (fwd_kernel.cuh, tile_slot), and, for a two-stage ring with K and V on
// barriers of their own (kSplitKV), V's full and empty ones per stage: 8 x (3 + 4 x 2) = 88 bytes.
constexpr int kFwdSmemBarrierBytes = 88;
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
// pipelined kernel cannot (its 128 registers). Measured
// (H200, 16k tokens, last 10% of keys padded, attention_h200-20261130-d64pad.json), wide / pipelined with the mask:
// bf16 0.78 at S 1k, 1.01 at 4k, 1.10 at 8k, 1.08 at 16k; fp16 0.76 / 1.04 / 1.09 / 1.07.
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

// The schedule each headdim runs by default. Measured on the H200 (2026-11-30, bf16, 16k tokens, hidden 2048,
// S 2k/8k/16k, causal and not; benchmarks/results/attention_h200-20261130-schedules.json), forward TFLOP/s relative to
// kPipelined: d 64 warp-specialized 0.72-0.80, ping-pong 0.58-0.63, overlap 0.68-0.74 (one 384-thread CTA per SM
// where the pipelined kernel runs two); d 128 warp-specialized 1.06-1.12, ping-pong 0.87-0.94, overlap 1.12-1.20;
// d 256 warp-specialized 1.10-1.14, ping-pong 0.85-0.93, overlap 0.65-0.83 (two stages starved: see d 256 below).
// A second run (attention_h200-20261130-schedules2.json, S 2k/16k): d 96 warp-specialized 1.01-1.03, overlap
// 1.00-1.03 (within the run-to-run noise: d 96 stays pipelined, like d 32); d 192 warp-specialized 1.02-1.13,
// overlap 1.02-1.11.
// d 128, both (kPingpongOverlap) against overlap alone (2026-11-30, bf16, non-causal, scripts/fwd_variant_bench.cu,
// ABAB, two rounds agree within 1.5%): 1.03 / 1.02 / 1.02 / 1.01 at S 1k / 2k / 4k / 16k; with torch's benchmark
// (attention_h200-20261130-ppov.json, causal and not, 1k-16k) 0.97-1.05, mostly ahead. (At d 256 it was 0.67x the
// warp-specialized kernel then: two stages starved, below.)
// d 256 with 80-key tiles (fwd_tile_shape_wgmma) and ping-pong, against the warp-specialized kernel with 64-key tiles
// (H200, bf16, scripts/fwd_variant_bench.cu, 2 rounds, variants_h200-20261130-d256-80keys.json): +1.0 / +2.9 / +3.5 /
// +6.3% at S 1k / 2k / 4k / 16k non-causal, -1.7 / +1.8 / +2.3 / +4.2% causal; ping-pong over warp-specialized with
// 80-key tiles +0.6 / +3.2 / +3.4% at S 1k / 4k / 16k (causal +1.2 / +2.3 / +2.3%).
// d 256 (two K/V stages) with K and V on barriers of their own (fwd_kernel.cuh, kSplitKV; before, the overlap
// schedules held a stage until its P V, issued behind the next tile's Q K^T, completed, so the producer had nothing
// to load ahead: overlap 0.63-0.78x ping-pong), against ping-pong (H200, bf16, scripts/fwd_variant_bench.cu, 2 rounds,
// variants_h200-20261201-fwd-d256-split-kv.json): overlap +6.6 / +8.7 / +8.0 / +7.8% at S 1k / 2k / 4k / 16k
// non-causal (742 TFLOP/s at 16k), +4.0 / +5.9 / +7.5 / +8.5% causal; ping-pong-overlap +6.9 / +9.6 / +6.5 / +5.3%,
// causal +5.8 / +6.2 / +6.9 / +9.3%.
// With the previous P V's wait behind the softmax (fwd_kernel.cuh, d9f28b3), the same forced in one binary (H200,
// bf16, scripts/fwd_variant_bench.cu, 2 rounds, variants_h200-20261201-fwd-schedules-after-pv-wait.json):
// d 256 ping-pong-overlap over overlap +1.4 / +1.8 / +0.1% at S 1k / 4k / 16k (causal +1.0 / +0.6 / +0.2%), so d 256
// takes it; d 192 +1.3 / +0.5 / -1.9% (causal +2.4 / +0.6 / -0.2%) keeps overlap; d 128 overlap over
// ping-pong-overlap +1.2 / +0.5 / +0.3% at S 2k / 4k / 16k but -9.3 / -5.9 / -2.7% causal, plain ping-pong -8..-12%.
// So d 128 takes the overlap alone where no causal mask or window bounds the keys (`windowed` false: every query
// block sees every key, the persistent kernel's tiles all of one length) and ping-pong-overlap otherwise. Measured
// again after the causal tile order (H200, bf16, scripts/fwd_variant_bench.cu, one binary, FA2_SM90_SCHEDULE forced,
// 3 rounds, variants_h200-20261202-fwd-schedules-d128-d256.json; means, ping-pong-overlap's 6 runs as "auto" and
// forced): non-causal overlap over ping-pong-overlap +0.3 / +1.3 / +0.2 / +0.1 / +0.3% at S 1k / 2k / 4k / 8k / 16k
// (at 2k 592-602 TFLOP/s against 587-593), causal -12.3 / -8.8 / -5.3 / -3.2 / -2.2%; d 256 overlap -1.4..+0.2%
// non-causal, -0.3..-2.4% causal (d 256 keeps ping-pong-overlap throughout).
constexpr Sm90Schedule sm90_default_schedule(int headdim, bool windowed) {
  return headdim <= 96    ? Sm90Schedule::kPipelined
         : headdim <= 128 ? (windowed ? Sm90Schedule::kPingpongOverlap : Sm90Schedule::kOverlap)
         : headdim <= 192 ? Sm90Schedule::kOverlap
                          : Sm90Schedule::kPingpongOverlap;
}
// The schedule of the warp-specialized key-row bias kernel (padding masks; fwd_launch_template.cuh) where the
// default one is warp-specialized: the default without ping-pong, whose warpgroups' turns count key tiles, so that
// all -inf key tiles can be skipped (fwd_kernel.cuh, kSkipMaskedTiles); and without the overlap where the ring has
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
// fwd_launch_template.cuh). Measured on the H200 (2026-11-30, bf16, non-causal, scripts/fwd_variant_bench.cu, two
// rounds, benchmarks/results/variants_h200-20261130-persistent*.json): d 128 against one CTA per tile of the same
// build 1.02 / 1.00-1.03 at S 1k / 2k; against the kernels of 136cf1f (before the tile loop) 0.99-1.01 / 0.98-1.00 /
// 0.97-1.01 / 0.98-1.00 at S 1k / 2k / 4k / 16k, with a padding mask 1.02-1.03 / 1.01-1.04 / 1.01-1.02 / 1.00-1.01.
// d 256 (at d6a0da6) 0.94 / 0.98 / 0.99 at S 1k / 4k / 16k (padding 0.93-0.95 / 0.96-0.97 / 0.96): its O (64 x 256
// a warpgroup) stored straight from the registers costs more than the tile switch saves. d 64 (wide), 96 and 192
// were not measured.
constexpr bool fwd_persistent_headdim(int headdim) { return headdim > 96 && headdim <= 128; }
// Whether the persistent forward's plain overlap kernel (d 128's default without a causal mask or window) also comes
// in clusters of two CTAs that share each K/V tile's L2 read (fwd_kernel.cuh, kCluster; TMA multicast, each CTA
// loading half the 64-column blocks: an even number of them; FA-3 runs d >= 128 non-causal so). The launcher takes it
// wherever a call allows (fwd_launch_template.cuh). Measured on the H200 (2026-12-04, d 128, non-causal, no mask):
// harness, bf16, 2 rounds (variants_h200-20261204-fwd-d128-cluster.json): +0.6 / +2.0..+2.4 / +2.1..+2.5 /
// +2.6..+4.4% at S 2k / 4k / 8k / 16k over the cluster-free kernel, whose out it matches bitwise; the cluster
// launch alone (each CTA loading its own K/V) -1..-2.5%, so the halved L2 reads gain 3-5%.
// benchmarks/bench_attention.py, 5 rounds of separate bursts with fa2-nocluster beside
// (attention_h200-20261204-cluster-bursts.json): forward
// +0.0..+2.1% (bf16 / fp16 alike), forward+backward +0.0..+1.3%; with the two interleaved call by call
// (attention_h200-20261204-cluster-interleaved.json, 3 rounds) -0.1..+1.0%.
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
  // shared memory allow (ptxas, bf16, bias staged and folded in shared memory: 128 registers, 48 bytes spilled for a
  // bool bias, 72-76 for float ones, mostly around the loop's setup; unbounded: 129-141. The plain variant: 126, 0
  // spilled; unbounded it took 128 until the tile order's tail (tile_order.h) made it 130, one CTA per SM: 0.73-0.80x).
  // 0 (everything else) leaves the compiler free: an explicit 1 is not the same (the plain variant then took 152).
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
  // that the products never wait on a global load of it (fwd_kernel.cuh, kStagedBias; fwd_bias_tile_bytes)
  static constexpr int kSmemBiasTileBytes = kWgmma ? fwd_bias_tile_bytes(kBlockN) : 0;
  // the pipelined kernel also keeps each stage's bias tile folded to fp32 once for the CTA (fwd_kernel.cuh)
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
