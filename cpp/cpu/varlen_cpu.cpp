// CPU implementation of fa2::varlen_fwd and fa2::varlen_bwd (packed sequences): each sequence is one batch-1 problem
// of the padded CPU kernels (cpu/fwd_kernel.h, cpu/bwd_kernel.h) on views of the packed tensors, with its own
// lengths, so causal and windows align bottom-right per sequence and memory stays O(N) (per-thread tiles; the
// forward's lse goes through one (nheads, total_q) float scratch). Work is shared out by VarlenSchedule: sequences
// too large to share a thread run one after another on every thread (the kernel's parallelism over heads and query /
// key blocks), the others are packed into one task list per thread. A sequence's result does not depend on the
// others or on the schedule, so the backward is deterministic.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <tuple>
#include <vector>

#include "checks.h"
#include "cpu/bwd_kernel.h"
#include "cpu/fwd_kernel.h"

namespace fa2::cpu {
namespace {

// Rows of one sequence: queries [q_begin, q_begin + seqlen_q), keys [k_begin, k_begin + seqlen_k) (the keys it uses:
// seqused_k[b] when given).
struct SequenceSpan {
  int64_t q_begin, seqlen_q, k_begin, seqlen_k;
};

std::vector<SequenceSpan> sequence_spans(const VarlenProblem& vp) {
  const int32_t* cu_q = vp.cu_seqlens_q.const_data_ptr<int32_t>();
  const int32_t* cu_k = vp.cu_seqlens_k.const_data_ptr<int32_t>();
  const int32_t* used = vp.seqused_k.has_value() ? vp.seqused_k->const_data_ptr<int32_t>() : nullptr;
  std::vector<SequenceSpan> spans(vp.problem.batch);
  for (int64_t b = 0; b < vp.problem.batch; ++b) {
    spans[b] = {cu_q[b], cu_q[b + 1] - cu_q[b], cu_k[b], used != nullptr ? used[b] : cu_k[b + 1] - cu_k[b]};
  }
  return spans;
}

// Sequence b as a batch-1 problem of the padded kernels.
AttentionProblem sequence_problem(const AttentionProblem& shared, const SequenceSpan& span) {
  AttentionProblem p = shared;
  p.batch = 1;
  p.seqlen_q = span.seqlen_q;
  p.seqlen_k = span.seqlen_k;
  return p;
}

// Rows [begin, begin + length) of a packed (total, heads, headdim) tensor as a (1, length, heads, headdim) view.
at::Tensor rows_view(const at::Tensor& packed, int64_t begin, int64_t length) {
  return packed.as_strided({1, length, packed.size(1), packed.size(2)},
                           {packed.stride(0), packed.stride(0), packed.stride(1), packed.stride(2)},
                           packed.storage_offset() + begin * packed.stride(0));
}

// Estimated cost of a sequence: score elements it computes (per head, each one a headdim-long product), plus its rows'
// loads and a fixed per-call overhead (worker tiles, views).
int64_t sequence_cost(const AttentionProblem& p, const SequenceSpan& span) {
  constexpr int64_t kCallOverhead = 1 << 14;
  const WindowMask window{span.seqlen_q, span.seqlen_k, p.window_left, p.window_right};
  int64_t visible = 0;
  for (int64_t i = 0; i < span.seqlen_q; ++i) {
    visible += std::max<int64_t>(0, window.last_key(i) - window.first_key(i) + 1);
  }
  return p.nheads * p.headdim * (visible + span.seqlen_q + span.seqlen_k) + kCallOverhead;
}

// How the sequences are shared out among the threads. A sequence whose cost exceeds a thread's fair share of what is
// left runs alone, on every thread (longest first); the rest are dealt longest first to the least loaded thread
// (each thread then runs its list serially).
struct VarlenSchedule {
  std::vector<int64_t> alone;
  std::vector<std::vector<int64_t>> per_thread;

