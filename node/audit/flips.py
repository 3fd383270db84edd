"""The audit's statistics: how often an honest engine's race picks differ from the auditor's, and
when a sampler's rare events are too many to be honest (a sequential likelihood-ratio test per
sampler, `FlipTest`), for two kinds of event: flips (its token is not the auditor's best) and
exceedances (its token's margin is past `AuditConfig.margin`: an honest engine's rounding does
that too, rarely, so one is evidence, not a verdict).
"""

from __future__ import annotations

import collections
import math




def flip_llr(flips: int, positions: int, rate: float, ratio: float) -> float:
    """log likelihood ratio of `flips` among `positions` under a flip rate ratio x `rate` (a
    sampler that chooses tokens) against `rate` (the highest honest one)."""
    alt = ratio * rate
    return flips * math.log(alt / rate) + (positions - flips) * math.log((1 - alt) / (1 - rate))


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a share k/n ((0, 1) for n = 0)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def wilson_upper(k: int, n: int) -> float:
    """Upper end of `wilson` (1 for n = 0)."""
    return wilson(k, n)[1]


class FlipRate:
    """The honest flip rate the flip test holds samplers to, measured on this learner's own model.

    Audits the budget affords it (node/audit/budget.py: the reference pass is the least urgent of
    an audit's costs) also run the model in REFERENCE_DTYPE (`audit_margins(reference=True)`) and
    count the positions where that honest engine's race pick is not the float32 one. The rate is
    twice the upper end of that share's 95% interval, at least FLOOR (kernels other than the
    learner's) and at most `cap` (AuditConfig.flip_rate: the highest honest rate measured on any
    model), so until enough positions are measured the cap holds. Why: the honest rate depends on
    the model by 10x (bfloat16: 0.34% on the built-in model, 4.3% on a 151k vocabulary), and a
    constant loose enough for the second lets a sampler that chooses tokens flip at 9% unrefused on
    the first (docs/BENCHMARKS.md). No count of positions ends the measurement: it goes on at what
    the budget leaves, and follows the model as it trains."""

    FACTOR = 2.0
    FLOOR = 0.005

    def __init__(self) -> None:
        self.flips = 0
        self.positions = 0

    def add(self, flips: int, positions: int) -> None:
        self.flips += flips
        self.positions += positions

    def rate(self, cap: float) -> float:
        if self.positions == 0:
            return cap
        return min(cap, max(self.FLOOR, self.FACTOR * wilson_upper(self.flips, self.positions)))

    def state_dict(self) -> dict:
        return {"flips": self.flips, "positions": self.positions}

    def load_state_dict(self, state: dict) -> None:
        self.flips, self.positions = int(state.get("flips", 0)), int(state.get("positions", 0))


class FlipTest:
    """A sequential probability ratio test of one sampler's events (flips, or exceedances), over all
    its audited positions.

    Each audited group adds `flip_llr` of its events and positions; the sampler is refused once the
    sum reaches the threshold. A sampler that picks within the tolerance flips more often; it gains
    ~1.4 per flip (ratio 4) and loses ~3 x rate per position.

    The sum has a floor, -log(SLACK x LIFETIME) = -16.1: without one a long honest record was credit
    ("credit goes only to checked work"): 1,000 audited groups of 800 positions with no exceedance
    banked 721 nats, and one edit a group then went unrefused for 1,092 groups. With the floor, a
    sampler's past buys at most 16.1 nats, ~12 events, and that sampler is refused at its 36th
    (tests/unit/node/test_race.py, by hand).

    The guarantee, for an honest engine whose events come at a rate <= `rate`: its likelihood ratio
    is a nonnegative supermartingale between floor hits, so by Ville's inequality the first stretch
    (from 1) reaches the threshold 1 / a' with probability <= a', and each stretch from the floor
    (1 / (SLACK x LIFETIME)) with probability <= a' / (SLACK x LIFETIME). A group starts at most one
    stretch, so over G audited groups P(refused) <= a' (1 + G / (SLACK x LIFETIME)); with
    a' = alarm / (1 + 1 / SLACK) that is <= `alarm` for any G <= LIFETIME (beyond it, it grows by
    alarm / (SLACK + 1) per LIFETIME more). The threshold is log(1.1) = 0.095 nats above the test
    without a floor: a fresh cheater needs 0.095 nats more, one group more at most where its groups
    each add 0.095 or more (one edit in 800 positions adds 0.67), more near the no-drift rate."""

    RATIO = 4.0
    """The alternative the test is most sensitive to: flips at 4 x the honest rate."""
    LIFETIME = 1_000_000
    """Audited groups of one sampler the alarm holds over: at a spot rate of 1% that is 1e8 groups
    trained from one key, 12 years of a learner training 16 groups a minute."""
    SLACK = 10
    """How much deeper the floor sits than 1 / LIFETIME: the stretches from it share 1 / (SLACK + 1)
    of the alarm, the first stretch the rest."""

    def __init__(self, rate: float, alarm: float, events: str = "flips") -> None:
        self.rate, self.events = rate, events
        """`rate`: the honest rate when `add` is given none; `events`: what they are, for `why`."""
        self.threshold = math.log((1 + 1 / self.SLACK) / alarm)
        self.floor = -math.log(self.SLACK * self.LIFETIME)
        self.last_rate = rate
        self.llr: dict[str, float] = {}
        self.flips: collections.Counter[str] = collections.Counter()
        self.positions: collections.Counter[str] = collections.Counter()
        """Events and positions since the sum last stood on the floor: what it holds (a refusal's
        reason quotes these; a lifetime's share could sit far under the rate while its last stretch
        is far over it)."""

    def add(self, peer: str, flips: int, positions: int, rate: float | None = None) -> bool:
        """Count one audited group's flips against `rate` (fixed before this group is seen, so
        the guarantee holds for any rate at least the honest one); True once `peer` is past the
        threshold."""
        self.last_rate = self.rate if rate is None else rate
        llr = self.llr.get(peer, 0.0) + flip_llr(flips, positions, self.last_rate, self.RATIO)
        if llr <= self.floor:  # a new stretch begins
            llr, self.flips[peer], self.positions[peer] = self.floor, 0, 0
        else:
            self.flips[peer] += flips
            self.positions[peer] += positions
        self.llr[peer] = llr
        return llr >= self.threshold

    def why(self, peer: str) -> str:
        return (f"audit statistic: {self.flips[peer]} {self.events} in {self.positions[peer]} audited positions (since its record "
                f"last stood on the test's floor), "
                f"more than an honest engine's {self.last_rate:.2%} (log likelihood ratio {self.llr[peer]:.1f} >= "
                f"{self.threshold:.1f})")

    def state_dict(self) -> dict:
        return {"llr": dict(self.llr), "flips": dict(self.flips), "positions": dict(self.positions)}

    def load_state_dict(self, state: dict) -> None:
        self.llr = {str(k): max(self.floor, float(v)) for k, v in state.get("llr", {}).items()}  # saved before the floor
        self.flips = collections.Counter(state.get("flips", {}))
        self.positions = collections.Counter(state.get("positions", {}))
