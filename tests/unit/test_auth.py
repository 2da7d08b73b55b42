"""API keys at the edge (router/auth.py + the edge's authenticate hook), with a fake backend."""

from __future__ import annotations

import logging

import pytest

from cluster.config import ClusterConfig
from router.auth import ApiKeyAuth
from tests.support.fakes import FakeBackend
from tests.support.openai_helpers import MODEL, assert_openai_error, make_client

ACME_KEY = "sk-acme-0123456789"
NIGHTLY_KEY = "sk-nightly-0123456789"
BODY = {"model": MODEL, "prompt": "hello", "max_tokens": 3}


def config(tmp_path, monkeypatch, auth=None):
    monkeypatch.setenv("TANDEM_TEST_NIGHTLY_KEY", NIGHTLY_KEY)
    key_file = tmp_path / "acme.key"
    key_file.write_text(ACME_KEY + "\n")
    default_auth = {
        "tenants": {"acme": {"tier": "interactive", "allowed_tiers": ["batch"]}, "nightly": {"tier": "batch"}},
        "keys": [{"tenant": "acme", "file": str(key_file)}, {"tenant": "nightly", "env": "TANDEM_TEST_NIGHTLY_KEY"}],
    }
    return ClusterConfig.model_validate({
        "model": {"path": str(tmp_path)},
        "tiers": {"interactive": {}, "batch": {}},
        "auth": default_auth if auth is None else auth,
    })


@pytest.fixture
def client(tmp_path, monkeypatch):
    backend = FakeBackend()
    auth = ApiKeyAuth.from_config(config(tmp_path, monkeypatch))
    return make_client(backend, authenticate=auth.caller)[0], backend


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer "}])
def test_missing_key_is_401_in_openai_shape(client, headers):
    c, backend = client
    r = c.post("/v1/completions", json=BODY, headers=headers)
    assert_openai_error(r, 401, code="invalid_api_key", contains="didn't provide an API key")
    assert r.headers["WWW-Authenticate"] == "Bearer"
    assert backend.requests == []


def test_wrong_key_is_401_and_never_echoed(client, caplog):
    c, backend = client
    wrong = "sk-acme-0123456788"
    with caplog.at_level(logging.DEBUG):
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                   headers=bearer(wrong))
        models = c.get("/v1/models", headers=bearer(wrong))
    assert_openai_error(r, 401, code="invalid_api_key", contains="Incorrect API key")
    assert_openai_error(models, 401)
    assert wrong not in r.text and wrong not in caplog.text and ACME_KEY not in caplog.text
    assert backend.requests == []


def test_auth_comes_before_body_validation(client):
    c, _ = client
    assert c.post("/v1/completions", content=b"{not json", headers={"Content-Type": "application/json"}).status_code == 401


def test_keys_map_to_their_tenants_tier(client):
    c, backend = client
    assert c.post("/v1/completions", json=BODY, headers=bearer(ACME_KEY)).status_code == 200
    assert c.post("/v1/completions", json=BODY, headers=bearer(NIGHTLY_KEY)).status_code == 200
    assert [r.tier for r in backend.requests] == ["interactive", "batch"]
    assert c.get("/v1/models", headers=bearer(ACME_KEY)).status_code == 200
    assert c.get("/health").status_code == 200  # probes need no key


def test_allowed_key_may_choose_a_tier_per_request(client):
    c, backend = client
    r = c.post("/v1/completions", json=BODY, headers={**bearer(ACME_KEY), "X-Tandem-Tier": "batch"})
    assert r.status_code == 200 and backend.requests[-1].tier == "batch"


def test_tier_not_allowed_is_403_and_unknown_tier_400(client):
    c, backend = client
    r = c.post("/v1/completions", json=BODY, headers={**bearer(NIGHTLY_KEY), "X-Tandem-Tier": "interactive"})
    assert_openai_error(r, 403, code="tier_not_allowed", contains="batch")
    r = c.post("/v1/completions", json=BODY, headers={**bearer(ACME_KEY), "X-Tandem-Tier": "gold"})
    assert_openai_error(r, 400, code="invalid_tier", contains="interactive, batch")
    assert backend.requests == []


def test_no_keys_runs_open_and_says_so(tmp_path, monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="router.auth"):
        auth = ApiKeyAuth.from_config(config(tmp_path, monkeypatch, auth={}))
    assert auth.open and "OPEN" in caplog.text
    backend = FakeBackend()
    c, _ = make_client(backend, authenticate=auth.caller)
    assert c.post("/v1/completions", json=BODY).status_code == 200
    assert c.post("/v1/completions", json=BODY, headers={"X-Tandem-Tier": "batch"}).status_code == 200
    assert [r.tier for r in backend.requests] == ["interactive", "batch"]


def test_key_sources_fail_early_with_the_source_named(tmp_path, monkeypatch):
    monkeypatch.delenv("TANDEM_TEST_MISSING", raising=False)
    cfg = config(tmp_path, monkeypatch, auth={"tenants": {"a": {"tier": "batch"}},
                                              "keys": [{"tenant": "a", "env": "TANDEM_TEST_MISSING"}]})
    with pytest.raises(ValueError, match="TANDEM_TEST_MISSING is not set"):
        ApiKeyAuth.from_config(cfg)


@pytest.mark.parametrize("auth, match", [
    ({"tenants": {"a": {"tier": "gold"}}}, "unknown tier 'gold'"),
    ({"tenants": {"a": {"tier": "batch"}}, "keys": [{"tenant": "b", "value": "sk-12345678"}]}, "unknown tenant 'b'"),
    ({"tenants": {"a": {"tier": "batch"}}, "keys": [{"tenant": "a", "value": "sk-12345678", "env": "X"}]},
     "exactly one of env, file, value"),
])
def test_auth_config_is_validated(tmp_path, monkeypatch, auth, match):
    with pytest.raises(ValueError, match=match):
        config(tmp_path, monkeypatch, auth=auth)


def test_plaintext_key_is_masked_when_the_config_is_printed(tmp_path, monkeypatch):
    cfg = config(tmp_path, monkeypatch, auth={"tenants": {"a": {"tier": "batch"}},
                                              "keys": [{"tenant": "a", "value": "sk-very-secret"}]})
    assert "sk-very-secret" not in cfg.model_dump_json() and "sk-very-secret" not in repr(cfg)


def test_plaintext_key_works_but_warns(tmp_path, monkeypatch, caplog):
    cfg = config(tmp_path, monkeypatch, auth={"tenants": {"a": {"tier": "batch"}},
                                              "keys": [{"tenant": "a", "value": "sk-very-secret"}]})
    with caplog.at_level(logging.WARNING, logger="router.auth"):
        auth = ApiKeyAuth.from_config(cfg)
    assert "plaintext" in caplog.text and "sk-very-secret" not in caplog.text
    assert auth.tier_of({"authorization": "Bearer sk-very-secret"}) == "batch"
