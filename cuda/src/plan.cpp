// The plan builder (plan.h): every choice of which kernel runs, how it is launched and what scratch it needs, for
// the forward and the backward, made here once per call. Plain C++: compiled into the CUDA library and into the
// CPU-only build (plans for a described GPU).
#include "fa2/plan.h"

#include <string>
#include <type_traits>

#include "fa2/bwd_tile_config.h"
#include "fa2/tile_order.h"

namespace fa2 {
namespace {

const char* message(std::string s) {  // (valid until this thread's next message)
  thread_local std::string buffer;
  buffer = std::move(s);
  return buffer.c_str();
}

// A note for a printed plan, built only where one is asked for (launches pass no notes: no string work there).
template <class Text>
void note(PlanNotes* notes, Text&& text) {
  if (notes != nullptr) notes->push_back(text());
}

const char* dtype_name(DType t) { return t == DType::kBFloat16 ? "bf16" : "fp16"; }

// Calls f with the instantiated headdim as a compile-time constant (its tile configs are templates).
template <class F>
auto with_headdim(int headdim, F&& f) {
  switch (headdim) {
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 96: return f(std::integral_constant<int, 96>{});
    case 192: return f(std::integral_constant<int, 192>{});
    case 256: return f(std::integral_constant<int, 256>{});
    default: return f(std::integral_constant<int, 128>{});  // (instances only have the six headdims)
  }
}

struct KernelShape {
  int block_m = 0, block_n = 0, threads = 0, smem = 0;
};

// The forward kernel's shape (fwd_kernel.cuh's FwdKernelConfig and fwd_kernel_threads): the sm80 or wgmma tiles;
// warp-specialized: the producer warpgroup on top, its deeper ring, the wide tiles where they exist.
KernelShape fwd_kernel_shape(int headdim, bool wgmma, bool warp_specialized) {
  return with_headdim(headdim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    if (!wgmma) {
      using C = FwdTileConfig<D, false>;
      return KernelShape{C::kBlockM, C::kBlockN, C::kNThreads, C::kSmemBytes};
    }
    if (!warp_specialized) {
      using C = FwdTileConfig<D, true>;
      return KernelShape{C::kBlockM, C::kBlockN, C::kNThreads, C::kSmemBytes};
    }
    if constexpr (fwd_wide_warp_specialized(D)) {
      using C = FwdTileConfig<D, true, true>;
      return KernelShape{C::kBlockM, C::kBlockN, C::kNThreads + kWsProducerThreads, C::kSmemBytesWs};
    }
    using C = FwdTileConfig<D, true>;
    return KernelShape{C::kBlockM, C::kBlockN, C::kNThreads + kWsProducerThreads, C::kSmemBytesWs};
  });
}

// ---- the instance ---------------------------------------------------------------------------------------------

// The instance for (dtype, headdim_rounded) whose SASS runs on the device (same major compute capability, minor <=
// the device's; an arch-specific build only on its exact compute capability and while arch_specific_kernels is on),
// preferring an arch-specific one (or, with prefer_arch_specific false, one that is not, where there is one), then
// the highest arch. -1 and *error where none does.
int pick_instance(const char* direction, const AttentionParams& p, const DeviceDesc& device, const DevOptions& options,
                  const InstanceDesc* instances, int num_instances, bool prefer_arch_specific, const char** error) {
  const int cc = device.cc;
  int best = -1;
  std::string built_archs, built_headdims;
  for (int i = 0; i < num_instances; ++i) {
    const InstanceDesc& e = instances[i];
    if (e.dtype != p.dtype || e.headdim != p.headdim_rounded) continue;
    built_archs += " sm_" + std::to_string(e.arch) + (e.arch_specific ? "a" : "");
    const bool runs_here = e.arch / 10 == cc / 10 && e.arch <= cc &&
                           (!e.arch_specific || (e.arch == cc && options.arch_specific_kernels));
    const InstanceDesc* b = best < 0 ? nullptr : &instances[best];
    const bool better = b == nullptr || (e.arch_specific != b->arch_specific ? e.arch_specific == prefer_arch_specific
                                                                             : e.arch > b->arch);
    if (runs_here && better) best = i;
  }
  if (best >= 0) return best;
  if (built_archs.empty()) {
    for (int i = 0; i < num_instances; ++i) built_headdims += " " + std::to_string(instances[i].headdim);
    *error = message(std::string("fa2: no CUDA ") + direction + " kernel for " +
                     (p.dtype == DType::kBFloat16 ? "bfloat16" : "float16") + " headdim " +
                     std::to_string(p.headdim_rounded) + " in this build (instantiated headdims:" + built_headdims +
                     "); rebuild with FA2_HEADDIMS including it");
  } else {
    *error = message(std::string("fa2: no CUDA ") + direction + " kernel for this GPU (compute capability " +
                     std::to_string(cc / 10) + "." + std::to_string(cc % 10) + "): this build has" + built_archs +
                     (!options.arch_specific_kernels ? " (arch-specific ones switched off: development option "
                                                       "arch_specific_kernels)"
                                                     : "") +
                     "; rebuild with FA2_CUDA_ARCHS including " + std::to_string(cc));
  }
  return -1;
}

int arch_tag_of(const InstanceDesc& e) { return e.arch * 10 + (e.arch_specific ? 1 : 0); }

// The tag of the kernels a call runs from instance e: sm80_varlen calls run the sm80 path's (fwd_kernel.cuh /
// bwd_kernel.cuh with kVarlen), also where e is an sm_90a instance (pick_instance, not preferring those, found no sm_90
// one: such a build's sm_90a instances carry them, cmake/Kernels.cmake).
int kernel_arch_tag(const InstanceDesc& e, bool sm80_varlen) { return sm80_varlen ? e.arch * 10 : arch_tag_of(e); }

// Whether a varlen call may run the sm_90a kernels where its instance is one, while the option is on: the forward's
// (TMA loads over the packed tensors) where the instances load with the TMA; the backward's (bwd_kernel.cuh with the
// wgmma tiles, cp.async loads) while those tiles are on (sm90_backward) and exist at the headdim (bwd_wgmma_headdim:
// at the others the sm_90a instances have no varlen kernel, the sm_90 ones' sm80-path kernels run).
bool sm90_varlen_forward(const DevOptions& options) { return options.sm90_varlen && FA2_SM90_TMA; }
bool sm90_varlen_backward(const DevOptions& options, int headdim) {
  return options.sm90_varlen && options.sm90_backward && bwd_wgmma_headdim(headdim);
}

// A varlen call (params.h) takes no bias (the checks reject one before any plan); its note.
const char* check_varlen_call(const char* direction, const AttentionParams& p, bool sm90a, PlanNotes* notes) {
  if (p.bias_type != BiasType::kNone || p.dbias != nullptr) {
    return message(std::string("fa2: the CUDA varlen ") + direction + " takes no bias");
  }
  if (p.varlen_q_rows_each > 0 && direction[0] != 'f') {  // (the KV-cache op's layout is forward only)
    return "fa2: evenly spaced varlen sequences (params.h, varlen_q_rows_each) have no backward";
  }
  note(notes, [&] {
    const bool forward = direction[0] == 'f';
    return std::string("varlen: ") +
           (!sm90a   ? std::string("the sm80 path's ") + direction + " kernel"
            : forward ? "the sm_90a kernels, TMA loads from each sequence's first row of the packed tensors"
                      : "the sm_90a kernels (the main kernel below: warp-specialized with TMA loads from each "
                        "sequence's first row, or bwd_kernel.cuh's wgmma tiles)") +
           ", a " + (direction[0] == 'f' ? "query" : "key") +
           " block of one sequence per tile (those past its end are skipped)";
  });
  return nullptr;
}

// A dropout call's score path (the kernels with dropout: plain or general, fwd_launch_template.cuh): a bias folded into
// S takes the general path; its note.
void note_dropout_score(FwdScore& score, int arch_tag, PlanNotes* notes) {
  if (score == FwdScore::kBiasFold || score == FwdScore::kKeyBiasFold) score = FwdScore::kGeneral;
  note(notes, [&] {
    return std::string("dropout: ") + (arch_tag == 901 ? "the pipelined sm_90a kernel" : "the sm80 path's kernel") +
           " with dropout (Philox bits from rng_state), " + (score == FwdScore::kPlain ? "plain" : "general") +
           " score path";
  });
}

// Whether a dropout call may run the sm_90a kernels where its instance is one (while option sm90_dropout is on): the
// forward's pipelined ones where the instances load with the TMA (varlen: where sm90_varlen_forward); the backward's
// wgmma tiles (bwd_kernel.cuh, not the warp-specialized kernel) on the plain path (no bias, no softcap: the score-mod
// path keeps the sm80 tiles there too) at the headdims that have them (varlen: where sm90_varlen_backward).
bool sm90_dropout_forward(const AttentionParams& p, const DevOptions& options) {
  return options.sm90_dropout && FA2_SM90_TMA && (!is_varlen(p) || sm90_varlen_forward(options));
}
bool sm90_dropout_backward(const AttentionParams& p, const DevOptions& options) {
  return options.sm90_dropout && options.sm90_backward && bwd_wgmma_headdim(p.headdim_rounded) &&
         !bwd_uses_score_mod(p) && (!is_varlen(p) || sm90_varlen_backward(options, p.headdim_rounded));
}

// ---- launch limits ----------------------------------------------------------------------------------------------

const char* check_smem(const char* what, int headdim, int bytes, const DeviceDesc& device) {
  if (device.smem_optin < 0 || bytes <= device.smem_optin) return nullptr;  // (unknown: the launch reports it)
  return message(std::string("fa2: the CUDA ") + what + " at headdim " + std::to_string(headdim) + " needs " +
                 std::to_string((bytes + 1023) / 1024) +
                 " KB of shared memory per block; this GPU (compute capability " +
                 std::to_string(device.cc / 10) + "." + std::to_string(device.cc % 10) + ") allows " +
                 std::to_string(device.smem_optin / 1024) +
                 " KB (its tiles are sized for GPUs with at least 99 KB: sm80 and later)");
}

const char* check_grid_batch_heads(const char* what, int64_t batch, int64_t nheads) {
  if (batch <= 65535 && nheads <= 65535) return nullptr;
  return message(std::string("fa2: the CUDA ") + what + " supports batch and nheads up to 65535 each (CUDA grid "
                 "limits), got batch " + std::to_string(batch) + " and nheads " + std::to_string(nheads) +
                 "; split the batch into chunks of at most 65535");
}

// The tail of a launch's tile order (tile_order.h) over `blocks` blocks per head (heads: the grid's heads per batch):
// where the blocks have causal lengths, not in the deterministic mode (whose CTAs take their tiles in start order),
// while the option is on; else 0 (head by head).
int launch_tile_order_tail(const AttentionParams& p, const DeviceDesc& device, const DevOptions& options, int blocks,
                           int heads_per_batch) {
  const int64_t heads = int64_t(p.batch) * heads_per_batch;
  if (!has_causal_lengths(p) || p.deterministic || heads * blocks > 0x7fffffff || !options.tile_order_tail) return 0;
  return tile_order_tail(blocks, int(heads), device.sm_count);
}

// ---- forward ----------------------------------------------------------------------------------------------------

// Which kernel: score path, warp specialization and schedule (sm_90a with TMA loads), and the twins that exist for
// it (tile counter, clusters). Shapes follow in plan_fwd.
struct FwdChoice {
  FwdScore score = FwdScore::kPlain;
  bool ws = false;
  Sm90Schedule schedule = Sm90Schedule::kPipelined;
  bool has_tile_counter_twin = false, has_cluster_twin = false, key_bias_tma = false;
};

// A paged cache's keys (params.h, has_paged_kv): the sm_90a varlen kernels' TMA loads only (FwdPlan::paged).
const char* check_paged_call(const AttentionParams& p, const FwdPlan& plan, const DevOptions& options) {
  if (!plan.varlen || plan.arch_tag != 901 || plan.dropout || !options.paged_kv_in_place) return kPagedKvDeclined;
  if (p.page_size <= 0 || p.page_size % 16 != 0 || p.pages_per_sequence <= 0 || p.num_pages <= 0) {
    return "fa2: a paged key/value cache needs pages of a multiple of 16 keys and a block table";
  }
  return nullptr;
}

// The key-loop length a forward's schedule is chosen by (sm90_schedule_for_keys): seqlen_k; varlen, the keys per
// sequence on average (total_k / batch, known without a sync; max_seqlen_k would take the long-loop schedule for a
// batch of mostly short sequences). A paged cache: max_seqlen_k (total_k counts every page of the pool, used or not);
// evenly spaced sequences (a KV cache) too (total_k counts the rows between entries, e.g. the other heads').
int schedule_key_length(const AttentionParams& p) {
  const bool average = is_varlen(p) && !has_paged_kv(p) && p.varlen_q_rows_each == 0;
  return average ? (p.batch > 0 ? p.total_k / p.batch : 0) : p.seqlen_k;
}

FwdChoice choose_fwd_kernel(const AttentionParams& p, const DevOptions& options, int arch_tag, int headdim,
                            PlanNotes* notes) {
  FwdChoice c;
  const bool general = p.softcap > 0.f || !(p.scale > 0.f);
  const bool plain = !general && p.bias_type == BiasType::kNone;
  const bool equal_blocks = p.window_left < 0 && p.window_right < 0;  // (causal is folded into window_right)
  const bool tma = arch_tag == 901 && FA2_SM90_TMA;
  // dropout on sm_90a: the pipelined kernels only (fwd_launch_template.cuh, fwd_dropout_kernel)
  const bool dropout = has_dropout(p);
  // the default of causal / windowed calls: the schedule the tile-counter and key-bias kernels are built for
  const Sm90Schedule built_default = tma ? sm90_default_schedule(headdim, true) : Sm90Schedule::kPipelined;
  Sm90Schedule schedule = built_default;
  // (varlen: no forced schedule, the ones its kernels are built for: fwd_launch_template.cuh)
  const bool forced = tma && !dropout && !is_varlen(p) && options.sm90_schedule != Sm90Schedule::kAuto;
  const int schedule_keys = schedule_key_length(p);
  const Sm90Schedule for_keys = sm90_schedule_for_keys(headdim, !equal_blocks, schedule_keys);
  // a paged cache: the windowed default's warp-specialized twin (fwd_kernel.cuh, kPagedKV), else the pipelined kernel
  const bool paged_off_default = has_paged_kv(p) && for_keys != built_default;
  if (tma) {
    schedule = dropout || paged_off_default ? Sm90Schedule::kPipelined : forced ? options.sm90_schedule : for_keys;
  }
  if (tma) {
    note(notes, [&] {
      return std::string("schedule: ") + sm90_schedule_name(schedule) +
             (dropout             ? " (dropout: the pipelined kernels have it)"
              : paged_off_default ? " (a paged cache: the pipelined kernel, or the windowed default's twin)"
              : forced            ? " (forced: option sm90_schedule)"
                       : std::string(" (d ") + std::to_string(headdim) + "'s default " +
                             (equal_blocks ? "without" : "with") + " a causal mask or window at " +
                             std::to_string(schedule_keys) + (is_varlen(p) ? " keys a sequence on average)" : " keys)"));
    });
  }
  // a bias with one value per key (padding masks): its own variant; on sm_90a its key tiles come by the TMA, which
  // needs 16-byte aligned rows (else the general bias-fold variant reads it)
  const int64_t elem = p.bias_type == BiasType::kFloat32 ? 4 : p.bias_type == BiasType::kBool ? 1 : 2;
  const bool bias_rows_tma_loadable = p.bias_col_stride == 1 && reinterpret_cast<uintptr_t>(p.bias) % 16 == 0 &&
                                      (p.batch == 1 || (p.bias_batch_stride * elem) % 16 == 0) &&
                                      (p.nheads == 1 || (p.bias_head_stride * elem) % 16 == 0);
  // (dropout: none, its bias is the general path's: note_dropout_score)
  const bool key_row_bias = !general && !dropout && p.bias_type != BiasType::kNone && p.bias_row_stride == 0 &&
                            (!tma || bias_rows_tma_loadable);
  if (tma && plain && schedule != Sm90Schedule::kPipelined) {
    c.ws = true;
    c.schedule = schedule;
    // twins, for fewer instantiations only where they are used by default
    c.has_tile_counter_twin = schedule == Sm90Schedule::kPingpongOverlap && fwd_persistent_headdim(headdim) &&
                              built_default == Sm90Schedule::kPingpongOverlap && !has_paged_kv(p);
    c.has_cluster_twin = schedule == Sm90Schedule::kOverlap && fwd_cluster_headdim(headdim) && !is_varlen(p);
  } else if (tma && key_row_bias && (schedule != Sm90Schedule::kPipelined || !forced)) {
    if (built_default != Sm90Schedule::kPipelined) {
      c.ws = true, c.schedule = sm90_key_bias_schedule(headdim);
      note(notes, [&] { return std::string("key-row bias: the headdim's key-bias schedule"); });
    } else if (fwd_wide_warp_specialized(headdim) &&
               (schedule == Sm90Schedule::kWarpSpecialized ||
                (!forced && fwd_wide_key_bias_by_default(headdim, p.seqlen_k)))) {
      c.ws = true, c.schedule = Sm90Schedule::kWarpSpecialized;
      note(notes, [&] {
        return std::string("key-row bias: the wide warp-specialized kernel (") +
               (forced ? "forced \"ws\"" : "at least kWideKeyBiasMinKeys keys") + ")";
      });
    }
  }
  c.score = c.ws ? (plain ? FwdScore::kPlain : FwdScore::kKeyBiasFold)
            : general      ? FwdScore::kGeneral
            : plain        ? FwdScore::kPlain
            : key_row_bias ? FwdScore::kKeyBiasFold
                           : FwdScore::kBiasFold;
  c.key_bias_tma = tma && key_row_bias;
  note(notes, [&] {
    return std::string("score path: ") +
           (general ? "general (softcap or scale <= 0)"
            : plain ? "plain (no bias, no softcap)"
            : key_row_bias ? "key-row bias folded into S (one value per key: a padding mask)"
            : dropout      ? "bias folded into S (with dropout: the general path's)"
                           : "bias folded into S (it varies along queries, or its rows are not TMA-loadable)");
  });
  if (tma && !c.ws) {
    note(notes, [&] {
      return std::string("kernel: pipelined (") +
             (dropout ? "dropout"
              : plain ? "the schedule is pipelined"
                      : "warp-specialized kernels serve the plain path and key-row bias") +
             ")";
    });
  }
  return c;
}

// The persistent grid's CTAs over `tiles`: at most one per SM (where known) and at most the option's cap (> 0).
int64_t persistent_grid(int64_t tiles, const DeviceDesc& device, const DevOptions& options) {
  int64_t ctas = tiles;
  const int sms = device.sm_count, setting = options.persistent_forward_ctas;
  if (sms > 0 && sms < ctas) ctas = sms;
  if (setting > 0 && setting < ctas) ctas = setting;
  return ctas;
}

// The warp-specialized forward's grid: a 1-D grid over the tiles, persistent (fewer CTAs) by default only where
// every query block has the same key range (or the CTAs take tiles from a counter), at the headdims where it
// measured faster; clusters of two where every pair takes two query blocks of one head with the same keys.
const char* plan_fwd_ws_grid(FwdPlan& plan, const FwdChoice& c, const AttentionParams& p, const DeviceDesc& device,
                             const DevOptions& options, PlanBuffers buffers, PlanNotes* notes) {
  const int64_t tiles = int64_t(plan.num_m_blocks) * p.nheads * p.batch;
  // (<= 2^30 - 1: the kernel's tile index plus the grid stride stays an int)
  if (tiles > 0x3fffffff) return "fa2: batch * nheads * query blocks is too large for the CUDA forward";
  const bool equal_blocks = p.window_left < 0 && p.window_right < 0;
  const int setting = options.persistent_forward_ctas;
  const bool persistent_headdim = fwd_persistent_headdim(plan.headdim);
  const bool workspace = buffers == PlanBuffers::kDecide || p.workspace != nullptr;
  const bool counter = c.has_tile_counter_twin && workspace && !equal_blocks && persistent_headdim && setting != 0 &&
                       persistent_grid(tiles, device, options) < tiles;
  int64_t ctas = tiles;
  if (persistent_headdim && (setting > 0 || (setting < 0 && (equal_blocks || counter)))) {
    ctas = persistent_grid(tiles, device, options);
  }
  plan.tile_counter = counter;
  plan.workspace_ints = counter ? 1 : 0;
  plan.grid_x = ctas, plan.grid_y = 1, plan.grid_z = 1;
  plan.persistent_grid = ctas < tiles;
  plan.cluster = c.has_cluster_twin && equal_blocks && !counter && plan.num_m_blocks % 2 == 0 && ctas >= 2 &&
                 options.fwd_cluster;
  note(notes, [&] {
    return std::string("grid: ") + std::to_string(ctas) + " CTAs over " + std::to_string(tiles) + " tiles (" +
           (!persistent_headdim ? "one tile per CTA at this headdim"
            : setting == 0     ? "not persistent: option persistent_forward_ctas 0"
            : setting > 0      ? "persistent: option persistent_forward_ctas " + std::to_string(setting)
            : equal_blocks     ? "persistent: every query block has the same keys"
            : counter          ? "persistent, tiles claimed from a counter: causal / windowed blocks"
                               : "one tile per CTA: blocks of unequal length and no tile counter") +
           ")";
  });
  if (c.has_cluster_twin) {
    note(notes, [&] {
      return std::string("clusters of two: ") +
             (plan.cluster ? "yes, where the device runs such pairs (a persistent grid is cut to the co-resident pairs "
                             "at launch)"
                           : !options.fwd_cluster ? "no (option fwd_cluster off)"
                                                  : "no (needs no mask or window, an even number of query blocks, no "
                                                    "tile counter)");
    });
  }
  return nullptr;
}

}  // namespace

