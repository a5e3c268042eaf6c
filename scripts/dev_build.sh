#!/usr/bin/env bash
# In-tree development build: configures/builds with CMake + ninja into build/dev (or $FA2_BUILD_DIR) and drops
# the extension next to the sources, so `PYTHONPATH=python python -c "import fa2"` uses it without reinstalling.
# Extra arguments go to CMake (e.g. -DFA2_CUDA=OFF -DFA2_HEADDIMS="64;128" -DFA2_CUDA_ARCHS=90).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
BUILD_DIR=${FA2_BUILD_DIR:-build/dev}
JOBS=${FA2_JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$(command -v "$PY")" \
  -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" "$@" >"$BUILD_DIR.configure.log" 2>&1 \
  || { cat "$BUILD_DIR.configure.log"; exit 1; }
cmake --build "$BUILD_DIR" -j "$JOBS"
so=$(ls "$BUILD_DIR"/_C*.so | head -1)
# Copy then rename: another process importing fa2 meanwhile sees either the old or the new library, never half.
cp "$so" "python/fa2/.$(basename "$so").tmp" && mv "python/fa2/.$(basename "$so").tmp" "python/fa2/$(basename "$so")"
cp "$BUILD_DIR/_build_info.json" python/fa2/_build_info.json
echo "fa2: built $(basename "$so") into python/fa2 (use PYTHONPATH=$(pwd)/python)"
