"""A pool's vLLM engine arguments, read by vLLM's own command-line parser.

A pool's `engine:` takes vLLM's engine arguments under their own names (EngineConfig in
cluster/config/pools.py). tandem does not re-implement their types: `cli_args` writes them as
the command line `vllm serve --config` makes of the same YAML, and `parse` lets the parser
`vllm serve` uses (AsyncEngineArgs.add_cli_args) convert and check each one, so sizes ("4G"),
JSON configs, choices and booleans mean what they mean to vLLM. A name vLLM does not know is
refused with the closest one it does know.

`check` runs this for every pool at `tandem check-config`; the engine replica builds its
AsyncEngineArgs from the same `parse` (cluster/engine/vllm.py), so what was checked is what
runs. Importing vLLM costs ~10 s of CPU, so cluster/config/ never imports this module.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from typing import TYPE_CHECKING, Any, Mapping

from cluster.config import ConfigError
from cluster.config.pools import SET_BY_TANDEM, TANDEM_ENGINE_KEYS

if TYPE_CHECKING:
    from cluster.config import ClusterConfig


@functools.cache
def _parser() -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class RaisingParser(FlexibleArgumentParser):
        def error(self, message: str):  # argparse would print usage and exit the process
            raise ValueError(message)

    return AsyncEngineArgs.add_cli_args(RaisingParser())


@functools.cache
def vllm_arg_names() -> frozenset[str]:
    """Every engine argument `vllm serve` takes, by its AsyncEngineArgs field name (the few
    fields without a flag are internal to vLLM), less those tandem sets itself."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    flags = vars(_parser().parse_args([]))
    return frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs)
                     if f.name in flags and f.name not in SET_BY_TANDEM)


def cli_args(settings: Mapping[str, Any]) -> list[str]:
    """`--flag value` arguments of vLLM names, as vLLM's FlexibleArgumentParser.load_config_file
    turns a YAML config into a command line: true is the bare flag, false its --no- form,
    a list its items, a mapping JSON."""
    args: list[str] = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (list, tuple)):
            args += [flag, *map(str, value)] if value else []
        elif isinstance(value, dict):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


def _unknown(key: str, where: str) -> str:
    close = difflib.get_close_matches(key.replace("-", "_"), sorted(vllm_arg_names() | TANDEM_ENGINE_KEYS), n=1)
    hint = f"did you mean {close[0]}?" if close else "see `python -m vllm.entrypoints.openai.api_server --help`"
    return f"{where}.{key}: not a vLLM engine argument nor a tandem one; {hint}"


def parse(settings: Mapping[str, Any], where: str = "engine") -> dict[str, Any]:
    """vLLM-named settings (EngineConfig.vllm_args()) as vLLM's parser makes them: the keyword
    arguments of AsyncEngineArgs. `where` is the YAML path of the pool's engine, for errors."""
    parser, names = _parser(), vllm_arg_names()
    parsed: dict[str, Any] = {}
    for key, value in settings.items():
        if key not in names:
            raise ConfigError(_unknown(key, where))
        # One key at a time, so an error names the key.
        args = cli_args({key: value})
        if value is False and args[0] not in parser._option_string_actions:
            args = []  # a store_true flag: false is its default, as vLLM's load_config_file has it
        try:
            namespace = parser.parse_args(args)
        except ValueError as exc:
            raise ConfigError(f"{where}.{key}: vLLM refuses {value!r}: {exc}") from None
        parsed[key] = getattr(namespace, key)
    return parsed


def check(cfg: "ClusterConfig", source: str = "config") -> None:
    """Every pool's engine arguments through vLLM's parser; one ConfigError with every problem."""
    problems = []
    for tier, tier_cfg in cfg.tiers.items():
        for role, pool in tier_cfg.pools().items():
            try:
                parse(pool.engine.vllm_args(), f"tiers.{tier}.{role}.engine")
            except ConfigError as exc:
                problems.append(str(exc))
    if len(problems) == 1:
        raise ConfigError(f"{source}: {problems[0]}")
    if problems:
        raise ConfigError(f"{source}: invalid config ({len(problems)} problems):\n  " + "\n  ".join(problems))


def flag_schemas() -> dict[str, dict[str, Any]]:
    """A JSON Schema per vLLM engine argument for the Helm chart (deploy/helm/gen_schema.py):
    typed only as far as the flag says (a boolean, a fixed set of choices); vLLM's parser
    checks every value at `tandem check-config` and at engine start."""
    import argparse

    actions = {action.dest: action for action in _parser()._actions}
    schemas = {}
    for name in sorted(vllm_arg_names()):
        action = actions[name]
        schema: dict[str, Any] = {"description": f"vLLM's --{name.replace('_', '-')}"}
        if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
            schema["type"] = "boolean"
        elif action.choices and all(c is None or isinstance(c, (str, int)) for c in action.choices):
            schema["enum"] = list(action.choices)
        schemas[name] = schema
    return schemas
