#!/usr/bin/env bash
# One device call that validates a CUDA build end to end and says so in a few lines (logs in $OUT):
#   1. the sm90 building-block probes (wgmma descriptors/fragments, TMA tiles), when the GPU is compute capability 9.0
#   2. build (scripts/gpu_check.sh; FA2_CUDA_ARCHS defaults to "90;90a" here, so the sm_90a path is what runs)
#      + the CUDA-selected tests (the same tests as CI, their CUDA parameters, plus the GPU-only ones; not the zoo)
#   3. compute-sanitizer memcheck on the small grid with the default sm_90a schedules (memcheck + racecheck "gqa" with
#      the GQA backward's groups summed in its CTAs, FA2_DEV_OPTIONS=bwd_gqa_grouping=1; and with each warp-specialized
#      one forced, FA2_DEV_OPTIONS=sm90_schedule=...: memcheck + racecheck "ws", racecheck + synccheck "pingpong", "overlap" and
#      "pingpong-overlap"; "ws", "overlap" and "pingpong-overlap" with at most 3 persistent CTAs)
#   3a. the warp-specialized backward's last wave split wherever its cost model gains, FA2_DEV_OPTIONS=bwd_tail_split=1 (the
#      default splits only long query ranges): the CUDA tests of ops, API and Hopper with it, then memcheck + racecheck
#   4. the sm80-path backward on the same build, FA2_DEV_OPTIONS=sm90_backward=0 (the default is its sm_90a wgmma
#      instances): the CUDA tests of ops, API and Hopper with it, then memcheck + racecheck
#   4a. bwd_kernel.cuh's wgmma backward where the warp-specialized one is the default, FA2_DEV_OPTIONS=sm90_ws_backward=0
#   4b. the backward's general bias path for padding masks, FA2_DEV_OPTIONS=key_bias_backward=0 (the default is its key-row
#      variant): the CUDA tests of ops and API with it
#   4c. the sm80-path backward's small-shared-memory tiles (sm86 / sm89), FA2_DEV_OPTIONS=bwd_small_tiles=1,
#      sm90_backward=0: the CUDA tests of ops and API, then memcheck + racecheck
#   5. a quick side-by-side forward timing: fa2 (sm_90a, default schedules), fa2-pipe / fa2-ws / fa2-wspp / fa2-wsov
#      (each sm_90a schedule forced: pipelined, warp-specialized, with ping-pong, with P V overlapping the softmax),
#      torch's FA-2, cuDNN; FA2_VALIDATE_{DIMS,SEQLENS,PASSES,IMPLS} change it (e.g. PASSES=bwd,fwdbwd with
#      IMPLS=fa2,fa2-bwd80,torch-fa2,cudnn to time the backward against its sm80-path kernels)
# Each step has its own time limit, so that one hang cannot eat the whole call (the device call's limit is 600 s).
# Usage (from the repository root, on the GPU machine): bash scripts/dev/gpu_validate.sh [steps...]
#   steps (default: all, in this order): probes tests tests-ws memcheck sanitize-gqa sanitize-ws sanitize-wspp
#   sanitize-wsov sanitize-wsppov tests-split sanitize-split tests-bwd80 sanitize-bwd80 tests-bwd-nows tests-kbias-off
#   tests-bwd-small bench
#   ("tests" builds; "build" only builds; "pytest" is "tests" without the build, e.g. run beside the sanitizer steps
#   in another invocation with its own OUT: both only read the built extension)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/gpu_validate}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
export FA2_CUDA_ARCHS=${FA2_CUDA_ARCHS:-90;90a}
PY=${PYTHON:-python3}
STEP_LOGS=$OUT
# shellcheck source=scripts/dev/steps.sh
source scripts/dev/steps.sh

all_steps=(probes tests tests-ws memcheck sanitize-gqa sanitize-ws sanitize-wspp sanitize-wsov sanitize-wsppov
  tests-split sanitize-split tests-bwd80 sanitize-bwd80 tests-bwd-nows tests-kbias-off tests-bwd-small bench)
