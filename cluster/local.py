"""Start and stop a tandem cluster on Ray: a local one (laptop, CI) or an existing one.

`LocalCluster(cfg).start()` returns once /health says both pools serve, printing progress
while engines load; `stop()` tears the Serve app down (engines shut down in their replicas)
and then Ray. The integration tests use exactly this, so what they prove is what users run.
With `log_file` (`tandem run`), Ray's forwarded worker output and Serve's and vLLM's loggers go
to that file and the console keeps progress and what a person must act on (cluster/console.py);
without it (tests, benchmarks) Ray prints everything, as it does by default.

A cluster on this machine (a new one, or `ray.address` on loopback) keeps every Ray port on
127.0.0.1 and runs with Ray's token auth: the token is in `.tandem/ray_auth_token` (0600),
made on first use; other drivers (`ray status`, `serve status`) find it through
RAY_AUTH_TOKEN_PATH. For a remote cluster Ray's own settings apply (RAY_AUTH_MODE,
RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH in the environment).
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import time
import urllib.request
from pathlib import Path
from typing import Callable, Optional

from cluster.config import ClusterConfig
from cluster.console import RunLog, actionable, describe_deployments

LOOPBACK = "127.0.0.1"
# Ray's auth token of a local cluster (`tandem run`, benchmarks): the file Ray reads through
# RAY_AUTH_TOKEN_PATH. `ray status` and other drivers of that cluster need the same variable.
DEFAULT_RAY_TOKEN = Path(".tandem") / "ray_auth_token"

# Local-only Ray settings, measured on these machines (../shared/DESIGN.md):
LOCAL_RAY_ENV = {
    # Keep the 127.0.0.1 node address: with it every Ray port (GCS, raylets, workers, agents,
    # metrics) listens on loopback only. Ray rewrites 127.0.0.1 to the machine's address when
    # this is on (Linux's default), and then listens on all interfaces.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_worker_niceness": "0",  # workers run at nice 15 otherwise
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    # Engines and Serve log every request at INFO; keep the console to progress and problems.
    "VLLM_LOGGING_LEVEL": "WARNING",
    # vLLM's own logging set-up closes Serve's replica log files (cluster/vllm_logging.py).
    "VLLM_CONFIGURE_LOGGING": "0",
}


def is_loopback_address(address: Optional[str]) -> bool:
    """Whether a Ray address ("host:port", "ray://host:port"; None: a new local cluster) is on
    this machine's loopback interface."""
    if address is None:
        return True
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name, "auto": not known to be loopback
        return False


def ensure_ray_token(path: Path) -> Path:
    """The local cluster's Ray auth token in `path`, made once (256 random bits, as
    `ray get-auth-token --generate` makes them), readable by this user only."""
    path = path.resolve()
    if not path.exists() or not path.read_text().strip():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    os.chmod(path, 0o600)  # also a file made by hand with the umask's mode
    return path


