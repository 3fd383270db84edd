"""The Exchange seam on the real swarm: rollouts and weights over our own P2P RPCs (not the DHT).

Learner side (`LearnerExchange`) serves three RPCs:
  hetero.rollouts.v1  [[record id, envelope], ...] -> {"ok": [ids], "rejected": {id: reason},
                      "backlog": groups received but not yet trained on}
                      each envelope's signature is checked and must be the sampler's own; valid
                      records are appended to the journal (fsynced) *before* the ack, so an
                      acknowledged rollout survives a learner crash.
  hetero.manifest.v1  -> the manifest of the learner's current chain (its last keyframe and the
                      deltas after it), sealed by the learner: chain id, model, and per version
                      its base, size, sha256 and per-chunk sha256.
  hetero.chunks.v1    [chain, version, [index, ...], wait] -> a stream of those chunks (b"" for
                      one not held). Served by the learner *and* by every sampler for the versions it holds (announced in
                      the DHT) or is downloading, so the learner's upload need not grow with the
                      number of samplers (`ChunkStore`, `chunk_owner`).
Sampler side (`SamplerExchange`) keeps rollouts in its persistent outbox and a background thread
sends what is due, with exponential backoff while the learner is unreachable; it fetches weights
several chunks at a time and checks every chunk and the whole against the manifest (a stream can silently
lose its tail, so nothing is trusted unverified). Weight loads follow the same injected-delay
model as the simulator (`ReloadTimer`).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import msgpack

from .delay import DelayConfig, ReloadTimer, sample_delay
from .envelope import open_envelope, seal
from .journal import Journal
from .outbox import Outbox
from .p2p import MAX_MESSAGE, SwarmNode
from .records import RecordError, decode_rollout_group
from .weights_meta import plan_fetch, weights_metadata

log = logging.getLogger(__name__)

ROLLOUTS, MANIFEST, CHUNKS = "hetero.rollouts.v1", "hetero.manifest.v1", "hetero.chunks.v1"
CHUNK_SIZE = 1024 * 1024
MAX_INDICES = 1 << 16
MAX_BATCH = 256


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

    def __init__(self, node: SwarmNode) -> None:
        self.chain = ""
        self.blobs: dict[int, bytes] = {}
        self.partial: dict[int, dict[int, bytes]] = {}
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

    def add_chunk(self, chain: str, version: int, index: int, chunk: bytes) -> None:
        if chain == self.chain and version in self.partial:
            self.partial[version][index] = chunk

    def abandon(self, version: int) -> None:
        self.partial.pop(version, None)

    def _lookup(self, chain, version: int, index: int) -> bytes | None:
        if chain != self.chain:
            return None
        blob = self.blobs.get(version)
        if blob is not None:
            return blob[index * CHUNK_SIZE : (index + 1) * CHUNK_SIZE] if 0 <= index * CHUNK_SIZE < len(blob) else None
        return self.partial.get(version, {}).get(index)

    async def _on_chunks(self, payload: bytes, remote: str):
        try:
            chain, version, indices, wait = msgpack.unpackb(payload)
            version, indices, wait = int(version), [int(i) for i in indices], min(float(wait), self.MAX_WAIT)
            if len(indices) > MAX_INDICES:
                raise ValueError(f"more than {MAX_INDICES} chunks in one request")
        except Exception as e:
            self.malformed += 1
            log.warning("malformed chunk request from %s: %s", remote[-8:], e)
            return
        deadline = time.monotonic() + wait
        for index in indices:
            chunk = self._lookup(chain, version, index)
            # a download in progress here: we are fetching this chunk now; wait for it briefly
            while chunk is None and chain == self.chain and version in self.partial and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
                chunk = self._lookup(chain, version, index)
            chunk = chunk or b""
            self.served_bytes += len(chunk)
            yield chunk


def chunk_owner(mates: list[str], version: int, index: int) -> str | None:
    """The sampler that takes chunk `index` of `version` from the learner; the others take it from
    that sampler. `mates` are the samplers following the same learner (sorted, so that every one of
    them computes the same owner without talking). Rotating by version spreads single-chunk deltas.
    With N mates fetching together, the learner uploads each chunk once instead of N times.
    """
    return mates[(index + version) % len(mates)] if mates else None


class LearnerExchange:
    def __init__(self, node: SwarmNode, journal: Journal, cursor: int = 0,
                 rejected: collections.Counter | None = None, untrained: Callable[[], int] = lambda: 0) -> None:
        self.node = node
        self.journal = journal
        self.cursor = cursor
        """Journal records already handed to the learner (stored in its checkpoints)."""
        self.rejected = rejected if rejected is not None else collections.Counter()
        """Counter of rejections by reason; the runner passes the learner's, so both count together."""
        self._untrained = untrained
        self.store = ChunkStore(node)  # the current chain: last keyframe + deltas after it
        self._entries: list[dict] = []
        self._manifest = b""
        node.add_handler(ROLLOUTS, self._on_rollouts)
        node.add_handler(MANIFEST, self._on_manifest)

    async def _on_rollouts(self, payload: bytes, remote: str) -> bytes:
        try:
            items = msgpack.unpackb(payload, raw=False)
            if not isinstance(items, list) or len(items) > MAX_BATCH:
                raise ValueError("expected a list of at most %d [id, envelope] pairs" % MAX_BATCH)
        except Exception as e:
            self.rejected["undecodable"] += 1
            log.warning("rollout batch from %s is undecodable: %s", remote[-8:], e)
            return msgpack.packb({"ok": [], "rejected": {}, "backlog": self.backlog()})
        ok, rejected, records = [], {}, []
        for item in items:
            rid = str(item[0]) if isinstance(item, list) and item else "?"
            try:
                if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], bytes)):
                    raise RecordError("schema", "item is not [id, envelope]")
                record, signer = open_envelope(item[1])
                group = decode_rollout_group(record)
                if group.sampler != signer:
                    raise RecordError("forged_sender", f"signed by {signer[-8:]}, claims {group.sampler[-8:]}")
                if group.id != rid:
                    raise RecordError("schema", "outbox id differs from the record id")
            except RecordError as e:
                self.rejected[e.reason] += 1
                rejected[rid] = e.reason
                log.warning("rejected rollout %s from %s: %s", rid[:8], remote[-8:], e)
                continue
            records.append(record)
            ok.append(rid)
        if records:
            self.journal.append(records)  # durable before we acknowledge
        return msgpack.packb({"ok": ok, "rejected": rejected, "backlog": self.backlog()})

    def backlog(self) -> int:
        """Rollouts received but not yet trained on (journal not yet read + the learner's buffer);
        reported in every ack so that samplers can pace themselves."""
        return len(self.journal) - self.cursor + self._untrained()

    async def _on_manifest(self, payload: bytes, remote: str) -> bytes:
        return self._manifest

    # ---- Exchange ------------------------------------------------------------------------------
    def receive_rollouts(self, receiver: str, max_records: int, timeout: float = 0.0) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while True:
            out = self.journal.read(self.cursor, max_records)
            if out or time.monotonic() >= deadline:
                self.cursor += len(out)
                return out
            time.sleep(0.05)

    def publish_weights(self, sender: str, version: int, blob: bytes) -> None:
        meta = weights_metadata(blob)
        if not meta.get("base"):
            self.store.reset(meta.get("chain", ""))  # a keyframe starts a new chain segment
            self._entries = []
        self.store.put(meta.get("chain", ""), version, blob)
        chunks = [blob[i : i + CHUNK_SIZE] for i in range(0, len(blob), CHUNK_SIZE)]
        self._entries.append({"version": version, "base": meta.get("base", ""), "size": len(blob), "sha256": _sha(blob),
                              "chunks": [_sha(c) for c in chunks]})
        manifest = {"model_id": meta.get("model_id", ""), "chain": meta.get("chain", ""), "chunk_size": CHUNK_SIZE,
                    "versions": self._entries, "learner": self.node.peer_id, "time": time.time()}
        self._manifest = seal(self.node.identity, msgpack.packb(manifest))

    def fetch_weights(self, receiver: str, have_chain: str, have_version: int):
        raise NotImplementedError("a learner publishes weights; samplers fetch them")

    def send_rollouts(self, sender: str, records: list[tuple[str, bytes]]) -> None:
        raise NotImplementedError("a learner receives rollouts; samplers send them")


