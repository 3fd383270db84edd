"""The learner's side: its chain segment's manifest (a long poll) and chunks (`WeightServer`)."""

from __future__ import annotations

import collections
import dataclasses
import logging
import time

from swarm.exchange import WeightVersion
from swarm.identity import Identity, short_id
from swarm.p2p import SwarmNode
from swarm.p2p.changes import Changes
from swarm.wire.chunks import CHUNK_SIZE, MAX_REQUEST_WAIT
from swarm.weights.chunks import ChunkStore
from swarm.wire.manifest import MANIFEST, Manifest, ManifestRequest, TailNotice, VersionEntry, tail_digest

log = logging.getLogger(__name__)


TAIL_RELAYS = 8
"""Samplers a version's tail goes to, per version an asker may hold, before the learner answers the
others that take notices with a `TailNotice` naming them. Each relay then serves about 1 in 8 of
the learner's samplers (1,000 samplers: 125 tails of 3.4 kB, 0.4 MB a version), and an asker
tries up to `fetcher.TAIL_TRIES` of them before the learner: 8 leave room for relays that do
not serve. A swarm of 8 samplers or fewer never sees a notice."""


class Segment:
    """The chain segment as of one publication, and its manifests sealed for each version an asker
    may hold: the whole segment (sealed at publication, in the learner's thread), and the tail after
    one of the TAILS versions before the newest, sealed on first ask (in the node's loop) and kept
    until the next publication. An asker holding anything else (an older version, one never
    published, another chain) gets the whole segment: so however many keys ask for whatever
    versions, a publication costs at most TAILS signatures and TAILS small tails of memory.

    Each tail goes whole to its first `relays` askers that the learner has proven and that offer to
    relay it; once they are named, an asker that takes notices gets a `TailNotice` naming them
    instead (the learner's upload of tails: `relays` a version, not one per sampler). A key the
    learner has not proven is never named a relay, so fresh keys cannot crowd the relays out."""

    TAILS = 8
    """Versions (before the newest) whose tail is served: a sampler keeping up holds the one before
    the newest; one that missed a few publications, one of the few before it."""

    def __init__(self, manifest: Manifest, identity: Identity, relays: int = TAIL_RELAYS) -> None:
        self.manifest = manifest
        self._identity = identity
        self.relays = relays
        self.whole = manifest.seal(identity)
        self._tails: dict[int, tuple[bytes, bytes, list[str]]] = {}
        """after -> (the sealed tail, its sha256, the relays it went to)."""
        self._tailed = {e.version for e in manifest.versions[-self.TAILS - 1 : -1]}

    @property
    def newest(self) -> tuple[str, int]:
        return self.manifest.chain, self.manifest.versions[-1].version

    def for_asker(self, holds: tuple[str, int] | None, asker: str = "", notice: bool = False, relay: bool = False,
                  proven: bool = False) -> bytes:
        """The sealed manifest for an asker that holds `holds`: only the versions after it when it is
        one of the TAILS listed before the newest, else the whole segment; in place of the tail, a
        `TailNotice` for an asker that takes notices (`notice`) once the tail's relays are named.
        `asker` is named a relay if it offers to be one (`relay`) and is `proven`, while there is room."""
        m = self.manifest
        if holds is None or holds[0] != m.chain or holds[1] not in self._tailed:
            return self.whole
        after = holds[1]
        if after not in self._tails:
            tail = dataclasses.replace(m, versions=tuple(e for e in m.versions if e.version > after)).seal(self._identity)
            self._tails[after] = (tail, tail_digest(tail), [])
        tail, digest, relays = self._tails[after]
        if asker in relays:
            return tail
        if notice and len(relays) >= self.relays:
            return TailNotice(m.chain, m.versions[-1].version, after, digest, tuple(relays)).encode()
        if relay and proven and len(relays) < self.relays:
            relays.append(asker)
        return tail


