// The pybind11 module fa2._C: importing it registers the ops (TORCH_LIBRARY in ops.cpp and the backends).
// It holds no logic beyond reporting what this build contains.
#include <pybind11/pybind11.h>

#include <string>

#include "checks.h"
#include "cpu/blas.h"  // bf16_gemm_supported, bf16_gemm_switch
#include "fa2/bwd_tile_config.h"  // bwd_ws_headdim (plain constexpr C++)
#include "fa2_build_info.h"
#if FA2_WITH_CUDA
#include "fa2/bwd_launch.h"
#include "fa2/launch.h"
#else
#include "fa2/tile_config.h"  // Sm90Schedule (plain C++)
namespace fa2 {  // a CPU-only build has no kernels to switch: the development switches read as off
inline void set_arch_specific_kernels(bool) {}
inline bool arch_specific_kernels() { return false; }
inline const char* set_sm90_schedule(const char*) { return "fa2: this build has no CUDA kernels (no sm_90a schedule)"; }
inline void set_sm90_backward(bool) {}
inline bool sm90_backward() { return false; }
inline void set_sm90_ws_backward(bool) {}
inline bool sm90_ws_backward() { return false; }
inline void set_key_bias_backward(bool) {}
inline bool key_bias_backward() { return false; }
inline void set_bwd_small_tiles(bool) {}
inline bool bwd_small_tiles() { return false; }
inline void set_bwd_gqa_grouping(int) {}
inline int bwd_gqa_grouping() { return 0; }
inline void set_bwd_gqa_accumulate(bool) {}
inline bool bwd_gqa_accumulate() { return false; }
inline void set_persistent_forward_ctas(int) {}
inline int persistent_forward_ctas() { return 0; }
inline void set_tile_order_tail(bool) {}
inline bool tile_order_tail_enabled() { return false; }
inline void set_fwd_cluster(bool) {}
inline bool fwd_cluster_enabled() { return false; }
inline void set_bwd_tail_split(int) {}
inline int bwd_tail_split() { return 0; }
inline const char* sm90_schedule(Sm90Schedule* schedule) {
  *schedule = Sm90Schedule::kAuto;
  return nullptr;
}
}  // namespace fa2
#endif

