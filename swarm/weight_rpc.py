"""Weight versions over the swarm: a signed manifest and hash-checked chunks served by every holder.

Learner side (`WeightServer`) serves two RPCs:
  hetero.manifest.v1  b"" or [chain, version, wait] (a long poll: answered once the learner has a
                      version newer than that one, or after `wait` s)
                      -> the manifest of the learner's current chain segment (its last keyframe
                      and the deltas after it), sealed by the learner: chain id, model, and per
                      version its base, size and per-chunk sha256 (which pin every byte: a
                      whole-blob hash on top would only cost the fetcher a pass over it).
  hetero.chunks.v1    [chain, version, [index, ...], wait] -> a stream of those chunks (b"" for
                      one not held). Served by the learner *and* by every sampler for the versions
                      it holds (announced in the DHT) or is downloading, so the learner's upload
                      need not grow with the number of samplers (`ChunkStore`, `chunk_owner`).
Sampler side (`WeightFetcher`): reads the manifest of the learner it follows (refusing one that
learner did not seal), plans which versions to fetch (`exchange.plan_fetch`), gathers chunks from
holders, mates and the learner, and checks every chunk and the whole blob's size against the
manifest (a stream can silently lose its tail, so nothing is trusted unverified). No source can
hold a fetch hostage (`FetchConfig`): each item is bounded in time and rate, a stream that stalls
is hedged to the chunk's next source (the learner last), and a source that stalls or lies is
demoted with backoff (`PeerStrikes`). Weight loads follow the same injected-delay model as the
simulator (`ReloadTimer`).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import queue
import random
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait as wait_futures
from dataclasses import dataclass, field
from typing import Callable

import msgpack

from .delay import DelayConfig, ReloadTimer
from .envelope import open_envelope, seal
from .exchange import WeightVersion, plan_fetch
from .identity import short_id
from .p2p import CallStopped, RemoteError, Stall, StreamStalled, SwarmNode
from .records import RecordError

log = logging.getLogger(__name__)

MANIFEST, CHUNKS = "hetero.manifest.v1", "hetero.chunks.v1"
CHUNK_SIZE = 1024 * 1024
MAX_INDICES = 1 << 16


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


class ChunkStore:
    """The weight blobs of one chain that this peer holds, served chunk by chunk to any peer.

    A request [chain, version, [index, ...], wait] is answered with a stream of those chunks, in
    order, b"" for each one not held. A version still being downloaded is served chunk by chunk as its
    verified chunks arrive, and a request with `wait` > 0 for such a version waits (at most
    `wait`, capped at MAX_WAIT) for the chunk instead of answering b"" at once. That is what lets
    samplers fetching the same version at the same time share it (see `chunk_owner`). Every byte a
    fetcher receives is checked against the learner-signed manifest, so a holder cannot serve
    wrong weights, only fail to help.
    """

    MAX_WAIT = 10.0
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
        self.malformed = 0
        """Chunk requests refused as malformed (logged with the reason)."""
        node.add_stream_handler(CHUNKS, self._on_chunks)

    def put(self, chain: str, version: int, blob: bytes) -> None:
        if chain != self.chain:
            self.reset(chain)
        self.blobs[version] = blob
        self.partial.pop(version, None)

    def reset(self, chain: str) -> None:
        self.chain, self.blobs, self.partial = chain, {}, {}

    def retain(self, versions) -> None:
        """Prune every held version not in `versions` (those the learner no longer lists)."""
        keep = set(versions)
        self.blobs = {v: b for v, b in self.blobs.items() if v in keep}

    def begin(self, chain: str, version: int) -> None:
        if chain != self.chain:
            self.reset(chain)
        self.partial.setdefault(version, {})

    def add_chunk(self, chain: str, version: int, index: int, chunk: bytes | memoryview) -> None:
        if chain == self.chain and version in self.partial:
            self.partial[version][index] = chunk

    def abandon(self, version: int) -> None:
        self.partial.pop(version, None)

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
            return memoryview(blob)[index * CHUNK_SIZE : (index + 1) * CHUNK_SIZE] if 0 <= index * CHUNK_SIZE < len(blob) else None
        return self.partial.get(version, {}).get(index)

    async def _on_chunks(self, payload: bytes, remote: str):
        try:
            chain, version, indices, wait = msgpack.unpackb(payload)
            version, indices, wait = int(version), [int(i) for i in indices], min(float(wait), self.MAX_WAIT)
            if len(indices) > MAX_INDICES:
                raise ValueError(f"more than {MAX_INDICES} chunks in one request")
        except Exception as e:
            self.malformed += 1
            log.warning("malformed chunk request from %s: %s", short_id(remote), e)
            return
        if self._waiting[remote] >= self.MAX_WAITING:
            wait = 0.0  # this peer has enough requests waiting already: answer what is here now
        deadline = time.monotonic() + wait
        self._waiting[remote] += 1
        try:
            for index in indices:
                chunk = self._lookup(chain, version, index)
                # a download in progress here, or about to start: wait for the chunk briefly
                while chunk is None and self._coming(chain, version) and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                    chunk = self._lookup(chain, version, index)
                chunk = chunk or b""
                self.served_bytes += len(chunk)
                yield chunk
        finally:
            self._waiting[remote] -= 1
            if not self._waiting[remote]:
                del self._waiting[remote]


def chunk_owner(mates: list[str], version: int, index: int) -> str | None:
    """The sampler that takes chunk `index` of `version` from the learner; the others take it from
    that sampler. `mates` are the samplers following the same learner (sorted, so that every one of
    them computes the same owner without talking). Rotating by version spreads single-chunk deltas.
    With N mates fetching together, the learner uploads each chunk once instead of N times.
    """
    return mates[(index + version) % len(mates)] if mates else None


@dataclass(frozen=True)
class FetchConfig:
    """How long a sampler waits on a source of chunks before it goes to the next one.

    The defaults are far from what an honest source needs over the emulated WAN (100 Mbit/s, 80 ms:
    a 1 MiB chunk in ~0.1 s alone, ~0.4 s with 4 streams sharing the link, ~1.3 s with 16) and
    close enough that a holder that stalls or trickles costs a version or two, once."""

    idle_s: float = 10.0
    """A stream whose next item header does not come within this (plus the request's own `wait`
    for a mate's download) is abandoned: a peer that accepted and says nothing."""
    min_rate: float = 128 * 1024
    """Bytes/s an item must average once `idle_s` of slack is spent (a 1 MiB chunk: 10 + 8 s), so
    a frame header claiming 1 MiB followed by a byte a second is abandoned mid-frame."""
    hedge_s: float = 3.0
    """A stream that delivered no chunk for this long (plus its `wait`) has its remaining chunks
    asked of the next source too, the first verified copy winning; the slow source is demoted.
    The learner, the last resort, is never hedged against itself."""
    holder_tries: int = 2
    """Holders asked for one chunk before the chunk's owner and the learner: with one bad holder
    the learner is reached within (holder_tries + 1) hedges, however many holders announce."""
    demote_s: float = 30.0
    """How long a demoted peer (stalled, trickled, lied, announced a version it did not serve) is
    not asked; each further strike doubles it, up to `demote_max_s`."""
    demote_max_s: float = 600.0
    forget_s: float = 3600.0
    """A peer with no strike for this long starts again from `demote_s`."""
    long_poll_s: float = 10.0
    """The learner holds a sampler's request for its manifest this long at most, answering the
    moment it publishes (`WeightServer`): a version is fetched when it exists, not at the next
    poll. 0: poll (once a second) and fetch what is there."""

    def __post_init__(self) -> None:
        if min(self.idle_s, self.min_rate, self.hedge_s, self.demote_s) <= 0 or self.holder_tries < 0 \
                or not 0 <= self.long_poll_s <= WeightServer.MAX_WAIT:
            raise ValueError(f"FetchConfig: timeouts, rate and demotion must be > 0, holder_tries >= 0, "
                             f"0 <= long_poll_s <= {WeightServer.MAX_WAIT:g}: {self}")
        if self.demote_max_s < self.demote_s:
            raise ValueError(f"FetchConfig: demote_max_s ({self.demote_max_s}) must be >= demote_s ({self.demote_s})")

    def stall(self, wait: float) -> Stall:
        return Stall(self.idle_s + wait, self.min_rate)


@dataclass
class PeerStrikes:
    """Peers that failed us, benched with exponential backoff: the n-th strike in a row benches a
    peer for min(base * 2^(n-1), cap) seconds; strikes while benched count once (one offence, e.g.
    four streams stalling together, is one strike); a peer clean for `forget` s starts again at n=1.
    Not thread-safe: the fetcher holds its lock."""

    base: float
    cap: float
    forget: float
    _strikes: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    """peer -> (strikes in a row, time of the last, benched until)."""

    def strike(self, peer: str, now: float) -> bool:
        """Record a failure of `peer` at `now`; True if it counted (the peer was not benched)."""
        n, last, until = self._strikes.get(peer, (0, -float("inf"), -float("inf")))
        if now < until:
            return False
        n = 1 if now - last > self.forget else n + 1
        self._strikes[peer] = (n, now, now + min(self.base * 2 ** (n - 1), self.cap))
        return True

    def benched(self, peer: str, now: float) -> bool:
        return now < self._strikes.get(peer, (0, 0.0, -float("inf")))[2]

    def strikes(self, peer: str, now: float) -> int:
        n, last, _ = self._strikes.get(peer, (0, -float("inf"), 0.0))
        return 0 if now - last > self.forget else n

    def order(self, peers: list[str], now: float) -> list[str]:
        """`peers` without the benched ones, those with fewer recent strikes first (stable)."""
        return sorted((p for p in peers if not self.benched(p, now)), key=lambda p: self.strikes(p, now))


@dataclass(eq=False)
class _Stream:
    """One chunk request in flight (see `WeightFetcher._gather`)."""
    source: str
    wait: float
    indices: list[int]
    progress: float | None = None
    """When it was sent or last delivered a chunk (None while it waits for a worker)."""
    future: Future | None = None
    delivered: int = 0
    hedged: bool = False


class WeightServer:
    """The learner's side: keeps the current chain segment and serves its manifest and chunks.

    A manifest request may be a long poll: [chain, version, wait] asks for the manifest once the
    learner's newest version is no longer (chain, version), waiting at most `wait` s (capped at
    `MAX_WAIT`). Samplers then hear of a version the moment it is published, not at their next
    poll, and ask less often than a poll a second would. An empty request (or one that is not a
    valid long poll: counted) is answered at once. One waiting request per peer, `MAX_WAITERS` in
    all: beyond that, at once."""

    MAX_WAIT = 10.0
    MAX_WAITERS = 256
    MAX_REQUEST = 512

    def __init__(self, node: SwarmNode) -> None:
        self.node = node
        self.store = ChunkStore(node, waits_for_coming=False)
        self._entries: list[dict] = []
        self._manifest = b""
        self._newest: tuple[str, int] | None = None
        self._published: asyncio.Event | None = None
        """Set (and replaced) in the node's loop when a version is published: wakes the long polls."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: set[str] = set()
        self.stats: collections.Counter[str] = collections.Counter()
        """manifests served, long polls that waited, malformed requests."""
        node.add_handler(MANIFEST, self._on_manifest)

    async def _on_manifest(self, payload: bytes, remote: str) -> bytes:
        self.stats["manifests"] += 1
        after, wait = self._long_poll(payload, remote)
        if wait > 0 and after == self._newest and remote not in self._waiting and len(self._waiting) < self.MAX_WAITERS:
            if self._published is None:
                self._loop, self._published = asyncio.get_running_loop(), asyncio.Event()
            published = self._published
            self._waiting.add(remote)
            self.stats["long_polls"] += 1
            try:
                await asyncio.wait_for(published.wait(), wait)
            except asyncio.TimeoutError:
                pass
            finally:
                self._waiting.discard(remote)
        return self._manifest

    def _long_poll(self, payload: bytes, remote: str) -> tuple[tuple[str, int] | None, float]:
        """(the version the caller holds, seconds it will wait for a newer one); (None, 0) for a
        plain request or a malformed one."""
        if not payload:
            return None, 0.0
        try:
            if len(payload) > self.MAX_REQUEST:
                raise ValueError(f"{len(payload)} bytes")
            chain, version, wait = msgpack.unpackb(payload)
            if not isinstance(chain, str) or not isinstance(version, int) or not isinstance(wait, (int, float)):
                raise ValueError("not [chain, version, wait]")
            return (chain, version), min(max(float(wait), 0.0), self.MAX_WAIT)
        except Exception as e:
            self.stats["malformed"] += 1
            log.info("malformed manifest request from %s (%s); answered at once", short_id(remote), e)
            return None, 0.0

    def _wake(self) -> None:  # in the node's loop
        if self._published is not None:
            self._published.set()
            self._published = asyncio.Event()

    def publish(self, wv: WeightVersion) -> None:
        if wv.base is None:  # a keyframe starts a new chain segment; the last one is still served
            # until the next keyframe, so that downloads under way (from its manifest) can finish
            self.store.retain(e["version"] for e in self._entries if wv.chain == self.store.chain)
            self._entries = []
        self.store.put(wv.chain, wv.version, wv.blob)
        chunks = [wv.blob[i : i + CHUNK_SIZE] for i in range(0, len(wv.blob), CHUNK_SIZE)]
        self._entries.append({"version": wv.version, "base": -1 if wv.base is None else wv.base, "size": len(wv.blob),
                              "chunks": [_sha(c) for c in chunks]})
        manifest = {"model_id": wv.model_id, "chain": wv.chain, "chunk_size": CHUNK_SIZE,
                    "versions": self._entries, "learner": self.node.peer_id, "time": time.time()}
        self._manifest = seal(self.node.identity, msgpack.packb(manifest))
        self._newest = (wv.chain, wv.version)
        if self._loop is not None:  # publish runs in the learner's thread; the waiters in the node's loop
            try:
                self._loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # the node's loop is closed: it is shutting down, nobody waits
                pass


class WeightFetcher:
    """A sampler's side: fetches versions from holders, mates and the learner it follows."""

    def __init__(self, node: SwarmNode, learner: Callable[[], str | None], weight_delay: DelayConfig = DelayConfig(),
                 rng: random.Random | None = None, rpc_timeout: float = 30.0,
                 mates: Callable[[], list[str]] = lambda: [], parallel: int = 4, peer_wait: float = 5.0,
                 cfg: FetchConfig = FetchConfig()) -> None:
        self.node = node
        self.learner = learner
        """Returns the peer id of the learner to follow (None while none is known)."""
        self.mates = mates
        """Returns the samplers that follow the same learner with the same model (`chunk_owner`)."""
        self._timer = ReloadTimer(weight_delay, rng or random.Random(0))
        self.rpc_timeout = rpc_timeout
        self.peer_wait = peer_wait
        """How long to wait for a chunk from a mate that is downloading it right now."""
        self.stats: collections.Counter[str] = collections.Counter()
        self._stats_lock = threading.Lock()
        self.store = ChunkStore(node)
        self.cfg = cfg
        self.strikes = PeerStrikes(cfg.demote_s, cfg.demote_max_s, cfg.forget_s)
        """Holders and mates that stalled or lied, benched (under `_stats_lock`)."""
        self.demoted: collections.Counter[str] = collections.Counter()
        """peer -> times it was demoted (`why` in the log)."""
        # several chunk requests in flight: one call at a time leaves the link idle between them;
        # room for as many again that were hedged and are still running out their stall bounds
        self._parallel = max(1, parallel)
        self._pool = ThreadPoolExecutor(4 * self._parallel, thread_name_prefix="chunk-fetch")
        # a DHT store takes tens of ms: the new weights need not wait for it. One daemon thread keeps
        # order and announces only the newest holdings; an executor's worker would be joined at exit,
        # and hang it while a store waits on a DHT that is shutting down
        self._announcements: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._announcer, name="announce-holdings", daemon=True).start()

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:  # chunk fetches run on several threads
            self.stats[key] += n

    def _demote(self, peer: str, why: str) -> None:
        """A strike against a holder or mate (never the learner: it is the last resort)."""
        if peer == self.learner():
            return
        with self._stats_lock:
            counted = self.strikes.strike(peer, time.monotonic())
            if counted:
                self.stats["demotions"] += 1
                self.demoted[peer] += 1
        if counted:
            log.info("demoted %s (%s): not asked for chunks for a while", short_id(peer), why)

    def _usable(self, peers: list[str]) -> list[str]:
        with self._stats_lock:
            return self.strikes.order(peers, time.monotonic())

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._announcements.put(None)

    def fetch(self, have_chain: str, have_version: int, wait: float = 0.0,
              stop: threading.Event | None = None) -> list[WeightVersion] | None:
        """Versions to apply, in order, to go from `have_version` of `have_chain` to the newest one the
        learner lists (see `exchange.plan_fetch`), each verified against its sealed manifest; None if
        there is nothing newer, the injected delay has not passed, or the fetch failed (counted).
        `wait` > 0 asks the learner to answer only once it has a newer version (a long poll, at
        most `wait` s); `stop` gives the wait up."""
        learner = self.learner()
        now = time.time()
        if learner is None or not self._timer.due(now):
            return None
        wanted: list[int] = []
        try:
            manifest = self._manifest(learner, (have_chain, have_version), wait, stop)
            if manifest is None:
                return None
            chain, entries = manifest["chain"], {e["version"]: e for e in manifest["versions"]}
            wanted = plan_fetch(chain, list(entries), have_chain, have_version)
            for v in wanted:  # from now on, a mate that asks us for these waits for them: it heard
                self.store.begin(chain, v)  # of them when we did, and its requests come at once
            # one version behind on the same chain (a sampler keeping up): whoever holds the new
            # version already is a mate, asked as its chunks' owner, so the DHT get of the holder
            # records is skipped: it would sit on the critical path of every version
            following = chain == have_chain and wanted == [have_version + 1]
            holders = self._holders(chain) if wanted and not following else {}
            # a private sampler (behind a NAT) owns no chunks: it takes every one from its public mates
            mates = sorted({*self.mates(), *([] if self.node.private else [self.node.peer_id])}) if wanted else []
            blobs = [self._download(learner, chain, entries[v], holders.get(v, []), mates) for v in wanted]
        except CallStopped:
            return None
        except Exception as e:  # a learner that vanished, a bad chunk from every source: try later
            for v in wanted:  # chunks of versions fetched before the failure are not kept either
                self.store.abandon(v)
            self._count("weight_fetch_failures")
            log.warning("weights fetch from %s failed (%s: %s); keeping version %d", short_id(learner),
                        type(e).__name__, e, have_version)
            return None
        self._timer.arm(now)
        for v, blob in zip(wanted, blobs):
            self.store.put(chain, v, blob)
        if wanted:
            self.store.retain(entries)  # versions the learner no longer lists are of no use to anyone
            self._announcements.put((chain, sorted(self.store.blobs)))
        base = lambda v: None if entries[v]["base"] < 0 else entries[v]["base"]  # noqa: E731
        return [WeightVersion(manifest["model_id"], chain, v, base(v), blob) for v, blob in zip(wanted, blobs)] or None

    def _announcer(self) -> None:
        while (item := self._announcements.get()) is not None:
            while not self._announcements.empty():  # only the newest holdings matter
                if (item := self._announcements.get()) is None:
                    return
            self._announce(*item)

    def _announce(self, chain: str, versions: list[int]) -> None:
        if self.node.private:  # mates would time out on us and demote us: serve no one
            return
        try:
            if not self.node.announce_holdings(chain, versions):
                log.info("the DHT refused our holder record for %s", versions)
        except Exception as e:  # mates fall back on the learner; the next fetch announces again
            log.warning("announcing holdings failed: %s", e)

    def _holders(self, chain: str) -> dict[int, list[str]]:
        """version -> peers (other than us) announcing they hold it, in an order of our own."""
        by_version: dict[int, list[str]] = collections.defaultdict(list)
        for h in self.node.holders():
            if h.get("chain") == chain and h.get("peer_id") != self.node.peer_id:
                for v in h.get("versions", []):
                    by_version[v].append(h["peer_id"])
        rng = random.Random(self.node.peer_id)  # each fetcher spreads its load differently
        for peers in by_version.values():
            rng.shuffle(peers)
        return by_version

    def _manifest(self, learner: str, have: tuple[str, int], wait: float, stop: threading.Event | None) -> dict | None:
        request = msgpack.packb([have[0], have[1], wait]) if wait > 0 else b""
        sealed = self.node.call(learner, MANIFEST, request, self.rpc_timeout + wait, stop=stop)
        if not sealed:
            return None
        record, signer = open_envelope(sealed)
        if signer != learner:
            self._count("forged_manifests")
            raise RecordError("signature", f"manifest signed by {short_id(signer)}, not by the learner we follow")
        return msgpack.unpackb(record, raw=False)

    def _download(self, learner: str, chain: str, entry: dict, holders: list[str], mates: list[str]) -> bytes:
        """One version's blob. Every chunk is asked at once: those this sampler owns
        (`chunk_owner`) of the learner, the others of their owners, who serve each chunk as it
        arrives and wait for one still coming (`ChunkStore`). So the mates' copies flow while the
        learner's upload is under way (pipelined per chunk), rather than after this sampler's own
        share is complete. The whole is checked against the learner-signed manifest entry."""
        version, n = entry["version"], len(entry["chunks"])
        owners = [chunk_owner(mates, version, i) for i in range(n)]  # (`fetch` began it in the store)
        got: dict[int, memoryview | bytes] = {}  # verified chunks, filled by several streams (threads)
        try:
            self._gather(learner, chain, entry, list(range(n)), holders, owners, got)
        except Exception:
            self.store.abandon(version)
            raise
        blob = b"".join(got[i] for i in range(n))
        if len(blob) != entry["size"]:  # every chunk is verified: only their number and sizes are left
            self.store.abandon(version)
            raise RecordError("sizes", "reassembled weights do not match the manifest")
        return blob

    def _gather(self, learner: str, chain: str, entry: dict, indices: list[int], holders: list[str],
                owners: list[str | None], got: dict[int, memoryview | bytes]) -> None:
        """Fill `got` with verified chunks `indices`. Each chunk has its own list of sources
        (`_sources`): holders of the whole version not demoted (chunk i from holder i+r in try r,
        spreading the load), then its owner when that is a mate that may be downloading it now,
        the learner last (twice: a reset libp2p stream reads as its end). Chunks asking the same
        source go in a few streams at once. A chunk a stream did not deliver (it ended, failed, or
        sent a bad copy) moves to its next source; one whose stream stalls for `hedge_s` is asked
        of its next source *too* (hedged: the first verified copy wins, the slow source is
        demoted). So a holder that stalls or trickles delays a chunk by one hedge at most."""
        plans = {i: self._sources(i, learner, holders, owners) for i in indices}
        tries = dict.fromkeys(indices, 0)
        owner: dict[int, _Stream] = {}  # chunk -> the stream now responsible for it
        streams: list[_Stream] = []

        def launch(chunks: list[int]) -> None:
            requests: dict[tuple[str, float], list[int]] = collections.defaultdict(list)
            for i in chunks:
                if tries[i] < len(plans[i]):
                    requests[plans[i][tries[i]]].append(i)
                    tries[i] += 1
            for (source, wait), idx in requests.items():
                for part in self._split(idx):
                    stream = _Stream(source, wait, part)
                    stream.future = self._pool.submit(self._stream_chunks, stream, chain, entry, got)
                    owner.update(dict.fromkeys(part, stream))
                    streams.append(stream)

        launch(list(indices))
        while missing := [i for i in indices if i not in got]:
            now = time.monotonic()
            for stream in [s for s in streams if s.future.done()]:
                streams.remove(stream)
                launch([i for i in stream.indices if i not in got and owner.get(i) is stream])
            for stream in streams:
                if not stream.hedged and stream.source != learner and self._stalled(stream, now):
                    stream.hedged = True
                    self._count("hedged_streams")
                    self._demote(stream.source, f"no chunk in {now - stream.progress:.1f} s")
                    launch([i for i in stream.indices if i not in got and owner.get(i) is stream])
            alive = {i for stream in streams for i in stream.indices}
            if dead := [i for i in missing if i not in got and i not in alive and tries[i] >= len(plans[i])]:
                raise RecordError("sizes", f"chunks {dead[:5]} of version {entry['version']} verified from no source")
            wait_futures([s.future for s in streams], timeout=0.1, return_when=FIRST_COMPLETED)

    def _sources(self, i: int, learner: str, holders: list[str], owners: list[str | None]) -> list[tuple[str, float]]:
        """Where chunk `i` is asked, in order, with the `wait` each source is asked for."""
        me, usable = self.node.peer_id, self._usable(holders)
        tried = [(usable[(i + r) % len(usable)], 0.0) for r in range(min(len(usable), self.cfg.holder_tries))]
        mate = owners[i]
        if mate not in (None, me, learner, *holders) and self._usable([mate]):
            tried.append((mate, self.peer_wait))
        return tried + [(learner, 0.0)] * 2

    def _stalled(self, stream: _Stream, now: float) -> bool:
        if stream.progress is None:  # queued behind other streams: not the source's fault
            return False
        return now - stream.progress > self.cfg.hedge_s + (stream.wait if not stream.delivered else 0.0)

    def _split(self, indices: list[int]) -> list[list[int]]:
        """Several streams to one source, interleaved, so a large version keeps the link busy."""
        k = min(self._parallel, max(1, len(indices) // 2))
        return [indices[j::k] for j in range(k)]

    def _stream_chunks(self, stream: _Stream, chain: str, entry: dict, got: dict[int, memoryview | bytes]) -> None:
        source, indices, wait = stream.source, stream.indices, stream.wait
        version, pos = entry["version"], 0
        from_learner = source == self.learner()
        stream.progress = time.monotonic()

        def on_chunk(chunk: memoryview | bytes) -> None:  # in this thread, as each chunk arrives
            nonlocal pos
            if pos >= len(indices):
                return
            index, pos = indices[pos], pos + 1
            if _sha(chunk) == entry["chunks"][index]:  # hashlib lets go of the GIL: streams hash at once
                got.setdefault(index, chunk)
                stream.delivered, stream.progress = stream.delivered + 1, time.monotonic()
                self.store.add_chunk(chain, version, index, chunk)  # mates may ask for it right away
                self._count("bytes_from_learner" if from_learner else "bytes_from_holders", len(chunk))
            elif chunk:
                self._count("bad_chunks")
                self._demote(source, "a chunk that failed its hash")
                log.warning("chunk %d of version %d from %s failed its hash; trying another source",
                            index, version, short_id(source))

        try:  # the whole stream's bound allows a slow link; `stall` bounds each item
            n = self.node.call_stream(source, CHUNKS, msgpack.packb([chain, version, indices, wait]),
                                      self.rpc_timeout + wait + 5.0 * len(indices), on_chunk, max_item=CHUNK_SIZE,
                                      stall=self.cfg.stall(wait))
            if n < len(indices):
                self._count("short_streams")
                log.info("%s sent %d of %d chunks of version %d; asking again", short_id(source), n, len(indices), version)
            if wait == 0.0 and not stream.delivered:  # a holder with nothing of what it announced
                self._demote(source, f"announced version {version} and served none of it")
        except StreamStalled as e:  # it accepted, then sent nothing or a trickle: abandoned mid-stream
            self._count("stalled_streams")
            self._demote(source, str(e))
            log.info("chunk stream from %s abandoned: %s", short_id(source), e)
        except RemoteError as e:  # it broke the protocol (e.g. an item larger than a chunk): refused
            self._count("bad_streams")
            self._demote(source, str(e))
            log.warning("chunk stream from %s refused: %s", short_id(source), e)
        except Exception as e:  # a source that vanished or is slow: the chunk's next source is asked
            log.debug("chunks %s of version %d from %s failed: %s", indices[:3], version, short_id(source), e)


class WeightPrefetcher:
    """Fetches versions in a thread of its own, once every `interval` s, while the sampler generates.

    A sampler that fetched between batches would stall generation for the whole download (seconds
    for a patch over a home link) and, starting at its own moment, would not be downloading when its
    mates ask it for the chunks it owns: they would take those from the learner. Polling apart from
    generation keeps the mates in step (`ChunkStore` waits briefly for a version a mate is about to
    fetch) and the sampler only applies what has already arrived (`take`).
    """

    def __init__(self, fetcher: WeightFetcher, interval: float = 1.0) -> None:
        self.fetcher = fetcher
        self.interval = interval
        """The least time between two polls; each is a long poll (`FetchConfig.long_poll_s`)."""
        self._lock = threading.Lock()
        self._pending: list[WeightVersion] = []
        self._have = ("", -1)
        """(chain, version) the pending list leads to: what the next poll fetches from."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weight-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self._poll()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))

    def _poll(self) -> None:
        with self._lock:
            have = self._have
        try:  # failures are counted there and retried here
            versions = self.fetcher.fetch(*have, wait=self.fetcher.cfg.long_poll_s, stop=self._stop)
        except Exception:  # a bug must not end the thread: the sampler would never update again
            log.exception("weight prefetch failed")
            return
        if not versions:
            return
        with self._lock:
            if self._have != have:  # `take` restarted us meanwhile: these lead from a stale base
                return
            self._pending += versions
            keyframes = [i for i, wv in enumerate(self._pending) if wv.base is None]
            if keyframes:  # nothing before the last keyframe is needed any more
                self._pending = self._pending[keyframes[-1]:]
            self._have = (versions[-1].chain, versions[-1].version)

    def take(self, have_chain: str, have_version: int) -> list[WeightVersion] | None:
        """The versions fetched so far that lead from `have_version` of `have_chain` (or from a
        keyframe) to the newest; None if there are none. If the sampler holds something they do not
        lead from (it refused a version, or started over), the next poll fetches from what it holds."""
        with self._lock:
            pending, self._pending = self._pending, []
            starts = [i for i, wv in enumerate(pending)
                      if wv.base is None or (wv.chain == have_chain and wv.base == have_version)]
            if not starts:
                if (have_chain, have_version) != self._have:
                    self._have = (have_chain, have_version)
                return None
            return pending[starts[-1]:]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.fetcher.rpc_timeout + 5)
        self.fetcher.close()
