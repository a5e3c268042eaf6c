// The pybind11 module fa2._C: importing it registers the ops (TORCH_LIBRARY in ops.cpp and the backends).
// Besides build information it reaches the development namespace (python/fa2/dev.py): the options struct
// (fa2/dev_options.h), the tuning tables the plans use, and the plan of a call (fa2/plan.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <string>
#include <vector>

#include "checks.h"
#include "cpu/blas.h"  // bf16_gemm_supported, bf16_gemm_switch
#include "fa2/bwd_tile_config.h"  // bwd_ws_headdim (plain constexpr C++)
#include "fa2/decode/dense_route.h"
#include "fa2/decode/shape.h"  // decode_shape, choose_splits (plain C++)
#include "fa2/dev_options.h"
#include "fa2/philox.h"  // dropout_keep_threshold
#include "fa2/plan.h"
#include "fa2/tile_config.h"
#include "fa2_build_info.h"
#if FA2_WITH_CUDA
#include "fa2/launch.h"
#if FA2_CUDA_BWD
#include "fa2/bwd_launch.h"
#endif
#endif

namespace py = pybind11;

namespace {

constexpr int kHeaddims[] = {32, 64, 96, 128, 192, 256};

py::dict options_dict(const fa2::DevOptions& o) {
  py::dict d;
  for (int i = 0; i < fa2::kNumDevOptions; ++i) {
    const char* key = fa2::kDevOptionNames[i];
    const std::string v = fa2::dev_option_value(o, key);
    const std::string k = key;
    if (k == "sm90_schedule") {
      d[key] = v;
    } else if (k == "persistent_forward_ctas" || k == "bwd_gqa_grouping" || k == "bwd_tail_split" ||
               k == "cpu_key_splits") {
      d[key] = std::stoi(v);
    } else {
      d[key] = v == "1";
    }
  }
  return d;
}

// A Python value as FA2_DEV_OPTIONS spells it.
std::string option_text(const py::handle& value) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>() ? "1" : "0";
  return py::str(value).cast<std::string>();
}

// The instances a plan for a described device picks from: this build's, or (a build without CUDA kernels) those of
// the default build (FA2_CUDA_ARCHS 80;90;90a, every headdim, fp16 and bf16).
std::vector<fa2::InstanceDesc> plan_instances(bool forward) {
  std::vector<fa2::InstanceDesc> all;
#if FA2_WITH_CUDA
  int n = 0;
  const fa2::InstanceDesc* built = nullptr;
  if (forward) built = fa2::fwd_instances(&n);
#if FA2_CUDA_BWD
  if (!forward) built = fa2::bwd_instances(&n);
#endif
  if (built != nullptr) return std::vector<fa2::InstanceDesc>(built, built + n);
  if (!forward) return all;  // (built without the backward)
#endif
  (void)forward;
  for (fa2::DType t : {fa2::DType::kFloat16, fa2::DType::kBFloat16}) {
    for (int d : kHeaddims) {
      all.push_back({t, d, 80, false});
      all.push_back({t, d, 90, false});
      all.push_back({t, d, 90, true});
    }
  }
  return all;
}