std::string headdim_padding(const AttentionParams& p) {
  const int qk = p.call_headdim_qk > 0 ? p.call_headdim_qk : p.headdim;
  const int v = p.call_headdim_v > 0 ? p.call_headdim_v : qk;
  const int kernel = kernel_headdim(qk, v);
  if (qk == kernel && v == kernel) return "";
  const std::string padded = qk == v       ? "q, k, v from headdim " + std::to_string(qk)
                             : qk == kernel ? "v from headdim " + std::to_string(v)
                             : v == kernel  ? "q, k from headdim " + std::to_string(qk)
                                            : "q, k from headdim " + std::to_string(qk) + " and v from " +
                                                  std::to_string(v);
  return padded + " to " + std::to_string(kernel) + " (zero-padded copies)";
}

namespace {
// The padding note of a plan, where the glue pads.
void note_headdim_padding(const AttentionParams& p, PlanNotes* notes) {
  note(notes, [&] {
    const std::string padding = headdim_padding(p);
    return padding.empty() ? std::string("padding: none (q, k, v read at their own headdim)")
                           : "padding: " + padding + ": the kernels take one headdim, a multiple of 8 (q/k's and " +
                                 "v's larger one); zero columns add nothing to q.k, and the extra columns of out " +
                                 "and the gradients are sliced off";
  });
}
}  // namespace

