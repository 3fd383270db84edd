"""Every inbound door of a node, and its budget: what one peer, and all the keys the node has not
proven together, may take from it per second, checked before a handler does any work.

Keys are free, so a bound per peer alone bounds nothing: each door also has one pool shared by
every key the node has not proven (`Doors.set_proven`: a learner proves the samplers whose first
groups passed their audits; other nodes prove nobody), and a proven peer never draws on it, so a
crowd of fresh keys slows only fresh keys. Every door's budget is declared in `DOORS` below, next to
the reason for each figure, and a door is charged on what it actually serves or reads, never on
what a caller claims. Open streams are bounded separately and before any of this (budget.py): a
stream costs a descriptor even unread.

What a door does past its budget is the door's own: a manifest long poll answers an empty reply
(the caller polls later), a chunk stream answers "not held" (the fetcher goes to another source),
the rollout gate answers busy (swarm/rollouts/admission.py, which adds what each sampler holds at
the learner to the door's rates), a reach probe answers busy. Every call turned away waits in the
door's tarpit first, and every refusal is counted by door and bound (`Doors.stats`) and logged at
the 1st, 10th, 100th... of each.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import logging
import math
import time
from dataclasses import dataclass
from typing import Callable

from swarm.buckets import TokenBuckets, worth_logging
from swarm.exchange import IntakeConfig
from swarm.wire.batch import ROLLOUTS
from swarm.wire.chunks import CHUNKS, MAX_REQUEST_WAIT
from swarm.wire.directory import DIRECTORY
from swarm.wire.manifest import MANIFEST, TAIL
from swarm.wire.model_files import MAX_BUNDLE, MODEL_FILES
from swarm.wire.reach import REACH

log = logging.getLogger(__package__)

INF = math.inf
MiB = 1 << 20


class Bound(enum.StrEnum):
    """The bound of a door a call (or a byte) is past."""

    CALLS = "calls"
    BYTES = "bytes"
    UNPROVEN_CALLS = "unproven_calls"
    """The calls of every key the node has not proven, together."""
    UNPROVEN_BYTES = "unproven_bytes"


TARPIT_S = 1.0
"""The least a call turned away waits for its answer: a caller that asks again at once (a flood)
then makes at most (calls it keeps in flight) / TARPIT_S calls a second; refusing at once kept one
key at 2,397 empty manifest replies a second. An honest caller told "busy" waits about this long
anyway before it asks again (reach.RETRY_S, the fetcher's next source)."""
TARPIT_MAX_S = MAX_REQUEST_WAIT
"""The most: what any peer can make this node hold one request open for. Between the two, a refused
call waits until the bound it met has refilled (`Door.refill_s`): the time its budget's rate needs,
so the wait follows each door's figures, not one constant: a peer 2 GiB into its chunk bytes at
64 MiB/s waits the 10 s cap, a manifest caller at 1 call/s one second."""
TARPIT_ALL = 4096
"""Calls waiting in one door's tarpit, all peers together: past it, turned-away calls are answered at once."""
TARPIT_BYTES = 64 * MiB
"""Payload bytes the calls in one door's tarpit may hold, all peers together (a rollout call waits
with its batch: a thousand keys must not make the tarpit hold gigabytes)."""


@dataclass(frozen=True)
class DoorBudget:
    """One door's budget: calls and bytes (served or read) per second, each with its burst, for one
    peer and for all unproven keys together (`unproven_*`), and its tarpit. INF: not bounded on that
    axis."""

    calls_per_s: float
    call_burst: float
    bytes_per_s: float = INF
    byte_burst: float = INF
    unproven_calls_per_s: float = INF
    unproven_call_burst: float = INF
    unproven_bytes_per_s: float = INF
    unproven_byte_burst: float = INF
    min_tarpit_s: float = TARPIT_S
    max_tarpit_s: float = TARPIT_MAX_S
    """A refused call of this door waits between these: below `TARPIT_MAX_S` where the door's
    callers must hear sooner (a chunk refusal says "not held", and a fetcher demotes a source silent
    for 3 s)."""
    tarpit_per_peer: int = 64
    """Calls of one peer waiting in the tarpit at once; past it, its turned-away calls are answered at once."""
    why: str = ""
    """Where the figures come from: shown in DESIGN's table of doors and in the node's logs."""


FAST_LINE = 125_000_000
"""Bytes a second of 1 Gbit/s, the fastest volunteer line we plan for: one peer's chunk rate, so an
honest fetch, whatever its line, is never slowed by the door."""


def rollouts_budget(cfg: IntakeConfig, tarpit_s: float = TARPIT_S) -> DoorBudget:
    """The learner's rollout gate (`[learner.intake]`): a call of this door is one record checked."""
    return DoorBudget(
        calls_per_s=cfg.rate, call_burst=cfg.quota, bytes_per_s=cfg.byte_rate, byte_burst=cfg.byte_rate,
        unproven_calls_per_s=cfg.unproven_rate, unproven_call_burst=cfg.unproven_quota,
        unproven_bytes_per_s=cfg.unproven_byte_rate, unproven_byte_burst=cfg.unproven_byte_rate,
        min_tarpit_s=tarpit_s, max_tarpit_s=tarpit_s, tarpit_per_peer=4,
        why="checking a record costs the learner CPU (a signature, a decode, a detokenisation) even when it refuses "
            "it, and its bytes are read before anything else: records checked and bytes read per second, per sampler "
            "and for all unproven keys, with the groups and journal bytes each holds (admission.py's rooms); a "
            "turned-away call waits a fixed second with its payload, at most 4 of a peer")


DOORS: dict[str, DoorBudget] = {
    MANIFEST: DoorBudget(
        calls_per_s=1.0, call_burst=8, unproven_calls_per_s=32.0, unproven_call_burst=64,
        why="a sampler long-polls: one call per version published or per wait (<= MAX_REQUEST_WAIT s), a few more "
            "when it starts or fails over; a sealed manifest costs little to send but one key asking 32 at a time "
            "made 2,249 replies/s (0.92 of a core): 32 a second for all unproven keys is ~1% of that"),
    TAIL: DoorBudget(
        calls_per_s=1.0, call_burst=8, unproven_calls_per_s=64.0, unproven_call_burst=256,
        why="a sampler sent a TailNotice asks one relay a version (three at most, then the learner), and a relay "
            "is asked by about 1 in 8 of its learner's samplers at once when a version is published (1,000 "
            "samplers: 125). Its mates (samplers the learner credits, as the notices' readers are) each have "
            "their own budget; every other key draws on the pool, whose rate bounds what keys that read the "
            "digest from notices can take to 64 tails a second (3.4 kB each at 80 chunks a version: 1.7 Mbit/s "
            "of a relay's upload), and whose burst holds one version's askers whose mate lists lag"),
    CHUNKS: DoorBudget(
        calls_per_s=8.0, call_burst=64, bytes_per_s=FAST_LINE, byte_burst=64 * MiB,
        unproven_calls_per_s=64.0, unproven_call_burst=256, unproven_bytes_per_s=64 * MiB, unproven_byte_burst=64 * MiB,
        max_tarpit_s=1.0,  # "not held" must reach an honest fetcher before its hedge_s (3 s) demotes us
        why="a fetcher opens up to 4 streams per source per version, each asking many chunks; a peer may take a "
            "whole version at its line rate: the byte bursts grow to the largest version the node holds "
            "(`ChunkStore.put`: a 0.6B keyframe in bf16 is 1.2 GB, a 7B one 15 GB; 64 MiB before any) and one "
            "peer's rate is a 1 Gbit/s line; keys the node does not know share one 64 MiB/s (~540 Mbit/s, more "
            "than most volunteers' downlinks), so any number of fresh keys cost the uplink at most that. Repeats "
            "are bounded apart (MAX_REPEATS): one key asking the newest keyframe again and again drew 178 MB/s "
            "from the learner (issue 39)"),
    REACH: DoorBudget(
        calls_per_s=1.0, call_burst=4,
        why="a joiner asks once (again after a busy answer, about once a second); no pool: every key is new to a "
            "bootstrap, and the slots per address bound the probes' cost"),
    ROLLOUTS: rollouts_budget(IntakeConfig()),
    DIRECTORY: DoorBudget(
        calls_per_s=1.0, call_burst=8, bytes_per_s=2 * MiB, byte_burst=4 * MiB,
        unproven_calls_per_s=128.0, unproven_call_burst=256, unproven_bytes_per_s=16 * MiB, unproven_byte_burst=16 * MiB,
        why="a node asks each coordinator once per refresh (10 s; a leaderboard once per --poll, >= 2 s), each learner it reads once, a few more when it "
            "joins; a reply is a few records of ~1 KB, or a tally (<= 1 MiB) when one changed: a bootstrap answers "
            "1,280 unproven samplers refreshing every 10 s within the pool, and any number of fresh keys take at "
            "most 16 MiB/s of its uplink (proven here: the peers the node favours, swarm/directory/book.py)"),
    MODEL_FILES: DoorBudget(
        calls_per_s=4.0, call_burst=MAX_BUNDLE // (1 << 20), bytes_per_s=8 * MiB, byte_burst=MAX_BUNDLE,
        unproven_calls_per_s=32.0, unproven_call_burst=256, unproven_bytes_per_s=16 * MiB, unproven_byte_burst=MAX_BUNDLE,
        why="a sampler given no model fetches the learner's bundle (config and tokenizer, ~2.4 MB packed for Qwen3) "
            "once when it first joins, a part (1 MiB) a call: one peer may take the largest bundle at once, then 8 MiB/s; "
            "all unproven keys share 16 MiB/s, so 1,000 volunteers joining at once have theirs within ~2.5 min and "
            "any number of fresh keys take at most that of the learner's uplink"),
}
"""Every inbound door's budget (the rollout gate's as `[learner.intake]`'s defaults make it; a learner
opens it with its own). The streams a door's calls hold open are bounded before any door: budget.py."""


class Tarpit:
    """Where one door's turned-away calls wait before they are answered, within its bounds: a few
    calls a peer, `TARPIT_ALL` calls and `TARPIT_BYTES` of held payload in all; past them a call is
    answered at once."""

    def __init__(self, per_peer: int, max_calls: int = TARPIT_ALL, max_bytes: int = TARPIT_BYTES) -> None:
        self.per_peer, self.max_calls, self.max_bytes = per_peer, max_calls, max_bytes
        self._held: collections.Counter[str] = collections.Counter()
        self._calls = 0
        self._bytes = 0
        self.count = 0
        """Calls answered only after the tarpit, so far."""

    async def hold(self, peer: str, seconds: float, nbytes: int = 0) -> None:
        if (self._held[peer] >= self.per_peer or self._calls >= self.max_calls
                or self._bytes + nbytes > self.max_bytes):
            return
        self._held[peer] += 1
        self._calls += 1
        self._bytes += nbytes
        self.count += 1
        try:
            await asyncio.sleep(seconds)
        finally:
            self._calls -= 1
            self._bytes -= nbytes
            self._held[peer] -= 1
            if self._held[peer] <= 0:
                del self._held[peer]


class Door:
    """One door's buckets, refusals and tarpit. Not thread-safe: used from the node's event loop only."""

    def __init__(self, name: str, budget: DoorBudget, proven: Callable[[str], bool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.budget, self._proven = name, budget, proven
        b = budget
        self._buckets = {
            Bound.CALLS: TokenBuckets(b.calls_per_s, b.call_burst, clock=clock),
            Bound.BYTES: TokenBuckets(b.bytes_per_s, b.byte_burst, clock=clock),
            Bound.UNPROVEN_CALLS: TokenBuckets(b.unproven_calls_per_s, b.unproven_call_burst, clock=clock),
            Bound.UNPROVEN_BYTES: TokenBuckets(b.unproven_bytes_per_s, b.unproven_byte_burst, clock=clock),
        }
        self.refused: collections.Counter[Bound] = collections.Counter()
        """Calls turned away (or cut short), by the bound they met."""
        self.served = 0
        """Bytes charged to this door (served or read), all peers."""
        self._tarpit = Tarpit(b.tarpit_per_peer)

    @property
    def tarpitted(self) -> int:
        """Calls answered only after the tarpit, so far."""
        return self._tarpit.count

    def resize(self, **figures: float) -> None:
        """Change some of the budget's figures (`DoorBudget` field names): for those that follow what
        the door guards, as a chunk door's bursts follow the largest version it holds."""
        self.budget = b = dataclasses.replace(self.budget, **figures)
        for bound, rate, burst in ((Bound.CALLS, b.calls_per_s, b.call_burst), (Bound.BYTES, b.bytes_per_s, b.byte_burst),
                                   (Bound.UNPROVEN_CALLS, b.unproven_calls_per_s, b.unproven_call_burst),
                                   (Bound.UNPROVEN_BYTES, b.unproven_bytes_per_s, b.unproven_byte_burst)):
            self._buckets[bound].rate, self._buckets[bound].burst = rate, burst

    def is_proven(self, peer: str) -> bool:
        return self._proven(peer)

    def left(self, bound: Bound, peer: str) -> float:
        """What is left of `bound` now (`peer`'s own, or the unproven keys' pool)."""
        pool = bound in (Bound.UNPROVEN_CALLS, Bound.UNPROVEN_BYTES)
        return self._buckets[bound].available("" if pool else peer)  # no peer id is empty

    def past(self, peer: str, unproven: bool) -> Bound | None:
        """The first bound a call of `peer` is past now, not counted: its calls, any of its bytes, and,
        `unproven`, the pool's. A peer with any bytes left is let in once in credit, so a burst smaller
        than an item never stops a peer for good; the debt is paid back at the rate."""
        checks = [(Bound.CALLS, 1.0), (Bound.BYTES, 0.0)]
        if unproven:
            checks += [(Bound.UNPROVEN_CALLS, 1.0), (Bound.UNPROVEN_BYTES, 0.0)]
        return next((bound for bound, need in checks if (self.left(bound, peer) < 1 if need else
                                                         self.left(bound, peer) <= 0)), None)

    def enter(self, peer: str) -> Bound | None:
        """A call of `peer`: the bound it is past (counted and logged), or None with one call taken
        from its budget (and the pool's, unless proven)."""
        unproven = not self._proven(peer)
        why = self.past(peer, unproven)
        if why is not None:
            return self._refuse(peer, why)
        self.take_calls(peer, 1, unproven)
        return None

    def take_calls(self, peer: str, n: float, unproven: bool) -> None:
        self._buckets[Bound.CALLS].charge(peer, n)
        if unproven:
            self._buckets[Bound.UNPROVEN_CALLS].charge("", n)

    def allows(self, peer: str, nbytes: int) -> Bound | None:
        """Whether `nbytes` more may be served to (or read from) `peer` now: the bound it is past
        (counted), or None (see `past` on credit)."""
        if self.left(Bound.BYTES, peer) <= 0:
            return self._refuse(peer, Bound.BYTES)
        if not self._proven(peer) and self.left(Bound.UNPROVEN_BYTES, peer) <= 0:
            return self._refuse(peer, Bound.UNPROVEN_BYTES)
        return None

    def charge(self, peer: str, nbytes: int, unproven: bool | None = None) -> None:
        """`nbytes` were served to (or read from) `peer`: its bytes, and the pool's if `unproven` (by
        default: unless proven)."""
        self.charge_peer(peer, nbytes)
        if (not self._proven(peer)) if unproven is None else unproven:
            self.charge_unproven(nbytes)

    def charge_peer(self, peer: str, nbytes: int) -> None:
        """`nbytes` on `peer`'s own budget only (the rollout gate: the bytes a caller declares)."""
        self.served += nbytes
        self._buckets[Bound.BYTES].charge(peer, nbytes)

    def charge_unproven(self, nbytes: int) -> None:
        """`nbytes` on the unproven keys' pool only (the rollout gate: what was actually read)."""
        self._buckets[Bound.UNPROVEN_BYTES].charge("", nbytes)

    def refill_s(self, peer: str, why: Bound) -> float:
        """Seconds until `peer` would be let past the bound `why` again (0 if it is now)."""
        b = self.budget
        rate = {Bound.CALLS: b.calls_per_s, Bound.BYTES: b.bytes_per_s, Bound.UNPROVEN_CALLS: b.unproven_calls_per_s,
                Bound.UNPROVEN_BYTES: b.unproven_bytes_per_s}[why]
        return max(0.0, 1.0 - self.left(why, peer)) / rate if rate > 0 else INF  # bytes: let in once in credit

    def tarpit_s(self, peer: str, why: Bound | None) -> float:
        """How long a call turned away past `why` waits (None: a bound of the door's caller, not its
        buckets: the least)."""
        refill = self.refill_s(peer, why) if why is not None else 0.0
        return min(self.budget.max_tarpit_s, TARPIT_MAX_S, max(self.budget.min_tarpit_s, refill))

    async def tarpit(self, peer: str, why: Bound | None = Bound.CALLS, nbytes: int = 0) -> None:
        """Hold a call turned away past the bound `why` (with `nbytes` of its payload) until that bound
        refills, within the door's tarpit bounds (`Tarpit`: past them it is answered at once)."""
        await self._tarpit.hold(peer, self.tarpit_s(peer, why), nbytes)

    def _refuse(self, peer: str, why: Bound) -> Bound:
        self.refused[why] += 1
        n = self.refused[why]
        if worth_logging(n):
            log.warning("%s: a call of %s past its %s budget (%d so far)", self.name, peer[-8:], why, n)
        return why


class Doors:
    """Every inbound door of one node, by name; who the node has proven (`set_proven`) decides who
    draws on the pools. Until told otherwise, no key is proven: every peer draws on every pool."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._doors: dict[str, Door] = {}
        self._proven: Callable[[str], bool] = lambda peer: False

    def set_proven(self, proven: Callable[[str], bool]) -> None:
        """Keys for which `proven(peer)` holds draw on their own budgets only (the learner: the
        samplers whose first groups passed their audits). Called from the role that knows, once its
        state is loaded."""
        self._proven = proven

    def is_proven(self, peer: str) -> bool:
        return self._proven(peer)

    def open(self, name: str, budget: DoorBudget | None = None, proven: Callable[[str], bool] | None = None) -> Door:
        """The door `name`, with its budget in `DOORS` unless given (one per name: opening it twice is a
        bug); `proven` adds keys this door alone does not charge to its pools."""
        if name in self._doors:
            raise ValueError(f"door {name} is already open")
        also = proven
        check = self.is_proven if also is None else (lambda peer: self.is_proven(peer) or also(peer))
        door = self._doors[name] = Door(name, budget or DOORS[name], check, clock=self._clock)
        return door

    def stats(self) -> dict[str, dict[str, int]]:
        """door -> {bound: calls refused, "served_bytes": bytes charged, "tarpitted": calls held}."""
        return {name: {**d.refused, "served_bytes": d.served, "tarpitted": d.tarpitted} for name, d in self._doors.items()}