// A described call (plan's arguments) as the glue would fill the params: contiguous (batch, seqlen, heads, headdim)
// tensors, aligned, zero-padded to one headdim (fa2::kernel_headdim) where headdim_v (v's) differs from headdim (q's
// and k's); a bias "key_row" (a padding mask: (batch, 1, 1, seqlen_k) broadcast) or "full" (batch, nheads,
// seqlen_q, seqlen_k) of bias_dtype ("same", "float32", "bool"); dropout_p > 0: dropout on; sinks: sinks given; varlen:
// packed sequences (total_q / total_k rows, default batch x max_seqlen).
fa2::AttentionParams described_params(const py::dict& c, const std::vector<fa2::InstanceDesc>& instances) {
  auto get = [&](const char* k, auto fallback) {
    return c.contains(k) && !c[k].is_none() ? c[k].cast<decltype(fallback)>() : fallback;
  };
  fa2::AttentionParams p;
  p.batch = get("batch", 1), p.nheads = get("nheads", 1), p.nheads_k = get("nheads_k", p.nheads);
  p.seqlen_q = get("seqlen_q", 1), p.seqlen_k = get("seqlen_k", p.seqlen_q);
  const int headdim = get("headdim", 64), headdim_v = get("headdim_v", headdim);  // q/k's, v's
  p.headdim = fa2::kernel_headdim(headdim, headdim_v);
  p.call_headdim_qk = headdim, p.call_headdim_v = headdim_v;
  p.headdim_rounded = fa2::plan_rounded_headdim(instances.data(), int(instances.size()), p.headdim);
  if (p.nheads_k <= 0 || p.nheads % p.nheads_k != 0) {
    throw py::value_error("fa2: nheads must be a multiple of nheads_k");
  }
  p.h_h_k_ratio = p.nheads / p.nheads_k;
  p.dtype = get("dtype", std::string("bfloat16")) == "float16" ? fa2::DType::kFloat16 : fa2::DType::kBFloat16;
  p.scale = get("scale", 1.0 / std::sqrt(double(headdim)));
  p.scale_log2 = float(p.scale * 1.4426950408889634);
  p.softcap = get("softcap", 0.0);
  const bool causal = get("causal", false);
  p.is_causal = causal;
  p.window_left = get("window_left", -1);
  p.window_right = causal ? 0 : get("window_right", -1);
  p.deterministic = get("deterministic", false);
  const int64_t d = p.headdim;
  p.q_row_stride = p.nheads * d, p.q_head_stride = d, p.q_batch_stride = p.seqlen_q * p.q_row_stride;
  p.k_row_stride = p.nheads_k * d, p.k_head_stride = d, p.k_batch_stride = p.seqlen_k * p.k_row_stride;
  p.v_row_stride = p.k_row_stride, p.v_head_stride = d, p.v_batch_stride = p.k_batch_stride;
  p.dout_row_stride = p.q_row_stride, p.dout_head_stride = d, p.dout_batch_stride = p.q_batch_stride;
  p.dk_row_stride = p.k_row_stride, p.dk_head_stride = d, p.dk_batch_stride = p.k_batch_stride;
  p.dv_row_stride = p.k_row_stride, p.dv_head_stride = d, p.dv_batch_stride = p.k_batch_stride;
  p.gqa_dkv = fa2::GqaDkv::kInKernel;
  const std::string bias = get("bias", std::string("none"));
  if (bias != "none") {
    const std::string bt = get("bias_dtype", std::string("same"));
    p.bias_type = bt == "bool" ? fa2::BiasType::kBool
                  : bt == "float32" ? fa2::BiasType::kFloat32 : fa2::BiasType::kSameAsInput;
    p.bias_col_stride = 1;
    if (bias == "key_row") {
      p.bias_batch_stride = p.seqlen_k;
    } else if (bias == "full") {
      p.bias_row_stride = p.seqlen_k, p.bias_head_stride = int64_t(p.seqlen_q) * p.seqlen_k;
      p.bias_batch_stride = p.nheads * p.bias_head_stride;
    } else {
      throw py::value_error("fa2: bias is 'none', 'key_row' or 'full'");
    }
    static float some_buffer[4];  // (an address for dbias: a gradient asked for)
    if (get("bias_requires_grad", false)) p.dbias = some_buffer;
  }
  const double dropout_p = get("dropout_p", 0.0);
  if (dropout_p > 0.0) {
    static const int64_t some_rng_state[2] = {0, 0};  // (an address for rng_state: dropout on)
    p.rng_state = some_rng_state;
    p.dropout_keep_threshold = fa2::dropout_keep_threshold(dropout_p);
    p.dropout_keep_scale = float(1.0 / (1.0 - dropout_p));
  }
  if (get("sinks", false)) {
    static const float some_sinks[1] = {0.f};  // (an address: sinks given)
    p.sinks = some_sinks;
  }
  if (get("varlen", false)) {  // packed sequences: batch sequences of seqlen_q / seqlen_k (their max_seqlen)
    static const int some_cu_seqlens[2] = {0, 0};  // (addresses only: a plan never reads them)
    p.cu_seqlens_q = p.cu_seqlens_k = some_cu_seqlens;
    p.total_q = get("total_q", p.batch * p.seqlen_q), p.total_k = get("total_k", p.batch * p.seqlen_k);
  }
  return p;
}

fa2::DeviceDesc described_device(const py::object& device) {
  fa2::DeviceDesc d;
  if (device.is_none()) {
#if FA2_WITH_CUDA
    return fa2::current_device();
#else
    throw py::value_error("fa2: this build has no CUDA: describe the device (e.g. fa2.dev.DEVICES['h100'])");
#endif
  }
  const py::dict desc = device.cast<py::dict>();
  d.cc = desc["cc"].cast<int>();
  d.sm_count = desc.contains("sm_count") ? desc["sm_count"].cast<int>() : -1;
  d.smem_optin = desc.contains("smem_optin") ? desc["smem_optin"].cast<int>() : -1;
  return d;
}

