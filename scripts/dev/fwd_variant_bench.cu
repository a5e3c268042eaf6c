// A/B timing of compile-time variants of the forward kernel (and, built with -DFA2_BWD=1, the backward), without
// torch: one instance (bf16, headdim FA2_HD, sm_90a) built straight from a cuda/include tree, timed with CUDA events
// on random inputs, with and without a (B, 1, 1, S) padding bias (last 10% of keys masked; bf16 / fp32 / bool). Each
// variant is its own nvcc build (about 10 s for the forward), so a device call can build several side by side and
// time them in one run (scripts/dev/fwd_variants.sh). Prints one line per case and direction: TFLOP/s (forward
// 4 B H S^2 D / time, backward 2.5x that; the padded keys counted) and a checksum of out (of dq, dk, dv for the
// backward: variants that must be bitwise equal print the same ones; the backward's dq is summed with atomics, so only
// close).
// FA2_KV_HEADS=n: n K/V heads (GQA / MQA: a divisor of the query heads; the backward then writes fp32 dK / dV partials
// per query head, as the torch glue has it, and the checksums of dk / dv are of those partials).
// Built with -DFA2_CTA_TRACE=1 it also writes each case's CTA timelines to $FA2_TRACE_OUT: the backward's with
// FA2_BWD=1, else the forward's (fa2/cta_trace.cuh; summarized by scripts/dev/cta_trace.py); with -DFA2_CTA_TRACE_TILES=1
// too the forward's every tile of both consumer warpgroups (trace_fwdtiles_* files).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "fa2/fwd_launch_template.cuh"
#if FA2_BWD
#include "fa2/bwd_launch_template.cuh"
#endif

#ifndef FA2_HD
#define FA2_HD 64
#endif

namespace {

#define CHECK_CUDA(x)                                                                    \
  do {                                                                                   \
    cudaError_t e = (x);                                                                 \
    if (e != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

template <typename E>
E* device_copy(const std::vector<E>& host) {
  E* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, host.size() * sizeof(E)));
  CHECK_CUDA(cudaMemcpy(d, host.data(), host.size() * sizeof(E), cudaMemcpyHostToDevice));
  return d;
}

// Median time of fn() in ms: 3 warm-up calls, then 5 batches of about 200 ms of launches in all.
template <typename Fn>
float median_ms(Fn fn) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start));
  fn();
  CHECK_CUDA(cudaEventRecord(stop));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float once_ms = 0.f;
  CHECK_CUDA(cudaEventElapsedTime(&once_ms, start, stop));
  const int per_batch = std::max(2, int(40.f / std::max(once_ms, 1e-3f)));
  std::vector<float> times;
  for (int rep = 0; rep < 5; ++rep) {
    CHECK_CUDA(cudaEventRecord(start));
    for (int i = 0; i < per_batch; ++i) fn();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0.f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms / float(per_batch));
  }
  std::sort(times.begin(), times.end());
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return times[2];
}

// the padding bias of one case: key j of every batch is masked when j >= seqlen - seqlen / 10
template <typename E>
void* padding_bias(int batch, int seqlen, E keep, E masked) {
  std::vector<E> host(size_t(batch) * seqlen);
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < seqlen; ++j) host[size_t(b) * seqlen + j] = j >= seqlen - seqlen / 10 ? masked : keep;
  return device_copy(host);
}

}  // namespace

