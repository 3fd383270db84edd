"""Rollouts over the swarm: signed records from a sampler's outbox to the learner's journal.

  hetero.rollouts.v1  [[record id, envelope], ...] -> {"ok": [ids], "rejected": {id: reason},
                      "busy": [ids], "backlog": this sampler's groups received but not yet trained on}

Learner side (`RolloutReceiver`): every check happens *before* the acknowledgement, so nothing
refused ever reaches the journal: the envelope's signature, its signer = the calling peer (libp2p
authenticates the caller) = the record's `sampler`, the record's structure and bounds, then the
learner's own checks (`check`: swarm, task, prompt, version and chain, sizes of the swarm's
sampling settings, duplicates). Valid records are appended to the journal (fsynced) before the ack,
so an acknowledged rollout survives a learner crash.

Fair share: each sampler may have at most `quota` groups received and not yet trained on (its
unread journal records plus the learner's buffer), and the learner checks at most `rate` of its
records per second (a token bucket, burst `quota`): checking costs the learner CPU (a signature,
a decode, a detokenisation) even for records it then refuses. Past either bound the items are
answered "busy": not refused, not journaled, not even decoded; the sampler keeps them and sends
them later. A flooding peer fills only its own quota and budget and sees its own backlog; the
others' records keep flowing.

Sampler side (`RolloutSender`): records wait in a persistent outbox and a background thread sends
what is due, with exponential backoff while the learner is unreachable; a record leaves the outbox
only once the learner settled it (ok or rejected).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import threading
import time
from typing import Callable

import msgpack

from .delay import DelayConfig, sample_delay
from .envelope import open_envelope, seal
from .identity import short_id
from .journal import Journal
from .outbox import Outbox
from .p2p import MAX_MESSAGE, SwarmNode
from .records import MAX_ID, RecordError, RolloutGroup, decode_rollout_group

log = logging.getLogger(__name__)

ROLLOUTS = "hetero.rollouts.v1"
MAX_BATCH = 256
TARPIT_S = 1.0
TARPIT_PER_PEER = 4


class RolloutReceiver:
    """The learner's side: checks, journals and acknowledges rollout batches, a quota per sampler."""

    def __init__(self, node: SwarmNode, journal: Journal, cursor: int = 0,
                 rejected: collections.Counter | None = None,
                 untrained: Callable[[str], int] = lambda sampler: 0,
                 check: Callable[[RolloutGroup], str | None] = lambda group: None, quota: int = 64,
                 rate: float = 64.0) -> None:
        self.journal = journal
        self.cursor = max(cursor, journal.first)
        """Journal records already handed to the learner (a global index, saved in its checkpoints)."""
        self.rejected = rejected if rejected is not None else collections.Counter()
        """Rejections by reason; the runner passes the learner's counter, so both count together."""
        self.busy: collections.Counter[str] = collections.Counter()
        """Items (or whole batches, when not even unpacked) answered "busy", per sampler."""
        self._untrained, self._check, self.quota = untrained, check, quota
        self._budget = TokenBuckets(rate, burst=quota)
        self._tarpitted: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._unread: collections.deque[str] = collections.deque(
            decode_rollout_group(r).sampler for r in journal.read(self.cursor, len(journal)))
        """Sampler of each journal record after the cursor, in order (for per-sampler backlogs)."""
        node.add_handler(ROLLOUTS, self._on_rollouts)

    def backlog(self, sampler: str) -> int:
        """`sampler`'s groups received but not yet trained on: its share of the journal's unread
        records and of the learner's buffer. Reported in its acks so that it paces itself."""
        with self._lock:
            unread = sum(s == sampler for s in self._unread)
        return unread + self._untrained(sampler)

    async def _on_rollouts(self, payload: bytes, remote: str) -> bytes:
        if self._budget.available(remote) < 1 or self.backlog(remote) >= self.quota:
            self.busy[remote] += 1
            await self._tarpit(remote)
            return self._reply(remote, [], {}, [])  # not even unpacked: whatever it sent stays its own to resend
        try:
            items = msgpack.unpackb(payload, raw=False)
            if not isinstance(items, list) or len(items) > MAX_BATCH:
                raise ValueError("expected a list of at most %d [id, envelope] pairs" % MAX_BATCH)
        except Exception as e:
            self.rejected["undecodable"] += 1
            log.warning("rollout batch from %s is undecodable: %s", short_id(remote), e)
            return self._reply(remote, [], {}, [])
        room = self._budget.take(remote, min(len(items), self.quota - self.backlog(remote)))
        ok, rejected, busy, records = [], {}, [], []
        for item in items:
            rid = str(item[0])[:MAX_ID] if isinstance(item, list) and item else "?"
            if len(ok) + len(rejected) >= room:  # over its quota or budget: nothing decoded or verified
                busy.append(rid)
                continue
            try:
                records.append(self._open(item, rid, remote))
                ok.append(rid)
            except RecordError as e:
                self.rejected[e.reason] += 1
                rejected[rid] = e.reason
                log.warning("rejected rollout %s from %s: %s", rid[:8], short_id(remote), e)
        if busy:
            self.busy[remote] += len(busy)
            log.debug("%s is over its quota of %d groups: %d items busy", short_id(remote), self.quota, len(busy))
        if records:
            with self._lock:
                self.journal.append(records)  # durable before we acknowledge
                self._unread.extend([remote] * len(records))
        return self._reply(remote, ok, rejected, busy)

    async def _tarpit(self, remote: str) -> None:
        """Answer a peer that is over its quota or budget only after TARPIT_S: a peer that calls
        again at once (a flood) then makes at most a few calls a second, so its bytes stop costing
        the learner's network stack and event loop. Bounded per peer (a few waiting calls each), so
        parallel calls cannot pile up here; past that they are answered at once."""
        if self._tarpitted[remote] >= TARPIT_PER_PEER:
            return
        self._tarpitted[remote] += 1
        try:
            await asyncio.sleep(TARPIT_S)
        finally:
            self._tarpitted[remote] -= 1
            if not self._tarpitted[remote]:
                del self._tarpitted[remote]

    def _open(self, item, rid: str, remote: str) -> bytes:
        """The record inside one [id, envelope] item, if it passes every check (else RecordError)."""
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], bytes)):
            raise RecordError("schema", "item is not [id, envelope]")
        record, signer = open_envelope(item[1])
        if signer != remote:
            raise RecordError("forged_sender", f"signed by {short_id(signer)}, sent by {short_id(remote)}")
        group = decode_rollout_group(record)
        if group.sampler != signer:
            raise RecordError("forged_sender", f"signed by {short_id(signer)}, claims {short_id(group.sampler)}")
        if group.id != rid:
            raise RecordError("schema", "outbox id differs from the record id")
        reason = self._check(group)
        if reason is not None:
            raise RecordError(reason, "refused by the learner's checks")
        return record

    def _reply(self, remote: str, ok: list[str], rejected: dict[str, str], busy: list[str]) -> bytes:
        return msgpack.packb({"ok": ok, "rejected": rejected, "busy": busy, "backlog": self.backlog(remote)})

    def receive(self, max_records: int, timeout: float = 0.0) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while True:
            out = self.journal.read(self.cursor, max_records)
            if out or time.monotonic() >= deadline:
                with self._lock:
                    self.cursor += len(out)
                    for _ in out:
                        self._unread.popleft()
                return out
            time.sleep(0.05)


