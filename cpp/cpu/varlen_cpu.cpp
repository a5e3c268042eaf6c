// CPU implementation of fa2::varlen_fwd and fa2::varlen_bwd (packed sequences): each sequence, or each run of
// adjacent sequences of equal lengths, is one problem of the padded CPU kernels (cpu/fwd_kernel.h, cpu/bwd_kernel.h)
// on views of the packed tensors, with its own lengths, so causal and windows align bottom-right per sequence and
// memory stays O(N) (per-thread tiles; the forward's lse goes through one (nheads, total_q) float scratch). Work is
// shared out by VarlenSchedule: runs too large to share a thread run one after another on every thread (the kernel's
// parallelism over heads and query / key blocks), the others are dealt into one task list per thread. Sequences write
// disjoint rows and the schedule depends only on the lengths and the thread count: the backward is deterministic.
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
#include "dropout_state.h"
#include "cpu/bwd_kernel.h"
#include "cpu/fwd_kernel.h"
#include "sinks_grad.h"

namespace fa2::cpu {
namespace {

// `count` consecutive sequences of the same lengths whose rows follow one another: queries from q_begin, keys (those
// used: seqused_k[b] when given) from k_begin, seqlen_q / seqlen_k rows each. One batched problem of the padded
// kernels: most runs of a mixed batch hold one sequence; equal lengths (fixed-length chunks) make one call, with no
// per-sequence cost.
struct SequenceRun {
  int64_t q_begin, k_begin, seqlen_q, seqlen_k, count;
  int64_t first;  // the run's first sequence: its batch coordinate in the dropout mask (fa2/philox.h)
};

std::vector<SequenceRun> sequence_runs(const VarlenProblem& vp) {
  const int32_t* cu_q = vp.cu_seqlens_q.const_data_ptr<int32_t>();
  const int32_t* cu_k = vp.cu_seqlens_k.const_data_ptr<int32_t>();
  const int32_t* used = vp.seqused_k.has_value() ? vp.seqused_k->const_data_ptr<int32_t>() : nullptr;
  std::vector<SequenceRun> runs;
  for (int64_t b = 0; b < vp.problem.batch; ++b) {
    const int64_t seqlen_q = cu_q[b + 1] - cu_q[b];
    const int64_t seqlen_k = used != nullptr ? used[b] : cu_k[b + 1] - cu_k[b];
    if (!runs.empty()) {
      SequenceRun& run = runs.back();
      // (the run's keys fill their sequences: no unused keys between them)
      if (run.seqlen_q == seqlen_q && run.seqlen_k == seqlen_k && run.k_begin + run.count * seqlen_k == cu_k[b]) {
        ++run.count;
        continue;
      }
    }
    runs.push_back({cu_q[b], cu_k[b], seqlen_q, seqlen_k, 1, b});
  }
  return runs;
}

// A run as a (count)-batch problem of the padded kernels.
AttentionProblem run_problem(const AttentionProblem& shared, const SequenceRun& run) {
  AttentionProblem p = shared;
  p.batch = run.count;
  p.seqlen_q = run.seqlen_q;
  p.seqlen_k = run.seqlen_k;
  return p;
}

// Rows [begin, begin + count * length) of a packed (total, heads, headdim) tensor as a (count, length, heads,
// headdim) view.
at::Tensor rows_view(const at::Tensor& packed, int64_t begin, int64_t length, int64_t count) {
  return packed.as_strided({count, length, packed.size(1), packed.size(2)},
                           {length * packed.stride(0), packed.stride(0), packed.stride(1), packed.stride(2)},
                           packed.storage_offset() + begin * packed.stride(0));
}

// Estimated cost of a run: score elements it computes (per head, each one a headdim-long product), plus its rows'
// loads and a fixed per-call overhead (worker tiles, views).
int64_t run_cost(const AttentionProblem& p, const SequenceRun& run) {
  constexpr int64_t kCallOverhead = 1 << 14;
  const WindowMask window{run.seqlen_q, run.seqlen_k, p.window_left, p.window_right};
  int64_t visible = 0;
  for (int64_t i = 0; i < run.seqlen_q; ++i) {
    visible += std::max<int64_t>(0, window.last_key(i) - window.first_key(i) + 1);
  }
  return run.count * p.nheads * p.headdim * (visible + run.seqlen_q + run.seqlen_k) + kCallOverhead;
}

// How the runs are shared out among the threads. A run whose cost exceeds a thread's fair share of what is left runs
// alone, on every thread (costliest first); the rest are dealt costliest first to the least loaded thread (each thread
// then runs its list serially).
struct VarlenSchedule {
  std::vector<int64_t> alone;
  std::vector<std::vector<int64_t>> per_thread;

