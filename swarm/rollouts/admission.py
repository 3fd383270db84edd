"""What the learner's rollout gate lets in: the door's rates (swarm/p2p/doors.py, `ROLLOUTS`), and
what each sampler, and all unproven keys together, hold at the learner (its rooms).

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
calls again at once makes a few calls a second (the door's tarpit).

The rates are one `Door` of the node's (`rollouts_budget`: a call of it is one record checked), so
the rollout gate and every other door are one mechanism, with one tarpit and one table; what is
the gate's own are the rooms, and the words its replies give (`Busy`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from swarm.exchange import Intake, IntakeConfig
from swarm.p2p.doors import Bound, Door
from swarm.wire.batch import POLL_BYTES
from swarm.wire.reasons import Busy

MAX_OPEN_CALLS = 2
"""Calls of one peer past the door at once (a sender makes one at a time): more are busy."""
BUSY = {Bound.CALLS: Busy.RATE, Bound.BYTES: Busy.BYTES, Bound.UNPROVEN_CALLS: Busy.UNPROVEN_RATE,
        Bound.UNPROVEN_BYTES: Busy.UNPROVEN_BYTES}
"""The gate's word for each of its door's bounds (its calls are records checked)."""


class Standing(enum.StrEnum):
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

    why: Busy
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
    """The rollout gate's checks: its door's rates (per peer and the unproven pool, a `Door` of the
    node's) and the rooms each visit may fill; what a peer holds is read from `holdings`, its
    standing from the learner (`intake`)."""

    def __init__(self, cfg: IntakeConfig, intake: Intake, holdings: Holdings, door: Door) -> None:
        self.cfg, self._intake, self._holdings, self.door = cfg, intake, holdings, door

    def visit(self, peer: str) -> Visit:
        if self._intake.is_refused(peer):
            return Visit(peer, Standing.REFUSED, [])
        standing = Standing.PROVEN if self._intake.is_proven(peer) else Standing.UNPROVEN
        return Visit(peer, standing, self._rooms(peer, standing))

    def at_door(self, visit: Visit, nbytes: int, open_calls: int) -> Busy | None:
        """Why a call is answered busy without being read, or None, having charged the `nbytes` the
        caller declared to its own byte budget: from here on they cost their sender, decodable or
        not, sent or not. Charged here rather than after the read, so that many calls of one key at
        once cannot all pass before the first is paid. Nothing is decoded."""
        why = Busy.CONCURRENT if open_calls >= MAX_OPEN_CALLS else self._over(visit, nbytes > POLL_BYTES)
        if why is None:
            self.door.charge_peer(visit.peer, nbytes)
        return why

    def read(self, visit: Visit, nbytes: int) -> None:
        """A payload of `nbytes` was read from `visit.peer`: the unproven pool pays for it now."""
        if visit.pooled:
            self.door.charge_unproven(nbytes)

    def charge_check(self, visit: Visit) -> None:
        """A batch refused whole costs one check, like a record refused."""
        self.door.take_calls(visit.peer, 1, visit.pooled)

    def admit(self, visit: Visit, size: int) -> Busy | None:
        """Room for one item whose envelope is `size` bytes, and one check taken from the budgets;
        else the bound it is past (and nothing taken)."""
        why = next((room.why for room in visit.rooms if not room.fits(size)), None)
        if why is not None:
            return why
        if self.door.left(Bound.CALLS, visit.peer) < 1:
            return Busy.RATE
        if visit.pooled and self.door.left(Bound.UNPROVEN_CALLS, visit.peer) < 1:
            return Busy.UNPROVEN_RATE
        self.door.take_calls(visit.peer, 1, visit.pooled)
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

    def _over(self, visit: Visit, adds: bool = True) -> Busy | None:
        """The first bound a call is past before anything of it is read, or None: the door's calls,
        the rooms (unless the call `adds` nothing: a poll, at most an empty batch's bytes read, which
        a paused sampler makes to learn when its groups are trained; turned away at a full room, its
        poll waited out the tarpit, as a flooder's calls do), then the rest of the door's bounds."""
        if self.door.left(Bound.CALLS, visit.peer) < 1:
            return Busy.RATE
        why = next((room.why for room in visit.rooms if adds and not room.fits(1)), None)
        if why is not None:
            return why
        past = self.door.past(visit.peer, visit.pooled)
        return BUSY[past] if past is not None else None