def ray_auth_env(token_path: Path) -> dict[str, str]:
    """Ray's documented token-auth settings: every Ray process and driver of the cluster
    (raylets and workers inherit them) authenticates with the token in this file."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}


def _reload_ray_settings() -> None:
    """Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER and RAY_AUTH_MODE once, when `ray` is first
    imported, and a benchmark may import it before LocalCluster sets them: without this, the
    driver would rewrite 127.0.0.1 to the machine's address (all interfaces) and connect
    without its token. Ray refreshes its config the same way when it turns auth on itself
    (ray._private.authentication.authentication_token_setup). start() then checks the node
    address Ray ended up with."""
    from ray._private import ray_constants
    from ray._raylet import AuthenticationTokenLoader, Config

    ray_constants.ENABLE_RAY_CLUSTER = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1"
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


class LocalCluster:
    def __init__(self, cfg: ClusterConfig, *, cache_dir: Optional[Path] = None,
                 ray_token: Optional[Path] = None, progress: Callable[[str], None] = print,
                 log_file: Optional[Path] = None):
        self.cfg = cfg
        self.cache_dir = cache_dir or Path(".tandem/cache").resolve()
        # Ray's token file for a cluster on this machine (a new one, or ray.address on
        # loopback); a remote cluster's token comes from the environment, as Ray documents.
        self.ray_token = ray_token or DEFAULT_RAY_TOKEN
        self.progress = progress
        self.log_file = log_file
        self._run_log: Optional[RunLog] = None
        self._started_ray = False

    @property
    def url(self) -> str:
        return f"http://{self.cfg.gateway.host}:{self.cfg.gateway.port}"

    def _say(self, line: str) -> None:
        """A progress line: on the console, and in the run log so that it reads as one story."""
        self.progress(line)
        if self._run_log is not None:
            self._run_log.write([line])

    def start(self, ready_timeout_s: float = 600) -> "LocalCluster":
        t0 = time.monotonic()
        self._connect()
        from cluster.app import build_app
        from cluster.types import APP_NAME

        pools = ", ".join(
            f"{tier}: {t.prefill.replicas} prefill + {t.decode.replicas} decode" for tier, t in self.cfg.tiers.items()
        )
        self._say(f"[tandem] deploying {self.cfg.model.served_name}: gateway; {pools}")
        for tier, t in self.cfg.tiers.items():
            self._say(f"[tandem] admission, {tier}: {t.admission.summary()}")
        deadline = t0 + ready_timeout_s
        run_app(build_app(self.cfg), APP_NAME, deadline, self._say, t0)
        self._wait_ready(deadline)
        self._say(f"[tandem] ready in {time.monotonic() - t0:.0f} s at {self.url}")
        if self._started_ray and self.cfg.ray.address is None:
            self._say(f"[tandem] metrics for Prometheus: http://127.0.0.1:{self.cfg.ray.metrics_export_port}/metrics")
        return self

    def redeploy(self, timeout_s: float = 600) -> float:
        """Deploy this config onto the running cluster at `ray.address`, replacing its replicas
        while they serve (a rolling upgrade: cluster/app.py surge_percent, gateway_options), and
        leave it running; the seconds until every old replica had drained and stopped. Past the
        deadline TimeoutError, the app left to Serve (never taken down)."""
        from ray import serve

        from cluster.app import build_app
        from cluster.types import APP_NAME

        t0 = time.monotonic()
        try:
            self._connect()
            self._say(f"[tandem] redeploying {self.cfg.model.served_name} onto {self.cfg.ray.address}: new replicas "
                      "first where there is room, old ones drain their requests")
            deadline = t0 + timeout_s
            run_app(build_app(self.cfg), APP_NAME, deadline, self._say, t0, take_down_on_timeout=False)
            while True:  # the old replicas draining: Serve reports the app running before they are gone
                stopping = {name: n for name, d in serve.status().applications[APP_NAME].deployments.items()
                            if (n := d.replica_states.get("STOPPING", 0))}
                if not stopping:
                    break
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"old replicas still draining at the deadline: {stopping}")
                time.sleep(1.0)
            self._wait_ready(deadline)
            took = time.monotonic() - t0
            self._say(f"[tandem] redeployed in {took:.0f} s at {self.url}")
            return took
        finally:
            self._disconnect()

    @property
    def ray_address(self) -> Optional[str]:
        """The Ray cluster's address (GCS host:port) once connected: `tandem redeploy` reaches it there."""
        import ray

        return ray.get_runtime_context().gcs_address if ray.is_initialized() else None

    def _connect(self) -> None:
        """Ray (a new local cluster, or the one at ray.address) and Serve started, this process its driver."""
        if self.log_file is not None:
            self._run_log = RunLog(self.log_file, console=self.progress)
        address = self.cfg.ray.address
        local = is_loopback_address(address)
        env = dict(LOCAL_RAY_ENV)
        if not local:  # a remote cluster's nodes have their own addresses
            del env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
        env["VLLM_CACHE_ROOT"] = str(self.cache_dir / "vllm")
        os.environ.update(env)
        if local:
            # Not in runtime_env: Ray processes inherit it from the raylet; a path, not the token.
            os.environ.update(ray_auth_env(ensure_ray_token(self.ray_token)))

        import ray
        from ray import serve

        from cluster.app import proxy_location

        if not ray.is_initialized():
            if local:
                _reload_ray_settings()
            log_note = f"; logs: {self.log_file}" if self.log_file is not None else ""
            self._say(f"[tandem] starting Ray ({address or 'local'}){log_note}")
            context = ray.init(
                # "local": a new instance, never one Ray finds by itself (RAY_ADDRESS, or
                # /tmp/ray/ray_current_cluster, which a `ray start` elsewhere leaves behind).
                address=address or "local",
                num_cpus=self.cfg.ray.num_cpus if address is None else None,
                include_dashboard=False,
                _node_ip_address=LOOPBACK if address is None else None,
                _metrics_export_port=self.cfg.ray.metrics_export_port if address is None else None,
                runtime_env={"env_vars": env},
                logging_level="warning",
            )
            self._started_ray = True
            if self._run_log is not None:
                self._run_log.write([f"Ray's own logs (one file per process): {context.address_info.get('session_dir')}/logs"])
            node_ip = ray.util.get_node_ip_address()
            if local and not is_loopback_address(f"{node_ip}:0"):
                self.stop()
                raise RuntimeError(f"Ray's node address is {node_ip}, not loopback: its ports would listen "
                                   "on every interface")
        if self._run_log is not None:
            self._run_log.attach_to_ray()
            # Serve's driver-side INFO ("Started Serve in namespace", "Connecting to existing
            # Serve app") and vLLM's import-time warnings ("Triton is installed, but ...", which
            # build_app's import of vLLM's server prints through Python's last-resort handler:
            # vLLM 0.32 sets its handlers up only when an engine is made) into the file too.
            self._run_log.route_logger("ray.serve")
            self._run_log.route_logger("vllm")
        serve.start(
            # No proxy when the gateway serves HTTP itself; else one gateway address: a proxy per
            # node would collide on the port when several Ray nodes share a machine (the
            # two-node integration test), and k8s uses the chart.
            proxy_location=proxy_location(self.cfg),
            http_options={"host": self.cfg.gateway.host, "port": self.cfg.gateway.port},
            logging_config={"log_level": "WARNING"},
        )

    def _wait_ready(self, deadline: float) -> None:
        wait_until_ready(self.url, deadline)

    def health(self) -> dict:
        with urllib.request.urlopen(self.url + "/health", timeout=10) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        import ray
        from ray import serve

        self._say("[tandem] shutting down (engines first, then Ray)")
        try:
            serve.shutdown()
        finally:
            self._disconnect()
        self.progress("[tandem] stopped")

    def _disconnect(self) -> None:
        """This driver off Ray (ray.shutdown: a local cluster it started ends with it, a cluster at
        ray.address goes on); the run log closed."""
        import ray

        if self._started_ray:
            ray.shutdown()
        if self._run_log is not None:  # after Ray: its last forwarded lines still land in the file
            self._run_log.close()
            self._run_log = None


