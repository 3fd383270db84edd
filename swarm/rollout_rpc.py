"""Rollouts over the swarm: signed records from a sampler's outbox to the learner's journal.

  hetero.rollouts.v2  [[record id, envelope], ...] -> {"ok": [ids], "rejected": {id: reason},
                      "busy": [ids], "backlog": this sampler's groups received but not yet trained on,
                      "why": the bound that made items busy (when some are),
                      "error": why the batch itself was refused (when it was)}

A gated call (swarm/p2p.py, `call_gated`): the sampler declares the batch's size, the learner's
door answers busy or go before reading a byte of it, and only then is the batch sent. (v1 was a
unary call, whose payload p2pd reads whole before any check: a key past its byte budget still made
the learner read every byte it sent.)

Learner side (`RolloutReceiver`): every check happens *before* the acknowledgement, so nothing
refused ever reaches the journal: the envelope's signature, its signer = the calling peer (libp2p
authenticates the caller) = the record's `sampler`, the record's structure and bounds, then the
learner's own checks (`check`: swarm, task, prompt, version and chain, sizes of the swarm's
sampling settings, duplicates). Valid records are appended to the journal (fsynced) before the ack,
so an acknowledged rollout survives a learner crash. A batch that is not a msgpack list of at most
`MAX_BATCH` items is refused whole, with a reason (`batch_undecodable`, `batch_schema`,
`batch_too_many`), counted, charged to its sender and tarpitted.

Fair share (`ReceiverConfig`): per sampler, at most `quota` groups received and not yet trained
on, `journal_bytes` of its records in the journal not yet read by the learner, `rate` records
checked per second (checking costs the learner CPU, a signature, a decode, a detokenisation, even
for records it then refuses) and `byte_rate` bytes read per second, charged at the door on the size the sender declares
(a payload longer than declared is not read), so bytes that cannot be decoded cost their sender as
much as any, and a sender past its budget is not read at all. At most `MAX_OPEN_CALLS` of a peer's
calls are past the door at once.
Keys are free, so a key the learner has not yet proven (`is_proven`: it passed its first audits)
also draws on one pool shared by every unproven key, with the same four bounds (`unproven_*`): any
number of fresh keys get what the pool holds, and proven samplers keep their own budgets whatever
they do. Past any bound the items are answered "busy" with the bound's name: not refused, not
journaled, not even decoded; the sampler keeps them and sends them later. A call that got nothing
accepted (all busy or refused) is answered only after a tarpit, so a flooder that calls again at
once makes a few calls a second.

Sampler side (`RolloutSender`): records wait in a persistent outbox and a background thread per
learner sends what is due to it, with exponential backoff while it is unreachable; a record leaves
the outbox only once every learner it is for settled it (ok or rejected), or, for a partner
learner of another model, was given up on (bounded copies; a partner gone for good).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable

import msgpack

from .delay import DelayConfig, sample_delay
from .envelope import open_envelope, seal
from .identity import short_id
from .journal import Journal
from .outbox import OWN, Outbox
from .p2p import MAX_MESSAGE, SwarmNode, decrement
from .records import MAX_ID, RecordError, RolloutGroup, decode_rollout_group

log = logging.getLogger(__name__)

ROLLOUTS = "hetero.rollouts.v2"
MAX_BATCH = 256
MAX_OPEN_CALLS = 2
"""Calls of one peer past the door at once (a sender makes one at a time): more are busy."""
TARPIT_S = 1.0
TARPIT_PER_PEER = 4
TARPIT_BYTES = 64 << 20
"""Payload bytes held by tarpitted calls, all peers together: past it calls are answered at once
(a waiting call keeps its payload, so a thousand keys must not make the tarpit hold gigabytes)."""

MiB = 1 << 20
_POOL = ""
"""The one bucket of the unproven pool (no peer id is empty)."""


@dataclass(frozen=True)
class ReceiverConfig:
    """What the learner reads, checks and journals for one sampler, and for all unproven samplers
    together (docs/DESIGN.md, "Trust"). The learner's config sets these (`[learner]`,
    node/learner.py); a key draws on its own budget and, until proven, on the pool's too."""

    quota: int = 64
    """Groups one sampler may have received and not yet trained on."""
    rate: float = 64.0
    """Records checked per second for one sampler (burst `quota`)."""
    byte_rate: float = 8.0 * MiB
    """Payload bytes read per second from one peer (burst one second's worth; one call may overdraw
    it, then the peer waits until it is paid back)."""
    journal_bytes: int = 64 * MiB
    """Bytes of one sampler's records in the journal not yet read by the learner (it reads between
    steps); one record always fits, whatever its size."""
    unproven_quota: int = 32
    """Groups of all unproven keys together received and not yet trained on: at least a step's
    worth, or a swarm of new samplers could never fill a step."""
    unproven_rate: float = 8.0
    """Records checked per second for all unproven keys together (burst `unproven_quota`)."""
    unproven_byte_rate: float = 1.0 * MiB
    """Payload bytes read per second from all unproven keys together."""
    unproven_journal_bytes: int = 16 * MiB
    """Journal bytes of all unproven keys together not yet read by the learner."""

    def __post_init__(self) -> None:
        if min(self.quota, self.unproven_quota) < 1 or min(self.rate, self.byte_rate, self.unproven_rate,
                                                           self.unproven_byte_rate, self.journal_bytes,
                                                           self.unproven_journal_bytes) <= 0:
            raise ValueError("receiver: quotas must be >= 1, rates and byte bounds > 0")


