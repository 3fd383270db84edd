"""What a node keeps of the records that decide who trains: `Book`, the newest verified entry of each
(kind, owner) it has a use for, and `LastGood`, the records it read from the DHT.

A node keeps the swarm records of its coordinators, and the peer records and tallies of the
learners they name (and its own): nothing else, whoever offers it, so what a crowd of keys can make
it hold is nothing at all, and what it holds is bounded by the coordinators it was given
(`MAX_NAMED` learners, each record within the DHT's own bounds). An entry expires when its owner
said, but is still the last good one while its owner answers (`Directory.record`): a node that can
read no newer record keeps using it.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

from msgspec import Struct

from swarm.dht.records import named_by
from swarm.wire.directory import Entry
from swarm.wire.peer import SwarmRecord
from swarm.wire.tally import Tally

MAX_NAMED = 32
"""Learners a node keeps records of, of all its coordinators' records together (a swarm names a
few; docs/DESIGN.md "Several learners"): with each one's peer record (4 KiB) and tally (1 MiB at
most), what a book holds is under 33 MiB plus 64 KiB a coordinator, whatever is offered."""
MAX_CREDITED = 2048
"""Peers of one learner's tally a node favours (`Book.favoured`): a tally names at most 2,048."""


@dataclass(frozen=True)
class Held:
    owner: str
    entry: Entry
    record: Struct


class Book:
    """The entries a node keeps; safe for several threads (the node's loop serves from it while a
    role's thread refreshes it)."""

    def __init__(self, own_id: str, coordinators: set[str]) -> None:
        self.own_id = own_id
        self.coordinators = set(coordinators)
        """Whose swarm records the node keeps: the bootstraps it was pointed at, and itself once it
        signs one (a coordinator)."""
        self._held: dict[tuple[str, str], Held] = {}
        self._lock = threading.Lock()
        self._named: dict[str, str] = {}
        self._favoured: frozenset[str] = frozenset()

    def named(self) -> dict[str, str]:
        """learner -> model, as the swarm records held name them (at most MAX_NAMED: the first by id)."""
        return dict(self._named)

    def keeps(self, kind: str, owner: str) -> bool:
        if owner == self.own_id:
            return True
        if kind == "swarm":
            return owner in self.coordinators
        return owner in self._named

    def put(self, owner: str, entry: Entry, record: Struct) -> bool:
        """Keep a verified entry if the node has a use for it and it is newer than the one held."""
        if not self.keeps(entry.kind, owner):
            return False
        with self._lock:
            held = self._held.get((entry.kind, owner))
            if held is not None and held.entry.expires >= entry.expires:
                return False
            self._held[(entry.kind, owner)] = Held(owner, entry, record)
            if entry.kind in ("swarm", "tally"):
                self._recount()
        return True

    def get(self, kind: str, owner: str) -> Held | None:
        return self._held.get((kind, owner))

    def newer(self, kind: str, owner: str, have: float) -> Entry | None:
        """The entry held of (kind, owner) if it expires after `have` (what an asker holds)."""
        held = self._held.get((kind, owner))
        return held.entry if held is not None and held.entry.expires > have else None

    def favours(self, peer: str) -> bool:
        """Whether `peer` is a coordinator, a named learner, or a peer a named learner credited."""
        return peer in self._favoured

    def favoured(self) -> frozenset[str]:
        return self._favoured

    def _recount(self) -> None:
        """Who is named, what is no longer kept, and who is favoured, after a swarm record or a tally changed."""
        records = [h.record for (kind, owner), h in self._held.items() if kind == "swarm" and owner in self.coordinators]
        named = named_by([r for r in records if isinstance(r, SwarmRecord)])
        self._named = {k: named[k] for k in sorted(named)[:MAX_NAMED]}
        for key in [k for k in self._held if not self.keeps(*k)]:  # a learner no coordinator names any more
            del self._held[key]
        credited: set[str] = set()
        for (kind, _), h in self._held.items():
            if kind == "tally" and isinstance(h.record, Tally):
                recent = sorted(h.record.peers.items(), key=lambda kv: -kv[1].last)[:MAX_CREDITED]
                credited.update(p for p, c in recent if c.rollouts > 0)
        favoured = frozenset(self.coordinators | set(self._named) | credited)
        if favoured != self._favoured:  # the same object otherwise: the node pushes a new one to its DHT
            self._favoured = favoured

    def add_coordinator(self, peer: str) -> None:
        with self._lock:
            if peer not in self.coordinators:
                self.coordinators.add(peer)
                self._recount()

    def nbytes(self) -> int:
        return sum(h.entry.nbytes for h in list(self._held.values()))


class LastGood:
    """The records a node read from the DHT, newest per (kind, owner), at most `size` (the least
    recently read go first): what it uses while it can read no newer one and the owner answers."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._seen: collections.OrderedDict[tuple[str, str], tuple[Struct, float]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def put(self, kind: str, owner: str, record: Struct, expires: float) -> None:
        with self._lock:
            self._seen[(kind, owner)] = (record, expires)
            self._seen.move_to_end((kind, owner))
            while len(self._seen) > self.size:
                self._seen.popitem(last=False)

    def get(self, kind: str, owner: str) -> tuple[Struct, float] | None:
        return self._seen.get((kind, owner))
