"""Several learners in one swarm (docs/DESIGN.md, "Several learners"), over the real protocol: a
sampler's copies reach two real receivers and a dead peer's wait without holding up the rest, in one
process. Who a sampler follows and feeds, its outbox and a coordinator's list of learners:
tests/unit/swarm/test_fanout.py; three learners as processes:
tests/integration/swarm/test_swarm_learners.py."""

from __future__ import annotations

import time

from swarm.rollouts.outbox import Outbox


def test_copies_reach_every_learner_and_a_dead_partner_delays_nobody(tmp_path):
    """One sampler, its own learner and a partner (real hivemind peers and real receivers with their
    journals), and a partner that has left: the same signed envelope reaches both live learners,
    each acknowledges on its own, and the dead one's copies wait (bounded) without holding up the rest."""
    from swarm.dht.network import NetworkConfig
    from swarm.wire.envelope import open_envelope
    from swarm.identity import Identity
    from swarm.rollouts.journal import Journal
    from swarm.p2p import SwarmNode
    from swarm.exchange import IntakeConfig
    from swarm.rollouts import RolloutReceiver, RolloutSender
    from helpers.intake import Learner, make_item

    own = SwarmNode(Identity.load_or_create(tmp_path / "own.key"), NetworkConfig(), "fan")
    boot = own.maddrs()
    partner = SwarmNode(Identity.load_or_create(tmp_path / "partner.key"), NetworkConfig(initial_peers=boot), "fan")
    dead = SwarmNode(Identity.load_or_create(tmp_path / "dead.key"), NetworkConfig(initial_peers=boot), "fan")
    dead_id = dead.peer_id
    dead.shutdown()
    node = SwarmNode(Identity.load_or_create(tmp_path / "sampler.key"), NetworkConfig(initial_peers=boot), "fan")
    receivers = {n.peer_id: RolloutReceiver(n, Journal(tmp_path / f"{name}.journal"), IntakeConfig())
                 for name, n in (("own", own), ("partner", partner))}
    for r in receivers.values():
        r.open(Learner(), cursor=0)
    box = Outbox(tmp_path / "outbox.db")
    sender = RolloutSender(node, box, lambda: own.peer_id, rpc_timeout=5.0,
                           partners=lambda: [partner.peer_id, dead_id], max_partner_owed=4)
    try:
        records = []
        for i in range(6):
            rid, env = make_item(node.identity)
            records.append((rid, open_envelope(env)[0]))  # the record bytes; the sender seals them itself
        def settled() -> bool:
            return not (box.owed() or box.owed(partner.peer_id) or not sender.partner_stats[dead_id]["send_failures"])

        for batch in (records[:3], records[3:]):  # the live partner never owes more than the bound of 4
            sender.send(batch)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not settled():
                time.sleep(0.2)
        got = {pid: [raw for raw in r.receive(100, timeout=1.0)] for pid, r in receivers.items()}
        assert len(got[own.peer_id]) == 6 and sorted(got[own.peer_id]) == sorted(got[partner.peer_id])  # same bytes, once
        assert sender.stats["delivered"] == 6 and sender.partner_stats[partner.peer_id]["delivered"] == 6
        assert box.owed(dead_id) == 4 and sender.partner_stats[dead_id]["given_up"] == 2  # bounded, counted
        assert sender.partner_stats[dead_id]["send_failures"] >= 1 and len(box) == 4
    finally:
        sender.close()
        box.close()
        for n in (node, partner, own):
            n.shutdown()
