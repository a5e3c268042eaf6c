#!/usr/bin/env bash
# Compile time of every CUDA kernel instance of a build (no GPU, no torch): the instances cmake/Kernels.cmake
# lists for FA2_CUDA_ARCHS (default the build's, 80;90;90a) at every headdim (or FA2_HEADDIMS) and dtype, each
# compiled alone with the library's nvcc flags (cuda/CMakeLists.txt), FA2_JOBS at a time (default 2). Prints the
# slowest five, then the sum per arch and a bound for the kernels' share of a build on N cores (list scheduling:
# sum / N + the longest TU; N = FA2_BOUND_CORES, default 16, the Hopper issue's "under 5 minutes on 16 cores"), with
# this machine's cores' speed. Run it on an idle machine: each TU's wall time is what is summed.
# Usage: bash scripts/dev/instance_compile_times.sh   (one "seconds arch file" line per instance in
# $OUT/instance_times.txt, OUT default out/instance_times)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/instance_times}
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake -DFA2_GEN_DIR="$work/gen" -DFA2_CUDA_ARCHS="${FA2_CUDA_ARCHS:-80;90;90a}" \
  ${FA2_HEADDIMS:+-DFA2_HEADDIMS="$FA2_HEADDIMS"} -P cmake/generate_kernels.cmake >/dev/null
echo "== $(wc -l <"$work/gen/instances.txt") instances, ${FA2_JOBS:-2} at a time"
compile_one() {  # src arch -> "seconds arch file"
  local start end
  start=$(date +%s.%N)
  "${NVCC:-nvcc}" -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -I cuda/include -I cuda/src -I "$GEN" \
    "--generate-code=arch=compute_$2,code=[sm_$2]" -c "$1" -o "$1.o"
  end=$(date +%s.%N)
  echo "$(awk -v s="$start" -v e="$end" 'BEGIN {printf "%.1f", e - s}') $2 $(basename "$1")"
}
export -f compile_one
export GEN="$work/gen"
xargs -P "${FA2_JOBS:-2}" -L 1 bash -c 'compile_one "$0" "$1"' <"$work/gen/instances.txt" >"$OUT/instance_times.txt"
sort -n "$OUT/instance_times.txt" | tail -5
awk -v cores="${FA2_BOUND_CORES:-16}" '{ s += $1; a[$2] += $1; if ($1 > m) m = $1 }
  END { for (k in a) printf "sm_%s: %.0f s\n", k, a[k]
        printf "%d instances: %.0f s in all, the longest %.0f s; on %d cores at most %.0f s\n", NR, s, m, cores,
               s / cores + m }' \
  "$OUT/instance_times.txt"
