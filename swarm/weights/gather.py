"""Gathering one version's chunks from several sources at once, each chunk verified as it arrives.

`Gather` is the scheduler of one download: which source each chunk is asked of next, the streams
in flight, the chunks verified so far. A stream that ends, fails or lies hands its chunks to their
next source; one that pauses is hedged (its chunks asked of their next source too), its source
demoted only if it had sent nothing (a busy mate is not punished for sharing its link); a chunk no
source delivered fails the download.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import zlib
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait as wait_futures
from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol

from swarm.identity import short_id
from swarm.p2p import RemoteError, StreamStalled, SwarmNode
from swarm.wire.rollout import RecordError
from swarm.wire.chunks import CHUNK_SIZE, CHUNKS, ChunkRequest, chunk_digest, chunk_size
from swarm.weights.chunks import ChunkStore
from swarm.weights.config import FetchConfig
from swarm.wire.manifest import VersionEntry
from swarm.wire.reasons import Drop

log = logging.getLogger(__name__)


class GatherHost(Protocol):
    """What a gather asks of the fetcher it runs for (`WeightFetcher`)."""

    node: SwarmNode
    store: ChunkStore
    """Verified chunks go here as they arrive: mates may ask for them right away."""
    cfg: FetchConfig
    rpc_timeout: float
    peer_wait: float
    """How long a mate downloading a chunk right now may hold our request for it, after the last
    chunk it sent on that request."""
    learner: Callable[[], str | None]
    pace: float | None
    """Mean seconds between two chunks of one stream in the last download (`Gather.pace`); None
    before one was measured."""

    def usable(self, peers: list[str]) -> list[str]: ...
    def count(self, key: str, n: int = 1) -> None: ...
    def demote(self, peer: str, why: str) -> None: ...


class Source(NamedTuple):
    peer: str
    wait: float
    """How long the peer may hold the request for a chunk it is still downloading (a mate); 0: none."""


class Superseded(Exception):
    """A hedged stream's chunks all arrived from other sources: it stops at its next chunk."""


@dataclass(eq=False)
class ChunkStream:
    """One chunk request in flight: some chunks of the version asked of one source."""

    source: str
    wait: float
    indices: list[int]
    progress: float | None = None
    """When it was sent or last delivered a chunk (None while it waits for a worker)."""
    future: Future | None = None
    delivered: int = 0
    hedged: bool = False

    def stalled(self, now: float, hedge_s: float) -> bool:
        """No chunk for `hedge_s` (before the first: plus the `wait` the source may hold it)."""
        if self.progress is None:  # queued behind other streams: not the source's fault
            return False
        return now - self.progress > hedge_s + (self.wait if not self.delivered else 0.0)


