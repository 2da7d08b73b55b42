"""Runs the OpenAI Agents SDK, unmodified, against an OpenAI-compatible server.

Run with .venv-peers/bin/python (made by `make peers-venv`): one agent run per model class the
SDK ships (chat completions, and its default, the Responses model), each with and without a
function tool. Prints one JSON object, {run name: {"ok", "final_output" | "error"}}, and exits
1 when any run failed. tests/integration/test_peer_clients.py runs it against the test cluster.

The tiny random test model will not really call the tool; the tool runs prove that a request
carrying `tools` is accepted and answered. Nor does it ever emit its end-of-sequence token, and
the SDK treats a truncated answer as an error (chat: "finish_reason='length' but produced no
assistant text"; Responses: "terminal event `response.incomplete`", both seen against vLLM's own
server), so every request carries stop sequences (OpenAI's `stop`, which vLLM's chat and
Responses endpoints both take) through the SDK's own `ModelSettings.extra_body`: the answer ends
at the first vowel with finish_reason "stop", as a real model's would at its end token.
"""

from __future__ import annotations

import argparse
import json
import sys

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI


INSTRUCTIONS = "You are a helpful assistant."
# At most 4, OpenAI's limit; the tiny model's greedy answer to INSTRUCTIONS + "Say hi" starts
# " mill", so the answer is " m".
STOP = ("a", "e", "i", "o")


@function_tool
def get_weather(city: str) -> str:
    """Tells the weather in a city."""
    return f"It is sunny in {city}."


def build_agents(base_url: str, model: str) -> dict[str, Agent]:
    # max_retries=0: a failure shows as itself, not as three slow retries.
    client = AsyncOpenAI(base_url=base_url, api_key="tandem-peer-check", max_retries=0, timeout=120)
    settings = ModelSettings(max_tokens=16, temperature=0, extra_body={"stop": list(STOP)})
    models = {
        "chat_completions": OpenAIChatCompletionsModel(model=model, openai_client=client),
        "responses": OpenAIResponsesModel(model=model, openai_client=client),
    }
    agents: dict[str, Agent] = {}
    for kind, model_class in models.items():
        agents[kind] = Agent(name=f"{kind} agent", instructions=INSTRUCTIONS, model=model_class,
                             model_settings=settings)
        agents[f"{kind}_tool"] = Agent(name=f"{kind} tool agent", instructions=INSTRUCTIONS,
                                       model=model_class, model_settings=settings, tools=[get_weather])
    return agents


def run_one(agent: Agent) -> dict:
    try:
        # max_turns 3: should the random model emit a tool call, the SDK runs the tool and asks
        # again, but never loops for long.
        result = Runner.run_sync(agent, "Say hi", max_turns=3)
    except Exception as exc:  # reported, not raised: every run gets its line in the JSON
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    output = result.final_output
    if not isinstance(output, str):
        return {"ok": False, "error": f"final_output is {type(output).__name__}, not str: {output!r}"}
    return {"ok": True, "final_output": output}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the server's OpenAI base URL, ending in /v1")
    parser.add_argument("--model", required=True, help="the served model name")
    args = parser.parse_args()
    set_tracing_disabled(True)  # the SDK would export traces to OpenAI; nothing outside is reachable
    results = {name: run_one(agent) for name, agent in build_agents(args.base_url, args.model).items()}
    print(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