FwdPlan plan_fwd(const AttentionParams& p, const DeviceDesc& device, const DevOptions& options,
                 const InstanceDesc* instances, int num_instances, PlanBuffers buffers, PlanNotes* notes) {
  FwdPlan plan;
  plan.varlen = is_varlen(p);
  plan.dropout = has_dropout(p);
  // dropout, varlen: the sm_90a kernels where they have them and the option allows, else the sm80 path's
  const bool sm90_dropout = plan.dropout && sm90_dropout_forward(p, options);
  const bool sm90_varlen = plan.varlen && sm90_varlen_forward(options);
  plan.instance = pick_instance("forward", p, device, options, instances, num_instances,
                                (!plan.dropout || sm90_dropout) && (!plan.varlen || sm90_varlen), &plan.error);
  if (plan.instance < 0) return plan;
  const InstanceDesc& inst = instances[plan.instance];
  const bool sm90a = arch_tag_of(inst) == 901;
  const bool sm80_path = (plan.dropout && !(sm90_dropout && sm90a)) || (plan.varlen && !(sm90_varlen && sm90a));
  if (plan.varlen && (plan.error = check_varlen_call("forward", p, !sm80_path, notes))) return plan;
  plan.arch_tag = kernel_arch_tag(inst, sm80_path), plan.headdim = inst.headdim, plan.bias = p.bias_type;
  if ((plan.paged = has_paged_kv(p)) && (plan.error = check_paged_call(p, plan, options))) {
    plan.paged_declined = plan.error == kPagedKvDeclined;
    return plan;
  }
  note(notes, [&] {
    return std::string("instance: sm_") + std::to_string(inst.arch) + (inst.arch_specific ? "a" : "") +
           (inst.arch_specific ? " (arch-specific instances preferred)"
                               : options.arch_specific_kernels ? "" : " (option arch_specific_kernels off)");
  });
  note_headdim_padding(p, notes);
  FwdChoice c = choose_fwd_kernel(p, options, plan.arch_tag, inst.headdim, notes);
  if (plan.dropout) note_dropout_score(c.score, plan.arch_tag, notes);
  plan.score = c.score, plan.warp_specialized = c.ws, plan.schedule = c.schedule, plan.key_bias_tma = c.key_bias_tma;
  const KernelShape shape = fwd_kernel_shape(inst.headdim, plan.arch_tag == 901, c.ws);
  plan.block_m = shape.block_m, plan.threads = shape.threads, plan.smem = shape.smem;
  plan.num_m_blocks = (p.seqlen_q + shape.block_m - 1) / shape.block_m;
  if ((plan.error = check_grid_batch_heads("forward", p.batch, p.nheads))) return plan;
  plan.grid_x = plan.num_m_blocks, plan.grid_y = p.nheads, plan.grid_z = p.batch;
  if (c.ws) {
    if ((plan.error = plan_fwd_ws_grid(plan, c, p, device, options, buffers, notes))) return plan;
  }
  if (plan.smem > 48 * 1024 && (plan.error = check_smem("forward", inst.headdim, plan.smem, device))) return plan;
  plan.stage_masks = plan.varlen && plan.warp_specialized && options.varlen_stage_masks;
  // (the sm80-path kernels keep blockIdx's order)
  plan.tile_order_tail =
      plan.arch_tag == 901 ? launch_tile_order_tail(p, device, options, plan.num_m_blocks, p.nheads) : 0;
  note(notes, [&] {
    return std::string("tile order: ") + (plan.tile_order_tail > 0
                                              ? "the last " + std::to_string(plan.tile_order_tail) +
                                                    " heads longest block first (causal lengths)"
                                              : "head by head");
  });
  return plan;
}

