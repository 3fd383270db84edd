"""The admission layer of every inbound door: what one peer, and all keys not yet known together,
may take from this node per second, checked before a handler does any work.

Keys are free, so a bound per peer alone bounds nothing: each door also has one pool shared by
every key the node does not yet know (`Doors.trust`: the learner knows the samplers it has proven),
and a known peer never draws on it, so a crowd of fresh keys slows only fresh keys. Each door
declares its `DoorBudget` in one place (`DOORS` below, next to the reason for each figure), and is
charged on what it actually serves or reads, never on what a caller claims. Open streams are
bounded separately and before any of this (budget.py): a stream costs a descriptor even unread.

What a door does past its budget is the door's own: a manifest long poll answers an empty reply at
once (the caller polls later), a chunk stream answers "not held" for the rest of its chunks (the
fetcher goes to another source), the rollout gate answers busy (admission.py of swarm/rollouts).
Every refusal is counted by door and reason (`Doors.stats`), and logged at 1, 10, 100... of each.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from typing import Callable

from swarm.buckets import TokenBuckets, worth_logging

log = logging.getLogger(__package__)

INF = math.inf


@dataclass(frozen=True)
class DoorBudget:
    """One door's budget: calls and bytes (served or read) per second, each with its burst, for one
    peer and for all unknown keys together (`pool_*`). INF: not bounded on that axis."""

    calls_per_s: float
    call_burst: float
    bytes_per_s: float = INF
    byte_burst: float = INF
    pool_calls_per_s: float = INF
    pool_call_burst: float = INF
    pool_bytes_per_s: float = INF
    pool_byte_burst: float = INF
    max_tarpit_s: float = INF
    """The longest a refused call of this door waits, below `TARPIT_MAX_S` where the door's callers
    must hear sooner (a chunk refusal says "not held", and a fetcher demotes a source silent for 3 s)."""
    why: str = ""
    """Where the figures come from: shown in DESIGN's table of doors and in `hetero-node` logs."""


_POOL = ""
"""The pool's bucket (no peer id is empty)."""
TARPIT_S = 1.0
"""The least a call turned away waits for its answer: a caller that asks again at once (a flood)
then makes at most (calls it keeps in flight) / TARPIT_S calls a second; refusing at once kept one
key at 2,397 empty manifest replies a second. An honest caller told "busy" waits about this long
anyway before it asks again (reach.RETRY_S, the fetcher's next source)."""
TARPIT_MAX_S = 10.0
"""The most: what any peer can make this node hold one request open for (weights' MAX_REQUEST_WAIT).
Between the two, a refused call waits until the bound it met has refilled (`Door.refill_s`): the
time its budget's rate needs, so the wait follows each door's figures, not one constant: a peer 2
GiB into its chunk bytes at 64 MiB/s waits the 10 s cap, a manifest caller at 1 call/s one second."""
TARPIT_PER_PEER = 64
TARPIT_ALL = 4096
"""Calls waiting in the tarpit, per peer and in all (each is a task and its small request): past
either, turned-away calls are answered at once."""


