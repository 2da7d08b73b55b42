"""Redis password and TLS for the prefix index, against a real redis-server started here with
`--requirepass` (and a TLS port with a throwaway self-signed certificate): the right password
works, a missing or wrong one fails the build with a clear error that names the config fields
and never the password; the config plumbs env passwords and TLS files down to the client."""

from __future__ import annotations

import datetime
import ipaddress

import pytest
import redis

from cluster.config import ClusterConfig
from router.prefix_index import BlockStored, IndexUnavailable, make_index
from router.prefix_index.redis_index import RedisAuthError, RedisTLS, client_kwargs
from router.routing.build import build_kv_router
from tests.support.redis_server import RedisServer, running

PASSWORD = "s3cret-redis-password-4711"


class SecuredRedis(RedisServer):
    """RedisServer with a password and, optionally, TLS only (no plain port)."""

    def __init__(self, tls_files=None) -> None:
        super().__init__()
        self.tls_files = tls_files
        scheme = "rediss" if tls_files else "redis"
        self.url = f"{scheme}://127.0.0.1:{self.port}/0"

    def listen_args(self) -> list[str]:
        if not self.tls_files:
            return ["--requirepass", PASSWORD, "--port", str(self.port)]
        cert, key = self.tls_files
        return ["--requirepass", PASSWORD, "--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert),
                "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"]

    def client(self) -> redis.Redis:
        tls = {"ssl_ca_certs": str(self.tls_files[0])} if self.tls_files else {}
        return redis.Redis.from_url(self.url, password=PASSWORD, **tls)


@pytest.fixture
def secured():
    with running(SecuredRedis()) as server:
        yield server


def self_signed(tmp_path):
    """A certificate for 127.0.0.1 and its key (PEM files), valid for a day."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "redis.crt", tmp_path / "redis.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_the_right_password_works(secured):
    index = make_index("redis", redis_url=secured.url, redis_password=PASSWORD, prefix="p1:")
    index.apply([BlockStored("w", (1, 2))])
    assert index.match([1, 2]) == {"w": 2}


@pytest.mark.parametrize("password", [None, "wrong-password-123"])
def test_a_missing_or_wrong_password_fails_clearly(secured, password):
    with pytest.raises(RedisAuthError) as exc:
        make_index("redis", redis_url=secured.url, redis_password=password)
    message = str(exc.value)
    assert f"127.0.0.1:{secured.port}" in message and "redis_password_env" in message
    assert PASSWORD not in message and (password is None or password not in message)


def test_a_password_the_server_does_not_want_fails_clearly(redis_server):
    with pytest.raises(RedisAuthError, match="redis_password"):
        make_index("redis", redis_url=redis_server.url, redis_password="not-configured-there")


def test_a_redis_that_is_down_is_not_a_config_error():
    """Only credentials fail the build; an outage degrades routing (IndexUnavailable)."""
    server = RedisServer()  # never started: nothing listens on its port
    index = make_index("redis", redis_url=server.url, redis_password=PASSWORD)
    with pytest.raises(IndexUnavailable):
        index.match([1])


def cfg_with_index(tmp_path, **index):
    return ClusterConfig.model_validate({"model": {"path": str(tmp_path)},
                                         "routing": {"index": {"backend": "redis", **index}}})


def test_config_reads_the_password_from_the_environment(tmp_path, monkeypatch, secured):
    cfg = cfg_with_index(tmp_path, redis_url=secured.url, redis_password_env="TANDEM_TEST_REDIS_PASSWORD")
    with pytest.raises(ValueError, match="TANDEM_TEST_REDIS_PASSWORD is not set"):
        build_kv_router(cfg)
    monkeypatch.setenv("TANDEM_TEST_REDIS_PASSWORD", PASSWORD)
    router = build_kv_router(cfg)
    assert router is not None
    assert PASSWORD not in repr(cfg) and PASSWORD not in cfg.model_dump_json()


@pytest.mark.parametrize("index, message", [
    ({"redis_url": "redis://:hunter22@127.0.0.1:6379/0"}, "holds a password"),
    ({"redis_url": "redis://127.0.0.1:6379/0", "redis_password": "a", "redis_password_env": "B"}, "not both"),
    ({"redis_url": "redis://127.0.0.1:6379/0", "redis_tls": {}}, "rediss://"),
    ({"redis_url": "rediss://127.0.0.1:6379/0", "redis_tls": {"cert_file": "c.pem"}}, "go together"),
    ({"redis_url": "http://127.0.0.1:6379/0"}, "redis:// or rediss://"),
])
def test_config_refuses_unsafe_or_inconsistent_redis_settings(tmp_path, index, message):
    with pytest.raises(ValueError, match=message) as exc:
        cfg_with_index(tmp_path, **index)
    assert "hunter22" not in str(exc.value)


def test_client_kwargs_carry_tls_and_credentials(tmp_path):
    plain = client_kwargs("redis://h:6379/0", password="pw", username="tandem")
    assert plain["password"] == "pw" and plain["username"] == "tandem"
    assert not any(k.startswith("ssl") for k in plain)
    tls = client_kwargs("rediss://h:6380/0", tls=RedisTLS(tmp_path / "ca.pem", tmp_path / "c.pem", tmp_path / "k.pem"))
    assert tls["ssl_ca_certs"] == str(tmp_path / "ca.pem") and tls["ssl_certfile"] == str(tmp_path / "c.pem")
    assert tls["ssl_keyfile"] == str(tmp_path / "k.pem")
    assert tls["ssl_cert_reqs"] == "required" and tls["ssl_check_hostname"] is True
    insecure = client_kwargs("rediss://h:6380/0", tls=RedisTLS(verify=False))
    assert insecure["ssl_cert_reqs"] == "none" and insecure["ssl_check_hostname"] is False
    assert client_kwargs("rediss://h:6380/0")["ssl_cert_reqs"] == "required"  # TLS verifies by default
    with pytest.raises(ValueError, match="rediss://"):
        client_kwargs("redis://h:6379/0", tls=RedisTLS())


def test_tls_with_password_end_to_end(tmp_path, monkeypatch):
    cert, key = self_signed(tmp_path)
    server = SecuredRedis(tls_files=(cert, key))
    server.start()
    try:
        monkeypatch.setenv("TANDEM_TEST_REDIS_PASSWORD", PASSWORD)
        cfg = cfg_with_index(tmp_path, redis_url=server.url, redis_password_env="TANDEM_TEST_REDIS_PASSWORD",
                             redis_tls={"ca_file": str(cert)}, key_prefix="tls:")
        build_kv_router(cfg)  # the gateway's path: config → client, credentials checked
        index = make_index("redis", redis_url=server.url, redis_password=PASSWORD,
                           redis_tls=RedisTLS(ca_file=cert), prefix="tls:")
        index.apply([BlockStored("w", (7,))])
        assert index.match([7]) == {"w": 1}
        # Without our CA the server's certificate is not trusted: no connection, no data.
        untrusting = make_index("redis", redis_url=server.url, redis_password=PASSWORD, prefix="tls:")
        with pytest.raises(IndexUnavailable):
            untrusting.match([7])
        # A plain-text client gets nowhere on the TLS port.
        plain = make_index("redis", redis_url=server.url.replace("rediss://", "redis://"), redis_password=PASSWORD)
        with pytest.raises(IndexUnavailable):
            plain.match([7])
    finally:
        server.stop()
