"""The chart's `cluster:` schema is generated from ClusterConfig (deploy/helm/gen_schema.py):
it is current, and a typo or a wrong value under `cluster:` fails `helm lint`, naming it."""

from __future__ import annotations

import json

import pytest

from deploy.helm import gen_schema
from tests.conftest import REPO

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra")

CHART = REPO / "deploy" / "helm" / "tandem"


def lint_errors(values: dict) -> list[str]:
    report = helm.lint(CHART, values, strict=True, kube_version="v1.30.0")
    return report["errors"]


def test_committed_schema_is_current():
    assert gen_schema.main(["--check"]) == 0, "run `python -m deploy.helm.gen_schema`"


def test_check_notices_a_stale_file(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "values.schema.json"
    schema = json.loads(gen_schema.SCHEMA_FILE.read_text())
    del schema["definitions"]["EngineConfig"]["properties"]["kv_cache_memory_bytes"]
    stale.write_text(json.dumps(schema, indent=2) + "\n")
    monkeypatch.setattr(gen_schema, "SCHEMA_FILE", stale)
    assert gen_schema.main(["--check"]) == 1
    assert "not current" in capsys.readouterr().err
    assert gen_schema.main([]) == 0 and gen_schema.main(["--check"]) == 0


def test_every_config_field_is_in_the_schema():
    from cluster.config import EngineConfig, KVTransferConfig
    from cluster.engine.engine_args import vllm_arg_names

    definitions = json.loads(gen_schema.SCHEMA_FILE.read_text())["definitions"]
    # The declared keys, and every other vLLM engine argument by its name.
    assert set(definitions["EngineConfig"]["properties"]) == set(EngineConfig.model_fields) | vllm_arg_names()
    assert set(definitions["KVTransferConfig"]["properties"]) == set(KVTransferConfig.model_fields)
    assert definitions["EngineConfig"]["additionalProperties"] is False


@pytest.mark.parametrize("values, named", [
    ({"cluster": {"tiers": {"interactive": {"prefill": {"engine": {"kv_cache_byte": 1}}}}}},
     "at '/cluster/tiers/interactive/prefill/engine': additional properties 'kv_cache_byte' not allowed"),
    ({"cluster": {"tiers": {"interactive": {"decode": {"engine": {"max_num_seq": 8}}}}}},
     "additional properties 'max_num_seq' not allowed"),
    ({"cluster": {"tiers": {"interactive": {"decode": {"engine": {"disable_cascade_attn": "yes"}}}}}},
     "at '/cluster/tiers/interactive/decode/engine/disable_cascade_attn'"),
    ({"cluster": {"kv_transfer": {"buffer_devise": "cpu"}}}, "additional properties 'buffer_devise' not allowed"),
    ({"cluster": {"kv_transfer": {"buffer_device": "gpu"}}}, "at '/cluster/kv_transfer/buffer_device'"),
    ({"cluster": {"routing": {"picker": "best"}}}, "at '/cluster/routing/picker'"),
    ({"cluster": {"tiers": {"interactive": {"decode": {"engine": {"kv_cache_memory_bytes": "4 gigs"}}}}}},
     "at '/cluster/tiers/interactive/decode/engine/kv_cache_memory_bytes'"),
    ({"cluster": {"gateway": {"port": 70000}}}, "at '/cluster/gateway/port'"),
])
def test_a_mistake_under_cluster_fails_lint_naming_it(values, named):
    errors = lint_errors(values)
    assert errors and any(named in e for e in errors), errors


def test_hub_ids_and_sizes_lint_clean():
    values = {"cluster": {"model": {"path": "HuggingFaceTB/SmolLM2-135M-Instruct", "name": "smol"},
                          "tiers": {"interactive": {"prefill": {"engine": {"kv_cache_memory_bytes": "4G"}},
                                                    "decode": {"engine": {"kv_cache_memory_bytes": "512M", "disable_cascade_attn": True}}}}}}
    assert lint_errors(values) == []