// ---- backward ---------------------------------------------------------------------------------------------------

namespace {

// The backward's tile configs for a BwdTiles choice: the plain path's (Cfg) and the score-mod path's.
struct BwdConfigs {
  KernelShape plain, score_mod;
  int key_bias_smem = 0;        // the plain config with its key block of bias (bwd_kernel.cuh, kKeyBias)
  bool wgmma = false;           // the plain config multiplies with wgmma
  int min_block_m = 0;          // the deterministic mode's counters' block (bwd_min_block_m)
};

template <class Cfg>
KernelShape bwd_shape() {
  return KernelShape{Cfg::kBlockM, Cfg::kBlockN, Cfg::kNThreads, Cfg::kSmemBytes};
}

BwdConfigs bwd_configs(int headdim, BwdTiles tiles) {
  return with_headdim(headdim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    BwdConfigs c;
    c.min_block_m = bwd_min_block_m(D);
    auto fill = [&](auto plain_cfg, auto score_mod_cfg) {
      using Cfg = typename decltype(plain_cfg)::type;
      c.plain = bwd_shape<Cfg>();
      c.score_mod = bwd_shape<typename decltype(score_mod_cfg)::type>();
      c.key_bias_smem = Cfg::kSmemBytes + Cfg::kBlockN * 4;
      c.wgmma = Cfg::kWgmma;
    };
    using Sm80 = BwdTileConfig<D>;
    if (tiles == BwdTiles::kSm90a) {
      fill(std::common_type<typename BwdTileConfigSm90a<D>::type>{}, std::common_type<Sm80>{});
    } else if (tiles == BwdTiles::kSmall) {
      fill(std::common_type<BwdTileConfigSmall<D>>{}, std::common_type<BwdTileConfigSmall<D>>{});
    } else {
      fill(std::common_type<Sm80>{}, std::common_type<Sm80>{});
    }
    return c;
  });
}

