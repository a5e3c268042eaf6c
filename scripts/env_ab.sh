#!/usr/bin/env bash
# A/B of run-time switches in one build of scripts/fwd_variant_bench.cu (sm_90a, no torch): the harness is built once
# from this tree, or from a copy with a patch applied, then timed under each setting of environment variables, in
# rounds of alternating order (ABAB), each run under a time limit (a hang must not take the device call with it).
# The unset baseline ("base") always runs; with --patch the unpatched tree's build too ("head"). On the GPU machine.
# Usage: bash scripts/env_ab.sh [--patch FILE] SEQLENS MASKS CAUSAL ["NAME:VAR=1 VAR2=1" ...]
#   env: FA2_HD (default 128), FA2_BWD (0), ROUNDS (2), FA2_VARIANT_TIMEOUT (90 s), OUT, FA2_HARNESS_FLAGS (extra
#   nvcc flags of both builds: harness.sh), FA2_TRACE_OUT (with a -DFA2_CTA_TRACE=1 build: each entry's CTA timelines
#   go to FA2_TRACE_OUT/<name>, read by scripts/cta_trace.py)
#   e.g. bash scripts/env_ab.sh --patch benchmarks/results/patches/20261204-fwd-d128-tail-split.patch \
#          2048,4096,8192,16384 none 0 "nosplit:FA2_NO_FWD_TAIL_SPLIT=1" "nocluster:FA2_NO_FWD_CLUSTER=1"
# The build and the rounds: scripts/harness.sh (as fwd_variants.sh's).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/env_ab}
mkdir -p "$OUT"
src=.
if [ "${1:-}" = "--patch" ]; then
  src="$OUT/tree"
  # (the source folders a patch may touch: the harness builds from cuda/ and scripts/, a library patch has its
  # glue, tests and benchmark beside them)
  rm -rf "$src" && mkdir -p "$src" && cp -r cuda cpp python scripts tests benchmarks "$src/"
  (cd "$src" && patch -s -p1) < "$2" || { echo "env_ab: $2 does not apply"; exit 2; }
  shift 2
fi
[ $# -ge 3 ] || { sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 2; }
seqlens=$1 masks=$2 causal=$3
shift 3
FA2_HD=${FA2_HD:-128}
# shellcheck source=scripts/harness.sh
source scripts/harness.sh
rm -f "$OUT/bench_head" "$OUT/bench_head.log"  # (built below only with --patch: none left from an earlier run)
harness_build "$src" "$src/cuda/include" "$OUT/bench" &
[ "$src" != . ] && harness_build . cuda/include "$OUT/bench_head" &
wait
for b in "$OUT/bench" "$OUT/bench_head"; do
  [ -e "$b.log" ] && [ ! -x "$b" ] && { echo "env_ab: build failed ($b.log)"; tail -5 "$b.log"; }
done
[ -x "$OUT/bench" ] || exit 1
entries=("base|$OUT/bench|")
[ -x "$OUT/bench_head" ] && entries=("head|$OUT/bench_head|" "${entries[@]}")
for s in "$@"; do entries+=("${s%%:*}|$OUT/bench|${s#*:}"); done
if [ -n "${FA2_TRACE_OUT:-}" ]; then  # (one folder per entry: the builds write the same file names)
  for i in "${!entries[@]}"; do
    name=${entries[$i]%%|*}
    mkdir -p "$FA2_TRACE_OUT/$name"
    entries[$i]="${entries[$i]} FA2_TRACE_OUT=$FA2_TRACE_OUT/$name"
  done
fi
harness_rounds "${ROUNDS:-2}" "$seqlens" "$masks" "$causal" "${entries[@]}"