  static VarlenSchedule make(const AttentionProblem& p, const std::vector<SequenceSpan>& spans, int64_t threads) {
    VarlenSchedule schedule;
    std::vector<int64_t> cost(spans.size()), order(spans.size());
    for (size_t b = 0; b < spans.size(); ++b) cost[b] = sequence_cost(p, spans[b]);
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cost[a] > cost[b]; });
    int64_t remaining = std::accumulate(cost.begin(), cost.end(), int64_t{0});
    size_t first_shared = 0;
    while (threads > 1 && first_shared < order.size() && cost[order[first_shared]] * threads > remaining) {
      remaining -= cost[order[first_shared]];
      schedule.alone.push_back(order[first_shared++]);
    }
    schedule.per_thread.resize(std::max<int64_t>(threads, 1));
    std::vector<int64_t> load(schedule.per_thread.size(), 0);
    for (size_t n = first_shared; n < order.size(); ++n) {
      const size_t t = std::min_element(load.begin(), load.end()) - load.begin();
      load[t] += cost[order[n]];
      schedule.per_thread[t].push_back(order[n]);
    }
    return schedule;
  }

  // run(b) for every sequence: the alone ones in turn (run may use every thread), then each thread's list.
  template <typename Run>
  void for_each(const Run& run) const {
    for (const int64_t b : alone) run(b);
    parallel_for(0, static_cast<int64_t>(per_thread.size()), /*grain_size=*/1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        for (const int64_t b : per_thread[t]) run(b);
      }
    });
  }
};

// One sequence's tensors for the forward (views of the packed ones, made on the calling thread: the kernels only read
// their pointers and strides).
struct FwdSequence {
  AttentionProblem problem;
  at::Tensor q, k, v, out, lse;  // lse: (1, nheads, seqlen_q) contiguous, in the scratch
};

std::tuple<at::Tensor, at::Tensor> varlen_fwd_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
    const std::optional<at::Tensor>& seqused_k, std::optional<double> scale, bool causal, int64_t window_left,
    int64_t window_right, double softcap, double dropout_p, const std::optional<at::Tensor>& sinks) {
  const VarlenProblem vp = check_varlen_fwd_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                   seqused_k, scale, causal, window_left, window_right, softcap,
                                                   dropout_p, sinks);
  const int64_t nheads = vp.problem.nheads, total_q = vp.total_q;
  at::Tensor out = at::empty({total_q, nheads, v.size(2)}, q.options());
  at::Tensor lse = at::empty({nheads, total_q}, q.options().dtype(at::kFloat));
  if (total_q * nheads == 0) return {out, lse};

  // The kernel writes a sequence's lse as (nheads, seqlen_q), contiguous: sequence b's block starts at
  // nheads * q_begin, and is copied to lse[:, q_begin : q_begin + seqlen_q] by the same task.
  at::Tensor lse_scratch = at::empty({nheads * total_q}, lse.options());
  const std::vector<SequenceSpan> spans = sequence_spans(vp);
  std::vector<FwdSequence> seqs;
  seqs.reserve(spans.size());
  for (const SequenceSpan& s : spans) {
    seqs.push_back({sequence_problem(vp.problem, s), rows_view(q, s.q_begin, s.seqlen_q),
                    rows_view(k, s.k_begin, s.seqlen_k), rows_view(v, s.k_begin, s.seqlen_k),
                    rows_view(out, s.q_begin, s.seqlen_q),
                    lse_scratch.as_strided({1, nheads, s.seqlen_q}, {nheads * s.seqlen_q, s.seqlen_q, 1},
                                           nheads * s.q_begin)});
  }
  const float* scratch = lse_scratch.const_data_ptr<float>();
  float* lse_out = lse.mutable_data_ptr<float>();
  const VarlenSchedule schedule = VarlenSchedule::make(vp.problem, spans, at::get_num_threads());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "fa2_varlen_fwd_cpu", [&] {
    schedule.for_each([&](int64_t b) {
      FwdSequence& s = seqs[b];
      fwd_kernel<scalar_t>(s.problem, s.q, s.k, s.v, s.out, s.lse);
      const SequenceSpan& span = spans[b];
      for (int64_t h = 0; h < nheads; ++h) {
        const float* src = scratch + nheads * span.q_begin + h * span.seqlen_q;
        std::copy(src, src + span.seqlen_q, lse_out + h * total_q + span.q_begin);
      }
    });
  });
  return {out, lse};
}

