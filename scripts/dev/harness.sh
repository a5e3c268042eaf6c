# Sourced by the harness A/B scripts (fwd_variants.sh: folders of edited headers; env_ab.sh: run-time switches, a
# patched tree): building scripts/dev/fwd_variant_bench.cu and timing the builds in rounds. On the GPU machine (sm_90a).
#   harness_build TREE INCLUDE BINARY   TREE's harness + cuda/src/dispatch.cpp (plan.cpp) against the headers in INCLUDE, at
#                                       FA2_HD / FA2_BWD, with FA2_HARNESS_FLAGS' extra nvcc flags (e.g. "-DFA2_CTA_TRACE=1
#                                       -DFA2_CTA_TRACE_TILES=1"); BINARY removed first (a failed build must not leave
#                                       an older binary to time), the compiler's output in BINARY.log
#   harness_rounds ROUNDS SEQLENS MASKS CAUSAL "NAME|BINARY|VAR=1 VAR2=1" ...
#                                       every entry timed once a round ("== NAME (round N)", the sections
#                                       benchmarks/variant_results.py reads), in the given order, each run limited to
#                                       FA2_VARIANT_TIMEOUT seconds (default 90: a hang, e.g. on a barrier, must not
#                                       take the device call with it); an entry that fails or hangs is not run again
harness_build() {
  rm -f "$3"
  local host=("$1/cuda/src/dispatch.cpp") f  # (and the plan builder and options where the tree has them)
  for f in plan dev_options; do [ -f "$1/cuda/src/$f.cpp" ] && host+=("$1/cuda/src/$f.cpp"); done
  # shellcheck disable=SC2086  # (FA2_HARNESS_FLAGS: words)
  nvcc -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -DFA2_HD="$FA2_HD" -DFA2_BWD="${FA2_BWD:-0}" \
    ${FA2_HARNESS_FLAGS:-} -I "$2" -I "$1/cuda/src" --generate-code=arch=compute_90a,code=[sm_90a] -Xptxas=-v \
    "$1/scripts/dev/fwd_variant_bench.cu" "${host[@]}" -o "$3" >"$3.log" 2>&1
}
harness_rounds() {
  local rounds=$1 seqlens=$2 masks=$3 causal=$4
  shift 4
  local -A failed=()
  local round entry name bin vars rc
  for round in $(seq 1 "$rounds"); do
    for entry in "$@"; do
      IFS='|' read -r name bin vars <<<"$entry"
      [ -x "$bin" ] && [ -z "${failed[$name]:-}" ] || continue
      echo "== $name (round $round)"
      # (word splitting of vars is wanted: "VAR=1 VAR2=1")
      # shellcheck disable=SC2086
      env $vars timeout "${FA2_VARIANT_TIMEOUT:-90}" "$bin" "$seqlens" "$masks" "$causal"
      rc=$?
      if [ $rc -ne 0 ]; then  # (not timed again: a hang would eat the call's time twice)
        echo "== $name (round $round): exit $rc$([ $rc -eq 124 ] && echo ', timed out')"
        failed[$name]=1
      fi
    done
  done
}
