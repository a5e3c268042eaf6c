#!/usr/bin/env bash
# Sets up fa2 on a fresh machine: a virtual environment in .venv (or the interpreter in $FA2_PYTHON), torch,
# the build and test tools, then builds and installs fa2 against that torch.
#   bash scripts/setup.sh            # build deps + fa2 + transformers (for the demo and tests)
# On a machine whose python3 already has torch (e.g. a CUDA build), the venv sees it (--system-site-packages)
# and fa2 is built against it, with CUDA kernels when nvcc is present. Otherwise torch==2.13.0 is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${FA2_PYTHON:-}" ]]; then
  PY="$FA2_PYTHON"
else
  if [[ ! -x .venv/bin/python ]]; then
    if python3 -c "import torch" 2>/dev/null; then
      python3 -m venv --system-site-packages .venv
    else
      python3 -m venv .venv
    fi
  fi
  PY=.venv/bin/python
fi

pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "fa2 setup: installing torch==2.13.0"
  pip_install "torch==2.13.0"
fi
# Build tools (fa2 is built with --no-build-isolation against the installed torch) and what tests/demo use.
pip_install "scikit-build-core>=0.10" "pybind11>=2.12" cmake ninja "pytest>=8" "hypothesis>=6.100" \
  "transformers==5.17.0"
echo "fa2 setup: building fa2 against torch $("$PY" -c 'import torch; print(torch.__version__)')"
# Use every core for the build (CMAKE_BUILD_PARALLEL_LEVEL is read by scikit-build-core's cmake --build).
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
pip_install --no-build-isolation --no-deps .
"$PY" -m fa2
