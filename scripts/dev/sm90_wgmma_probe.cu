// Checks fa2's wgmma building blocks (cuda/include/fa2/sm90/wgmma.cuh) on an sm_90 GPU before a kernel relies on
// them: the descriptors of SwizzledTile layouts as K-major A and B operands (S = Q K^T) and as an N-major B operand
// with A from registers (O = P V), for 128-byte and 64-byte swizzles, bf16 and f16, against a double reference; and
// sm90::gemm_ss in the backward's forms: M-major A and N-major B taken from a column offset (dV += P^T dO,
// dK += dS^T Q), K-major A with N-major B (dQ = dS K).
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -I cuda/include scripts/dev/sm90_wgmma_probe.cu -o /tmp/sm90_wgmma_probe && /tmp/sm90_wgmma_probe
// Prints one line per case; exits 1 if any case is off.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <type_traits>
#include <vector>

#include "fa2/sm90/wgmma.cuh"

using fa2::SwizzledTile;
namespace sm90 = fa2::sm90;

__host__ __device__ constexpr int block_cols(int cols) { return cols % 64 == 0 ? 64 : 32; }

// Copies a row-major (rows x cols) b16 matrix from global memory into a SwizzledTile in shared memory.
template <class Tile, typename T>
__device__ void fill_tile(T* tile, const T* src, int rows, int cols) {
  for (int i = threadIdx.x; i < rows * cols / 8; i += blockDim.x) {
    const int row = i / (cols / 8), chunk = i % (cols / 8);
    *reinterpret_cast<uint4*>(tile + Tile::offset(row, chunk)) = *reinterpret_cast<const uint4*>(src + row * cols + chunk * 8);
  }
}

// This thread's accumulators (m64nN layout) into a row-major (64 x N) fp32 matrix.
template <int N>
__device__ void store_accumulators(const float (&d)[N / 2], float* c) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  for (int j = 0; j < N / 8; ++j) {
    const int row = 16 * warp + g, col = 8 * j + 2 * t;
    c[row * N + col] = d[4 * j];
    c[row * N + col + 1] = d[4 * j + 1];
    c[(row + 8) * N + col] = d[4 * j + 2];
    c[(row + 8) * N + col + 1] = d[4 * j + 3];
  }
}

// C (64 x N) = A (64 x K) B^T, A and B (N x K) row-major: both K-major operands from shared memory. A sits in rows
// kARow0 .. kARow0 + 63 of a (kARow0 + 64)-row tile (the kernel's Q tile is 128 rows, one warpgroup per 64).
template <typename T, int N, int K, int kARow0>
__global__ void __launch_bounds__(128) ss_kernel(const T* a, const T* b, float* c) {
  using ATile = SwizzledTile<kARow0 + 64, K, block_cols(K)>;
  using BTile = SwizzledTile<N, K, block_cols(K)>;
  extern __shared__ __align__(1024) unsigned char smem[];
  T* sa = reinterpret_cast<T*>(smem);
  T* sb = reinterpret_cast<T*>(smem + ATile::kBytes);
  fill_tile<ATile>(sa + kARow0 * block_cols(K), a, 64, K);  // rows kARow0.. (whole 8-row groups: same swizzle)
  fill_tile<BTile>(sb, b, N, K);
  sm90::fence_proxy_async();
  __syncthreads();
  const uint32_t sa_addr = fa2::ptx::smem_u32(sa), sb_addr = fa2::ptx::smem_u32(sb);
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  sm90::hold_registers(d);
  sm90::fence();
#pragma unroll
  for (int k16 = 0; k16 < K / 16; ++k16) {  // rows kARow0.. of the A tile: as the kernel's second warpgroup reads Q
    sm90::Wgmma<T, N>::template ss<0>(d, sm90::TileDescriptors<ATile>::k_major(sa_addr, kARow0, k16),
                                      sm90::TileDescriptors<BTile>::k_major(sb_addr, 0, k16), k16 > 0);
  }
  sm90::commit_group();
  sm90::wait_group<0>();
  sm90::hold_registers(d);
  store_accumulators<N>(d, c);
}

