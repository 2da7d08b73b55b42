"""Per-engine cost models that calibrate themselves from what the gateway observes.

Two straight lines per engine, each fitted online by weighted least squares over decayed sums
(recent observations count most, so a model follows a changed machine or model):

- prefill: seconds from handing a prompt to a prefill engine until its prefill returns, as
  a + b·n for n uncached prompt tokens, timed on hops that queued behind nothing; b is the
  engine's cost per prompt token, a the hops, the scheduling and the first step. A queue of
  q tokens ahead is predicted to add b·q (decider.py).
- step: one decode step's seconds, as c + d·batch (running sequences), from the mean token
  gap each decode engine reports over its last routing-stats period.

And per decode engine, `handoff`: the seconds from the gateway's call to it after a remote
prefill until its first token (the KV pull, the hop, a step), the gap a client sees between the
answer's first token (the prefill's) and its second; its decayed mean and spread give the gap
one request in ten sees (`p90`: mean + 1.28 standard deviations, as for a normal spread).

The prior is two pseudo-observations on a line measured on the 2-core test VM (loadtest/bench/
RESULTS.md: 128 / 1500-token prompts ~0.28 / ~3.0 s through tandem, an unloaded decode step
~35-40 ms); it keeps the fit sane until data arrive, is outweighed after a few observations
and decays like them.

Everything here is pure: `observe` returns a new frozen value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# Older observations count this much less per new one: ~20 observations' memory.
DECAY = 0.95
PRIOR_WEIGHT = 2.0  # the prior line counts as this many observations, decaying like them


@dataclass(frozen=True)
class LinearFit:
    """y ≈ a + b·x by decayed weighted least squares. It starts from a prior line, as
    pseudo-observations at x = 0 and x = x_ref that decay like data, so data outweigh it after
    a few observations and it is forgotten after a few dozen. a and b never go negative."""

    prior_b: float  # the slope when the data span no range of x
    sw: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    data_weight: float = 0.0  # the decayed weight of real observations

    @classmethod
    def prior(cls, a: float, b: float, x_ref: float, weight: float = PRIOR_WEIGHT) -> "LinearFit":
        w = weight / 2
        y_ref = a + b * x_ref
        return cls(prior_b=b, sw=2 * w, sx=w * x_ref, sy=w * (a + y_ref), sxx=w * x_ref * x_ref,
                   sxy=w * x_ref * y_ref)

    def observe(self, x: float, y: float, decay: float = DECAY) -> "LinearFit":
        if x < 0 or y < 0:
            return self
        return replace(self, sw=self.sw * decay + 1.0, sx=self.sx * decay + x, sy=self.sy * decay + y,
                       sxx=self.sxx * decay + x * x, sxy=self.sxy * decay + x * y,
                       data_weight=self.data_weight * decay + 1.0)

    @property
    def observations(self) -> float:
        """The decayed weight of the data (the prior not counted)."""
        return self.data_weight

    def coefficients(self) -> tuple[float, float]:
        if self.sw <= 0:
            return 0.0, self.prior_b
        var = self.sxx - self.sx * self.sx / self.sw
        b = (self.sxy - self.sx * self.sy / self.sw) / var if var > 1e-9 * max(self.sxx, 1.0) else self.prior_b
        b = max(b, 0.0)
        a = max((self.sy - b * self.sx) / self.sw, 0.0)
        return a, b

    def predict(self, x: float) -> float:
        a, b = self.coefficients()
        return a + b * max(x, 0.0)


# Priors (seconds; see the module docstring). Prefill: 2 ms per prompt token, 90 ms of path.
PREFILL_PRIOR = LinearFit.prior(a=0.09, b=0.002, x_ref=1024)
# Decode step: 35 ms unloaded, +1 ms per running sequence.
STEP_PRIOR = LinearFit.prior(a=0.035, b=0.001, x_ref=8)


@dataclass(frozen=True)
class DecayedSpread:
    total: float = 0.0
    squares: float = 0.0
    weight: float = 0.0

    def observe(self, y: float, decay: float = DECAY) -> "DecayedSpread":
        if y < 0:
            return self
        return DecayedSpread(self.total * decay + y, self.squares * decay + y * y, self.weight * decay + 1.0)

    @property
    def mean(self) -> float:
        """0 until observed."""
        return self.total / self.weight if self.weight > 0 else 0.0

    @property
    def p90(self) -> float:
        if self.weight <= 0:
            return 0.0
        variance = max(self.squares / self.weight - self.mean ** 2, 0.0)
        return self.mean + 1.28 * variance ** 0.5


@dataclass(frozen=True)
class EngineCostModel:
    """One engine's two lines. A prefill engine calibrates `prefill`, a decode engine `step`;
    local prefill on a decode engine is costed with the prefill slope of the prefill engine
    it would otherwise use (same hardware in a pool pair; decode never times its own)."""

    prefill: LinearFit = PREFILL_PRIOR
    step: LinearFit = STEP_PRIOR
    handoff: DecayedSpread = DecayedSpread()

    def observe_prefill(self, tokens: float, seconds: float) -> "EngineCostModel":
        return replace(self, prefill=self.prefill.observe(tokens, seconds))

    def observe_step(self, batch: float, seconds: float) -> "EngineCostModel":
        return replace(self, step=self.step.observe(batch, seconds))

    def observe_handoff(self, seconds: float) -> "EngineCostModel":
        return replace(self, handoff=self.handoff.observe(seconds))

    def handoff_s(self) -> float:
        """The handoff's gap one request in ten sees (0 until observed)."""
        return self.handoff.p90

    def prefill_s(self, tokens: float) -> float:
        return self.prefill.predict(tokens)

    def per_token_s(self) -> float:
        return self.prefill.coefficients()[1]

    def step_s(self, batch: float) -> float:
        return self.step.predict(batch)
