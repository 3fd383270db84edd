"""What the learner's door lets in: per-peer budgets, the unproven pool, the tarpit.

Fair share (`IntakeConfig`, swarm/exchange.py): per sampler, at most `quota` groups received and
not yet trained on, `journal_bytes` of its records in the journal not yet read by the learner,
`rate` records checked per second (checking costs the learner CPU, a signature, a decode, a
detokenisation, even for records it then refuses) and `byte_rate` bytes read per second, charged at
the door on the size the sender declares (a payload longer than declared is not read), so bytes
that cannot be decoded cost their sender as much as any, a key whose calls never carry their
payload pays for the payload all the same, and a sender past its budget is not read at all. At
most `MAX_OPEN_CALLS` of a peer's calls are past the door at once.

Keys are free, so a key the learner has not yet proven (`Intake.is_proven`: it passed its first
audits) also draws on one pool shared by every unproven key, with the same four bounds
(`unproven_*`): any number of fresh keys get what the pool holds, and proven samplers keep their
own budgets whatever they do. The pool's bytes are charged on what was actually read (`read`),
not on what a key declared: two keys declaring 3 MiB a call and sending nothing kept the pool in
debt, and a new honest sampler got nothing acknowledged for 160 s (issue 39); a declared payload
that never comes costs only its own key. (A partial payload is cut by the body's stall bound, so
what a key can have read for free is a few hundred KiB a minute per call.) Past any bound the items are answered "busy" with the bound's name:
not refused, not journaled, not even decoded; the sampler keeps them and sends them later. A call
that got nothing accepted (all busy or refused) is answered only after a tarpit, so a flooder that
calls again at once makes a few calls a second.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from swarm.exchange import Intake, IntakeConfig
from swarm.p2p import TokenBuckets, decrement
from swarm.wire.reasons import Busy

MAX_OPEN_CALLS = 2
"""Calls of one peer past the door at once (a sender makes one at a time): more are busy."""
TARPIT_S = 1.0
TARPIT_PER_PEER = 4
TARPIT_BYTES = 64 << 20
"""Payload bytes held by tarpitted calls, all peers together: past it calls are answered at once
(a waiting call keeps its payload, so a thousand keys must not make the tarpit hold gigabytes)."""

_POOL = ""
"""The one bucket of the unproven pool (no peer id is empty)."""


class Standing(enum.Enum):
    """What the learner knows of a key, which decides the budgets it draws on."""

    PROVEN = "proven"
    """Passed its first audits: its own budgets only."""
    UNPROVEN = "unproven"
    """Not yet audited: its own budgets and the pool's."""
    REFUSED = "refused"
    """Failed an audit: its items are refused by id, unopened, so it draws on no pool or room."""


class Holdings(Protocol):
    """What the samplers hold at the learner: groups not yet trained on, journal bytes not yet read."""

    def held(self, peer: str) -> tuple[int, int]:
        """(groups, bytes) of `peer`."""
        ...

    def holders(self) -> dict[str, tuple[int, int]]:
        """(groups, bytes) of every peer holding some group."""
        ...


@dataclass
class Room:
    """One bound on what a sampler may add (groups or bytes), its use, and what this call added."""

    why: str
    bound: float
    used: float
    per_record: bool = False
    """Counts records (a quota), not bytes."""

    def fits(self, size: int) -> bool:
        """Whether a record of `size` bytes fits; into an empty room one always does (so a bound
        below the largest record never stops a sampler for good)."""
        n = 1 if self.per_record else size
        return self.used == 0 or self.used + n <= self.bound

    def add(self, size: int) -> None:
        self.used += 1 if self.per_record else size


@dataclass
class Visit:
    """One call's standing and the rooms it may fill, looked up once at the door and once more for
    its batch (the learner may have read or trained on records in between)."""

    peer: str
    standing: Standing
    rooms: list[Room]

    @property
    def pooled(self) -> bool:
        """Draws on the unproven pool too."""
        return self.standing is Standing.UNPROVEN


