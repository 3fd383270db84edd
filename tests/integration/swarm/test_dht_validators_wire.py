"""The validator chain every DHT peer runs (swarm/dht/validation.py OwnerValidator, hivemind's
signatures) on real in-process DHT peers: they keep a learner's tally and refuse a forged one.
The chain record by record: tests/unit/swarm/test_dht_validators.py."""

from __future__ import annotations

from node.learner.credit import Credit
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
    finally:
        for n in reversed(nodes):
            n.shutdown()
