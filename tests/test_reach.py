"""Reachability (swarm/reach.py): what a bootstrap accepts as a request, how a joining node settles
its network settings, and a real probe on loopback. The NAT case (a probe that finds a peer
private) runs in tests/test_internet.py, inside namespaces."""

from __future__ import annotations

import msgpack
import pytest

from swarm.dht import NetworkConfig
from swarm.reach import MAX_PORTS, _ports, all_loopback, settle

BOOT = "/ip4/127.0.0.1/tcp/4001/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
REMOTE = "/ip4/203.0.113.7/tcp/4001/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


@pytest.mark.parametrize("payload,ports", [
    (msgpack.packb({"ports": [31337]}), [31337]),
    (msgpack.packb({"ports": [5, 3, 5]}), [3, 5]),  # sorted, once each
    (msgpack.packb({"ports": list(range(1, MAX_PORTS + 2))}), []),  # more than MAX_PORTS: not read
    (msgpack.packb({"ports": [0]}), []), (msgpack.packb({"ports": [65536]}), []),
    (msgpack.packb({"ports": [True]}), []), (msgpack.packb({"ports": [1.5]}), []),
    (msgpack.packb({"ports": "31337"}), []), (msgpack.packb([31337]), []), (b"\xc1\xc1", []), (b"", []),
])
def test_a_request_names_at_most_a_few_valid_ports_or_none(payload, ports):
    assert _ports(payload) == ports


def test_loopback_bootstraps_need_no_probe():
    assert all_loopback([BOOT]) and not all_loopback([BOOT, REMOTE]) and not all_loopback([])
    assert not all_loopback(["/dns4/example.org/tcp/1/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"])


@pytest.mark.parametrize("net,private", [
    (NetworkConfig(initial_peers=[BOOT]), False),  # all on this machine: as configured, no probe
    (NetworkConfig(initial_peers=[REMOTE], reachability="public"), False),
    (NetworkConfig(initial_peers=[REMOTE], public_ip="203.0.113.9"), False),
    (NetworkConfig(initial_peers=[REMOTE], reachability="private"), True),
    (NetworkConfig(initial_peers=[REMOTE], client_mode=True), True),
])
def test_settle_without_a_probe(net, private):
    out = settle(net)
    assert out.client_mode == private and out.use_auto_relay == private
    if not private:
        assert out == net  # untouched
    else:
        assert out.use_relay and out.reachability == "private"


def test_an_unknown_reachability_is_a_config_error():
    with pytest.raises(ValueError, match="auto, public or private"):
        NetworkConfig(reachability="maybe")


@pytest.mark.integration
def test_a_bootstrap_answers_a_probe_and_refuses_garbage_with_a_reason(tmp_path):
    from swarm.identity import Identity
    from swarm.p2p import SwarmNode
    from swarm.reach import REACH, probe, serve_reachability

    boot = SwarmNode(Identity.load_or_create(tmp_path / "boot.key"), NetworkConfig(), "reach")
    counts = serve_reachability(boot)
    caller = SwarmNode(Identity.load_or_create(tmp_path / "caller.key"), NetworkConfig(initial_peers=boot.maddrs()),
                       "reach")
    try:
        # a real probe: a listener on a free port of this machine, dialled back by the bootstrap
        from swarm.reach import free_port

        port = free_port("127.0.0.1")
        reach = probe("127.0.0.1", port, boot.maddrs())
        assert reach.reachable is True and reach.ip == "127.0.0.1" and reach.bootstrap == boot.peer_id, reach
        # a peer with its own key sends garbage, and too many ports: refused with a reason, counted
        for payload in (b"\xc1", msgpack.packb({"ports": list(range(1, 100))})):
            reply = msgpack.unpackb(caller.call(boot.peer_id, REACH, payload, timeout=30), raw=False)
            assert reply == {"ip": "127.0.0.1", "open": [], "error": "malformed"}, reply
        assert counts["malformed"] == 2 and counts["probes"] == 1
    finally:
        caller.shutdown()
        boot.shutdown()
