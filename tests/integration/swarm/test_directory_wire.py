"""The directory and the DHT's storage budget over the real protocol (real hivemind peers in this
process): what a coordinator keeps and serves, and what a stranger with its own key is refused."""

from __future__ import annotations

import time
from functools import partial

import msgspec
import pytest
from hivemind.dht import DHT

from swarm.dht.network import NetworkConfig
from swarm.dht.validation import OwnerValidator
from swarm.identity import Identity
from swarm.p2p import SwarmNode
from swarm.wire.directory import DIRECTORY, DirectoryReply, DirectoryRequest, Want
from swarm.wire.peer import PeerInfo
from swarm.wire.tally import Contribution, Tally
from helpers.fake_records import ManyKeys, make_keys
from helpers import storage_flood

SWARM = "dir"


def _card(node: SwarmNode, role: str = "learner") -> PeerInfo:
    return PeerInfo(peer_id=node.peer_id, role=role, model_id="m", version=1, engine="hf", throughput=1.0,
                    maddrs=node.maddrs())


@pytest.fixture
def swarm(tmp_path):
    """A coordinator naming a learner (which has announced and published a tally), a sampler and a
    stranger, each a SwarmNode of its own key, joined through the coordinator."""
    nodes = []
    try:
        boot = SwarmNode(Identity.load_or_create(tmp_path / "boot.key"), NetworkConfig(host="127.0.0.1"), SWARM)
        nodes.append(boot)
        join = NetworkConfig(initial_peers=boot.maddrs()[:1])
        for name in ("learner", "sampler", "stranger"):
            nodes.append(SwarmNode(Identity.load_or_create(tmp_path / f"{name}.key"), join, SWARM))
        _, learner, sampler, stranger = nodes
        boot.publish_swarm_record({learner.peer_id: "m"}, "m")
        learner.announce(_card(learner))
        c = Contribution(groups=1, rollouts=4, tokens=9, first=1.0, last=2.0, models=["m"])
        learner.publish_tally(Tally(learner=learner.peer_id, seq=1, time=2.0, model_id="m", peers={sampler.peer_id: c}))
        yield boot, learner, sampler, stranger
    finally:
        for node in reversed(nodes):
            node.shutdown()


@pytest.mark.timeout(180)
def test_a_sampler_gets_the_named_learners_records_from_its_coordinator(swarm):
    boot, learner, sampler, _ = swarm
    assert boot.directory.book.get("peer", learner.peer_id) is not None  # the learner offered, the coordinator kept
    assert boot.directory.book.get("tally", learner.peer_id) is not None
    assert sampler.trusted_learners(sampler.coordinators) == {learner.peer_id: "m"}
    assert sampler.directory.book.get("swarm", boot.peer_id) is not None  # by the directory, not the DHT alone
    assert sampler.directory.book.get("peer", learner.peer_id).record.peer_id == learner.peer_id
    tally = sampler.tally_of(learner.peer_id)
    assert tally is not None and sampler.peer_id in tally.peers
    assert sampler.directory.book.favours(sampler.peer_id)  # credited by a named learner


@pytest.mark.timeout(180)
def test_a_named_learner_of_another_wire_protocol_is_not_followed_and_is_said(swarm, monkeypatch, caplog):
    """The learner (its own key) announces the record an older hetero-node would: protocol one less.
    A sampler reads it through its coordinator, follows nobody and says why; announced again at ours,
    it is followed."""
    import swarm.dht.records as records
    from swarm.discovery import LearnerTracker
    from swarm.wire.peer import PROTOCOL

    boot, learner, sampler, _ = swarm

    def tracked(protocol: int) -> LearnerTracker:
        monkeypatch.setattr(records, "PROTOCOL", protocol)  # what `SwarmNode.announce` stamps
        learner.announce(_card(learner))
        tracker, deadline = LearnerTracker(sampler, None, "m"), time.monotonic() + 60
        while time.monotonic() < deadline:
            read = sampler.peer_records([learner.peer_id]).get(learner.peer_id)
            if read is not None and read.protocol == protocol:  # then the tracker reads it too (or newer)
                tracker.refresh(force=True)
                return tracker
            time.sleep(1.0)
        raise AssertionError(f"the sampler never read the learner's protocol-{protocol} record")

    with caplog.at_level("WARNING", logger="swarm.discovery"):
        old = tracked(PROTOCOL - 1)
    assert old.current is None and old.other_protocol == {learner.peer_id: PROTOCOL - 1}
    assert f"wire protocol {PROTOCOL - 1} there, {PROTOCOL} here" in caplog.text
    ours = tracked(PROTOCOL)
    assert ours.current == learner.peer_id and ours.other_protocol == {}


