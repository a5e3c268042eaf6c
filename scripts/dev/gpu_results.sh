#!/usr/bin/env bash
# One device call that produces the numbers the issues quote (after scripts/dev/gpu_validate.sh said the build is sound).
# Steps, run in the order given (default: build zoo sanitize bench), each with its own time limit:
#   build     build (scripts/gpu_check.sh), then python -m fa2 (what was built)
#   zootests  the CUDA tests selected by $FA2_TEST_K (default "cuda and zoo") from tests/
#   zoo       the zoo table on CUDA (python tests/zoo.py --device cuda $FA2_ZOO_ARGS; default bf16 and fp16)
#   sanitize  compute-sanitizer racecheck and initcheck on the small grid (memcheck runs in gpu_validate)
#   multigpu  the tests that need two GPUs (second device, NCCL DDP)
#   bench     benchmarks/bench_attention.py with $FA2_BENCH_ARGS
#   e2e       benchmarks/bench_e2e.py with $FA2_E2E_ARGS
# Logs and the benchmark JSON are packed into $OUT/results.tgz (a device call brings back at most 8 files); the
# result JSON files are also left as files of their own.
# Usage (repository root, GPU machine): bash scripts/dev/gpu_results.sh [steps...]
# The GPU machine's copy of the tree keeps an older .git: pass FA2_GIT_COMMIT=<the source checkout's HEAD> on the
# command line so that the result JSON names the commit measured (benchmarks/bench_common.py).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/gpu_results}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
export FA2_CUDA_ARCHS=${FA2_CUDA_ARCHS:-90;90a}
PY=${PYTHON:-python3}
BENCH_ARGS=${FA2_BENCH_ARGS:---dtypes bf16,fp16 --dims 64,128,256 --seqlens 512,1k,2k,4k,8k,16k --causal both \
--masks none,padding --pass fwd,bwd,fwdbwd --impls fa2,torch-fa2,cudnn,fa2-sm80 --mem-seqlens "" \
--warmup-ms 5 --rep-ms 20 --rounds 1 --time-budget 250}
STEP_LOGS=$LOGS
# shellcheck source=scripts/dev/steps.sh
source scripts/dev/steps.sh
E2E_ARGS=${FA2_E2E_ARGS:---modes train,prefill --time-budget 200}
[ $# -eq 0 ] && set -- build zoo sanitize bench
for what in "$@"; do
  case $what in
    build)
      step build 180 env OUT="$LOGS/gpu_check" scripts/gpu_check.sh "-m fa2" ;;
    zootests)
      step zootests 200 env PYTHONPATH=python "$PY" scripts/dev/gpu_pytest.py tests -k "${FA2_TEST_K:-cuda and zoo}" ;;
    multigpu)
      step multigpu 200 env PYTHONPATH=python "$PY" scripts/dev/gpu_pytest.py tests -k "second_gpu or ddp" ;;
    zoo)
      step zoo_table 150 env PYTHONPATH=python "$PY" tests/zoo.py --device cuda ${FA2_ZOO_ARGS:---dtype bfloat16,float16} ;;
    sanitize)
      step racecheck 100 env PYTHONPATH=python "$PY" scripts/dev/sanitizer_check.py --tools racecheck
      step initcheck 60 env PYTHONPATH=python "$PY" scripts/dev/sanitizer_check.py --tools initcheck ;;
    bench)
      # shellcheck disable=SC2086
      eval step bench 280 env PYTHONPATH=python "$PY" benchmarks/bench_attention.py $BENCH_ARGS \
        --no-progress --no-plot --out "$OUT/bench" ;;
    e2e)
      # shellcheck disable=SC2086
      eval step e2e "${FA2_E2E_LIMIT:-300}" env PYTHONPATH=python "$PY" benchmarks/bench_e2e.py $E2E_ARGS --no-plot --out "$OUT/bench" ;;
    *) echo "unknown step $what"; exit 2 ;;
  esac
done

echo "== gpu_results (FA2_CUDA_ARCHS=$FA2_CUDA_ARCHS)"
print_steps
for log in zootests multigpu; do
  [ -f "$LOGS/$log.log" ] && { grep -E "passed|failed|skipped" "$LOGS/$log.log" | tail -1; grep -E "^(FAILED|ERROR)" "$LOGS/$log.log" | head -20; }
done
[ -f "$LOGS/zoo_table.log" ] && tail -22 "$LOGS/zoo_table.log"
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$LOGS"/racecheck.log "$LOGS"/initcheck.log 2>/dev/null | sort | uniq -c
[ -f "$LOGS/bench.log" ] && sed -n '/TFLOP\/s (median/,$p' "$LOGS/bench.log" | head -60
[ -f "$LOGS/e2e.log" ] && tail -25 "$LOGS/e2e.log"
tar czf "$OUT/results.tgz" -C "$OUT" logs $( [ -d "$OUT/bench" ] && echo bench ) 2>/dev/null
find "$OUT/bench" -name '*.json' -exec cp {} "$OUT/" \; 2>/dev/null
rm -rf "$LOGS" "$OUT/bench"