class SamplerExchange:
    def __init__(self, node: SwarmNode, outbox: Outbox, learner: Callable[[], str | None],
                 weight_delay: DelayConfig = DelayConfig(), rollout_delay: DelayConfig = DelayConfig(),
                 seed: int = 0, rpc_timeout: float = 30.0, mates: Callable[[], list[str]] = lambda: [],
                 parallel: int = 4, peer_wait: float = 5.0) -> None:
        self.node = node
        self.outbox = outbox
        self.learner = learner
        """Returns the peer id of the learner to follow (None while none is known)."""
        self.mates = mates
        """Returns the samplers that follow the same learner with the same model (`chunk_owner`)."""
        self._rng = random.Random(seed)
        self._timer = ReloadTimer(weight_delay, self._rng)
        self._rollout_delay = rollout_delay
        self.rpc_timeout = rpc_timeout
        self.peer_wait = peer_wait
        """How long to wait for a chunk from a mate that is downloading it right now."""
        self.stats = collections.Counter()
        self._stats_lock = threading.Lock()
        self._last_reply = 0.0
        self.learner_backlog = 0
        """The learner's backlog from its last ack: samplers pause while it is large (fresher data)."""
        self.store = ChunkStore(node)
        # several chunk requests in flight: one unary call at a time leaves the link idle between them
        self._parallel = max(1, parallel)
        self._pool = ThreadPoolExecutor(self._parallel, thread_name_prefix="chunk-fetch")
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, name="outbox-flusher", daemon=True)
        self._flusher.start()

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:  # chunk fetches run on several threads
            self.stats[key] += n

    # ---- rollouts ------------------------------------------------------------------------------
    def send_rollouts(self, sender: str, records: list[tuple[str, bytes]]) -> None:
        for rid, record in records:
            self.outbox.put(rid, seal(self.node.identity, record), sample_delay(self._rollout_delay, self._rng))

    def _flush_loop(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                sent = self.flush_once()
                backoff = 1.0
                if not sent:
                    self._stop.wait(0.5)
            except Exception as e:  # the learner is gone or slow: keep the outbox, retry later
                self._count("send_failures")
                log.warning("could not deliver rollouts to the learner (%s: %s); %d waiting in the outbox, "
                            "retrying in %.0f s", type(e).__name__, e, len(self.outbox), backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def flush_once(self) -> int:
        """Send one batch of due records; returns how many the learner settled (ok or rejected)."""
        learner = self.learner()
        if learner is None:
            return 0
        due = self.outbox.due(MAX_MESSAGE - 64 * 1024, MAX_BATCH)
        if not due and time.monotonic() - self._last_reply < 1.0:
            return 0
        # an empty batch is a cheap poll: it refreshes learner_backlog while we are paused
        self._last_reply = time.monotonic()
        reply = msgpack.unpackb(self.node.call(learner, ROLLOUTS, msgpack.packb([[i, e] for i, e in due]),
                                               self.rpc_timeout), raw=False)
        for rid, reason in reply.get("rejected", {}).items():
            log.warning("the learner rejected rollout %s: %s (dropped from the outbox)", rid[:8], reason)
        self.learner_backlog = int(reply.get("backlog", 0))
        settled = list(reply.get("ok", [])) + list(reply.get("rejected", {}))
        self.outbox.remove(settled)
        self._count("delivered", len(reply.get("ok", [])))
        self._count("rejected", len(reply.get("rejected", {})))
        return len(settled) if due else 0

    # ---- weights -------------------------------------------------------------------------------
    def fetch_weights(self, receiver: str, have_chain: str, have_version: int) -> list[bytes] | None:
        learner = self.learner()
        now = time.time()
        if learner is None or not self._timer.due(now):
            return None
        try:
            manifest = self._manifest(learner)
            if manifest is None:
                return None
            chain, entries = manifest["chain"], {e["version"]: e for e in manifest["versions"]}
            wanted = plan_fetch([(v, {"chain": chain}) for v in entries], have_chain, have_version)
            holders = self._holders(chain) if wanted else {}
            mates = sorted({*self.mates(), self.node.peer_id}) if wanted else []
            blobs = [self._download(learner, chain, entries[v], holders.get(v, []), mates) for v in wanted]
        except Exception as e:
            self._count("weight_fetch_failures")
            log.warning("weights fetch from %s failed (%s: %s); keeping version %d", learner[-8:],
                        type(e).__name__, e, have_version)
            return None
        self._timer.arm(now)
        for v, blob in zip(wanted, blobs):
            self.store.put(chain, v, blob)
        if wanted:
            self.store.retain(entries)  # versions the learner no longer lists are of no use to anyone
            self.node.announce_holdings(chain, sorted(self.store.blobs))
        return blobs or None

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

    def _manifest(self, learner: str) -> dict | None:
        sealed = self.node.call(learner, MANIFEST, b"", self.rpc_timeout)
        if not sealed:
            return None
        record, signer = open_envelope(sealed)
        if signer != learner:
            self._count("forged_manifests")
            raise RecordError("signature", f"manifest signed by {signer[-8:]}, not by the learner we follow")
        return msgpack.unpackb(record, raw=False)

    def _download(self, learner: str, chain: str, entry: dict, holders: list[str], mates: list[str]) -> bytes:
        """One version's blob. The chunks this sampler owns (`chunk_owner`) come first, in a phase
        of their own: mates that start fetching a moment later are then already downloading theirs
        when we ask them. The whole is checked against the learner-signed manifest entry."""
        version, n = entry["version"], len(entry["chunks"])
        owners = [chunk_owner(mates, version, i) for i in range(n)]
        mine = [i for i in range(n) if owners[i] in (None, self.node.peer_id)]
        self.store.begin(chain, version)
        got: dict[int, bytes] = {}
        try:
            for phase in (mine, [i for i in range(n) if i not in set(mine)]):
                self._gather(learner, chain, entry, phase, holders, owners, got)
        except Exception:
            self.store.abandon(version)
            raise
        blob = b"".join(got[i] for i in range(n))
        if len(blob) != entry["size"] or _sha(blob) != entry["sha256"]:
            self.store.abandon(version)
            raise RecordError("sizes", "reassembled weights do not match the manifest")
        return blob

    def _gather(self, learner: str, chain: str, entry: dict, indices: list[int], holders: list[str],
                owners: list[str | None], got: dict[int, bytes]) -> None:
        """Fill `got` with verified chunks `indices`, in rounds: from the holders of the whole
        version (chunk i from holder i+r mod n in round r, spreading the load), then from the chunk's
        owner when it is a mate that may be downloading it now, the learner last. Each round sends
        one streaming request per source (several in flight); what a source lacks or spoils is
        asked of the next round's source."""
        me = self.node.peer_id
        rounds = [lambda i, r=r: (holders[(i + r) % len(holders)], 0.0) for r in range(len(holders))]
        rounds.append(lambda i: (owners[i], self.peer_wait) if owners[i] not in (None, me, learner, *holders)
                      else (None, 0.0))
        # twice: a stream can end early without an error (a reset libp2p stream reads as its end)
        rounds += [lambda i: (learner, 0.0)] * 2
        missing = list(indices)
        for pick in rounds:
            requests: dict[tuple[str, float], list[int]] = collections.defaultdict(list)
            for i in missing:
                source, wait = pick(i)
                if source is not None:
                    requests[(source, wait)].append(i)
            jobs = [(source, wait, part) for (source, wait), idx in requests.items() for part in self._split(idx)]
            list(self._pool.map(lambda job: self._stream_chunks(*job, chain, entry, got), jobs))
            missing = [i for i in missing if i not in got]
            if not missing:
                return
        raise RecordError("sizes", f"chunks {missing[:5]} of version {entry['version']} verified from no source")

    def _split(self, indices: list[int]) -> list[list[int]]:
        """Several streams to one source, interleaved, so a large version keeps the link busy."""
        k = min(self._parallel, max(1, len(indices) // 2))
        return [indices[j::k] for j in range(k)]

    def _stream_chunks(self, source: str, wait: float, indices: list[int], chain: str, entry: dict,
                       got: dict[int, bytes]) -> None:
        version, pos = entry["version"], 0
        from_learner = source == self.learner()

        def on_chunk(chunk: bytes) -> None:  # on the swarm loop, as each chunk arrives
            nonlocal pos
            if pos >= len(indices):
                return
            index, pos = indices[pos], pos + 1
            if _sha(chunk) == entry["chunks"][index]:
                got[index] = chunk
                self.store.add_chunk(chain, version, index, chunk)  # mates may ask for it right away
                self._count("bytes_from_learner" if from_learner else "bytes_from_holders", len(chunk))
            elif chunk:
                self._count("bad_chunks")
                log.warning("chunk %d of version %d from %s failed its hash; trying another source",
                            index, version, source[-8:])

        try:  # allow for a slow link: at least 0.2 MB/s per stream
            n = self.node.call_stream(source, CHUNKS, msgpack.packb([chain, version, indices, wait]),
                                      self.rpc_timeout + wait + 5.0 * len(indices), on_chunk)
            if n < len(indices):
                self._count("short_streams")
                log.info("%s sent %d of %d chunks of version %d; asking again", source[-8:], n, len(indices), version)
        except Exception as e:  # a source that vanished or is slow: the next round asks another
            log.debug("chunks %s of version %d from %s failed: %s", indices[:3], version, source[-8:], e)

    def receive_rollouts(self, receiver: str, max_records: int, timeout: float = 0.0) -> list[bytes]:
        raise NotImplementedError("samplers send rollouts; learners receive them")

    def publish_weights(self, sender: str, version: int, blob: bytes) -> None:
        raise NotImplementedError("learners publish weights")

    def close(self) -> None:
        self._stop.set()
        self._flusher.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)
