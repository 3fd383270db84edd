"""Weight blobs served chunk by chunk: the chunk request, the holder's store, and who owns which chunk.

hetero.chunks.v2: [chain, version, [index, ...], wait] -> a stream of those chunks, in order, ending
at the first one not held (of a version downloading here, after at most MAX_GAPS empty frames for
chunks not in yet; the fetcher asks the rest of their next source). Served by the learner
*and* by every sampler for the versions it holds (announced in the DHT) or is downloading, so the
learner's upload need not grow with the number of samplers.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Container


from swarm.buckets import worth_logging
from swarm.identity import short_id
from swarm.p2p import SwarmNode
from swarm.p2p.changes import Changes
from swarm.p2p.doors import Bound
from swarm.p2p.handlers import BoundedStream
from swarm.wire.tally import MAX_SEEDERS
from swarm.wire.chunks import CHUNKS, ChunkRequest, ChunkRequestError, MAX_INDICES, MAX_REQUEST_BYTES, MAX_REQUEST_WAIT, chunk_size

log = logging.getLogger(__name__)


NEWCOMERS_AT_ONCE = 2
"""Fresh keys whose first fetches of the largest version the pool serves whole at once; more wait on
its rate. With the pool at one version (or 64 MiB), two fresh samplers joining together (the
39M-parameter rehearsal: a ~54 MiB version) had their last chunks refused, and a failed first fetch
to retry."""
MAX_REPEATS = 3
"""Times one peer is served one chunk of one version: an honest fetcher asks it once, again after a
failed stream or a bad source; beyond that it is answered "not held" (its mates hold it too)."""


class Repeats:
    """How often each peer was served each chunk of each version (a count per chunk, in an LRU of
    (peer, chain, version) bounded to `max_entries`: 4,096 x ~1,000 chunks of a 1 GiB version is
    4 MB at most), and how many distinct chunks of it (what says a peer took a version whole)."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._counts: collections.OrderedDict[tuple[str, str, int], bytearray] = collections.OrderedDict()
        self._distinct: dict[tuple[str, str, int], int] = {}

    def take(self, peer: str, chain: str, version: int, index: int) -> bool:
        """Whether `peer` may be served chunk `index` (one this node holds: so `index` is bounded by
        the version's size) once more; counts it."""
        key = (peer, chain, version)
        counts = self._counts.pop(key, None) or bytearray()
        self._counts[key] = counts
        if len(self._counts) > self.max_entries:
            self._distinct.pop(self._counts.popitem(last=False)[0], None)
        if index >= len(counts):
            counts.extend(bytes(index + 1 - len(counts)))
        if counts[index] >= MAX_REPEATS:
            return False
        if not counts[index]:
            self._distinct[key] = self._distinct.get(key, 0) + 1
        counts[index] += 1
        return True

    def distinct(self, peer: str, chain: str, version: int) -> int:
        """Distinct chunks of `version` served to `peer` (0 once its entry has left the LRU)."""
        return self._distinct.get((peer, chain, version), 0)


MAX_GAPS = 64
"""Chunks not held of a version this peer is downloading that a stream answers with an empty frame
before it ends: a mate mid-download holds its chunks with gaps, and the ones after a gap are worth
taking from it. Past this, or at any chunk not held of a version held whole or not at all, the stream
ends and the fetcher asks the rest of their next source (an empty frame per index named cost the
loop 2.2 s for 65,536 of them)."""
INDEX_COST = 64
"""Bytes of its door's byte budget (per peer, and the pool's) that each index a request names costs,
charged before any is looked up: a lookup is work whatever the answer, and one request may name
MAX_INDICES (5.6 MiB of budget for the largest). Small: at 1 KiB an index (1/1024 of a 1 MiB chunk), two
fresh samplers fetching the 219M rehearsal's keyframe from the learner were refused by its pool of
unknown keys (tests/integration/swarm/test_rehearsal.py, a weight fetch failed; at 64 bytes it
passes, as before the charge), so honest fetches name chunks more often than once each.
The call budget (8 a second a key, and the pool's) binds an attacker first; a call's work is then
its lookups and at most MAX_GAPS empty frames."""