template <class Plan>
py::dict plan_dict(const Plan& plan, fa2::DType dtype, const fa2::PlanNotes& notes) {
  py::dict d;
  for (const auto& [key, value] : fa2::describe(plan, dtype)) d[py::str(key)] = value;
  d["reasons"] = notes;
  return d;
}

// A described decode call's shape in the decode kernel (fa2.attention_with_kvcache; direction "decode"): its query
// rows per CTA, shared memory and the splits of the KV length (decode/shape.h), from batch, seqlen_q, seqlen_k (the
// cache's capacity), nheads, nheads_k, headdim and num_splits (0: the library's choice). The instance and layout
// checks of the real plan (decode_dispatch.cpp) need tensors; this is the arithmetic that sizes the launch.
py::dict decode_plan_of(const py::dict& c, const fa2::DeviceDesc& dev) {
  auto get = [&](const char* k, int fallback) {
    return c.contains(k) && !c[k].is_none() ? c[k].cast<int>() : fallback;
  };
  const int batch = get("batch", 1), seqlen_q = get("seqlen_q", 1), capacity = get("seqlen_k", 1);
  const int nheads = get("nheads", 1), nheads_k = get("nheads_k", nheads), requested = get("num_splits", 0);
  if (batch <= 0 || seqlen_q <= 0 || capacity <= 0 || nheads_k <= 0 || nheads % nheads_k != 0 || requested < 0) {
    throw py::value_error("fa2: a decode call needs positive sizes, nheads a multiple of nheads_k, num_splits >= 0");
  }
  const std::vector<fa2::InstanceDesc> instances = plan_instances(/*forward=*/true);
  const int headdim = fa2::plan_rounded_headdim(instances.data(), int(instances.size()), get("headdim", 64));
  if (headdim < 0) throw py::value_error("fa2: no instantiated headdim serves this one");
  py::dict d;
  const fa2::decode::DecodeShape shape = fa2::decode::decode_shape(int64_t(seqlen_q) * (nheads / nheads_k), headdim);
  if (shape.decline != nullptr) {
    d["decline"] = shape.decline;
    return d;
  }
  const int64_t ctas = int64_t(batch) * nheads_k * shape.row_blocks;
  d["headdim"] = headdim, d["row_blocks"] = shape.row_blocks, d["warps_m"] = shape.warps_m;
  d["smem_bytes"] = shape.smem_bytes, d["ctas_per_split"] = ctas;
  d["num_splits"] = fa2::decode::choose_splits(ctas, capacity, fa2::decode::decode_tile_config(headdim).block_n,
                                               shape.smem_bytes, dev.sm_count, dev.smem_optin, requested);
  d["device"] = py::dict(py::arg("cc") = dev.cc, py::arg("sm_count") = dev.sm_count,
                         py::arg("smem_optin") = dev.smem_optin);
  return d;
}

py::dict plan_of(const std::string& direction, const py::dict& call, const py::object& device) {
  if (direction == "decode") return decode_plan_of(call, described_device(device));
  fa2::DevOptions options;
  if (const char* e = fa2::dev_options(&options)) throw py::value_error(e);
  const bool forward = direction == "fwd";
  if (!forward && direction != "bwd") throw py::value_error("fa2: direction is 'fwd', 'bwd' or 'decode'");
  const std::vector<fa2::InstanceDesc> instances = plan_instances(forward);
  if (instances.empty()) throw py::value_error("fa2: this build has no CUDA backward");
  const fa2::AttentionParams p = described_params(call, instances);
  if (p.headdim_rounded < 0) throw py::value_error("fa2: no instantiated headdim serves this one");
  const fa2::DeviceDesc dev = described_device(device);
  fa2::PlanNotes notes;
  py::dict d;
  if (forward) {
    d = plan_dict(fa2::plan_fwd(p, dev, options, instances.data(), int(instances.size()), fa2::PlanBuffers::kDecide,
                                &notes), p.dtype, notes);
    // (fa2.attention's call, not varlen's: the glue hands decode-shaped ones to the decode kernel, this plan the
    // fallback where that kernel declines the layout)
    const bool key_mask = fa2::decode::bias_is_key_mask(p.bias_type == fa2::BiasType::kBool, p.nheads,
                                                        p.bias_head_stride, p.seqlen_q, p.bias_row_stride, p.seqlen_k,
                                                        p.bias_col_stride);
    d["decode_kernel"] = p.cu_seqlens_q == nullptr && fa2::decode::dense_call_goes_to_decode(
        p.seqlen_q, p.nheads, p.nheads_k, p.bias_type != fa2::BiasType::kNone && !key_mask, p.rng_state != nullptr,
        p.sinks != nullptr, p.call_headdim_v != p.call_headdim_qk, options);
  } else {
    const fa2::BwdPlan plan = fa2::plan_bwd(p, dev, options, instances.data(), int(instances.size()),
                                            fa2::PlanBuffers::kDecide, &notes);
    d = plan_dict(plan, p.dtype, notes);
    d["tail_split_plan"] = py::make_tuple(plan.tail_split.tiles, plan.tail_split.pieces, plan.tail_split.grid_tiles);
  }
  const std::string padding = fa2::headdim_padding(p);
  d["padding"] = padding.empty() ? std::string("none") : padding;
  d["device"] = py::dict(py::arg("cc") = dev.cc, py::arg("sm_count") = dev.sm_count,
                         py::arg("smem_optin") = dev.smem_optin);
  return d;
}

