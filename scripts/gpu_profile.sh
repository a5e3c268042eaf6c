#!/usr/bin/env bash
# Nsight Compute on the main fa2 kernels of scripts/profile_cases.py's cases (the third, profiled call of each), for
# the questions the timings cannot answer (why d 64 with a padding mask runs at 0.8-0.9x of d 64 without; where
# the backward's time goes), and the same calls through cuDNN (SDPA) beside them: speed of light, occupancy,
# warp-state (stall) statistics, compute and memory workload, launch statistics. Logs (CSV, one file per case) in
# $OUT/profile; a few headline metrics printed per case.
# ncu runs with --clock-control none (the device notes: leave the clocks alone). Needs a build (gpu_check.sh / the
# "build" step of gpu_validate.sh).
# Usage (repository root, GPU machine): bash scripts/gpu_profile.sh [cases...]   (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_profile}
mkdir -p "$OUT/profile"
PY=${PYTHON:-python3}
export PYTHONPATH=python
[ $# -eq 0 ] && set -- $("$PY" scripts/profile_cases.py --list)
for case in "$@"; do
  # two warm-up calls launch the kernel twice before the profiled one (the backward cases' forward launch is not
  # counted: each case's own direction only)
  # (fa2's backward main kernels: bwd_kernel, bwd_ws_kernel, bwd_ws_dsplit_kernel; cuDNN's: *_fprop_* / *_bprop_*)
  case $case in
    fwd*) kernel=fwd_kernel ;;
    bwd*) kernel="bwd_(ws_(dsplit_)?)?kernel" ;;
    cudnn-fwd*) kernel=fprop ;;
    cudnn-bwd*) kernel=bprop ;;
  esac
  timeout 120 ncu --clock-control none -k "regex:$kernel" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --csv --page details \
    "$PY" scripts/profile_cases.py "$case" >"$OUT/profile/$case.csv" 2>"$OUT/profile/$case.err"
  echo "== $case (rc $?)"
  grep -hE '"(Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued Instruction|L1/TEX Hit Rate|Local Memory Spilling Requests|Block Limit Registers|Block Limit Shared Mem)"' \
    "$OUT/profile/$case.csv" | awk -F'","' '{printf "  %-40s %s %s\n", $(NF-2), $NF, $(NF-1)}' | tr -d '"' | head -20
  tail -2 "$OUT/profile/$case.err" | grep -iE "error|warn" | head -2
done
# the stall breakdown (raw metrics; names differ between ncu versions, hence the pattern), for the d 64 forward with
# and without the padding mask: what the mask's extra time is spent waiting on
for case in fwd-d64 fwd-d64-pad; do
  [[ " $* " == *" $case "* ]] || continue
  timeout 120 ncu --clock-control none -k "regex:fwd_kernel" --launch-skip 2 --launch-count 1 \
    --metrics "regex:^smsp__(average_)?warps?_(latency_)?issue_stalled_[a-z_]+(_per_warp_active\.pct|\.ratio)$" \
    --csv --page raw "$PY" scripts/profile_cases.py "$case" >"$OUT/profile/$case-stalls.csv" \
    2>"$OUT/profile/$case-stalls.err"
  echo "== $case stalls (rc $?; the largest)"
  "$PY" - "$OUT/profile/$case-stalls.csv" <<'PYEOF'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
header = next((r for r in rows if "Kernel Name" in r), None)
if header is None:
    sys.exit("  (no CSV rows)")
data = rows[rows.index(header) + 2:]  # after the header and the units row
pairs = []
for r in data:
    for name, value in zip(header, r):
        if "issue_stalled" in name:
            try:
                pairs.append((float(value.replace(",", "")), name))
            except ValueError:
                pass
for value, name in sorted(pairs, reverse=True)[:8]:
    print(f"  {name:72s} {value:.3g}")
PYEOF
done
# a device call brings back at most 8 files: the CSVs travel packed
tar czf "$OUT/profile.tgz" -C "$OUT" profile && rm -rf "$OUT/profile"
