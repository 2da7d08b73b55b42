"""No secret in any log line, response or config dump, with everything secret configured: API
keys from a file, an env variable and plaintext, rate limits, and a Redis password from the
environment. Every logger is captured at DEBUG while requests take each path that handles a
key (accepted, wrong, forbidden tier, rate limited, failing backend)."""

from __future__ import annotations

import logging


from cluster.config import ClusterConfig
from router.auth import ApiKeyAuth
from router.ratelimit import RateLimiter
from tests.support.fakes import FakeBackend
from tests.support.openai_helpers import MODEL, make_client

FILE_KEY = "sk-file-5f2a9c0d1e7b"
ENV_KEY = "sk-env-8e1d3b7a6c45"
PLAIN_KEY = "sk-plain-0b9c8d7e6f51"
REDIS_PASSWORD = "redis-pw-3c7f0e9a2b14"
SECRETS = (FILE_KEY, ENV_KEY, PLAIN_KEY, REDIS_PASSWORD)


def test_no_secret_in_logs_responses_or_config(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TANDEM_TEST_ENV_KEY", ENV_KEY)
    monkeypatch.setenv("TANDEM_TEST_REDIS_PASSWORD", REDIS_PASSWORD)
    (tmp_path / "file.key").write_text(FILE_KEY + "\n")
    caplog.set_level(logging.DEBUG)  # the root logger: every library's records
    cfg = ClusterConfig.model_validate({
        "model": {"path": str(tmp_path)},
        "tiers": {"interactive": {}, "batch": {}},
        "auth": {
            "tenants": {"acme": {"tier": "interactive", "rate_limit": {"requests_per_minute": 3}},
                        "nightly": {"tier": "batch"}, "demo": {"tier": "interactive"}},
            "keys": [{"tenant": "acme", "file": str(tmp_path / "file.key")},
                     {"tenant": "nightly", "env": "TANDEM_TEST_ENV_KEY"},
                     {"tenant": "demo", "value": PLAIN_KEY}],
        },
        "routing": {"index": {"backend": "redis", "redis_url": "redis://127.0.0.1:1/0",
                              "redis_password_env": "TANDEM_TEST_REDIS_PASSWORD"}},
    })
    assert cfg.routing.index.resolve_redis_password() == REDIS_PASSWORD
    auth = ApiKeyAuth.from_config(cfg)
    limits = RateLimiter.from_config(cfg)
    backend = FakeBackend()
    client = make_client(backend, authenticate=auth.caller, rate_limit=limits.hook())[0]
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}

    def post(key, **headers):
        return client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}", **headers})

    statuses = [post(FILE_KEY).status_code, post(ENV_KEY).status_code, post(PLAIN_KEY).status_code]
    statuses += [post(FILE_KEY[:-1] + "x").status_code]  # wrong, one character off
    statuses += [post(ENV_KEY, **{"X-Tandem-Tier": "interactive"}).status_code]  # nightly may not
    statuses += [post(FILE_KEY).status_code for _ in range(3)]  # acme's 3 per minute run out
    backend.fail_after = 0
    statuses += [post(PLAIN_KEY).status_code]
    assert statuses == [200, 200, 200, 401, 403, 200, 200, 429, 500], statuses
    responses_text = "".join(post(k).text for k in (FILE_KEY + "z", PLAIN_KEY))

    dumps = [repr(cfg), str(cfg), cfg.model_dump_json(), str(cfg.model_dump()), repr(auth.__dict__)]
    logged = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert "API keys: 3 key(s) for 3 tenant(s)" in logged  # the capture sees the gateway's own lines
    assert "plaintext" in logged
    for secret in SECRETS:
        assert secret not in logged, f"a secret was logged: {secret[:6]}..."
        assert secret not in responses_text
        assert all(secret not in d for d in dumps), f"a secret is in a config/auth dump: {secret[:6]}..."
