#include "dispatch.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fa2/bwd_launch.h"  // the backward's switches and answers defined here
#include "fa2/bwd_tile_config.h"  // the tail split's shapes (bwd_tail_split_plan)
#include "fa2/launch.h"  // the switches defined here
#include "fa2/tile_order.h"

namespace fa2 {

// run_bwd's answers to a GQA call that must bring its own dK / dV buffers (bwd_launch.h; defined here, with the
// switches, so that the kernel harness scripts/fwd_variant_bench.cu links them too)
const char* const kBwdNeedsGqaAccumulators =
    "fa2: this GQA backward needs zeroed fp32 dK / dV accumulators per kv head (no kernel here sums the group)";
const char* const kBwdNeedsGqaPartials =
    "fa2: this GQA backward needs fp32 dK / dV partials per query head (no kernel here sums the group)";

namespace {

const char* dtype_name(DType t) { return t == DType::kBFloat16 ? "bfloat16" : "float16"; }

// Messages returned to the caller live here until this thread's next failing call.
const char* message(std::string s) {
  thread_local std::string buffer;
  buffer = std::move(s);
  return buffer.c_str();
}

// A process-wide on/off switch for A/B timing: set() wins; until then the environment variable decides (set to
// anything but "" or "0" means `when_set`, absent means the opposite).
class Switch {
 public:
  constexpr Switch(const char* env_var, bool when_set) : env_var_(env_var), when_set_(when_set) {}
  bool on() {
    int state = state_.load(std::memory_order_relaxed);
    if (state < 0) {
      const char* v = std::getenv(env_var_);
      const bool set = v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
      const int from_env = set == when_set_ ? 1 : 0;
      // a concurrent set() wins over the environment
      if (!state_.compare_exchange_strong(state, from_env, std::memory_order_relaxed)) return state == 1;
      state = from_env;
    }
    return state == 1;
  }
  void set(bool on) { state_.store(on ? 1 : 0, std::memory_order_relaxed); }

