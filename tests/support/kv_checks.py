"""One check shared by the CPU and GPU suites: a request's prompt KV moved over NIXL."""

from __future__ import annotations

from typing import Any, Callable

import httpx


def assert_prompt_kv_moved(url: str, body: dict[str, Any], decode_stats: Callable[[], Any]) -> None:
    """Send `body` to /v1/completions; decode must have computed none of the prompt itself:
    every prompt token arrived by KV transfer, no transfer failed. The one token decode
    computes is the prefill's first token, which it continues after (first-token reuse,
    kv_transfer/first_token.py)."""
    before = decode_stats()
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    prompt_tokens = resp.json()["usage"]["prompt_tokens"]
    after = decode_stats()
    assert after.prompt_tokens_computed - before.prompt_tokens_computed == 1
    assert after.prompt_tokens_transferred - before.prompt_tokens_transferred == prompt_tokens
    assert after.kv_bytes_transferred - before.kv_bytes_transferred > 0
    assert after.kv_failed_transfers == before.kv_failed_transfers