// The warp-specialized backward's config at a headdim that has one.
struct BwdWsShape {
  KernelShape shape;
  bool tile_order_tail = false, headdim_split = false;
};
BwdWsShape bwd_ws_shape(int headdim) {
  return with_headdim(headdim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    if constexpr (bwd_ws_headdim(D)) {
      using Cfg = BwdWsConfig<D>;
      return BwdWsShape{bwd_shape<Cfg>(), Cfg::kTileOrderTail, kBwdWsSplit<D>};
    } else {
      return BwdWsShape{};
    }
  });
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Whether the TMA can address a (batch, seqlen, heads, headdim) b16 tensor: a 16-byte aligned base and, for every
// dimension longer than 1, a non-zero stride (broadcast inputs keep zero strides for the backward, which the
// tensor-map encoder rejects) that is a multiple of 8 elements.
bool bshd_tma_addressable(const void* base, int64_t batch, int64_t seqlen, int64_t heads, int64_t batch_stride,
                          int64_t row_stride, int64_t head_stride) {
  auto ok = [](int64_t size, int64_t stride) { return size == 1 || (stride != 0 && stride % 8 == 0); };
  return aligned16(base) && ok(batch, batch_stride) && ok(seqlen, row_stride) && ok(heads, head_stride);
}

// Whether the warp-specialized kernel can run a call (with dk / dv as gqa_dkv says): its TMA reads the row
// statistics from flat fp32 buffers (16-byte aligned; with a key-row bias bwd_row_stats_kernel's), q / dout / k / v
// in tiles, adds dQ into dq_accum, all with int coordinates; unless dK, dV are GQA's fp32 buffers it stores them in
// 16-byte pieces.
bool bwd_ws_applies(const AttentionParams& p, GqaDkv gqa_dkv, int block_m, bool key_bias) {
  const bool dkv_16b = (p.h_h_k_ratio > 1 && gqa_dkv != GqaDkv::kInKernel) ||
                       (bshd_tma_addressable(p.dk, p.batch, p.seqlen_k, p.nheads_k, p.dk_batch_stride, p.dk_row_stride,
                                             p.dk_head_stride) &&
                        bshd_tma_addressable(p.dv, p.batch, p.seqlen_k, p.nheads_k, p.dv_batch_stride, p.dv_row_stride,
                                             p.dv_head_stride));
  return dkv_16b && aligned16(p.softmax_d) && aligned16(p.dq_accum) &&
         (key_bias ? aligned16(p.row_lse) && aligned16(p.row_shift) : aligned16(p.lse)) &&
         int64_t(p.batch) * p.nheads * p.seqlen_q + block_m + 4 <= 0x7fffffff &&
         bshd_tma_addressable(p.q, p.batch, p.seqlen_q, p.nheads, p.q_batch_stride, p.q_row_stride, p.q_head_stride) &&
         bshd_tma_addressable(p.dout, p.batch, p.seqlen_q, p.nheads, p.dout_batch_stride, p.dout_row_stride,
                              p.dout_head_stride) &&
         bshd_tma_addressable(p.k, p.batch, p.seqlen_k, p.nheads_k, p.k_batch_stride, p.k_row_stride,
                              p.k_head_stride) &&
         bshd_tma_addressable(p.v, p.batch, p.seqlen_k, p.nheads_k, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
}

// GQA's fp32 accumulators as the ws kernel's TMA adds into them: (batch, nheads_k, seqlen_k, headdim) contiguous
// (the glue allocates them so; given buffers are checked), rows within int coordinates.
bool gqa_accumulators_usable(const AttentionParams& p, PlanBuffers buffers, int headdim, int block_n) {
  const int64_t kv_rows = int64_t(p.batch) * p.nheads_k * p.seqlen_k;
  if (kv_rows + block_n > 0x7fffffff) return false;
  if (buffers == PlanBuffers::kDecide) return true;
  return p.dk_row_stride == headdim && p.dk_head_stride == int64_t(p.seqlen_k) * headdim &&
         p.dk_batch_stride == int64_t(p.nheads_k) * p.dk_head_stride && p.dv_row_stride == p.dk_row_stride &&
         p.dv_head_stride == p.dk_head_stride && p.dv_batch_stride == p.dk_batch_stride;
}

// Whether a GQA call's ws CTAs each take a whole group (with a key-row bias: one that every head shares): option
// bwd_gqa_grouping 1 always, 0 never, -1 where the grouped grid still fills the GPU (bwd_tile_config.h).
bool bwd_groups_gqa(const AttentionParams& p, const DeviceDesc& device, const DevOptions& options, int block_n,
                    bool key_bias) {
  if (p.h_h_k_ratio == 1 || (key_bias && p.bias_head_stride != 0)) return false;
  if (options.bwd_gqa_grouping >= 0) return options.bwd_gqa_grouping == 1;
  const int64_t ctas = int64_t((p.seqlen_k + block_n - 1) / block_n) * p.nheads_k * p.batch;
  const int64_t sms = device.sm_count;
  if (sms <= 0) return false;
  if (has_causal_lengths(p)) return ctas >= kBwdGqaGroupMinWavesCausal * sms;
  const int64_t waves = (ctas + sms - 1) / sms;
  return double(ctas) >= kBwdGqaGroupMinWaveFill * double(waves * sms);
}

// The backward's choice of tiles for an instance: sm_90a instances take the wgmma configs while sm90_backward is on;
// the sm80-path instances take the small-shared-memory tiles where the regular ones with the key-row bias' extra
// key block exceed the device's per-block limit (sm86 / sm89), or when forced.
BwdTiles choose_bwd_tiles(const BwdPlan& plan, const DeviceDesc& device, const DevOptions& options,
                          PlanNotes* notes) {
  if (plan.arch_tag == 901) {
    note(notes, [&] {
      return std::string("tiles: ") + (options.sm90_backward ? "sm_90a wgmma (the score-mod path: sm80's)"
                                                             : "sm80 (option sm90_backward off)");
    });
    return options.sm90_backward ? BwdTiles::kSm90a : BwdTiles::kSm80;
  }
  const BwdConfigs regular = bwd_configs(plan.headdim, BwdTiles::kSm80);
  // (the sm_90 instances have varlen and dropout kernels with the regular tiles only: bwd_launch_template.cuh)
  const bool forced_small = options.bwd_small_tiles && !((plan.varlen || plan.dropout) && plan.arch_tag >= 900);
  const bool small = forced_small || (device.smem_optin > 0 && regular.key_bias_smem > device.smem_optin);
  note(notes, [&] {
    return std::string("tiles: ") + (!small        ? "sm80"
                                     : forced_small ? "sm80 small (option bwd_small_tiles)"
                                                    : "sm80 small (the regular ones exceed the GPU)");
  });
  return small ? BwdTiles::kSmall : BwdTiles::kSm80;
}

// The ws kernel's eligibility, GQA's buffers and the main kernel (plan_bwd's middle part).
void choose_bwd_main(BwdPlan& plan, const BwdConfigs& cfg, const AttentionParams& p, const DeviceDesc& device,
                     const DevOptions& options, PlanBuffers buffers, PlanNotes* notes) {
  const bool score_mod = bwd_uses_score_mod(p);
  const bool key_bias_fits = plan.arch_tag >= 900 || cfg.key_bias_smem <= 163 * 1024;
  // (dropout: the plain path or the score-mod path, which takes any bias)
  plan.key_bias = key_bias_fits && options.key_bias_backward && p.bias_type != BiasType::kNone &&
                  p.bias_row_stride == 0 && p.softcap == 0.f && p.dbias == nullptr && !plan.dropout;
  plan.row_stats = !plan.varlen && (score_mod || plan.key_bias);  // (varlen: BwdPlan::varlen)
  const bool ws_capable = plan.arch_tag == 901 && cfg.wgmma && bwd_ws_headdim(plan.headdim);
  const BwdWsShape ws_shape = bwd_ws_shape(plan.headdim);
  const bool ws_smem = ws_capable && check_smem("backward", plan.headdim, ws_shape.shape.smem, device) == nullptr;
  // varlen: the ws kernels' kVarlen variants, on the packed tensors as a batch of one (varlen_rows_view), GQA's dK /
  // dV as fp32 partials per query head (the varlen glue's buffers)
  const AttentionParams& tma_view = plan.varlen ? varlen_rows_view(p) : p;
  // dropout: bwd_ws_kernel's kDropout variant (plain path, not the d 256 headdim-split kernel) while the option is on
  const bool ws_dropout = options.sm90_ws_dropout && !plan.varlen && !ws_shape.headdim_split;
  auto ws_eligible = [&](GqaDkv gqa_dkv) {
    return ws_capable && (!plan.varlen || gqa_dkv == GqaDkv::kPartials) && (!plan.dropout || ws_dropout) &&
           options.sm90_ws_backward && (!score_mod || plan.key_bias) && !p.deterministic &&
           bwd_ws_applies(tma_view, gqa_dkv, ws_shape.shape.block_m, plan.key_bias) && ws_smem &&
           (p.h_h_k_ratio == 1 || gqa_dkv != GqaDkv::kAccumulate ||
            gqa_accumulators_usable(p, buffers, plan.headdim, ws_shape.shape.block_n));
  };
  bool ws = false;
  const bool gqa = p.h_h_k_ratio > 1;
  plan.gqa = gqa;
  if (!gqa) {
    ws = ws_eligible(plan.varlen ? GqaDkv::kPartials : p.gqa_dkv);  // (varlen: ignored without GQA)
  } else if (plan.varlen) {
    plan.gqa_dkv = GqaDkv::kPartials, ws = ws_eligible(GqaDkv::kPartials);
  } else if (buffers == PlanBuffers::kGiven) {
    plan.gqa_dkv = p.gqa_dkv;
    ws = ws_eligible(p.gqa_dkv) &&
         (p.gqa_dkv != GqaDkv::kInKernel ||
          bwd_groups_gqa(p, device, options, ws_shape.shape.block_n, plan.key_bias));
    if (!ws && p.gqa_dkv != GqaDkv::kPartials) {
      plan.error = "fa2: this GQA backward needs fp32 dK / dV partials per query head (gqa_dkv kPartials)";
    }
  } else if (ws_eligible(GqaDkv::kInKernel) &&
             bwd_groups_gqa(p, device, options, ws_shape.shape.block_n, plan.key_bias)) {
    plan.gqa_dkv = GqaDkv::kInKernel, ws = true;
  } else if (options.bwd_gqa_accumulate && ws_eligible(GqaDkv::kAccumulate)) {
    plan.gqa_dkv = GqaDkv::kAccumulate, ws = true;
  } else {
    plan.gqa_dkv = GqaDkv::kPartials, ws = ws_eligible(GqaDkv::kPartials);
  }
  if (gqa) {
    note(notes, [&] {
      return std::string("GQA dK / dV: ") +
             (plan.gqa_dkv == GqaDkv::kInKernel     ? "each CTA sums its group (in kernel)"
              : plan.gqa_dkv == GqaDkv::kAccumulate ? "fp32 accumulators per kv head"
                                                    : "fp32 partials per query head, summed by torch");
    });
  }
  plan.main = ws ? BwdMain::kWarpSpecialized
              : plan.key_bias ? BwdMain::kKeyBias
              : score_mod     ? BwdMain::kScoreMod
                              : BwdMain::kPlain;
  note(notes, [&] {
    if (ws) return std::string("main kernel: warp-specialized") + (plan.key_bias ? " (key-row bias)" : "");
    std::string why = !ws_capable             ? "no warp-specialized kernel for this instance / headdim / tiles"
                      : !options.sm90_ws_backward ? "option sm90_ws_backward off"
                      : plan.dropout          ? "dropout: option sm90_ws_dropout off, or d 256 / varlen"
                      : score_mod && !plan.key_bias ? "softcap or a general bias"
                      : p.deterministic       ? "deterministic mode"
                                              : "the TMA cannot address every buffer, or too little shared memory";
    return std::string("main kernel: bwd_kernel (") + why + ")";
  });
}

// The main kernel's grid, the ws kernel's tail split, dQ overlap and tile order, and the workspace.
void plan_bwd_launch(BwdPlan& plan, const BwdConfigs& cfg, const AttentionParams& p, const DeviceDesc& device,
                     const DevOptions& options, PlanBuffers buffers, PlanNotes* notes) {
  const bool ws = plan.main == BwdMain::kWarpSpecialized;
  if (ws) {
    const BwdWsShape ws_shape = bwd_ws_shape(plan.headdim);
    plan.threads = ws_shape.shape.threads, plan.smem = ws_shape.shape.smem;
    const int key_blocks = (p.seqlen_k + ws_shape.shape.block_n - 1) / ws_shape.shape.block_n;
    const int grid_heads = p.h_h_k_ratio > 1 && plan.gqa_dkv == GqaDkv::kInKernel ? p.nheads_k : p.nheads;
    plan.grid_x = key_blocks, plan.grid_y = grid_heads, plan.grid_z = p.batch;
    // (varlen: the dQ conversion's counts are per head, over every sequence: the rows it converts are (nheads,
    // total_q); no tail split)
    const bool overlap_capable = bwd_ws_overlaps_dq_conversion_at(plan.headdim);
    const int64_t counts = !overlap_capable ? 0 : plan.varlen ? int64_t(p.nheads) : int64_t(p.batch) * p.nheads;
    const bool have_counts = buffers == PlanBuffers::kDecide ? overlap_capable : p.workspace != nullptr;
    plan.dq_overlap = overlap_capable && have_counts;
    // (not behind the row statistics kernel, which runs between the two)
    plan.programmatic_main = options.bwd_programmatic_main && !plan.row_stats;
    if (!plan.key_bias && !plan.varlen) {
      const BwdTailSplitPlan split = bwd_tail_split_plan(p, device, options);
      const bool fits = buffers == PlanBuffers::kDecide ||
                        (p.workspace != nullptr && p.workspace_ints >= split.workspace_offset + split.zero_ints);
      if (split.pieces > 1 && fits) plan.tail_split = split;
    }
    if (plan.tail_split.pieces > 1) {
      plan.grid_x = plan.tail_split.grid_tiles - plan.tail_split.tiles +
                    int64_t(plan.tail_split.tiles) * plan.tail_split.pieces;
      plan.grid_y = 1, plan.grid_z = 1;
      plan.workspace_ints = plan.tail_split.workspace_offset + plan.tail_split.zero_ints;
    } else {
      plan.workspace_ints = plan.dq_overlap ? counts : 0;
      plan.tile_order_tail =
          ws_shape.tile_order_tail ? launch_tile_order_tail(p, device, options, key_blocks, grid_heads) : 0;
    }
    note(notes, [&] {
      return std::string("tail split: ") +
             (plan.tail_split.pieces > 1 ? "the last " + std::to_string(plan.tail_split.tiles) + " tiles in " +
                                               std::to_string(plan.tail_split.pieces) + " pieces each"
                                         : "none") +
             "; dQ conversion: " + (plan.dq_overlap ? "overlaps the last CTAs" : "after the main kernel");
    });
  } else {
    const KernelShape shape = plan.main == BwdMain::kScoreMod ? cfg.score_mod : cfg.plain;
    plan.threads = shape.threads;
    plan.smem = plan.main == BwdMain::kKeyBias ? cfg.key_bias_smem : shape.smem;
    plan.grid_x = (p.seqlen_k + shape.block_n - 1) / shape.block_n, plan.grid_y = p.nheads, plan.grid_z = p.batch;
    plan.error = check_smem("backward", plan.headdim, plan.smem, device);
  }
  if (p.deterministic) {  // one ticket counter, then a turn counter per query block (the smaller sm80 block_m)
    const int64_t num_m_blocks = (p.seqlen_q + cfg.min_block_m - 1) / cfg.min_block_m;
    plan.workspace_ints = 1 + int64_t(p.batch) * p.nheads * num_m_blocks;
    plan.zero_workspace = true;
  }
}

}  // namespace

