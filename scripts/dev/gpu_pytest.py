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
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rfE"] + args))
