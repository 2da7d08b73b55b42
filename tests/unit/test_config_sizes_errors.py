"""Sizes as vLLM's command line reads them ("256M", "4G" binary; "4g", "8k" decimal) wherever
bytes or token counts are configured, and config errors as one message naming the file and the
field (`tandem run` / `check-config`: no traceback)."""

from __future__ import annotations

import argparse
import json

import pytest
from pydantic import ValidationError

from cluster import cli
from cluster.config import ClusterConfig, ConfigError, parse_size

# What vLLM accepts (human_readable_int), and what it refuses: "4GiB" or "512MB" are not sizes to it.
VLLM_SIZES = ["4G", "4g", "256M", "256m", "512K", "1.5k", "25.6m", "2T", "1024", " 64M ", "0"]
NOT_VLLM_SIZES = ["512MiB", "4GiB", "512MB", "1.5G", "4 G", "4GiX", "G", ""]


@pytest.mark.parametrize("text, size", [
    ("4G", 4 << 30), ("4g", 4 * 10**9), ("256M", 256 << 20), ("1.5k", 1500), ("1024", 1024), (4096, 4096),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", VLLM_SIZES)
def test_sizes_parse_as_vllm_parses_them(text):
    from vllm.utils.argparse_utils import human_readable_int

    assert parse_size(text) == human_readable_int(text)


@pytest.mark.parametrize("text", NOT_VLLM_SIZES)
def test_what_vllm_refuses_is_refused(text):
    from vllm.utils.argparse_utils import human_readable_int

    with pytest.raises((ValueError, argparse.ArgumentTypeError)):
        human_readable_int(text)
    with pytest.raises(ValueError):
        parse_size(text)


def test_a_binary_unit_with_decimals_suggests_the_decimal_one():
    with pytest.raises(ValueError, match="did you mean '1.5g'"):
        parse_size("1.5G")


def test_sizes_are_accepted_wherever_bytes_are_configured():
    cfg = ClusterConfig.model_validate({
        "model": {"path": "/m"},
        "gateway": {"max_body_bytes": "8M"},
        "tiers": {"interactive": {"prefill": {"engine": {"kv_cache_memory_bytes": "4G"}},
                                  "decode": {"engine": {"kv_cache_memory_bytes": 268435456}}}},
    })
    assert cfg.tiers["interactive"].prefill.engine.kv_cache_memory_bytes == 4 << 30
    assert cfg.tiers["interactive"].decode.engine.kv_cache_memory_bytes == 256 << 20
    assert cfg.gateway.max_body_bytes == 8 << 20
    # Dumped as plain bytes: what the engines and the Serve config receive.
    assert json.loads(cfg.model_dump_json())["gateway"]["max_body_bytes"] == 8 << 20


def test_size_floor_still_applies_after_parsing():
    with pytest.raises(ValidationError, match="kv_cache_memory_bytes"):
        ClusterConfig.model_validate(
            {"model": {"path": "/m"}, "tiers": {"interactive": {"prefill": {"engine": {"kv_cache_memory_bytes": "1M"}}}}})


def _write(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_a_typo_is_one_message_with_file_and_field(tmp_path):
    path = _write(tmp_path, "model: {path: m}\nkv_transfer: {buffer_devise: cpu}\n")
    with pytest.raises(ConfigError) as info:
        ClusterConfig.load_checked(path)
    assert str(info.value) == f"{path}: kv_transfer.buffer_devise: unknown field (a typo?)"


def test_a_bad_size_names_the_field(tmp_path):
    path = _write(tmp_path, "model: {path: m}\ntiers: {interactive: {decode: {engine: {kv_cache_memory_bytes: 4GiX}}}}\n")
    with pytest.raises(ConfigError) as info:
        ClusterConfig.load_checked(path)
    assert str(info.value).startswith(
        f"{path}: tiers.interactive.decode.engine.kv_cache_memory_bytes: '4GiX' is not a size as vLLM writes it")


def test_several_problems_in_one_message(tmp_path):
    path = _write(tmp_path, "model: {path: m, dtyp: float32}\ngateway: {port: 0}\n")
    with pytest.raises(ConfigError) as info:
        ClusterConfig.load_checked(path)
    text = str(info.value)
    assert text.startswith(f"{path}: invalid config (2 problems):")
    assert "model.dtyp: unknown field" in text and "gateway.port: Input should be greater than or equal to 1" in text


def test_a_cross_field_check_keeps_its_own_field_names(tmp_path):
    path = _write(tmp_path, "model: {path: m}\ndefault_tier: nope\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: default_tier: 'nope' is not one of the tiers"):
        ClusterConfig.load_checked(path)


@pytest.mark.parametrize("text, expected", [
    ("model: [\n", "malformed YAML (line 2, column 1)"),
    ("model:\n  path: m\n    name: x\n", "malformed YAML (line 3, column 9)"),
    ("- a\n- b\n", "the config must be a mapping"),
])
def test_malformed_yaml_is_one_message(tmp_path, text, expected):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"c\.yaml: " + expected.replace("(", r"\(").replace(")", r"\)")):
        ClusterConfig.load(path)


def test_a_missing_file_is_one_message(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml: cannot read the config: No such file"):
        ClusterConfig.load(tmp_path / "nope.yaml")


@pytest.mark.parametrize("command", ["run", "check-config"])
def test_cli_prints_the_message_without_traceback(tmp_path, capsys, command):
    path = _write(tmp_path, "model: {path: m}\nkv_transfer: {buffer_devise: cpu}\n")
    argv = ["run", "--config", str(path)] if command == "run" else ["check-config", str(path)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"{path}: kv_transfer.buffer_devise: unknown field (a typo?)\n"


def test_cli_malformed_yaml(tmp_path, capsys):
    path = _write(tmp_path, "model: [\n")
    assert cli.main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "malformed YAML" in err and "Traceback" not in err


def test_run_overrides_model_and_port(tmp_path, monkeypatch):
    folder = tmp_path / "mymodel"
    folder.mkdir()
    monkeypatch.chdir(tmp_path)
    # A local folder resolves against the current directory, not the YAML's; its own name.
    cfg = ClusterConfig.load(cli.DEFAULT_CONFIG, cli.run_overrides("mymodel", 9001))
    assert cfg.model.path == folder.resolve() and cfg.model.served_name == "mymodel"
    assert cfg.gateway.port == 9001
    hub = ClusterConfig.load(cli.DEFAULT_CONFIG, cli.run_overrides("HuggingFaceTB/SmolLM2-135M-Instruct", None))
    assert hub.model.hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert hub.model.served_name == "HuggingFaceTB/SmolLM2-135M-Instruct" and hub.gateway.port == 8000
    assert cli.run_overrides(None, None) == {}


def test_run_refuses_a_bad_port(capsys):
    assert cli.main(["run", "--port", "70000"]) == 2
    assert "gateway.port: Input should be less than or equal to 65535" in capsys.readouterr().err


def test_run_overrides_host():
    cfg = ClusterConfig.load(cli.DEFAULT_CONFIG, cli.run_overrides(None, None, "0.0.0.0"))
    assert (cfg.gateway.host, cfg.gateway.port) == ("0.0.0.0", 8000)
