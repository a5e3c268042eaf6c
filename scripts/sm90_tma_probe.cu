// Checks fa2's TMA building blocks (cuda/include/fa2/sm90/tma.cuh) on an sm_90 GPU: a (rows x d) tile of a
// (batch, seqlen, heads, headdim) tensor, loaded by the TMA one 64- (or 32-) column block at a time, must land in
// shared memory exactly as fa2::SwizzledTile lays it out (what the wgmma descriptors read), with rows past seqlen
// zero-filled; for a BSHD tensor and for a BHSD-transposed view (other strides), bf16, d 128 and 96.
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -I cuda/include scripts/sm90_tma_probe.cu -o /tmp/sm90_tma_probe && /tmp/sm90_tma_probe
// Prints one line per case; exits 1 if any case is off.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "fa2/ptx.cuh"
#include "fa2/sm90/tma.cuh"

using fa2::SwizzledTile;
namespace sm90 = fa2::sm90;

constexpr int kRows = 64;

// Loads rows row0 .. row0 + kRows - 1 of (batch, head) into a SwizzledTile and copies the shared memory out as is.
template <int kD, int kBlockCols>
__global__ void load_kernel(const __grid_constant__ CUtensorMap map, int row0, int head, int batch, uint16_t* out) {
  using Tile = SwizzledTile<kRows, kD, kBlockCols>;
  extern __shared__ __align__(1024) unsigned char smem[];  // [tile] [mbarrier]
  const uint32_t tile = fa2::ptx::smem_u32(smem), bar = tile + Tile::kBytes;
  if (tile % 1024 != 0) __trap();  // the 128-byte swizzle's period: TMA and SwizzledTile agree only from there
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(bar, 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_tx(bar, Tile::kBytes);
    for (int block = 0; block < kD / kBlockCols; ++block) {  // one TMA per column block
      sm90::tma_load_4d(tile + block * kRows * kBlockCols * 2, &map, bar, block * kBlockCols, row0, head, batch);
    }
  }
  sm90::mbarrier_wait(bar, 0);
  for (int i = threadIdx.x; i < Tile::kElems; i += blockDim.x) out[i] = reinterpret_cast<const uint16_t*>(smem)[i];
}

template <int kD>
bool run_case(const char* name, bool transposed_view, int row0) {
  constexpr int kBlockCols = kD % 64 == 0 ? 64 : 32;
  using Tile = SwizzledTile<kRows, kD, kBlockCols>;
  const int B = 2, S = 200, H = 3;
  std::vector<uint16_t> host(size_t(B) * S * H * kD);
  for (size_t i = 0; i < host.size(); ++i) host[i] = uint16_t(0x3c00 + (i * 2654435761u >> 20) % 2000);  // nonzero
  uint16_t *dev, *out;
  cudaMalloc(&dev, host.size() * 2);
  cudaMalloc(&out, Tile::kElems * 2);
  cudaMemcpy(dev, host.data(), host.size() * 2, cudaMemcpyHostToDevice);
  // BSHD: the memory is (B, S, H, D); the BHSD view: the memory is (B, H, S, D), read as (B, S, H, D) with strides
  const int64_t batch_stride = int64_t(S) * H * kD;
  const int64_t row_stride = transposed_view ? kD : int64_t(H) * kD, head_stride = transposed_view ? int64_t(S) * kD : kD;
  CUtensorMap map;
  const char* err = sm90::make_bshd_tensor_map(&map, dev, true, B, S, H, kD, batch_stride, row_stride, head_stride,
                                               kRows, kBlockCols);
  if (err != nullptr) {
    std::printf("%-40s %s\n", name, err);
    return false;
  }
  const int head = 2, batch = 1;
  const int smem = Tile::kBytes + 8;
  cudaFuncSetAttribute(load_kernel<kD, kBlockCols>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  load_kernel<kD, kBlockCols><<<1, 128, smem>>>(map, row0, head, batch, out);
  const cudaError_t cerr = cudaDeviceSynchronize();
  std::vector<uint16_t> got(Tile::kElems);
  cudaMemcpy(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost);
  cudaFree(dev);
  cudaFree(out);
  if (cerr != cudaSuccess) {
    std::printf("%-40s CUDA error: %s\n", name, cudaGetErrorString(cerr));
    return false;
  }
  int wrong = 0;
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kD; ++c) {
      const int s = row0 + r;
      const uint16_t want = s < S ? host[batch * batch_stride + s * row_stride + head * head_stride + c] : 0;
      const uint16_t have = got[Tile::offset(r, c / 8) + c % 8];
      wrong += have != want;
    }
  }
  std::printf("%-40s %s (%d of %d elements off)\n", name, wrong == 0 ? "ok" : "WRONG", wrong, kRows * kD);
  return wrong == 0;
}

int main() {
  bool ok = true;
  ok &= run_case<128>("bshd d128 rows 64..127 (128B swizzle)", false, 64);
  ok &= run_case<128>("bhsd view d128 rows 64..127", true, 64);
  ok &= run_case<128>("bshd d128 rows 192..255 (tail: zeros)", false, 192);
  ok &= run_case<96>("bshd d96 rows 0..63 (64B swizzle)", false, 0);
  ok &= run_case<96>("bhsd view d96 rows 160..223 (tail)", true, 160);
  std::printf("sm90_tma_probe: %s\n", ok ? "all ok" : "FAILED");
  return ok ? 0 : 1;
}
