"""vLLM's NixlConnector with two changes on the decode side: never load more prompt tokens
than the prefill engine computed, and never pull a handoff whose lease has ended.

Why: with first-token reuse (kv_transfer/first_token.py) the decode request's prompt is the
prefill's prompt plus the token the prefill already sampled. vLLM 0.32's pull scheduler asks
for the KV of every prompt token (`len(prompt) - num_computed`), one more than the prefill
holds: when the prompt filled its last block exactly, decode allocates one block more than
the prefill sends and the worker's `num_local <= num_remote` assertion fails; otherwise the
slot of the reused token gets stale bytes. Capping the count at the prefill's
`remote_num_tokens` (vLLM puts it in every handoff) loads exactly the prompt's KV; the
scheduler then computes the reused token like any decode step and samples the second one.

For a plain handoff (decode prompt == prefill prompt) `remote_num_tokens` equals the prompt
length, so the cap changes nothing. The class keeps vLLM's name: vLLM enables several
NIXL-specific settings by connector name, and `kv_connector_module_path` makes vLLM load this
module's class instead of its own (kv_transfer/nixl.py sets both).

The lease (kv_transfer/handoff.py): vLLM's scheduler calls get_num_new_matched_tokens when it
takes the request off its waiting queue, right before the pull. A request that waited there past
its handoff's lease deadline would read blocks the prefill engine has freed, maybe another
request's KV by now; it is turned into a plain local request (no pull, no notification to the
prefill engine, which has already let the blocks go) and computes its prompt.

Runs in vLLM's EngineCore process (the connector's scheduler half).
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector as VLLMNixlConnector

from kv_transfer.first_token import tokens_to_load
from kv_transfer.handoff import lease_ended, without_remote_prefill

log = logging.getLogger(__name__)


class NixlConnector(VLLMNixlConnector):
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        if lease_ended(request.kv_transfer_params):
            log.warning("request %s waited past its KV handoff's lease: computing its prompt instead of "
                        "pulling blocks the prefill engine has freed", request.request_id)
            request.kv_transfer_params = without_remote_prefill(request.kv_transfer_params)
        count, load_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if count is None:
            return count, load_async
        capped = tokens_to_load(request.kv_transfer_params, count, num_computed_tokens)
        if capped == 0:
            # Nothing left to pull (the local prefix cache holds it all): vLLM's own
            # full-hit path, which still tells the prefill engine to free its blocks.
            return 0, False
        return capped, load_async
