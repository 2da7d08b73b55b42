"""The interface every layer of the gateway's request path implements: the P/D path
(router/pd/path.py), admission control (router/admission.py) and the request metrics
(router/request_metrics.py) each wrap the next and are one, so the engine client
(router/openai/engine_client.py) drives the outermost without knowing the stack.

Requests arrive with their tier set (the edge chose it); no layer defaults it again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncIterator, Protocol

from cluster.protocol import EngineRequest

if TYPE_CHECKING:  # vLLM is heavy; only its type is needed here
    from vllm.outputs import RequestOutput


class Backend(Protocol):
    """What serves an EngineRequest: vLLM RequestOutput DELTAs; may raise OpenAIError (429, 400)."""

    def generate(self, request: EngineRequest) -> AsyncIterator["RequestOutput"]: ...

    async def abort(self, request_id: str) -> None: ...

    async def health(self) -> dict[str, Any]:
        """{"ready": bool, ...details}: /health's answer."""
        ...
