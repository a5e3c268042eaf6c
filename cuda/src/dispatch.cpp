// What every direction's dispatch shares: the current device as the plans see it, the process's development
// options, and the cluster occupancy query. (The kernel harness scripts/dev/fwd_variant_bench.cu links this file with
// plan.cpp and dev_options.cpp.)
#include "dispatch.h"

#include <atomic>
#include <string>

#include "fa2/bwd_launch.h"
#include "fa2/launch.h"

namespace fa2 {

namespace {
constexpr int kMaxDevices = 64;
// A value of the current device that stays fixed while the process runs, cached per device ordinal in the caller's
// slots (off the launch path after the first query; each slot holds the value + 1, 0 = not asked yet; racing first
// calls store the same value): query(ordinal, &value) reads it, false when CUDA cannot say (then nothing is cached
// and -1 is returned). *device: the ordinal.
template <class Query>
int cached_per_device(std::atomic<int> (&slots)[kMaxDevices], int* device, Query query) {
  if (cudaGetDevice(device) != cudaSuccess) return -1;
  const bool cacheable = *device >= 0 && *device < kMaxDevices;
  const int stored = cacheable ? slots[*device].load(std::memory_order_relaxed) : 0;
  if (stored > 0) return stored - 1;
  int value = 0;
  if (!query(*device, &value) || value < 0) return -1;
  if (cacheable) slots[*device].store(value + 1, std::memory_order_relaxed);
  return value;
}

// A device attribute of the current device (cached_per_device), or -1 when CUDA cannot say.
template <cudaDeviceAttr kAttr>
int cached_device_attribute() {
  static std::atomic<int> slots[kMaxDevices];
  int device = 0;
  return cached_per_device(slots, &device, [](int ordinal, int* value) {
    return cudaDeviceGetAttribute(value, kAttr, ordinal) == cudaSuccess;
  });
}
}  // namespace

DeviceDesc current_device() {
  DeviceDesc d;
  const int major = cached_device_attribute<cudaDevAttrComputeCapabilityMajor>();
  const int minor = cached_device_attribute<cudaDevAttrComputeCapabilityMinor>();
  d.cc = major < 0 || minor < 0 ? 0 : major * 10 + minor;
  d.sm_count = cached_device_attribute<cudaDevAttrMultiProcessorCount>();
  d.smem_optin = cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>();
  return d;
}

DevOptions process_dev_options(const char** error) {
  DevOptions options;
  *error = dev_options(&options);
  return options;
}

int max_active_cluster_pairs(const void* kernel, const cudaLaunchConfig_t& config) {
  static std::atomic<int> slots[kMaxDevices];
  int device = 0;
  const int pairs = cached_per_device(slots, &device, [&](int, int* value) {
    if (cudaOccupancyMaxActiveClusters(value, kernel, &config) == cudaSuccess) return true;
    (void)cudaGetLastError();  // (not sticky: this call runs without clusters, and the next one asks again)
    return false;
  });
  return pairs > 0 ? pairs : 0;
}

int64_t bwd_workspace_ints(const AttentionParams& p) {
  const DeviceDesc device = current_device();
  const char* error = nullptr;
  const DevOptions options = process_dev_options(&error);
  // (the instance a build for this device's arch runs)
  const InstanceDesc instance{p.dtype, p.headdim_rounded, device.cc, device.cc == 90};
  return plan_bwd(p, device, options, &instance, 1).workspace_ints;
}

}  // namespace fa2