class RolloutReceiver:
    """The learner's side: checks, journals and acknowledges rollout batches, within each sampler's
    budget and, for keys not yet proven, the pool they share."""

    def __init__(self, node: SwarmNode, journal: Journal, cursor: int = 0,
                 rejected: collections.Counter | None = None,
                 untrained: Callable[[str], int] = lambda sampler: 0,
                 check: Callable[[RolloutGroup], str | None] = lambda group: None,
                 cfg: ReceiverConfig = ReceiverConfig(), is_proven: Callable[[str], bool] = lambda peer: True,
                 is_refused: Callable[[str], bool] = lambda peer: False,
                 throttled: collections.Counter | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.journal = journal
        self.cursor = max(cursor, journal.first)
        """Journal records already handed to the learner (a global index, saved in its checkpoints)."""
        self.rejected = rejected if rejected is not None else collections.Counter()
        """Rejections by reason; the runner passes the learner's counter, so both count together."""
        self.throttled = throttled if throttled is not None else collections.Counter()
        """"busy" answers by bound: one per call answered unread, one per item past a bound after that."""
        self.cfg = cfg
        self._untrained, self._check, self._is_proven, self._is_refused = untrained, check, is_proven, is_refused
        self._rate = TokenBuckets(cfg.rate, cfg.quota, clock=clock)
        self._pool_rate = TokenBuckets(cfg.unproven_rate, cfg.unproven_quota, clock=clock)
        self._bytes = TokenBuckets(cfg.byte_rate, cfg.byte_rate, clock=clock)
        self._pool_bytes = TokenBuckets(cfg.unproven_byte_rate, cfg.unproven_byte_rate, clock=clock)
        self.tarpit_s = TARPIT_S
        self.tarpitted = 0
        """Calls answered only after the tarpit, so far."""
        self._tarpitted: collections.Counter[str] = collections.Counter()
        self._held = 0
        """Payload bytes of the calls in the tarpit now."""
        self._lock = threading.Lock()
        self._unread: collections.deque[tuple[str, int]] = collections.deque()
        """(sampler, bytes) of each journal record after the cursor, in order."""
        self._unread_n: collections.Counter[str] = collections.Counter()
        self._unread_bytes: collections.Counter[str] = collections.Counter()
        self._senders: set[str] = set()
        """Samplers that may have groups not yet trained on (pruned once they have none): the
        unproven pool's use is summed over them."""
        for r in journal.read(self.cursor, len(journal)):
            self._note(_sampler_of(r), len(r))
        node.add_gated_handler(ROLLOUTS, self._on_call, self._on_rollouts)

    def backlog(self, sampler: str) -> int:
        """`sampler`'s groups received but not yet trained on: its share of the journal's unread
        records and of the learner's buffer. Reported in its acks so that it paces itself."""
        with self._lock:
            unread = self._unread_n[sampler]
        return unread + self._untrained(sampler)

    def unread_bytes(self, sampler: str) -> int:
        """Bytes of `sampler`'s records in the journal that the learner has not read yet: what
        `journal_bytes` bounds (the learner reads between steps, so they pile up during a long one)."""
        with self._lock:
            return self._unread_bytes[sampler]

    def _note(self, sampler: str, nbytes: int) -> None:
        """Count one record as unread; the caller holds `_lock` (with the append it belongs to)."""
        self._unread.append((sampler, nbytes))
        self._unread_n[sampler] += 1
        self._unread_bytes[sampler] += nbytes
        self._senders.add(sampler)

    def _pool_usage(self) -> tuple[int, int, set[str]]:
        """(groups not yet trained on, journal bytes not yet read, the keys holding them) of all
        unproven samplers together."""
        groups = nbytes = 0
        holders = set()
        for peer in list(self._senders):
            n = self.backlog(peer)
            if n == 0:
                self._senders.discard(peer)
            elif not self._is_proven(peer):
                groups, nbytes = groups + n, nbytes + self.unread_bytes(peer)
                holders.add(peer)
        return groups, nbytes, holders

    def _rooms(self, remote: str, proven: bool) -> list[_Room]:
        """What `remote` may still add: its own bounds, then, unproven, the pool's."""
        mine, mine_bytes = self.backlog(remote), self.unread_bytes(remote)
        rooms = [_Room("quota", self.cfg.quota, mine, per_record=True),
                 _Room("journal_bytes", self.cfg.journal_bytes, mine_bytes)]
        if not proven:
            groups, nbytes, holders = self._pool_usage()
            k = len(holders | {remote})
            rooms += [_Room("unproven_quota", pool_bound(self.cfg.unproven_quota, groups, mine, k),
                            groups, per_record=True),
                      _Room("unproven_journal_bytes", pool_bound(self.cfg.unproven_journal_bytes, nbytes, mine_bytes, k),
                            nbytes)]
        return rooms

    def _door(self, remote: str, proven: bool, rooms: list[_Room]) -> str | None:
        """Why a call from `remote` is answered busy without being read, or None. No decoding."""
        over = [("rate", self._rate.available(remote) < 1)]
        over += [(room.why, not room.fits(1)) for room in rooms]
        over.append(("bytes", self._bytes.available(remote) <= 0))
        if not proven:
            over += [("unproven_rate", self._pool_rate.available(_POOL) < 1),
                     ("unproven_bytes", self._pool_bytes.available(_POOL) <= 0)]
        return next((why for why, is_over in over if is_over), None)

    def _take_check(self, remote: str, proven: bool) -> str | None:
        """Take one record check from `remote`'s budget (and the pool's); why not, if it cannot."""
        if self._rate.available(remote) < 1:
            return "rate"
        if not proven and self._pool_rate.available(_POOL) < 1:
            return "unproven_rate"
        self._rate.take(remote, 1)
        if not proven:
            self._pool_rate.take(_POOL, 1)
        return None

    async def _on_call(self, remote: str, nbytes: int, open_calls: int) -> bytes | None:
        """The door, before a byte of the payload is read: busy (after the tarpit) past a bound, or
        None, having charged the `nbytes` the caller declared to its byte budget (and the pool's):
        read from here on, they cost their sender, decodable or not. Charged here rather than
        after the read, so that many calls at once cannot all pass before the first is paid."""
        refused = self._is_refused(remote)
        proven = not refused and self._is_proven(remote)
        rooms = [] if refused else self._rooms(remote, proven)
        why = "concurrent" if open_calls >= MAX_OPEN_CALLS else self._door(remote, proven or refused, rooms)
        if why is not None:
            self.throttled[why] += 1
            await self._tarpit(remote, 0)  # its payload unread: what p2pd read ahead stays there
            return self._reply(remote, [], {}, [], why=why)
        self._bytes.charge(remote, nbytes)
        if not proven and not refused:
            self._pool_bytes.charge(_POOL, nbytes)
        return None

    async def _on_rollouts(self, payload: bytes, remote: str) -> bytes:
        """A batch the door let in (its bytes already charged): every item checked, the valid ones
        journaled, then the reply."""
        refused = self._is_refused(remote)
        proven = not refused and self._is_proven(remote)
        rooms = [] if refused else self._rooms(remote, proven)
        try:
            items = unpack_batch(payload)
        except RecordError as e:
            self.rejected[e.reason] += 1
            self._rate.charge(remote, 1)  # and one check, like a record refused
            if not proven and not refused:
                self._pool_rate.charge(_POOL, 1)
            log.warning("rollout batch from %s refused: %s", short_id(remote), e)
            await self._tarpit(remote, len(payload))
            return self._reply(remote, [], {}, [], error=e.reason)
        if refused:  # failed an audit: its items are refused by id, unopened (libp2p told us who calls)
            rejected = dict.fromkeys((_item_id(item) for item in items), "refused_sampler")
            self.rejected["refused_sampler"] += len(rejected)
            if rejected:
                await self._tarpit(remote, len(payload))
            return self._reply(remote, [], rejected, [])
        ok, rejected, busy, records, whys = self._settle(items, remote, proven, rooms)
        if busy:
            self.throttled.update(whys)
            log.debug("%s: %d items busy (%s)", short_id(remote), len(busy), dict(whys))
        if records:
            # durable before we acknowledge; counted with the append, atomically: `receive` (the
            # learner's thread) must never read a record whose count is not there yet
            with self._lock:
                self.journal.append(records)
                for r in records:
                    self._note(remote, len(r))
        if not ok and (busy or rejected):
            await self._tarpit(remote, len(payload))
        return self._reply(remote, ok, rejected, busy, why=next(iter(whys), None))

    def _settle(self, items: list, remote: str, proven: bool, rooms: list[_Room]):
        """Check each item within `remote`'s rooms: (ok ids, {id: reason}, busy ids, records, busy whys)."""
        ok, rejected, busy, records, whys = [], {}, [], [], collections.Counter()
        for item in items:
            rid = _item_id(item)
            # the envelope's size bounds its record's: checked before anything is decoded
            size = len(item[1]) if isinstance(item, list) and len(item) == 2 and isinstance(item[1], bytes) else 0
            why = next((room.why for room in rooms if not room.fits(size)), None) or self._take_check(remote, proven)
            if why is not None:  # over a bound: nothing decoded or verified
                busy.append(rid)
                whys[why] += 1
                continue
            try:
                record = self._open(item, rid, remote)
            except RecordError as e:
                self.rejected[e.reason] += 1
                rejected[rid] = e.reason
                log.warning("rejected rollout %s from %s: %s", rid[:8], short_id(remote), e)
                continue
            except Exception:  # a record must never take the handler down
                log.exception("checking rollout %s from %s failed", rid[:8], short_id(remote))
                self.rejected["internal_error"] += 1
                rejected[rid] = "internal_error"
                continue
            for room in rooms:
                room.add(len(record))
            records.append(record)
            ok.append(rid)
        return ok, rejected, busy, records, whys

    async def _tarpit(self, remote: str, nbytes: int) -> None:
        """Answer a call that got nothing accepted (busy, refused, a bad batch) only after TARPIT_S:
        a peer that calls again at once (a flood) then makes at most a few calls a second, so its
        bytes stop costing the learner's network stack and event loop. Bounded per peer (a few
        waiting calls each) and in bytes held, so parallel calls cannot pile up here; past that
        they are answered at once. (Holding more of the calls turned away at the door, unread, did
        not help: a held stream lets p2pd read further ahead, 1.1 against 0.65 MiB a call.)"""
        if self._tarpitted[remote] >= TARPIT_PER_PEER or self._held + nbytes > TARPIT_BYTES:
            return
        self._tarpitted[remote] += 1
        self._held += nbytes
        self.tarpitted += 1
        try:
            await asyncio.sleep(self.tarpit_s)
        finally:
            self._held -= nbytes
            decrement(self._tarpitted, remote, 1)

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

    def _reply(self, remote: str, ok: list[str], rejected: dict[str, str], busy: list[str],
               why: str | None = None, error: str | None = None) -> bytes:
        reply = {"ok": ok, "rejected": rejected, "busy": busy, "backlog": self.backlog(remote)}
        if why is not None:
            reply["why"] = why
        if error is not None:
            reply["error"] = error
        return msgpack.packb(reply)

    def receive(self, max_records: int, timeout: float = 0.0) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while True:
            out = self.journal.read(self.cursor, max_records)
            if out or time.monotonic() >= deadline:
                with self._lock:
                    self.cursor += len(out)
                    for _ in out:
                        sampler, nbytes = self._unread.popleft()
                        decrement(self._unread_n, sampler, 1)
                        decrement(self._unread_bytes, sampler, nbytes)
                return out
            time.sleep(0.05)


def pool_bound(cap: int, used: int, mine: int, keys: int) -> int:
    """The unproven pool's bound as one key sees it: the pool's `cap`, or more while the key holds
    less than its fair share, cap // keys (keys: the unproven keys holding something, it included).

    A key that can never be proven (a foreign model's sampler: its groups are never audited) or a
    fast one would otherwise keep the pool full and starve every new key; with the fair share a
    new key always gets in at once while keys <= cap. The pool's use stays <= 2 x cap: each key
    can push it past `cap` only up to its own share, and the shares sum to <= cap."""
    return max(cap, used + max(0, cap // keys - mine))


def unpack_batch(payload: bytes) -> list:
    """A rollout batch's items, or RecordError: `batch_too_many` (told by the list's header, before
    anything is unpacked), `batch_undecodable` (not msgpack, truncated, trailing bytes) or
    `batch_schema` (msgpack, but not a list)."""
    n = _array_len(payload)
    if n is not None and n > MAX_BATCH:
        raise RecordError("batch_too_many", f"{n} items (at most {MAX_BATCH})")
    try:  # items are [id, envelope]: no list or map in a batch needs to be longer than a batch
        items = msgpack.unpackb(payload, raw=False, max_array_len=MAX_BATCH, max_map_len=MAX_BATCH)
    except Exception as e:  # msgpack raises several types for garbage
        raise RecordError("batch_undecodable", f"{type(e).__name__}: {e}") from None
    if not isinstance(items, list):
        raise RecordError("batch_schema", f"a batch is a list of [id, envelope] pairs, not {type(items).__name__}")
    return items


def _item_id(item) -> str:
    return str(item[0])[:MAX_ID] if isinstance(item, list) and item else "?"


def _array_len(data: bytes) -> int | None:
    """The length a msgpack array header at the start of `data` claims, or None if there is none."""
    if data[:1] and 0x90 <= data[0] <= 0x9F:
        return data[0] & 0x0F
    if data[:1] == b"\xdc" and len(data) >= 3:
        return int.from_bytes(data[1:3], "big")
    if data[:1] == b"\xdd" and len(data) >= 5:
        return int.from_bytes(data[1:5], "big")
    return None


def _sampler_of(record: bytes) -> str:
    """The sampler a journaled record names, for its backlog after a restart ("?" if it names none:
    records accepted under older rules are checked again, and counted, when the learner reads them)."""
    try:
        d = msgpack.unpackb(record, raw=False)
    except Exception:
        return "?"
    sampler = d.get("sampler") if isinstance(d, dict) else None
    return sampler if isinstance(sampler, str) else "?"


@dataclass
class _Room:
    """One bound on what a sampler may add (groups or bytes), its use, and what this call added."""

    why: str
    bound: float
    used: float
    per_record: bool = False
    """Counts records (a quota), not bytes."""

    def fits(self, size: int) -> bool:
        """Whether a record of `size` bytes fits; into an empty room one always does (so a bound
        below the largest record never stops a sampler for good)."""
        n = 1 if self.per_record else size
        return self.used == 0 or self.used + n <= self.bound

    def add(self, size: int) -> None:
        self.used += 1 if self.per_record else size


class TokenBuckets:
    """Per-peer token buckets: `rate` tokens a second, at most `burst` saved up; an LRU of peers.

    `take` grants whole tokens from what is there; `charge` takes what a peer already used, and may
    leave its bucket in debt (a call larger than the burst), which it then pays back at `rate`."""

    def __init__(self, rate: float, burst: float, max_peers: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.max_peers, self.clock = rate, burst, max_peers, clock
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def available(self, peer: str) -> float:
        tokens, last = self._buckets.get(peer, (self.burst, self.clock()))
        return min(self.burst, tokens + (self.clock() - last) * self.rate)

    def take(self, peer: str, want: int) -> int:
        """How many of `want` items `peer` may have checked now (each costs one token)."""
        tokens, now = self._refill(peer)
        grant = max(0, min(want, int(tokens)))
        self._store(peer, tokens - grant, now)
        return grant

    def charge(self, peer: str, amount: float) -> None:
        """Take `amount` tokens from `peer`, into debt if need be."""
        tokens, now = self._refill(peer)
        self._store(peer, tokens - amount, now)

    def _refill(self, peer: str) -> tuple[float, float]:
        now = self.clock()
        tokens, last = self._buckets.pop(peer, (self.burst, now))
        return min(self.burst, tokens + (now - last) * self.rate), now

    def _store(self, peer: str, tokens: float, now: float) -> None:
        self._buckets[peer] = (tokens, now)
        if len(self._buckets) > self.max_peers:
            self._buckets.popitem(last=False)


class RolloutSender:
    """The sampler's side: an outbox on disk and one thread per learner that delivers what it is owed.

    Every record goes to the learner the sampler follows (`learner()`, its own model's) and to each
    of `partners()` when it is put: learners of other models that take this one's rollouts
    (docs/DESIGN.md, "Several learners"). The same signed envelope goes to each; each learner
    acknowledges it on its own, so a slow or dead partner delays nobody else. A partner's copies
    are bounded (`max_partner_owed`, the oldest given up and counted); the followed learner's never
    are (the sampler stops generating instead)."""

    def __init__(self, node: SwarmNode, outbox: Outbox, learner: Callable[[], str | None],
                 rollout_delay: DelayConfig = DelayConfig(), rng: random.Random | None = None,
                 rpc_timeout: float = 30.0, partners: Callable[[], list[str]] = lambda: [],
                 max_partner_owed: int = 256, forget_after_s: float = 600.0) -> None:
        self.node = node
        self.outbox = outbox
        self.learner = learner
        self.partners = partners
        self.max_partner_owed, self.forget_after_s = max_partner_owed, forget_after_s
        self._rollout_delay = rollout_delay
        self._rng = rng or random.Random(0)
        self.rpc_timeout = rpc_timeout
        self.stats: collections.Counter[str] = collections.Counter()
        """The followed learner's counts: delivered, rejected, busy, send_failures, batch_errors."""
        self.partner_stats: dict[str, collections.Counter[str]] = {}
        """The same per partner, plus `given_up` (copies dropped past `max_partner_owed` or when it left)."""
        self.learner_backlog = 0
        """The learner's backlog from its last ack: samplers pause while it is large (fresher data)."""
        self._stop = threading.Event()
        self._flushers: dict[str, threading.Thread] = {}
        self._last_reply: dict[str, float] = {}
        self._lock = threading.Lock()
        self._start(OWN)
        for partner in self.outbox.learners():  # copies owed from before a restart
            if partner != OWN:
                self._start(partner)

    def _start(self, target: str) -> None:
        with self._lock:
            if target != OWN:
                self.partner_stats.setdefault(target, collections.Counter())
            if target in self._flushers or self._stop.is_set():
                return
            name = "outbox-flusher" if target == OWN else f"outbox-flusher-{short_id(target)}"
            self._flushers[target] = t = threading.Thread(target=self._flush_loop, args=(target,), name=name, daemon=True)
        t.start()

    def send(self, records: list[tuple[str, bytes]]) -> None:
        """Into the outbox for the learner we follow (if one is live: rows already there wait for it
        through its restarts) and a copy for each partner, whose copies are then trimmed to the bound."""
        own = self.learner()
        partners = tuple(p for p in self.partners() if p and p != own)
        to = ((OWN,) if own is not None else ()) + partners
        for rid, record in records:
            if to:
                self.outbox.put(rid, seal(self.node.identity, record), sample_delay(self._rollout_delay, self._rng),
                                to=to)
        for p in partners:
            self._start(p)
            if given_up := self.outbox.trim(p, self.max_partner_owed):
                self.partner_stats[p]["given_up"] += given_up

    def _flush_loop(self, target: str) -> None:
        backoff, away_since = 1.0, None
        stats = self.stats if target == OWN else self.partner_stats[target]
        while not self._stop.is_set():
            if target != OWN:  # a partner that left the swarm (or stopped taking our model) for good
                away_since = None if target in self.partners() else (away_since or time.monotonic())
                if away_since is not None and time.monotonic() - away_since > self.forget_after_s:
                    with self._lock:  # a copy put meanwhile is trimmed here, or finds no flusher and starts one
                        stats["given_up"] += self.outbox.trim(target, 0)
                        del self._flushers[target]
                    log.info("partner learner %s is gone: gave up the rollouts owed to it", short_id(target))
                    return
            try:
                sent = self.flush_once(target)
                backoff = 1.0
                if not sent:
                    self._stop.wait(0.5)
            except Exception as e:  # the learner is gone or slow: keep the outbox, retry later
                stats["send_failures"] += 1
                if target == OWN:  # its backlog is unknown now: the outbox's bound paces us (partners still fed)
                    self.learner_backlog = 0
                log.log(logging.WARNING if target == OWN else logging.INFO,
                        "could not deliver rollouts to %s (%s: %s); %d waiting in the outbox, retrying in %.0f s",
                        "the learner" if target == OWN else f"partner learner {short_id(target)}",
                        type(e).__name__, e, self.outbox.owed(target), backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def flush_once(self, target: str = OWN) -> int:
        """Send one batch of due records to `target` (OWN: the followed learner); returns how many it
        settled (ok or rejected)."""
        learner = self.learner() if target == OWN else target
        if learner is None:
            return 0
        due = self.outbox.due(MAX_MESSAGE - 64 * 1024, MAX_BATCH, learner=target)
        if not due and (target != OWN or time.monotonic() - self._last_reply.get(target, 0.0) < 1.0):
            return 0
        # an empty batch is a cheap poll: it refreshes learner_backlog while we are paused
        self._last_reply[target] = time.monotonic()
        reply = msgpack.unpackb(self.node.call_gated(learner, ROLLOUTS, msgpack.packb([[i, e] for i, e in due]),
                                                     self.rpc_timeout), raw=False)
        stats = self.stats if target == OWN else self.partner_stats[target]
        who = "the learner" if target == OWN else f"partner learner {short_id(target)}"
        if reply.get("error"):  # our batch itself was refused: a bug on one side, not a busy learner
            stats["batch_errors"] += 1
            log.warning("%s refused a batch of %d rollouts: %s (kept in the outbox)", who, len(due), reply["error"])
        elif reply.get("busy"):
            log.debug("%s is busy for %d rollouts: %s", who, len(reply["busy"]), reply.get("why"))
        for rid, reason in reply.get("rejected", {}).items():
            log.log(logging.WARNING if target == OWN else logging.DEBUG,
                    "%s rejected rollout %s: %s (dropped from the outbox)", who, rid[:8], reason)
        if target == OWN:
            self.learner_backlog = int(reply.get("backlog", 0))
        settled = list(reply.get("ok", [])) + list(reply.get("rejected", {}))
        self.outbox.remove(settled, learner=target)
        stats["delivered"] += len(reply.get("ok", []))
        stats["rejected"] += len(reply.get("rejected", {}))
        stats["busy"] += len(reply.get("busy", []))
        return len(settled) if due else 0  # 0 when all were busy: the loop pauses before trying again

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            threads = list(self._flushers.values())
        deadline = time.monotonic() + 5.0  # one bound for all: shutdown does not grow with the partners
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
