"""Functions longer than a limit under cuda/ and cpp/ (the layout rule: none over 200 lines). CI runs it.

A function is found as a line that ends a signature with `{` at brace depth 0 within a namespace (or a lambda-free
body start), and measured to its matching `}`; comments and strings are stripped first. Heuristic, but it errs
towards finding: a body it cannot match counts as long.
Usage: python3 scripts/function_lengths.py [--limit 200] [paths...]   (exit 1 when any is longer)
"""
import argparse
import re
import sys
from pathlib import Path

SOURCES = ("*.h", "*.cuh", "*.cu", "*.cpp", "*.in")


def strip(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    text = re.sub(r"'(\\.|[^'\\\n])*'", "''", text)
    return text


def functions(text):
    """(name, first line, line count) of every top-level function body (namespaces and structs are entered)."""
    lines = strip(text).split("\n")
    stack = []  # kinds of open braces: "scope" (namespace/struct/class/extern) or "func"
    out, start, name, header = [], None, None, ""
    for i, line in enumerate(lines):
        for ch_i, ch in enumerate(line):
            if ch == "{":
                if any(k == "func" for k in stack):
                    stack.append("inner")
                    continue
                before = (header + " " + line[:ch_i]).strip()
                is_scope = re.search(r"\b(namespace|struct|class|union|enum)\b[^;()]*$", before) or \
                    re.search(r'extern\s*""\s*$', before) or not re.search(r"\)\s*(const|noexcept|override|final|->[^{]*|\s)*$", before)
                if is_scope:
                    stack.append("scope")
                else:
                    m = re.search(r"([~\w:<>]+)\s*\([^()]*(\([^()]*\)[^()]*)*\)\s*[^()]*$", before)
                    stack.append("func")
                    start, name = i, (m.group(1) if m else "?")
                header = ""
            elif ch == "}":
                kind = stack.pop() if stack else "scope"
                if kind == "func":
                    out.append((name, start + 1, i - start + 1))
                header = ""
            elif ch == ";" and not any(k == "func" for k in stack):
                header = ""
        if not any(k == "func" for k in stack):
            header = (header + " " + line)[-2000:]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("paths", nargs="*", default=["cuda", "cpp"])
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    bad = []
    for base in args.paths:
        base = (root / base) if not Path(base).is_absolute() else Path(base)
        files = [base] if base.is_file() else sorted(p for pat in SOURCES for p in base.rglob(pat))
        for f in files:
            for name, line, count in functions(f.read_text(errors="replace")):
                if count > args.limit:
                    bad.append((count, f"{f.relative_to(root)}:{line}", name))
    for count, where, name in sorted(bad, reverse=True):
        print(f"{count:5d} lines  {where}  {name}")
    if bad:
        print(f"{len(bad)} function(s) longer than {args.limit} lines")
        return 1
    print(f"no function under {', '.join(args.paths)} is longer than {args.limit} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