  static VarlenSchedule make(const AttentionProblem& p, const std::vector<SequenceRun>& runs, int64_t threads) {
    VarlenSchedule schedule;
    std::vector<int64_t> cost(runs.size()), order(runs.size());
    for (size_t r = 0; r < runs.size(); ++r) cost[r] = run_cost(p, runs[r]);
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

  // run(r) for every run: the alone ones in turn (run may use every thread), then each thread's list.
  template <typename Run>
  void for_each(const Run& run) const {
    for (const int64_t b : alone) run(b);
    if (per_thread[0].empty()) return;  // (dealt to the least loaded first: all empty when the first is)
    parallel_for(0, static_cast<int64_t>(per_thread.size()), /*grain_size=*/1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        for (const int64_t b : per_thread[t]) run(b);
      }
    });
  }
};

// One run's tensors for the forward (views of the packed ones, made on the calling thread: the kernels only read
// their pointers and strides).
struct FwdRun {
  AttentionProblem problem;
  at::Tensor q, k, v, out, lse;  // lse: (count, nheads, seqlen_q) contiguous, in the scratch
};

std::tuple<at::Tensor, at::Tensor> varlen_fwd_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
    const std::optional<at::Tensor>& seqused_k, std::optional<double> scale, bool causal, int64_t window_left,
    int64_t window_right, double softcap, double dropout_p, const std::optional<at::Tensor>& sinks,
    const std::optional<at::Tensor>& rng_state) {
  VarlenProblem vp = check_varlen_fwd_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                   seqused_k, scale, causal, window_left, window_right, softcap,
                                                   dropout_p, sinks, rng_state);
  resolve_rng_state(vp.problem, q, "fa2.varlen_fwd", /*draw=*/true);
  const int64_t nheads = vp.problem.nheads, total_q = vp.total_q;
  at::Tensor out = at::empty({total_q, nheads, v.size(2)}, q.options());
  at::Tensor lse = at::empty({nheads, total_q}, q.options().dtype(at::kFloat));
  if (total_q * nheads == 0) return {out, lse};

  // The kernel writes a run's lse as (count, nheads, seqlen_q), contiguous: the run's block starts at
  // nheads * q_begin, and the same task copies it to lse[:, q_begin : q_begin + count * seqlen_q].
  at::Tensor lse_scratch = at::empty({nheads * total_q}, lse.options());
  const std::vector<SequenceRun> runs = sequence_runs(vp);
  std::vector<FwdRun> views;
  views.reserve(runs.size());
  for (const SequenceRun& r : runs) {
    views.push_back({run_problem(vp.problem, r), rows_view(q, r.q_begin, r.seqlen_q, r.count),
                     rows_view(k, r.k_begin, r.seqlen_k, r.count), rows_view(v, r.k_begin, r.seqlen_k, r.count),
                     rows_view(out, r.q_begin, r.seqlen_q, r.count),
                     lse_scratch.as_strided({r.count, nheads, r.seqlen_q},
                                            {nheads * r.seqlen_q, r.seqlen_q, 1}, nheads * r.q_begin)});
  }
  const float* scratch = lse_scratch.const_data_ptr<float>();
  float* lse_out = lse.mutable_data_ptr<float>();
  const VarlenSchedule schedule = VarlenSchedule::make(vp.problem, runs, at::get_num_threads());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "fa2_varlen_fwd_cpu", [&] {
    schedule.for_each([&](int64_t index) {
      FwdRun& t = views[index];
      const SequenceRun& r = runs[index];
      fwd_kernel<scalar_t>(t.problem, t.q, t.k, t.v, t.out, t.lse, /*dropout_batch0=*/r.first);
      for (int64_t n = 0; n < r.count; ++n) {
        for (int64_t h = 0; h < nheads; ++h) {
          const float* src = scratch + nheads * r.q_begin + (n * nheads + h) * r.seqlen_q;
          std::copy(src, src + r.seqlen_q, lse_out + h * total_q + r.q_begin + n * r.seqlen_q);
        }
      }
    });
  });
  return {out, lse};
}

