// STUB of the CUDA decode kernel's entry point (decode_cuda.h): takes no problem, so the KV-cache glue always falls
// back to the varlen kernels. The decode helper's decode_cuda.cpp replaces this file.
#include "cuda/decode_cuda.h"

namespace fa2::cuda_glue {

bool try_decode_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, float, bool, int, int,
                          float, int, at::Tensor&, at::Tensor&) {
  return false;
}

}  // namespace fa2::cuda_glue
