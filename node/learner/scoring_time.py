"""How much of the training thread each peer's text may take to score.

`node/tasks/bounded.py` bounds one group's scoring (1 s for a group of 8, at least 0.5 s), but a
pathology no pre-check knows (`\\boxed{(x+1)^{1000}}`) still costs that budget every time, and the
pool of unproven keys lets in ~8 groups a second: 8 such groups a second would hold the thread that
trains for good. So scoring time is a budget too, charged after each group with the seconds it took:
one bucket per proven key, and one for all unproven keys together (keys are free), each refilling at
`RATE_S` seconds a second. A group that arrives while its bucket is empty is not scored: dropped as
`scoring_time`, counted, never trained on.

Honest groups cost ~21 ms on average (math-verify on MATH/GSM8K-style answers, p99 128 ms a group
of 8: examples/bench_reward_budget.py), so a sampler sending 10 groups a second uses 0.21 s a second of
its 0.5; the unproven pool's 8 groups a second, 0.17 s of its 0.5. An attacker whose every group
runs to its deadline gets 0.5 s a second of the thread whatever its number of keys (the pool), and
proven keys, which passed audits with honest work, 0.5 s each, within their own quotas.
"""

from __future__ import annotations

import time
from typing import Callable

from swarm.exchange import TokenBuckets
from swarm.wire.reasons import Drop

RATE_S = 0.5
"""Seconds of scoring a second, per proven key and for all unproven keys together."""
BURST_GROUPS = 4
"""A bucket holds this many of the largest group's budgets: a sampler's burst of slow honest groups."""
MAX_KEYS = 4096
"""Proven keys with a bucket; the least recently charged is forgotten past it (full again: a key
that only a flood of keys could push out did honest work to be proven)."""
SCORING_TIME = Drop.SCORING_TIME
"""The drop reason of a group whose key's bucket (or the unproven keys') was empty."""


class ScoringTime:
    """Seconds of scoring left per proven key, and for the unproven ones together (the doors' token
    buckets, swarm/p2p/doors.py, in seconds); charged after the fact, so a bucket may go into debt."""

    def __init__(self, burst_s: float, rate_s: float = RATE_S, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._proven = TokenBuckets(rate_s, burst_s, max_keys, clock)
        self._pool = TokenBuckets(rate_s, burst_s, 1, clock)

    def allows(self, sampler: str, proven: bool) -> bool:
        """Whether `sampler`'s next group may be scored: its bucket (the pool's, if unproven) is not empty."""
        return (self._proven.available(sampler) if proven else self._pool.available("")) > 0

    def charge(self, sampler: str, proven: bool, seconds: float) -> None:
        """`seconds` of scoring spent on one of `sampler`'s groups (paid back at the rate before its next)."""
        if proven:
            self._proven.charge(sampler, seconds)
        else:
            self._pool.charge("", seconds)
