"""Reachability (swarm/p2p/reach.py) for real on loopback: a bootstrap answers a probe and refuses
garbage with a reason, and fresh keys probing black holes cannot push a joiner behind relays. What a
bootstrap accepts and how a joining node settles its settings, by hand:
tests/unit/swarm/test_reach.py. The NAT case (a probe that finds a peer private) runs in
tests/integration/swarm/test_internet.py, inside namespaces."""

from __future__ import annotations

import time

import msgpack

from swarm.dht.network import NetworkConfig


def test_a_bootstrap_answers_a_probe_and_refuses_garbage_with_a_reason(tmp_path):
    from swarm.identity import Identity
    from swarm.p2p import SwarmNode
    from swarm.p2p.reach import probe, serve_reachability
    from swarm.wire.reach import REACH

    boot = SwarmNode(Identity.load_or_create(tmp_path / "boot.key"), NetworkConfig(), "reach")
    counts = serve_reachability(boot)
    caller = SwarmNode(Identity.load_or_create(tmp_path / "caller.key"), NetworkConfig(initial_peers=boot.maddrs()),
                       "reach")
    try:
        # a real probe: a listener on a port of this machine, dialled back by the bootstrap; a dead
        # bootstrap named first does not use up the time (all are asked at once)
        dead = "/ip4/127.0.0.1/tcp/9/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
        reach, port = probe("127.0.0.1", 0, [dead, *boot.maddrs()])
        assert reach.reachable is True and reach.ip == "127.0.0.1" and reach.bootstrap == boot.peer_id, reach
        assert port > 0
        # a peer with its own key sends garbage, and too many ports: refused with a reason, counted
        for payload in (b"\xc1", msgpack.packb({"ports": list(range(1, 100))})):
            reply = msgpack.unpackb(caller.call(boot.peer_id, REACH, payload, timeout=30), raw=False)
            assert reply == {"ip": "127.0.0.1", "open": [], "error": "malformed"}, reply
        assert counts["malformed"] == 2 and counts["probes"] == 1
        # a second request while its first is being probed is refused at once, not queued
        import socket
        import threading

        with socket.socket() as full:  # a listener whose backlog is full: the bootstrap's connect hangs
            full.bind(("127.0.0.1", 0))
            full.listen(0)
            fillers = []
            try:
                while len(fillers) < 8:  # until a connect hangs: the queue is full
                    fillers.append(socket.create_connection(full.getsockname(), timeout=0.5))
            except OSError:
                pass
            ask = msgpack.packb({"ports": [full.getsockname()[1]]})
            first = threading.Thread(target=caller.call, args=(boot.peer_id, REACH, ask), kwargs={"timeout": 30})
            first.start()
            time.sleep(1.0)
            reply = msgpack.unpackb(caller.call(boot.peer_id, REACH, ask, timeout=30), raw=False)
            first.join(30)
            for s in fillers:
                s.close()
        assert reply["error"] == "busy" and counts["busy"] == 1 and counts["probes"] == 2, (reply, counts)
    finally:
        caller.shutdown()
        boot.shutdown()


def test_fresh_keys_probing_black_holes_from_one_address_cannot_push_a_joiner_behind_relays(tmp_path):
    """Issue 39: 120 fresh keys probing black-hole ports kept the bootstrap's 16 slots full, so an
    honest joiner was told "busy" and joined as private. Now 20 keys from one address (127.0.0.3)
    hold at most MAX_PROBES_PER_IP slots, and a busy answer means "ask again"."""
    import asyncio
    import socket
    import threading

    from google.protobuf.wrappers_pb2 import BytesValue
    from hivemind.p2p import P2P, PeerID

    from swarm.identity import Identity
    from swarm.p2p import SwarmNode
    from swarm.p2p.reach import MAX_PROBES, MAX_PROBES_PER_IP, probe, serve_reachability
    from swarm.wire.reach import REACH

    boot = SwarmNode(Identity.load_or_create(tmp_path / "boot.key"), NetworkConfig(), "reach")
    counts = serve_reachability(boot)
    stop, calls = threading.Event(), []
    with socket.socket() as full:  # a black hole: a listener whose backlog is full (the connect hangs)
        full.bind(("127.0.0.3", 0))
        full.listen(0)
        fillers = []
        try:
            while len(fillers) < 8:
                fillers.append(socket.create_connection(full.getsockname(), timeout=0.5))
        except OSError:
            pass
        ask = BytesValue(value=msgpack.packb({"ports": [full.getsockname()[1]]}))

        async def attack(n: int) -> None:
            keys = await asyncio.gather(*(P2P.create(initial_peers=boot.maddrs(), host_maddrs=["/ip4/127.0.0.3/tcp/0"],
                                                     auto_nat=False, nat_port_map=False, use_relay=False)
                                          for _ in range(n)))
            target = PeerID.from_base58(boot.peer_id)

            async def hammer(p2p) -> None:
                while not stop.is_set():
                    try:
                        calls.append(msgpack.unpackb((await p2p.call_protobuf_handler(target, REACH, ask, BytesValue)).value))
                    except Exception:
                        await asyncio.sleep(0.1)
            try:
                await asyncio.gather(*(hammer(p) for p in keys))
            finally:
                await asyncio.gather(*(p.shutdown() for p in keys))
        attacker = threading.Thread(target=lambda: asyncio.run(attack(MAX_PROBES + 4)))
        attacker.start()
        try:
            deadline = time.monotonic() + 60
            while counts["probes"] < MAX_PROBES_PER_IP and time.monotonic() < deadline:
                time.sleep(0.2)  # the attack is under way: its address's slots are taken
            t0 = time.monotonic()
            reach, _ = probe("127.0.0.2", 0, boot.maddrs())
            took = time.monotonic() - t0
        finally:
            stop.set()
            attacker.join(60)
            for s in fillers:
                s.close()
            boot.shutdown()
    print(f"\nreach under attack: {reach}, {took:.1f} s; bootstrap counts {dict(counts)}, {len(calls)} attacker calls")
    assert reach.reachable is True and reach.ip == "127.0.0.2", reach
    assert counts["busy"] > 0 and counts["probes"] >= MAX_PROBES_PER_IP  # the attack ran, was refused and counted
