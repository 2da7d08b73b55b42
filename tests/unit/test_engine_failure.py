"""What a decode or prefill replica sends the gateway when vLLM's AsyncLLM.generate fails
(cluster/engine/vllm.py): AsyncLLM wraps unexpected errors, and some of its own request
checks, in a message-less EngineGenerateError; the request's faults become a 400, the rest a
server error naming its cause, never vLLM's class (see test_openai_edge's Ray case)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from vllm.v1.engine.exceptions import EngineGenerateError

from cluster.engine.vllm import VLLMEngine, engine_failure
from cluster.protocol import InvalidEngineRequest


def _wrapped(cause: BaseException) -> EngineGenerateError:
    try:
        try:
            raise cause
        except Exception as exc:
            raise EngineGenerateError() from exc
    except EngineGenerateError as wrapped:
        return wrapped


@pytest.mark.parametrize("cause", [ValueError("min_tokens must be <= max_tokens"), TypeError("bad type")])
def test_a_check_of_the_request_is_the_clients_error(cause: BaseException) -> None:
    refused = engine_failure("r1", _wrapped(cause))
    assert isinstance(refused, InvalidEngineRequest) and str(cause) in str(refused)


def test_anything_else_is_a_server_error_that_names_its_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    # The module's logger itself, not caplog: vLLM's logging set-up, run by earlier tests in
    # this process, may disable loggers that exist when it runs.
    from cluster.engine import vllm as engine_module

    warned: list[str] = []
    monkeypatch.setattr(engine_module, "log", SimpleNamespace(warning=lambda msg, *args: warned.append(msg % args)))
    failed = engine_failure("r2", _wrapped(KeyError("block 7")))
    assert not isinstance(failed, (InvalidEngineRequest, EngineGenerateError))
    assert "KeyError" in str(failed) and "block 7" in str(failed)
    assert len(warned) == 1 and "r2" in warned[0] and "KeyError" in warned[0]


def test_generate_raises_what_engine_failure_says() -> None:
    class _FailingLLM:
        async def generate(self, *_: object, **__: object):
            raise _wrapped(ValueError("prompt too long"))
            yield  # an async generator, as AsyncLLM.generate

    engine = object.__new__(VLLMEngine)
    engine._llm = _FailingLLM()
    request = SimpleNamespace(request_id="r3", prompt_token_ids=(1, 2, 3), cache_salt=None, traceparent=None,
                              adapter=None)

    async def drain() -> None:
        async for _ in engine._generate(request, params=None):
            pass

    with pytest.raises(InvalidEngineRequest, match="prompt too long"):
        asyncio.run(drain())