 private:
  const char* env_var_;
  bool when_set_;
  std::atomic<int> state_{-1};  // -1: not decided yet
};

// Whether sm_XXa instances may be chosen (FA2_DISABLE_ARCH_SPECIFIC=1 turns them off, e.g. to time the sm80-path
// kernels against the wgmma ones on the same build).
Switch g_arch_specific{"FA2_DISABLE_ARCH_SPECIFIC", /*when_set=*/false};
// Whether the backward prefers its sm_90a (wgmma) instances (FA2_DISABLE_SM90_BACKWARD=1 turns them off, e.g. to
// time the sm80-path backward on the same build).
Switch g_sm90_backward{"FA2_DISABLE_SM90_BACKWARD", /*when_set=*/false};
// Whether the sm_90a backward runs its warp-specialized kernel where it applies (bwd_launch.h;
// FA2_DISABLE_SM90_WS_BACKWARD=1 turns it off, e.g. to time bwd_kernel.cuh's wgmma instances on the same build).
Switch g_sm90_ws_backward{"FA2_DISABLE_SM90_WS_BACKWARD", /*when_set=*/false};
// Whether the backward runs a key-row bias on its plain path (bwd_launch.h; FA2_DISABLE_KEY_BIAS_BWD=1 turns it off,
// e.g. to time the general bias path on the same build).
Switch g_key_bias_backward{"FA2_DISABLE_KEY_BIAS_BWD", /*when_set=*/false};
Switch g_bwd_small_tiles{"FA2_BWD_SMALL_TILES", /*when_set=*/true};
// Whether causal-length launches end with tile_order.h's rank-major tail (launch.h; FA2_NO_TILE_ORDER_TAIL=1 turns it
// off).
Switch g_tile_order_tail{"FA2_NO_TILE_ORDER_TAIL", /*when_set=*/false};
// Whether the persistent d 128 forward may run in clusters of two sharing K/V loads (launch.h; FA2_NO_FWD_CLUSTER=1
// turns it off).
Switch g_fwd_cluster{"FA2_NO_FWD_CLUSTER", /*when_set=*/false};
// Whether a GQA backward's CTAs that do not sum a group add their dK, dV into fp32 accumulators (bwd_launch.h;
// FA2_BWD_GQA_NO_ACCUMULATE=1 turns it off: fp32 partials per query head, e.g. to time them on the same build).
Switch g_bwd_gqa_accumulate{"FA2_BWD_GQA_NO_ACCUMULATE", /*when_set=*/false};
// The warp-specialized forward's persistent grid (launch.h): at most this many CTAs, -1 one per SM, 0 not
// persistent; kUnread until FA2_PERSISTENT_FWD_CTAS is read.
constexpr int kPersistentUnread = -2;
std::atomic<int> g_persistent_ctas{kPersistentUnread};
// The -1 / 0 / 1 mode settings (auto / never / forced) read from the environment once: kModeUnread until then.
constexpr int kModeUnread = -2;
// Whether a GQA backward's CTAs may each sum a group (bwd_launch.h): -1 auto, 0 never, 1 always (FA2_BWD_GQA_GROUPING).
std::atomic<int> g_bwd_gqa_grouping{kModeUnread};
// Where the warp-specialized backward splits its last partial wave (bwd_launch.h): -1 auto, 0 never, 1 wherever the
// cost model gains (FA2_BWD_TAIL_SPLIT).
std::atomic<int> g_bwd_tail_split{kModeUnread};
// The sm_90a forward's schedule (launch.h): an Sm90Schedule value; -1: FA2_SM90_SCHEDULE not read yet; -2: it names
// no schedule.
constexpr int kScheduleUnread = -1, kScheduleInvalid = -2;
std::atomic<int> g_sm90_schedule{kScheduleUnread};

int schedule_index(const char* name) {
  for (int i = 0; i < int(sizeof(kSm90ScheduleNames) / sizeof(kSm90ScheduleNames[0])); ++i) {
    if (std::strcmp(name, kSm90ScheduleNames[i]) == 0) return i;
  }
  return kScheduleInvalid;
}
// The int setting in `state`, read once from the environment variable `env_var` (parse: its value, nullptr when
// unset, to the setting) while the state is `unread`; a concurrent set_...() wins over the environment.
template <class Parse>
int setting_read_once(std::atomic<int>& state, int unread, const char* env_var, Parse parse) {
  int value = state.load(std::memory_order_relaxed);
  if (value == unread) {
    const int from_env = parse(std::getenv(env_var));
    value = state.compare_exchange_strong(value, from_env, std::memory_order_relaxed) ? from_env : value;
  }
  return value;
}

std::string schedule_choices() {
  std::string all;
  for (const char* n : kSm90ScheduleNames) all += std::string(all.empty() ? "" : ", ") + n;
  return all;
}

}  // namespace

const char* dispatch_instance(const char* direction, const InstanceEntry* entries, int num_entries,
                              const AttentionParams& p, cudaStream_t stream, bool prefer_arch_specific) {
  int device = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  const int cc = major * 10 + minor;

  const InstanceEntry* best = nullptr;
  std::string built_archs, built_headdims;
  for (int i = 0; i < num_entries; ++i) {
    const InstanceEntry& e = entries[i];
    if (e.dtype != p.dtype || e.headdim != p.headdim_rounded) continue;
    built_archs += " sm_" + std::to_string(e.arch) + (e.arch_specific ? "a" : "");
    const bool runs_here = e.arch / 10 == cc / 10 && e.arch <= cc &&
                           (!e.arch_specific || (e.arch == cc && g_arch_specific.on()));
    const bool better = best == nullptr ||
                        (e.arch_specific != best->arch_specific ? e.arch_specific == prefer_arch_specific
                                                                : e.arch > best->arch);
    if (runs_here && better) best = &e;
  }
  if (best != nullptr) return best->fn(p, stream);
  if (built_archs.empty()) {
    for (int i = 0; i < num_entries; ++i) built_headdims += " " + std::to_string(entries[i].headdim);
    return message(std::string("fa2: no CUDA ") + direction + " kernel for " + dtype_name(p.dtype) + " headdim " +
                   std::to_string(p.headdim_rounded) + " in this build (instantiated headdims:" + built_headdims +
                   "); rebuild with FA2_HEADDIMS including it");
  }
  return message(std::string("fa2: no CUDA ") + direction + " kernel for this GPU (compute capability " +
                 std::to_string(major) + "." + std::to_string(minor) + "): this build has" + built_archs +
                 (!g_arch_specific.on() ? " (arch-specific ones switched off: FA2_DISABLE_ARCH_SPECIFIC / "
                                             "fa2._C.set_arch_specific_kernels)"
                                           : "") +
                 "; rebuild with FA2_CUDA_ARCHS including " + std::to_string(cc));
}

void set_arch_specific_kernels(bool enabled) { g_arch_specific.set(enabled); }
void set_sm90_backward(bool enabled) { g_sm90_backward.set(enabled); }
bool sm90_backward() { return g_sm90_backward.on(); }
void set_sm90_ws_backward(bool enabled) { g_sm90_ws_backward.set(enabled); }
bool sm90_ws_backward() { return g_sm90_ws_backward.on(); }
void set_key_bias_backward(bool enabled) { g_key_bias_backward.set(enabled); }
bool key_bias_backward() { return g_key_bias_backward.on(); }
void set_bwd_small_tiles(bool enabled) { g_bwd_small_tiles.set(enabled); }
bool bwd_small_tiles() { return g_bwd_small_tiles.on(); }
void set_persistent_forward_ctas(int ctas) { g_persistent_ctas.store(ctas < 0 ? -1 : ctas, std::memory_order_relaxed); }
int persistent_forward_ctas() {
  return setting_read_once(g_persistent_ctas, kPersistentUnread, "FA2_PERSISTENT_FWD_CTAS", [](const char* env) {
    char* end = nullptr;
    const long value = env == nullptr || *env == '\0' ? -1 : std::strtol(env, &end, 10);
    return env != nullptr && *env != '\0' && (*end != '\0' || value < 0 || value > 1 << 30)
               ? -1  // (not a count: the default)
               : int(value);
  });
}
// A mode setting's value from its environment variable: "0" 0, "1" 1, anything else (or unset) -1.
static int parse_mode_env(const char* env) {
  return env == nullptr ? -1 : std::strcmp(env, "0") == 0 ? 0 : std::strcmp(env, "1") == 0 ? 1 : -1;
}
void set_bwd_gqa_grouping(int mode) {
  g_bwd_gqa_grouping.store(mode == 0 || mode == 1 ? mode : -1, std::memory_order_relaxed);
}
int bwd_gqa_grouping() {
  return setting_read_once(g_bwd_gqa_grouping, kModeUnread, "FA2_BWD_GQA_GROUPING", parse_mode_env);
}
void set_bwd_tail_split(int mode) {
  g_bwd_tail_split.store(mode == 0 || mode == 1 ? mode : -1, std::memory_order_relaxed);
}
int bwd_tail_split() {
  return setting_read_once(g_bwd_tail_split, kModeUnread, "FA2_BWD_TAIL_SPLIT", parse_mode_env);
}
void set_bwd_gqa_accumulate(bool enabled) { g_bwd_gqa_accumulate.set(enabled); }
bool bwd_gqa_accumulate() { return g_bwd_gqa_accumulate.on(); }
bool arch_specific_kernels() { return g_arch_specific.on(); }
const char* set_sm90_schedule(const char* name) {
  const int index = schedule_index(name);
  if (index < 0) {
    return message(std::string("fa2: unknown sm_90a schedule '") + name + "' (one of " + schedule_choices() + ")");
  }
  g_sm90_schedule.store(index, std::memory_order_relaxed);
  return nullptr;
}

const char* sm90_schedule(Sm90Schedule* schedule) {
  // (the environment is read once, not on every launch)
  const int state = setting_read_once(g_sm90_schedule, kScheduleUnread, "FA2_SM90_SCHEDULE", [](const char* env) {
    return env == nullptr || *env == '\0' ? int(Sm90Schedule::kAuto) : schedule_index(env);
  });
  if (state == kScheduleInvalid) {
    const char* env = std::getenv("FA2_SM90_SCHEDULE");
    return message(std::string("fa2: FA2_SM90_SCHEDULE=") + (env != nullptr ? env : "") +
                   " is not an sm_90a schedule (one of " + schedule_choices() + ")");
  }
  *schedule = static_cast<Sm90Schedule>(state);
  return nullptr;
}

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
int cached_device_attribute(int* device) {
  static std::atomic<int> slots[kMaxDevices];
  return cached_per_device(slots, device, [](int ordinal, int* value) {
    return cudaDeviceGetAttribute(value, kAttr, ordinal) == cudaSuccess;
  });
}
}  // namespace

