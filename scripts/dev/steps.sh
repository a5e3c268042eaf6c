# Sourced by the one-call GPU scripts (gpu_validate.sh, gpu_results.sh): time-boxed steps and their summary.
#   step NAME SECONDS COMMAND...   runs COMMAND with a time limit, output to $STEP_LOGS/NAME.log, and records one
#                                  summary line (ok / TIMEOUT / FAILED, seconds, the log's last line)
#   print_steps                    the summary lines
# Each step has its own limit so that one hang cannot eat the whole device call (600 s at most).
STEP_LOGS=${STEP_LOGS:?set STEP_LOGS before sourcing scripts/dev/steps.sh}
step_summary=()
step() {
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$STEP_LOGS/$name.log" 2>&1
  local rc=$?
  local verdict="ok"
  [ $rc -eq 124 ] && verdict="TIMEOUT (${limit} s)"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && verdict="FAILED (rc $rc)"
  step_summary+=("$(printf '%-16s %-18s %4d s  %s' "$name" "$verdict" $((SECONDS - start)) \
    "$(tail -1 "$STEP_LOGS/$name.log" | cut -c1-100)")")
}
print_steps() { printf '%s\n' "${step_summary[@]}"; }
