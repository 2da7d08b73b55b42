"""OpenAI's two logprobs shapes, built from the engine's `TokenLogprob`s.

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`.
Completions (legacy): `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
"text_offset"}`. Pure functions, so the wire shape is tested without an engine.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from cluster.protocol import TokenLogprob


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": e.token,
                "logprob": e.logprob,
                "bytes": _bytes(e.token),
                "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": _bytes(t.token)} for t in e.top],
            }
            for e in entries
        ]
    }


def completion_logprobs(entries: Sequence[TokenLogprob], text_offset: int = 0) -> dict[str, Any]:
    """`text_offset` is where the first entry's token starts in the whole completion."""
    offsets = []
    for e in entries:
        offsets.append(text_offset)
        text_offset += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        # Duplicate token strings (distinct ids decoding alike) keep the likeliest.
        "top_logprobs": [{t.token: t.logprob for t in reversed(e.top)} for e in entries],
        "text_offset": offsets,
    }


def logprobs_body(chat: bool, entries: Sequence[TokenLogprob], text_offset: int = 0) -> Optional[dict[str, Any]]:
    return chat_logprobs(entries) if chat else completion_logprobs(entries, text_offset)