// C (64 x N) = A (64 x K) B, A row-major from registers, B (K x N) row-major = N-major from shared memory.
template <typename T, int N, int K>
__global__ void __launch_bounds__(128) rs_kernel(const T* a, const T* b, float* c) {
  using BTile = SwizzledTile<K, N, block_cols(N)>;
  extern __shared__ __align__(1024) unsigned char smem[];
  T* sb = reinterpret_cast<T*>(smem);
  fill_tile<BTile>(sb, b, K, N);
  sm90::fence_proxy_async();
  __syncthreads();
  const uint32_t sb_addr = fa2::ptx::smem_u32(sb);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  auto pair = [&](int row, int col) {  // two consecutive b16 of A as one 32-bit register
    return *reinterpret_cast<const uint32_t*>(a + row * K + col);
  };
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  uint32_t frag[K / 16][4];
#pragma unroll
  for (int k16 = 0; k16 < K / 16; ++k16) {
    const int row = 16 * warp + g, col = 16 * k16 + 2 * t;
    frag[k16][0] = pair(row, col);
    frag[k16][1] = pair(row + 8, col);
    frag[k16][2] = pair(row, col + 8);
    frag[k16][3] = pair(row + 8, col + 8);
  }
  sm90::hold_registers(d);
  sm90::hold_fragments(frag);
  sm90::fence();
#pragma unroll
  for (int k16 = 0; k16 < K / 16; ++k16) {
    sm90::Wgmma<T, N>::template rs<1>(d, frag[k16], sm90::TileDescriptors<BTile>::mn_major(sb_addr, k16), k16 > 0);
  }
  sm90::commit_group();
  sm90::wait_group<0>();
  sm90::hold_registers(d);
  sm90::hold_fragments(frag);
  store_accumulators<N>(d, c);
}

// The backward's products through sm90::gemm_ss: C (64 x N) = A B with
//   A: kAMn ? columns kACol0 .. + 63 of a (K x kACols) row-major matrix (M-major) : rows 0..63 of a (64 x K) one;
//   B: kBMn ? columns kBCol0 .. + N - 1 of a (K x kBCols) row-major matrix (N-major) : a (N x K) one (B^T, K-major).
template <typename T, int N, int K, bool kAMn, int kACols, int kACol0, bool kBMn, int kBCols, int kBCol0>
__global__ void __launch_bounds__(128) gemm_ss_kernel(const T* a, const T* b, float* c) {
  using ATile = std::conditional_t<kAMn, SwizzledTile<K, kACols, block_cols(kACols)>, SwizzledTile<64, K, block_cols(K)>>;
  using BTile = std::conditional_t<kBMn, SwizzledTile<K, kBCols, block_cols(kBCols)>, SwizzledTile<N, K, block_cols(K)>>;
  extern __shared__ __align__(1024) unsigned char smem[];
  T* sa = reinterpret_cast<T*>(smem);
  T* sb = reinterpret_cast<T*>(smem + ATile::kBytes);
  fill_tile<ATile>(sa, a, kAMn ? K : 64, kAMn ? kACols : K);
  fill_tile<BTile>(sb, b, kBMn ? K : N, kBMn ? kBCols : K);
  sm90::fence_proxy_async();
  __syncthreads();
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  sm90::gemm_ss<T, N, K / 16, kAMn, kBMn, ATile, BTile>(d, fa2::ptx::smem_u32(sa), kAMn ? kACol0 : 0,
                                                         fa2::ptx::smem_u32(sb), kBMn ? kBCol0 : 0);
  store_accumulators<N>(d, c);
}

template <typename T>
float to_float(T x) { return static_cast<float>(x); }

template <typename T>
std::vector<T> random_matrix(size_t n, std::mt19937& gen) {
  std::normal_distribution<float> dist;
  std::vector<T> m(n);
  for (auto& x : m) x = T(dist(gen));
  return m;
}

