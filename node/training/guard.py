"""The divergence guard: the learner slows down when its policy runs away from the data.

Every step the learner measures k3 = mean over tokens of exp(d) - d - 1, d = log(q / p), between
the policy that sampled the batch (q, as claimed and gap-checked) and its own (p): how far it has
moved from the data it trains on. On-policy k3 is ~0; stale rollouts that every loss here corrects
keep it around 1e-3-2e-2 (docs/RESULTS.md); a runaway (the uncorrected `pg` at max delay 64, GEPO's
losing seeds, Algorithm-1 M2PO at 256) takes it past 0.1 and on to 1-19 while accuracy falls.

The guard scales the learning rate, multiplicatively, from that measurement:

    s <- max(s * down, min_scale)   if k3 > kl_high          (moving away: halve the step)
    s <- min(s * up, 1)             if k3 < kl_low           (settled: give the step back)
    s unchanged                     otherwise                 (the band between)
    lr_next = lr * s

so a runaway meets a step that shrinks geometrically while its data stays far, and the learner
returns to its lr once the samplers catch up (fresh rollouts bring k3 back down). On-policy k3
never reaches kl_low's band, so the guard costs an on-policy run nothing. Unlike an adaptive KL
penalty (PPO's, TRL's), it needs no reference model and adds no term to any loss: it works
with every stale loss, and its state is one number, saved with the learner's checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GuardConfig:
    """`[learner.guard]`: the divergence guard on the learning rate."""

    enabled: bool = True
    kl_high: float = 0.05
    """Above this step's k3 (behaviour vs learner, mean per token) the lr scale is cut by `down`."""
    kl_low: float = 0.02
    """Below it the scale grows back by `up`, up to 1."""
    down: float = 0.5
    up: float = 1.25
    min_scale: float = 1 / 16
    """The guard never takes the lr below lr x this (a stuck learner is no safer than a slow one)."""

    def __post_init__(self) -> None:
        if not (0 <= self.kl_low <= self.kl_high and 0 < self.down < 1 <= self.up and 0 < self.min_scale <= 1):
            raise ValueError("learner.guard: need 0 <= kl_low <= kl_high, 0 < down < 1 <= up, 0 < min_scale <= 1")


def guard_scale(scale: float, kl: float, cfg: GuardConfig) -> float:
    """The next step's lr scale from this step's k3 (module docstring); a NaN k3 (no step was
    measured) leaves it as it is."""
    if not cfg.enabled or math.isnan(kl):
        return 1.0 if not cfg.enabled else scale
    if kl > cfg.kl_high:
        return max(scale * cfg.down, cfg.min_scale)
    if kl < cfg.kl_low:
        return min(scale * cfg.up, 1.0)
    return scale
