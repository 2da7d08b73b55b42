"""The control-plane benchmark's arithmetic, pure (unit-tested): the client's window summary,
the demanded rate, process kinds as this benchmark names them, and CPU per streamed token.

CPU per token: the client reads each process's CPU seconds at its window's edges (the same
instants as its token counts); a kind's seconds over the window make its cores busy, and ms
per token = cores busy x 1000 / delivered tokens per second.
"""

from __future__ import annotations

from typing import Mapping, Optional

from loadtest.bench import procs
from loadtest.bench.control_plane_sse import STALL_MS, Tally
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


def cpu_by_kind(cpu_s_by_pid: Mapping[int, float], kind_of: Mapping[int, str]) -> dict[str, float]:
    """CPU seconds by kind, from each process's seconds and its kind (unknown pids: other)."""
    out: dict[str, float] = {}
    for pid, seconds in cpu_s_by_pid.items():
        k = kind_of.get(pid, OTHER)
        out[k] = out.get(k, 0.0) + seconds
    return out


def demanded_tok_s(streams: int, pace_s: Optional[float]) -> Optional[float]:
    """Tokens per second the streams would take if every one ran at the engine's pace (a fake
    engine's fixed gap); None where the pace is the real engine's own (vLLM)."""
    if not pace_s:
        return None
    return streams / pace_s


def gap_summary(gaps_ms: list[float]) -> dict:
    """The gaps' latency summary, and the share of gaps that are 0: content events that came
    in the same read as the stream's previous one (sent together, or queued on the way and
    delivered in a burst), which a reader sees as arriving at once."""
    out = latency_summary(gaps_ms)
    if gaps_ms:
        out["same_read_share"] = round(sum(1 for g in gaps_ms if g == 0.0) / len(gaps_ms), 3)
    return out


def stall_summary(stalls: list[tuple[int, float]], gaps_ms: list[float]) -> dict:
    """The gaps of STALL_MS or more: how many, their share of all the streams' waiting (what
    they cost the delivered rate), and after how many tokens of an answer they came (1: between
    the first token, from the prefill hop, and the second, from decode)."""
    waited = sum(gaps_ms)
    after = sorted(n for n, _ in stalls)
    return {"threshold_ms": STALL_MS, "count": len(stalls),
            "time_share": round(sum(g for _, g in stalls) / waited, 3) if waited else None,
            "after_first_token": sum(1 for n in after if n == 1),
            "after_tokens_p50": after[len(after) // 2] if after else None,
            "max_ms": round(max((g for _, g in stalls), default=0.0), 1)}


def client_summary(tally: Tally) -> dict:
    """The client's figures of its window (what its RESULT line carries)."""
    window_s = tally.window.end - tally.window.start
    return {
        "window_s": round(window_s, 3),
        "tokens": tally.tokens,
        "content_events": tally.events,
        "tokens_per_event": round(tally.tokens / tally.events, 3) if tally.events else None,
        "delivered_tok_s": round(tally.tokens / window_s, 1) if window_s > 0 else None,
        "token_gap": gap_summary(tally.gaps_ms),
        "stalls": stall_summary(tally.stalls, tally.gaps_ms),
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
                 kinds: tuple[str, ...]) -> dict:
    """One cell of the sweep: the client's figures (its RESULT), the demand, the system's CPU
    by kind and the client's own over the client's window, and what else kept the machine
    busy meanwhile (other work on it: the noise in the figures)."""
    delivered = client.get("delivered_tok_s")
    demanded = demanded_tok_s(streams, pace_s)
    window_s = client["window_s"]
    own = cpu_figures(system_cpu_s, window_s, delivered, kinds)
    client_cpu = client["client_cpu_s"]
    client_cores = client_cpu / window_s
    foreign = max(0.0, client["machine_busy_s"] - sum(system_cpu_s.values()) - client_cpu)
    skip = ("delivered_tok_s", "client_cpu_s", "client", "cpu_s_by_pid", "machine_busy_s", "steal_s")
    return {
        "streams": streams,
        "pace_ms": round(pace_s * 1000, 3) if pace_s else None,
        "demanded_tok_s": round(demanded, 1) if demanded else None,
        "delivered_tok_s": delivered,
        "delivered_over_demanded": round(delivered / demanded, 3) if demanded and delivered is not None else None,
        **{k: v for k, v in client.items() if k not in skip},
        **own,
        "load_generator": {"cores_busy": round(client_cores, 3),
                           "cpu_ms_per_token": round(client_cores * 1000 / delivered, 4) if delivered else None},
        "machine": {"busy_cores": round(client["machine_busy_s"] / window_s, 3),
                    "other_work_cores": round(foreign / window_s, 3),
                    "steal_cores": round(client["steal_s"] / window_s, 3)},
    }
