"""The learner's intake (swarm/rollouts/): budgets per key, one pool for all unproven keys,
batch-level refusals, what undecodable bytes cost, and the reply's bytes.

Unit tests drive the real `RolloutReceiver` (real journal, real signatures) through the handler it
registers once opened on an `Intake` (swarm/exchange.py), on a frozen clock, so every budget is
computed by hand. tests/integration/swarm/test_intake_wire.py sends the same inputs over the real
protocol.
"""

from __future__ import annotations

from swarm.p2p.doors import Doors

import asyncio

import msgpack
import pytest

from helpers.clock import Clock
from helpers.intake import Learner, make_item
from swarm.identity import Identity
from swarm.rollouts.journal import Journal
from swarm.exchange import IntakeConfig
from swarm.wire.batch import MAX_BATCH, ROLLOUTS, BatchItem, RolloutReply, unpack_batch
from swarm.wire.rollout import RolloutGroup
from swarm.buckets import TokenBuckets
from swarm.rollouts import MAX_OPEN_CALLS, Room, RolloutReceiver, pool_bound


# ---- the budget math, by hand ----------------------------------------------------------------------
def test_token_buckets_grant_whole_tokens_refill_at_rate_and_cap_at_the_burst():
    clock = Clock(100.0)
    b = TokenBuckets(rate=2.0, burst=4.0, clock=clock)
    assert b.take("a", 10) == 4  # a full burst
    assert b.take("a", 1) == 0
    clock.t += 0.75  # 1.5 tokens back
    assert b.available("a") == 1.5
    assert b.take("a", 3) == 1  # whole tokens only: 0.5 left
    assert b.available("a") == 0.5
    clock.t += 10
    assert b.available("a") == 4.0  # never above the burst
    assert b.take("b", 1) == 1  # each peer its own bucket


def test_a_charge_may_overdraw_and_is_paid_back_at_the_rate():
    clock = Clock(100.0)
    b = TokenBuckets(rate=1000.0, burst=1000.0, clock=clock)
    b.charge("a", 3000)  # one call three times the burst: let through, then owed
    assert b.available("a") == -2000.0
    clock.t += 2.0
    assert b.available("a") == 0.0  # paid back at 1000/s: nothing to spend yet
    assert b.take("a", 1) == 0
    clock.t += 0.5
    assert b.available("a") == 500.0


def test_token_buckets_forget_the_least_recent_peer_beyond_max_peers():
    clock = Clock(100.0)
    b = TokenBuckets(rate=1.0, burst=2.0, max_peers=2, clock=clock)
    for peer in ("a", "b", "c"):
        assert b.take(peer, 2) == 2
    assert b.available("a") == 2.0 and b.available("b") == 0.0  # "a" was evicted: a fresh bucket


def test_a_room_takes_one_record_when_empty_and_then_what_fits():
    journal = Room("journal_bytes", bound=100, used=0)
    assert journal.fits(500)  # an empty room always takes one, however large: no sampler stuck for good
    journal.add(500)
    assert not journal.fits(1)
    quota = Room("quota", bound=3, used=2, per_record=True)
    assert quota.fits(10**6)  # counts records, not bytes
    quota.add(10**6)
    assert quota.used == 3 and not quota.fits(1)


def test_the_pool_bound_lets_a_key_below_its_fair_share_in_and_no_further():
    assert pool_bound(cap=32, used=10, mine=0, keys=2) == 32  # room in the pool: its cap
    assert pool_bound(cap=32, used=32, mine=32, keys=1) == 32  # one key at the cap: nothing more
    assert pool_bound(cap=32, used=32, mine=0, keys=2) == 48  # full of another key's: this one's share, 16
    assert pool_bound(cap=32, used=40, mine=6, keys=3) == 44  # share 10, holds 6: 4 more
    assert pool_bound(cap=32, used=40, mine=12, keys=3) == 40  # over its share
    assert pool_bound(cap=4, used=4, mine=0, keys=5) == 4  # more keys than the cap: shares round down to 0


NESTED_ID = b"\x91\x92" + b"\x91" * 1000 + b"\xc0\xc4\x00"
"""A batch of one item whose id is nested 1,000 lists deep."""


