"""A sampler's side: fetches versions from holders, mates and the learner it follows (`WeightFetcher`)."""

from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import random
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Callable

from swarm.delay import DelayConfig, ReloadTimer
from swarm.exchange import WeightVersion, plan_fetch
from swarm.identity import short_id
from swarm.p2p import CallStopped, SwarmNode
from swarm.wire.rollout import RecordError
from swarm.weights.chunks import ChunkStore, chunk_owner
from swarm.weights.config import FetchConfig
from swarm.weights.gather import Gather
from swarm.wire.chunks import MAX_REQUEST_WAIT
from swarm.weights.relay import TailRelay
from swarm.wire.manifest import MANIFEST, TAIL, Manifest, ManifestRequest, TailNotice, TailRequest, VersionEntry, tail_digest
from swarm.weights.strikes import PeerStrikes
from swarm.wire.reasons import Drop

log = logging.getLogger(__name__)

TAIL_TRIES = 3
"""Relays a `TailNotice` names that a sampler asks for the tail before the learner."""
TAIL_HEDGE_S = 0.5
"""How long a relay asked for a tail has to answer before the next source is asked too (the first
copy with the notice's sha256 wins): a relay that holds the tail answers in a round trip (a 3.4 kB
tail at 10 Mbit/s is 3 ms on the line), one that read its own copy late within a few, so three
relays that stall a request and then answer nothing cost a version 2 s, not three relays' waits."""