class Gather:
    """The verified chunks of one version (`run`). Each chunk has its own list of sources
    (`_sources`): holders of the whole version not demoted (chunk i from holder i+r in try r,
    spreading the load), then its owner when that is a mate that may be downloading it now, then
    up to `holder_tries` of our other mates (they take it from the owner), the learner last (twice:
    a reset libp2p stream reads as its end). Chunks asking the same source go in a few streams at
    once (`_split`). A chunk a stream did not deliver (it ended, failed, or sent a bad copy) moves
    to its next source; one whose stream brings no chunk for `hedge_s` is asked of its next source
    *too* (hedged: the first verified copy wins). The hedged source is demoted only if that stream
    delivered nothing at all: one that delivered is congested (a public mate serves its share to
    every private one), and if it stops altogether its stall bound ends the stream (StreamStalled,
    demoted then). So a holder that stalls or trickles delays a chunk by one hedge at most.

    "No chunk for `hedge_s`" is relative on a slow link (`_hedge_after`): a stream is hedged when it
    lags the pace of the download's other sources, not a fixed 3 s, and never later than `idle_s`."""

    HEDGE_PACE = 3.0
    """A stream is hedged once it brought no chunk for this many times the mean gap between two
    chunks of one stream of the download's *other* sources (never sooner than `hedge_s`, never later
    than `idle_s`). On a slow link every stream is slow, and hedging them all piles the same bytes
    onto the same uplinks: at 25 Mbit/s a fixed 3 s hedged the mates' honest streams, the hedges went
    on to the learner, and its uplink, shared by dozens of streams, stalled them (23-95 s for a 20 MB
    version, up to 13 learner copies; docs/BENCHMARKS.md). 3: three times slower than the others is
    lagging, not sharing. Other sources only, and capped: a source's own slow gaps must not raise its
    own bar (each just under 3x the mean would ratchet it up to the stall bound within 5 chunks)."""

    def __init__(self, host: GatherHost, pool: Executor, parallel: int, chain: str, entry: VersionEntry,
                 learner: str, holders: list[str], owners: list[str | None], mates: list[str]) -> None:
        self._host, self._pool, self._parallel = host, pool, parallel
        self.chain, self.entry, self.learner = chain, entry, learner
        self.chunk = chunk_size(entry.size)
        """How large its chunks are: the manifest's size says how the learner cut it; no item is larger."""
        self.got: dict[int, memoryview | bytes] = host.store.verified(chain, entry.version)
        """Verified chunks, filled by several streams (pool threads); those an earlier try of this
        version verified are kept: at size a try can end short (a budget the learner shares among
        new keys, a source gone) and starting over threw away hundreds of MB each time."""
        usable = set(host.usable(mates))
        others = sorted(m for m in usable if m not in (host.node.peer_id, learner, *holders))
        self._plans = {i: self._sources(i, holders, owners, others) for i in range(len(entry.chunks))}
        self._tries = dict.fromkeys(self._plans, 0)
        """chunk -> sources of its plan asked so far."""
        self._owner: dict[int, ChunkStream] = {}
        """chunk -> the stream now responsible for it."""
        self._streams: list[ChunkStream] = []
        self._gaps: dict[str, list[float]] = {}
        """source -> [gaps between two chunks of one of its streams measured so far, their seconds]."""
        self.arrived: list[tuple[float, int, str]] = []
        """(wall time, chunk, source) of each chunk's first verified copy: how a version spread."""
        self._first = threading.Lock()
        """Held while a chunk is found first and put in `got` and `arrived`."""

    def run(self) -> dict[int, memoryview | bytes]:
        """Every chunk, verified; RecordError(Drop.SIZES) if one was verified from no source."""
        self._launch([i for i in self._plans if i not in self.got])
        while missing := [i for i in self._plans if i not in self.got]:
            self._step(missing)
        return self.got

    def _step(self, missing: list[int]) -> None:
        now = time.monotonic()
        for stream in [s for s in self._streams if s.future.done()]:
            self._streams.remove(stream)
            self._launch(self._orphans(stream))
        for stream in self._streams:  # (and those launched here: they are not stalled)
            if not stream.hedged and stream.source != self.learner and stream.stalled(now, self._hedge_after(stream.source)):
                stream.hedged = True
                self._host.count("hedged_streams")
                if stream.delivered:  # still delivering, slowly: congestion, not a fault
                    self._host.count("hedged_slow_streams")
                else:  # nothing at all in `hedge_s` + its wait: silent
                    self._host.demote(stream.source, f"no chunk in {now - stream.progress:.1f} s")
                self._launch(self._orphans(stream))
        alive = {i for stream in self._streams for i in stream.indices}
        if dead := [i for i in missing if i not in self.got and i not in alive and self._tries[i] >= len(self._plans[i])]:
            raise RecordError(Drop.SIZES, f"chunks {dead[:5]} of version {self.entry.version} verified from no source")
        wait_futures([s.future for s in self._streams], timeout=0.1, return_when=FIRST_COMPLETED)

    @property
    def pace(self) -> float | None:
        """Mean seconds between two chunks of one stream in this download, every source's (None
        before a stream brought its second chunk)."""
        return self._mean_gap(None)

    def _mean_gap(self, excluding: str | None) -> float | None:
        gaps = [g for source, g in list(self._gaps.items()) if source != excluding]
        n = sum(g[0] for g in gaps)
        return sum(g[1] for g in gaps) / n if n else None

    def _gap(self, source: str, seconds: float) -> None:
        """A stream of `source` brought a chunk `seconds` after its last one."""
        g = self._gaps.setdefault(source, [0, 0.0])  # one entry per source: two threads may lose a gap, not break it
        g[0], g[1] = g[0] + 1, g[1] + seconds

    def _hedge_after(self, source: str) -> float:
        """Seconds without a chunk after which a stream of `source` is hedged: `hedge_s`, or HEDGE_PACE
        x the mean gap between two chunks of a stream of the download's other sources if longer (the
        last download's, the host's `pace`, until one is measured), at most `idle_s`. Gaps only:
        a stream's wait for its first chunk holds the owner's own download."""
        cfg = self._host.cfg
        pace = self._mean_gap(source)
        if pace is None:
            pace = self._host.pace
        return min(max(cfg.hedge_s, self.HEDGE_PACE * (pace or 0.0)), max(cfg.hedge_s, cfg.idle_s))

    def _orphans(self, stream: ChunkStream) -> list[int]:
        """The chunks `stream` is responsible for and has not delivered."""
        return [i for i in stream.indices if i not in self.got and self._owner.get(i) is stream]

    def _launch(self, chunks: list[int]) -> None:
        """Ask each of `chunks` of its next source, if it has one left."""
        requests: dict[Source, list[int]] = collections.defaultdict(list)
        for i in chunks:
            if self._tries[i] < len(self._plans[i]):
                requests[self._plans[i][self._tries[i]]].append(i)
                self._tries[i] += 1
        for (source, wait), indices in requests.items():
            for part in self._split(indices):
                stream = ChunkStream(source, wait, part)
                stream.future = self._pool.submit(self._run_stream, stream)
                self._owner.update(dict.fromkeys(part, stream))
                self._streams.append(stream)

    def _sources(self, i: int, holders: list[str], owners: list[str | None], mates: list[str]) -> list[Source]:
        """Where chunk `i` is asked, in order, with the `wait` each source is asked for. `mates`: our
        mates not demoted, other than us, the learner and the holders, sorted."""
        host, learner = self._host, self.learner
        me, usable = host.node.peer_id, host.usable(holders)
        tried = [Source(usable[(i + r) % len(usable)], 0.0) for r in range(min(len(usable), host.cfg.holder_tries))]
        mate = owners[i]
        if mate in (None, me, learner):  # ours to take from the learner: no mate has it before us
            return tried + [Source(learner, 0.0)] * 2
        if mate not in holders and host.usable([mate]):
            tried.append(Source(mate, host.peer_wait))
        return tried + self._hedge_mates(i, mate, mates) + [Source(learner, 0.0)] * 2

    def _hedge_mates(self, i: int, owner: str, mates: list[str]) -> list[Source]:
        """Up to `holder_tries` of `mates` other than chunk `i`'s `owner` (they take it from the
        owner), in their order from a start that a hash of (our id, i) picks: the hedges of the
        samplers sharing one owner spread over its mates rather than all landing on one. Each may
        hold the request for the chunk while it is still coming (`peer_wait`), as the owner may."""
        n, tries = len(mates), self._host.cfg.holder_tries
        if not n or not tries:
            return []
        r = zlib.crc32(f"{self._host.node.peer_id}/{i}".encode()) % n
        ring = (mates[(r + k) % n] for k in range(min(n, tries + 1)))  # the owner is among them at most once
        return [Source(m, self._host.peer_wait) for m in ring if m != owner][:tries]

    STREAM_BYTES = 2 * CHUNK_SIZE
    """Bytes asked of one source per stream (`_split`), up to the fetcher's `parallel` streams: one
    stream's window (p2pd's yamux) would cap a large share at ~26-51 Mbit/s at 80 ms, and more
    streams cost each source work per stream (one per chunk, up to 4, was ~1 s slower than one per
    2 MiB at 100 Mbit/s on the emulated WAN: docs/BENCHMARKS.md). In bytes, not chunks: a 20 MiB
    patch's 80 chunks of 256 KiB over 8 mates ask each owner 2.5 MiB, one stream, as its 20
    chunks of 1 MiB did."""

    def _split(self, indices: list[int]) -> list[list[int]]:
        """Several streams to one source, interleaved, so a large version keeps the link busy."""
        k = min(self._parallel, max(1, len(indices) * self.chunk // self.STREAM_BYTES))
        return [indices[j::k] for j in range(k)]

    def _run_stream(self, stream: ChunkStream) -> None:  # in a pool thread
        host, source, indices, wait = self._host, stream.source, stream.indices, stream.wait
        version = self.entry.version
        from_learner = source == host.learner()
        stream.progress = time.monotonic()
        pos = 0

        def on_chunk(chunk: memoryview | bytes) -> None:  # in this thread, as each chunk arrives
            nonlocal pos
            if pos >= len(indices):
                return
            if stream.hedged and all(i in self.got for i in indices):
                raise Superseded  # its hedges delivered the rest: free this thread, not wait out a slow source
            index, pos = indices[pos], pos + 1
            if chunk_digest(chunk) == self.entry.chunks[index]:
                # counted and traced before `got` holds it: `run` returns once `got` is complete, and
                # its caller reads the counts and the trace then
                host.count("bytes_from_learner" if from_learner else "bytes_from_holders", len(chunk))  # all received
                with self._first:  # two streams cannot both be first
                    first = index not in self.got
                    if first:
                        self.arrived.append((time.time(), index, source))
                        self.got[index] = chunk
                now = time.monotonic()
                if stream.delivered:
                    self._gap(source, now - stream.progress)
                stream.delivered, stream.progress = stream.delivered + 1, now
                host.store.add_chunk(self.chain, version, index, chunk)  # mates may ask for it right away
                if not first:  # a hedge's second copy: received, and waste
                    host.count("bytes_duplicate", len(chunk))
            elif chunk:
                host.count("bad_chunks")
                host.demote(source, "a chunk that failed its hash")
                log.warning("chunk %d of version %d from %s failed its hash; trying another source",
                            index, version, short_id(source))

        try:  # the whole stream's bound allows a slow link; `stall` bounds each item
            request = ChunkRequest(self.chain, version, indices, wait).encode()
            stall = host.cfg.stall(wait, learner=from_learner)  # each item's bound; the whole stream's, a backstop
            n = host.node.call_stream(source, CHUNKS, request, host.rpc_timeout + len(indices) * stall.within_s(self.chunk),
                                      on_chunk, max_item=self.chunk, stall=stall)
            if n < len(indices):  # it holds no more of them (a stream ends at the first chunk not held):
                # `_step` asks the rest of their next source. Not a failure: the protocol's "not held"
                host.count("chunks_not_held", len(indices) - n)
                log.debug("%s sent %d of %d chunks of version %d; the rest go to their next source", short_id(source),
                          n, len(indices), version)
            if wait == 0.0 and not stream.delivered:  # a holder with nothing of what it announced
                host.demote(source, f"announced version {version} and served none of it")
        except Superseded:  # slow, not faulty (it delivered): the hedge's copies won
            host.count("superseded_streams")
        except StreamStalled as e:  # it accepted, then sent nothing or a trickle: abandoned mid-stream
            host.count("stalled_streams")
            host.count("chunks_failed", len(indices) - stream.delivered)
            host.demote(source, str(e))
            log.info("chunk stream from %s abandoned: %s", short_id(source), e)
        except RemoteError as e:  # it broke the protocol (e.g. an item larger than a chunk): refused
            host.count("bad_streams")
            host.count("chunks_failed", len(indices) - stream.delivered)
            host.demote(source, str(e))
            log.warning("chunk stream from %s refused: %s", short_id(source), e)
        except Exception as e:  # a source that vanished or is slow: the chunk's next source is asked
            # chunks_failed, here and above: the chunks of a stream that ended in an error, asked of
            # their next source (what the source sent of them may have been lost in flight)
            host.count("chunks_failed", len(indices) - stream.delivered)
            log.debug("chunks %s of version %d from %s failed: %s", indices[:3], version, short_id(source), e)