@pytest.mark.parametrize("payload,reason", [
    (b"", "batch_undecodable"),
    (b"\xc1", "batch_undecodable"),
    (msgpack.packb([["a", b"x"], ["b", b"y"]])[:-1], "batch_undecodable"),  # truncated
    (msgpack.packb([]) + b"\x00", "batch_undecodable"),  # trailing bytes
    (msgpack.packb({"a": 1}), "batch_schema"),
    (msgpack.packb(7), "batch_schema"),
    (b"\xdd\xff\xff\xff\xff", "batch_too_many"),  # told by the header: nothing after it is read
    (msgpack.packb([["i", b""]] * (MAX_BATCH + 1)), "batch_too_many"),
    (NESTED_ID, "batch_schema"),  # str() of its id raised RecursionError, which escaped the refusal
    (msgpack.packb([[7, b"e"]]), "batch_schema"),  # ids are str, of 1..MAX_ID characters
    (msgpack.packb([["x" * 65, b"e"]]), "batch_schema"),
    (msgpack.packb([["", b"e"]]), "batch_schema"),
])
def test_batch_level_errors_have_a_reason(payload, reason):
    from swarm.wire.rollout import RecordError

    with pytest.raises(RecordError) as e:
        unpack_batch(payload)
    assert e.value.reason == reason, e.value


def _v2_reply(ok, rejected, busy, backlog, why=None, error=None) -> bytes:
    """The reply as hetero.rollouts.v2 has always encoded it (a dict, optional keys only when set)."""
    reply = {"ok": ok, "rejected": rejected, "busy": busy, "backlog": backlog}
    if why is not None:
        reply["why"] = why
    if error is not None:
        reply["error"] = error
    return msgpack.packb(reply)


@pytest.mark.parametrize("parts", [
    dict(ok=[], rejected={}, busy=[], backlog=0),
    dict(ok=["a", "b"], rejected={"c": "forged_sender"}, busy=["d"], backlog=7, why="quota"),
    dict(ok=[], rejected={}, busy=[], backlog=3, why="concurrent"),
    dict(ok=[], rejected={}, busy=[], backlog=0, error="batch_undecodable"),
    dict(ok=["x"], rejected={}, busy=["y"], backlog=1, why="unproven_rate", error="batch_schema"),
])
def test_the_reply_has_the_same_bytes_as_v2_and_decodes_back(parts):
    data = RolloutReply(**parts).encode()
    assert data == _v2_reply(**parts)
    assert RolloutReply.decode(data) == RolloutReply(**parts)


def test_a_reply_decodes_with_defaults_for_missing_keys_and_ignores_unknown_ones():
    assert RolloutReply.decode(msgpack.packb({"ok": ["a"], "later": 1})) == RolloutReply(ok=["a"])
    with pytest.raises(ValueError):
        RolloutReply.decode(msgpack.packb([1, 2]))
    with pytest.raises(ValueError):
        RolloutReply.decode(msgpack.packb({"ok": "a"}))


def test_a_batch_item_is_id_and_envelope_or_it_has_no_envelope():
    assert BatchItem.of(["id", b"env"]) == BatchItem("id", b"env") and BatchItem.of(["id", b"env"]).size == 3
    assert BatchItem.of(["id", "not bytes"]) == BatchItem("id", None)
    assert BatchItem.of(["id", b"e", "extra"]).envelope is None
    assert BatchItem.of(["x" * 64, b"e"]) == BatchItem("x" * 64, b"e")  # an id of MAX_ID characters
    assert BatchItem.of({"id": 1}) == BatchItem("?", None) and BatchItem.of([]).id == "?"
    assert unpack_batch(msgpack.packb([["a", b"e"], 5])) == [BatchItem("a", b"e"), BatchItem("?", None)]


