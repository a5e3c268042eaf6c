// The gradient of attention sinks on CUDA (the backward's last step): d sinks[h] = -sum_i exp(sinks[h] - lse_i) * D_i
// over the rows i of head h, where D = rowsum(dout * out) is the backward's softmax_d and lse includes the sink (so
// the exponential is the sink's probability; 0 where lse is +inf, a row that saw no key). One launch: a CTA per head
// sums its rows in a fixed order (deterministic in every mode). Plain C++: nothing here includes torch.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fa2 {

struct SinksGradParams {
  // softmax_d and lse: float32, the same layout: row i of head h of batch b at b * batch_stride + h * head_stride + i
  const float* softmax_d = nullptr;
  const float* lse = nullptr;
  const float* sinks = nullptr;  // float32 (nheads,)
  float* dsinks = nullptr;       // float32 (nheads,), written (not accumulated)
  int batch = 0, nheads = 0;
  int64_t rows = 0;  // rows per (batch, head): seqlen_q (dense) or total_q (varlen, batch 1)
  int64_t batch_stride = 0, head_stride = 0;
};

// Launches the reduction on `stream`, asynchronously; nullptr on success, else a message.
const char* run_sinks_grad(const SinksGradParams& params, cudaStream_t stream);

}  // namespace fa2