class TokenBuckets:
    """Per-peer token buckets: `rate` tokens a second, at most `burst` saved up; an LRU of peers."""

    def __init__(self, rate: float, burst: float, max_peers: int = 10_000) -> None:
        self.rate, self.burst, self.max_peers = rate, burst, max_peers
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def available(self, peer: str) -> float:
        tokens, last = self._buckets.get(peer, (self.burst, time.monotonic()))
        return min(self.burst, tokens + (time.monotonic() - last) * self.rate)

    def take(self, peer: str, want: int) -> int:
        """How many of `want` items `peer` may have checked now (each costs one token)."""
        now = time.monotonic()
        tokens, last = self._buckets.pop(peer, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        grant = max(0, min(want, int(tokens)))
        self._buckets[peer] = (tokens - grant, now)
        if len(self._buckets) > self.max_peers:
            self._buckets.popitem(last=False)
        return grant


class RolloutSender:
    """The sampler's side: an outbox on disk and a thread that delivers it to the learner."""

    def __init__(self, node: SwarmNode, outbox: Outbox, learner: Callable[[], str | None],
                 rollout_delay: DelayConfig = DelayConfig(), rng: random.Random | None = None,
                 rpc_timeout: float = 30.0) -> None:
        self.node = node
        self.outbox = outbox
        self.learner = learner
        self._rollout_delay = rollout_delay
        self._rng = rng or random.Random(0)
        self.rpc_timeout = rpc_timeout
        self.stats: collections.Counter[str] = collections.Counter()
        self._last_reply = 0.0
        self.learner_backlog = 0
        """The learner's backlog from its last ack: samplers pause while it is large (fresher data)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._flush_loop, name="outbox-flusher", daemon=True)
        self._thread.start()

    def send(self, records: list[tuple[str, bytes]]) -> None:
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
        self.stats["busy"] += len(reply.get("busy", []))
        return len(settled) if due else 0  # 0 when all were busy: the loop pauses before trying again

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
