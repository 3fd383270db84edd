"""Tails relayed over the real protocol (in-process hivemind peers on 127.0.0.1): the learner sends a
version's tail to its first proven relay and a `TailNotice` to the next sampler, which takes the tail
from the relay (hetero.tail.v1); a fresh key that offers to relay is never named; relays that send
other bytes or cannot be reached are refused, counted and demoted, and the sampler takes the tail from
the learner. (Which asker gets what, by hand: tests/unit/swarm/test_tail_relay.py.)"""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from swarm.dht.network import NetworkConfig
from swarm.exchange import WeightVersion
from swarm.identity import Identity
from swarm.p2p import SwarmNode
from swarm.weights import WeightFetcher, WeightServer
from swarm.wire.manifest import MANIFEST, TAIL, Manifest, ManifestRequest, TailNotice, VersionEntry


@pytest.fixture
def swarm(tmp_path):
    """A learner whose tails go to `relays` samplers, and nodes to build samplers and strangers on."""
    made: list[SwarmNode] = []
    fetchers: list[WeightFetcher] = []
    learner = SwarmNode(Identity.load_or_create(tmp_path / "l.key"), NetworkConfig(), "tr")
    made.append(learner)

    def node(name: str) -> SwarmNode:
        n = SwarmNode(Identity.load_or_create(tmp_path / f"{name}.key"), NetworkConfig(initial_peers=learner.maddrs()), "tr")
        made.append(n)
        return n

    def fetcher(n: SwarmNode, mates: list[str]) -> WeightFetcher:
        f = WeightFetcher(n, lambda: learner.peer_id, mates=lambda: sorted(mates))
        fetchers.append(f)
        return f

    yield learner, node, fetcher
    for f in fetchers:
        f.close()
    for n in reversed(made):
        n.shutdown()


def _publish(server: WeightServer, chain: str, v: int, rng: random.Random) -> bytes:
    blob = rng.randbytes(300_000)  # 5 chunks of 64 KiB
    server.publish(WeightVersion("m", chain, v, None if v == 0 else v - 1, blob))
    return blob


def test_a_notice_sends_a_sampler_to_the_relay_and_a_fresh_key_is_never_named(swarm):
    learner, node, fetcher = swarm
    server, rng = WeightServer(learner, relays=1), random.Random(0)
    relay_node, asker_node, fresh = node("relay"), node("asker"), node("fresh")
    mates = [relay_node.peer_id, asker_node.peer_id]
    learner.doors.set_proven(lambda peer: peer in mates)
    relay, asker = fetcher(relay_node, mates), fetcher(asker_node, mates)
    _publish(server, "c1", 0, rng)
    assert relay.fetch("", -1) and asker.fetch("", -1)  # both hold v0 (the whole segment: never a notice)
    v1 = _publish(server, "c1", 1, rng)
    # a key the learner has not proven asks first, offering to relay: it gets the tail, and is not named
    first = fresh.call(learner.peer_id, MANIFEST, ManifestRequest("c1", 0, 0.0, notice=False, relay=True).encode(), 30)
    assert not TailNotice.is_notice(first) and Manifest.open(first, learner.peer_id).versions[0].version == 1
    assert [w.blob for w in relay.fetch("c1", 0)] == [v1]  # the first proven relay: sent the tail
    sealed_before = server.stats["sealed"]
    got = asker.fetch("c1", 0)  # sent a notice naming the relay, which serves it the tail
    assert got is not None and [w.blob for w in got] == [v1]
    assert server.stats["notices"] == 1 and server.stats["sealed"] == sealed_before
    assert asker.stats["tails_from_relays"] == 1 and asker.stats["tails_from_learner"] == 0
    assert relay.relay.stats["served"] == 1
    # the notice cost the learner a fraction of the tail it stands for
    assert server.stats["notices_bytes"] < len(first) / 3


def test_relays_that_lie_or_cannot_be_reached_are_refused_counted_and_the_learner_serves_the_tail(swarm, tmp_path):
    learner, node, fetcher = swarm
    server, rng = WeightServer(learner, relays=2), random.Random(1)
    liar, absent, asker_node = node("liar"), node("absent"), node("asker")
    learner.doors.set_proven(lambda peer: True)
    forger = Identity.load_or_create(tmp_path / "forger.key")

    async def forged_tail(payload: bytes, remote: str) -> bytes:  # the liar's own hetero.tail.v1
        entry = VersionEntry.of_blob(1, 0, b"not the learner's version")
        return Manifest("m", "c2", 1 << 20, (entry,), learner.peer_id, 1.0, 0).seal(forger)

    liar.add_handler(TAIL, forged_tail)  # (`absent` serves no hetero.tail.v1 at all)
    asker = fetcher(asker_node, [asker_node.peer_id, liar.peer_id])  # a mate: so it takes notices
    _publish(server, "c2", 0, rng)
    assert asker.fetch("", -1)
    v1 = _publish(server, "c2", 1, rng)
    for stranger in (liar, absent):  # each has itself named a relay: proven, holding v0, offering to relay
        ask = ManifestRequest("c2", 0, 0.0, notice=False, relay=True).encode()
        assert not TailNotice.is_notice(stranger.call(learner.peer_id, MANIFEST, ask, 30))
    got = asker.fetch("c2", 0)
    assert got is not None and [w.blob for w in got] == [v1]  # from the learner in the end, whole and checked
    assert server.stats["notices"] == 1
    assert asker.stats["bad_tails"] == 1 and asker.stats["tail_relay_failures"] == 1
    assert asker.stats["tails_from_learner"] == 1 and asker.stats["tails_from_relays"] == 0
    assert asker.demoted[liar.peer_id] == 1 and asker.demoted[absent.peer_id] == 1  # (then benched: not asked for chunks)


