"""What each sampler has at the learner and the learner has not trained on yet: its records in the
journal after the cursor (acknowledged, not yet handed to the learner: counted here) and its
groups in the learner's buffer (asked of the learner). The budgets read it (`Holdings`), and acks
report it so that a sampler paces itself."""

from __future__ import annotations

import collections
import threading
from typing import Callable

import msgpack

from swarm.exchange import Received
from swarm.p2p.handlers import decrement
from swarm.rollouts.journal import Journal
from swarm.wire.rollout import RolloutGroup

PASS_BYTES = 32 << 20
"""Journal bytes after the cursor whose decoded groups are kept for the learner (`Received.group`), so
that it does not decode what the receiver decoded to check it; past this (a long step, a flood of
the unproven pool) the rest are handed over raw and decoded when read. A decoded group takes several
times its record's bytes (Python lists of its token ids and log-probs)."""


class Backlog:
    """The journal past the cursor, counted by sampler; the one place that appends to the journal
    and reads from it, so that a record and its count always go together."""

    def __init__(self, journal: Journal, cursor: int, untrained: Callable[[str], int]) -> None:
        self.journal = journal
        self.cursor = max(cursor, journal.first)
        """Journal records already handed to the learner (a global index, saved in its checkpoints)."""
        self._untrained = untrained
        self._lock = threading.Lock()
        self._unread: collections.deque[tuple[str, int, RolloutGroup | None]] = collections.deque()
        """(sampler, bytes, the group decoded or None) of each journal record after the cursor, in order."""
        self._passed = 0
        """Bytes of the records in `_unread` whose decoded group is kept (at most PASS_BYTES)."""
        self._unread_n: collections.Counter[str] = collections.Counter()
        self._unread_bytes: collections.Counter[str] = collections.Counter()
        self._senders: set[str] = set()
        """Samplers that may have groups not yet trained on (pruned once they have none): the
        unproven pool's use is summed over them."""
        self._restored: list[tuple[str, str]] = []
        """(id, sampler) of each record after the cursor at start, until `take_restored`."""
        for r in journal.read(self.cursor, len(journal)):
            sampler, rid = _header_of(r)
            self._note(sampler, len(r))
            if rid is not None and sampler != "?":
                self._restored.append((rid, sampler))

    def take_restored(self) -> list[tuple[str, str]]:
        """(id, sampler) of the records that were after the cursor when this backlog was built,
        oldest first, once: what the receiver had acknowledged and the learner not yet read before
        a restart (receiver.MAX_ACKED)."""
        out, self._restored = self._restored, []
        return out

    def groups(self, sampler: str) -> int:
        """`sampler`'s groups received but not yet trained on: its share of the journal's unread
        records and of the learner's buffer."""
        with self._lock:
            unread = self._unread_n[sampler]
        return unread + self._untrained(sampler)

    def unread_bytes(self, sampler: str) -> int:
        """Bytes of `sampler`'s records in the journal that the learner has not read yet: what
        `journal_bytes` bounds (the learner reads between steps, so they pile up during a long one)."""
        with self._lock:
            return self._unread_bytes[sampler]

    def held(self, peer: str) -> tuple[int, int]:
        return self.groups(peer), self.unread_bytes(peer)

    def holders(self) -> dict[str, tuple[int, int]]:
        out = {}
        for peer in list(self._senders):
            held = self.held(peer)
            if held[0] == 0:
                self._senders.discard(peer)
            else:
                out[peer] = held
        return out

    def append(self, sampler: str, records: list[bytes], groups: list[RolloutGroup | None] | None = None) -> None:
        """Journal `sampler`'s checked records, durably (fsynced: an acknowledged rollout survives a
        learner crash), counted with the append, atomically: `take` (the learner's thread) must
        never read a record whose count is not there yet. `groups`: each record as the receiver
        decoded it, kept for the learner within PASS_BYTES."""
        with self._lock:
            self.journal.append(records)
            for r, g in zip(records, groups or [None] * len(records)):
                self._note(sampler, len(r), g)

    def take(self, max_records: int) -> list[Received]:
        """Up to `max_records` records after the cursor, which moves past them; now uncounted. Only
        the learner's thread calls this, so the read needs no lock (the network thread's appends
        land after what it reads)."""
        raws = self.journal.read(self.cursor, max_records)
        out = []
        with self._lock:
            self.cursor += len(raws)
            for raw in raws:
                sampler, nbytes, group = self._unread.popleft()
                if group is not None:
                    self._passed -= nbytes
                decrement(self._unread_n, sampler, 1)
                decrement(self._unread_bytes, sampler, nbytes)
                out.append(Received(raw, group))
        return out

    def _note(self, sampler: str, nbytes: int, group: RolloutGroup | None = None) -> None:
        """Count one record as unread; the caller holds `_lock` (with the append it belongs to)."""
        if group is not None and self._passed + nbytes > PASS_BYTES:
            group = None
        self._passed += nbytes if group is not None else 0
        self._unread.append((sampler, nbytes, group))
        self._unread_n[sampler] += 1
        self._unread_bytes[sampler] += nbytes
        self._senders.add(sampler)


def _header_of(record: bytes) -> tuple[str, str | None]:
    """The sampler and the id a journaled record names, for its backlog after a restart ("?" and
    None where it names none: records accepted under older rules are checked again, and counted,
    when the learner reads them)."""
    try:
        d = msgpack.unpackb(record, raw=False)
    except Exception:
        return "?", None
    if not isinstance(d, dict):
        return "?", None
    sampler, rid = d.get("sampler"), d.get("id")
    return sampler if isinstance(sampler, str) else "?", rid if isinstance(rid, str) else None
