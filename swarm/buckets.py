"""Token buckets, the budget every door and a node's own costs are held to (swarm/p2p/doors.py,
node/learner/scoring_time.py): a module of the standard library alone, so both layers import it."""

from __future__ import annotations

import collections
import time
from typing import Callable


class TokenBuckets:
    """Per-peer token buckets: `rate` tokens a second, at most `burst` saved up; an LRU of peers.

    `take` grants whole tokens from what is there; `charge` takes what a peer already used, and may
    leave its bucket in debt (a call larger than the burst), which it then pays back at `rate`."""

    def __init__(self, rate: float, burst: float, max_peers: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.max_peers, self.clock = rate, burst, max_peers, clock
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def available(self, peer: str) -> float:
        tokens, last = self._buckets.get(peer, (self.burst, self.clock()))
        return min(self.burst, tokens + (self.clock() - last) * self.rate)

    def take(self, peer: str, want: int) -> int:
        """How many of `want` items `peer` may have checked now (each costs one token)."""
        tokens, now = self._refill(peer)
        grant = max(0, min(want, int(tokens)))
        self._store(peer, tokens - grant, now)
        return grant

    def charge(self, peer: str, amount: float) -> None:
        """Take `amount` tokens from `peer`, into debt if need be."""
        tokens, now = self._refill(peer)
        self._store(peer, tokens - amount, now)

    def _refill(self, peer: str) -> tuple[float, float]:
        now = self.clock()
        tokens, last = self._buckets.pop(peer, (self.burst, now))
        return min(self.burst, tokens + (now - last) * self.rate), now

    def _store(self, peer: str, tokens: float, now: float) -> None:
        self._buckets[peer] = (tokens, now)
        if len(self._buckets) > self.max_peers:
            self._buckets.popitem(last=False)


def worth_logging(n: int) -> bool:
    """Whether the n-th refusal of a kind gets a log line: the 1st, 10th, 100th, 1000th and every
    10,000th, so that a flood of them is seen without one line each."""
    return n in (1, 10, 100, 1000) or n % 10_000 == 0
