"""`python -m loadtest.sim matrix`, the pure part: from the matrix's simulated rows to its
verdicts, and from the decider's reasons to the rules that never fired. No simulation here
(matrix.py runs them). SIMULATED, every figure these functions are given.

A comparison (adaptive vs colocated, adaptive vs always) is judged per cell over every swept
setting (KV link bandwidth x control-plane cost scale), each side's best goodput under the SLO
(TTFT + mean ITL) over the offered loads and, for tandem, over the P:D splits. Issue 32: "a
result is stated only where its sign holds across the sweep". A verdict is "adaptive ahead" or
"adaptive behind" only when it is so at every setting by more than MARGIN (the planner's noise
margin, plan_sizing.recommend's `close`: one seeded trace per setting, so a few percent is noise);
otherwise "sign does not hold", with the range of the ratios.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

MARGIN = 0.05  # plan_sizing.recommend(close=0.05): the same noise margin as the planner's
AHEAD, BEHIND, NO_SIGN = "adaptive ahead", "adaptive behind", "sign does not hold"
COMPARISONS = (("adaptive", "colocated"), ("adaptive", "always"))

# Every (path, reason) router/routing/decider.py `decide` can return, with its rule (the
# numbering of decider.py's docstring). A unit test reads decider.py so this cannot drift.
REASONS: dict[str, str] = {
    "local/never": "rule 1: mode never",
    "remote/always": "rule 1: mode always",
    "local/short_uncached": "rule 2 (decode_only_below_tokens, 0 here) or rule 3 (adaptive: the hops cost more "
                            "than the prompt); one label for both",
    "remote/prefill_ok": "rule 4 (or rule 6: remote meets ttft_s)",
    "local/prefill_queue": "rule 5: local faster, an idle prefill engine would have met ttft_s",
    "local/local_faster": "rule 5: local faster, an idle prefill engine would not have met ttft_s",
    "remote/decode_itl_budget": "rule 6: the decode step is past itl_s",
    "remote/decode_gap_budget": "rule 6: the running streams' gap with the chunk is past gap_s",
    "remote/overloaded": "rule 6: local is slower too",
    "whole/short_output": "rule 7: a short answer runs whole on the prefill engine",
    "whole/decode_full": "rule 8: the decode engine at its bound, the prefill engine has room (off by default)",
}
# Rule 9 gives no reason label: it sets reuse_first_token on a remote verdict. Counted apart.
REUSE_DECLINED = "rule 9: a remote verdict that does not reuse the prefill's first token"


@dataclass(frozen=True)
class Verdict:
    label: str  # AHEAD | BEHIND | NO_SIGN
    why: str
    ratio_min: Optional[float]  # adaptive / other over the settings where the other met the SLO at all
    ratio_max: Optional[float]
    settings: int

    def as_dict(self) -> dict:
        return asdict(self)


def _sign(a: float, b: float, margin: float) -> tuple[int, bool]:
    """(+1 adaptive ahead, -1 behind, 0 equal; whether the margin, relative to the winner as
    the planner measures it, exceeds `margin`)."""
    if a == b:
        return 0, False
    win, lose = (a, b) if a > b else (b, a)
    return (1 if a > b else -1), (win - lose) / win > margin


def verdict(pairs: Sequence[tuple[float, float]], margin: float = MARGIN) -> Verdict:
    """pairs: (adaptive, other) best goodput, req/s, one per swept setting."""
    if not pairs:
        raise ValueError("no settings to judge")
    ratios = [a / b for a, b in pairs if b > 0]
    lo, hi = (round(min(ratios), 4), round(max(ratios), 4)) if ratios else (None, None)
    span = f"adaptive/other {lo:.2f}-{hi:.2f}" if ratios else "the other met the SLO at no setting"
    if len(ratios) < len(pairs):
        span += f"; the other met the SLO at no load at {len(pairs) - len(ratios)} of {len(pairs)} settings"
    signs = [_sign(a, b, margin) for a, b in pairs]
    n = len(pairs)
    if all(a == 0 and b == 0 for a, b in pairs):
        return Verdict(NO_SIGN, f"neither met the SLO at any load, at any of {n} settings", lo, hi, n)
    if {s for s, _ in signs} == {1} or {s for s, _ in signs} == {-1}:
        label = AHEAD if signs[0][0] == 1 else BEHIND
        small = sum(1 for _, big in signs if not big)
        if small == 0:
            return Verdict(label, f"at every one of {n} settings by more than {margin:.0%} ({span})", lo, hi, n)
        return Verdict(NO_SIGN, f"{label} at every setting, but by {margin:.0%} or less at {small} of {n} "
                                f"(within the noise; {span})", lo, hi, n)
    counts = {s: sum(1 for x, _ in signs if x == s) for s in (1, -1, 0)}
    return Verdict(NO_SIGN, f"ahead at {counts[1]}, behind at {counts[-1]}, equal at {counts[0]} of {n} settings "
                            f"({span})", lo, hi, n)


@dataclass(frozen=True)
class Best:
    """A system's best goodput under the SLO at one setting: over the loads (and splits)."""

    goodput_rps: float
    candidate: str  # "colocated x8", "adaptive 2P:6D"
    rate_rps: float


