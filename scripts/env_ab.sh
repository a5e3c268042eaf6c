#!/usr/bin/env bash
# A/B of run-time switches in one build of scripts/fwd_variant_bench.cu (sm_90a, no torch): the harness is built once
# from this tree, or from a copy with a patch applied, then timed under each setting of environment variables, in
# rounds of alternating order (ABAB), each run under a time limit (a hang must not take the device call with it).
# The unset baseline ("base") always runs; with --patch the unpatched tree's build too ("head"). On the GPU machine.
# Usage: bash scripts/env_ab.sh [--patch FILE] SEQLENS MASKS CAUSAL "NAME:VAR=1 VAR2=1" ["NAME2:VAR=1" ...]
#   env: FA2_HD (default 128), FA2_BWD (0), ROUNDS (2), FA2_VARIANT_TIMEOUT (90 s), OUT
#   e.g. bash scripts/env_ab.sh --patch benchmarks/results/patches/20261204-fwd-d128-tail-split.patch \
#          2048,4096,8192,16384 none 0 "split:FA2_FWD_TAIL_SPLIT=1" \
#          "split-nocluster:FA2_FWD_TAIL_SPLIT=1 FA2_NO_FWD_CLUSTER=1" "nocluster:FA2_NO_FWD_CLUSTER=1"
# The output's "== NAME (round N)" sections are what benchmarks/variant_results.py reads.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/env_ab}
mkdir -p "$OUT"
src=.
if [ "${1:-}" = "--patch" ]; then
  src="$OUT/tree"
  rm -rf "$src" && mkdir -p "$src" && cp -r cuda scripts "$src/"
  (cd "$src" && patch -s -p1) < "$2" || { echo "env_ab: $2 does not apply"; exit 2; }
  shift 2
fi
[ $# -ge 4 ] || { sed -n 2,12p "$0"; exit 2; }
seqlens=$1 masks=$2 causal=$3
shift 3
build() {  # tree, binary
  nvcc -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -DFA2_HD="${FA2_HD:-128}" -DFA2_BWD="${FA2_BWD:-0}" \
    -I "$1/cuda/include" -I "$1/cuda/src" --generate-code=arch=compute_90a,code=[sm_90a] -Xptxas=-v \
    "$1/scripts/fwd_variant_bench.cu" "$1/cuda/src/dispatch.cpp" -o "$2" >"$2.log" 2>&1 ||
    { echo "env_ab: build of $1 failed"; tail -5 "$2.log"; return 1; }
}
rm -f "$OUT/bench" "$OUT/bench_head"  # (a failed build must not leave an older binary to time)
build "$src" "$OUT/bench" &
[ "$src" != . ] && build . "$OUT/bench_head" &
wait
[ -x "$OUT/bench" ] || exit 1
settings=("base:" "$@")
[ -x "$OUT/bench_head" ] && settings=("head:" "${settings[@]}")
declare -A failed=()
for round in $(seq 1 "${ROUNDS:-2}"); do
  for s in "${settings[@]}"; do
    name=${s%%:*} vars=${s#*:}
    [ -z "${failed[$name]:-}" ] || continue
    echo "== $name (round $round)"
    bin=$OUT/bench
    [ "$name" = head ] && bin=$OUT/bench_head
    # (word splitting of vars is wanted: "VAR=1 VAR2=1")
    # shellcheck disable=SC2086
    env $vars timeout "${FA2_VARIANT_TIMEOUT:-90}" "$bin" "$seqlens" "$masks" "$causal"
    rc=$?
    if [ $rc -ne 0 ]; then
      echo "== $name (round $round): exit $rc$([ $rc -eq 124 ] && echo ', timed out')"
      failed[$name]=1
    fi
  done
done
