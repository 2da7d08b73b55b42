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
