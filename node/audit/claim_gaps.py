"""How far each sampler's claimed behaviour log-probs sit from the learner's own, measured on
the groups the learner checks anyway, and what `behaviour_logprobs = "auto"` decides from it.

Why per sampler: the gap is the sampler's engine's (its precision, kernels, batch shapes), not
the model's. A float32 engine on the learner's weights claims what the learner computes, to
rounding (k3 1e-13 to 1e-10 a token): recomputing its groups would cost a no-grad forward each
(34-54% of the training time on the built-in model) and change nothing. Any lower precision sits
orders of magnitude further (float16 ~1e-6 on the built-in model, bfloat16 3e-5 to 2e-4, a
151k-vocabulary shape in bfloat16 ~5e-3), and recomputing its groups never cost accuracy where
training on its claims did (docs/RESULTS.md section 6). So "auto" recomputes for every sampler
above a threshold in that gap, and for those not measured yet. A threshold among the engines
themselves (1e-3 once) let a sampler's estimate cross it as training lowered the policy's entropy,
and the switch from recomputed to claimed log-probs mid-run cost GRPO more than either alone.

Where the figures come from: every audit recomputes the claimed version's log-probs anyway
(node/audit.audit_margins), and so does every recomputed group (node/learner/behaviour.py). Both
are at the version the group claims, so the gap is engine numerics alone, not policy change.

What a sampler's estimate forgets: older tokens weigh less (a half-life in tokens), so an engine
that changes (a volunteer restarting in bfloat16) is seen within a few audits. At most
`MAX_SAMPLERS` are kept (keys are free); a forgotten sampler is unmeasured again, and is
recomputed until measured: forgetting errs on the costly side, never on the wrong one.
"""

from __future__ import annotations

import collections
import math
from typing import Any

HALF_LIFE_TOKENS = 16384
"""An estimate's memory: tokens measured this many tokens ago weigh half (~80 groups of the chain
task, ~16 of 1,024-token completions, ~1,000 of the arithmetic task's short answers)."""

MIN_TOKENS = 64
"""Tokens measured before an estimate is believed. A Gaussian gap's k3 per token has a relative
std of sqrt(2), so 64 tokens put the mean within +-18% (1 sigma): far more than it takes to tell
rounding from any low-precision engine (4 orders of magnitude apart), and one group's worth on
most tasks (the built-in arithmetic task's 4 short answers are fewer)."""

MAX_SAMPLERS = 4096
"""Samplers whose estimates are kept; the least recently measured is forgotten past it."""


def decayed(k3_sum: float, tokens: float, add_k3: float, add_tokens: int, half_life: float) -> tuple[float, float]:
    """(k3 sum, tokens) after `add_tokens` more tokens whose k3 sums to `add_k3`, as if they came one
    at a time: each token weighs 2^(-age / half_life), age in tokens counted since. So the count
    approaches half_life / ln 2 and one large batch weighs no more than a steady stream of it."""
    w = 0.5 ** (add_tokens / half_life)
    # the sum over the new tokens of 2^(-i / half_life), i = 0..n-1, taken as its integral (exact as n/h -> 0)
    fresh = (1 - w) * half_life / math.log(2) if math.isfinite(half_life) else float(add_tokens)
    return k3_sum * w + add_k3 / add_tokens * fresh, tokens * w + fresh


class ClaimGaps:
    """Each sampler's claimed log-probs' k3 per token against the learner's own (log q/p, as
    behaviour.Mismatch takes it), and whether "auto" recomputes its groups."""

    def __init__(self, threshold: float, half_life: float = HALF_LIFE_TOKENS, min_tokens: int = MIN_TOKENS,
                 max_samplers: int = MAX_SAMPLERS) -> None:
        self.threshold, self.half_life, self.min_tokens, self.max_samplers = threshold, half_life, min_tokens, max_samplers
        self._est: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def add(self, sampler: str, k3_sum: float, tokens: int) -> None:
        """Count `tokens` of `sampler`'s claims whose k3 against ours sums to `k3_sum`."""
        if tokens <= 0 or math.isnan(k3_sum):  # nothing measured, or NaN (never believed as "close")
            return
        self._est[sampler] = decayed(*self._est.pop(sampler, (0.0, 0.0)), k3_sum, tokens, self.half_life)
        while len(self._est) > self.max_samplers:
            self._est.popitem(last=False)

    def k3(self, sampler: str) -> float | None:
        """`sampler`'s k3 per token, None while fewer than `min_tokens` were measured."""
        k3_sum, tokens = self._est.get(sampler, (0.0, 0.0))
        # (> min - 1: a count of exactly min_tokens decays by a hair, 64 to 63.9 at the default half-life)
        return k3_sum / tokens if tokens > self.min_tokens - 1 else None

    def far(self, sampler: str) -> bool:
        """Whether "auto" recomputes `sampler`'s groups: its claims sit further than `threshold`
        from ours, or it is not measured yet."""
        k = self.k3(sampler)
        return k is None or k > self.threshold

    def stats(self) -> dict[str, Any]:
        """For the step record: samplers measured, how many of them sit far, the largest k3."""
        known = [k for s in self._est if (k := self.k3(s)) is not None]
        return {"measured": len(known), "far": sum(k > self.threshold for k in known),
                "k3_max": max(known, default=0.0)}

    def state_dict(self) -> dict[str, Any]:
        return {"est": {s: list(v) for s, v in self._est.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._est = collections.OrderedDict((s, (float(a), float(b))) for s, (a, b) in state.get("est", {}).items())
