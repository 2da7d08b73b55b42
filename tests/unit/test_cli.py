"""The `tandem` CLI's cheap paths (no Ray; check-config imports vLLM for its parser)."""

from __future__ import annotations

import json
from types import SimpleNamespace

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
                                   "ready_wait_s": 120.0, "max_ready_waiters": 256,
                                   "decode_first_token_timeout_s": None, "allowed_hosts": None}


def test_run_refuses_a_missing_model_folder(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("model: {path: nowhere}\n")
    assert cli.main(["run", "--config", str(config)]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_run_refuses_an_engine_argument_vllm_does_not_know_before_starting_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # where `tandem run` would write its state; nothing may appear
    config = tmp_path / "c.yaml"
    config.write_text("model: {path: nowhere}\ntiers: {interactive: {decode: {engine: {max_num_seq: 8}}}}\n")
    assert cli.main(["run", "--config", str(config)]) == 2
    assert "did you mean max_num_seqs" in capsys.readouterr().err
    assert not (tmp_path / ".tandem").exists()


def test_stop_without_a_running_cluster_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["stop"]) == 0
    assert "no running cluster" in capsys.readouterr().out


def test_unknown_command_exits_with_usage():
    with pytest.raises(SystemExit):
        cli.main(["frobnicate"])


def test_version_names_tandem_vllm_and_ray(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("tandem ") and "vllm " in out and "ray " in out


def test_logs_prints_the_newest_run_log(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["logs"]) == 1
    assert "no run log" in capsys.readouterr().err
    logs = tmp_path / ".tandem" / "logs"
    logs.mkdir(parents=True)
    for name in ("run-20261203-223025.log", "run-20261204-090501.log"):
        (logs / name).write_text("")
    assert cli.main(["logs"]) == 0
    assert capsys.readouterr().out.strip() == ".tandem/logs/run-20261204-090501.log"


def test_the_banner_follows_the_config(tmp_path):
    from cluster.config import ClusterConfig

    cfg = ClusterConfig.load_checked(cli.DEFAULT_CONFIG, {"gateway": {"host": "0.0.0.0"}})
    cluster = SimpleNamespace(url="http://0.0.0.0:8000", ray_token=tmp_path / "token")
    banner = cli.banner(cfg, cluster, tmp_path / "run.log")
    assert "tandem is serving SmolLM2-135M-Instruct at http://0.0.0.0:8000" in banner
    assert str(tmp_path / "run.log") in banner and f"RAY_AUTH_TOKEN_PATH={tmp_path / 'token'}" in banner
    assert "Warning: no API keys configured" in banner


def test_lora_adapter_writes_a_peft_adapter_vllm_accepts_for_the_model(tmp_path, capsys, tiny_model_dir):
    from vllm.lora.peft_helper import PEFTHelper

    dest = tmp_path / "demo"
    assert cli.main(["lora-adapter", str(dest), "--model", str(tiny_model_dir), "--seed", "3"]) == 0
    assert capsys.readouterr().out.strip() == str(dest)
    helper = PEFTHelper.from_local_dir(str(dest), max_position_embeddings=None)  # vLLM's own reader
    assert helper.r == 8 and set(helper.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj"}


def test_lora_adapter_without_a_model_says_what_to_run(tmp_path, capsys):
    assert cli.main(["lora-adapter", str(tmp_path / "demo"), "--model", str(tmp_path / "none")]) == 2
    assert "tandem prepare-model" in capsys.readouterr().err
