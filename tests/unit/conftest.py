"""Fixtures the unit suites share."""

from __future__ import annotations

import pytest

from tests.support.redis_server import RedisServer, running


@pytest.fixture
def redis_server():
    with running(RedisServer()) as server:
        yield server