# ---- the receiver, on a frozen clock ----------------------------------------------------------------
class Handlers:
    """What the receiver needs of a SwarmNode: a place to register its handler, and its doors (on `clock`)."""

    def __init__(self, clock=None) -> None:
        self.handlers = {}
        self.doors = Doors(clock) if clock is not None else Doors()

    def add_gated_handler(self, name, door, handler) -> None:
        self.handlers[name] = (door, handler)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    base = tmp_path_factory.mktemp("keys")
    return [Identity.load_or_create(base / f"k{i}.key") for i in range(12)]


class Intake(Learner):
    """An Intake whose receiver has a real journal on a frozen clock; `send` calls its handler as a
    peer would."""

    def __init__(self, tmp_path, proven: set[str] = frozenset(), refused: set[str] = frozenset(), **cfg) -> None:
        super().__init__(set(proven), refused)
        self.clock = Clock(100.0)
        node = Handlers(self.clock)
        self.receiver = RolloutReceiver(node, Journal(tmp_path / "journal.bin"), IntakeConfig(**cfg), tarpit_s=0.0)
        assert node.handlers == {} and self.receiver.receive(10) == []  # nothing taken before it opens
        self.receiver.open(self, cursor=0)
        self.door, self.handler = node.handlers[ROLLOUTS]

    def send(self, ident: Identity, payload: bytes | list, open_calls: int = 0) -> dict:
        """One gated call: the door on the declared size, then, if it lets the batch in, the batch."""
        data = payload if isinstance(payload, bytes) else msgpack.packb(payload)

        async def call() -> bytes:
            return await self.door(ident.peer_id, len(data), open_calls) or await self.handler(data, ident.peer_id)
        return msgpack.unpackb(asyncio.run(call()), raw=False)


def test_unknown_fields_beyond_the_bound_are_refused_with_a_reason(tmp_path, keys):
    intake = Intake(tmp_path)
    small, padded = make_item(keys[0], pad=100), make_item(keys[0], pad=1 << 20)
    reply = intake.send(keys[0], [small, padded])
    assert reply["ok"] == [small[0]] and reply["rejected"] == {padded[0]: "unknown_fields"}, reply
    assert intake.rejected["unknown_fields"] == 1
    assert len(intake.receiver.journal.read(0, 10)) == 1  # the padded one never reached the journal


def test_a_bad_batch_gets_a_reason_is_counted_costs_a_check_and_is_tarpitted(tmp_path, keys):
    intake = Intake(tmp_path, quota=3, rate=1.0)  # 3 checks saved up, none back on a frozen clock
    for payload, reason in [(b"\x93\x01", "batch_undecodable"), (msgpack.packb({"x": 1}), "batch_schema"),
                            (b"\xdc\x01\x01", "batch_too_many")]:
        reply = intake.send(keys[0], payload)
        assert reply["error"] == reason and reply["ok"] == [], reply
        assert intake.rejected[reason] == 1
    assert intake.receiver.tarpitted == 3
    reply = intake.send(keys[0], [make_item(keys[0])])  # its 3 checks were spent on the bad batches
    assert reply == {"ok": [], "rejected": {}, "busy": [], "backlog": 0, "why": "rate"}, reply
    assert intake.throttled["rate"] == 1 and intake.receiver.tarpitted == 4


def test_a_batch_whose_id_is_not_a_short_str_is_refused_whole_counted_charged_and_tarpitted(tmp_path, keys):
    intake = Intake(tmp_path, quota=2, rate=1.0)  # 2 checks saved up, none back on a frozen clock
    for payload in (NESTED_ID, msgpack.packb([make_item(keys[0]), ["x" * 65, b"e"]])):
        reply = intake.send(keys[0], payload)
        assert reply == {"ok": [], "rejected": {}, "busy": [], "backlog": 0, "error": "batch_schema"}, reply
    assert intake.rejected == {"batch_schema": 2} and intake.receiver.tarpitted == 2
    assert len(intake.receiver.journal.read(0, 10)) == 0  # the valid item beside the bad id was not taken
    reply = intake.send(keys[0], [make_item(keys[0])])  # its 2 checks went on the bad batches
    assert reply["why"] == "rate" and intake.throttled["rate"] == 1


