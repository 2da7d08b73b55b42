"""The edge's tokenizer: the model's own Hugging Face tokenizer and chat template.

The gateway tokenizes once so the router can hash prompt blocks and the edge can enforce
the context length before any engine is touched. It must produce exactly the ids vLLM would
produce from the same text, hence the model folder's tokenizer with its default special
tokens and its chat template, not a re-implementation. `transformers` is imported here
only, so the rest of the edge stays importable (and testable) without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from router.openai.errors import OpenAIError, bad_request


class PromptTokenizer:
    """Wraps `AutoTokenizer.from_pretrained(path)` with the two calls the edge needs."""

    def __init__(self, path: Union[str, Path], tokenizer: Optional[Any] = None) -> None:
        """Load from a local model folder; `tokenizer` lets a caller pass one already loaded."""
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.path = str(path)
        self._tok = tokenizer

    @property
    def vocab_size(self) -> int:
        """All ids the model knows, added special tokens included (for prompt id checks)."""
        return len(self._tok)

    @property
    def hf(self) -> Any:
        """The Hugging Face tokenizer itself (vLLM's tool parsers take it)."""
        return self._tok

    @property
    def eos_token_id(self) -> Optional[int]:
        return self._tok.eos_token_id

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._tok, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        """Ids of a completion prompt; special tokens (e.g. BOS) as the tokenizer defaults."""
        return list(self._tok.encode(text))

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=True))

    def chat(self, messages: Sequence[Mapping[str, Any]],
             tools: Optional[Sequence[Mapping[str, Any]]] = None) -> list[int]:
        """Ids of a conversation rendered by the model's chat template, ready for a reply.
        `tools` (OpenAI's tool objects) go to the template, which shows them to the model.

        A model without a template cannot serve chat: say so with a 400 that points to
        /v1/completions rather than guessing a format the model was not trained on.
        """
        if not self.has_chat_template:
            raise bad_request(
                "This model has no chat template, so /v1/chat/completions cannot be used "
                "with it; use /v1/completions with a plain prompt instead.",
                "messages",
                "chat_template_missing",
            )
        try:
            extra = {"tools": [dict(t) for t in tools]} if tools else {}
            out = self._tok.apply_chat_template(
                [dict(m) for m in messages], add_generation_prompt=True, tokenize=True, **extra
            )
        except OpenAIError:
            raise
        except Exception as exc:  # jinja2 TemplateError and friends: the conversation is bad
            if type(exc).__module__.startswith("jinja2"):
                raise bad_request(
                    f"The conversation cannot be rendered with this model's chat template: {exc}",
                    "messages",
                ) from None
            raise
        return _ids_of(out)


def _ids_of(out: Any) -> list[int]:
    """apply_chat_template returns a list (transformers 4) or a BatchEncoding (5)."""
    if isinstance(out, Mapping) or hasattr(out, "keys"):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    out = list(out)
    if out and isinstance(out[0], (list, tuple)):
        out = list(out[0])
    return [int(i) for i in out]