// What the plans read from the tile configs (tile_config.h, bwd_tile_config.h): for tests and python -m fa2.
py::dict tuning_tables() {
  py::dict schedules, key_bias, t;
  py::list ws_dims, overlap_dims;
  for (int d : kHeaddims) {
    schedules[py::int_(d)] = py::make_tuple(fa2::sm90_schedule_name(fa2::sm90_default_schedule(d, true)),
                                            fa2::sm90_schedule_name(fa2::sm90_default_schedule(d, false)));
    key_bias[py::int_(d)] = fa2::sm90_schedule_name(fa2::sm90_key_bias_schedule(d));
    if (fa2::bwd_ws_headdim(d)) ws_dims.append(d);
    if (fa2::bwd_ws_overlaps_dq_conversion_at(d)) overlap_dims.append(d);
  }
  t["sm90_default_schedule"] = schedules;  // headdim -> (causal / windowed, neither)
  t["sm90_key_bias_schedule"] = key_bias;
  t["sm90_ws_backward_headdims"] = ws_dims;
  t["sm90_ws_backward_dq_overlap_headdims"] = overlap_dims;
  py::list schedule_names;
  for (const char* n : fa2::kSm90ScheduleNames) schedule_names.append(n);
  t["sm90_schedules"] = schedule_names;
  return t;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "fa2 native extension: registers torch.ops.fa2.* and reports build information";
  m.def("build_info", []() {
    py::dict d;
    d["version"] = FA2_VERSION;
    d["torch_version"] = FA2_BUILT_TORCH_VERSION;
    d["torch_cuda"] = FA2_BUILT_TORCH_CUDA;
    d["with_cuda"] = static_cast<bool>(FA2_BUILT_WITH_CUDA);
    d["cuda_archs"] = FA2_BUILT_CUDA_ARCHS;
    d["kernels"] = FA2_BUILT_KERNELS;
    return d;
  });
  // The compute-capability check of the CUDA path, reachable without such a GPU (tests/test_api.py).
  m.def("_check_compute_capability", [](int major, int minor, const std::string& device, const std::string& name) {
    fa2::check_compute_capability(major, minor, device, name);
  });
  // whether this CPU has bf16 tile products (MKL's gemm_bf16bf16f32 on AMX, cpu/bf16_dot.h's on AVX512-BF16 without
  // AMX): only there does the development option cpu_bf16_gemm change what runs
  m.def("cpu_bf16_gemm_supported", &fa2::cpu::bf16_gemm_supported);
  // The development options (fa2/dev_options.h; python/fa2/dev.py): the process's (defaults: the built-in ones).
  m.def("dev_options", [](bool defaults) {
    fa2::DevOptions o;
    if (!defaults) {
      if (const char* e = fa2::dev_options(&o)) throw py::value_error(e);
    }
    return options_dict(o);
  }, py::arg("defaults") = false);
  // Replaces the process's options with `base` updated by `changes` (all or nothing).
  m.def("set_dev_options", [](const py::dict& base, const py::dict& changes) {
    fa2::DevOptions o;
    for (const py::dict* d : {&base, &changes}) {
      for (auto item : *d) {
        const std::string key = py::str(item.first);
        if (const char* e = fa2::set_dev_option(&o, key.c_str(), option_text(item.second).c_str())) {
          throw py::value_error(e);
        }
      }
    }
    fa2::set_dev_options(o);
  }, py::arg("base"), py::arg("changes"));
  m.def("tuning_tables", &tuning_tables);
  // The plan of a described call ("fwd" or "bwd"; python/fa2/dev.py builds the dict) on a described device (cc,
  // sm_count, smem_optin), or on the current one where device is None (CUDA builds).
  m.def("plan", &plan_of, py::arg("direction"), py::arg("call"), py::arg("device") = py::none());
}