// One sequence's tensors for the backward (views, as FwdSequence's).
struct BwdSequence {
  AttentionProblem problem;
  at::Tensor dout, q, k, v, out, lse, dq, dk, dv;  // lse: (1, nheads, seqlen_q) view of (nheads, total_q)
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> varlen_bwd_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, const std::optional<at::Tensor>& seqused_k, std::optional<double> scale, bool causal,
    int64_t window_left, int64_t window_right, double softcap, double dropout_p,
    const std::optional<at::Tensor>& sinks, bool deterministic) {
  // Always deterministic on the CPU (BwdPartition; sequences write disjoint rows), so `deterministic` needs no path.
  (void)deterministic;
  const VarlenProblem vp = check_varlen_bwd_inputs(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                   max_seqlen_k, seqused_k, scale, causal, window_left, window_right,
                                                   softcap, dropout_p, sinks);
  // Gradients in their inputs' memory order, as the padded ops' (empty_grad_like on the packed tensor seen as batch 1).
  at::Tensor dq = empty_grad_like(q.unsqueeze(0)).squeeze(0);
  at::Tensor dk = empty_grad_like(k.unsqueeze(0)).squeeze(0);
  at::Tensor dv = empty_grad_like(v.unsqueeze(0)).squeeze(0);
  // Keys past seqused_k[b] take no part: their gradients are 0 (every other row is written by its sequence).
  if (vp.seqused_k.has_value()) {
    dk.zero_();
    dv.zero_();
  }
  const at::Tensor dsinks = at::empty({0}, q.options());
  const std::vector<SequenceSpan> spans = sequence_spans(vp);
  std::vector<BwdSequence> seqs;
  seqs.reserve(spans.size());
  const int64_t nheads = vp.problem.nheads;
  for (const SequenceSpan& s : spans) {
    const int64_t rows = s.seqlen_q, keys = s.seqlen_k;
    seqs.push_back({sequence_problem(vp.problem, s), rows_view(dout, s.q_begin, rows), rows_view(q, s.q_begin, rows),
                    rows_view(k, s.k_begin, keys), rows_view(v, s.k_begin, keys), rows_view(out, s.q_begin, rows),
                    lse.as_strided({1, nheads, rows}, {lse.stride(0), lse.stride(0), lse.stride(1)},
                                   lse.storage_offset() + s.q_begin * lse.stride(1)),
                    rows_view(dq, s.q_begin, rows), rows_view(dk, s.k_begin, keys), rows_view(dv, s.k_begin, keys)});
  }
  const VarlenSchedule schedule = VarlenSchedule::make(vp.problem, spans, at::get_num_threads());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "fa2_varlen_bwd_cpu", [&] {
    schedule.for_each([&](int64_t b) {
      BwdSequence& s = seqs[b];
      at::Tensor no_dbias;
      bwd_kernel<scalar_t>(s.problem, s.dout, s.q, s.k, s.v, s.out, s.lse, s.dq, s.dk, s.dv, no_dbias);
    });
  });
  return {dq, dk, dv, dsinks};
}

}  // namespace
}  // namespace fa2::cpu

TORCH_LIBRARY_IMPL(fa2, CPU, m) {
  m.impl("varlen_fwd", &fa2::cpu::varlen_fwd_cpu);
  m.impl("varlen_bwd", &fa2::cpu::varlen_bwd_cpu);
}