BwdTailSplitPlan bwd_tail_split_plan(const AttentionParams& p, const DeviceDesc& device, const DevOptions& options) {
  BwdTailSplitPlan plan;
  const BwdTailSplitShape shape = bwd_tail_split_shape_at(p.headdim_rounded);
  const int mode = options.bwd_tail_split;
  if (shape.block_n == 0 || mode == 0 || p.deterministic || p.window_left >= 0 || p.window_right >= 0 ||
      p.bias_type != BiasType::kNone || p.softcap != 0.f || p.h_h_k_ratio != 1 || !options.sm90_backward ||
      !options.sm90_ws_backward || device.cc / 10 != 9) {
    return plan;
  }
  const int64_t tiles = int64_t((p.seqlen_k + shape.block_n - 1) / shape.block_n) * p.nheads * p.batch;
  const int query_blocks = (p.seqlen_q + shape.block_m - 1) / shape.block_m;
  if (tiles > 0x7fffffff / kBwdTailSplitTuning.max_pieces) return plan;  // (the split grid's CTAs fit an int)
  if (mode < 0 && query_blocks < shape.min_query_blocks) return plan;  // (auto: where it was measured to pay)
  const TailSplit split = tail_split(tiles, query_blocks, device.sm_count, kBwdTailSplitTuning);
  if (split.pieces <= 1) return plan;
  plan.tiles = split.tiles, plan.pieces = split.pieces, plan.grid_tiles = int(tiles);
  const bool overlap = bwd_ws_overlaps_dq_conversion_at(p.headdim_rounded);
  plan.workspace_offset = overlap ? (int64_t(p.batch) * p.nheads + 3) / 4 * 4 : 0;  // (16-byte aligned: the TMA's)
  plan.dkv_offset = (plan.tiles + 3) / 4 * 4;
  plan.zero_ints = plan.dkv_offset + 2 * int64_t(plan.tiles) * shape.block_n * p.headdim_rounded;
  return plan;
}

