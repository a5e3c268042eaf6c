#!/usr/bin/env bash
# CI's compile-only check of the CUDA kernels with the machine's nvcc (no GPU, no torch needed):
#   1. nothing under cuda/ includes torch, ATen or c10;
#   2. every hand-written source under cuda/src compiles (host-only .cpp with the host compiler, .cu with nvcc);
#   3. one instance per kernel family (direction) compiles for sm_80 and for sm_90a, ptxas reporting registers
#      and spills (a spill in a kernel is printed as a warning, not a failure; wgmma serialized by ptxas, C751x, fails);
#   4. the sm90 building-block probes (scripts/dev/sm90_wgmma_probe.cu, sm90_tma_probe.cu) and the forward's variant
#      harness (scripts/dev/fwd_variant_bench.cu) compile for sm_90a (and its d 256 forward with FA2_SM90_TMA=0, its d 128
#      backward with FA2_CTA_TRACE), and the generated wgmma wrappers match
#      their generator.
# Usage: scripts/cuda_compile_check.sh [headdims: one, or a CMake list such as "64;128;256" (default 128)];
# env NVCC, CXX, FA2_JOBS (default 2), FA2_CHECK_DTYPES (a CMake list, default fp16: the kernels of fp16 and bf16 differ
# in their conversions only, but ptxas has spilled in one and not the other). (.ci/run checks 64;128;256 in fp16 and
# bf16: about 160 s on 2 cores.)
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-nvcc}
CXX=${CXX:-g++}
JOBS=${FA2_JOBS:-2}
HEADDIM=${1:-128}
DTYPES=${FA2_CHECK_DTYPES:-fp16}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== no torch/ATen/c10 under cuda/"
if grep -rnE '#\s*include\s*[<"](torch|ATen|c10)/' cuda/; then
  echo "FAIL: cuda/ must stay framework-free (the lines above include torch/ATen/c10)"; exit 1
fi

command -v "$NVCC" >/dev/null || { echo "FAIL: nvcc not found (set NVCC)"; exit 1; }
cuda_inc=$(dirname "$(dirname "$(readlink -f "$(command -v "$NVCC")")")")/include
[ -f "$cuda_inc/cuda_runtime_api.h" ] || cuda_inc=/usr/local/cuda/include

echo "== generating one instance per direction (headdim $HEADDIM, $DTYPES, sm_80 and sm_90a)${FA2_DISABLE_BWD:+, FA2_DISABLE_BWD}"
cmake -DFA2_GEN_DIR="$work/gen" -DFA2_HEADDIMS="$HEADDIM" -DFA2_CUDA_ARCHS="80;90a" -DFA2_DTYPES="$DTYPES" \
  -DFA2_DISABLE_BWD="${FA2_DISABLE_BWD:-OFF}" -P cmake/generate_kernels.cmake

flags=(-std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -I cuda/include -I cuda/src -I "$work/gen")
jobs_file="$work/jobs"
: >"$jobs_file"
while read -r src; do  # the hand-written sources of the enabled directions (cmake/Kernels.cmake decides)
  [ -n "$src" ] || continue
  case "$src" in
    *.cpp) echo "$CXX -std=c++17 -O2 -Wall -Werror -I cuda/include -I cuda/src -I $work/gen -I $cuda_inc -c $src -o $work/$(basename "$src").o" ;;
    *.cu) echo "$NVCC ${flags[*]} --generate-code=arch=compute_80,code=[sm_80] -c $src -o $work/$(basename "$src").o" ;;
  esac >>"$jobs_file"
done <"$work/gen/host_sources.txt"
while read -r src arch; do
  echo "$NVCC ${flags[*]} -Xptxas=-v --generate-code=arch=compute_${arch},code=[sm_${arch}] -c $src -o $src.o 2>$src.ptxas.log" >>"$jobs_file"
done <"$work/gen/instances.txt"
for probe in sm90_wgmma_probe sm90_tma_probe; do
  echo "$NVCC -std=c++17 -O2 -I cuda/include --generate-code=arch=compute_90a,code=[sm_90a] scripts/dev/$probe.cu -o $work/$probe" >>"$jobs_file"
