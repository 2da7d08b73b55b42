"""The OpenAI compatibility table of docs/api.md, rendered from the differential test's corpus
(tests/integration/compat_corpus/): one row per feature, "same as vLLM" unless an entry of it
documents a difference. `python -m tests.support.compat_table` rewrites the table between
the markers in docs/api.md; tests/unit/test_compat_table.py fails when the table there is not
what this renders, so the table cannot drift from what the differential test checks.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.compat import CORPUS_DIR, Entry, load_corpus

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
BEGIN = "<!-- compat-table:begin -->"
END = "<!-- compat-table:end -->"
SAME = "same as vLLM"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _status(entries: list[Entry]) -> str:
    differences = [f"differs (tandem {e.difference.tandem}): {e.difference.reason}"
                   for e in entries if e.difference is not None]
    if differences:
        return "; ".join(dict.fromkeys(differences))
    codes = sorted({str(e.expect_vllm) for e in entries if e.expect_vllm != "2xx"})
    return f"{SAME} ({', '.join(codes)})" if codes else SAME


def render(entries: list[Entry]) -> str:
    """The markdown table: features in corpus order, each with its endpoints and entry ids."""
    features: dict[str, list[Entry]] = {}
    for entry in entries:
        features.setdefault(entry.feature, []).append(entry)
    lines = ["| Feature | Endpoint | Corpus entries | tandem |", "|---|---|---|---|"]
    for feature, group in features.items():
        endpoints = ", ".join(dict.fromkeys(f"`{e.method} {e.path}`" for e in group))
        ids = ", ".join(f"`{e.id}`" for e in group)
        lines.append(f"| {_cell(feature)} | {endpoints} | {ids} | {_cell(_status(group))} |")
    return "\n".join(lines) + "\n"


def spliced(doc_text: str, table: str) -> str:
    """The document's text with the table between the markers replaced."""
    try:
        head, rest = doc_text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
    except ValueError:
        raise ValueError(f"docs/api.md needs the markers {BEGIN} and {END}") from None
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    new = spliced(text, render(load_corpus(CORPUS_DIR)))
    if "--check" in argv:
        if new != text:
            print("docs/api.md's compatibility table is stale: run python -m tests.support.compat_table")
            return 1
        return 0
    if new != text:
        DOC.write_text(new)
        print("docs/api.md: compatibility table updated")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
