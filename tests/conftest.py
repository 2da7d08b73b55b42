"""Shared test set-up: where test artefacts live, and the tiny model every suite may use."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TEST_STATE = REPO / ".tandem" / "test"


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny float32 Llama (seeded weights, locally trained BPE), generated once."""
    from cluster.models import make_tiny_llama

    return make_tiny_llama(TEST_STATE / "models" / "tiny-llama")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need an NVIDIA GPU; without one they are reported as skipped."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not _has_cuda():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
        for item in gpu_items:
            item.add_marker(skip)
