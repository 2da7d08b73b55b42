"""The differential test's reference server is started like the test cluster's engines."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.direct_vllm import direct_vllm_command, direct_vllm_environment


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_command_mirrors_the_integration_engines():
    cmd = direct_vllm_command(Path("/models/tiny"), port=8791)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(cmd, "--served-model-name") == "tiny-llama"
    assert _flag(cmd, "--dtype") == "float32"
    assert _flag(cmd, "--max-model-len") == "512"
    assert _flag(cmd, "--kv-cache-memory-bytes") == str(64 << 20)
    assert _flag(cmd, "--max-num-seqs") == "8"
    assert json.loads(_flag(cmd, "--structured-outputs-config")) == {"backend": "xgrammar", "disable_any_whitespace": True}
    assert _flag(cmd, "--tool-call-parser") == "hermes"
    assert {"--enforce-eager", "--enable-auto-tool-choice"} <= set(cmd)
    assert (_flag(cmd, "--host"), _flag(cmd, "--port")) == ("127.0.0.1", "8791")
    # The cluster's LoRA adapters, as vLLM's own flags (model.lora_adapters).
    assert "--enable-lora" in cmd and (_flag(cmd, "--max-loras"), _flag(cmd, "--max-lora-rank")) == ("2", "8")
    assert [a.split("=")[0] for a in cmd[cmd.index("--lora-modules") + 1:]] == ["tiny-lora-a", "tiny-lora-b"]


def test_environment_pins_one_core_and_a_test_cache():
    env = direct_vllm_environment()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert "/.tandem/test/" in env["VLLM_CACHE_ROOT"]
