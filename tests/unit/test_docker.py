"""deploy/docker: the images pin what the project pins, and the chart's default image is the
GPU one, tagged with the chart's appVersion."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml

from cluster.doctor import NIXL_VERSION
from tests.conftest import REPO

DOCKER = REPO / "deploy" / "docker"
CHART = REPO / "deploy" / "helm" / "tandem"
BOOTSTRAP = (REPO / "cluster" / "bootstrap.sh").read_text()


def _vllm_version() -> str:
    return re.search(r"^VLLM_VERSION=(\S+)", BOOTSTRAP, re.M).group(1)


def test_gpu_image_is_vllms_official_image_at_the_pinned_version():
    text = (DOCKER / "Dockerfile.gpu").read_text()
    assert f"ARG VLLM_IMAGE=vllm/vllm-openai:v{_vllm_version()}\nFROM ${{VLLM_IMAGE}}" in text
    ray = next(r for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
               if r.startswith("ray"))
    assert f'"{ray}"' in text
    # The NIXL backend comes from the same function as bootstrap.sh's, at the same version.
    assert "python3 -m cluster.doctor nixl-package" in text
    assert f'"$NIXL_BACKEND=={NIXL_VERSION}"' in text and f'--no-deps "nixl=={NIXL_VERSION}"' in text
    assert "ENTRYPOINT []" in text  # vLLM's image would start `vllm serve`


def test_cpu_image_installs_with_bootstrap_and_serves_on_all_interfaces():
    text = (DOCKER / "Dockerfile.cpu").read_text()
    assert "bash cluster/bootstrap.sh" in text and "tandem prepare-model" in text
    assert 'CMD ["tandem", "run", "--host", "0.0.0.0"]' in text


def test_build_context_leaves_out_venvs_and_state():
    # (not parametrized by flavor: a "gpu" test id would be skipped as a GPU test by conftest)
    for dockerfile in ("Dockerfile.cpu", "Dockerfile.gpu"):
        ignored = (DOCKER / f"{dockerfile}.dockerignore").read_text().split()
        assert {".git", ".venv", ".tandem"} <= set(ignored), dockerfile


def test_chart_default_image_is_the_gpu_image_at_app_version():
    helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra")
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    chart = helm.Chart.load(CHART)

    def images(values: dict) -> set[str]:
        out = chart.render(values, name="t", namespace="n", is_install=True)
        return set(re.findall(r"image: (\S*tandem\S*)", "".join(out.values())))

    assert images({}) == {f"ghcr.io/tandem/tandem:{app_version}"}
    cpu_dev = yaml.safe_load((CHART / "values-cpu-dev.yaml").read_text())
    assert images(cpu_dev) == {f"ghcr.io/tandem/tandem-cpu:{app_version}"}  # init container too
    assert images({"image": {"tag": "9.9.9"}}) == {"ghcr.io/tandem/tandem:9.9.9"}
