// The decode kernel's plan: whether it takes a call, with which instance, how many rows per CTA and how many splits
// of the KV length, and the fp32 scratch the splits need. Host-only C++, sized from shapes alone (no host sync, so
// CUDA-graph capture sees the same plan every replay).
#pragma once
#include <cstdint>

#include "fa2/decode/params.h"
#include "fa2/plan.h"  // DeviceDesc, InstanceDesc

namespace fa2 {

struct DecodePlan {
  const char* decline = nullptr;  // why the decode kernel does not take the call (the caller falls back); else null
  int instance = -1;              // index into the build's decode instances
  int warps_m = 1;                // warps over query rows (16 rows each); 4 / warps_m warps split each key tile
  int row_blocks = 1;             // CTAs per (split, kv head, batch) over the kv head's query rows
  int num_splits = 1;             // CTAs per (batch, kv head) over the KV length; > 1: partials + combine kernel
  int smem_bytes = 0;
  int64_t workspace_floats = 0;   // DecodeParams::workspace's size (0 with one split)
  // the combine kernel launched as a programmatic dependent (sm90): it starts while the split CTAs finish their
  // merge and waits for their memory in-kernel, instead of a full launch gap after the last of them
  bool programmatic_combine = false;
};

// requested_splits: 0 = chosen here from the SM count and the cache's capacity, 1 = no split, n = n (clamped to the
// key tiles of the capacity and decode::kMaxSplits).
DecodePlan plan_decode(const DecodeParams& params, const DeviceDesc& device, const InstanceDesc* instances,
                       int num_instances, int requested_splits);

}  // namespace fa2
