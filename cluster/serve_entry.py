"""Ray Serve entry point for clusters Ray Serve deploys from a config file: KubeRay's
RayService (the Helm chart in deploy/helm/tandem) and `serve deploy` / `serve run`.

The Serve config names the builder and hands it the ClusterConfig, the same schema a local
run takes (cluster/config/), either inline or as a path to a mounted YAML file:

    applications:
      - name: tandem
        import_path: cluster.serve_entry:build
        route_prefix: /
        args:
          cluster: {model: {path: /models/m}, tiers: {...}}   # inline (what the chart renders)
          # or: config_path: /etc/tandem/cluster.yaml

The Ray cluster already exists here, so `ray` and `gateway.host`/`gateway.port` in the
ClusterConfig are not used: the Serve config's `http_options` say where the gateway listens.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from cluster.config import ClusterConfig


def load_config(args: dict[str, Any]) -> ClusterConfig:
    """The ClusterConfig in the Serve application's args; errors say which key to set."""
    given = sorted(set(args) & {"cluster", "config_path"})
    if len(given) != 1 or set(args) - {"cluster", "config_path"}:
        raise ValueError(
            "tandem's Serve args take exactly one of `cluster` (the ClusterConfig as a mapping) "
            f"or `config_path` (a ClusterConfig YAML file); got keys {sorted(args)}"
        )
    if "cluster" in args:
        return ClusterConfig.model_validate(args["cluster"])
    return ClusterConfig.load(args["config_path"])


def build(args: dict[str, Any]) -> Application:
    """Serve application builder (`import_path: cluster.serve_entry:build`)."""
    from cluster.app import build_app

    return build_app(load_config(args))
