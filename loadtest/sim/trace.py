"""What the real policies decided in a simulated run, with their inputs (the replay test reads
them; the report counts them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from router.routing.decider import Decision


@dataclass
class Trace:
    """What the real policies decided, with their inputs (for the replay test and the report)."""

    verdicts: list[tuple[tuple, Decision]] = field(default_factory=list)
    scaling: list[tuple] = field(default_factory=list)  # (rules, observation, state, decision, new state)
    paths: dict[str, int] = field(default_factory=dict)

    def clear(self) -> None:
        """Forget what was decided so far (a warm-up's verdicts count in no rate)."""
        self.verdicts.clear()
        self.scaling.clear()
        self.paths.clear()

    def reasons(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, d in self.verdicts:
            key = f"{d.path}/{d.reason}"
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))
