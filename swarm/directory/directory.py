"""`Directory`: the records that decide who trains, passed directly between the peers that hold them,
so that they reach every node whatever the DHT does (docs/DESIGN.md, "Discovery").

Any node may place DHT nodes next to any key (hivemind lets a node choose its id), and 5 of them
next to a learner's key, answering stores "ok" and finds "not found", hid it from the whole swarm
(issue 58). So the three kinds of record a sampler decides with travel another way as well:
  - a coordinator (a bootstrap) holds the swarm record it signs, and the peer records and tallies
    its named learners offer it (`push`: a learner offers its own to the coordinators it joined
    through, whenever it announces or publishes);
  - every node asks its coordinators for the swarm records and the named learners' peer records,
    and each named learner it deals with for its own records (`refresh`: tallies from their owner
    first, a coordinator only when the owner does not answer, so a bootstrap serves the small
    records only);
  - every node keeps the newest copy it verified (book.py) and serves it to whoever asks (`serve`),
    so a newcomer can learn them from any peer it knows.
Every entry is its owner's DHT record with the owner's signature (swarm/dht/sealed.py): a relay can
withhold or replay, never forge. The DHT is read only for what no peer gave (swarm/p2p/node.py).

The door (`DOORS[DIRECTORY]`) bounds each peer's calls and bytes, and those of all unproven keys
together; a proven peer here is one the node favours (a coordinator, a named learner, a peer one
credited) or one the role has proven.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from hivemind.utils import get_dht_time
from msgspec import Struct

from swarm.buckets import worth_logging
from swarm.dht.sealed import Sealer
from swarm.directory.book import Book
from swarm.identity import Identity, short_id
from swarm.wire.directory import MAX_REPLY, MAX_WANTS, DirectoryReply, DirectoryRequest, Entry, Want

if TYPE_CHECKING:
    from swarm.p2p.doors import Door

log = logging.getLogger(__name__)

REFRESH_S = 10.0
"""Seconds between asks: a sampler's tracker reads every 10 s; a record lives 60 s."""
CALL_S = 10.0
"""Seconds one ask may take: a coordinator that does not answer in that time is asked again next time."""
LAST_GOOD_S = 120.0
"""Seconds since its owner last answered us within which an expired record is still used: a
sampler sends its learner a batch every few seconds and long-polls it, a node asks its coordinators
every REFRESH_S; twice a record's life without an answer and the owner is taken as gone."""

Call = Callable[[str, bytes, float], bytes]
"""call(peer, payload, timeout) -> reply: the node's unary call of DIRECTORY."""


