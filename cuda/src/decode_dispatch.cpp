// The decode kernel's plan and entry point; the instance table comes from the generated fa2_kernel_instances.h.
#include <cstdint>

#include "dispatch.h"
#include "fa2/decode/launch.h"
#include "fa2/decode/shape.h"
#include "fa2/decode/tile_config.h"
#include "fa2/launch.h"  // current_device
#include "fa2_kernel_instances.h"

namespace fa2 {
namespace {
using DecodeInstanceFn = const char* (*)(const DecodePlan&, const DecodeParams&, cudaStream_t);
const InstanceDesc kDecodeInstances[] = {FA2_DECODE_INSTANCES(FA2_INSTANCE_DESC)};
const DecodeInstanceFn kDecodeInstanceFns[] = {FA2_DECODE_INSTANCES(FA2_INSTANCE_FN)};
constexpr int kNumDecodeInstances = sizeof(kDecodeInstances) / sizeof(kDecodeInstances[0]);

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// What the kernel's 16-byte copies and stores need of the tensors; nullptr when all holds.
const char* layout_decline(const DecodeParams& p) {
  if (p.headdim % 8 != 0) return "headdim is not a multiple of 8";
  if (!aligned16(p.q) || !aligned16(p.k_cache) || !aligned16(p.v_cache) || !aligned16(p.out)) {
    return "a tensor is not 16-byte aligned";
  }
  const int64_t strides[] = {p.q_batch_stride,   p.q_row_stride,   p.q_head_stride,   p.k_batch_stride,
                             p.k_row_stride,     p.k_head_stride,  p.v_batch_stride,  p.v_row_stride,
                             p.v_head_stride,    p.out_batch_stride, p.out_row_stride, p.out_head_stride};
  for (const int64_t s : strides) {
    if (s % 8 != 0) return "a stride is not a multiple of 8 elements";
  }
  return nullptr;
}

}  // namespace

DecodePlan plan_decode(const DecodeParams& p, const DeviceDesc& device, const InstanceDesc* instances,
                       int num_instances, int requested_splits) {
  DecodePlan plan;
  if (p.batch <= 0 || p.seqlen_q <= 0 || p.nheads <= 0 || p.nheads_k <= 0 || p.nheads % p.nheads_k != 0) {
    plan.decline = "empty or inconsistent sizes";
    return plan;
  }
  if (p.batch > 65535 || p.nheads_k > 65535) {  // grid (splits, kv heads, batch): y and z stop at 65535
    plan.decline = "batch or nheads_k above 65535";
    return plan;
  }
  const decode::DecodeShape shape =
      decode::decode_shape(int64_t(p.seqlen_q) * (p.nheads / p.nheads_k), p.headdim_rounded);
  if (shape.decline != nullptr) {
    plan.decline = shape.decline;
    return plan;
  }
  if (const char* why = layout_decline(p)) {
    plan.decline = why;
    return plan;
  }
  if (p.cache_entries <= 0 || (p.block_table == nullptr && p.cache_batch_idx == nullptr && p.cache_entries < p.batch)) {
    plan.decline = "a cache with fewer rows than the batch (or no blocks)";
    return plan;
  }
  if (p.block_table != nullptr && p.cache_batch_idx != nullptr) {
    plan.decline = "cache_batch_idx with a paged cache";
    return plan;
  }
  // -- the instance: this dtype and headdim, SASS that runs on this device (same major, not newer), newest arch
  const InstanceDesc* best = nullptr;
  for (int i = 0; i < num_instances; ++i) {
    const InstanceDesc& e = instances[i];
    const bool runs_here = e.arch / 10 == device.cc / 10 && e.arch <= device.cc &&
                           (!e.arch_specific || e.arch == device.cc);
    if (e.dtype != p.dtype || e.headdim != p.headdim_rounded || !runs_here) continue;
    if (best == nullptr || e.arch > best->arch) {
      best = &e;
      plan.instance = i;
    }
  }
  if (best == nullptr) {
    plan.decline = "no decode instance for this dtype, headdim and GPU in this build";
    return plan;
  }
  plan.row_blocks = shape.row_blocks, plan.warps_m = shape.warps_m, plan.smem_bytes = shape.smem_bytes;
  if (device.smem_optin > 0 && plan.smem_bytes > device.smem_optin) {
    plan.decline = "the decode tiles need more shared memory than this GPU has";
    return plan;
  }
  const int block_n = decode::decode_tile_config(p.headdim_rounded).block_n;
  plan.num_splits = decode::choose_splits(int64_t(p.batch) * p.nheads_k * plan.row_blocks, p.capacity, block_n,
                                          plan.smem_bytes, device.sm_count, device.smem_optin, requested_splits);
  if (plan.num_splits > 1) {
    plan.programmatic_combine = device.cc >= 90;
    plan.workspace_floats = int64_t(plan.num_splits) * p.batch * p.nheads * p.seqlen_q * (p.headdim + 1);
  }
  return plan;
}

int decode_headdim_rounded(int headdim) {
  return plan_rounded_headdim(kDecodeInstances, kNumDecodeInstances, headdim);
}

DecodePlan plan_decode_call(const DecodeParams& params, int requested_splits) {
  return plan_decode(params, current_device(), kDecodeInstances, kNumDecodeInstances, requested_splits);
}

const char* run_decode(const DecodePlan& plan, const DecodeParams& params, cudaStream_t stream) {
  if (plan.decline != nullptr) return plan.decline;
  if (plan.instance < 0 || plan.instance >= kNumDecodeInstances) return "fa2: a decode plan without an instance";
  if (plan.num_splits > 1 && params.workspace == nullptr) return "fa2: a split decode plan without its workspace";
  return kDecodeInstanceFns[plan.instance](plan, params, stream);
}

}  // namespace fa2
