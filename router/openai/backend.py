"""The contract between the HTTP edge and whatever serves tokens behind it.

The edge depends on this Protocol only, so the Ray Serve gateway (router + prefill/decode
pools) and the unit-test fake are interchangeable, and the edge never imports Ray or vLLM.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Mapping, Optional, Protocol, Sequence, runtime_checkable

from cluster.protocol import EngineRequest, TokenChunk


@runtime_checkable
class TokenizerLike(Protocol):
    """What the edge needs from a tokenizer; `PromptTokenizer` is the real one.

    Tokenizing once at the edge gives the router the exact token ids (for prefix hashing)
    and lets the edge enforce the context length before any GPU work is spent.
    """

    def encode(self, text: str) -> list[int]:
        """Token ids of a completion prompt, special tokens added as the model expects."""
        ...

    def chat(self, messages: Sequence[Mapping[str, Any]],
             tools: Optional[Sequence[Mapping[str, Any]]] = None) -> list[int]:
        """Token ids of a conversation with the chat template and generation prompt applied;
        `tools` (OpenAI tool objects, or None) are rendered by the template when given.

        Raises `OpenAIError` (400) when the model cannot render the conversation.
        """
        ...


@runtime_checkable
class OpenAIBackend(Protocol):
    """Serves one model behind the OpenAI edge.

    `generate` is an async generator function in practice (``async def`` with ``yield``):
    calling it returns an async iterator of `TokenChunk` deltas; the last chunk carries a
    `finish_reason` ("stop" or "length"; "abort" and "error" are reported to the client as
    errors). It may raise `OpenAIError` (e.g. 429 or 503) before or during the stream. An
    implementation whose `generate` is a coroutine returning an async iterator also works.
    """

    model_id: str
    """The served model name; requests naming any other model get 404."""

    max_model_len: int
    """Prompt tokens plus generated tokens may not exceed this."""

    tokenizer: TokenizerLike

    def generate(self, request: EngineRequest) -> AsyncIterator[TokenChunk]:
        """Stream the generation of a validated, tokenized request."""
        ...

    async def health(self) -> dict[str, Any]:
        """Readiness: ``{"ready": bool, ...details}``; details are shown on /health."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop work for a request whose client went away; must be idempotent."""
        ...