// One run's tensors for the backward (views, as FwdRun's).
struct BwdRun {
  AttentionProblem problem;
  at::Tensor dout, q, k, v, out, lse, dq, dk, dv;  // lse: (count, nheads, seqlen_q) view of (nheads, total_q)
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> varlen_bwd_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, const std::optional<at::Tensor>& seqused_k, std::optional<double> scale, bool causal,
    int64_t window_left, int64_t window_right, double softcap, double dropout_p,
    const std::optional<at::Tensor>& sinks, bool deterministic, const std::optional<at::Tensor>& rng_state) {
  // Always deterministic on the CPU (BwdPartition; sequences write disjoint rows), so `deterministic` needs no path.
  (void)deterministic;
  VarlenProblem vp = check_varlen_bwd_inputs(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                   max_seqlen_k, seqused_k, scale, causal, window_left, window_right,
                                                   softcap, dropout_p, sinks, rng_state);
  resolve_rng_state(vp.problem, q, "fa2.varlen_bwd", /*draw=*/false);
  // Gradients in their inputs' memory order, as the padded ops' (empty_grad_like on the packed tensor seen as batch 1).
  at::Tensor dq = empty_grad_like(q.unsqueeze(0)).squeeze(0);
  at::Tensor dk = empty_grad_like(k.unsqueeze(0)).squeeze(0);
  at::Tensor dv = empty_grad_like(v.unsqueeze(0)).squeeze(0);
  // Keys past seqused_k[b] take no part: their gradients are 0 (every other row is written by its sequence).
  if (vp.seqused_k.has_value()) {
    dk.zero_();
    dv.zero_();
  }
  // (lse includes the sinks: dq, dk, dv need nothing more)
  const at::Tensor dsinks =
      vp.problem.sinks.has_value() ? sinks_grad(dout, out, lse, *vp.problem.sinks, 1, 0) : at::empty({0}, q.options());
  const std::vector<SequenceRun> runs = sequence_runs(vp);
  std::vector<BwdRun> views;
  views.reserve(runs.size());
  const int64_t nheads = vp.problem.nheads;
  for (const SequenceRun& r : runs) {
    const int64_t rows = r.seqlen_q, keys = r.seqlen_k, n = r.count;
    views.push_back({run_problem(vp.problem, r), rows_view(dout, r.q_begin, rows, n), rows_view(q, r.q_begin, rows, n),
                     rows_view(k, r.k_begin, keys, n), rows_view(v, r.k_begin, keys, n),
                     rows_view(out, r.q_begin, rows, n),
                     lse.as_strided({n, nheads, rows}, {rows * lse.stride(1), lse.stride(0), lse.stride(1)},
                                    lse.storage_offset() + r.q_begin * lse.stride(1)),
                     rows_view(dq, r.q_begin, rows, n), rows_view(dk, r.k_begin, keys, n),
                     rows_view(dv, r.k_begin, keys, n)});
  }
  const VarlenSchedule schedule = VarlenSchedule::make(vp.problem, runs, at::get_num_threads());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "fa2_varlen_bwd_cpu", [&] {
    schedule.for_each([&](int64_t index) {
      BwdRun& t = views[index];
      at::Tensor no_dbias;
      bwd_kernel<scalar_t>(t.problem, t.dout, t.q, t.k, t.v, t.out, t.lse, t.dq, t.dk, t.dv, no_dbias,
                           /*dropout_batch0=*/runs[index].first);
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
