"""docs/configuration.md is what cluster/config/docs.py renders from ClusterConfig, and every
config field has a description to render (issue 30)."""

from __future__ import annotations

from cluster.config import docs


def test_committed_reference_is_current():
    assert docs.DOC_FILE.read_text() == docs.render(), f"docs/configuration.md is stale: run `{docs.REGENERATE}`"


def test_every_field_is_described():
    assert docs.missing_descriptions() == [], "give these fields a Field(description=...) in cluster/config/"


def test_the_reference_names_every_section_and_its_keys():
    text = docs.render()
    for heading in ("## `tiers.<tier>.prefill`, `tiers.<tier>.decode`", "## `auth.tenants.<tenant>`",
                    "## `auth.keys[]`", "## `routing.index.redis_tls`"):
        assert heading in text
    assert "| `kv_cache_memory_bytes` | size | null (≥ 16M) | `\"256M\"` |" in text.replace("\\|", "|")
    assert "| `tier` | str | required |" in text


def test_check_notices_a_stale_file(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "configuration.md"
    stale.write_text(docs.render().replace("Time to first token.", "Time to the first token."))
    monkeypatch.setattr(docs, "DOC_FILE", stale)
    assert docs.main(["--check"]) == 1
    assert docs.REGENERATE in capsys.readouterr().err
    assert docs.main([]) == 0 and docs.main(["--check"]) == 0