def pool_bound(cap: int, used: int, mine: int, keys: int) -> int:
    """The unproven pool's bound as one key sees it: the pool's `cap`, or more while the key holds
    less than its fair share, cap // keys (keys: the unproven keys holding something, it included).

    A key that can never be proven (a foreign model's sampler: its groups are never audited) or a
    fast one would otherwise keep the pool full and starve every new key; with the fair share a
    new key always gets in at once while keys <= cap. The pool's use stays <= 2 x cap: each key
    can push it past `cap` only up to its own share, and the shares sum to <= cap."""
    return max(cap, used + max(0, cap // keys - mine))


class Admission:
    """The per-peer and pool budgets (the state of the four token buckets) and the checks against
    them; what a peer holds is read from `holdings`, its standing from the learner (`intake`)."""

    def __init__(self, cfg: IntakeConfig, intake: Intake, holdings: Holdings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg, self._intake, self._holdings = cfg, intake, holdings
        self._rate = TokenBuckets(cfg.rate, cfg.quota, clock=clock)
        self._pool_rate = TokenBuckets(cfg.unproven_rate, cfg.unproven_quota, clock=clock)
        self._bytes = TokenBuckets(cfg.byte_rate, cfg.byte_rate, clock=clock)
        self._pool_bytes = TokenBuckets(cfg.unproven_byte_rate, cfg.unproven_byte_rate, clock=clock)

    def visit(self, peer: str) -> Visit:
        if self._intake.is_refused(peer):
            return Visit(peer, Standing.REFUSED, [])
        standing = Standing.PROVEN if self._intake.is_proven(peer) else Standing.UNPROVEN
        return Visit(peer, standing, self._rooms(peer, standing))

    def door(self, visit: Visit, nbytes: int, open_calls: int) -> str | None:
        """Why a call is answered busy without being read, or None, having charged the `nbytes` the
        caller declared to its own byte budget: from here on they cost their sender, decodable or
        not, sent or not. Charged here rather than after the read, so that many calls of one key at
        once cannot all pass before the first is paid. Nothing is decoded."""
        why = Busy.CONCURRENT if open_calls >= MAX_OPEN_CALLS else self._over(visit)
        if why is None:
            self._bytes.charge(visit.peer, nbytes)
        return why

    def read(self, visit: Visit, nbytes: int) -> None:
        """A payload of `nbytes` was read from `visit.peer`: the unproven pool pays for it now."""
        if visit.pooled:
            self._pool_bytes.charge(_POOL, nbytes)

    def charge_check(self, visit: Visit) -> None:
        """A batch refused whole costs one check, like a record refused."""
        self._charge(visit, self._rate, self._pool_rate, 1)

    def admit(self, visit: Visit, size: int) -> str | None:
        """Room for one item whose envelope is `size` bytes, and one check taken from the budgets;
        else the bound it is past (and nothing taken)."""
        why = next((room.why for room in visit.rooms if not room.fits(size)), None)
        if why is not None:
            return why
        if self._rate.available(visit.peer) < 1:
            return Busy.RATE
        if visit.pooled and self._pool_rate.available(_POOL) < 1:
            return Busy.UNPROVEN_RATE
        self._rate.take(visit.peer, 1)
        if visit.pooled:
            self._pool_rate.take(_POOL, 1)
        return None

    def _rooms(self, peer: str, standing: Standing) -> list[Room]:
        """What `peer` may still add: its own bounds, then, unproven, the pool's."""
        mine, mine_bytes = self._holdings.held(peer)
        rooms = [Room(Busy.QUOTA, self.cfg.quota, mine, per_record=True),
                 Room(Busy.JOURNAL_BYTES, self.cfg.journal_bytes, mine_bytes)]
        if standing is Standing.UNPROVEN:
            pool = {p: h for p, h in self._holdings.holders().items() if not self._intake.is_proven(p)}
            groups, nbytes = sum(g for g, _ in pool.values()), sum(b for _, b in pool.values())
            k = len(pool.keys() | {peer})
            rooms += [Room(Busy.UNPROVEN_QUOTA, pool_bound(self.cfg.unproven_quota, groups, mine, k), groups,
                           per_record=True),
                      Room(Busy.UNPROVEN_JOURNAL_BYTES,
                           pool_bound(self.cfg.unproven_journal_bytes, nbytes, mine_bytes, k), nbytes)]
        return rooms

    def _over(self, visit: Visit) -> str | None:
        """The first bound a call is past before anything of it is read, or None."""
        over = [(Busy.RATE, self._rate.available(visit.peer) < 1)]
        over += [(room.why, not room.fits(1)) for room in visit.rooms]
        over.append((Busy.BYTES, self._bytes.available(visit.peer) <= 0))
        if visit.pooled:
            over += [(Busy.UNPROVEN_RATE, self._pool_rate.available(_POOL) < 1),
                     (Busy.UNPROVEN_BYTES, self._pool_bytes.available(_POOL) <= 0)]
        return next((why for why, is_over in over if is_over), None)

    def _charge(self, visit: Visit, mine: TokenBuckets, pool: TokenBuckets, amount: float) -> None:
        mine.charge(visit.peer, amount)
        if visit.pooled:
            pool.charge(_POOL, amount)


class Tarpit:
    """Answers a call that got nothing accepted (busy, refused, a bad batch) only after `seconds`:
    a peer that calls again at once (a flood) then makes at most a few calls a second, so its bytes
    stop costing the learner's network stack and event loop. Bounded per peer (a few waiting calls
    each) and in bytes held, so parallel calls cannot pile up here; past that they are answered at
    once. (Holding more of the calls turned away at the door, unread, did not help: a held stream
    lets p2pd read further ahead, 1.1 against 0.65 MiB a call.)"""

    def __init__(self, seconds: float = TARPIT_S) -> None:
        self.seconds = seconds
        self.count = 0
        """Calls answered only after the tarpit, so far."""
        self._waiting: collections.Counter[str] = collections.Counter()
        self._held = 0
        """Payload bytes of the calls in the tarpit now."""

    async def hold(self, peer: str, nbytes: int) -> None:
        """Wait before answering `peer`'s call of `nbytes` payload bytes, unless the tarpit is full."""
        if self._waiting[peer] >= TARPIT_PER_PEER or self._held + nbytes > TARPIT_BYTES:
            return
        self._waiting[peer] += 1
        self._held += nbytes
        self.count += 1
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self._held -= nbytes
            decrement(self._waiting, peer, 1)
