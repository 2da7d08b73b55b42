"""The OpenAI-compatible HTTP edge of tandem.

This package knows HTTP, JSON and the OpenAI wire format, and nothing about Ray or vLLM:
it validates and tokenizes a request, turns it into a `cluster.protocol.EngineRequest`
and hands it to an `OpenAIBackend`. Keeping the edge free of Ray and vLLM lets the whole
HTTP contract be unit-tested with a fake backend in milliseconds.
"""

from __future__ import annotations

from router.openai.app import build_openai_app
from router.openai.backend import OpenAIBackend, TokenizerLike
from router.openai.errors import OpenAIError

__all__ = ["OpenAIBackend", "OpenAIError", "TokenizerLike", "build_openai_app"]