def best_per_setting(rows: Iterable[dict]) -> dict[tuple[float, float], dict[str, Best]]:
    """rows: {system, candidate, rate_rps, goodput_rps, bandwidth_gbps, cp_scale}; a colocated
    row has bandwidth_gbps and cp_scale None (its engines pull no KV and make no hop: one run
    serves every setting). Ties keep the first row (the sweep's order)."""
    rows = list(rows)
    settings = sorted({(r["bandwidth_gbps"], r["cp_scale"]) for r in rows if r["system"] != "colocated"})
    out: dict[tuple[float, float], dict[str, Best]] = {s: {} for s in settings}
    for r in rows:
        targets = settings if r["system"] == "colocated" else [(r["bandwidth_gbps"], r["cp_scale"])]
        for s in targets:
            cur = out[s].get(r["system"])
            if cur is None or r["goodput_rps"] > cur.goodput_rps:
                out[s][r["system"]] = Best(r["goodput_rps"], r["candidate"], r["rate_rps"])
    return out


def cell_verdicts(rows: Sequence[dict], top_rate: float, margin: float = MARGIN) -> dict:
    """The cell's two comparisons and, per setting, each system's best (where it came at the
    highest swept load, the grid set that number, not the system's capacity: said)."""
    best = best_per_setting(rows)
    out: dict = {"per_setting": [], "verdicts": {}}
    for (bw, cp), systems in best.items():
        out["per_setting"].append({"bandwidth_gbps": bw, "cp_scale": cp,
                                   **{name: {"goodput_rps": b.goodput_rps, "candidate": b.candidate,
                                             "at_top_load": b.rate_rps == top_rate and b.goodput_rps > 0}
                                      for name, b in sorted(systems.items())}})
    for a, b in COMPARISONS:
        pairs = [(s[a].goodput_rps, s[b].goodput_rps) for s in best.values()]
        out["verdicts"][f"{a} vs {b}"] = verdict(pairs, margin).as_dict()
    return out


def count_reasons(rows: Iterable[dict]) -> dict[str, dict[str, int]]:
    """{mode: {path/reason: decisions}} summed over tandem rows, plus rule 9 as REUSE_DECLINED."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        if r["system"] == "colocated":
            continue
        mode = out.setdefault(r["system"], {})
        for key, n in r["reasons"].items():
            mode[key] = mode.get(key, 0) + n
        if r.get("reuse_declined"):
            mode[REUSE_DECLINED] = mode.get(REUSE_DECLINED, 0) + r["reuse_declined"]
    return {m: dict(sorted(c.items())) for m, c in sorted(out.items())}


def rule_report(matrix: dict[str, dict[str, int]], measured: Sequence[str], replayed: Sequence[str]) -> dict:
    """Per reason: decisions in the matrix (per mode), whether the CPU validation's measured runs
    and its simulated replay gave it; and the reasons no run gave at all (the candidates to delete;
    none is deleted here)."""
    totals: dict[str, int] = {}
    for counts in matrix.values():
        for k, n in counts.items():
            totals[k] = totals.get(k, 0) + n
    rules = {}
    for key, rule in REASONS.items():
        rules[key] = {"rule": rule, "matrix_decisions": totals.get(key, 0),
                      "matrix_by_mode": {m: c[key] for m, c in matrix.items() if key in c},
                      "cpu_validation_measured": key in measured, "cpu_validation_simulated": key in replayed}
    never = [k for k, v in rules.items()
             if not v["matrix_decisions"] and not v["cpu_validation_measured"] and not v["cpu_validation_simulated"]]
    unknown = sorted(k for k in set(totals) | set(measured) | set(replayed) if k not in REASONS and k != REUSE_DECLINED)
    return {"rules": rules, "rule_9": {"what": REUSE_DECLINED, "matrix_decisions": totals.get(REUSE_DECLINED, 0),
                                       "cpu_validation": "not recorded (the recorded runs count reasons, not reuse)"},
            "never_fired": never, "unknown_reasons_seen": unknown}


def decider_literals(path: Path) -> set[str]:
    """The path/reason pairs written in decider.py's returns (for the test that REASONS is whole)."""
    found: set[str] = set()
    for line in path.read_text().splitlines():
        m = re.search(r'(?:out\(|return \()"(local|remote|whole)", (.*)\)', line)
        if m:
            found |= {f"{m.group(1)}/{r}" for r in re.findall(r'"([a-z_]+)"', m.group(2))}
    return found