done
# the kernel variant harness (scripts/dev/fwd_variants.sh) at its default headdim, with the backward, built and linked
# as fwd_variants.sh builds it (with dispatch.cpp: a symbol the harness needs and that file lacks broke its device run)
echo "$NVCC ${flags[*]} -DFA2_BWD=1 --generate-code=arch=compute_90a,code=[sm_90a] scripts/dev/fwd_variant_bench.cu cuda/src/dispatch.cpp cuda/src/plan.cpp cuda/src/dev_options.cpp -o $work/fwd_variant_bench" >>"$jobs_file"
# the sm_90a forward with cp.async loads instead of the TMA (the FA2_SM90_TMA=OFF debugging build) at d 256, whose
# 80-key tile exists only with the TMA (tile_config.h)
echo "$NVCC ${flags[*]} -DFA2_HD=256 -DFA2_SM90_TMA=0 --generate-code=arch=compute_90a,code=[sm_90a] -c scripts/dev/fwd_variant_bench.cu -o $work/fwd_variant_bench_cp_async.o" >>"$jobs_file"
# the CTA-timeline build (fa2/cta_trace.cuh, scripts/dev/cta_trace.py) of the harness's backward
echo "$NVCC ${flags[*]} -DFA2_HD=128 -DFA2_BWD=1 -DFA2_CTA_TRACE=1 --generate-code=arch=compute_90a,code=[sm_90a] -c scripts/dev/fwd_variant_bench.cu -o $work/fwd_variant_bench_trace.o" >>"$jobs_file"
# ... and of the forward with every tile of both consumer warpgroups marked (FA2_CTA_TRACE_TILES)
echo "$NVCC ${flags[*]} -DFA2_HD=128 -DFA2_CTA_TRACE=1 -DFA2_CTA_TRACE_TILES=1 --generate-code=arch=compute_90a,code=[sm_90a] -c scripts/dev/fwd_variant_bench.cu -o $work/fwd_variant_bench_trace_tiles.o" >>"$jobs_file"

echo "== cuda/include/fa2/sm90/wgmma_ops.cuh is what gen_wgmma.py writes"
python3 cuda/include/fa2/sm90/gen_wgmma.py --out "$work/wgmma_ops.cuh" >/dev/null
if ! cmp -s cuda/include/fa2/sm90/wgmma_ops.cuh "$work/wgmma_ops.cuh"; then
  echo "FAIL: wgmma_ops.cuh differs from gen_wgmma.py's output: regenerate it and commit both"; exit 1
fi

echo "== compiling $(wc -l <"$jobs_file") translation units, $JOBS at a time"
start=$SECONDS
if ! xargs -P "$JOBS" -I{} -d '\n' bash -c '{} || { echo "FAIL: {}"; exit 255; }' <"$jobs_file"; then
  for log in "$work"/gen/*.ptxas.log; do [ -s "$log" ] && grep -v "^ptxas info\s*: \(Compile time\|Function properties\|0 bytes gmem\)" "$log" | grep -iE "error|warning" || true; done
  echo "FAIL: compilation failed"; exit 1
fi
for log in "$work"/gen/*.ptxas.log; do
  inst=$(basename "$log" .cu.ptxas.log)
  awk -v inst="$inst" '/bytes spill stores/ {spill=$5} /Used [0-9]+ registers/ {
      print "  " inst ": " $5 " registers" (spill > 0 ? ", " spill " B spill stores" : ""); spill=0}' "$log"
  if grep -qE "[1-9][0-9]* bytes spill stores" "$log"; then echo "  warning: $inst spills registers (see -Xptxas -v)"; fi
  # ptxas serializing wgmma (C7510..C7515: wait after every product) silently undoes an sm_90a kernel's pipelining
  if grep -E "C751[0-9]" "$log"; then echo "FAIL: $inst: ptxas serialized wgmma instructions (above)"; exit 1; fi
done
echo "OK: CUDA compile check passed in $((SECONDS - start)) s"
