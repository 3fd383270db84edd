"""The learner's side of hetero.rollouts.v2: checks, journals and acknowledges rollout batches.

Every check happens *before* the acknowledgement, so nothing refused ever reaches the journal: the
envelope's signature, its signer = the calling peer (libp2p authenticates the caller) = the
record's `sampler`, the record's structure and bounds, then the learner's own checks
(`Intake.check`: swarm, task, prompt, version and chain, sizes of the swarm's sampling settings,
duplicates). Valid records are appended to the journal (fsynced) before the ack, so an
acknowledged rollout survives a learner crash; an id journaled for the same sampler before (its
ack lost on the way, the batch sent again) is acknowledged again and not journaled twice. A batch
that is not a msgpack list of at most `MAX_BATCH` items is refused whole, with a reason
(`batch_undecodable`, `batch_schema`, `batch_too_many`), counted, charged to its sender and
tarpitted. The budgets: admission.py.

The receiver and the learner need each other (the learner reads through the link; the receiver
asks the learner, `Intake`, about every record), so the door opens only once the learner behind
it is ready: `open(intake, cursor)`. Until then nothing is registered and `receive` returns [].
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from dataclasses import dataclass, field

from swarm.wire.envelope import open_envelope
from swarm.exchange import Intake, IntakeConfig, Received
from swarm.identity import short_id
from swarm.rollouts.journal import Journal
from swarm.p2p import SwarmNode
from swarm.wire.rollout import RecordError, RolloutGroup, decode_rollout_group
from swarm.p2p.doors import TARPIT_S, rollouts_budget
from swarm.rollouts.admission import Admission, Standing, Visit
from swarm.rollouts.backlog import Backlog
from swarm.wire.batch import ROLLOUTS, BatchItem, RolloutReply, unpack_batch
from swarm.wire.reasons import Drop

log = logging.getLogger(__name__)

MAX_ACKED = 1 << 16
"""Ids the receiver remembers having journaled, with their sampler (~160 bytes each, measured: 10 MB).
A sampler whose ack was lost sends the batch again at once, then within its backoff (at most 30 s):
65,536 groups are over half an hour of a learner taking 30 a second. After a restart it holds the
journal's records the learner had not read. An id sent again after it left, or one read before a
restart, is checked as any record: the learner's duplicate check refuses it."""


@dataclass
class _Settled:
    """What became of a batch's items."""

    ok: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    busy: list[str] = field(default_factory=list)
    records: list[bytes] = field(default_factory=list)
    """The records of `ok` not journaled before, to journal..."""
    groups: list[RolloutGroup] = field(default_factory=list)
    """...and each as decoded (the learner reads it so, not decoding it again)."""
    journaled: list[str] = field(default_factory=list)
    """Their ids."""
    whys: collections.Counter[str] = field(default_factory=collections.Counter)
    """Busy items by the bound they met."""


