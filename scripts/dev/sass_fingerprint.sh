#!/usr/bin/env bash
# SASS fingerprint of the CUDA kernel instances (no GPU, no torch): every instance cmake/Kernels.cmake lists for
# FA2_CUDA_ARCHS (default 80;90a) x FA2_HEADDIMS (default all) x FA2_DTYPES (default both) is compiled alone with the
# library's nvcc flags and disassembled; each kernel's instructions (its name left out, so that a renamed template
# still matches) are hashed. Two fingerprints compared with scripts/dev/sass_compare.py tell whether a refactor
# changed any instruction: identical SASS means identical results and identical speed.
# Usage: bash scripts/dev/sass_fingerprint.sh OUT_DIR [INSTANCE_REGEX]    (FA2_JOBS at a time, default 2)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
FILTER=${2:-.}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake -DFA2_GEN_DIR="$work/gen" -DFA2_CUDA_ARCHS="${FA2_CUDA_ARCHS:-80;90a}" \
  ${FA2_HEADDIMS:+-DFA2_HEADDIMS="$FA2_HEADDIMS"} ${FA2_DTYPES:+-DFA2_DTYPES="$FA2_DTYPES"} \
  -P cmake/generate_kernels.cmake >/dev/null
grep -E "$FILTER" "$work/gen/instances.txt" >"$work/selected.txt" || { echo "no instance matches $FILTER"; exit 1; }
echo "== $(wc -l <"$work/selected.txt") instances, ${FA2_JOBS:-2} at a time -> $OUT"
sass_one() {  # src arch: OUT/<instance>.<arch>.sass (normalized) and .ptxas (registers, spills)
  local name; name=$(basename "$1" .cu).sm_$2
  "${NVCC:-nvcc}" -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -I cuda/include -I cuda/src -I "$GEN" \
    -Xptxas=-v "--generate-code=arch=compute_$2,code=[sm_$2]" -c "$1" -o "$GEN/$name.o" 2>"$OUT/$name.ptxas" ||
    { echo "FAIL: $1 ($2)"; cat "$OUT/$name.ptxas"; return 255; }
  cuobjdump --dump-sass "$GEN/$name.o" | python3 "$ROOT/scripts/dev/sass_compare.py" --normalize >"$OUT/$name.sass"
  echo "  $name"
}
export -f sass_one
export GEN="$work/gen" OUT ROOT="$PWD"
xargs -P "${FA2_JOBS:-2}" -L 1 bash -c 'sass_one "$0" "$1"' <"$work/selected.txt"