@pytest.mark.timeout(180)
def test_a_credited_sampler_counts_itself_a_mate_though_its_own_record_is_not_read(swarm):
    """The sampler never announced (as if its record had lapsed), but the learner's tally credits it:
    it owns its share of each version's chunks in its own eyes too, as its mates expect."""
    from swarm.discovery import LearnerTracker

    _, learner, sampler, _ = swarm
    tracker, deadline = LearnerTracker(sampler, None, "m"), time.monotonic() + 60
    while tracker.refresh(force=True) is None and time.monotonic() < deadline:
        time.sleep(1.0)
    assert tracker.current == learner.peer_id and sampler.peer_records([sampler.peer_id]) == {}
    assert not sampler.private and tracker.mates == [sampler.peer_id] and not tracker.seeding


@pytest.mark.timeout(180)
def test_a_strangers_offers_are_refused_and_counted(swarm):
    boot, learner, sampler, stranger = swarm
    own = stranger.directory.hold_own("peer", _card(stranger), ttl=60)  # valid, but nobody names it
    genuine = learner.directory.hold_own("peer", _card(learner), ttl=60)
    altered = msgspec.structs.replace(genuine, value=genuine.value.replace(b"hf", b"HF"))
    posing = stranger.directory.sealer.seal("peer", _card(learner), stranger.peer_id, 60)  # names the learner
    before = dict(boot.directory.stats)
    reply = DirectoryReply.decode(stranger.call(boot.peer_id, DIRECTORY,
                                                DirectoryRequest(offer=[own, altered, posing]).encode(), 10))
    stats = boot.directory.stats
    assert reply.taken == 0
    assert stats["offers_refused"] - before.get("offers_refused", 0) == 3
    assert stats["invalid"] - before.get("invalid", 0) == 1  # the altered one: `posing` is a stranger's, not kept
    assert boot.directory.book.get("peer", stranger.peer_id) is None
    served = DirectoryReply.decode(stranger.call(boot.peer_id, DIRECTORY, DirectoryRequest(
        wants=[Want("peer", learner.peer_id)]).encode(), 10))
    assert [e.value for e in served.entries] != [altered.value] and len(served.entries) == 1
    assert stranger.directory.sealer.unseal(served.entries[0])[1].engine == "hf"


@pytest.mark.timeout(180)
def test_a_strangers_flood_of_asks_is_held_at_the_door(swarm):
    boot, _, _, stranger = swarm
    ask = DirectoryRequest(wants=[Want("swarm", boot.peer_id)]).encode()
    replies = [DirectoryReply.decode(stranger.call(boot.peer_id, DIRECTORY, ask, 10)) for _ in range(12)]
    assert sum(r.error == "busy" for r in replies) >= 1
    assert boot.doors.stats()[DIRECTORY].get("calls", 0) >= 1
    assert boot.directory.stats["busy"] >= 1


@pytest.mark.timeout(300)
def test_fresh_keys_storing_their_largest_records_are_refused_past_the_unproven_pool(swarm, tmp_path):
    """8 fresh keys each store a 1 MiB tally and a 64 KiB swarm record at their own keys (what the
    validators let any key store): past 4 MiB of such rows of unproven keys, every node refuses them,
    and counts it."""
    boot, learner, _, _ = swarm
    keys = make_keys(tmp_path / "keys", 8)
    storage_flood._identities[:] = keys  # the DHT's process forks with them: records are built there
    dht = DHT(initial_peers=boot.maddrs()[:1], start=True, client_mode=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
              record_validators=[ManyKeys(keys), OwnerValidator(SWARM)])
    try:
        stored, sent = dht.run_coroutine(partial(storage_flood.store_round, SWARM, kinds=("tally",)))
        assert sent == 8
        time.sleep(1)
        stats = boot.dht_storage()["storage"]
        assert stats["refused_large"] >= 4, stats
        assert stats["large_bytes"] <= 4 << 20 and stats["unproven_bytes"] <= 32 << 20
        assert learner.dht_storage()["storage"]["refused_large"] >= 4
        # the named learner's own 1 MiB tally is favoured: stored however full the pool of strangers is
        c = Contribution(groups=1, rollouts=1, tokens=1, first=1.0, last=1.0, models=["m"])
        peers = {f"Qm{i:044d}": c for i in range(5000)}
        assert learner.publish_tally(Tally(learner=learner.peer_id, seq=2, time=3.0, model_id="m", peers=peers))
        assert boot.dht_storage()["storage"]["favoured_bytes"] > 500_000
    finally:
        dht.shutdown()
