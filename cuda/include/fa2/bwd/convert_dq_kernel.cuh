// The backward's step 3: dq = scale dq_accum, to f16/bf16.
#pragma once
#include <cstdint>
#include "fa2/bwd/dq_fragment_order.h"
#include "fa2/bwd/preprocess_kernel.cuh"  // row_group_threads
#include "fa2/bwd_ptx.cuh"
#include "fa2/params.h"
#include "fa2/ptx.cuh"

namespace fa2 {
namespace bwd {

// dq = scale * dq_accum, to T; rows in the preprocessing's order. kAfterHeads (launched to overlap the
// warp-specialized main kernel's last CTAs, p.key_blocks_done: bwd_launch_template.cuh): rows in (batch, head, query)
// order instead, the order in which the main kernel's CTAs finish their heads, and a CTA first waits until every
// main-kernel CTA of its rows' heads has counted itself finished; dq_accum is then read through the L2
// (ld.global.cg). (p.dq_accum_fragment_order: whole blocks of DqFragmentOrder::kRows queries read in that order;
// p.varlen_dq_head_rows: a varlen call's blocks, each sequence's from a block boundary, all in that order, the row's
// sequence found in p.cu_seqlens_q; a row in none converts as zeros)
template <typename T, int kHeadDim, int kNThreads, bool kAfterHeads = false>
__global__ void __launch_bounds__(kNThreads) bwd_convert_dq_kernel(const __grid_constant__ AttentionParams p) {
  constexpr int kGroup = row_group_threads<kHeadDim>(), kRowsPerCta = kNThreads / kGroup;
  const int64_t num_rows = int64_t(p.batch) * p.seqlen_q * p.nheads;
  const int64_t first_row = int64_t(blockIdx.x) * kRowsPerCta;
  if constexpr (kAfterHeads) {
    if (threadIdx.x == 0) {
      const int64_t last_row = min(first_row + kRowsPerCta, num_rows) - 1;
      for (int64_t bh = first_row / p.seqlen_q; bh <= last_row / p.seqlen_q; ++bh) {
        while (ptx::ld_acquire_gpu(p.key_blocks_done + bh) < p.key_blocks_per_head) __nanosleep(256);
      }
    }
    __syncthreads();  // (the acquire above, then every thread's reads)
  }
  const int64_t row_id = first_row + threadIdx.x / kGroup;
  const int chunk = threadIdx.x % kGroup;
  if (row_id >= num_rows || chunk * 8 >= p.headdim) return;
  int64_t batch, head, row, acc_row;  // (acc_row: the row of dq_accum, (batch, head, query))
  if constexpr (kAfterHeads) {
    const int64_t bh = row_id / p.seqlen_q;
    row = row_id - bh * p.seqlen_q;
    head = bh % p.nheads;
    batch = bh / p.nheads;
    acc_row = row_id;
  } else {
    head = row_id % p.nheads;
    row = (row_id / p.nheads) % p.seqlen_q;
    batch = row_id / (int64_t(p.nheads) * p.seqlen_q);
    acc_row = (batch * p.nheads + head) * p.seqlen_q + row;
  }
  const float* const row_acc = p.dq_accum + acc_row * kHeadDim + chunk * 8;
  auto load2 = [](const float* at) {
    return kAfterHeads ? __ldcg(reinterpret_cast<const float2*>(at)) : *reinterpret_cast<const float2*>(at);
  };
  auto load4 = [](const float* at) {
    return kAfterHeads ? __ldcg(reinterpret_cast<const float4*>(at)) : *reinterpret_cast<const float4*>(at);
  };
  float4 a, b;
  bool row_major = true;
  if constexpr (kHeadDim == DqFragmentOrder::kCols) {
    using Order = DqFragmentOrder;
    // row r of the block at `block`, columns chunk * 8 ..
    auto load_fragment_order = [&](const float* block, int r) {
      const int c = chunk * 8;  // (columns c, c + 1 are adjacent in the order, as are c + 2 tig, c + 2 tig + 1)
      const float2 v0 = load2(block + Order::offset(r, c)), v1 = load2(block + Order::offset(r, c + 2));
      const float2 v2 = load2(block + Order::offset(r, c + 4)), v3 = load2(block + Order::offset(r, c + 6));
      a = make_float4(v0.x, v0.y, v1.x, v1.y);
      b = make_float4(v2.x, v2.y, v3.x, v3.y);
      row_major = false;
    };
    const int64_t block_row0 = row / Order::kRows * Order::kRows;
    if (!kAfterHeads && p.varlen_dq_head_rows != 0) {
      const int* const cu = p.cu_seqlens_q;
      const int sequences = p.varlen_sequences, packed_row = int(row);
      if (packed_row < __ldg(cu) || packed_row >= __ldg(cu + sequences)) {
        a = b = make_float4(0.f, 0.f, 0.f, 0.f);
        row_major = false;
      } else {
        int lo = 0, hi = sequences;  // (cu[lo] <= packed_row < cu[hi]; the last of equal entries: a non-empty one)
        while (hi - lo > 1) {
          const int mid = (lo + hi) / 2;
          if (__ldg(cu + mid) <= packed_row) {
            lo = mid;
          } else {
            hi = mid;
          }
        }
        const int q_row0 = __ldg(cu + lo), in_sequence = packed_row - q_row0;
        const int64_t block = head * p.varlen_dq_head_rows + Order::varlen_block_row0(q_row0, lo) +
                              in_sequence / Order::kRows * Order::kRows;
        load_fragment_order(p.dq_accum + block * kHeadDim, in_sequence % Order::kRows);
      }
    } else if (p.dq_accum_fragment_order && block_row0 + Order::kRows <= p.seqlen_q) {
      load_fragment_order(row_acc - (row - block_row0) * kHeadDim - chunk * 8, int(row - block_row0));
    }
  }
  if (row_major) {
    a = load4(row_acc);
    b = load4(row_acc + 4);
  }
  const float s = p.scale;
  uint4 packed;
  packed.x = ptx::pack2<T>(a.x * s, a.y * s);
  packed.y = ptx::pack2<T>(a.z * s, a.w * s);
  packed.z = ptx::pack2<T>(b.x * s, b.y * s);
  packed.w = ptx::pack2<T>(b.z * s, b.w * s);
  T* dq = static_cast<T*>(p.dq) + batch * p.dq_batch_stride + row * p.dq_row_stride + head * p.dq_head_stride +
          chunk * 8;
  *reinterpret_cast<uint4*>(dq) = packed;
}

}  // namespace bwd
}  // namespace fa2