int main(int argc, char** argv) {
  // usage: fwd_variant_bench [seqlens (comma list, default 1024,4096,16384)] [masks (none,bf16,fp32,bool)]
  //                           [causal: 0, 1 or 0,1 (default 0); causal cases print their mask as "<mask>/c"]
  std::vector<int> seqlens = {1024, 4096, 16384};
  std::string masks = argc > 2 ? argv[2] : "none,bf16,fp32,bool";
  const std::string causal_list = argc > 3 ? argv[3] : "0";
  std::vector<bool> causal_modes;
  for (char c : causal_list) {
    if (c == '0' || c == '1') causal_modes.push_back(c == '1');
  }
  if (argc > 1) {
    seqlens.clear();
    for (char* s = std::strtok(argv[1], ","); s; s = std::strtok(nullptr, ",")) seqlens.push_back(std::atoi(s));
  }
  constexpr int kHeadDim = FA2_HD;
  const int tokens = 16384, hidden = 2048, nheads = hidden / kHeadDim;
  const int nheads_k = std::getenv("FA2_KV_HEADS") ? std::atoi(std::getenv("FA2_KV_HEADS")) : nheads;
  if (nheads_k < 1 || nheads % nheads_k != 0) {
    std::fprintf(stderr, "FA2_KV_HEADS=%d does not divide the %d query heads\n", nheads_k, nheads);
    return 1;
  }
  const bool gqa = nheads_k != nheads;
  uint32_t rng = 12345u;  // inputs uniform in [-2, 2) from a fast LCG (the host fills 10^8 values for S 16k)
  auto uniform = [&rng] {
    rng = rng * 1664525u + 1013904223u;
    return float(rng >> 8) * (4.f / 16777216.f) - 2.f;
  };
  for (int seqlen : seqlens) {
    const int batch = tokens / seqlen;
    const size_t elems = size_t(batch) * seqlen * nheads * kHeadDim;
    const size_t elems_k = size_t(batch) * seqlen * nheads_k * kHeadDim;  // (K, V)
    std::vector<__nv_bfloat16> host(elems);
    __nv_bfloat16* qkv[3];
    for (int i = 0; i < 3; ++i) {
      host.resize(i == 0 ? elems : elems_k);
      for (auto& x : host) x = __float2bfloat16(uniform());
      qkv[i] = device_copy(host);
    }
    host.resize(elems);
    __nv_bfloat16* out = nullptr;
    float* lse = nullptr;
    CHECK_CUDA(cudaMalloc(&out, elems * sizeof(__nv_bfloat16)));
    CHECK_CUDA(cudaMalloc(&lse, size_t(batch) * nheads * seqlen * sizeof(float)));

    int* tile_counter = nullptr;  // the persistent forward's (fa2::fwd_workspace_ints; zeroed before each call)
    CHECK_CUDA(cudaMalloc(&tile_counter, sizeof(int)));

    fa2::AttentionParams p;
    p.q = qkv[0], p.k = qkv[1], p.v = qkv[2], p.out = out, p.lse = lse;
    const int64_t row = int64_t(nheads) * kHeadDim, bstride = row * seqlen;
    const int64_t row_k = int64_t(nheads_k) * kHeadDim, bstride_k = row_k * seqlen;
    p.q_batch_stride = p.out_batch_stride = bstride;
    p.q_row_stride = p.out_row_stride = row;
    p.k_batch_stride = p.v_batch_stride = bstride_k;
    p.k_row_stride = p.v_row_stride = row_k;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.out_head_stride = kHeadDim;
    p.batch = batch, p.seqlen_q = p.seqlen_k = seqlen, p.nheads = nheads, p.nheads_k = nheads_k;
    p.h_h_k_ratio = nheads / nheads_k;
    p.headdim = p.headdim_rounded = kHeadDim;
    p.scale = 1.f / std::sqrt(float(kHeadDim));
    p.scale_log2 = float(double(p.scale) * 1.4426950408889634);
    p.dtype = fa2::DType::kBFloat16;

    for (const bool causal : causal_modes) {
      // causal: bottom-right aligned, folded into window_right as the library does (params.h); FLOPs halved as in
      // benchmarks/bench_attention.py
      p.is_causal = causal;
      p.window_left = -1;
      p.window_right = causal ? 0 : -1;
      // as the torch glue: a tile counter where the persistent forward may claim tiles from one (FA2_NO_TILE_COUNTER:
      // without, for A/B timing)
      p.workspace = causal && fa2::fwd_persistent_headdim(kHeadDim) && std::getenv("FA2_NO_TILE_COUNTER") == nullptr
                        ? tile_counter
                        : nullptr;
      char list[64];
      std::snprintf(list, sizeof(list), "%s", masks.c_str());
      for (char* mask_name = std::strtok(list, ","); mask_name; mask_name = std::strtok(nullptr, ",")) {
        char mask[16];
        std::snprintf(mask, sizeof(mask), "%s%s", mask_name, causal ? "/c" : "");
        void* bias = nullptr;
        p.bias_type = fa2::BiasType::kNone;
        if (std::strcmp(mask_name, "bf16") == 0) {
          bias = padding_bias(batch, seqlen, __float2bfloat16(0.f), __float2bfloat16(-INFINITY));
          p.bias_type = fa2::BiasType::kSameAsInput;
        } else if (std::strcmp(mask_name, "fp32") == 0) {
          bias = padding_bias(batch, seqlen, 0.f, -INFINITY);
          p.bias_type = fa2::BiasType::kFloat32;
        } else if (std::strcmp(mask_name, "bool") == 0) {
          bias = padding_bias<unsigned char>(batch, seqlen, 1, 0);
          p.bias_type = fa2::BiasType::kBool;
        }
        p.bias = bias;
        p.bias_batch_stride = seqlen, p.bias_head_stride = 0, p.bias_row_stride = 0, p.bias_col_stride = 1;

        const double fwd_flops = 4.0 * batch * nheads * double(seqlen) * seqlen * kHeadDim / (causal ? 2 : 1);
        // one weighted sum per result (the forward's out; the backward's dq, dk, dv): variants that compute the same
        // thing agree to rounding (bitwise-equal ones exactly)
        // (fp32: GQA's dK / dV partials, elems of them)
        auto checksum = [&](const void* result_ptr, bool fp32 = false) {
          std::vector<float> result(elems);
          if (fp32) {
            CHECK_CUDA(cudaMemcpy(result.data(), result_ptr, elems * sizeof(float), cudaMemcpyDeviceToHost));
          } else {
            std::vector<__nv_bfloat16> bf(elems);
            CHECK_CUDA(cudaMemcpy(bf.data(), result_ptr, elems * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < elems; ++i) result[i] = __bfloat162float(bf[i]);
          }
          double sum = 0;
          for (size_t i = 0; i < elems; ++i) sum += double(result[i]) * double((i % 7) + 1);
          return sum;
        };
        auto report = [&](const char* pass, const char* what, const char* e, double flops,
                          std::initializer_list<const void*> results) {
          if (e != nullptr) {
            std::fprintf(stderr, "%s: %s\n", what, e);
            std::exit(1);
          }
          std::printf("d %d S %5d mask %-6s %s %6.1f TFLOP/s  checksum", kHeadDim, seqlen, mask, pass, flops / 1e12);
          int index = 0;
          for (const void* r : results) std::printf(" %.6e", checksum(r, gqa && index++ > 0));  // (bwd: dk, dv)
          std::printf("\n");
          std::fflush(stdout);
        };
#if FA2_CTA_TRACE
        // the CTA timelines of the last instrumented launch (fa2/cta_trace.cuh; scripts/dev/cta_trace.py reads them)
        auto dump_trace = [&](const char* pass) {
          const char* dir = std::getenv("FA2_TRACE_OUT");
          if (dir == nullptr) return;
          std::vector<unsigned long long> trace(size_t(fa2::trace::kCtas) * fa2::trace::kSlots);
          CHECK_CUDA(cudaMemcpyFromSymbol(trace.data(), fa2::trace::g_cta_trace, trace.size() * 8));
          char path[512];
          std::snprintf(path, sizeof(path), "%s/trace_%s_d%d_s%d_%s%s.bin", dir, pass, kHeadDim, seqlen, mask_name,
                        causal ? "_c" : "");
          if (FILE* f = std::fopen(path, "wb")) {
            std::fwrite(trace.data(), 8, trace.size(), f);
            std::fclose(f);
          }
        };
#endif
        const char* fwd_error = nullptr;
        const float fwd_ms = median_ms([&] {
          // (timed with it, as the torch glue's at::zeros is)
          if (p.workspace != nullptr) CHECK_CUDA(cudaMemsetAsync(p.workspace, 0, sizeof(int)));
          if (fwd_error == nullptr) fwd_error = fa2::run_fwd_instance<__nv_bfloat16, kHeadDim, 901>(p, nullptr);
        });
        report("fwd", "run_fwd_instance", fwd_error, fwd_flops / (fwd_ms * 1e-3), {out});
#if FA2_CTA_TRACE && !FA2_BWD
        // one more forward launch on a cleared buffer: its CTA timelines
        if (std::getenv("FA2_TRACE_OUT")) {
          std::vector<unsigned long long> zeros(size_t(fa2::trace::kCtas) * fa2::trace::kSlots);
          CHECK_CUDA(cudaMemcpyToSymbol(fa2::trace::g_cta_trace, zeros.data(), zeros.size() * 8));
          if (p.workspace != nullptr) CHECK_CUDA(cudaMemsetAsync(p.workspace, 0, sizeof(int)));
          fa2::run_fwd_instance<__nv_bfloat16, kHeadDim, 901>(p, nullptr);
          CHECK_CUDA(cudaDeviceSynchronize());
          dump_trace(FA2_CTA_TRACE_TILES ? "fwdtiles" : "fwd");  // (cta_trace.py's layout by name)
        }
#endif
  #if FA2_BWD
        {  // the backward of this forward (out, lse as computed above), dout random
          fa2::AttentionParams pb = p;
          // (not the forward's tile counter: the backward's scratch, bwd_workspace_ints: the finished-CTA counts
          // with which its dQ conversion overlaps the main kernel at the headdims that do (kOverlapDqConversion),
          // and its last wave's split (bwd_tail_split_plan; FA2_DEV_OPTIONS=bwd_tail_split=0: none, 1: wherever its cost model
          // gains); FA2_BWD_NO_DQ_OVERLAP=1: no scratch: the conversion after the kernel, no split)
          pb.workspace = nullptr;
          pb.workspace_ints = 0;
          int* bwd_workspace = nullptr;
          if (std::getenv("FA2_BWD_NO_DQ_OVERLAP") == nullptr) {
            pb.workspace_ints = fa2::bwd_workspace_ints(pb);
            if (pb.workspace_ints > 0) {
              CHECK_CUDA(cudaMalloc(&bwd_workspace, size_t(pb.workspace_ints) * sizeof(int)));
              pb.workspace = bwd_workspace;
            }
          }
          for (auto& x : host) x = __float2bfloat16(uniform());
          __nv_bfloat16* dout = device_copy(host);
          __nv_bfloat16 *dq = nullptr, *dk = nullptr, *dv = nullptr;
          float *softmax_d = nullptr, *dq_accum = nullptr, *row_lse = nullptr, *row_shift = nullptr;
          CHECK_CUDA(cudaMalloc(&dq, elems * sizeof(__nv_bfloat16)));
          // (GQA: fp32 partials per query head, the layout of q)
          CHECK_CUDA(cudaMalloc(&dk, elems * (gqa ? sizeof(float) : sizeof(__nv_bfloat16))));
          CHECK_CUDA(cudaMalloc(&dv, elems * (gqa ? sizeof(float) : sizeof(__nv_bfloat16))));
          const size_t rows = size_t(batch) * nheads * seqlen;
          CHECK_CUDA(cudaMalloc(&softmax_d, rows * sizeof(float)));
          CHECK_CUDA(cudaMalloc(&dq_accum, rows * kHeadDim * sizeof(float)));
          CHECK_CUDA(cudaMalloc(&row_lse, rows * sizeof(float)));
          CHECK_CUDA(cudaMalloc(&row_shift, rows * sizeof(float)));
          pb.dout = dout, pb.dq = dq, pb.dk = dk, pb.dv = dv;
          pb.dout_batch_stride = pb.dq_batch_stride = pb.dk_batch_stride = pb.dv_batch_stride = bstride;
          pb.dout_row_stride = pb.dq_row_stride = pb.dk_row_stride = pb.dv_row_stride = row;
          pb.dout_head_stride = pb.dq_head_stride = pb.dk_head_stride = pb.dv_head_stride = kHeadDim;
          pb.softmax_d = softmax_d, pb.dq_accum = dq_accum, pb.row_lse = row_lse, pb.row_shift = row_shift;
          const char* bwd_error = nullptr;
          const float bwd_ms = median_ms([&] {
            if (bwd_error == nullptr) bwd_error = fa2::run_bwd_instance<__nv_bfloat16, kHeadDim, 901>(pb, nullptr);
          });
          report("bwd", "run_bwd_instance", bwd_error, 2.5 * fwd_flops / (bwd_ms * 1e-3), {dq, dk, dv});
#if FA2_CTA_TRACE
          dump_trace("bwd");  // the last backward launch's
#endif
          for (void* t : {(void*)dout, (void*)dq, (void*)dk, (void*)dv, (void*)softmax_d, (void*)dq_accum,
                          (void*)row_lse, (void*)row_shift, (void*)bwd_workspace})
            CHECK_CUDA(cudaFree(t));
        }
  #endif
        if (bias) CHECK_CUDA(cudaFree(bias));
      }
    }
    for (auto& t : qkv) CHECK_CUDA(cudaFree(t));
    CHECK_CUDA(cudaFree(out));
    CHECK_CUDA(cudaFree(lse));
    CHECK_CUDA(cudaFree(tile_counter));
  }
  return 0;
}
