"""The gated RPC (swarm/p2p/, `add_gated_handler` / `call_gated`) between two real hivemind
peers on loopback: the door answers before the payload is read, whatever the caller sends, and a
caller that lies about its payload's size or trickles it is cut off."""

from __future__ import annotations

import asyncio
import time

import pytest
from google.protobuf.wrappers_pb2 import BytesValue
from hivemind.p2p import P2P, PeerID

from swarm.dht.network import NetworkConfig
from swarm.identity import Identity
from swarm.p2p import NotAnswered, Stall, SwarmNode
from swarm.p2p.framing import read_frame


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("gated")
    server = SwarmNode(Identity.load_or_create(base / "server.key"), NetworkConfig(), "gated")
    client = SwarmNode(Identity.load_or_create(base / "client.key"),
                       NetworkConfig(initial_peers=server.maddrs()), "gated")
    seen = {"door": [], "handler": []}

    async def door(remote: str, nbytes: int, open_calls: int) -> bytes | None:
        seen["door"].append(nbytes)
        return b"no" if nbytes > 1000 else None

    async def handler(payload: bytes, remote: str) -> bytes:
        seen["handler"].append(len(payload))
        return b"got " + str(len(payload)).encode()

    server.add_gated_handler("t.gated", door, handler, body=Stall(idle_s=1.0, min_rate=1000.0))
    yield server, client, seen
    client.shutdown()
    server.shutdown()


def test_the_door_lets_a_payload_in_or_answers_without_reading_it(pair):
    server, client, seen = pair
    assert client.call_gated(server.peer_id, "t.gated", b"x" * 100, timeout=30) == b"got 100"
    assert client.call_gated(server.peer_id, "t.gated", b"x" * 5000, timeout=30) == b"no"
    assert seen["door"][-2:] == [100, 5000] and seen["handler"] == [100]


def test_a_payload_sent_without_waiting_for_the_door_is_not_read(pair):
    from swarm.p2p import call_gated

    server, client, seen = pair
    before = list(seen["handler"])
    try:  # the door's answer, unless the stream broke under the unread payload first (asyncio's
        # reader raises a broken pipe before the bytes it holds): a flooder's problem, not ours
        reply = client.run(call_gated(client.p2p, server.peer_id, "t.gated", b"y" * 2_000_000, eager=True), 30)
    except (ConnectionError, asyncio.IncompleteReadError):  # or a reset that overtook the answer
        reply = b"no"
    assert reply == b"no" and seen["handler"] == before and seen["door"][-1] == 2_000_000


async def _raw(p2p: P2P, peer: str, declared: int, body: bytes, pace: float = 0.0) -> bytes | None:
    """A caller that declares `declared` bytes, then sends `body` (in pieces `pace` s apart): the
    reply, or None if the server closed the stream without one."""
    _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer), "t.gated")
    try:
        await P2P.send_protobuf(BytesValue(value=declared.to_bytes(8, "big")), writer)
        _, go = await read_frame(reader, 64)
        frame = BytesValue(value=body).SerializeToString()
        frame = P2P.MESSAGE_MARKER + len(frame).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER) + frame
        for k in range(0, len(frame), 100 if pace else len(frame)):
            writer.write(frame[k:k + (100 if pace else len(frame))])
            await writer.drain()
            await asyncio.sleep(pace)
        _, data = await read_frame(reader, 1 << 20)
        return BytesValue.FromString(data).value
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    finally:
        writer.close()


def test_a_payload_longer_than_declared_is_not_handled(pair):
    server, client, seen = pair
    before = list(seen["handler"])
    assert client.run(_raw(client.p2p, server.peer_id, declared=10, body=b"z" * 900), 30) is None
    assert seen["handler"] == before


def test_a_trickled_payload_is_cut_off(pair):
    server, client, seen = pair
    before = list(seen["handler"])
    t0 = time.monotonic()
    # 900 bytes at 100 bytes per 0.5 s = 200 B/s against the server's 1 s + 900 / 1000 B/s bound
    assert client.run(_raw(client.p2p, server.peer_id, declared=900, body=b"z" * 900, pace=0.5), 30) is None
    assert seen["handler"] == before and time.monotonic() - t0 < 10


def test_a_stream_its_door_never_answered_is_told_apart_from_a_call_that_failed(pair):
    """A stream that ends before the door's first word (reset on the way, or closed by the callee)
    carried nothing the callee read: `NotAnswered`, which a caller may retry at once."""
    server, client, _ = pair
    calls = []

    async def mute(remote: str, nbytes: int, open_calls: int) -> bytes | None:
        calls.append(nbytes)
        raise RuntimeError("closes the stream without a word")  # GatedHandler logs it and closes

    async def never(payload: bytes, remote: str) -> bytes:
        raise AssertionError("past a door that never let anything in")

    server.add_gated_handler("t.mute", mute, never)
    with pytest.raises(NotAnswered):
        client.call_gated(server.peer_id, "t.mute", b"x" * 10, timeout=30)
    assert calls == [10]