class Door:
    """One door's buckets and refusals. Not thread-safe: used from the node's event loop only."""

    def __init__(self, name: str, budget: DoorBudget, trusted: Callable[[str], bool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.budget, self._trusted = name, budget, trusted
        b = budget
        self._calls = TokenBuckets(b.calls_per_s, b.call_burst, clock=clock)
        self._bytes = TokenBuckets(b.bytes_per_s, b.byte_burst, clock=clock)
        self._pool_calls = TokenBuckets(b.pool_calls_per_s, b.pool_call_burst, clock=clock)
        self._pool_bytes = TokenBuckets(b.pool_bytes_per_s, b.pool_byte_burst, clock=clock)
        self.refused: collections.Counter[str] = collections.Counter()
        """Calls turned away (or cut short), by the bound they met."""
        self.served = 0
        """Bytes charged to this door (served or read), all peers."""
        self._held: collections.Counter[str] = collections.Counter()
        self._held_all = 0
        """Calls of every peer in the tarpit now (kept, not summed: a flood calls `tarpit` per call)."""

    def resize(self, **figures: float) -> None:
        """Change some of the budget's figures (`DoorBudget` field names): for those that follow what
        the door guards, as a chunk door's bursts follow the largest version it holds."""
        self.budget = b = dataclasses.replace(self.budget, **figures)
        for buckets, rate, burst in ((self._calls, b.calls_per_s, b.call_burst),
                                     (self._bytes, b.bytes_per_s, b.byte_burst),
                                     (self._pool_calls, b.pool_calls_per_s, b.pool_call_burst),
                                     (self._pool_bytes, b.pool_bytes_per_s, b.pool_byte_burst)):
            buckets.rate, buckets.burst = rate, burst

    def enter(self, peer: str) -> str | None:
        """A call of `peer`: the bound it is past (counted and logged), or None with one call taken
        from its budget (and the pool's, unless trusted). A peer whose bytes are spent is turned
        away too: its call could only be cut short."""
        pooled = not self._trusted(peer)
        why = ("calls" if self._calls.available(peer) < 1 else
               "bytes" if self._bytes.available(peer) <= 0 else
               "pool_calls" if pooled and self._pool_calls.available(_POOL) < 1 else
               "pool_bytes" if pooled and self._pool_bytes.available(_POOL) <= 0 else None)
        if why is not None:
            return self._refuse(peer, why)
        self._calls.charge(peer, 1)
        if pooled:
            self._pool_calls.charge(_POOL, 1)
        return None

    def allows(self, peer: str, nbytes: int) -> str | None:
        """Whether `nbytes` more may be served to (or read from) `peer` now: the bound it is past
        (counted), or None. A peer (and the pool) with any budget left gets one more item, so a
        burst smaller than an item never stops a peer for good; the debt is paid back at the rate."""
        if self._bytes.available(peer) <= 0:
            return self._refuse(peer, "bytes")
        if not self._trusted(peer) and self._pool_bytes.available(_POOL) <= 0:
            return self._refuse(peer, "pool_bytes")
        return None

    def charge(self, peer: str, nbytes: int) -> None:
        """`nbytes` were served to (or read from) `peer`."""
        self.served += nbytes
        self._bytes.charge(peer, nbytes)
        if not self._trusted(peer):
            self._pool_bytes.charge(_POOL, nbytes)

    def refill_s(self, peer: str, why: str) -> float:
        """Seconds until `peer` would be let past the bound `why` again (0 if it is now)."""
        b = self.budget
        tokens, rate, need = {
            "calls": (self._calls.available(peer), b.calls_per_s, 1.0),
            "bytes": (self._bytes.available(peer), b.bytes_per_s, 1.0),  # let in once in credit
            "pool_calls": (self._pool_calls.available(_POOL), b.pool_calls_per_s, 1.0),
            "pool_bytes": (self._pool_bytes.available(_POOL), b.pool_bytes_per_s, 1.0),
        }[why]
        return max(0.0, need - tokens) / rate if rate > 0 else INF

    def tarpit_s(self, peer: str, why: str) -> float:
        return min(self.budget.max_tarpit_s, TARPIT_MAX_S, max(TARPIT_S, self.refill_s(peer, why)))

    async def tarpit(self, peer: str, why: str = "calls") -> None:
        """Hold a call turned away past the bound `why` until that bound refills, at least TARPIT_S
        and at most TARPIT_MAX_S (unless too many already wait: then it is answered at once)."""
        if self._held[peer] >= TARPIT_PER_PEER or self._held_all >= TARPIT_ALL:
            return
        self._held[peer] += 1
        self._held_all += 1
        try:
            await asyncio.sleep(self.tarpit_s(peer, why))
        finally:
            self._held_all -= 1
            self._held[peer] -= 1
            if self._held[peer] <= 0:
                del self._held[peer]

    def _refuse(self, peer: str, why: str) -> str:
        self.refused[why] += 1
        n = self.refused[why]
        if worth_logging(n):
            log.warning("%s: a call of %s past its %s budget (%d so far)", self.name, peer[-8:], why, n)
        return why


class Doors:
    """Every inbound door of one node, by name; what the node trusts (`trust`) decides who draws on
    the pools. Until told otherwise, no key is trusted: every peer draws on every pool."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._doors: dict[str, Door] = {}
        self._trusted: Callable[[str], bool] = lambda peer: False

    def trust(self, trusted: Callable[[str], bool]) -> None:
        """Keys for which `trusted(peer)` holds draw on their own budgets only (the learner: the
        samplers it has proven). Called from the role that knows (once its state is loaded)."""
        self._trusted = trusted

    def is_trusted(self, peer: str) -> bool:
        return self._trusted(peer)

    def open(self, name: str, budget: DoorBudget) -> Door:
        """The door `name` with `budget` (one per name: opening it twice is a bug)."""
        if name in self._doors:
            raise ValueError(f"door {name} is already open")
        door = self._doors[name] = Door(name, budget, self.is_trusted, clock=self._clock)
        return door

    def stats(self) -> dict[str, dict[str, int]]:
        """door -> {bound: calls refused, "bytes": bytes charged}."""
        return {name: {**d.refused, "bytes": d.served} for name, d in self._doors.items()}