class RolloutReceiver:
    """Checks, journals and acknowledges rollout batches within each sampler's budget and, for keys
    not yet proven, the pool they share; hands the journaled records to the learner (`receive`)."""

    def __init__(self, node: SwarmNode, journal: Journal, cfg: IntakeConfig, tarpit_s: float = TARPIT_S) -> None:
        self.node, self.journal, self.cfg = node, journal, cfg
        self._tarpit_s = tarpit_s
        self._intake: Intake | None = None
        self._backlog: Backlog | None = None
        self._admission: Admission | None = None
        self._acked: collections.OrderedDict[str, str] = collections.OrderedDict()
        """Id -> the sampler whose record it journaled, the newest `MAX_ACKED`: a batch sent again
        after its ack was lost is acknowledged again, not journaled twice (the acks are idempotent)."""
        self.acked_again = 0
        """Items acknowledged again so."""
        self._arrived = threading.Event()
        """Set when records are journaled: a learner waiting in `receive` wakes then, not at its next
        50 ms poll (the demo's learner, 5 steps a second, waited 11.2-11.7 s of its run for rollouts
        in two runs so, 13.5-15.4 s in three with the poll)."""

    def open(self, intake: Intake, cursor: int) -> None:
        """Start taking rollouts for the learner behind `intake`, which has read the journal up to
        `cursor` (from its checkpoint): the records after it are counted as unread, then the
        handler is registered."""
        if self._intake is not None:
            raise RuntimeError("the rollout receiver is already open")
        self._backlog = Backlog(self.journal, cursor, intake.untrained)
        # what was acknowledged and not read yet when the learner stopped: a batch sent again
        # after a restart (its ack lost in the crash) is acknowledged again, not journaled twice
        for rid, sampler in self._backlog.take_restored()[-MAX_ACKED:]:
            self._acked[rid] = sys.intern(sampler)
        self._admission = Admission(self.cfg, intake, self._backlog,
                                    self.node.doors.open(ROLLOUTS, rollouts_budget(self.cfg, self._tarpit_s)))
        self._intake = intake
        self.node.add_gated_handler(ROLLOUTS, self._on_call, self._on_rollouts)

    @property
    def cursor(self) -> int:
        """Journal records already handed to the learner (a global index, saved in its checkpoints)."""
        return self._backlog.cursor if self._backlog is not None else self.journal.first

    @property
    def tarpitted(self) -> int:
        """Calls answered only after the tarpit, so far."""
        return self._admission.door.tarpitted if self._admission is not None else 0

    async def _tarpit(self, remote: str, nbytes: int) -> None:
        await self._admission.door.tarpit(remote, None, nbytes)

    def backlog(self, sampler: str) -> int:
        """`sampler`'s groups received but not yet trained on. Reported in its acks so that it
        paces itself."""
        return self._backlog.groups(sampler) if self._backlog is not None else 0

    def unread_bytes(self, sampler: str) -> int:
        """Bytes of `sampler`'s records in the journal that the learner has not read yet."""
        return self._backlog.unread_bytes(sampler) if self._backlog is not None else 0

    def receive(self, max_records: int, timeout: float = 0.0) -> list[Received]:
        """Journaled records after the cursor, oldest first, waiting up to `timeout` for some."""
        deadline = time.monotonic() + timeout
        while True:
            self._arrived.clear()  # before looking: a record journaled after it sets it again
            out = self._backlog.take(max_records) if self._backlog is not None else []
            left = deadline - time.monotonic()
            if out or left <= 0:
                return out
            self._arrived.wait(left)

    async def _on_call(self, remote: str, nbytes: int, open_calls: int) -> bytes | None:
        """The door, before a byte of the payload is read: busy (after the tarpit) past a bound, or
        None (its declared bytes charged: admission.py)."""
        why = self._admission.at_door(self._admission.visit(remote), nbytes, open_calls)
        if why is None:
            return None
        self._intake.count_busy(why, 1)
        await self._tarpit(remote, 0)  # its payload unread: what p2pd read ahead stays there
        return self._reply(remote, why=why)

    async def _on_rollouts(self, payload: bytes, remote: str) -> bytes:
        """A batch the door let in (its bytes already charged): every item checked, the valid ones
        journaled, then the reply."""
        visit = self._admission.visit(remote)
        self._admission.read(visit, len(payload))
        try:
            items = unpack_batch(payload)
        except RecordError as e:
            self._intake.count_rejected(e.reason, 1)
            self._admission.charge_check(visit)
            log.warning("rollout batch from %s refused: %s", short_id(remote), e)
            await self._tarpit(remote, len(payload))
            return self._reply(remote, error=e.reason)
        if visit.standing is Standing.REFUSED:  # failed an audit: its items are refused by id, unopened
            rejected = dict.fromkeys((item.id for item in items), Drop.REFUSED_SAMPLER)
            self._intake.count_rejected(Drop.REFUSED_SAMPLER, len(rejected))
            if rejected:
                await self._tarpit(remote, len(payload))
            return self._reply(remote, rejected=rejected)
        done = self._settle(items, visit)
        if done.busy:
            for why, n in done.whys.items():
                self._intake.count_busy(why, n)
            log.debug("%s: %d items busy (%s)", short_id(remote), len(done.busy), dict(done.whys))
        if done.records:
            self._backlog.append(remote, done.records, done.groups)  # durable before we acknowledge
            remote = sys.intern(remote)  # one string per peer, however many of its ids are kept
            for rid in done.journaled:
                self._acked[rid] = remote
            while len(self._acked) > MAX_ACKED:
                self._acked.popitem(last=False)
            self._arrived.set()
        if not done.journaled and (done.busy or done.rejected):  # ids acked again do not spare it
            await self._tarpit(remote, len(payload))
        return self._reply(remote, ok=done.ok, rejected=done.rejected, busy=done.busy,
                           why=next(iter(done.whys), None))

    def _settle(self, items: list[BatchItem], visit: Visit) -> _Settled:
        """Check each item within the call's rooms and budgets."""
        done = _Settled()
        for item in items:
            if self._acked.get(item.id) == visit.peer:  # ours already, its ack lost: the same answer
                done.ok.append(item.id)
                self.acked_again += 1
                continue
            # the envelope's size bounds its record's: checked before anything is decoded
            why = self._admission.admit(visit, item.size)
            if why is not None:  # over a bound: nothing decoded or verified
                done.busy.append(item.id)
                done.whys[why] += 1
                continue
            reason = None
            try:
                record, group = self._open(item, visit.peer)
            except RecordError as e:
                reason = e.reason
                log.warning("rejected rollout %s from %s: %s", item.id[:8], short_id(visit.peer), e)
            except Exception:  # a record must never take the handler down
                log.exception("checking rollout %s from %s failed", item.id[:8], short_id(visit.peer))
                reason = Drop.INTERNAL_ERROR
            if reason is not None:
                self._intake.count_rejected(reason, 1)
                done.rejected[item.id] = reason
                continue
            for room in visit.rooms:
                room.add(len(record))
            done.records.append(record)
            done.groups.append(group)
            done.journaled.append(item.id)
            done.ok.append(item.id)
        return done

    def _open(self, item: BatchItem, remote: str) -> tuple[bytes, RolloutGroup]:
        """The record inside one item, and it decoded, if it passes every check (else RecordError)."""
        if item.envelope is None:
            raise RecordError(Drop.SCHEMA, "item is not [id, envelope]")
        record, signer = open_envelope(item.envelope)
        if signer != remote:
            raise RecordError(Drop.FORGED_SENDER, f"signed by {short_id(signer)}, sent by {short_id(remote)}")
        group = decode_rollout_group(record)
        if group.sampler != signer:
            raise RecordError(Drop.FORGED_SENDER, f"signed by {short_id(signer)}, claims {short_id(group.sampler)}")
        if group.id != item.id:
            raise RecordError(Drop.SCHEMA, "outbox id differs from the record id")
        reason = self._intake.check(group)
        if reason is not None:
            raise RecordError(reason, "refused by the learner's checks")
        return record, group

    def _reply(self, remote: str, **parts) -> bytes:
        return RolloutReply(backlog=self.backlog(remote), **parts).encode()
