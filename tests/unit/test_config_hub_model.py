"""model.path as a Hugging Face Hub id, resolved from HF_HOME by huggingface_hub's own
snapshot_download, against a cache folder laid out here (the Hub is unreachable)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import cli
from cluster.config import ClusterConfig, is_hub_id
from cluster.models.hub import ModelNotFound, hub_cache_dir, resolve_model_path, with_local_model

REPO_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
COMMIT = "a" * 40


def lay_out_cache(hf_home: Path, repo_id: str = REPO_ID, commit: str = COMMIT) -> Path:
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<commit>/...}."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "llama"}')
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def offline_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf"


@pytest.mark.parametrize("text, hub", [
    (REPO_ID, True), ("org/model.v2", True), ("m", False), ("models/m/x", False), ("../m/x", False),
    ("./m", False), ("org/..", False), ("/abs/path", False),
])
def test_hub_id_shape(text, hub):
    assert is_hub_id(text) is hub


def test_load_keeps_a_hub_id_and_resolves_folders(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(f"model: {{path: {REPO_ID}}}\n")
    cfg = ClusterConfig.load(path)
    assert cfg.model.hub_id == REPO_ID and cfg.model.served_name == REPO_ID
    # A folder of that shape beside the YAML is a folder.
    (tmp_path / REPO_ID).mkdir(parents=True)
    local = ClusterConfig.load(path)
    assert local.model.hub_id is None and local.model.path == (tmp_path / REPO_ID).resolve()


def test_offline_resolves_from_the_cache(offline_home):
    snapshot = lay_out_cache(offline_home)
    cfg = ClusterConfig.model_validate({"model": {"path": REPO_ID}})
    assert hub_cache_dir() == offline_home / "hub"
    assert resolve_model_path(cfg.model) == snapshot
    local = with_local_model(cfg)
    assert local.model.path == snapshot and local.model.hub_id is None
    assert local.model.served_name == REPO_ID  # the id stays the served name, as in vLLM


def test_offline_and_not_cached_is_a_clear_error(offline_home):
    cfg = ClusterConfig.model_validate({"model": {"path": "nobody/nothing"}})
    with pytest.raises(ModelNotFound, match=r"'nobody/nothing': not found in .*hf/hub \(HF_HUB_OFFLINE is set"):
        resolve_model_path(cfg.model)


def test_online_asks_snapshot_download_for_the_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls = []

    def download(**kwargs):
        calls.append(kwargs)
        return str(tmp_path / "snap")

    cfg = ClusterConfig.model_validate({"model": {"path": REPO_ID}})
    assert resolve_model_path(cfg.model, download) == tmp_path / "snap"
    assert calls == [{"repo_id": REPO_ID, "cache_dir": tmp_path / "hf" / "hub",
                      "local_files_only": False}]


def test_local_paths_are_left_alone():
    cfg = ClusterConfig.model_validate({"model": {"path": "/models/m", "name": "m"}})
    assert with_local_model(cfg) is cfg


def test_run_with_an_uncached_hub_id_fails_in_one_line(offline_home, capsys):
    assert cli.main(["run", "--model", "nobody/nothing"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "model.path 'nobody/nothing': not found" in err
