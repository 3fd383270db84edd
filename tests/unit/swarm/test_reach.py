"""Reachability (swarm/p2p/reach.py): what a bootstrap accepts as a request and how a joining node
settles its network settings. A real probe on loopback: tests/integration/swarm/test_reach_wire.py;
the NAT case (a probe that finds a peer private) runs in tests/integration/swarm/test_internet.py,
inside namespaces."""

from __future__ import annotations

import msgpack
import pytest

from swarm.dht.network import NetworkConfig
from swarm.p2p.reach import all_loopback, settle
from swarm.wire.reach import MAX_PORTS, ReachRequest

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
    assert ReachRequest.ports_of(payload) == ports


def test_loopback_bootstraps_need_no_probe():
    assert all_loopback([BOOT]) and not all_loopback([BOOT, REMOTE]) and not all_loopback([])
    assert not all_loopback(["/dns4/example.org/tcp/1/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"])


@pytest.mark.parametrize("net,private", [
    (NetworkConfig(initial_peers=[BOOT]), False),  # all on this machine: as configured, no probe
    (NetworkConfig(initial_peers=[REMOTE], reachability="public"), False),
    (NetworkConfig(initial_peers=[REMOTE], public_ip="203.0.113.9"), False),
    (NetworkConfig(initial_peers=[REMOTE], announce_maddrs=["/ip4/203.0.113.9/tcp/4001"]), False),  # a forward
    (NetworkConfig(initial_peers=[REMOTE], reachability="private"), True),
    (NetworkConfig(initial_peers=[REMOTE], client_mode=True), True),
])
def test_settle_without_a_probe(net, private):
    out, reach = settle(net)
    assert reach is None and out.client_mode == private and out.use_auto_relay == private
    if not private:
        assert out == net  # untouched
    else:
        assert out.use_relay and out.reachability == "private"


def test_the_listen_address_follows_the_bootstraps_unless_given():
    assert NetworkConfig().host == "127.0.0.1" and NetworkConfig(initial_peers=[BOOT]).host == "127.0.0.1"
    assert NetworkConfig(initial_peers=[BOOT, REMOTE]).host == "0.0.0.0"  # one elsewhere: it must dial us
    assert NetworkConfig(public_ip="203.0.113.9").host == "0.0.0.0"
    assert NetworkConfig(host="10.0.0.2", initial_peers=[REMOTE]).host == "10.0.0.2"


def test_an_unknown_reachability_is_a_config_error():
    with pytest.raises(ValueError, match="auto, public or private"):
        NetworkConfig(reachability="maybe")