BwdPlan plan_bwd(const AttentionParams& p, const DeviceDesc& device, const DevOptions& options,
                 const InstanceDesc* instances, int num_instances, PlanBuffers buffers, PlanNotes* notes) {
  BwdPlan plan;
  plan.varlen = is_varlen(p);
  plan.dropout = has_dropout(p);
  const bool sm90_dropout = plan.dropout && sm90_dropout_backward(p, options);
  const bool sm90_varlen = plan.varlen && sm90_varlen_backward(options, p.headdim_rounded);
  plan.instance = pick_instance("backward", p, device, options, instances, num_instances,
                                options.sm90_backward && (!plan.dropout || sm90_dropout) &&
                                    (!plan.varlen || sm90_varlen),
                                &plan.error);
  if (plan.instance < 0) return plan;
  const InstanceDesc& inst = instances[plan.instance];
  const bool sm90a = arch_tag_of(inst) == 901;
  const bool sm80_path = (plan.dropout && !(sm90_dropout && sm90a)) || (plan.varlen && !(sm90_varlen && sm90a));
  if (plan.varlen && (plan.error = check_varlen_call("backward", p, !sm80_path, notes))) return plan;
  plan.arch_tag = kernel_arch_tag(inst, sm80_path), plan.headdim = inst.headdim;
  if (plan.dropout) {
    note(notes, [&] {
      return std::string("dropout: ") +
             (plan.arch_tag == 901 ? "the sm_90a kernels" : "the sm80 path's bwd_kernel") +
             ", replaying the forward's mask (Philox bits from rng_state)";
    });
  }
  note(notes, [&] {
    return std::string("instance: sm_") + std::to_string(inst.arch) + (inst.arch_specific ? "a" : "") +
           (options.sm90_backward ? "" : " (option sm90_backward off: sm_90a instances not preferred)");
  });
  note_headdim_padding(p, notes);
  if ((plan.error = check_grid_batch_heads("backward", p.batch, p.nheads))) return plan;
  plan.tiles = choose_bwd_tiles(plan, device, options, notes);
  const BwdConfigs cfg = bwd_configs(plan.headdim, plan.tiles);
  choose_bwd_main(plan, cfg, p, device, options, buffers, notes);
  if (plan.error != nullptr) return plan;
  plan_bwd_launch(plan, cfg, p, device, options, buffers, notes);
  return plan;
}