class WeightFetcher:
    """A sampler's side: fetches versions from holders, mates and the learner it follows.

    Reads the manifest of the learner it follows (refusing one that learner did not seal), plans
    which versions to fetch (`exchange.plan_fetch`), gathers their chunks (`Gather`), checks each
    whole blob's size against the manifest, and announces what it holds so that others fetch from
    it. Weight loads follow the same injected-delay model as the simulator (`ReloadTimer`)."""

    def __init__(self, node: SwarmNode, learner: Callable[[], str | None], weight_delay: DelayConfig = DelayConfig(),
                 rng: random.Random | None = None, rpc_timeout: float = 30.0,
                 mates: Callable[[], list[str]] = lambda: [], parallel: int = 4, peer_wait: float = MAX_REQUEST_WAIT,
                 cfg: FetchConfig = FetchConfig(), seeding: Callable[[], bool] = lambda: False) -> None:
        self.node = node
        self.learner = learner
        """Returns the peer id of the learner to follow (None while none is known)."""
        self.mates = mates
        """Returns the samplers that follow the same learner with the same model (`chunk_owner`)."""
        self.seeding = seeding
        """Returns whether those are the learner's seeders (a new swarm: swarm/discovery.py `seeders`)
        rather than samplers it credits: a seeder's chunks are then hedged to the learner, not to the
        other seeders (a key that took the keyframe and serves no one delays a download by one hedge
        time, not by a hedge and a wait at each of `holder_tries` other seeders)."""
        self._timer = ReloadTimer(weight_delay, rng or random.Random(0))
        self.rpc_timeout = rpc_timeout
        self.peer_wait = peer_wait
        """How long a mate downloading a chunk right now may hold our request for it (after the last
        chunk it sent us): its chunks come one round of the learner's upload to every mate apart, 8
        mates x 1 MiB at 25 Mbit/s 2.7 s, at 10 Mbit/s 6.7 s; so the most a peer may be asked to wait."""
        self.pace: float | None = None
        """Mean seconds between two chunks of one stream in the last download that measured one
        (`Gather.pace`): what hedges are timed by until a download has measured its own (capped
        there at `idle_s`, so a slow download cannot stretch the next ones' hedges further)."""
        self.stats: collections.Counter[str] = collections.Counter()
        self._stats_lock = threading.Lock()
        self.store = ChunkStore(node)
        self.relay = TailRelay(node, proven=lambda peer: peer in self.mates())
        """The learner's sealed tails we were sent, served to samplers it sends notices (hetero.tail.v1)."""
        self.cfg = cfg
        self.strikes = PeerStrikes(cfg.demote_s, cfg.demote_max_s, cfg.forget_s)
        """Holders and mates that stalled or lied, benched (under `_stats_lock`)."""
        self.demoted: collections.Counter[str] = collections.Counter()
        """peer -> times it was demoted (`why` in the log)."""
        self.arrivals: collections.deque[tuple[int, int, float, int, float]] = collections.deque(maxlen=64)
        """(arrival number, version, wall time it was held whole and checked, bytes, seconds since the
        manifest listed it) of the newest versions fetched: what a sampler's metrics report (the
        last few suffice); the number, counted from 1, tells a reader which it has seen."""
        self._arrived = 0
        self.chunk_arrivals: list[tuple[float, int, str]] = []
        """(wall time, chunk, source) of each chunk of the last version downloaded (`Gather.arrived`):
        where a spread spent its time (examples/bench_wan.py prints it per version)."""
        # several chunk requests in flight: one call at a time leaves the link idle between them;
        # room for as many again that were hedged and are still running out their stall bounds
        self._parallel = max(1, parallel)
        self._pool = ThreadPoolExecutor(4 * self._parallel, thread_name_prefix="chunk-fetch")
        # a DHT store takes tens of ms: the new weights need not wait for it. One daemon thread keeps
        # order and announces only the newest holdings; an executor's worker would be joined at exit,
        # and hang it while a store waits on a DHT that is shutting down
        self._announcements: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._announcer, name="announce-holdings", daemon=True).start()

    def count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:  # chunk fetches run on several threads
            self.stats[key] += n

    def demote(self, peer: str, why: str) -> None:
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

    def usable(self, peers: list[str]) -> list[str]:
        """`peers` not demoted now, those with fewer recent strikes first."""
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
            # a notice will do in place of the tail when there are mates (samplers like us, who
            # were likely sent it); we relay what we are sent unless no one can dial us
            others = any(m != self.node.peer_id for m in self.mates())
            request = ManifestRequest(have_chain, have_version, wait, notice=others, relay=not self.node.private)
            manifest = self._manifest(learner, request, stop)
            if manifest is None:
                return None
            listed = time.time()  # the long poll's wait is not part of the download
            chain, entries = manifest.chain, {e.version: e for e in manifest.versions}
            if chain == self.store.chain:  # what left the learner's segment, partial tries included
                self.store.retain(manifest.segment())
            wanted = plan_fetch(chain, list(entries), have_chain, have_version, manifest.first)
            for v in wanted:  # from now on, a mate that asks us for these waits for them: it heard
                self.store.begin(chain, v)  # of them when we did, and its requests come at once
            # one version behind on the same chain (a sampler keeping up): whoever holds the new
            # version already is a mate, asked as its chunks' owner, so the DHT get of the holder
            # records is skipped: it would sit on the critical path of every version
            following = chain == have_chain and wanted == [have_version + 1]
            # seeders (a new swarm's stand-in mates) are asked as owners only: not as holders, nor
            # for each other's chunks, so one that serves no one costs a download one hedge time
            seeding = self.seeding()
            holders = self._holders(chain) if wanted and not following and not seeding else {}
            mates = self._owners() if wanted else []
            hedges = [] if seeding else mates
            blobs = [self._download(learner, chain, entries[v], holders.get(v, []), mates, hedges) for v in wanted]
        except CallStopped:
            return None
        except Exception as e:  # a learner that vanished, a chunk no source gave us: try later
            # the chunks verified so far stay (the store's partial versions): the next try asks
            # only for the rest. Versions the learner stops listing are pruned with them (`retain`)
            self.count("weight_fetch_failures")
            log.warning("weights fetch from %s failed (%s: %s); keeping version %d", short_id(learner),
                        type(e).__name__, e, have_version)
            return None
        self._timer.arm(now)
        held = time.time()
        for v, blob in zip(wanted, blobs):
            self.store.put(chain, v, blob)
            self._arrived += 1  # this thread alone appends
            self.arrivals.append((self._arrived, v, held, len(blob), held - listed))
        if wanted:
            self.store.retain(manifest.segment())  # versions out of the learner's segment are of no use to anyone
            self._announcements.put((chain, sorted(self.store.blobs)))
        return [WeightVersion(manifest.model_id, chain, v, entries[v].base, blob) for v, blob in zip(wanted, blobs)] or None

    def _owners(self) -> list[str]:
        """The samplers among which a version's chunks are shared out (`chunk_owner`): our mates,
        those the learner credits (swarm/discovery.py, `earned`), us among them once credited. With
        none credited yet, we own every chunk (from the learner); a private sampler (behind a NAT)
        owns none: it takes every one from its public mates."""
        mates = set(self.mates())
        if not mates and not self.node.private:
            mates = {self.node.peer_id}
        return sorted(mates)

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
        """version -> our credited mates (other than us) announcing they hold it, shuffled by our own
        seed. Only theirs are read, one own key each (swarm/dht/records.py, `holdings_of`): a holder record
        costs a fresh key and nothing else (2,000 of them announcing coming versions stalled every
        sampler, issue 39), and a whole holders index would be as large as any keys make it."""
        by_version: dict[int, list[str]] = collections.defaultdict(list)
        for h in self.node.holdings_of([m for m in self.mates() if m != self.node.peer_id]):
            if h.chain == chain:
                for v in h.versions:
                    by_version[v].append(h.peer_id)
        rng = random.Random(self.node.peer_id)  # each fetcher spreads its load differently
        for peers in by_version.values():
            rng.shuffle(peers)
        return by_version

    def _manifest(self, learner: str, request: ManifestRequest, stop: threading.Event | None) -> Manifest | None:
        sealed = self.node.call(learner, MANIFEST, request.encode(), self.rpc_timeout + request.wait, stop=stop)
        if TailNotice.is_notice(sealed):
            sealed = self._relayed_tail(learner, TailNotice.decode(sealed), request, stop)
        if not sealed:
            return None
        manifest = Manifest.open(sealed, learner, forged=lambda: self.count("forged_manifests"))
        if manifest.versions and manifest.versions[0].version != manifest.first:  # a tail (the whole
            self.relay.keep(sealed)  # segment goes to a newcomer alone, never relayed)
        return manifest

    def _relayed_tail(self, learner: str, notice: TailNotice, request: ManifestRequest,
                      stop: threading.Event | None) -> bytes:
        """The sealed tail a notice of our learner points to: the first copy with the notice's sha256
        from up to TAIL_TRIES of the relays it names (in an order of our own, those with strikes
        last), each asked TAIL_HEDGE_S after the one before unless that one failed first, and the
        learner last, asked for the tail itself once every relay asked has failed or TAIL_HEDGE_S
        more has passed. So relays that hold the request and then answer nothing delay a version by
        TAIL_TRIES + 1 hedges at most; each that sends other bytes, none, or cannot be reached is
        demoted (`_ask_relay`)."""
        relays = [r for r in notice.relays if r != self.node.peer_id]
        random.Random(f"{self.node.peer_id}/{notice.version}").shuffle(relays)
        asked = TailRequest(notice.chain, notice.version, notice.after, notice.digest).encode()
        pending: set[Future] = set()
        for relay in [*self.usable(relays)[:TAIL_TRIES], None]:  # None: the learner, last
            if relay is None:
                pending.add(self._pool.submit(self._ask_learner, learner, request, stop))
            else:
                pending.add(self._pool.submit(self._ask_relay, relay, asked, notice.digest, stop))
            while pending:  # until one answers with the tail, all asked failed, or it is time for the next
                done, pending = wait(pending, timeout=None if relay is None else TAIL_HEDGE_S,
                                     return_when=FIRST_COMPLETED)
                if not done:
                    break  # the next source, with these still asked
                for f in done:
                    if sealed := f.result():
                        return sealed
        return b""

    def _ask_relay(self, relay: str, asked: bytes, digest: bytes, stop: threading.Event | None) -> bytes:
        """A relay's copy of the tail `digest` names; b"" (counted, the relay demoted) if it sends other
        bytes, none, or cannot be reached."""
        try:
            sealed = self.node.call(relay, TAIL, asked, TailRelay.HOLD_S + self.cfg.hedge_s, stop=stop)
        except CallStopped:
            return b""
        except Exception as e:  # unreachable, or too slow
            self.count("tail_relay_failures")
            self.demote(relay, f"no tail ({type(e).__name__})")
            return b""
        if not sealed:  # it waited `TailRelay.HOLD_S` for it: an honest relay holds it by then
            self.count("tails_not_held")
            self.demote(relay, "named a relay of a tail it did not serve")
        elif tail_digest(sealed) != digest:
            self.count("bad_tails")
            self.demote(relay, "sent a tail that is not the one the learner named")
        else:
            self.count("tails_from_relays")
            return sealed
        return b""

    def _ask_learner(self, learner: str, request: ManifestRequest, stop: threading.Event | None) -> bytes:
        """The tail from the learner itself (its reply to a request that takes no notice)."""
        own = dataclasses.replace(request, wait=0.0, notice=False)
        try:
            sealed = self.node.call(learner, MANIFEST, own.encode(), self.rpc_timeout, stop=stop)
        except CallStopped:
            return b""
        self.count("tails_from_learner" if sealed else "tails_from_learner_refused")
        return sealed

    def _download(self, learner: str, chain: str, entry: VersionEntry, holders: list[str], mates: list[str],
                  hedges: list[str]) -> bytes:
        """One version's blob. Every chunk is asked at once: those this sampler owns
        (`chunk_owner`) of the learner, the others of their owners, who serve each chunk as it
        arrives and wait for one still coming (`ChunkStore`), hedged to `hedges` (other mates, who
        take it from the owner; none while the mates are seeders) before the learner (`Gather._sources`). So the mates' copies flow while the
        learner's upload is under way (pipelined per chunk), rather than after this sampler's own
        share is complete. The whole is checked against the learner-signed manifest entry."""
        n = len(entry.chunks)
        owners = [chunk_owner(mates, entry.version, i) for i in range(n)]  # (`fetch` began it in the store)
        gather = Gather(self, self._pool, self._parallel, chain, entry, learner, holders, owners, hedges)
        got = gather.run()
        self.pace, self.chunk_arrivals = gather.pace or self.pace, gather.arrived
        blob = b"".join(got[i] for i in range(n))
        if len(blob) != entry.size:  # every chunk is verified: only their number and sizes are left
            self.store.abandon(entry.version)
            raise RecordError(Drop.SIZES, "reassembled weights do not match the manifest")
        return blob
