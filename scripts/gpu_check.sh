#!/usr/bin/env bash
# On the GPU machine, in one go: build the extension (CMake + ninja, against the machine's CUDA torch), record the
# GPU and the kernels' register/spill report, run the given Python checks; logs in $OUT (or ./out/gpu_check).
#   scripts/gpu_check.sh [check.py [args...]] ...      checks separated by ';' as one argument each, e.g.
#   FA2_HEADDIMS="64;128" FA2_CUDA_ARCHS=90 scripts/gpu_check.sh "scripts/cuda_fwd_check.py" "scripts/dev/cuda_fwd_bench.py --quick"
# env: FA2_CUDA (ON; OFF to try the script on a machine without CUDA), FA2_HEADDIMS, FA2_CUDA_ARCHS (default: the CMake defaults), FA2_DISABLE_BWD (ON/OFF), FA2_JOBS (16),
#      PYTHON (python3). Default checks: scripts/cuda_fwd_check.py.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
status=0

{
  echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo no-commit)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv || true
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
} 2>&1 | tee "$OUT/env.log"

cmake_args=("-DFA2_CUDA=${FA2_CUDA:-ON}" -DFA2_PTXAS_VERBOSE=ON)
[ -n "${FA2_HEADDIMS:-}" ] && cmake_args+=("-DFA2_HEADDIMS=$FA2_HEADDIMS")
[ -n "${FA2_CUDA_ARCHS:-}" ] && cmake_args+=("-DFA2_CUDA_ARCHS=$FA2_CUDA_ARCHS")
[ -n "${FA2_DISABLE_BWD:-}" ] && cmake_args+=("-DFA2_DISABLE_BWD=$FA2_DISABLE_BWD")
echo "== build ${cmake_args[*]}"
start=$SECONDS
mkdir -p build  # dev_build.sh writes build/gpu.configure.log next to the build folder
if ! PYTHON="$PY" FA2_BUILD_DIR=build/gpu FA2_JOBS="${FA2_JOBS:-16}" scripts/dev_build.sh "${cmake_args[@]}" \
    >"$OUT/build.log" 2>&1; then
  grep -E "error|Error|FAILED" "$OUT/build.log" | head -40
  tail -20 "$OUT/build.log"
  echo "gpu_check: BUILD FAILED (log: $OUT/build.log)"
  exit 1
fi
echo "built in $((SECONDS - start)) s"
# ptxas's report per kernel: registers and spills (from FA2_PTXAS_VERBOSE)
grep -E "Compiling entry function|spill stores|Used [0-9]+ registers" "$OUT/build.log" >"$OUT/ptxas.log" || true
grep -B1 -E "\b[1-9][0-9]* bytes spill stores" "$OUT/ptxas.log" | grep -oE "_Z[A-Za-z0-9_]+" | sort -u \
  | sed 's/^/  spills: /' | head -20

[ $# -eq 0 ] && set -- "scripts/cuda_fwd_check.py"
i=0
for check in "$@"; do
  i=$((i + 1))
  name="$i-$(basename -- "${check%% *}" .py)"  # numbered: the same script may run twice with other arguments
  echo "== $check"
  # shellcheck disable=SC2086
  if ! PYTHONPATH=python "$PY" $check 2>&1 | tee "$OUT/$name.log"; then
    echo "gpu_check: $check FAILED"
    status=1
  fi
done
echo "gpu_check: $([ $status -eq 0 ] && echo OK || echo FAILED) (logs in $OUT)"
exit $status
