"""The `tandem` CLI's cheap paths (no Ray; check-config imports vLLM for its parser)."""

from __future__ import annotations

import json

import pytest

from cluster import cli


def test_check_config_prints_the_resolved_config(capsys):
    assert cli.main(["check-config", str(cli.DEFAULT_CONFIG)]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["model"]["name"] == "SmolLM2-135M-Instruct"
    assert resolved["gateway"] == {"host": "127.0.0.1", "port": 8000, "ingress": "direct",
                                   "decode_streams": "per_step", "replicas": 1,
                                   "max_body_bytes": 4 << 20,
                                   "body_read_timeout_s": 10.0, "health_interval_s": 1.0,
                                   "decode_first_token_timeout_s": 120.0, "allowed_hosts": None}


def test_run_refuses_a_missing_model_folder(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("model: {path: nowhere}\n")
    assert cli.main(["run", "--config", str(config)]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_stop_without_a_running_cluster_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["stop"]) == 0
    assert "no running cluster" in capsys.readouterr().out


def test_unknown_command_exits_with_usage():
    with pytest.raises(SystemExit):
        cli.main(["frobnicate"])
