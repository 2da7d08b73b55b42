"""loadtest/bench/redeploy.py's pure parts: the two configs it deploys and its summary."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from loadtest.bench import redeploy


def test_the_redeployed_config_differs_in_one_field_and_keeps_the_model_where_it_was(tmp_path: Path) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    config = folder / "local.yaml"
    config.write_text(yaml.safe_dump({"model": {"path": "../models/m"}, "gateway": {"port": 8123}}))
    out = tmp_path / "out"
    out.mkdir()
    before, after, _ = redeploy.write_configs(config, "", out)
    old, new = yaml.safe_load(before.read_text()), yaml.safe_load(after.read_text())
    assert old["model"]["path"] == str((tmp_path / "models" / "m").resolve())
    assert new["gateway"].pop("body_read_timeout_s") == 11.0 and "body_read_timeout_s" not in old["gateway"]
    assert new == old


def test_the_summary_counts_failures_and_the_requests_sent_during_the_redeploy() -> None:
    def rec(sent_s: float, ttft_ms: float, error: str = "", status: int = 200) -> dict:
        return {"sent_s": sent_s, "status": status, "tokens": 4, "chunks": 4, "ttft_ms": ttft_ms,
                "max_gap_ms": 50.0, "error": error}

    records = [rec(1, 100), rec(12, 40_000), rec(15, 0, "503 model_loading", 503), rec(30, 120)]
    args = argparse.Namespace(config=Path("c.yaml"), clients=2, max_tokens=4)
    out = redeploy.summarize(args, records, redeploy_from=10, redeploy_to=20, rc=0, model="m")
    assert (out["requests"], out["failed"]) == (4, 1)
    assert out["errors"] == {"503 503 model_loading": 1}
    during = out["sent_during_redeploy"]
    assert (during["requests"], during["failed"]) == (2, 1)
    assert during["ttft"]["max_ms"] == 40_000 and during["ttft"]["n"] == 1
    assert out["all"]["ttft"]["n"] == 3 and out["redeploy"]["seconds"] == 10