def run_app(app, name: str, deadline: float, progress: Callable[[str], None] = print,
            t0: Optional[float] = None, route_prefix: Optional[str] = "/", heartbeat_s: float = 30.0,
            external_scaler: bool = False, take_down_on_timeout: bool = True) -> None:
    """Deploy `app` and wait until it runs, within a deadline (monotonic). Progress: one line
    when the deployments' states change, or every `heartbeat_s` while they don't (engines load
    for minutes; a line now and then says the start is alive without filling the console), and
    a line when a deployment's status says something a person must act on (`actionable`).
    Public `serve.run` waits without a bound: one engine whose start hangs would hold it forever
    (and deleting the app does not end that wait), so this deploys without waiting (Serve's
    `_run`, what serve.run calls) and waits itself. Past the deadline the app is deleted and
    TimeoutError names the deployments that were not ready. `external_scaler`: Serve's
    external scaling API may set a pool's replica count (tests/serve scales decode down with it).
    `take_down_on_timeout` False (a redeploy): past the deadline the app stays, its old replicas
    still serving what the new ones could not take over."""
    from ray import serve
    from ray.serve.schema import ApplicationStatus

    t0 = time.monotonic() if t0 is None else t0
    serve._run(app, _blocking=False, name=name, route_prefix=route_prefix, external_scaler_enabled=external_scaler)
    last, said_at = "", 0.0
    notes: dict[str, Optional[str]] = {}
    while True:
        try:
            status = serve.status().applications.get(name)
        except Exception as exc:  # the controller busy or restarting: ask again, until the deadline
            line = f"status unavailable: {exc}"
        else:
            if status is None or not status.deployments:  # not listed yet
                line = last
            elif status.status == ApplicationStatus.RUNNING:
                return
            elif status.status == ApplicationStatus.DEPLOY_FAILED:
                raise RuntimeError(f"Deploying {name} failed: {status.message}")
            else:
                line = describe_deployments(status.deployments)
                for deployment, state in status.deployments.items():
                    note = actionable(state.message or "")
                    if note is not None and note != notes.get(deployment):
                        progress(f"[tandem] {deployment}: {note}")
                    notes[deployment] = note
        now = time.monotonic()
        if line and (line != last or now - said_at >= heartbeat_s):
            progress(f"[tandem] {now - t0:5.0f} s  {line}")
            last, said_at = line, now
        if now >= deadline and not take_down_on_timeout:
            raise TimeoutError(f"{name} was not redeployed by its deadline; its deployments then: "
                               f"{last or 'no status yet'}. Serve goes on with it; the replicas not yet "
                               "replaced keep serving.")
        if now >= deadline:
            serve.delete(name, _blocking=False)
            raise TimeoutError(f"{name} was not ready by its deadline and was taken down; its deployments "
                               f"then: {last or 'no status yet'}. Why: the replicas' own logs (the run log "
                               "`tandem logs` names, or Ray's session logs: serve/replica_*.log, worker-*.err).")
        time.sleep(0.5)


def wait_until_ready(url: str, deadline: float, poll_s: float = 1.0) -> None:
    """Poll a gateway's /health until it answers 200; past `deadline` (monotonic), raise with
    its last answer (which pool is not ready, or why nothing answered)."""
    last_error = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=10) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            last_error = exc.read().decode(errors="replace")
        except OSError as exc:
            last_error = str(exc)
        time.sleep(poll_s)
    raise TimeoutError(f"the gateway at {url} was not ready in time; last /health answer: {last_error}")
