// d sinks (fa2/sinks_grad.h): a CTA per head; each thread sums a fixed stride of the head's rows over the batch,
// then the CTA reduces the threads' sums in a fixed tree (warp shuffles, then one warp over the warps' sums): the
// same order every call, so the result does not depend on timing (the deterministic mode needs no other path).
#include "fa2/sinks_grad.h"

#include "fa2/ptx.cuh"  // warp_sum

namespace fa2 {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // rows a thread loads before it adds them: loads in flight hide the memory's latency

__global__ void __launch_bounds__(kThreads) sinks_grad_kernel(const SinksGradParams p) {
  const int h = blockIdx.x;
  const float sink = p.sinks[h];
  // the head's batch * rows rows as one index space (the host keeps it below 2^31), kThreads * kUnroll at a time
  const int rows = static_cast<int>(p.rows), total = p.batch * rows;
  const float* const lse = p.lse + h * p.head_stride;
  const float* const softmax_d = p.softmax_d + h * p.head_stride;
  float sum = 0.f;
  for (int first = 0; first < total; first += kThreads * kUnroll) {
    float l[kUnroll], d[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = first + u * kThreads + static_cast<int>(threadIdx.x);
      const int64_t at = j < total ? (j / rows) * p.batch_stride + j % rows : 0;
      l[u] = j < total ? lse[at] : INFINITY;
      d[u] = j < total ? softmax_d[at] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      // (a row that saw no key: lse = +inf, its sink probability 0)
      if (l[u] != INFINITY) sum = fmaf(expf(sink - l[u]), d[u], sum);
    }
  }
  sum = ptx::warp_sum(sum);
  __shared__ float warp_sums[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp != 0) return;
  sum = ptx::warp_sum(lane < kThreads / 32 ? warp_sums[lane] : 0.f);
  if (lane == 0) p.dsinks[h] = -sum;
}

}  // namespace

const char* run_sinks_grad(const SinksGradParams& params, cudaStream_t stream) {
  if (params.nheads == 0) return nullptr;
  if (static_cast<int64_t>(params.batch) * params.rows > 0x7fffffff) {
    return "fa2 sinks backward: too many rows per head";
  }
  sinks_grad_kernel<<<params.nheads, kThreads, 0, stream>>>(params);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace fa2