class ChunkStore:
    """The weight blobs of one chain that this peer holds, served chunk by chunk to any peer.

    A request (`ChunkRequest`) is answered with a stream of those chunks, in order, ending at the
    first one not held (of a download in progress: after MAX_GAPS empty frames). A version still being downloaded is served chunk by chunk as its verified chunks
    arrive, and a request with `wait` > 0 for such a version waits (at most `wait` after the last chunk
    it was served, capped at MAX_REQUEST_WAIT, until its first gap) for the chunk instead of ending
    the stream at once. That is what lets samplers
    fetching the same version at the same time share it (see `chunk_owner`). Every byte a fetcher
    receives is checked against the learner-signed manifest, so a holder cannot serve wrong
    weights, only fail to help.
    """

    MAX_WAITING = 8
    """Requests of one peer that may wait at once (a fetcher sends up to 4 streams per source)."""

    def __init__(self, node: SwarmNode, waits_for_coming: bool = True) -> None:
        self.waits_for_coming = waits_for_coming
        """False for the learner's store: it publishes, it never fetches, so nothing is coming."""
        self._waiting: collections.Counter[str] = collections.Counter()
        self.chain = ""
        self.blobs: dict[int, bytes] = {}
        self.partial: dict[int, dict[int, bytes | memoryview]] = {}
        """version -> verified chunks of a download in progress."""
        self.served_bytes = 0
        self.malformed_why: collections.Counter[str] = collections.Counter()
        """Chunk requests refused as malformed (logged with the reason), by reason: `frame` (a request
        frame over MAX_REQUEST_BYTES, left unread, or not a frame), and `ChunkRequest.decode`'s
        (`oversize`, `too_many`, `undecodable`, `schema`)."""
        self.repeats_refused = 0
        """Chunks answered "not held" because this peer was served them MAX_REPEATS times already."""
        self._repeats = Repeats()
        self.seed_version: int | None = None
        """The version whose whole download makes a peer a seeder (`seeders`): the learner's newest
        keyframe (`WeightServer.publish`); None: no one is (a sampler's store)."""
        self._seeded: list[str] = []
        """The first MAX_SEEDERS peers served every chunk of `seed_version`, in that order."""
        self._changes = Changes()
        """Notified whenever what this store holds changes: it wakes the requests waiting for a chunk
        still coming. They had polled every 10 ms, ~100 wakes a second each, and a sampler holds
        dozens of them while a version spreads. (The fetcher adds chunks in its pool's threads.)"""
        self._door = node.doors.open(CHUNKS)
        node.add_stream_handler(CHUNKS, BoundedStream(self._on_chunks, MAX_REQUEST_BYTES, self._on_broken_frame))

    def put(self, chain: str, version: int, blob: bytes) -> None:
        if chain != self.chain:
            self.reset(chain)
        self.blobs[version] = blob
        self.partial.pop(version, None)
        self._changes.notify()
        # one peer may take this version whole, and the pool NEWCOMERS_AT_ONCE such peers: a fresh
        # sampler has no mates yet, so its first fetch is the newest version whole, from here
        budget = self._door.budget
        peer, pool = max(budget.byte_burst, len(blob)), max(budget.unproven_byte_burst, NEWCOMERS_AT_ONCE * len(blob))
        if (peer, pool) != (budget.byte_burst, budget.unproven_byte_burst):
            self._door.resize(byte_burst=peer, unproven_byte_burst=pool)

    def reset(self, chain: str) -> None:
        self.chain, self.blobs, self.partial = chain, {}, {}
        self.seed_version, self._seeded = None, []
        self._changes.notify()

    def seed_from(self, version: int) -> None:
        """Name as seeders, from now on, the first peers served `version` whole (a keyframe)."""
        self.seed_version, self._seeded = version, []

    def retain(self, versions: Container[int]) -> None:
        """Prune every held version, whole or partial, not in `versions` (a container: those of the
        learner's segment, `Manifest.segment`)."""
        self.blobs = {v: b for v, b in self.blobs.items() if v in versions}
        self.partial = {v: p for v, p in self.partial.items() if v in versions}
        self._changes.notify()

    def verified(self, chain: str, version: int) -> dict[int, bytes | memoryview]:
        """The chunks of `version` verified so far (by an earlier try, too): a download resumes."""
        return dict(self.partial.get(version, {})) if chain == self.chain else {}

    def begin(self, chain: str, version: int) -> None:
        if chain != self.chain:
            self.reset(chain)
        self.partial.setdefault(version, {})
        self._changes.notify()

    def add_chunk(self, chain: str, version: int, index: int, chunk: bytes | memoryview) -> None:
        if chain == self.chain and version in self.partial:
            self.partial[version][index] = chunk
            self._changes.notify()

    def abandon(self, version: int) -> None:
        self.partial.pop(version, None)
        self._changes.notify()

    @property
    def malformed(self) -> int:
        """Chunk requests refused as malformed, all reasons."""
        return sum(self.malformed_why.values())

    def _coming(self, chain: str, version: int) -> bool:
        """Whether `version` is being downloaded here, or is the one after all this peer holds or
        fetches: a mate that has read the learner's manifest a moment before us asks for the chunks
        we own before we poll it, and answering "not held" at once would send it to the learner
        (whose upload then grows with the number of samplers). Any further version is a claim we
        have no reason to wait on."""
        if chain != self.chain or version in self.blobs:
            return False
        if version in self.partial:
            return True
        newest = max((*self.blobs, *self.partial), default=-1)
        return self.waits_for_coming and newest < version <= newest + 1  # the next one, not any claim

    def _lookup(self, chain, version: int, index: int) -> memoryview | bytes | None:
        if chain != self.chain:
            return None
        blob = self.blobs.get(version)
        if blob is not None:  # a view: slicing bytes would copy every chunk served
            size = chunk_size(len(blob))
            return memoryview(blob)[index * size : (index + 1) * size] if 0 <= index * size < len(blob) else None
        return self.partial.get(version, {}).get(index)

    def _may_serve(self, remote: str, chain: str, version: int, index: int, size: int) -> bool:
        """Within the door's bytes and this peer's repeats of this chunk (counted only when served)."""
        if self._door.allows(remote, size) is not None:
            return False
        if not self._repeats.take(remote, chain, version, index):
            self.repeats_refused += 1
            return False
        if version == self.seed_version:
            self._seeding(remote, chain, version)
        return True

    def _seeding(self, remote: str, chain: str, version: int) -> None:
        """`remote` was just served a chunk of the seed version: a seeder once it has had every one
        (distinct chunks: a repeat adds nothing), while fewer than MAX_SEEDERS are named."""
        blob = self.blobs.get(version)
        if (blob is not None and len(self._seeded) < MAX_SEEDERS and remote not in self._seeded
                and self._repeats.distinct(remote, chain, version) == -(-len(blob) // chunk_size(len(blob)))):
            self._seeded.append(remote)

    def seeders(self) -> list[str]:
        """The first MAX_SEEDERS peers this store served its seed version (the learner's newest
        keyframe) whole to, in that order: who holds the model though no one is credited yet. A
        learner names them in its tally (a new swarm's stand-in mates: swarm/discovery.py `earned`).
        Being named costs a key the largest version, whole, from the learner, within the door's pool
        for unproven keys, before the first MAX_SEEDERS that did; a repeat of a chunk adds nothing,
        and the list is fixed until the next keyframe."""
        return list(self._seeded)

    async def _on_chunks(self, payload: bytes, remote: str):
        """The door (a call, before a byte is decoded), the request decoded within its bounds, each
        index it names charged (INDEX_COST), then its chunks in order, up to the first one not held (a
        download in progress: its first MAX_GAPS gaps are empty frames)
        (not here, past the bytes or repeats bound): the stream ends there and the fetcher asks the
        rest of their next source. Past the door, or malformed: tarpitted, no chunk at all."""
        past = self._door.enter(remote)
        if past is not None:  # past its budget: "not held" (it asks another source)
            await self._door.tarpit(remote, past)
            return
        try:
            request = ChunkRequest.decode(payload)
        except ChunkRequestError as e:
            # what it could have named: at most an index a byte (decoding it was that much work)
            await self._malformed(remote, e.reason, str(e), INDEX_COST * min(len(payload), MAX_INDICES))
            return
        self._door.charge(remote, INDEX_COST * len(request.indices))  # before any is looked up
        chain, version, wait = request.chain, request.version, min(request.wait, MAX_REQUEST_WAIT)
        if self._waiting[remote] >= self.MAX_WAITING:
            wait = 0.0  # this peer has enough requests waiting already: answer what is here now
        deadline, gaps = time.monotonic() + wait, 0
        self._waiting[remote] += 1
        try:
            for index in request.indices:
                chunk = self._lookup(chain, version, index)
                # a download in progress here, or about to start: wait for the chunk briefly
                while chunk is None and self._coming(chain, version) and (left := deadline - time.monotonic()) > 0:
                    await self._changes.wait(left)
                    chunk = self._lookup(chain, version, index)
                if chunk and not self._may_serve(remote, chain, version, index, len(chunk)):
                    return  # past its bytes or repeats: so would the rest be
                if not chunk:
                    gaps += 1
                    if gaps > MAX_GAPS or chain != self.chain or version not in self.partial:
                        return  # not held from here on: the fetcher asks the rest of their next source
                    yield b""  # a gap of a download in progress: the chunks after it may be here
                    continue
                self.served_bytes += len(chunk)
                self._door.charge(remote, len(chunk))
                yield chunk
                # each chunk of a download in progress may be waited for: on a slow link an owner's
                # next chunk comes one round of the learner's upload after the last (8 mates x 1 MiB
                # at 25 Mbit/s: 2.7 s), so one deadline for the whole request ended its later chunks
                # in gaps, and they went to the learner. After a gap, none is waited for: a stream is
                # held at most `wait` past the last chunk it was served
                if not gaps:
                    deadline = time.monotonic() + wait
        finally:
            self._waiting[remote] -= 1
            if not self._waiting[remote]:
                del self._waiting[remote]

    async def _on_broken_frame(self, remote: str, detail: str) -> None:
        """A request frame over MAX_REQUEST_BYTES (its payload left unread) or not a frame: a call
        at the door, counted as malformed, tarpitted; no chunk."""
        past = self._door.enter(remote)
        await self._malformed(remote, "frame", detail, 0, past)

    async def _malformed(self, remote: str, why: str, detail: str, nbytes: int, past: Bound | None = None) -> None:
        """A request no honest fetcher sends (its call already taken at the door): `nbytes` charged,
        counted by `why`, logged at the 1st, 10th, 100th... of each reason, and tarpitted."""
        self.malformed_why[why] += 1
        n = self.malformed_why[why]
        if worth_logging(n):
            log.warning("%s: a malformed request from %s (%s; %d %s so far)", CHUNKS, short_id(remote), detail, n, why)
        self._door.charge(remote, nbytes)
        await self._door.tarpit(remote, past or Bound.CALLS)


def chunk_owner(mates: list[str], version: int, index: int) -> str | None:
    """The sampler that takes chunk `index` of `version` from the learner; the others take it from
    that sampler. `mates` are the samplers following the same learner (sorted, so that every one of
    them computes the same owner without talking). Rotating by version spreads single-chunk deltas.
    With N mates fetching together, the learner uploads each chunk once instead of N times.
    """
    return mates[(index + version) % len(mates)] if mates else None
