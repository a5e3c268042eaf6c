"""SASS fingerprints (scripts/dev/sass_fingerprint.sh): normalize a cuobjdump listing, or compare two folders.

  cuobjdump --dump-sass x.o | python3 sass_compare.py --normalize   one "#kernel <md5> <name>" line per kernel,
                                                                    then its instructions (addresses dropped)
  python3 sass_compare.py BEFORE_DIR AFTER_DIR                      per instance: kernels whose instructions are
                                                                    identical (matched by content, names ignored)
Exit status 1 when any instance differs or is missing.
"""
import hashlib
import re
import sys
from pathlib import Path


def normalize(text):
    kernels, name, body = [], None, []
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name is not None:
                kernels.append((name, body))
            name, body = m.group(1), []
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*(/\*.*)?$", line)
        if name is not None and m and m.group(1):
            body.append(m.group(1))
    if name is not None:
        kernels.append((name, body))
    out = []
    for name, body in sorted(kernels, key=lambda k: k[0]):
        digest = hashlib.md5("\n".join(body).encode()).hexdigest()
        out.append(f"#kernel {digest} {len(body)} {name}")
        out.extend(body)
    return "\n".join(out) + "\n"


def digests(path):
    return sorted(l.split()[1] + " " + l.split()[2] for l in path.read_text().splitlines() if l.startswith("#kernel "))


def compare(before, after):
    ok = True
    for b in sorted(Path(before).glob("*.sass")):
        a = Path(after) / b.name
        if not a.exists():
            print(f"MISSING {b.name}")
            ok = False
            continue
        db, da = digests(b), digests(a)
        same = sum(min(db.count(d), da.count(d)) for d in set(db))
        status = "same" if db == da else "DIFFERS"
        ok &= db == da
        print(f"{status:8s} {b.name}: {same}/{len(db)} kernels identical" + ("" if len(db) == len(da) else f" ({len(da)} after)"))
    return ok


if __name__ == "__main__":
    if sys.argv[1:] == ["--normalize"]:
        sys.stdout.write(normalize(sys.stdin.read()))
    else:
        sys.exit(0 if compare(sys.argv[1], sys.argv[2]) else 1)
