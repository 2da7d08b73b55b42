"""Differential test (issue 15): every corpus request (tests/integration/compat_corpus/) goes to
the tandem test cluster, through its prefill/decode path, and to one plain vLLM OpenAI server on
the same tiny float32 model. Per entry: tandem's status class is vLLM's (or the documented
difference), never a 5xx, and for answers of both: the same body shape and the same greedy text.

All entries are sent once, four requests in flight over one client; each entry's test then
judges its pair of answers. Every outcome lands in TEST_STATE/compat-differential.json.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import TEST_STATE
from tests.support.compat import Entry, Outcome, error_message, judge, load_corpus, send, vllm_problems


CORPUS = load_corpus()
RESULTS = TEST_STATE / "compat-differential.json"
IN_FLIGHT = 4


def _record(entry: Entry, tandem: Outcome, vllm: Outcome) -> dict:
    problems = vllm_problems(entry, vllm) + judge(entry, tandem, vllm)
    return {"id": entry.id, "feature": entry.feature, "path": entry.path, "passed": not problems,
            "problems": problems, "tandem_status": tandem.status, "vllm_status": vllm.status,
            "tandem_error": error_message(tandem), "vllm_error": error_message(vllm),
            "tandem_s": round(tandem.elapsed_s, 3), "vllm_s": round(vllm.elapsed_s, 3)}


@pytest.fixture(scope="module")
def outcomes(base_url, direct_vllm_url) -> dict[str, dict]:
    targets = [(entry, url) for entry in CORPUS for url in (base_url, direct_vllm_url)]
    t0 = time.monotonic()
    with httpx.Client() as client, ThreadPoolExecutor(IN_FLIGHT) as pool:
        answers = list(pool.map(lambda target: send(client, target[1], target[0]), targets))
    elapsed = time.monotonic() - t0
    records = {entry.id: _record(entry, answers[2 * i], answers[2 * i + 1]) for i, entry in enumerate(CORPUS)}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"elapsed_s": round(elapsed, 1), "entries": list(records.values())}, indent=1))
    return records


@pytest.mark.parametrize("entry", CORPUS, ids=[e.id for e in CORPUS])
def test_same_as_vllm(entry: Entry, outcomes):
    record = outcomes[entry.id]
    assert record["passed"], f"{entry.id} ({entry.feature}):\n" + "\n".join(record["problems"])
