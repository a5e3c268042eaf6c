// Checks fa2's TMA building blocks (cuda/include/fa2/sm90/tma.cuh) on an sm_90 GPU: a (rows x d) tile of a
// (batch, seqlen, heads, headdim) tensor, loaded by the TMA one 64- (or 32-) column block at a time, must land in
// shared memory exactly as fa2::SwizzledTile lays it out (what the wgmma descriptors read), with rows past seqlen
// zero-filled, columns past the tensor's headdim zero-filled; BSHD and BHSD-transposed views, bf16 and f16, 64- and
// 128-row boxes, d 64/96/128/256 tiles, a barrier's second phase, size-1 dims with odd strides.
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -I cuda/include scripts/dev/sm90_tma_probe.cu -o /tmp/sm90_tma_probe && /tmp/sm90_tma_probe
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

// Loads rows row0 .. row0 + kRows - 1 of (batch, head) into a SwizzledTile and copies the shared memory out as is;
// with twice, loads a second time through the same barrier (its phase 1: rows row0 + kRows ..) into the same tile.
template <int kD, int kBlockCols, int kRows>
__global__ void load_kernel(const __grid_constant__ CUtensorMap map, int row0, int head, int batch, bool twice,
                            uint16_t* out) {
  using Tile = SwizzledTile<kRows, kD, kBlockCols>;
  extern __shared__ __align__(1024) unsigned char smem[];  // [tile] [mbarrier]
  const uint32_t tile = fa2::ptx::smem_u32(smem), bar = tile + Tile::kBytes;
  if (tile % 1024 != 0) __trap();  // the 128-byte swizzle's period: TMA and SwizzledTile agree only from there
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(bar, 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  for (int pass = 0; pass < (twice ? 2 : 1); ++pass) {
    if (threadIdx.x == 0) {
      sm90::mbarrier_arrive_expect_tx(bar, Tile::kBytes);
      for (int block = 0; block < kD / kBlockCols; ++block) {  // one TMA per column block
        sm90::tma_load_4d(tile + block * kRows * kBlockCols * 2, &map, bar, block * kBlockCols, row0 + pass * kRows,
                          head, batch);
      }
    }
    sm90::mbarrier_wait(bar, pass & 1);
    __syncthreads();  // everyone saw this phase before the next one is armed
  }
  for (int i = threadIdx.x; i < Tile::kElems; i += blockDim.x) out[i] = reinterpret_cast<const uint16_t*>(smem)[i];
}

struct Case {
  const char* name;
  bool bf16 = true;
  bool transposed_view = false;  // memory (B, H, S, D) read as (B, S, H, D)
  int batch = 2, seqlen = 200, heads = 3;
  int headdim = 0;               // the tensor's (<= the tile's kD: the rest of the tile reads zeros); 0 = kD
  int row0 = 0;
  bool twice = false;
};

template <int kD, int kRows>
bool run_case(Case c) {
  constexpr int kBlockCols = kD % 64 == 0 ? 64 : 32;
  using Tile = SwizzledTile<kRows, kD, kBlockCols>;
  const int B = c.batch, S = c.seqlen, H = c.heads, D = c.headdim ? c.headdim : kD;
  const int Dmem = (D + 7) / 8 * 8;  // rows of 16-byte multiples, as the glue guarantees
  std::vector<uint16_t> host(size_t(B) * S * H * Dmem);
  for (size_t i = 0; i < host.size(); ++i) host[i] = uint16_t(0x3c00 + (i * 2654435761u >> 20) % 2000);  // nonzero
  uint16_t *dev, *out;
  cudaMalloc(&dev, host.size() * 2);
  cudaMalloc(&out, Tile::kElems * 2);
  cudaMemcpy(dev, host.data(), host.size() * 2, cudaMemcpyHostToDevice);
  const int64_t batch_stride = int64_t(S) * H * Dmem;
  const int64_t row_stride = c.transposed_view ? Dmem : int64_t(H) * Dmem;
  const int64_t head_stride = c.transposed_view ? int64_t(S) * Dmem : Dmem;
  // size-1 dims get nonsense strides from the caller (torch allows any): the map must not care
  CUtensorMap map;
  const char* err = sm90::make_bshd_tensor_map(&map, dev, c.bf16, B, S, H, D, B == 1 ? 3 : batch_stride,
                                               S == 1 ? 5 : row_stride, H == 1 ? 7 : head_stride, kRows, kBlockCols);
  if (err != nullptr) {
    std::printf("%-52s %s\n", c.name, err);
    return false;
  }
  const int head = H - 1, batch = B - 1;
  const int smem = Tile::kBytes + 8;
  cudaFuncSetAttribute(load_kernel<kD, kBlockCols, kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  load_kernel<kD, kBlockCols, kRows><<<1, 128, smem>>>(map, c.row0, head, batch, c.twice, out);
  const cudaError_t cerr = cudaDeviceSynchronize();
  std::vector<uint16_t> got(Tile::kElems);
  cudaMemcpy(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost);
  cudaFree(dev);
  cudaFree(out);
  if (cerr != cudaSuccess) {
    std::printf("%-52s CUDA error: %s\n", c.name, cudaGetErrorString(cerr));
    return false;
  }
  int wrong = 0;
  const int first = c.row0 + (c.twice ? kRows : 0);  // the tile holds the last load
  for (int r = 0; r < kRows; ++r) {
    for (int col = 0; col < kD; ++col) {
      const int s = first + r;
      const uint16_t want = s < S && col < D ? host[batch * batch_stride + s * row_stride + head * head_stride + col] : 0;
      const uint16_t have = got[Tile::offset(r, col / 8) + col % 8];
      wrong += have != want;
    }
  }
  std::printf("%-52s %s (%d of %d elements off)\n", c.name, wrong == 0 ? "ok" : "WRONG", wrong, kRows * kD);
  return wrong == 0;
}

int main() {
  bool ok = true;
  ok &= run_case<128, 64>({.name = "bshd d128 64 rows from 64 (128B swizzle)", .row0 = 64});
  ok &= run_case<128, 64>({.name = "bhsd view d128 64 rows from 64", .transposed_view = true, .row0 = 64});
  ok &= run_case<128, 64>({.name = "bshd d128 rows 192.. (tail: zeros)", .row0 = 192});
  ok &= run_case<128, 128>({.name = "bshd d128 128 rows (the kernel's Q/K/V box)", .row0 = 0});
  ok &= run_case<128, 128>({.name = "f16 bshd d128 128 rows, 2nd load = phase 1", .bf16 = false, .row0 = 0,
                            .twice = true});
  ok &= run_case<128, 128>({.name = "headdim 80 in a d128 tile (partial block)", .headdim = 80, .row0 = 0});
  ok &= run_case<256, 64>({.name = "headdim 64 in a d256 tile (blocks out of bounds)", .headdim = 64, .row0 = 100});
  ok &= run_case<64, 128>({.name = "batch 1, heads 1, odd strides of size-1 dims", .batch = 1, .heads = 1,
                           .row0 = 128});
  ok &= run_case<96, 64>({.name = "bshd d96 rows 0..63 (64B swizzle)", .row0 = 0});
  ok &= run_case<96, 128>({.name = "bhsd view d96 128 rows from 160 (tail)", .transposed_view = true, .row0 = 160});
  std::printf("sm90_tma_probe: %s\n", ok ? "all ok" : "FAILED");
  return ok ? 0 : 1;
}
