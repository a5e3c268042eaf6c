#!/usr/bin/env bash
# Nsight Compute on the main fa2 kernels of scripts/dev/profile_cases.py's cases (the third, profiled call of each), for
# the questions the timings cannot answer (why d 64 with a padding mask runs at 0.8-0.9x of d 64 without; where
# the backward's time goes), and the same calls through cuDNN (SDPA) beside them: speed of light, occupancy,
# warp-state (stall) statistics, compute and memory workload, launch statistics; then, from a second profile of the
# same launch, raw metrics: shared-memory wavefronts and bank conflicts, tensor-pipe utilisation, the stall reasons.
# Logs (CSV, two files per case) in $OUT/profile.tgz; a few headline metrics printed per case.
# ncu runs with --clock-control none (the device notes: leave the clocks alone). Needs a build (gpu_check.sh / the
# "build" step of gpu_validate.sh).
# Usage (repository root, GPU machine): bash scripts/dev/gpu_profile.sh [cases...]   (default: all)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/gpu_profile}
mkdir -p "$OUT/profile"
PY=${PYTHON:-python3}
export PYTHONPATH=python
[ $# -eq 0 ] && set -- $("$PY" scripts/dev/profile_cases.py --list)
raw_metrics='regex:^l1tex__data_(pipe_lsu_wavefronts_mem_shared|bank_conflicts_pipe_lsu_mem_shared)(_op_(ld|st))?\.sum$'
raw_metrics+=',regex:^smsp__warp_issue_stalled_[a-z_]+_per_warp_active\.pct$'
raw_metrics+=',gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active'
for case in "$@"; do
  # two warm-up calls launch the kernel twice before the profiled one (the backward cases' forward launch is not
  # counted: each case's own direction only)
  # (fa2's backward main kernels: bwd_kernel, bwd_ws_kernel, bwd_ws_dsplit_kernel; cuDNN's: *_fprop_* / *_bprop_*;
  # FA-4's (CuTe DSL) names hold its class names)
  case $case in
    fwd*) kernel=fwd_kernel ;;
    decode*) kernel=decode_kernel ;;
    cudnn-decode*) kernel=fprop ;;
    bwd*) kernel="bwd_(ws_(dsplit_)?)?kernel" ;;
    cudnn-fwd*) kernel=fprop ;;
    cudnn-bwd*) kernel=bprop ;;
    fa4-fwd*) kernel=FlashAttentionForwardSm90 ;;
    fa4-bwd*) kernel=FlashAttentionBackwardSm90 ;;
  esac
  timeout 120 ncu --clock-control none -k "regex:$kernel" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --csv --page details \
    "$PY" scripts/dev/profile_cases.py "$case" >"$OUT/profile/$case.csv" 2>"$OUT/profile/$case.err"
  echo "== $case (rc $?)"
  grep -hE '"(Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued Instruction|L1/TEX Hit Rate|Local Memory Spilling Requests|Block Limit Registers|Block Limit Shared Mem)"' \
    "$OUT/profile/$case.csv" | awk -F'","' '{printf "  %-40s %s %s\n", $(NF-2), $NF, $(NF-1)}' | tr -d '"' | head -20
  tail -2 "$OUT/profile/$case.err" | grep -iE "error|warn" | head -2
  # raw metrics of the same launch: shared-memory wavefronts and bank conflicts (loads / stores), the tensor pipe's
  # utilisation, and the warp stall reasons (names differ between ncu versions, hence the patterns). The store
  # conflicts are how de58efe's dQ staging fix was found (ncu_h200-20261202-bwd.json).
  timeout 120 ncu --clock-control none -k "regex:$kernel" --launch-skip 2 --launch-count 1 --metrics "$raw_metrics" \
    --csv --page raw "$PY" scripts/dev/profile_cases.py "$case" >"$OUT/profile/$case-raw.csv" 2>"$OUT/profile/$case-raw.err"
  echo "  -- raw metrics (rc $?)"
  "$PY" - "$OUT/profile/$case-raw.csv" <<'PYEOF'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
header = next((r for r in rows if "Kernel Name" in r), None)
if header is None:
    sys.exit("  (no CSV rows)")
values = {}
for name, value in zip(header, rows[rows.index(header) + 2]):  # after the header and the units row
    try:
        values[name] = float(value.replace(",", ""))
    except ValueError:
        pass
pick = lambda suffix: next((v for k, v in values.items() if k.endswith(suffix)), float("nan"))
print(f"  {'duration (us)':40s} {pick('gpu__time_duration.sum') / 1e3:.1f}")
print(f"  {'tensor pipe (% of peak, active)':40s} {pick('sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active'):.1f}")
for op in ("ld", "st"):
    wavefronts = pick(f"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{op}.sum")
    conflicts = pick(f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{op}.sum")
    print(f"  {'shared ' + op + ' wavefronts / bank conflicts':40s} {wavefronts:.3g} / {conflicts:.3g}")
stalls = sorted(((v, k) for k, v in values.items() if "issue_stalled" in k and k.endswith("_per_warp_active.pct")),
                reverse=True)
print("  stalls (% of warp cycles): " + ", ".join(
    f"{k.replace('smsp__warp_issue_stalled_', '').replace('_per_warp_active.pct', '')} {v:.1f}" for v, k in stalls[:6]))
PYEOF
done
# a device call brings back at most 8 files: the CSVs travel packed
tar czf "$OUT/profile.tgz" -C "$OUT" profile && rm -rf "$OUT/profile"
