#!/usr/bin/env bash
# One device call that validates a CUDA build end to end and says so in a few lines (logs in $OUT):
#   1. the sm90 building-block probes (wgmma descriptors/fragments, TMA tiles), when the GPU is compute capability 9.0
#   2. build (scripts/gpu_check.sh; FA2_CUDA_ARCHS defaults to "90;90a" here, so the sm_90a path is what runs)
#      + the CUDA-selected tests (the same tests as CI, their CUDA parameters, plus the GPU-only ones; not the zoo)
#   3. compute-sanitizer memcheck on the small grid (and memcheck + racecheck with the warp-specialized forward,
#      racecheck + synccheck with its ping-pong, racecheck with its overlap)
#   4. a quick side-by-side forward timing: fa2 (sm_90a), fa2-ws / fa2-wspp / fa2-wsov (its warp-specialized forward: plain,
#      with ping-pong, with P V overlapping the softmax), fa2-sm80 (same build, sm80-path kernels), torch's FA-2, cuDNN
# Each step has its own time limit, so that one hang cannot eat the whole call (the device call's limit is 600 s).
# Usage (from the repository root, on the GPU machine): bash scripts/gpu_validate.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_validate}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
export FA2_CUDA_ARCHS=${FA2_CUDA_ARCHS:-90;90a}
PY=${PYTHON:-python3}
STEP_LOGS=$OUT
# shellcheck source=scripts/steps.sh
source scripts/steps.sh

cc=$("$PY" -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())' 2>/dev/null || echo 0)
if [ "$cc" = "90" ]; then
  for probe in sm90_wgmma_probe sm90_tma_probe; do
    step "$probe" 60 bash -c "nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -I cuda/include \
      scripts/$probe.cu -o /tmp/$probe && /tmp/$probe"
  done
fi

# the opt-in warp-specialized forward is new code with named barriers (a hang there would not trap): its tests stay
# out of the main step and run in their own short one after it (which also builds). The zoo (slow: compilation)
# runs in gpu_results.sh's zootests step instead.
export PYTEST_ADDOPTS='-k "(cuda or current_stream or reduce_overhead or 2_31 or build or hopper or wgmma) and not warp_specialized and not zoo"'
step tests 420 scripts/gpu_check.sh "scripts/gpu_pytest.py tests"
unset PYTEST_ADDOPTS
step tests-ws 150 env PYTHONPATH=python "$PY" scripts/gpu_pytest.py tests/test_hopper.py -k warp_specialized
step memcheck 90 env PYTHONPATH=python "$PY" scripts/sanitizer_check.py --tools memcheck
# the opt-in warp-specialized sm_90a forward (FA2_SM90_WARP_SPECIALIZED) under racecheck too: its producer/consumer
# barriers are what a race would come from
step sanitize-ws 120 env PYTHONPATH=python FA2_SM90_WARP_SPECIALIZED=1 "$PY" scripts/sanitizer_check.py \
  --tools memcheck,racecheck
step sanitize-wspp 120 env PYTHONPATH=python FA2_SM90_WARP_SPECIALIZED=1 FA2_SM90_PINGPONG=1 "$PY" \
  scripts/sanitizer_check.py --tools racecheck,synccheck
step sanitize-wsov 90 env PYTHONPATH=python FA2_SM90_WARP_SPECIALIZED=1 FA2_SM90_OVERLAP=1 "$PY" \
  scripts/sanitizer_check.py --tools racecheck
step bench 100 env PYTHONPATH=python "$PY" benchmarks/bench_attention.py --dtypes bf16 --dims 64,128 \
  --seqlens 2k,8k --causal both --masks none,padding --pass fwd \
  --impls fa2,fa2-ws,fa2-wspp,fa2-wsov,fa2-sm80,torch-fa2,cudnn \
  --mem-seqlens "" --warmup-ms 10 --rep-ms 30 --no-progress --no-plot --out "$OUT/bench"

echo "== gpu_validate (FA2_CUDA_ARCHS=$FA2_CUDA_ARCHS, logs in $OUT)"
print_steps
grep -E "passed|failed" "$OUT/tests.log" "$OUT/tests-ws.log" | tail -3
grep -E "^FAILED" "$OUT"/1-gpu_pytest.log 2>/dev/null | head -20
sed -n '/TFLOP\/s (median/,$p' "$OUT/bench.log" | head -24
