"""The control-plane benchmark's arithmetic, pure (unit-tested): the client's window summary,
the demanded rate, process kinds as this benchmark names them, and CPU per streamed token.

CPU per token: a kind's CPU seconds over the parent's window (between its two process
snapshots) make its cores busy; the client's tokens over the client's window make the
delivered rate; ms per token = cores busy x 1000 / delivered tokens per second. Taking the
ratio of two rates, not of two counts, keeps the few milliseconds by which the windows differ
(the pipe, the snapshots' own time) out of the figure.
"""

from __future__ import annotations

from typing import Mapping, Optional

from loadtest.bench import procs
from loadtest.bench.control_plane_sse import Tally
from loadtest.measure.percentiles import latency_summary

# This benchmark's kinds: procs.py's, with the engine replicas told apart by pool and Ray's
# small processes (dashboard agent, idle workers, log monitor, the driver) as "other".
GATEWAY, PROXY, PREFILL, DECODE = "gateway", "Serve proxy", "prefill replica", "decode replica"
CONTROLLER, RAY_CORE, API_SERVER, ENGINE, OTHER = "Serve controller", "Ray core", "vLLM API server", "vLLM engine", "other"
TANDEM_KINDS = (GATEWAY, PROXY, PREFILL, DECODE, CONTROLLER, RAY_CORE, OTHER)
VLLM_KINDS = (API_SERVER, ENGINE, OTHER)
TOTAL = "total"

_BY_PROCS_KIND = {procs.GATEWAY: GATEWAY, procs.PROXY: PROXY, procs.CONTROLLER: CONTROLLER,
                  procs.RAY_CORE: RAY_CORE, procs.API_SERVER: API_SERVER, procs.ENGINE_CORE: ENGINE,
                  procs.WORKER: ENGINE}


def bench_kind(kind: str, role: Optional[str]) -> str:
    """This benchmark's kind of a process from procs.label's (kind, role)."""
    if kind == procs.ENGINE_REPLICA:
        if role and role.endswith("-prefill"):
            return PREFILL
        if role and role.endswith("-decode"):
            return DECODE
        return OTHER
    return _BY_PROCS_KIND.get(kind, OTHER)


def cpu_by_kind(delta: Mapping[tuple[str, Optional[str]], float]) -> dict[str, float]:
    """CPU seconds by this benchmark's kind, from procs.cpu_delta's {(kind, role): s}."""
    out: dict[str, float] = {}
    for (kind, role), seconds in delta.items():
        k = bench_kind(kind, role)
        out[k] = out.get(k, 0.0) + seconds
    return out


def demanded_tok_s(streams: int, pace_s: Optional[float]) -> Optional[float]:
    """Tokens per second the streams would take if every one ran at the engine's pace (a fake
    engine's fixed gap); None where the pace is the real engine's own (vLLM)."""
    if not pace_s:
        return None
    return streams / pace_s


def client_summary(tally: Tally) -> dict:
    """The client's figures of its window (what its RESULT line carries)."""
    window_s = tally.window.end - tally.window.start
    return {
        "window_s": round(window_s, 3),
        "tokens": tally.tokens,
        "content_events": tally.events,
        "tokens_per_event": round(tally.tokens / tally.events, 3) if tally.events else None,
        "delivered_tok_s": round(tally.tokens / window_s, 1) if window_s > 0 else None,
        "token_gap": latency_summary(tally.gaps_ms),
        "ttft": latency_summary(tally.ttfts_ms),
        "requests": {"completed": tally.completed, "errors": tally.errors,
                     "completed_outside_window": tally.completed_outside,
                     "errors_outside_window": tally.errors_outside, "error_samples": tally.error_samples},
    }


def cpu_figures(cpu_s: Mapping[str, float], cpu_wall_s: float, delivered_tok_s: Optional[float],
                kinds: tuple[str, ...]) -> dict:
    """{"cores_busy": {kind: cores}, "cpu_ms_per_token": {kind: ms}} over `kinds` (each
    listed, 0 where no process of it ran; any other kind counted as other) and their total.
    Per token: None without tokens."""
    cores = {k: cpu_s.get(k, 0.0) / cpu_wall_s for k in kinds}
    # A kind outside the list (not expected) must not vanish from the total: it counts as other.
    cores[OTHER] = cores.get(OTHER, 0.0) + sum(v for k, v in cpu_s.items() if k not in kinds) / cpu_wall_s
    cores[TOTAL] = sum(cores.values())
    per_token = {k: (round(v * 1000.0 / delivered_tok_s, 4) if delivered_tok_s else None) for k, v in cores.items()}
    return {"cores_busy": {k: round(v, 3) for k, v in cores.items()}, "cpu_ms_per_token": per_token}


def cell_figures(streams: int, pace_s: Optional[float], client: dict, system_cpu_s: Mapping[str, float],
                 kinds: tuple[str, ...], cpu_wall_s: float, machine_busy_s: float, steal_s: float) -> dict:
    """One cell of the sweep: the client's figures, the demand, the system's CPU by kind and
    the client's own, and what else kept the machine busy meanwhile (the noise)."""
    delivered = client.get("delivered_tok_s")
    demanded = demanded_tok_s(streams, pace_s)
    own = cpu_figures(system_cpu_s, cpu_wall_s, delivered, kinds)
    client_cpu = client["client_cpu_s"]
    client_cores = client_cpu / client["window_s"] if client.get("window_s") else 0.0
    foreign = max(0.0, machine_busy_s - sum(system_cpu_s.values()) - client_cpu)
    return {
        "streams": streams,
        "pace_ms": round(pace_s * 1000, 3) if pace_s else None,
        "demanded_tok_s": round(demanded, 1) if demanded else None,
        "delivered_tok_s": delivered,
        "delivered_over_demanded": round(delivered / demanded, 3) if demanded and delivered is not None else None,
        **{k: v for k, v in client.items() if k not in ("delivered_tok_s", "client_cpu_s", "client")},
        **own,
        "load_generator": {"cores_busy": round(client_cores, 3),
                           "cpu_ms_per_token": round(client_cores * 1000 / delivered, 4) if delivered else None},
        "machine": {"cpu_window_s": round(cpu_wall_s, 3), "busy_cores": round(machine_busy_s / cpu_wall_s, 3),
                    "other_work_cores": round(foreign / cpu_wall_s, 3), "steal_cores": round(steal_s / cpu_wall_s, 3)},
    }
