// Host entry points of the CUDA backward: plain C++, no torch (the forward's are in launch.h). run_bwd returns
// nullptr on success, else a message (valid until the next failing call on this thread). Asynchronous on `stream`.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

#include "fa2/launch.h"
#include "fa2/params.h"
#include "fa2/plan.h"

namespace fa2 {

// The instantiated backward headdim that serves a (multiple-of-8) headdim, or -1 when this build has none.
int bwd_headdim_rounded(int headdim);
// This build's backward instances.
const InstanceDesc* bwd_instances(int* count);

// The plan of a backward call on the current device with the process's development options. With buffers kDecide
// (the torch glue) params carry dk / dv like k (gqa_dkv kInKernel) and no workspace: the plan says what a GQA call's
// dk / dv must be (plan.gqa_dkv: params.h's GqaDkv) and how many workspace ints (zeroed where zero_workspace).
BwdPlan plan_bwd_call(const AttentionParams& params, PlanBuffers buffers = PlanBuffers::kDecide,
                      PlanNotes* notes = nullptr);

// A varlen backward's dq_accum rows per head (params.h, varlen_dq_head_rows) where it holds each sequence's query
// blocks from a block boundary, for the headdim-split ws kernel (d 256) to add them in its fragment order; 0 where it
// is (nheads, total_q) rows. Blocks are padded where the sequences average a block or more (at most doubling it), while
// option varlen_dq_blocks is on.
int64_t varlen_dq_block_rows(int64_t total_q, int64_t sequences, int headdim_rounded);

// The workspace a backward call needs on the current device (the kernel harness sizes it so; it then runs its
// instance with buffers kGiven).
int64_t bwd_workspace_ints(const AttentionParams& params);

// Backward: fills dq, dk, dv (and dbias when params.dbias != nullptr) as `plan` says. Needs, besides the forward's
// conditions (launch.h), params.headdim_rounded == bwd_headdim_rounded(params.headdim);
//   lse (batch, nheads, seqlen_q) contiguous; softmax_d: (batch, nheads, seqlen_q) fp32 scratch;
//   dq_accum: (batch, nheads, seqlen_q, headdim_rounded) fp32 scratch (zeroed by the backward itself);
//   row_lse / row_shift (batch, nheads, seqlen_q) fp32 scratch where plan.row_stats;
//   dk / dv as plan.gqa_dkv says for a GQA call (params.h), else like k; dbias (optional): fp32 (batch, nheads,
//   seqlen_q, seqlen_k) contiguous, zeroed; workspace: plan.workspace_ints int32s (zeroed where
//   plan.zero_workspace), workspace_ints its size.
// The one thing a plan cannot know is whether the driver accepts the warp-specialized kernel's tensor maps; where
// it does not, bwd_kernel.cuh's kernel runs instead (plan_bwd_without_ws), and a GQA call whose dk / dv only that
// kernel serves launches nothing and sets *needs_partials: the caller plans again with fp32 partials (buffers
// kGiven, gqa_dkv kPartials).
const char* run_bwd(const BwdPlan& plan, const AttentionParams& params, cudaStream_t stream,
                    bool* needs_partials = nullptr);

}  // namespace fa2
