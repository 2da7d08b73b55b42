"""The sampling settings a validated request asks for, beyond the length and the basics.

`sampling_extras(req, structured, vocab_size)` returns keyword arguments for
`SamplingSettings`: penalties, top-k/min-p, stop token ids, logprobs and the decoding
constraint (from response_format / structured_outputs, or from tool_choice). The app adds
max_tokens, temperature, top_p, seed, stop, ignore_eos and min_tokens.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from cluster.protocol import StructuredOutput
from router.openai.errors import bad_request
from router.openai.protocol import ChatCompletionRequest, CompletionRequest


def sampling_extras(
    req: Union[CompletionRequest, ChatCompletionRequest],
    structured: Optional[StructuredOutput],
    vocab_size: Optional[int],
) -> dict[str, Any]:
    stop_ids = tuple(req.stop_token_ids or ())
    if isinstance(vocab_size, int) and any(i >= vocab_size for i in stop_ids):
        raise bad_request(f"Token ids in 'stop_token_ids' must be below the vocabulary size {vocab_size}.",
                          "stop_token_ids")
    top_k = 0 if req.top_k in (None, -1) else req.top_k
    if isinstance(vocab_size, int) and top_k >= vocab_size:
        top_k = 0  # the whole vocabulary: the same as no top-k, and the engine's kernels need k <= vocab
    return {
        "top_k": top_k,
        "min_p": req.min_p or 0.0,
        "stop_token_ids": stop_ids,
        "presence_penalty": req.presence_penalty or 0.0,
        "frequency_penalty": req.frequency_penalty or 0.0,
        "repetition_penalty": 1.0 if req.repetition_penalty is None else req.repetition_penalty,
        "logprobs": req.num_logprobs(),
        "structured": structured,
    }