BwdPlan plan_bwd_without_ws(const BwdPlan& ws_plan, const AttentionParams& p, const DeviceDesc& device) {
  BwdPlan plan = ws_plan;
  if (plan.main != BwdMain::kWarpSpecialized) return plan;
  if (p.h_h_k_ratio > 1 && plan.gqa_dkv != GqaDkv::kPartials) {
    plan.error = "fa2: this GQA backward needs fp32 dK / dV partials per query head (gqa_dkv kPartials)";
    return plan;
  }
  const BwdConfigs cfg = bwd_configs(plan.headdim, plan.tiles);
  plan.main = plan.key_bias ? BwdMain::kKeyBias : BwdMain::kPlain;  // (ws ran only on those two paths)
  plan.tail_split = BwdTailSplitPlan{};
  plan.dq_overlap = false;
  plan.programmatic_main = false;
  plan.tile_order_tail = 0;
  plan.threads = cfg.plain.threads;
  plan.smem = plan.key_bias ? cfg.key_bias_smem : cfg.plain.smem;
  plan.grid_x = (p.seqlen_k + cfg.plain.block_n - 1) / cfg.plain.block_n, plan.grid_y = p.nheads,
  plan.grid_z = p.batch;
  plan.error = check_smem("backward", plan.headdim, plan.smem, device);
  return plan;
}

BwdPlan plan_bwd_without_tail_split(const BwdPlan& split_plan, const AttentionParams& p) {
  BwdPlan plan = split_plan;
  if (plan.tail_split.pieces <= 1) return plan;
  const BwdWsShape ws_shape = bwd_ws_shape(plan.headdim);
  const int grid_heads = p.h_h_k_ratio > 1 && plan.gqa_dkv == GqaDkv::kInKernel ? p.nheads_k : p.nheads;
  plan.grid_x = (p.seqlen_k + ws_shape.shape.block_n - 1) / ws_shape.shape.block_n;
  plan.grid_y = grid_heads, plan.grid_z = p.batch;
  plan.tail_split = BwdTailSplitPlan{};  // (its calls have no causal lengths: no tile order tail either)
  return plan;
}

int plan_rounded_headdim(const InstanceDesc* instances, int num_instances, int headdim) {
  int best = -1;
  for (int i = 0; i < num_instances; ++i) {
    const int d = instances[i].headdim;
    if (d >= headdim && (best < 0 || d < best)) best = d;
  }
  return best;
}

// ---- printing -----------------------------------------------------------------------------------------------------

namespace {
const char* bias_name(BiasType b) {
  return b == BiasType::kNone ? "none" : b == BiasType::kSameAsInput ? "same-as-input" : b == BiasType::kFloat32
                                                                                            ? "float32"
                                                                                            : "bool";
}
std::string arch_name(int arch_tag) {
  return "sm" + std::to_string(arch_tag / 10) + (arch_tag % 10 == 1 ? "a" : "");
}
std::string grid_text(int64_t x, int y, int z) {
  return "(" + std::to_string(x) + ", " + std::to_string(y) + ", " + std::to_string(z) + ")";
}
}  // namespace

std::string fwd_kernel_name(const FwdPlan& plan, DType dtype) {
  static const char* const kScores[] = {"plain", "bias-fold", "general", "key-bias-fold"};
  std::string s = std::string("fwd_kernel<") + dtype_name(dtype) + ", " + std::to_string(plan.headdim) + ", " +
                  arch_name(plan.arch_tag) + ", " + kScores[int(plan.score)] + ", bias " + bias_name(plan.bias);
  if (plan.warp_specialized) s += std::string(", warp-specialized ") + sm90_schedule_name(plan.schedule);
  if (plan.tile_counter) s += ", tile counter";
  if (plan.cluster) s += ", cluster of 2";
  if (plan.varlen) s += ", varlen";
  if (plan.dropout) s += ", dropout";
  return s + ">";
}

std::string bwd_kernel_name(const BwdPlan& plan, DType dtype) {
  static const char* const kTiles[] = {"sm80 tiles", "sm90a wgmma tiles", "sm80 small tiles"};
  const std::string args = std::string(dtype_name(dtype)) + ", " + std::to_string(plan.headdim) + ", ";
  if (plan.main == BwdMain::kWarpSpecialized) {
    const bool split = bwd_ws_shape(plan.headdim).headdim_split;
    return std::string(split ? "bwd_ws_dsplit_kernel<" : "bwd_ws_kernel<") + args +
           (plan.key_bias  ? "key-row bias>"
            : plan.varlen  ? "plain, varlen>"
            : plan.dropout ? "plain, dropout>"
                           : "plain>");
  }
  static const char* const kMain[] = {"", "plain", "key-row bias", "score-mod"};
  return "bwd_kernel<" + args + arch_name(plan.arch_tag) + ", " +
         (plan.main == BwdMain::kScoreMod && plan.tiles == BwdTiles::kSm90a ? "sm80 tiles" : kTiles[int(plan.tiles)]) +
         ", " + kMain[int(plan.main)] + (plan.varlen ? ", varlen" : "") + (plan.dropout ? ", dropout>" : ">");
}

std::vector<std::pair<std::string, std::string>> describe(const FwdPlan& plan, DType dtype) {
  if (plan.error != nullptr) return {{"error", plan.error}};
  return {{"kernel", fwd_kernel_name(plan, dtype)},
          {"grid", grid_text(plan.grid_x, plan.grid_y, plan.grid_z)},
          {"block", std::to_string(plan.threads) + " threads"},
          {"smem", std::to_string(plan.smem) + " bytes"},
          {"workspace", std::to_string(plan.workspace_ints) + " int32 (zeroed)"},
          {"stage_masks", plan.stage_masks ? "yes" : "no"},
          {"tile_order_tail", std::to_string(plan.tile_order_tail)}};
}

std::vector<std::pair<std::string, std::string>> describe(const BwdPlan& plan, DType dtype) {
  if (plan.error != nullptr) return {{"error", plan.error}};
  static const char* const kGqa[] = {"partials", "accumulate", "in kernel"};
  return {{"kernel", bwd_kernel_name(plan, dtype)},
          {"grid", grid_text(plan.grid_x, plan.grid_y, plan.grid_z)},
          {"block", std::to_string(plan.threads) + " threads"},
          {"smem", std::to_string(plan.smem) + " bytes"},
          {"workspace", std::to_string(plan.workspace_ints) + " int32" + (plan.zero_workspace ? " (zeroed)" : "")},
          {"gqa_dkv", plan.gqa ? kGqa[int(plan.gqa_dkv)] : "n/a (no GQA)"},
          {"tail_split", std::to_string(plan.tail_split.tiles) + " tiles x " + std::to_string(plan.tail_split.pieces)},
          {"dq_overlap", plan.dq_overlap ? "yes" : "no"},
          {"programmatic_main", plan.programmatic_main ? "yes" : "no"},
          {"tile_order_tail", std::to_string(plan.tile_order_tail)}};
}

}  // namespace fa2
