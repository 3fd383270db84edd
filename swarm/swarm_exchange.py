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
  hetero.chunk.v1     [chain, version, index] -> chunk bytes (b"" if not held). Served by the
                      learner *and* by every sampler for the versions it holds (announced in
                      the DHT), so the learner's upload need not grow with the number of samplers.
Sampler side (`SamplerExchange`) keeps rollouts in its persistent outbox and a background thread
sends what is due, with exponential backoff while the learner is unreachable; it fetches weights
chunk by chunk and checks every chunk and the whole against the manifest (a stream can silently
lose its tail, so nothing is trusted unverified). Weight loads follow the same injected-delay
model as the simulator (`ReloadTimer`).
"""

from __future__ import annotations

import collections
import hashlib
import logging
import random
import threading
import time
from typing import Callable

import msgpack

from .delay import DelayConfig, ReloadTimer, sample_delay
from .envelope import open_envelope, seal
from .identity import Identity
from .journal import Journal
from .outbox import Outbox
from .p2p import MAX_MESSAGE, SwarmNode
from .records import RecordError, decode_rollout_group
from .weights_meta import plan_fetch, weights_metadata

log = logging.getLogger(__name__)

ROLLOUTS, MANIFEST, CHUNK = "hetero.rollouts.v1", "hetero.manifest.v1", "hetero.chunk.v1"
CHUNK_SIZE = 1024 * 1024
MAX_BATCH = 256


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


class ChunkStore:
    """The weight blobs of one chain that this peer holds, served chunk by chunk to any peer.

    Requests name (chain, version, index); a peer answers b"" for anything it does not hold.
    Every byte a fetcher receives is checked against the learner-signed manifest, so a holder
    cannot serve wrong weights, only fail to help.
    """

    def __init__(self, node: SwarmNode) -> None:
        self.chain = ""
        self.blobs: dict[int, bytes] = {}
        self.served_bytes = 0
        node.add_handler(CHUNK, self._on_chunk)

    def put(self, chain: str, version: int, blob: bytes) -> None:
        if chain != self.chain:
            self.chain, self.blobs = chain, {}
        self.blobs[version] = blob

    def reset(self, chain: str) -> None:
        self.chain, self.blobs = chain, {}

    async def _on_chunk(self, payload: bytes, remote: str) -> bytes:
        try:
            chain, version, index = msgpack.unpackb(payload)
            blob = self.blobs.get(int(version)) if chain == self.chain else None
        except Exception:
            return b""
        if blob is None or not 0 <= index * CHUNK_SIZE < len(blob):
            return b""
        chunk = blob[index * CHUNK_SIZE : (index + 1) * CHUNK_SIZE]
        self.served_bytes += len(chunk)
        return chunk


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
                 seed: int = 0, rpc_timeout: float = 30.0) -> None:
        self.node = node
        self.outbox = outbox
        self.learner = learner
        """Returns the peer id of the learner to follow (None while none is known)."""
        self._rng = random.Random(seed)
        self._timer = ReloadTimer(weight_delay, self._rng)
        self._rollout_delay = rollout_delay
        self.rpc_timeout = rpc_timeout
        self.stats = collections.Counter()
        self._last_reply = 0.0
        self.learner_backlog = 0
        """The learner's backlog from its last ack: samplers pause while it is large (fresher data)."""
        self.store = ChunkStore(node)
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, name="outbox-flusher", daemon=True)
        self._flusher.start()

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
                self.stats["send_failures"] += 1
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
        self.stats["delivered"] += len(reply.get("ok", []))
        self.stats["rejected"] += len(reply.get("rejected", {}))
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
            entries = {e["version"]: e for e in manifest["versions"]}
            wanted = plan_fetch([(v, {"chain": manifest["chain"]}) for v in entries], have_chain, have_version)
            holders = self._holders(manifest["chain"]) if wanted else {}
            blobs = [self._download(learner, manifest["chain"], entries[v], holders.get(v, [])) for v in wanted]
        except Exception as e:
            self.stats["weight_fetch_failures"] += 1
            log.warning("weights fetch from %s failed (%s: %s); keeping version %d", learner[-8:],
                        type(e).__name__, e, have_version)
            return None
        self._timer.arm(now)
        for v, blob in zip(wanted, blobs):
            self.store.put(manifest["chain"], v, blob)
        if wanted:
            self.node.announce_holdings(manifest["chain"], sorted(self.store.blobs))
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
            self.stats["forged_manifests"] += 1
            raise RecordError("signature", f"manifest signed by {signer[-8:]}, not by the learner we follow")
        return msgpack.unpackb(record, raw=False)

    def _download(self, learner: str, chain: str, entry: dict, holders: list[str]) -> bytes:
        """One version's blob, chunk by chunk: chunk i goes first to holder i mod n (spreading the
        load), then to the other holders, and to the learner last. Each chunk and the whole are
        checked against the learner-signed manifest entry; a bad chunk is fetched elsewhere."""
        parts = []
        for index, expected in enumerate(entry["chunks"]):
            order = holders[index % len(holders):] + holders[: index % len(holders)] if holders else []
            for source in [*order, learner]:
                try:
                    chunk = self.node.call(source, CHUNK, msgpack.packb([chain, entry["version"], index]), self.rpc_timeout)
                except Exception as e:  # a holder that vanished or is slow: try the next one
                    log.debug("chunk %d from %s failed: %s", index, source[-8:], e)
                    continue
                if _sha(chunk) == expected:
                    self.stats["bytes_from_learner" if source == learner else "bytes_from_holders"] += len(chunk)
                    break
                if chunk:
                    self.stats["bad_chunks"] += 1
                    log.warning("chunk %d of version %d from %s failed its hash; trying another holder",
                                index, entry["version"], source[-8:])
            else:
                raise RecordError("sizes", f"chunk {index} of version {entry['version']} verified from no source")
            parts.append(chunk)
        blob = b"".join(parts)
        if len(blob) != entry["size"] or _sha(blob) != entry["sha256"]:
            raise RecordError("sizes", "reassembled weights do not match the manifest")
        return blob

    def receive_rollouts(self, receiver: str, max_records: int, timeout: float = 0.0) -> list[bytes]:
        raise NotImplementedError("samplers send rollouts; learners receive them")

    def publish_weights(self, sender: str, version: int, blob: bytes) -> None:
        raise NotImplementedError("learners publish weights")

    def close(self) -> None:
        self._stop.set()
        self._flusher.join(5)