def test_undecodable_bytes_are_charged_before_decoding_and_block_the_sender_until_paid(tmp_path, keys):
    intake = Intake(tmp_path, proven={keys[0].peer_id, keys[1].peer_id}, byte_rate=1000.0)
    assert intake.send(keys[0], b"\x93" + b"\xc1" * 2999)["error"] == "batch_undecodable"  # 3000 bytes
    item = make_item(keys[0])
    assert intake.send(keys[0], [item])["why"] == "bytes"  # owes 2000 bytes: answered unread
    intake.clock.t += 2.0  # paid back to exactly 0: still nothing to spend
    assert intake.send(keys[0], [item])["why"] == "bytes"
    intake.clock.t += 0.5
    assert intake.send(keys[0], [item])["ok"] == [item[0]]
    assert intake.send(keys[1], [make_item(keys[1])])["ok"]  # another key's budget is its own
    assert intake.throttled["bytes"] == 2 and intake.rejected["batch_undecodable"] == 1


def test_a_peers_calls_past_the_door_at_once_are_bounded(tmp_path, keys):
    intake = Intake(tmp_path, proven={keys[0].peer_id})
    item = make_item(keys[0])
    reply = intake.send(keys[0], [item], open_calls=MAX_OPEN_CALLS)  # two of its calls are being read
    assert reply == {"ok": [], "rejected": {}, "busy": [], "backlog": 0, "why": "concurrent"}, reply
    assert intake.throttled["concurrent"] == 1 and len(intake.receiver.journal) == 0
    assert intake.send(keys[0], [item], open_calls=MAX_OPEN_CALLS - 1)["ok"] == [item[0]]


def test_a_sampler_at_its_quota_is_answered_its_backlog_when_it_polls_and_busy_when_it_sends(tmp_path, keys):
    intake = Intake(tmp_path, proven={keys[0].peer_id}, quota=2)
    assert len(intake.send(keys[0], [make_item(keys[0]), make_item(keys[0])])["ok"]) == 2
    intake.clock.t += 1.0  # its checks back (64 a second, burst the quota): only the quota binds
    # its groups fill the quota: records are turned away at the door, unread (and tarpitted)...
    assert intake.send(keys[0], [make_item(keys[0])]) == {"ok": [], "rejected": {}, "busy": [], "backlog": 2,
                                                         "why": "quota"}
    # ...but a poll (an empty batch: it adds nothing) is let in and told the backlog, not tarpitted
    assert intake.send(keys[0], []) == {"ok": [], "rejected": {}, "busy": [], "backlog": 2}
    assert intake.throttled["quota"] == 1 and intake.receiver.tarpitted == 1
    assert len(intake.receiver.receive(10)) == 2  # the learner reads them: the poll says so
    assert intake.send(keys[0], [])["backlog"] == 0


def test_the_journal_holds_a_bounded_number_of_bytes_per_sampler_until_the_learner_reads_them(tmp_path, keys):
    item = make_item(keys[0])
    size = len(msgpack.unpackb(item[1], raw=False)["r"])
    intake = Intake(tmp_path, proven={keys[0].peer_id, keys[1].peer_id}, journal_bytes=2 * size + 10)
    items = [item] + [make_item(keys[0]) for _ in range(3)]
    reply = intake.send(keys[0], items)
    # the envelope's size (record + key + signature) bounds the record's, before anything is decoded:
    # the first always fits into an empty room, then the second envelope no longer does
    assert len(reply["ok"]) == 1 and len(reply["busy"]) == 3 and reply["why"] == "journal_bytes", reply
    assert intake.receiver.unread_bytes(keys[0].peer_id) == size
    assert intake.send(keys[1], [make_item(keys[1])])["ok"]  # another sampler's room is its own
    assert len(intake.receiver.receive(10)) == 2  # the learner read them: room again
    assert intake.receiver.unread_bytes(keys[0].peer_id) == 0
    assert len(intake.send(keys[0], items[1:])["ok"]) == 1


