"""Injected delay, as in the GEPO paper's simulation of a WAN (docs/DESIGN.md, "Delay").

A delay model draws D in seconds from a seeded RNG: none, fixed, log-normal given a lower and
upper bound at a confidence level, or Weibull, optionally capped. The paper's 1.7B setting is
log-normal between 60 s and 1920 s at 0.995, i.e. mu = 5.83, sigma = 0.62 (`lognormal_params`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist

KINDS = ("none", "fixed", "lognormal", "weibull")


@dataclass(frozen=True)
class DelayConfig:
    kind: str = "none"
    fixed_s: float = 0.0
    lower_s: float = 60.0
    upper_s: float = 1920.0
    confidence: float = 0.995
    """P(lower_s <= D <= upper_s) for the log-normal, symmetric in log space."""
    weibull_shape: float = 1.5
    weibull_scale_s: float = 300.0
    max_s: float | None = None
    """Cap on D (the paper's 'max delay'); None for no cap."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"delay.kind must be one of {KINDS}, not {self.kind!r}")
        if self.kind == "lognormal" and not (0 < self.lower_s < self.upper_s and 0 < self.confidence < 1):
            raise ValueError("lognormal delay: need 0 < lower_s < upper_s and 0 < confidence < 1")
        if self.kind == "weibull" and (self.weibull_shape <= 0 or self.weibull_scale_s <= 0):
            raise ValueError("weibull delay: shape and scale must be > 0")


def lognormal_params(lower: float, upper: float, confidence: float) -> tuple[float, float]:
    """(mu, sigma) of ln D such that P(lower <= D <= upper) = confidence, centred in log space."""
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    mu = (math.log(lower) + math.log(upper)) / 2
    return mu, (math.log(upper) - math.log(lower)) / (2 * z)


def sample_delay(cfg: DelayConfig, rng: random.Random) -> float:
    """One delay in seconds (>= 0), capped at cfg.max_s."""
    if cfg.kind == "none":
        d = 0.0
    elif cfg.kind == "fixed":
        d = cfg.fixed_s
    elif cfg.kind == "lognormal":
        d = rng.lognormvariate(*lognormal_params(cfg.lower_s, cfg.upper_s, cfg.confidence))
    else:
        d = rng.weibullvariate(cfg.weibull_scale_s, cfg.weibull_shape)
    return min(d, cfg.max_s) if cfg.max_s is not None else d


class ReloadTimer:
    """The paper's weight-delay model for one sampler: after each load, wait a fresh D before the
    next one. Shared by the in-memory exchange and the real swarm, so both inject the same delay."""

    def __init__(self, cfg: DelayConfig, rng: random.Random) -> None:
        self.cfg = cfg
        self.rng = rng
        self.next_load = 0.0

    def due(self, now: float) -> bool:
        return now >= self.next_load

    def arm(self, now: float) -> None:
        self.next_load = now + sample_delay(self.cfg, self.rng)
