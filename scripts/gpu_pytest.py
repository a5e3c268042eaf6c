"""pytest with faulthandler on and a per-test timeout where pytest-timeout exists (for the GPU machine's runs)."""
import faulthandler
import importlib.util
import sys

import pytest

faulthandler.enable()
args = sys.argv[1:]
if importlib.util.find_spec("pytest_timeout") is not None:
    args = ["--timeout", "300"] + args
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rfE"] + args))