def test_unproven_keys_share_one_pool_and_proven_keys_keep_their_own(tmp_path, keys):
    # per key: quota 64 and 64 checks; the pool of all unproven keys: 4 groups held, 4 checks saved up
    intake = Intake(tmp_path, proven={keys[0].peer_id}, unproven_quota=4, unproven_rate=1.0)
    replies = [intake.send(k, [make_item(k) for _ in range(3)]) for k in keys[2:12]]  # 10 fresh keys x 3
    assert sum(len(r["ok"]) for r in replies) == 4, replies  # the pool's 4, whatever the number of keys
    assert [len(r["ok"]) for r in replies[:2]] == [3, 1]
    assert {r.get("why") for r in replies[1:]} <= {"unproven_quota", "unproven_rate"}, replies
    assert sum(intake.throttled.values()) == 2 + 8  # 2 items of the second key, 8 calls unread
    reply = intake.send(keys[0], [make_item(keys[0]) for _ in range(10)])  # a proven key: its own budget
    assert len(reply["ok"]) == 10, reply
    intake.proven.add(keys[2].peer_id)  # proven now (its first audits passed): the pool is no longer its limit
    assert len(intake.send(keys[2], [make_item(keys[2]) for _ in range(5)])["ok"]) == 5


def test_a_key_that_fills_the_pool_cannot_keep_a_new_key_out(tmp_path, keys):
    # a foreign model's sampler is never audited, so never proven: it must not hold the pool for good
    intake = Intake(tmp_path, unproven_quota=8)
    assert len(intake.send(keys[1], [make_item(keys[1]) for _ in range(10)])["ok"]) == 8  # alone: the whole pool
    assert intake.send(keys[1], [make_item(keys[1])])["why"] == "unproven_quota"
    intake.clock.t += 10  # the pool's checks per second are back: only the groups held bound it now
    assert len(intake.send(keys[2], [make_item(keys[2]) for _ in range(10)])["ok"]) == 4  # its fair share, 8 // 2
    reply = intake.send(keys[3], [make_item(keys[3]) for _ in range(10)])
    assert len(reply["ok"]) == 2 and reply["why"] == "unproven_quota"  # 8 // 3; the pool holds 14 <= 2 x 8
    assert intake.send(keys[2], [make_item(keys[2])])["why"] == "unproven_quota"  # at its share: waits


def test_undecodable_bytes_from_one_fresh_key_cost_the_pool_not_the_proven(tmp_path, keys):
    intake = Intake(tmp_path, proven={keys[0].peer_id}, unproven_byte_rate=1000.0)
    assert intake.send(keys[3], b"\xc1" * 3000)["error"] == "batch_undecodable"
    assert intake.send(keys[4], [make_item(keys[4])])["why"] == "unproven_bytes"  # another fresh key waits
    assert intake.send(keys[0], [make_item(keys[0])])["ok"]  # the proven one does not


def test_a_declared_payload_that_never_comes_costs_its_key_not_the_pool(tmp_path, keys):
    # issue 39: two keys declaring 3 MiB and sending nothing kept the pool in debt for 160 s
    intake = Intake(tmp_path, unproven_byte_rate=1000.0, byte_rate=1000.0)
    liar = keys[7].peer_id
    assert asyncio.run(intake.door(liar, 3000, 0)) is None  # let in: its 3000 bytes charged to it...
    busy = msgpack.unpackb(asyncio.run(intake.door(liar, 10, 0)), raw=False)
    assert busy["why"] == "bytes"  # ...so its next call waits until it has paid them back
    assert intake.send(keys[8], [make_item(keys[8])])["ok"]  # the pool read nothing: a new key gets in
    assert intake.throttled == {"bytes": 1}


def test_a_refused_key_is_answered_by_id_unopened_and_costs_the_pool_nothing(tmp_path, keys):
    intake = Intake(tmp_path, refused={keys[5].peer_id}, unproven_rate=1.0, unproven_quota=2)
    items = [make_item(keys[5]) for _ in range(5)] + [["x", b"not even an envelope"]]
    reply = intake.send(keys[5], items)
    assert reply["ok"] == [] and reply["rejected"] == {i[0]: "refused_sampler" for i in items}, reply
    assert intake.rejected["refused_sampler"] == 6 and intake.receiver.tarpitted == 1
    # the pool's 2 checks are all still there for a fresh key
    assert len(intake.send(keys[6], [make_item(keys[6]) for _ in range(3)])["ok"]) == 2


