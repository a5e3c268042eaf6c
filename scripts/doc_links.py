"""Every file the documentation cites exists: markdown links (from the document's folder) and path-like words (`scripts/dev/harness.sh`,
`attention_h200-20261204g-grid.json`, `fa2/tile_order.h`) in README.md, docs/*.md and benchmarks/README.md. A word
resolves if it names a tracked file or folder from the repository root or the document's folder, or is the tail of
a tracked path; a suffix such as `-8k.json` after a full name is read against that name. Words in a paragraph that says
"git history" name removed files and are not checked. CI runs it.
Usage: python3 scripts/doc_links.py [files...]   (exit 1 when a citation does not resolve)
"""
import fnmatch
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", "benchmarks/README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
EXT = r"(?:json|png|py|sh|cu|cuh|h|cpp|md|cmake|toml|in|txt)"
WORD = re.compile(r"(?<![\w/.<{-])([\w.*/-]*[\w*]\." + EXT + r")(?![\w/])")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# produced at run time, or another project's file, named on purpose
NOT_IN_REPO = {".fa4/install.sh", "../shared/tools/fa4/prepare.sh", "modeling_llama.py", "tile_size.h"}
PLACEHOLDER = re.compile(r"[A-Z]{3,}")  # attention_TAG.json, FILE.json


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return out + sorted({str(Path(f).parent) for f in out})


def resolves(word: str, doc_dir: Path, files: list[str]) -> bool:
    if word in NOT_IN_REPO or word.startswith(("http", "/tmp/")) or "<" in word or PLACEHOLDER.search(word):
        return True
    for base in (ROOT, ROOT / doc_dir):
        candidate = (base / word).resolve()
        if "*" not in word and candidate.exists():
            return True
    tail = word.lstrip("./")
    return any(fnmatch.fnmatch(f, tail) or fnmatch.fnmatch(f, "*/" + tail) for f in files)


def block_of(lines: list[str], i: int) -> str:
    """The paragraph, list item or table row that line i belongs to."""
    starts = re.compile(r"\s*$|\s*([-|#]|\d+\.) ")
    first = i
    while first > 0 and not starts.match(lines[first]) and lines[first - 1].strip():
        first -= 1
    last = i + 1
    while last < len(lines) and lines[last].strip() and not starts.match(lines[last]):
        last += 1
    return "\n".join(lines[first:last])


def main(docs: list[str]) -> int:
    files = tracked()
    bad = 0
    for doc in docs:
        doc_dir = Path(doc).parent
        previous = ""
        lines = (ROOT / doc).read_text().splitlines()
        for lineno, line in enumerate(lines, 1):
            if "git history" in block_of(lines, lineno - 1) or "git show" in block_of(lines, lineno - 1):
                continue
            links = [m.group(1) for m in LINK.finditer(line) if not m.group(1).startswith("http")]
            for link in links:  # a link resolves from its document's folder, as the renderer reads it
                if not (ROOT / doc_dir / link).exists():
                    print(f"{doc}:{lineno}: link {link} does not exist")
                    bad += 1
            for word in [m.group(1) for m in WORD.finditer(line) if m.group(1) not in links]:
                if word.startswith(("-", "_")) and previous:
                    # a suffix of the previous full name: e2e_h200-20261130-2k.json / -8k.json
                    stem = previous.rsplit("/", 1)[-1]
                    word = stem[:stem.rfind(word[0], 0, stem.rfind("."))] + word if word[0] in stem else word
                elif "." in word.rsplit("/", 1)[-1]:
                    previous = word
                if not resolves(word, doc_dir, files):
                    print(f"{doc}:{lineno}: {word} does not exist")
                    bad += 1
    print(f"doc_links: {len(docs)} documents, {bad} missing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or DOCS))