namespace py = pybind11;

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
  // the CPU bf16 tile products (forward and backward) on bf16 operands (MKL's gemm_bf16bf16f32 on AMX,
  // cpu/bf16_dot.h's on AVX512-BF16 without AMX; off: fp32 sgemm on converted tiles); the switch only matters where
  // cpu_bf16_gemm_supported()
  m.def("set_cpu_bf16_gemm", [](bool enabled) { fa2::cpu::bf16_gemm_switch().store(enabled); });
  m.def("cpu_bf16_gemm", &fa2::cpu::bf16_gemm_available);
  m.def("cpu_bf16_gemm_supported", &fa2::cpu::bf16_gemm_supported);
  // Development switches (benchmarks/bench_attention.py's "fa2-sm80", "fa2-pipe", "fa2-ws", ..., tests/test_hopper.py):
  // whether sm_90a instances may run; which schedule the sm_90a forward runs (fa2/launch.h). With getters, so that
  // a benchmark or test can restore them.
  m.def("set_arch_specific_kernels", &fa2::set_arch_specific_kernels);
  m.def("arch_specific_kernels", &fa2::arch_specific_kernels);
  m.def("set_sm90_backward", &fa2::set_sm90_backward);  // the backward's sm_90a (wgmma) instances ("fa2-bwd80": off)
  m.def("sm90_backward", &fa2::sm90_backward);
  // its warp-specialized main kernel where it applies (bwd_launch.h; bench_attention.py's "fa2-bwdnows": off)
  m.def("set_sm90_ws_backward", &fa2::set_sm90_ws_backward);
  m.def("sm90_ws_backward", &fa2::sm90_ws_backward);
  m.def("sm90_ws_backward_headdims", []() {  // the instantiated headdims the warp-specialized backward serves
    py::list dims;
    for (int d : {32, 64, 96, 128, 192, 256}) {
      if (fa2::bwd_ws_headdim(d)) dims.append(d);
    }
    return dims;
  });
  // those of them whose dQ conversion is launched to overlap the main kernel's last CTAs (kOverlapDqConversion)
  m.def("sm90_ws_backward_dq_overlap_headdims", []() {
    py::list dims;
    for (int d : {32, 64, 96, 128, 192, 256}) {
      if (fa2::bwd_ws_overlaps_dq_conversion_at(d)) dims.append(d);
    }
    return dims;
  });
  // the backward's key-row bias variant (padding masks on the plain path's schedule; "fa2-kbias-off": off)
  m.def("set_key_bias_backward", &fa2::set_key_bias_backward);
  m.def("key_bias_backward", &fa2::key_bias_backward);
  // the sm80-path backward's small-shared-memory tiles (sm86 / sm89 take them by themselves): forced, for testing
  m.def("set_bwd_small_tiles", &fa2::set_bwd_small_tiles);
  m.def("bwd_small_tiles", &fa2::bwd_small_tiles);
  // GQA backward: each CTA sums a whole group into dK, dV (sm_90a ws kernels, d 64 / 128 / 256): -1 where the grid
  // keeps enough waves (default), 0 never (one CTA per query head), 1 wherever that kernel runs (tests)
  m.def("set_bwd_gqa_grouping", &fa2::set_bwd_gqa_grouping, py::arg("mode"));
  m.def("bwd_gqa_grouping", &fa2::bwd_gqa_grouping);
  // ... and where one CTA per query head runs that kernel: fp32 accumulators per kv head that its CTAs add into (on,
  // the default) or fp32 partials per query head that torch sums (off; the only way on the other kernels)
  m.def("set_bwd_gqa_accumulate", &fa2::set_bwd_gqa_accumulate, py::arg("enabled"));
  m.def("bwd_gqa_accumulate", &fa2::bwd_gqa_accumulate);
  // the warp-specialized sm_90a forward's persistent grid: -1 one CTA per SM (default), 0 off ("fa2-nopers"),
  // n > 0 at most n CTAs (tests)
  m.def("set_persistent_forward_ctas", &fa2::set_persistent_forward_ctas, py::arg("ctas"));
  m.def("persistent_forward_ctas", &fa2::persistent_forward_ctas);
  // causal launches' longest-first tail (fa2/tile_order.h): on by default, off = head by head (tests, A/B timing)
  m.def("set_tile_order_tail", &fa2::set_tile_order_tail, py::arg("enabled"));
  m.def("tile_order_tail", &fa2::tile_order_tail_enabled);
  // the persistent d 128 forward in clusters of two sharing K/V loads (TMA multicast) where a call allows them: on by
  // default, off = one CTA at a time (tests, A/B timing)
  m.def("set_fwd_cluster", &fa2::set_fwd_cluster, py::arg("enabled"));
  m.def("fwd_cluster", &fa2::fwd_cluster_enabled);
  // the warp-specialized backward's last partial wave split into CTAs over parts of a tile's query blocks
  // (bwd_launch.h): -1 where its tiles have the query blocks it was measured to pay at (default), 0 never (one CTA
  // per tile), 1 wherever the cost model gains (tests, A/B timing)
  m.def("set_bwd_tail_split", &fa2::set_bwd_tail_split, py::arg("mode"));
  m.def("bwd_tail_split", &fa2::bwd_tail_split);
  // what it does on this GPU for a plain (no bias, no softcap, not deterministic) backward call: (tiles split,
  // pieces each, the grid's tiles); (0, 1, 0) where it does not split (or this build has no CUDA kernels)
  m.def("bwd_tail_split_plan", [](int batch, int nheads, int nheads_k, int seqlen_q, int seqlen_k, int headdim,
                                  bool causal) {
#if FA2_WITH_CUDA
    fa2::AttentionParams p;
    p.batch = batch, p.nheads = nheads, p.nheads_k = nheads_k;
    p.h_h_k_ratio = nheads_k > 0 && nheads % nheads_k == 0 ? nheads / nheads_k : 0;
    p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k;
    p.headdim = headdim, p.headdim_rounded = fa2::bwd_headdim_rounded(headdim);
    p.window_right = causal ? 0 : -1;
    const fa2::BwdTailSplitPlan plan = fa2::bwd_tail_split_plan(p);
    return py::make_tuple(plan.tiles, plan.pieces, plan.grid_tiles);
#else
    (void)batch, (void)nheads, (void)nheads_k, (void)seqlen_q, (void)seqlen_k, (void)headdim, (void)causal;
    return py::make_tuple(0, 1, 0);
#endif
  }, py::arg("batch"), py::arg("nheads"), py::arg("nheads_k"), py::arg("seqlen_q"), py::arg("seqlen_k"),
        py::arg("headdim"), py::arg("causal") = false);
  m.def("set_sm90_schedule", [](const std::string& name) {
    if (const char* error = fa2::set_sm90_schedule(name.c_str())) throw py::value_error(error);
  }, py::arg("name"), "auto, pipelined, ws, pingpong, overlap or pingpong-overlap (FA2_SM90_SCHEDULE)");
  m.def("sm90_schedule", []() {
    fa2::Sm90Schedule schedule;
    if (const char* error = fa2::sm90_schedule(&schedule)) throw py::value_error(error);
    return std::string(fa2::sm90_schedule_name(schedule));
  });
  // what "auto" runs at an instantiated headdim on the plain path; windowed: a causal mask or a window
  m.def("sm90_default_schedule", [](int headdim, bool windowed) {
    return std::string(fa2::sm90_schedule_name(fa2::sm90_default_schedule(headdim, windowed)));
  }, py::arg("headdim"), py::arg("windowed"));
  m.def("sm90_key_bias_schedule", [](int headdim) {  // what a key-row bias (padding mask) runs under "auto"
    return std::string(fa2::sm90_schedule_name(fa2::sm90_key_bias_schedule(headdim)));
  }, py::arg("headdim"));
}