class WeightServer:
    """The learner's side: keeps the current chain segment and serves its manifest and chunks.

    A manifest request may be a long poll (`ManifestRequest`): it asks for the manifest once the
    learner's newest version is no longer (chain, version), waiting at most `wait` s (capped at
    MAX_REQUEST_WAIT). Samplers then hear of a version the moment it is published, not at their
    next poll, and ask less often than a poll a second would. A request whose (chain, version) is
    still the newest when its wait ends (or when it may not wait) is answered b"": nothing newer.
    Otherwise the manifest lists only the versions after the asker's, when that is one of the few
    published just before the newest (`Segment`), else the whole segment; a tail may go as a
    `TailNotice` naming the samplers that relay it (`Segment`). An empty request (or one that is not
    valid: counted) is answered at once, with the whole segment. One waiting request per peer, `MAX_WAITERS` in
    all, of which keys the node has not proven (`Doors.set_proven`) hold at most half: beyond that, at
    once (the caller asks again later), so however many fresh keys hold long polls, the proven
    samplers' find room. Calls past the door's budget (swarm/p2p/doors.py `DOORS`) are answered b"" after its tarpit."""

    MAX_WAITERS = 256
    """Long polls held at once: each is a task and a small request in the node's loop (no stream,
    no descriptor), and a learner feeds a few dozen samplers, each holding one."""

    def __init__(self, node: SwarmNode, relays: int = TAIL_RELAYS) -> None:
        self.node = node
        self.relays = relays
        """Samplers each tail goes to before notices name them (`Segment`; 0: notices from the first ask)."""
        self.store = ChunkStore(node, waits_for_coming=False)
        self._entries: list[VersionEntry] = []
        self._segment: Segment | None = None
        """The segment as last published and its sealed manifests (replaced whole at each publication,
        read once per request: the learner's thread publishes, the node's loop serves)."""
        self._published = Changes()
        """Notified when a version is published (in the learner's thread): wakes the long polls."""
        self._waiting: set[str] = set()
        self._waiting_unknown = 0
        """Of them, the long polls of keys the node does not know."""
        self.stats: collections.Counter[str] = collections.Counter()
        """requests answered (`manifests`: with a sealed manifest, `sealed`, or a notice, `notices`,
        each with its bytes, `sealed_bytes` and `notices_bytes`; or b"" when the asker holds the newest
        version, also counted as `nothing_newer`), long polls that waited, malformed requests, calls
        past the door's budget (busy)."""
        self._door = node.doors.open(MANIFEST)
        node.add_handler(MANIFEST, self._on_manifest)

    async def _on_manifest(self, payload: bytes, remote: str) -> bytes:
        past = self._door.enter(remote)
        if past is not None:  # past its budget: b"" (the fetcher asks again later)
            self.stats["busy"] += 1
            await self._door.tarpit(remote, past)
            return b""
        self.stats["manifests"] += 1
        request = self._request(payload, remote)
        after = (request.chain, request.version) if request is not None else None
        wait = min(max(float(request.wait), 0.0), MAX_REQUEST_WAIT) if request is not None else 0.0
        unknown = not self.node.doors.is_proven(remote)
        if wait > 0 and after == self._newest() and self._may_wait(remote, unknown):
            self._waiting.add(remote)
            self._waiting_unknown += unknown
            self.stats["long_polls"] += 1
            deadline = time.monotonic() + wait
            try:
                while self._newest() == after and (left := deadline - time.monotonic()) > 0:
                    await self._published.wait(left)
            finally:
                self._waiting.discard(remote)
                self._waiting_unknown -= unknown
        segment = self._segment
        if segment is None:
            return b""
        if after is not None and after == segment.newest:
            # it holds our newest version: "nothing newer" (b""; its fetcher polls again), not a
            # manifest, which went to every sampler at each long poll's end, ~6 times a version at
            # minute-long steps
            self.stats["nothing_newer"] += 1
            return b""
        reply = segment.for_asker(after, remote, request is not None and request.notice,
                                  request is not None and request.relay, proven=not unknown)
        kind = "notices" if TailNotice.is_notice(reply) else "sealed"
        self.stats[kind] += 1
        self.stats[f"{kind}_bytes"] += len(reply)
        return reply

    def _may_wait(self, remote: str, unknown: bool) -> bool:
        """One long poll per peer, MAX_WAITERS in all, half of them for keys the node does not know."""
        why = ("peer" if remote in self._waiting else "all" if len(self._waiting) >= self.MAX_WAITERS else
               "unknown" if unknown and self._waiting_unknown >= self.MAX_WAITERS // 2
               else None)
        if why is not None:
            self.stats[f"long_polls_refused_{why}"] += 1
        return why is None

    def _request(self, payload: bytes, remote: str) -> ManifestRequest | None:
        """The caller's request; None for a plain request (b"") or a malformed one (answered at once,
        with the whole segment)."""
        try:
            return ManifestRequest.decode(payload)
        except Exception as e:
            self.stats["malformed"] += 1
            log.info("malformed manifest request from %s (%s); answered at once", short_id(remote), e)
            return None

    def _newest(self) -> tuple[str, int] | None:
        return self._segment.newest if self._segment is not None else None

    def publish(self, wv: WeightVersion) -> None:
        if wv.base is None:  # a keyframe starts a new chain segment; the last one is still served
            # until the next keyframe, so that downloads under way (from its manifest) can finish
            self.store.retain({e.version for e in self._entries if wv.chain == self.store.chain})
            self._entries = []
        self.store.put(wv.chain, wv.version, wv.blob)
        if wv.base is None:  # a new swarm's seeders are the first to take it whole (ChunkStore.seeders)
            self.store.seed_from(wv.version)
        self._entries.append(VersionEntry.of_blob(wv.version, wv.base, wv.blob))
        first = self._entries[0].version
        manifest = Manifest(wv.model_id, wv.chain, CHUNK_SIZE, tuple(self._entries), self.node.peer_id, time.time(), first)
        self._segment = Segment(manifest, self.node.identity, self.relays)
        self._published.notify()
