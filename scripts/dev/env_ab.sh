#!/usr/bin/env bash
# A/B of run-time switches in one build of scripts/dev/fwd_variant_bench.cu (sm_90a, no torch): the harness is built once
# from this tree, or from a copy with a patch applied, then timed under each setting of environment variables, in
# rounds of alternating order (ABAB), each run under a time limit (a hang must not take the device call with it).
# The unset baseline ("base") always runs; with --patch the unpatched tree's build too ("head"), and with several
# --patch each after the first as its own build named after its file (the switches run on the first's). On the GPU
# machine.
# Usage: bash scripts/dev/env_ab.sh [--patch FILE ...] SEQLENS MASKS CAUSAL ["NAME:VAR=1 VAR2=1" ...]
#   env: FA2_HD (default 128), FA2_BWD (0), ROUNDS (2), FA2_VARIANT_TIMEOUT (90 s), OUT, FA2_HARNESS_FLAGS (extra
#   nvcc flags of every build: harness.sh), FA2_TRACE_OUT (with a -DFA2_CTA_TRACE=1 build: each entry's CTA timelines
#   go to FA2_TRACE_OUT/<name>, read by scripts/dev/cta_trace.py)
#   e.g. bash scripts/dev/env_ab.sh --patch benchmarks/results/patches/20261204-fwd-d128-tail-split.patch \
#          2048,4096,8192,16384 none 0 "nosplit:FA2_NO_FWD_TAIL_SPLIT=1" "nocluster:FA2_DEV_OPTIONS=fwd_cluster=0"
# The build and the rounds: scripts/dev/harness.sh (as fwd_variants.sh's).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/env_ab}
mkdir -p "$OUT"
# (each --patch's tree: a copy of the source folders a patch may touch. The harness builds from cuda/ and scripts/, a
# library patch has its glue, tests and benchmark beside them)
patched=() names=()
while [ "${1:-}" = "--patch" ]; do
  tree="$OUT/tree${#patched[@]}"
  rm -rf "$tree" && mkdir -p "$tree" && cp -r cuda cpp python scripts tests benchmarks "$tree/"
  (cd "$tree" && patch -s -p1) < "$2" || { echo "env_ab: $2 does not apply"; exit 2; }
  patched+=("$tree")
  names+=("$(basename "$2" .patch)")
  shift 2
done
[ $# -ge 3 ] || { sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 2; }
seqlens=$1 masks=$2 causal=$3
shift 3
FA2_HD=${FA2_HD:-128}
# shellcheck source=scripts/dev/harness.sh
source scripts/dev/harness.sh
rm -f "$OUT"/bench*  # (a failed build must not leave an earlier run's binary to time)
# Builds: "base" from the (first) patched tree, or this one; "head" from this tree when patched; each further patch
# under its file's name. All at once (one nvcc each).
builds=("base|${patched[0]:-.}")
[ ${#patched[@]} -gt 0 ] && builds=("head|." "${builds[@]}")
for i in $(seq 1 $((${#patched[@]} - 1))); do builds+=("${names[$i]}|${patched[$i]}"); done
for b in "${builds[@]}"; do harness_build "${b#*|}" "${b#*|}/cuda/include" "$OUT/bench_${b%%|*}" & done
wait
entries=()
for b in "${builds[@]}"; do
  bin="$OUT/bench_${b%%|*}"
  if [ -x "$bin" ]; then entries+=("${b%%|*}|$bin|"); else echo "env_ab: build failed ($bin.log)"; tail -5 "$bin.log"; fi
done
[ -x "$OUT/bench_base" ] || exit 1
for s in "$@"; do entries+=("${s%%:*}|$OUT/bench_base|${s#*:}"); done
if [ -n "${FA2_TRACE_OUT:-}" ]; then  # (one folder per entry: the builds write the same file names)
  for i in "${!entries[@]}"; do
    name=${entries[$i]%%|*}
    mkdir -p "$FA2_TRACE_OUT/$name"
    entries[$i]="${entries[$i]} FA2_TRACE_OUT=$FA2_TRACE_OUT/$name"
  done
fi
harness_rounds "${ROUNDS:-2}" "$seqlens" "$masks" "$causal" "${entries[@]}"