def _relay_named_by_its_own_call(swarm, chain: str, seed: int):
    """A learner naming one relay, the relay and an asker (proven mates of each other) holding v0, v1
    published, and the relay named by a call of its own (its fetcher never sees the tail, so its
    TailRelay does not hold it): (relay, asker, v1, the sealed tail the learner sent the relay)."""
    learner, node, fetcher = swarm
    server, rng = WeightServer(learner, relays=1), random.Random(seed)
    relay_node, asker_node = node("relay"), node("asker")
    mates = [relay_node.peer_id, asker_node.peer_id]
    learner.doors.set_proven(lambda peer: peer in mates)
    relay, asker = fetcher(relay_node, mates), fetcher(asker_node, mates)
    _publish(server, chain, 0, rng)
    assert relay.fetch("", -1) and asker.fetch("", -1)
    v1 = _publish(server, chain, 1, rng)
    sealed = relay_node.call(learner.peer_id, MANIFEST, ManifestRequest(chain, 0, 0.0, relay=True).encode(), 30)
    assert sealed and not TailNotice.is_notice(sealed)
    return relay, asker, v1, sealed


def test_a_relay_asked_before_it_holds_the_tail_waits_for_it(swarm):
    relay, asker, v1, sealed = _relay_named_by_its_own_call(swarm, "c3", 2)
    threading.Timer(0.5, relay.relay.keep, args=(sealed,)).start()  # the relay reads its copy late
    got = asker.fetch("c3", 0)
    assert got is not None and [w.blob for w in got] == [v1]
    assert relay.relay.stats["served_after_wait"] == 1 and asker.stats["tails_from_relays"] == 1


def test_a_named_relay_that_never_serves_the_tail_is_demoted_and_the_learner_serves_it(swarm):
    silent, asker, v1, _ = _relay_named_by_its_own_call(swarm, "c4", 3)  # it never keeps the tail:
    got = asker.fetch("c4", 0)  # it answers b"" after its wait
    assert got is not None and [w.blob for w in got] == [v1]
    assert silent.relay.stats["not_held"] == 1 and asker.stats["tails_not_held"] == 1
    assert asker.stats["tails_from_learner"] == 1 and asker.demoted[silent.node.peer_id] == 1


def test_a_relay_that_holds_the_request_is_hedged_to_the_next_one(swarm):
    learner, node, fetcher = swarm
    server, rng = WeightServer(learner, relays=2), random.Random(4)
    staller, honest_node, asker_node = node("staller"), node("honest"), node("asker")
    learner.doors.set_proven(lambda peer: True)

    async def stall(payload: bytes, remote: str) -> bytes:  # holds every request, answers nothing
        await asyncio.sleep(60)
        return b""

    staller.add_handler(TAIL, stall)
    mates = [honest_node.peer_id, asker_node.peer_id]  # (the staller is no mate: it owns no chunk)
    honest, asker = fetcher(honest_node, mates), fetcher(asker_node, mates)
    _publish(server, "c5", 0, rng)
    assert honest.fetch("", -1) and asker.fetch("", -1)
    v1 = _publish(server, "c5", 1, rng)
    # the asker tries the relays a notice names in an order of its own (`_relayed_tail`): they are
    # named in the order that puts the staller first in it
    swap = [0, 1]
    random.Random(f"{asker_node.peer_id}/1").shuffle(swap)
    for who in ("staller", "honest") if swap == [0, 1] else ("honest", "staller"):
        if who == "staller":
            ask = ManifestRequest("c5", 0, 0.0, relay=True).encode()
            assert not TailNotice.is_notice(staller.call(learner.peer_id, MANIFEST, ask, 30))
        else:
            assert [w.blob for w in honest.fetch("c5", 0)] == [v1]
    got = asker.fetch("c5", 0)
    assert got is not None and [w.blob for w in got] == [v1]
    # the tail came from the honest relay while the staller still held the request: asked one after
    # the other, the staller's call would have timed out first (TailRelay.HOLD_S + hedge_s, counted)
    assert asker.stats["tails_from_relays"] == 1 and honest.relay.stats["served"] == 1
    assert asker.stats["tail_relay_failures"] == 0 and asker.stats["tails_from_learner"] == 0
