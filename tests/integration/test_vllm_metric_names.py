"""The vLLM metric names tandem reads (cluster/vllm_metrics.py) against a live engine's registry.

The unit test (tests/unit/test_upstream_seams.py) reads vLLM's source; this one asks the
session's plain vLLM server (tests/support/direct_vllm.py), so a sample renamed at run time
(a suffix, a label) fails here too. That server has no KV connector, so vLLM registers no NIXL
families in it: those are held by the P/D tests that read them through EngineStats
(tests/integration/test_pd_sampling.py: kv_transfers and prompt tokens transferred).
"""

from __future__ import annotations

import re

import httpx

from cluster import vllm_metrics as vm


def test_every_vllm_sample_tandem_reads_is_in_a_live_engines_registry(direct_vllm_url):
    text = httpx.get(f"{direct_vllm_url}/metrics", timeout=30).text
    live = {(m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")).get("source"))
            for m in re.finditer(r"^(vllm:\w+)(?:\{(.*)\})? ", text, re.M)}
    nixl = {name for name, path in vm.FAMILIES.items() if path == vm.NIXL_STATS}
    wanted = [s for s in vm.SAMPLES if not s[0].startswith(tuple(nixl))]
    missing = [s for s in wanted if s not in live]
    assert not missing, f"vLLM's registry lacks {missing}: update cluster/vllm_metrics.py and UPSTREAM.md"
