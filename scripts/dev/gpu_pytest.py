"""pytest with faulthandler on and a per-test timeout where pytest-timeout exists (for the GPU machine's runs).

The work sits under the main guard: tests that start processes with the spawn method (the DDP test) import the
main module again in each child, which must not start another pytest run."""
import faulthandler
import importlib.util
import sys

import pytest

if __name__ == "__main__":
    faulthandler.enable()
    args = sys.argv[1:]
    if importlib.util.find_spec("pytest_timeout") is not None:
        args = ["--timeout", "300"] + args
    # (-q unless the caller gives a verbosity: -q twice prints no summary line, not even the pass count)
    quiet = [] if any(a in ("-q", "-qq", "-v", "-vv") for a in args) else ["-q"]
    sys.exit(pytest.main(quiet + ["-p", "no:cacheprovider", "-rfE"] + args))
