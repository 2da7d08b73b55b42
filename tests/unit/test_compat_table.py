"""docs/api.md's OpenAI compatibility table is what tests/support/compat_table.py renders from
the differential test's corpus, and the corpus itself is well-formed (issue 15)."""

from __future__ import annotations

import pytest

from tests.support import compat_table
from tests.support.compat import Difference, Entry, load_corpus


def test_docs_table_is_rendered_from_the_corpus():
    text = compat_table.DOC.read_text()
    expected = compat_table.spliced(text, compat_table.render(load_corpus()))
    assert text == expected, "docs/api.md's compatibility table is stale: run python -m tests.support.compat_table"


def test_corpus_covers_at_least_60_requests_with_unique_ids():
    corpus = load_corpus()
    assert len(corpus) >= 60
    assert len({e.id for e in corpus}) == len(corpus)
    assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize", "/detokenize",
            "/version", "/v1/models", "/docs", "/openapi.json"} <= {e.path for e in corpus}


def test_text_compared_requests_are_deterministic():
    """Where text is compared the request must be greedy (or top_k 1, for n > 1)."""
    for e in load_corpus():
        body = e.body if isinstance(e.body, dict) else {}
        if e.compare == "text" and "model" in body and e.expect_vllm == "2xx" and e.method == "POST" \
                and e.path.startswith("/v1/"):
            assert body.get("temperature") == 0 or body.get("top_k") == 1, e.id


def _entry(**kw) -> Entry:
    return Entry(id="x", feature=kw.pop("feature", "f"), method="POST", path="/v1/chat/completions", **kw)


def test_a_documented_difference_replaces_same_as_vllm():
    same = _entry(body={})
    differs = _entry(body={}, difference=Difference(tandem="2xx", reason="tandem accepts it"))
    error = _entry(body={}, feature="g", expect_vllm=400)
    table = compat_table.render([same, differs, error])
    assert "| f | `POST /v1/chat/completions` | `x`, `x` | differs (tandem 2xx): tandem accepts it |" in table
    assert "| g | `POST /v1/chat/completions` | `x` | same as vLLM (400) |" in table


def test_splice_needs_the_markers():
    with pytest.raises(ValueError):
        compat_table.spliced("no markers", "table")
    text = f"a\n{compat_table.BEGIN}\nold\n{compat_table.END}\nb"
    assert compat_table.spliced(text, "new\n") == f"a\n{compat_table.BEGIN}\nnew\n{compat_table.END}\nb"
