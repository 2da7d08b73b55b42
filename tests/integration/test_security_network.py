"""Nothing of the test cluster listens beyond loopback, and Ray refuses a driver without its
token (issue 16). Read from the OS: every listening TCP socket of every process of the Ray
session (GCS, raylets, agents, Serve's proxy, controller and replicas, the vLLM EngineCores
they start) and of this driver, through psutil."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from tests.support.integration_cluster import GATEWAY_PORT, METRICS_PORTS, RAY_PORT, RAY_TOKEN


ENGINE_POOLS = {"interactive-prefill": 2, "interactive-decode": 1, "batch-prefill": 1, "batch-decode": 1}


def _is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    mapped = getattr(addr, "ipv4_mapped", None)  # gRPC listens on ::ffff:127.0.0.1
    return addr.is_loopback or (mapped is not None and mapped.is_loopback)


def _session_processes() -> list[psutil.Process]:
    """The Ray session's processes (all name its session folder, or descend from one that
    does: workers, replicas, EngineCores) and this driver."""
    import ray

    session = Path(ray._private.worker.global_worker.node.get_session_dir_path()).name
    roots = [p for p in psutil.process_iter(["cmdline"]) if session in " ".join(p.info["cmdline"] or [])]
    found = {p.pid: p for p in roots}
    for root in roots:
        try:
            found.update({c.pid: c for c in root.children(recursive=True)})
        except psutil.NoSuchProcess:
            pass
    found[os.getpid()] = psutil.Process()
    return list(found.values())


def _listening(procs: list[psutil.Process]) -> list[tuple[str, int, str]]:
    """(ip, port, process) of every listening TCP socket of these processes."""
    out = []
    for proc in procs:
        try:
            conns, name = proc.net_connections(kind="tcp"), " ".join(proc.cmdline())[:80]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out += [(c.laddr.ip, c.laddr.port, name) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def _engine_ports() -> dict[str, set[int]]:
    """Each engine's NIXL side-channel and KV-event (publisher, replay) ports, from the replicas."""
    from ray import serve

    ports: dict[str, set[int]] = {}
    for deployment, replicas in ENGINE_POOLS.items():
        handle = serve.get_deployment_handle(deployment, app_name="tandem")
        seen: dict[str, dict] = {}
        for _ in range(100):
            info = handle.describe.remote().result()
            seen[info["worker_id"]] = info
            if len(seen) >= replicas:
                break
        assert len(seen) >= replicas, (deployment, sorted(seen))
        for worker, info in seen.items():
            assert len(info["kv_events"]) == 2, info  # every engine publishes KV events here
            for endpoint in info["kv_events"]:
                assert endpoint.startswith("tcp://127.0.0.1:"), (worker, endpoint)
            ports[worker] = {info["nixl_port"], *(int(e.rsplit(":", 1)[1]) for e in info["kv_events"])}
    return ports


def test_no_engine_or_ray_socket_listens_beyond_loopback(cluster):
    procs = _session_processes()
    sockets = _listening(procs)
    exposed = [s for s in sockets if not _is_loopback(s[0])]
    print(f"{len(procs)} processes, {len(sockets)} listening sockets, {len(exposed)} beyond loopback")
    assert exposed == [], exposed
    # Not vacuous: the sockets that matter are among those read, on loopback.
    listening_ports = {port for _ip, port, _name in sockets}
    ray_and_gateway = {RAY_PORT, GATEWAY_PORT, *METRICS_PORTS.values()}
    assert ray_and_gateway <= listening_ports, ray_and_gateway - listening_ports
    engines = _engine_ports()
    assert len(engines) == sum(ENGINE_POOLS.values())
    for worker, ports in engines.items():
        assert ports <= listening_ports, (worker, ports - listening_ports)


DRIVER = """
import ray
ray.init(address="127.0.0.1:{port}", logging_level="error")
print("nodes:", len(ray.nodes()))
"""


def _driver(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """A fresh Ray driver process connecting to the test cluster, with only the auth settings
    given (HOME elsewhere: no ~/.ray/auth_token either)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return subprocess.run([sys.executable, "-c", DRIVER.format(port=RAY_PORT)],
                          env={**base, "HOME": str(tmp_path), **env},
                          capture_output=True, text=True, timeout=180)


def test_ray_refuses_a_driver_without_the_token(cluster, tmp_path):
    envs = ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(RAY_TOKEN)},
            {"RAY_AUTH_MODE": "disabled"},  # sends no token at all
            {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64})  # a wrong one
    with ThreadPoolExecutor(len(envs)) as pool:  # three drivers at once: each is mostly `import ray`
        with_token, *refusals = pool.map(lambda env: _driver(tmp_path, **env), envs)
    assert with_token.returncode == 0 and "nodes: 2" in with_token.stdout, with_token.stderr[-2000:]

    for env, refused in zip(envs[1:], refusals):
        assert refused.returncode != 0 and "nodes:" not in refused.stdout, (env, refused.stdout)
        print(env, "->", refused.stderr.strip().splitlines()[-1][:200])