[ $# -eq 0 ] && set -- "${all_steps[@]}"
selected=" $* "
want_step() { [[ "$selected" == *" $1 "* ]]; }
known=" build pytest ${all_steps[*]} "
for s in "$@"; do
  [[ "$known" == *" $s "* ]] || { echo "gpu_validate: unknown step '$s' (steps:$known)"; exit 2; }
done

cc=$("$PY" -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())' 2>/dev/null || echo 0)
if [ "$cc" = "90" ] && want_step probes; then
  for probe in sm90_wgmma_probe sm90_tma_probe; do
    step "$probe" 60 bash -c "nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -I cuda/include \
      scripts/dev/$probe.cu -o /tmp/$probe && /tmp/$probe"
  done
fi

# the warp-specialized schedules have named barriers (a hang there would not trap): the tests that force each (and
# the padding-tile ones, which skip tiles inside them) stay out of the main step and run in their own short one.
# The zoo (slow: compilation) runs in gpu_results.sh's zootests step instead.
main_tests="(cuda or current_stream or reduce_overhead or 2_31 or build or hopper or wgmma)"
export PYTEST_ADDOPTS="-k \"$main_tests and not sm90_schedule and not padding_tiles and not zoo\""
want_step build && step build 180 scripts/gpu_check.sh "-m fa2"
want_step tests && step tests 420 scripts/gpu_check.sh "scripts/dev/gpu_pytest.py tests"
want_step pytest && step tests 400 env PYTHONPATH=python "$PY" scripts/dev/gpu_pytest.py tests
unset PYTEST_ADDOPTS
want_step tests-ws && step tests-ws 150 env PYTHONPATH=python "$PY" scripts/dev/gpu_pytest.py tests/test_hopper.py \
  -k "sm90_schedule or padding_tiles"
want_step memcheck && step memcheck 90 env PYTHONPATH=python "$PY" scripts/dev/sanitizer_check.py --tools memcheck
# the GQA backward with every group summed in its CTAs where the ws kernel runs (bwd_gqa_grouping=1; by default
# the grid's small calls keep fp32 partials): memcheck + racecheck
want_step sanitize-gqa && step sanitize-gqa 120 env PYTHONPATH=python FA2_DEV_OPTIONS=bwd_gqa_grouping=1 "$PY" \
  scripts/dev/sanitizer_check.py --tools memcheck,racecheck
# each warp-specialized sm_90a schedule forced (sm90_schedule) under racecheck: its producer/consumer barriers
# are what a race would come from
# (persistent_forward_ctas=3: at most three CTAs, so that the small grid's query blocks run several to a CTA: the
# persistent kernel's Q-empty barrier, ring phases across blocks and O stored from registers)
want_step sanitize-ws && step sanitize-ws 120 env PYTHONPATH=python FA2_DEV_OPTIONS=sm90_schedule=ws,persistent_forward_ctas=3 \
  "$PY" scripts/dev/sanitizer_check.py --tools memcheck,racecheck
want_step sanitize-wspp && step sanitize-wspp 120 env PYTHONPATH=python FA2_DEV_OPTIONS=sm90_schedule=pingpong "$PY" \
  scripts/dev/sanitizer_check.py --tools racecheck,synccheck
# (overlap with the cap: d 128 calls without a mask, the clusters of two among them, run several blocks a CTA, so
# memcheck too)
want_step sanitize-wsov && step sanitize-wsov 150 env PYTHONPATH=python \
  FA2_DEV_OPTIONS=sm90_schedule=overlap,persistent_forward_ctas=3 "$PY" scripts/dev/sanitizer_check.py --tools memcheck,racecheck,synccheck
# (pingpong-overlap with the cap: causal / windowed d 128 calls run the tile-counter forward, so memcheck too)
want_step sanitize-wsppov && step sanitize-wsppov 180 env PYTHONPATH=python \
  FA2_DEV_OPTIONS=sm90_schedule=pingpong-overlap,persistent_forward_ctas=3 "$PY" scripts/dev/sanitizer_check.py --tools memcheck,racecheck,synccheck
# the warp-specialized backward's last wave split wherever its cost model gains (bwd_tail_split=1; by default only
# long query ranges split, which the tests' shapes are not): the CUDA tests of the ops, the API and Hopper, then memcheck
# + racecheck of the sanitizer grid
want_step tests-split && step tests-split 300 env PYTHONPATH=python FA2_DEV_OPTIONS=bwd_tail_split=1 "$PY" \
  scripts/dev/gpu_pytest.py tests/test_ops.py tests/test_api.py tests/test_hopper.py -k "cuda or hopper or sm90"
want_step sanitize-split && step sanitize-split 120 env PYTHONPATH=python FA2_DEV_OPTIONS=bwd_tail_split=1 "$PY" \
  scripts/dev/sanitizer_check.py --tools memcheck,racecheck
# the sm80-path backward (sm90_backward=0; the default on this GPU is the sm_90a wgmma one): the CUDA
# tests of the ops and the API with it, then memcheck + racecheck
want_step tests-bwd80 && step tests-bwd80 300 env PYTHONPATH=python FA2_DEV_OPTIONS=sm90_backward=0 "$PY" \
  scripts/dev/gpu_pytest.py tests/test_ops.py tests/test_api.py tests/test_hopper.py -k "cuda or hopper or sm90"
want_step sanitize-bwd80 && step sanitize-bwd80 120 env PYTHONPATH=python FA2_DEV_OPTIONS=sm90_backward=0 "$PY" \
  scripts/dev/sanitizer_check.py --tools memcheck,racecheck
# bwd_kernel.cuh's wgmma backward where the warp-specialized one runs by default (sm90_ws_backward=0:
# d 64 / 128 / 256, plain path and padding masks): the CUDA tests of the ops, the API and Hopper with it
want_step tests-bwd-nows && step tests-bwd-nows 300 env PYTHONPATH=python FA2_DEV_OPTIONS=sm90_ws_backward=0 "$PY" \
  scripts/dev/gpu_pytest.py tests/test_ops.py tests/test_api.py tests/test_hopper.py -k "cuda or hopper or sm90"
# padding masks' backward on the general bias path (key_bias_backward=0; the default is the key-row variant):
# every CUDA test of the ops and the API with it (the sanitizer grid's general biases run that path by default)
want_step tests-kbias-off && step tests-kbias-off 300 env PYTHONPATH=python FA2_DEV_OPTIONS=key_bias_backward=0 "$PY" \
  scripts/dev/gpu_pytest.py tests/test_ops.py tests/test_api.py -k "cuda or key_bias"
# the sm80-path backward's small-shared-memory tiles (what sm86 / sm89 GPUs run) forced on this GPU: the CUDA tests
# of the ops and the API with them, then memcheck + racecheck of the sanitizer grid
want_step tests-bwd-small && step tests-bwd-small 300 env PYTHONPATH=python \
  FA2_DEV_OPTIONS=sm90_backward=0,bwd_small_tiles=1 "$PY" scripts/dev/gpu_pytest.py tests/test_ops.py tests/test_api.py -k "cuda"
want_step tests-bwd-small && step sanitize-bwd-small 120 env PYTHONPATH=python \
  FA2_DEV_OPTIONS=sm90_backward=0,bwd_small_tiles=1 "$PY" scripts/dev/sanitizer_check.py --tools memcheck,racecheck
want_step bench && step bench 200 env PYTHONPATH=python "$PY" benchmarks/bench_attention.py --dtypes bf16 \
  --dims ${FA2_VALIDATE_DIMS:-64,96,128,192,256} --seqlens ${FA2_VALIDATE_SEQLENS:-2k,16k} --causal both \
  --masks none,padding --pass ${FA2_VALIDATE_PASSES:-fwd} \
  --impls ${FA2_VALIDATE_IMPLS:-fa2,fa2-pipe,fa2-ws,fa2-wspp,fa2-wsov,torch-fa2,cudnn} \
  --mem-seqlens "" --warmup-ms 10 --rep-ms 30 --no-progress --no-plot --out "$OUT/bench"

echo "== gpu_validate (FA2_CUDA_ARCHS=$FA2_CUDA_ARCHS, logs in $OUT)"
print_steps
test_logs=("$OUT/tests.log" "$OUT/tests-ws.log" "$OUT/tests-split.log" "$OUT/tests-bwd80.log" "$OUT/tests-bwd-nows.log"
  "$OUT/tests-kbias-off.log" "$OUT/tests-bwd-small.log")
grep -HE "passed|failed" "${test_logs[@]}" 2>/dev/null | tail -n "${#test_logs[@]}"
grep -hE "^(FAILED|ERROR)" "${test_logs[@]}" "$OUT"/1-gpu_pytest.log 2>/dev/null | head -20
[ -f "$OUT/bench.log" ] && sed -n '/TFLOP\/s (median/,$p' "$OUT/bench.log" | head -40
# a device call brings back at most 8 files: the logs travel packed, the benchmark JSON as files of their own
find "$OUT" -name '*.json' -path '*bench*' -exec cp {} "$OUT/" \; 2>/dev/null
tar czf /tmp/gpu_validate_logs.tgz -C "$OUT" --exclude='*.json' . 2>/dev/null && mv /tmp/gpu_validate_logs.tgz "$OUT/logs.tgz" \
  && find "$OUT" -mindepth 1 ! -name logs.tgz ! -name '*.json' -delete 2>/dev/null
