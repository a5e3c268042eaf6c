#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the test suite. CI runs exactly this (see .ci/run).
# FA2_CI=1 (default here) uses the short hypothesis profile and skips tests marked slow; FA2_CI=0 runs them all
# (docs/testing.md: what each profile runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY="${FA2_PYTHON:-.venv/bin/python}"
# Absolute, because pytest runs from tests/ (no realpath: it would resolve the venv's symlink to the base python).
[[ "$PY" == /* ]] || PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
export FA2_CI="${FA2_CI:-1}"
if [[ "$FA2_CI" == "1" ]]; then export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"; fi
# Run from tests/ against the installed package (not the source tree), as a user would.
cd tests && "$PY" -m pytest -q -p no:cacheprovider "$@" .
