#!/usr/bin/env bash
# CI's check of the torch <-> CUDA glue (cpp/cuda/*.cpp: checks -> params -> launch), which a CPU build never
# compiles: each file is parsed (g++ -fsyntax-only) against the installed torch's headers (a CPU wheel ships the
# c10/cuda and ATen/cuda ones, read as system headers; the one header its CMake build generates is stubbed) and
# the CUDA toolkit's.
# Usage: scripts/cuda_glue_check.sh [python with torch (default .venv/bin/python)]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
CXX=${CXX:-g++}
command -v nvcc >/dev/null || { echo "cuda_glue_check: no nvcc (CUDA headers): skipped"; exit 0; }
cuda_inc=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")/include
[ -f "$cuda_inc/cuda_runtime_api.h" ] || cuda_inc=/usr/local/cuda/include  # (nvcc as a wrapper script)
stub=$(mktemp -d)
trap 'rm -rf "$stub"' EXIT
mkdir -p "$stub/c10/cuda/impl" && echo "#pragma once" >"$stub/c10/cuda/impl/cuda_cmake_macros.h"
read -r -a torch_inc <<<"$("$PY" -c "import torch.utils.cpp_extension as c; print(' '.join('-isystem' + p for p in c.include_paths()))")"
for src in cpp/cuda/*.cpp; do
  "$CXX" -std=c++17 -fsyntax-only -Wall -I "$stub" "${torch_inc[@]}" -I "$cuda_inc" -I cuda/include -I cpp -I cuda/src \
    "$src"
done
echo "OK: the CUDA glue (cpp/cuda) parses against torch $("$PY" -c 'import torch; print(torch.__version__)')"