// Runs kernel(a, b, c) as one 128-thread CTA with smem bytes of dynamic shared memory and compares its (64 x N)
// fp32 output with sum_k a_at(i, k) * b_at(k, j) in double. Prints one line; true when within fp32 accumulation of
// exact b16 products.
template <typename T, int N, int K, typename Kernel, typename AAt, typename BAt>
bool check_product(const char* name, const std::vector<T>& a, const std::vector<T>& b, Kernel kernel, int smem,
                   AAt a_at, BAt b_at) {
  T *da, *db;
  float* dc;
  cudaMalloc(&da, a.size() * sizeof(T));
  cudaMalloc(&db, b.size() * sizeof(T));
  cudaMalloc(&dc, 64 * N * sizeof(float));
  cudaMemcpy(da, a.data(), a.size() * sizeof(T), cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * sizeof(T), cudaMemcpyHostToDevice);
  cudaMemset(dc, 0xff, 64 * N * sizeof(float));  // NaN: unwritten outputs show
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  kernel<<<1, 128, smem>>>(da, db, dc);
  cudaError_t err = cudaDeviceSynchronize();
  std::vector<float> c(64 * N);
  cudaMemcpy(c.data(), dc, c.size() * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  if (err != cudaSuccess) {
    std::printf("%-34s CUDA error: %s\n", name, cudaGetErrorString(err));
    return false;
  }
  double max_err = 0, max_ref = 0;
  for (int i = 0; i < 64; ++i) {
    for (int j = 0; j < N; ++j) {
      double ref = 0;
      for (int k = 0; k < K; ++k) ref += a_at(i, k) * b_at(k, j);
      const double e = std::fabs(double(c[i * N + j]) - ref);
      max_err = std::isnan(e) ? INFINITY : std::max(max_err, e);
      max_ref = std::max(max_ref, std::fabs(ref));
    }
  }
  const bool ok = max_err <= 1e-4 * max_ref + 1e-4;
  std::printf("%-34s max |err| %.2e (max |ref| %.1f)  %s\n", name, max_err, max_ref, ok ? "ok" : "WRONG");
  return ok;
}

template <typename T, int N, int K, bool kAMn, int kACols, int kACol0, bool kBMn, int kBCols, int kBCol0>
bool run_gemm_case(const char* name) {
  std::mt19937 gen(N * 1000 + K + kACol0 + kBCol0);
  const std::vector<T> a = random_matrix<T>(kAMn ? K * kACols : 64 * K, gen);
  const std::vector<T> b = random_matrix<T>(kBMn ? K * kBCols : N * K, gen);
  return check_product<T, N, K>(
      name, a, b, gemm_ss_kernel<T, N, K, kAMn, kACols, kACol0, kBMn, kBCols, kBCol0>, int(a.size() + b.size()) * 2,
      [&](int i, int k) { return double(to_float(kAMn ? a[k * kACols + kACol0 + i] : a[i * K + k])); },
      [&](int k, int j) { return double(to_float(kBMn ? b[k * kBCols + kBCol0 + j] : b[j * K + k])); });
}

template <typename T, int N, int K, bool kRegisterA, int kARow0 = 0>
bool run_case(const char* name) {
  std::mt19937 gen(N * 1000 + K);
  const std::vector<T> a = random_matrix<T>(64 * K, gen);
  const std::vector<T> b = random_matrix<T>(size_t(K) * N, gen);  // (K x N) for rs, (N x K) for ss
  const int smem = (kRegisterA ? 0 : (kARow0 + 64) * K * 2) + K * N * 2;
  auto kernel = kRegisterA ? rs_kernel<T, N, K> : ss_kernel<T, N, K, kARow0>;
  return check_product<T, N, K>(
      name, a, b, kernel, smem, [&](int i, int k) { return double(to_float(a[i * K + k])); },
      [&](int k, int j) { return double(to_float(kRegisterA ? b[k * N + j] : b[j * K + k])); });
}

int main() {
  bool ok = true;
  // S = Q K^T: A = Q (64 x d), B = K (kBlockN x d), both K-major
  ok &= run_case<__nv_bfloat16, 128, 128, false>("ss bf16 n128 k128 (128B swizzle)");
  ok &= run_case<__nv_bfloat16, 64, 64, false>("ss bf16 n64 k64");
  ok &= run_case<__nv_bfloat16, 128, 256, false>("ss bf16 n128 k256 (4 column blocks)");
  ok &= run_case<__nv_bfloat16, 128, 96, false>("ss bf16 n128 k96 (64B swizzle)");
  ok &= run_case<__half, 192, 64, false>("ss f16 n192 k64");
  ok &= run_case<__nv_bfloat16, 128, 128, false, 64>("ss bf16 n128 k128, A rows 64..127");
  ok &= run_case<__nv_bfloat16, 64, 96, false, 64>("ss bf16 n64 k96, A rows 64..127 (64B)");
  // O = P V: A = P (64 x kBlockN) in registers, B = V (kBlockN x d), N-major
  ok &= run_case<__nv_bfloat16, 128, 128, true>("rs bf16 n128 k128 (128B swizzle)");
  ok &= run_case<__nv_bfloat16, 64, 64, true>("rs bf16 n64 k64");
  ok &= run_case<__nv_bfloat16, 256, 64, true>("rs bf16 n256 k64 (4 column blocks)");
  ok &= run_case<__nv_bfloat16, 96, 128, true>("rs bf16 n96 k128 (64B swizzle)");
  ok &= run_case<__half, 128, 128, true>("rs f16 n128 k128");
  // backward (gemm_ss): dV += P^T dO / dK += dS^T Q, A = columns of P (queries x keys), B = columns of dO (queries x d)
  ok &= run_gemm_case<__nv_bfloat16, 64, 128, true, 128, 64, true, 64, 0>("bwd dKV d64: P^T cols 64.., dO");
  ok &= run_gemm_case<__nv_bfloat16, 128, 64, true, 128, 64, true, 128, 0>("bwd dKV d128: P^T cols 64.., dO 2 blk");
  ok &= run_gemm_case<__half, 128, 64, true, 64, 0, true, 256, 128>("bwd dKV d256 f16: dO cols 128..");
  ok &= run_gemm_case<__nv_bfloat16, 32, 128, true, 128, 64, true, 32, 0>("bwd dKV d32: dO 64B swizzle");
  // dQ = dS K: A = dS rows (K-major), B = columns of K (keys x d)
  ok &= run_gemm_case<__nv_bfloat16, 64, 128, false, 0, 0, true, 128, 64>("bwd dQ d128: K cols 64..");
  ok &= run_gemm_case<__half, 64, 128, false, 0, 0, true, 64, 0>("bwd dQ d64 f16");
  std::printf("sm90_wgmma_probe: %s\n", ok ? "all ok" : "FAILED");
  return ok ? 0 : 1;
}
