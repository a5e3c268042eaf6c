// The decode kernel's tile sizes, in one place (host and device): keys per pipeline stage, stages, and how the
// four warps split the query rows and the keys of a tile.
#pragma once

namespace fa2 {
namespace decode {

constexpr int kThreads = 128;  // four warps
// Query rows per CTA go up to 16 x kMaxWarpsM: all the rows of one kv head (seqlen_q x nheads / nheads_k) where they
// fit, else row blocks of kMaxRowsPerCta, each CTA reading the kv head's keys again (from L2 where they stay), up to
// kMaxRowBlocks of them; beyond that the dense kernels' larger query tiles serve the call better.
constexpr int kMaxWarpsM = 4;
constexpr int kMaxRowsPerCta = 16 * kMaxWarpsM;
constexpr int kMaxRowBlocks = 4;
// fa2.attention's CUDA forward hands a call to the decode kernel up to this many query rows per kv head (option
// dense_decode): one row block, so each CTA reads its kv head's keys once, where the dense grid would give every query
// head's few rows a 128-row tile of its own and read the keys once per query head.
constexpr int kMaxRowsForDenseCalls = kMaxRowsPerCta;

struct DecodeTileConfig {
  int block_n;  // keys per stage (K and V tiles of block_n rows)
  int stages;   // cp.async ring depth: stages - 1 tiles in flight while one is computed
};

// 16-32 KB of K + V per stage (64 KB at d > 128), two stages in flight per CTA and two to four CTAs an SM: ~64-128 KB
// loading per SM, above what an H100 SM needs in flight for its share of HBM bandwidth (~25 KB at 3.35 TB/s x ~1 us
// / 132 SMs). d 64 takes 64 keys a stage (4 CTAs an SM) rather than 128 (2): short caches (a few tiles per CTA) then
// overlap more CTAs' first loads (the block-table reads of a paged cache among them).
// block_n / (4 / warps_m) keys per warp must stay a multiple of 16 (P is the A operand of a k16 step).
constexpr DecodeTileConfig decode_tile_config(int headdim) {
  return headdim <= 32 ? DecodeTileConfig{128, 3} : headdim <= 128 ? DecodeTileConfig{64, 3} : DecodeTileConfig{64, 2};
}

// Shared memory columns per swizzle block (ptx.cuh, SwizzledTile): 64 where the headdim allows, else 32 (d 96).
constexpr int smem_block_cols(int headdim) { return headdim % 64 == 0 ? 64 : 32; }

// Warps over query rows (each 16 rows) for a CTA of `rows` rows; the other warps of four split each key tile.
constexpr int warps_m_for_rows(int rows) { return rows <= 16 ? 1 : rows <= 32 ? 2 : 4; }

// Bytes of one padded fp32 row of the warps' O partials in the final merge (+8 floats: the C-fragment stores of
// a quad's 8 rows then fall in distinct banks).
constexpr int merge_row_floats(int headdim) { return headdim + 8; }

// Dynamic shared memory of an instance: Q tile, the K/V ring, and (reusing the ring) the merge of the warps' partials.
constexpr int decode_smem_bytes(int headdim, int warps_m) {
  const DecodeTileConfig cfg = decode_tile_config(headdim);
  const int q_bytes = 16 * warps_m * headdim * 2;
  const int ring_bytes = cfg.stages * 2 * cfg.block_n * headdim * 2;
  const int warps_n = 4 / warps_m;
  const int merge_bytes = (warps_n * 16 * warps_m * merge_row_floats(headdim) + 2 * warps_n * 16 * warps_m) * 4;
  const int q_aligned = (q_bytes + 1023) / 1024 * 1024;
  return q_aligned + (ring_bytes > merge_bytes ? ring_bytes : merge_bytes);
}

// Splits of the KV length at most (workspace and combine cost grow with it).
constexpr int kMaxSplits = 128;
// CTAs an SM that the split count aims to fill, where shared memory would allow more: a third and fourth CTA added
// no bandwidth and cost their splits' fixed work (H100, d 64, batch 1, 8 kv heads: 8k keys 11.7 us at 2 CTAs an SM
// against 15.9 at 4; 128k keys 96 against 106; at 1 CTA an SM 12.8 and 106).
constexpr int kSplitCtasPerSm = 2;

}  // namespace decode
}  // namespace fa2