int device_smem_optin_limit(int* device) {
  return cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device);
}

int device_smem_optin_limit() {
  int device = 0;
  return device_smem_optin_limit(&device);
}

int device_sm_count() {
  int device = 0;
  return cached_device_attribute<cudaDevAttrMultiProcessorCount>(&device);
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

int64_t persistent_forward_grid(int64_t tiles) {
  int64_t ctas = tiles;
  const int sms = device_sm_count(), setting = persistent_forward_ctas();
  if (sms > 0 && sms < ctas) ctas = sms;
  if (setting > 0 && setting < ctas) ctas = setting;
  return ctas;
}

void set_fwd_cluster(bool enabled) { g_fwd_cluster.set(enabled); }
bool fwd_cluster_enabled() { return g_fwd_cluster.on(); }

void set_tile_order_tail(bool enabled) { g_tile_order_tail.set(enabled); }
bool tile_order_tail_enabled() { return g_tile_order_tail.on(); }

int launch_tile_order_tail(const AttentionParams& p, int blocks, int heads_per_batch) {
  const bool causal_lengths = has_causal_lengths(p);
  const int64_t heads = int64_t(p.batch) * (heads_per_batch < 0 ? p.nheads : heads_per_batch);
  if (!causal_lengths || p.deterministic || heads * blocks > 0x7fffffff || !g_tile_order_tail.on()) return 0;
  return tile_order_tail(blocks, int(heads), device_sm_count());
}

BwdTailSplitPlan bwd_tail_split_plan(const AttentionParams& p) {
  BwdTailSplitPlan plan;
  const BwdTailSplitShape shape = bwd_tail_split_shape_at(p.headdim_rounded);
  const int mode = bwd_tail_split();
  if (shape.block_n == 0 || mode == 0 || p.deterministic || p.window_left >= 0 || p.window_right >= 0 ||
      p.bias_type != BiasType::kNone || p.softcap != 0.f || p.h_h_k_ratio != 1 || !g_sm90_backward.on() ||
      !g_sm90_ws_backward.on() || device_cc_major() != 9) {
    return plan;
  }
  const int64_t tiles = int64_t((p.seqlen_k + shape.block_n - 1) / shape.block_n) * p.nheads * p.batch;
  const int query_blocks = (p.seqlen_q + shape.block_m - 1) / shape.block_m;
  if (tiles > 0x7fffffff / kBwdTailSplitTuning.max_pieces) return plan;  // (the split grid's CTAs fit an int)
  if (mode < 0 && query_blocks < shape.min_query_blocks) return plan;  // (auto: where it was measured to pay)
  const TailSplit split = tail_split(tiles, query_blocks, device_sm_count(), kBwdTailSplitTuning);
  if (split.pieces <= 1) return plan;
  plan.tiles = split.tiles, plan.pieces = split.pieces, plan.grid_tiles = int(tiles);
  const bool overlap = bwd_ws_overlaps_dq_conversion_at(p.headdim_rounded);
  plan.workspace_offset = overlap ? (int64_t(p.batch) * p.nheads + 3) / 4 * 4 : 0;  // (16-byte aligned: the TMA's)
  plan.dkv_offset = (plan.tiles + 3) / 4 * 4;
  plan.zero_ints = plan.dkv_offset + 2 * int64_t(plan.tiles) * shape.block_n * p.headdim_rounded;
  return plan;
}

int64_t bwd_workspace_ints(const AttentionParams& p) {
  if (!p.deterministic) {
    // the finished-CTA counts (params.h, key_blocks_done) where the headdim overlaps, then the tail split's scratch
    const BwdTailSplitPlan split = bwd_tail_split_plan(p);
    if (split.pieces > 1) return split.workspace_offset + split.zero_ints;
    return bwd_ws_overlaps_dq_conversion_at(p.headdim_rounded) ? int64_t(p.batch) * p.nheads : 0;
  }
  const int64_t block_m = bwd_min_block_m(p.headdim_rounded);  // (whichever tiles run: bwd_launch_template.cuh)
  const int64_t num_m_blocks = (p.seqlen_q + block_m - 1) / block_m;
  return 1 + int64_t(p.batch) * p.nheads * num_m_blocks;
}

int device_cc_major() {
  int device = 0;
  return cached_device_attribute<cudaDevAttrComputeCapabilityMajor>(&device);
}

const char* check_dynamic_smem(const char* what, int headdim, int bytes) {
  int device = 0;
  const int limit = device_smem_optin_limit(&device);
  if (limit < 0) return nullptr;  // (the launch itself reports what is wrong with the device)
  if (bytes <= limit) return nullptr;
  cudaDeviceProp prop{};
  const bool named = cudaGetDeviceProperties(&prop, device) == cudaSuccess;
  return message(std::string("fa2: the CUDA ") + what + " at headdim " + std::to_string(headdim) + " needs " +
                 std::to_string((bytes + 1023) / 1024) + " KB of shared memory per block; " +
                 (named ? prop.name : "this GPU") + " (compute capability " +
                 (named ? std::to_string(prop.major) + "." + std::to_string(prop.minor) : std::string("?")) +
                 ") allows " + std::to_string(limit / 1024) +
                 " KB (its tiles are sized for GPUs with at least 99 KB: sm80 and later)");
}

const char* check_grid_batch_heads(const char* what, int64_t batch, int64_t nheads) {
  if (batch <= 65535 && nheads <= 65535) return nullptr;
  return message(std::string("fa2: the CUDA ") + what + " supports batch and nheads up to 65535 each (CUDA grid "
                 "limits), got batch " + std::to_string(batch) + " and nheads " + std::to_string(nheads) +
                 "; split the batch into chunks of at most 65535");
}

int rounded_headdim(const InstanceEntry* entries, int num_entries, int headdim) {
  int best = -1;
  for (int i = 0; i < num_entries; ++i) {
    const int d = entries[i].headdim;
    if (d >= headdim && (best < 0 || d < best)) best = d;
  }
  return best;
}

}  // namespace fa2
