#!/usr/bin/env bash
# Builds scripts/dev/fwd_variant_bench.cu once per variant of the kernel headers and times them side by side (the forward;
# the backward too with FA2_BWD=1), on the GPU machine (sm_90a; no torch, no CMake). A variant is a folder holding a
# full copy of cuda/include (its fa2/ headers, edited);
# "base" is this tree's cuda/include. The builds run in parallel, the timings one after the other, twice in
# alternating order (ABAB) so that clock drift shows (the build and the rounds: scripts/dev/harness.sh).
# Usage: bash scripts/dev/fwd_variants.sh [seqlens] [masks] [variant folders...]
#   env: FA2_HD (default 64), FA2_BWD=1 (also time the backward: builds take about 20 s), FA2_CAUSAL (0, 1 or 0,1;
#   default 0: the harness's causal argument), FA2_VARIANT_TIMEOUT (seconds a variant's timing may take, default 90:
#   a variant that hangs, e.g. on a barrier, must not take the device call with it), OUT
#   e.g. bash scripts/dev/fwd_variants.sh 1024,4096,16384 none,bf16,bool scratch/v1 scratch/v2
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/fwd_variants}
mkdir -p "$OUT"
seqlens=${1:-1024,4096,16384}
masks=${2:-none,bf16,fp32,bool}
shift 2 2>/dev/null || shift $#
variants=(base "$@")
names=$(for v in "${variants[@]}"; do basename "$v"; done)
if [ "$(echo "$names" | sort | uniq -d)" != "" ]; then echo "variant folders need distinct names (and not 'base')"; exit 2; fi
FA2_HD=${FA2_HD:-64}
# shellcheck source=scripts/dev/harness.sh
source scripts/dev/harness.sh
for v in "${variants[@]}"; do
  harness_build . "$([ "$v" = base ] && echo cuda/include || echo "$v")" "$OUT/bench_$(basename "$v")" &
done
wait
entries=()
for v in "${variants[@]}"; do
  name=$(basename "$v")
  [ -x "$OUT/bench_$name" ] || { echo "== $name: build failed"; tail -5 "$OUT/bench_$name.log"; }
  entries+=("$name|$OUT/bench_$name|")
done
harness_rounds 2 "$seqlens" "$masks" "${FA2_CAUSAL:-0}" "${entries[@]}"