class Checking(Intake):
    """An Intake whose learner counts the records it checks and takes only those in `fresh`, each
    once; every other is refused as content it has seen (as a flooder's resent forgeries are)."""

    def __init__(self, tmp_path, fresh: set[str], **cfg) -> None:
        super().__init__(tmp_path, **cfg)
        self.fresh, self.checks = set(fresh), 0

    def check(self, group: RolloutGroup) -> str | None:
        self.checks += 1
        if group.id in self.fresh:
            self.fresh.discard(group.id)
            return None
        return "duplicate_content"


def test_a_flood_that_resends_its_batches_is_checked_within_the_pool_and_tallied_so(tmp_path, keys):
    """tests/integration/swarm/test_intake_wire.py's flood on a frozen clock: 8 fresh keys send the same 64 records
    round and round; the first key's first 16 are new (accepted once), the rest seen before. The
    learner checks at most the pool's burst plus its rate, and the attacker's tally (helpers/sybils.py)
    says exactly that many: an accepted id sent again is acknowledged again unopened on every later
    call, and counted as opened it made 95 checks look like 399, past the 96 of the pool."""
    from helpers.sybils import new_counts, opened, tally

    flooders = keys[2:10]
    batches = [[make_item(k) for _ in range(64)] for k in flooders]  # signed once, resent
    # the wire test's pool: 16 checks saved up, 4 a second back
    intake = Checking(tmp_path, fresh={item[0] for item in batches[0][:16]}, unproven_quota=16, unproven_rate=4.0)
    counts, acked = new_counts(), set()
    seconds = 20
    for _ in range(seconds):  # each key calls once a second (the wire's tarpit), one after another
        for i, key in enumerate(flooders):
            intake.clock.t += 1 / len(flooders)
            tally(counts, acked, i, intake.send(key, batches[i]))
        intake.receiver.receive(10_000)  # the learner reads (and trains on) what was journaled
    assert intake.checks <= 16 + 4.0 * seconds  # the pool: charged before each record is opened
    assert opened(counts) == intake.checks, (opened(counts), intake.checks, counts)
    assert counts["ok"] == 16 and counts["acked_again"] == intake.receiver.acked_again > 0, counts
    # refused for good (its audit failed): its ids, acknowledged before, are now refused unopened
    intake.refused.add(flooders[0].peer_id)
    checks = intake.checks
    tally(counts, acked, 0, intake.send(flooders[0], batches[0]))
    assert counts["reasons"]["refused_sampler"] == 64 and intake.checks == checks == opened(counts)


def test_a_restarted_receiver_rebuilds_backlogs_from_the_journal(tmp_path, keys):
    intake = Intake(tmp_path, proven={keys[0].peer_id})
    intake.send(keys[0], [make_item(keys[0]) for _ in range(3)])
    intake.receiver.journal.append([b"\xc1 not a record"])  # from an older version, say: never crashes a restart
    again = RolloutReceiver(Handlers(), intake.receiver.journal, IntakeConfig())
    assert again.backlog(keys[0].peer_id) == 0  # not open: nothing read yet
    again.open(Learner(), cursor=0)
    assert again.backlog(keys[0].peer_id) == 3 and again.backlog("?") == 1
    assert again.unread_bytes(keys[0].peer_id) == intake.receiver.unread_bytes(keys[0].peer_id) > 0


def test_a_batch_sent_again_after_its_ack_was_lost_is_acknowledged_again_not_journaled_twice(tmp_path, keys):
    intake = Intake(tmp_path, proven={keys[0].peer_id})
    items = [make_item(keys[0]) for _ in range(2)]
    first = intake.send(keys[0], items)
    fresh = make_item(keys[0])
    again = intake.send(keys[0], items + [fresh])  # the reply to the first call never arrived
    assert first["ok"] == [i[0] for i in items] and again["ok"] == [*first["ok"], fresh[0]], again
    assert len(intake.receiver.journal.read(0, 10)) == 3 and intake.receiver.acked_again == 2
    # another key naming those ids is checked as any record is: it gets no acknowledgement for free
    assert intake.send(keys[1], [items[0]])["rejected"] == {items[0][0]: "forged_sender"}
    assert intake.receiver.acked_again == 2