def test_a_sender_sends_again_when_the_learners_door_never_answered(tmp_path):
    """The rollout sender against a real receiver whose first stream ends unanswered: the call is
    made again after a moment, not after the backoff, counted as `retried` and not as a failure,
    and the batch is delivered once."""
    from swarm.wire.envelope import open_envelope
    from swarm.exchange import IntakeConfig
    from swarm.rollouts.journal import Journal
    from swarm.rollouts.outbox import Outbox
    from swarm.rollouts import RolloutReceiver, RolloutSender
    from helpers.intake import Learner, make_item

    learner = SwarmNode(Identity.load_or_create(tmp_path / "learner.key"), NetworkConfig(), "retry")
    node = SwarmNode(Identity.load_or_create(tmp_path / "sampler.key"),
                     NetworkConfig(initial_peers=learner.maddrs()), "retry")
    receiver = RolloutReceiver(learner, Journal(tmp_path / "journal.bin"), IntakeConfig())
    door, dropped = receiver._on_call, []

    async def drops_the_first(remote: str, nbytes: int, open_calls: int) -> bytes | None:
        if not dropped:
            dropped.append(nbytes)
            raise ConnectionResetError("the first stream is lost")
        return await door(remote, nbytes, open_calls)

    receiver._on_call = drops_the_first  # what `open` registers as the door
    receiver.open(Learner(), cursor=0)
    box = Outbox(tmp_path / "outbox.db")
    sender = RolloutSender(node, box, lambda: learner.peer_id, rpc_timeout=10.0)
    try:
        rid, env = make_item(node.identity)
        sender.send([(rid, open_envelope(env)[0])])
        deadline = time.monotonic() + 30
        while (len(box) or not sender.stats["delivered"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(dropped) == 1 and len(receiver.receive(10, timeout=5.0)) == 1 and len(box) == 0
        assert sender.stats["retried"] == 1 and sender.stats["delivered"] == 1 and not sender.stats["send_failures"]
    finally:
        sender.close()
        box.close()
        node.shutdown()
        learner.shutdown()


def test_a_sender_whose_records_were_answered_busy_waits_rather_than_meeting_the_tarpit(tmp_path):
    """A proven sampler owes its learner four times the burst its door checks at once: each reply
    leaves the rest busy, and the sender waits POLL_S before the next call, by when the bucket has
    refilled, so none of its calls is tarpitted (called again at once, each met an empty bucket and
    waited out the door's second: the demo's samplers lost ~20 s each that way). Every record is
    delivered once."""
    from swarm.wire.envelope import open_envelope
    from swarm.exchange import IntakeConfig
    from swarm.rollouts.journal import Journal
    from swarm.rollouts.outbox import Outbox
    from swarm.rollouts import RolloutReceiver, RolloutSender
    from helpers.intake import Learner, make_item

    learner = SwarmNode(Identity.load_or_create(tmp_path / "learner.key"), NetworkConfig(), "busy")
    node = SwarmNode(Identity.load_or_create(tmp_path / "sampler.key"),
                     NetworkConfig(initial_peers=learner.maddrs()), "busy")
    receiver = RolloutReceiver(learner, Journal(tmp_path / "journal.bin"), IntakeConfig(quota=16, rate=32.0))
    receiver.open(Learner(), cursor=0)  # every key proven: its own budget only
    box = Outbox(tmp_path / "outbox.db")
    sender = RolloutSender(node, box, lambda: learner.peer_id, rpc_timeout=10.0)
    try:
        items = [make_item(node.identity) for _ in range(64)]
        sender.send([(rid, open_envelope(env)[0]) for rid, env in items])
        got, deadline = [], time.monotonic() + 60
        while (len(got) < 64 or len(box)) and time.monotonic() < deadline:  # (the last ack follows the journal)
            got += receiver.receive(64, timeout=0.05)  # read as the learner does: its quota frees
        assert len(got) == 64 and len(box) == 0, (len(got), len(box))
        assert sender.stats["busy"] > 0, "the burst never ran out: the test tests nothing"
        assert receiver.tarpitted == 0, (receiver.tarpitted, dict(sender.stats))
    finally:
        sender.close()
        box.close()
        node.shutdown()
        learner.shutdown()
