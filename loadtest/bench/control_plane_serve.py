"""tandem's real Serve graph with engines that cost nothing, in a process of its own: the
control-plane benchmark starts this, waits for its READY line, loads the gateway, and stops
it with SIGTERM. This process is the Ray driver, so Ray's processes (GCS, raylet, and the
raylet's workers: controller, proxy, gateway, replicas) are all its descendants, which is how
the benchmark finds and classifies them (loadtest/bench/procs.py).

    python -m loadtest.bench.control_plane_serve --config-json CONFIG.json --pace-s 0.02 --state-dir DIR

The graph is `cluster.app.build_app(cfg, engine_cls=functools.partial(FakeEngine,
knobs=FakeKnobs(token_s=PACE)))`, deployed as tests/serve/conftest.py deploys it: Ray on
127.0.0.1 with token auth (cluster/local.py's settings), Serve's proxy on the gateway's port,
no runtime_env (Ray's processes take the environment of this one: cluster/local.py's
LOCAL_RAY_ENV and --ray-env over it; a runtime_env would start every worker through Ray's
setup script).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

READY = "[control_plane] READY"


def log(line: str) -> None:
    print(line, flush=True)


def serve_graph(cfg_raw: dict, pace_s: float, ray_env: dict[str, str], state_dir: Path,
                ready_timeout_s: float) -> None:
    from cluster.local import LOCAL_RAY_ENV, _reload_ray_settings, ensure_ray_token, ray_auth_env, run_app, wait_until_ready

    # cluster/local.py's local settings (loopback, no usage stats...), then the benchmark's
    # --ray-env over them; set before Ray starts, so every Ray process inherits them.
    os.environ.update({**LOCAL_RAY_ENV, "VLLM_CACHE_ROOT": str(state_dir / "cache" / "vllm"), **ray_env})
    os.environ.update(ray_auth_env(ensure_ray_token(state_dir / "ray_auth_token")))

    import ray
    from ray import serve

    from cluster.app import build_app, proxy_location
    from cluster.config import ClusterConfig
    from cluster.engine.fake import FakeEngine, FakeKnobs
    from cluster.types import APP_NAME

    cfg = ClusterConfig.model_validate(cfg_raw)
    t0 = time.monotonic()
    # build_app imports the deployments' modules (the gateway's: vLLM's OpenAI server, seconds
    # of CPU): in a thread while Ray and Serve start, mostly waiting on their own processes.
    pool = ThreadPoolExecutor(1, thread_name_prefix="build-app")
    building = pool.submit(build_app, cfg, engine_cls=functools.partial(FakeEngine, knobs=FakeKnobs(token_s=pace_s)))
    _reload_ray_settings()
    # Ray 2.60's raylet exits when its dashboard agent starts slower than a fixed 15 s (two
    # cores busy with other work): ray.init then raises, "timed out during startup", and the
    # benchmark starts this process again (control_plane_systems.TandemGraph).
    ray.init(address="local", num_cpus=cfg.ray.num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
             _metrics_export_port=cfg.ray.metrics_export_port, logging_level="warning")
    node_ip = ray.util.get_node_ip_address()
    if node_ip != "127.0.0.1":
        raise RuntimeError(f"Ray's node address is {node_ip}, not loopback: its ports would listen on every interface")
    serve.start(proxy_location=proxy_location(cfg), http_options={"host": cfg.gateway.host, "port": cfg.gateway.port},
                logging_config={"log_level": "WARNING"})
    app = building.result()
    pool.shutdown()
    log(f"[control_plane] Ray and Serve up, app built in {time.monotonic() - t0:.1f} s; deploying")
    deadline = t0 + ready_timeout_s
    url = f"http://{cfg.gateway.host}:{cfg.gateway.port}"
    run_app(app, APP_NAME, deadline, log, t0)
    wait_until_ready(url, deadline, poll_s=0.25)
    log(f"{READY} {url} in {time.monotonic() - t0:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-json", type=Path, required=True, help="the ClusterConfig, as a JSON dict")
    parser.add_argument("--pace-s", type=float, required=True, help="FakeEngine's gap between tokens")
    parser.add_argument("--state-dir", type=Path, required=True, help="Ray's token and caches")
    parser.add_argument("--ray-env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment of every Ray process, over cluster/local.py's")
    parser.add_argument("--ready-timeout-s", type=float, default=300)
    args = parser.parse_args()
    # SIGTERM (the benchmark) unwinds as Ctrl-C does, during the start-up too: Ray goes down.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        ray_env = dict(e.split("=", 1) for e in args.ray_env)
        serve_graph(json.loads(args.config_json.read_text()), args.pace_s, ray_env, args.state_dir,
                    args.ready_timeout_s)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        import ray

        # Not serve.shutdown() first: it drains every replica gracefully (seconds) for a
        # cluster about to go; ray.shutdown() ends the processes this driver started.
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
