"""Per-engine cost models that calibrate themselves from what the gateway observes.

Two straight lines per engine, each fitted online by weighted least squares over decayed sums
(recent observations count most, so a model follows a changed machine or model):

- prefill: seconds from handing a prompt to a prefill engine until its prefill returns, as
  a + b·n, where n = the prompt tokens that engine must compute before this one is done (the
  uncached tokens already queued there plus this prompt's own). b is the engine's cost per
  prompt token; a is the hops, the scheduling and the first step.
- step: one decode step's seconds, as c + d·batch (running sequences), from the mean token
  gap each decode engine reports over its last routing-stats period.

The prior is two pseudo-observations on a line measured on the 2-core test VM (cluster/bench/
RESULTS.md: 128 / 1500-token prompts ~0.28 / ~3.0 s through tandem, an unloaded decode step
~35-40 ms); it keeps the fit sane until data arrive, and is outweighed after a few observations.

Everything here is pure: `observe` returns a new frozen value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# Older observations count this much less per new one: ~20 observations' memory.
DECAY = 0.95
PRIOR_WEIGHT = 2.0  # the prior line counts as this many observations


@dataclass(frozen=True)
class LinearFit:
    """y ≈ a + b·x by decayed weighted least squares, with a prior line as pseudo-points at
    x = 0 and x = x_ref (each half the prior weight). a and b never go negative."""

    prior_a: float
    prior_b: float
    x_ref: float  # where the prior's second pseudo-point sits: a typical x
    sw: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def observe(self, x: float, y: float, decay: float = DECAY) -> "LinearFit":
        if x < 0 or y < 0:
            return self
        return replace(self, sw=self.sw * decay + 1.0, sx=self.sx * decay + x, sy=self.sy * decay + y,
                       sxx=self.sxx * decay + x * x, sxy=self.sxy * decay + x * y)

    @property
    def observations(self) -> float:
        """The decayed weight of the data (the prior not counted)."""
        return self.sw

    def coefficients(self) -> tuple[float, float]:
        w0 = PRIOR_WEIGHT / 2
        x1, y1 = self.x_ref, self.prior_a + self.prior_b * self.x_ref
        sw = self.sw + 2 * w0
        sx = self.sx + w0 * x1
        sy = self.sy + w0 * (self.prior_a + y1)
        sxx = self.sxx + w0 * x1 * x1
        sxy = self.sxy + w0 * x1 * y1
        var = sxx - sx * sx / sw
        b = (sxy - sx * sy / sw) / var if var > 1e-12 else self.prior_b
        b = max(b, 0.0)
        a = max((sy - b * sx) / sw, 0.0)
        return a, b

    def predict(self, x: float) -> float:
        a, b = self.coefficients()
        return a + b * max(x, 0.0)


# Priors (seconds; see the module docstring). Prefill: 2 ms per prompt token, 90 ms of path.
PREFILL_PRIOR = LinearFit(prior_a=0.09, prior_b=0.002, x_ref=1024)
# Decode step: 35 ms unloaded, +1 ms per running sequence.
STEP_PRIOR = LinearFit(prior_a=0.035, prior_b=0.001, x_ref=8)


@dataclass(frozen=True)
class EngineCostModel:
    """One engine's two lines. A prefill engine calibrates `prefill`, a decode engine `step`;
    local prefill on a decode engine is costed with the prefill slope of the prefill engine
    it would otherwise use (same hardware in a pool pair; decode never times its own)."""

    prefill: LinearFit = PREFILL_PRIOR
    step: LinearFit = STEP_PRIOR

    def observe_prefill(self, tokens: float, seconds: float) -> "EngineCostModel":
        return replace(self, prefill=self.prefill.observe(tokens, seconds))

    def observe_step(self, batch: float, seconds: float) -> "EngineCostModel":
        return replace(self, step=self.step.observe(batch, seconds))

    def prefill_s(self, tokens: float) -> float:
        return self.prefill.predict(tokens)

    def per_token_s(self) -> float:
        return self.prefill.coefficients()[1]

    def step_s(self, batch: float) -> float:
        return self.step.predict(batch)
