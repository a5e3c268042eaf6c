// One launch helper for the kernels that may run as programmatic dependents (sm90 PDL) of the grid before them.
#pragma once
#include <cuda_runtime.h>

#include <utility>

namespace fa2 {

// kernel<<<grid, block, smem, stream>>>(args...), with `programmatic` as a programmatic dependent of the grid before
// it on the stream (cudaLaunchAttributeProgrammaticStreamSerialization): it may start once every CTA of that grid has
// triggered (ptx::launch_dependent_grids) and waits for that grid's results itself (ptx::wait_for_prior_grids).
// Returns the launch's error, cleared from CUDA's last error as a <<<>>> launch's check clears it.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          bool programmatic, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t launch{};
  launch.gridDim = grid;
  launch.blockDim = block;
  launch.dynamicSmemBytes = smem;
  launch.stream = stream;
  launch.attrs = &attribute;
  launch.numAttrs = programmatic ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&launch, kernel, std::forward<Args>(args)...);
  const cudaError_t last = cudaGetLastError();
  return err != cudaSuccess ? err : last;
}

}  // namespace fa2
