"""Every repository path a tracked markdown file names exists (issue 30: the README named nine
that did not).

What counts as a path, kept simple on purpose:
- a markdown link's relative target, `[text](target)`, resolved against the file's folder;
- a backticked span made only of path characters (letters, digits, `_ . - / *`, an optional
  `:name` after it, as in `cluster/app.py:proxy_location`) that has a `/` or ends in a file
  extension: with a `/`, it is checked when its first part is a tracked top-level entry (then
  from the repository root) or a tracked entry of the file's own folder (then from there), so
  a Hub id (`org/name`) or a URL route is left alone; a bare file name must be the name of
  some tracked file (a file gone from everywhere is what this catches);
- an unquoted word starting with a tracked top-level folder and a `/` (`router/README.md`).
`*` matches as a glob. Paths are checked against git's tracked files, so build outputs and
run results never count as existing.
"""

from __future__ import annotations

import re
import subprocess
from fnmatch import fnmatchcase
from pathlib import PurePosixPath

from tests.conftest import REPO

# Paths named before they exist, each with why.
NOT_YET: dict[str, str] = {}  # path -> why a document may name it before it exists
EXTENSIONS = (".py", ".md", ".yaml", ".yml", ".sh", ".json", ".txt", ".toml", ".tpl", ".cfg")

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_TICKED = re.compile(r"`([^`\n]+)`")
_PATHLIKE = re.compile(r"^([\w.*-]+(?:/[\w.*-]*)*)(?::[\w.]+)?$")


def _tracked() -> tuple[set[str], set[str]]:
    """(tracked files, tracked folders), relative to the repository root."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, text=True)
    files = {f for f in out.stdout.split("\0") if f and (REPO / f).exists()}
    folders = {str(parent) for f in files for parent in PurePosixPath(f).parents if str(parent) != "."}
    return files, folders


FILES, FOLDERS = _tracked()
TOP = {PurePosixPath(p).parts[0] for p in FILES}
NAMES = {PurePosixPath(p).name for p in FILES}


def _exists(path: str) -> bool:
    path = path.rstrip("/")
    if "*" in path:
        return any(fnmatchcase(p, path) for p in FILES | FOLDERS)
    return path in FILES or path in FOLDERS or path in NOT_YET


def _norm(folder: str, name: str) -> str:
    parts: list[str] = []
    for part in PurePosixPath(folder, name).parts:
        if part == "..":
            parts = parts[:-1]
        elif part != ".":
            parts.append(part)
    return "/".join(parts)


def _unquoted_paths(text: str) -> list[str]:
    text = _TICKED.sub(" ", text)
    text = re.sub(r"\]\([^)]*\)", " ", text)
    text = re.sub(r"\w+://\S+", " ", text)  # URLs
    top = "|".join(re.escape(t) for t in sorted(TOP) if t in FOLDERS)
    found = re.findall(rf"(?<![\w./-])((?:{top})/[\w./*-]*)", text)
    return [p.rstrip(".-") for p in found]


def broken_paths(md: str, text: str) -> list[str]:
    """The paths that `text`, the markdown file `md` (relative to the repository root), names and
    git does not track."""
    folder = str(PurePosixPath(md).parent)
    folder = "" if folder == "." else folder
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"^(\w+:|#|/)", target):
            continue
        path = _norm(folder, target.split("#")[0])
        if path and not _exists(path):
            broken.append(f"link ({target})")
    for span in _TICKED.findall(text):
        match = _PATHLIKE.match(span.strip())
        if not match:
            continue
        path = match.group(1)
        if "/" in path:
            first = path.split("/")[0]
            if first in TOP and _exists(path):
                continue
            local = _norm(folder, first)
            if local in FILES or local in FOLDERS:
                if not _exists(_norm(folder, path)):
                    broken.append(f"`{span}`")
            elif first in TOP:
                broken.append(f"`{span}`")
        elif path.endswith(EXTENSIONS) and not any(fnmatchcase(name, path) for name in NAMES):
            broken.append(f"`{span}`")
    for path in _unquoted_paths(text):
        if not _exists(path):
            broken.append(path)
    return broken


def test_every_path_named_in_markdown_exists():
    broken = {md: found for md in sorted(p for p in FILES if p.endswith(".md"))
              if (found := broken_paths(md, (REPO / md).read_text()))}
    assert not broken, "paths that are not in the repository (fix the text, or the path):\n" + "\n".join(
        f"  {md}: {', '.join(found)}" for md, found in broken.items())


def test_the_heuristics_find_what_they_should():
    text = ("A [link](pd/README.md), a [gone one](nothing.md), [up](../cluster/app.py), `cluster/app.py:proxy_location`, "
            "`cluster/gone.py`, `pd/path.py`, `pd/gone.py`, `HuggingFaceTB/SmolLM2-135M-Instruct`, `/v1/models`, "
            "`decider.py`, `nowhere.py`, `test_faults_*.py`, loadtest/bench/RESULTS.md section 8, router/missing.py.")
    found = broken_paths("router/x.md", text)
    assert found == ["link (nothing.md)", "`cluster/gone.py`", "`pd/gone.py`", "`nowhere.py`", "router/missing.py"]
