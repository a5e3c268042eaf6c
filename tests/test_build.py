"""Checks on the built extension itself (not on what it computes)."""
import re
import shutil
import subprocess

import pytest

import fa2

# Mangled-name prefixes of libstdc++'s iostream/locale machinery: std::ostream / std::istream members, std::locale,
# std::ios_base, std::num_put, std::ctype, std::codecvt. Our code never defines any of them; finding one defined in
# _C means part of libstdc++.a was linked in next to the shared libstdc++ torch loads (two copies of the locale
# state: integer formatting in error messages crashed on the H200 machine). CMakeLists.txt links the shared one.
_LIBSTDCXX_INTERNALS = re.compile(r"^_ZN(K?)(So|Si|St6locale|St8ios_base|St7num_put|St5ctype|St7codecvt)")


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_extension_does_not_carry_a_static_libstdcxx_copy():
    so = fa2._C.__file__
    out = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True, check=True).stdout
    symbols = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert symbols, f"nm listed no dynamic symbols in {so}"
    copied = [s for s in symbols if _LIBSTDCXX_INTERNALS.match(s)]
    assert not copied, f"{so} defines libstdc++ internals (static libstdc++ linked in?): {copied[:5]}"


def test_error_messages_keep_their_numbers():
    # The symptom the check above guards against, seen from Python: the value given must appear in the message.
    import torch
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises((RuntimeError, ValueError), match=r"window_left must be >= -1 .*got -12345"):
        fa2.attention(q, q, q, window_left=-12345)