class Directory:
    def __init__(self, identity: Identity, swarm: str, coordinators: set[str], call: Call,
                 answered: Callable[[str], float], door: "Door") -> None:
        self.peer_id = identity.peer_id
        self.door = door
        self.sealer = Sealer(identity, swarm)
        self.book = Book(identity.peer_id, coordinators)
        self._call, self._answered = call, answered
        self._own: dict[str, Entry] = {}
        self._pushed: dict[tuple[str, str], float] = {}
        """(coordinator, kind) -> the expiration of our entry it took last."""
        self._interest: set[str] = set()
        """Named learners whose tallies the node reads (its learner; the leaderboard's)."""
        self._refreshed = 0.0
        self._refreshing = threading.Lock()
        self.stats: collections.Counter[str] = collections.Counter()

    # our own records

    def hold_own(self, kind: str, record: Struct, ttl: float) -> Entry:
        """Seal our own record (as the DHT would store it) and keep it, to serve and to offer."""
        entry = self.sealer.seal(kind, record, self.peer_id, ttl)
        if kind == "swarm":
            self.book.add_coordinator(self.peer_id)
        self.book.put(self.peer_id, entry, record)
        self._own[kind] = entry
        return entry

    def push(self, kinds: tuple[str, ...] = ("peer", "tally")) -> int:
        """Offer our own records of `kinds` to each coordinator that has not taken them yet (a learner:
        they keep them if their swarm record names us); how many coordinators took one."""
        took = 0
        for coordinator in sorted(self.book.coordinators - {self.peer_id}):
            offer = [e for k, e in self._own.items() if k in kinds and self._pushed.get((coordinator, k), 0) < e.expires]
            if not offer:
                continue
            reply = self._ask(coordinator, DirectoryRequest(offer=offer))
            if reply is not None and reply.taken:
                took += 1
                for e in offer:
                    self._pushed[(coordinator, e.kind)] = e.expires
        return took

    # reading

    def want_tally(self, learner: str) -> None:
        """Read `learner`'s tally from now on (it is asked for at the next refresh)."""
        if learner not in self._interest:
            self._interest.add(learner)
            self._refreshed = 0.0

    def record(self, kind: str, owner: str, stale_ok: bool = False) -> Struct | None:
        """The record of (kind, owner) held if unexpired; with `stale_ok`, expired too (the last good one:
        the caller knows its owner still answers)."""
        held = self.book.get(kind, owner)
        if held is None:
            return None
        return held.record if stale_ok or held.entry.expires > get_dht_time() else None

    def answered_lately(self, peer: str) -> bool:
        return time.monotonic() - self._answered(peer) < LAST_GOOD_S

    def refresh(self, force: bool = False) -> None:
        """Ask our coordinators, then the named learners we read, for what is newer than what we hold;
        at most every REFRESH_S (unless `force`), and never two threads at once (the other reads the book)."""
        if not force and time.monotonic() - self._refreshed < REFRESH_S:
            return
        if not self._refreshing.acquire(blocking=False):
            return
        try:
            self._refreshed = time.monotonic()
            coordinators = sorted(self.book.coordinators - {self.peer_id})
            for c in coordinators:  # swarm records and the named learners' peer records
                asked = set(self.book.named())
                if not self._fetch(c, [("swarm", x) for x in coordinators] + [("peer", x) for x in sorted(asked)]):
                    continue  # not answering: asked again next time, not twice now
                unknown = [("peer", x) for x in sorted(set(self.book.named()) - asked)]
                if unknown:  # named only by the swarm record it just sent (a newcomer's first ask)
                    self._fetch(c, unknown)
            missing = []
            for learner in sorted(self._interest & set(self.book.named()) - {self.peer_id}):
                if not self._fetch(learner, [("peer", learner), ("tally", learner)]):
                    missing.append(learner)
            for c in coordinators if missing else []:  # tallies whose owner did not answer us
                self._fetch(c, [("tally", x) for x in missing])
        finally:
            self._refreshing.release()

    def _fetch(self, peer: str, wanted: list[tuple[str, str]]) -> bool:
        """Ask `peer` for `wanted` (kind, owner) newer than ours; whether it answered."""
        wants = [Want(k, o, h.entry.expires if (h := self.book.get(k, o)) else 0.0) for k, o in wanted]
        reply = self._ask(peer, DirectoryRequest(wants=wants[:MAX_WANTS]))
        if reply is None:
            return False
        for entry in reply.entries:
            self._take(entry, peer)
        return True

    def _ask(self, peer: str, request: DirectoryRequest) -> DirectoryReply | None:
        try:
            reply = DirectoryReply.decode(self._call(peer, request.encode(), CALL_S))
        except Exception as e:  # unreachable, slow, or not speaking the protocol: asked again next time
            self.stats["asks_failed"] += 1
            log.debug("directory ask of %s failed: %s", short_id(peer), e)
            return None
        self.stats["asks"] += 1
        if reply.error:
            self.stats[f"answered_{reply.error}"] += 1
        return reply

    def _take(self, entry: Entry, source: str) -> bool:
        """Verify and keep an entry a peer gave or offered; counted by outcome."""
        try:
            owner, record = self.sealer.unseal(entry)
        except ValueError as e:
            self.stats["invalid"] += 1
            if worth_logging(self.stats["invalid"]):
                log.warning("a directory entry from %s refused: %s (%d so far)", short_id(source), e,
                            self.stats["invalid"])
            return False
        kept = self.book.put(owner, entry, record)
        self.stats["kept" if kept else "not_kept"] += 1
        return kept

    # serving (the node's loop)

    async def on_call(self, payload: bytes, remote: str) -> bytes:
        """The DIRECTORY handler: the door first, then `serve`; charged on what was read and sent."""
        past = self.door.enter(remote)
        if past is not None:
            self.stats["busy"] += 1
            await self.door.tarpit(remote, past)
            return DirectoryReply(error="busy").encode()
        reply = self.serve(payload, remote)
        self.door.charge(remote, len(payload) + len(reply))
        return reply

    def serve(self, payload: bytes, remote: str) -> bytes:
        """A peer's request: keep what it offers that we have a use for, and answer what it wants
        that we hold newer than it, within MAX_REPLY bytes."""
        try:
            request = DirectoryRequest.decode(payload)
        except ValueError as e:
            self.stats["malformed"] += 1
            if worth_logging(self.stats["malformed"]):
                log.info("malformed directory request from %s: %s", short_id(remote), e)
            return DirectoryReply(error="malformed").encode()
        taken = sum(self._take(e, remote) for e in request.offer
                    if self.book.keeps(e.kind, self.sealer.owner_of(e) or ""))
        self.stats["offers_refused"] += len(request.offer) - taken
        entries, size = [], 64
        for want in request.wants:
            entry = self.book.newer(want.kind, want.owner, want.have)
            if entry is not None and size + entry.nbytes <= MAX_REPLY:
                entries.append(entry)
                size += entry.nbytes
        self.stats["served_entries"] += len(entries)
        return DirectoryReply(entries=entries, taken=taken).encode()
