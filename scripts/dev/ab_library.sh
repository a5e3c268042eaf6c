#!/usr/bin/env bash
# A/B of this tree's fa2 against an earlier tree, both built here, timed call by call in one process
# (scripts/dev/ab_library.py). On the GPU machine.
#   bash scripts/dev/ab_library.sh BASE_TREE [ab_library.py args...]
# BASE_TREE: a copy of the earlier sources (cuda cpp cmake CMakeLists.txt pyproject.toml python), e.g. made here with
#   mkdir -p .ab_base && git archive <commit> cuda cpp cmake python CMakeLists.txt pyproject.toml | tar -x -C .ab_base
# (and .ab_base carried to the machine). Its ops are renamed to the fa2ab namespace so that both libraries load into
# one process. Both builds: CMake + ninja, FA2_CUDA_ARCHS (default 90;90a), 8 jobs each, side by side; the head's
# extension lands in python/fa2 (PYTHONPATH=python), the base's in BASE_TREE/build/ab. env OUT (default out/ab_library),
# PYTHON (python3), AB_SKIP_BUILD=1 to reuse both builds, AB_BUILD_ONLY=1 to build and stop.
set -euo pipefail
cd "$(dirname "$0")/../.."
base=$(cd "$1" && pwd)
shift
OUT=${OUT:-out/ab_library}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
archs=${FA2_CUDA_ARCHS:-90;90a}
build() {  # source_dir build_dir log: configure + build, its wall time last in the log
  local t0=$SECONDS
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA2_CUDA=ON -DFA2_CUDA_ARCHS="$archs" \
    -DPython_EXECUTABLE="$(command -v "$PY")" -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" >"$3" 2>&1 &&
    cmake --build "$2" -j 8 >>"$3" 2>&1 && echo "built in $((SECONDS - t0)) s" >>"$3"
}
if [ "${AB_SKIP_BUILD:-0}" != 1 ]; then
  grep -rl "TORCH_LIBRARY" "$base/cpp" | xargs sed -i -E 's/TORCH_LIBRARY(_IMPL)?\(fa2,/TORCH_LIBRARY\1(fa2ab,/'
  start=$SECONDS
  build "$base" "$base/build/ab" "$OUT/build_base.log" & pid_base=$!
  build . build/ab_head "$OUT/build_head.log" & pid_head=$!
  ok=1
  wait $pid_base || { echo "ab_library: base build failed"; tail -20 "$OUT/build_base.log"; ok=0; }
  wait $pid_head || { echo "ab_library: head build failed"; tail -20 "$OUT/build_head.log"; ok=0; }
  [ $ok = 1 ] || exit 1
  echo "ab_library: both built side by side in $((SECONDS - start)) s (8 jobs each): base $(tail -1 "$OUT/build_base.log"), head $(tail -1 "$OUT/build_head.log")"
  so=$(ls build/ab_head/_C*.so | head -1)
  cp "$so" python/fa2/ && cp build/ab_head/_build_info.json python/fa2/_build_info.json
fi
[ "${AB_BUILD_ONLY:-0}" = 1 ] && exit 0
PYTHONPATH=python PYTHONUNBUFFERED=1 "$PY" scripts/dev/ab_library.py --base-lib "$(ls "$base"/build/ab/_C*.so | head -1)" \
  --out "$OUT" "$@"