def test_after_a_restart_the_unread_records_ids_are_acknowledged_again_not_journaled_twice(tmp_path, keys):
    before = Intake(tmp_path, proven={keys[0].peer_id})
    items = [make_item(keys[0]) for _ in range(2)]
    assert before.send(keys[0], items)["ok"] == [i[0] for i in items]
    before.receiver.journal.close()  # the learner stops before reading them; the acks were lost
    after = Intake(tmp_path, proven={keys[0].peer_id})  # the same journal, read from cursor 0
    assert after.send(keys[0], items)["ok"] == [i[0] for i in items]
    assert len(after.receiver.journal.read(0, 10)) == 2 and after.receiver.acked_again == 2
    assert after.send(keys[1], [items[0]])["rejected"] == {items[0][0]: "forged_sender"}


def test_a_receiver_opens_once(tmp_path):
    node = Handlers()
    receiver = RolloutReceiver(node, Journal(tmp_path / "journal.bin"), IntakeConfig())
    assert receiver.cursor == 0 and receiver.receive(10, timeout=0.1) == [] and not node.handlers
    receiver.open(Learner(), cursor=0)
    assert ROLLOUTS in node.handlers
    with pytest.raises(RuntimeError):
        receiver.open(Learner(), cursor=0)


def test_intake_config_says_what_to_fix():
    with pytest.raises(ValueError, match="unproven_quota, journal_bytes .* must be >= 1"):
        IntakeConfig(unproven_quota=0)
    with pytest.raises(ValueError, match="must be >= 1"):
        IntakeConfig(journal_bytes=0)
    with pytest.raises(ValueError, match="unproven_rate and unproven_byte_rate must be > 0"):
        IntakeConfig(byte_rate=0.0)
    assert IntakeConfig(unproven_quota=8).for_step(32).unproven_quota == 32  # new keys can fill a step
    assert IntakeConfig(unproven_quota=64).for_step(32).unproven_quota == 64


def test_a_paused_sampler_asks_its_learner_again_once_per_version():
    from swarm.rollouts.sender import POLL_IDLE_S, POLL_MAX_S, POLL_S, POLL_UNKNOWN_S, next_poll_s

    assert next_poll_s(10, 32, 0.18) == POLL_IDLE_S == 1.0  # not paused: it generates; its sends bring the backlog
    assert next_poll_s(40, 32, 0.0) == POLL_UNKNOWN_S == 1.0  # the learner's pace not seen yet
    assert next_poll_s(40, 32, 0.18) == POLL_S == 0.25  # the demo's learner: a version every 0.18 s
    assert next_poll_s(40, 32, 0.6) == 0.6
    assert next_poll_s(40, 32, 60.0) == POLL_MAX_S == 4.0  # minute-long steps: at most every 4 s


def test_a_samplers_view_of_its_learners_pace_is_a_running_mean_of_seconds_per_version():
    from swarm.weights.prefetcher import VersionPace

    now = [100.0]
    pace = VersionPace(keep=0.5, clock=lambda: now[0])
    pace.saw("c", 3)
    assert pace.seconds == 0.0  # one sighting: no pace yet
    now[0] = 102.0
    pace.saw("c", 7)  # 4 versions in 2 s
    assert pace.seconds == 0.5
    now[0] = 105.0
    pace.saw("c", 7)  # nothing newer: no change, and the clock keeps counting from v7's sighting
    now[0] = 106.0
    pace.saw("c", 9)  # 2 versions in 4 s: 2 s each; mean 0.5 x 0.5 + 0.5 x 2
    assert pace.seconds == 1.25
    now[0] = 107.0
    pace.saw("other-chain", 1)  # a restarted learner: counted from here
    now[0] = 108.0
    pace.saw("other-chain", 2)
    assert pace.seconds == 0.5 * 1.25 + 0.5 * 1.0
