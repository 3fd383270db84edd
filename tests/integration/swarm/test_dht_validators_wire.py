"""The validator chain every DHT peer runs (swarm/dht/validation.py OwnerValidator, hivemind's
signatures) on real in-process DHT peers: they keep a learner's tally and refuse a forged one, and
one of its own past the wire's bounds.
The chain record by record: tests/unit/swarm/test_dht_validators.py."""

from __future__ import annotations

import msgspec
from msgspec import UNSET

from node.learner.credit import Credit
from swarm.wire.tally import MAX_SEEDERS
from swarm.dht.network import NetworkConfig
from swarm.identity import Identity


def test_the_dht_keeps_a_learners_tally_and_refuses_forged_ones(tmp_path):
    from swarm.p2p import SwarmNode

    nodes = []
    try:
        learner = SwarmNode(Identity.load_or_create(tmp_path / "l.key"), NetworkConfig(), "lbt")
        nodes.append(learner)
        forger = SwarmNode(Identity.load_or_create(tmp_path / "f.key"), NetworkConfig(initial_peers=learner.maddrs()), "lbt")
        reader = SwarmNode(Identity.load_or_create(tmp_path / "r.key"), NetworkConfig(initial_peers=learner.maddrs()), "lbt")
        nodes += [forger, reader]
        t = Credit()
        t.credit("sampler-A", 8, 40, "m")
        assert learner.publish_tally(t.tally(learner.peer_id, "m"))
        forged = Credit()
        forged.credit(forger.peer_id, 10_000, 10_000, "m")
        assert not forger.publish_tally(forged.tally(learner.peer_id, "m"))  # claims to be the learner
        got = reader.tally_of(learner.peer_id)
        assert got.learner == learner.peer_id and got.peers["sampler-A"].rollouts == 8
        # the learner's own key, naming one seeder past the wire's bound: refused by every peer
        over = msgspec.structs.replace(t.tally(learner.peer_id, "m"), seeders=[forger.peer_id] * (MAX_SEEDERS + 1))
        assert not learner.publish_tally(over)
        assert reader.tally_of(learner.peer_id).seeders is UNSET  # still the last one it could store
    finally:
        for n in reversed(nodes):
            n.shutdown()


def test_a_tally_larger_than_the_dht_pipes_buffer_is_published_and_read(tmp_path):
    """A tally of 5,000 samplers (its 2,048 largest by name, ~0.25 MB) crosses the pipe to the DHT's process in one message:
    hivemind's loop left that pipe non-blocking, and the DHT process died reading the first
    message past 64 KiB (swarm/dht/process.py, _BlockingRecv)."""
    from swarm.p2p import SwarmNode

    nodes = []
    try:
        learner = SwarmNode(Identity.load_or_create(tmp_path / "l.key"), NetworkConfig(), "big")
        nodes.append(learner)
        reader = SwarmNode(Identity.load_or_create(tmp_path / "r.key"), NetworkConfig(initial_peers=learner.maddrs()), "big")
        nodes.append(reader)
        t = Credit()
        for i in range(5000):
            t.credit(f"sampler-{i:05d}", 8, 40, "m")
        assert learner.publish_tally(t.tally(learner.peer_id, "m"))
        assert learner.publish_tally(t.tally(learner.peer_id, "m"))  # the pipe still reads whole messages
        got = reader.tally_of(learner.peer_id)
        assert got is not None and len(got.peers) == 2048 and got.others.count == 5000 - 2048
        assert next(iter(got.peers.values())).rollouts == 8
    finally:
        for n in reversed(nodes):
            n.shutdown()
