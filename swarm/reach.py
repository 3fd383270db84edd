"""Can peers dial this one? Asked of a bootstrap before the node starts, so that joining from behind
a home router needs no flag.

  hetero.reach.v1  {"ports": [TCP ports the caller listens on, at most 4]}
                   -> {"ip": the address the bootstrap sees the caller at, "open": [ports it could connect to]}

Behind a NAT (a home router, no port forwarded) a peer dials anyone, but nobody dials it: it must
stay a DHT client (others would keep it in their routing tables and time out on it) and be reached
through a circuit relay. libp2p's own check (AutoNAT) needs several peers' dial-backs over minutes,
and hivemind 1.1.12's daemon reported a NAT'd peer reachable (docs/DESIGN.md, "Dependencies"). The
bootstrap's check is direct and takes one round trip and a connect: a TCP connection from the
bootstrap's network to the address it sees the caller at (after any NAT), at the caller's listening
ports. It tries only that address, so no one can make a bootstrap scan someone else's machine, and
it bounds its work: a few ports, `CONNECT_S` each, `MAX_PROBES` at once.

The caller (`probe`) runs a bare libp2p peer with a throwaway key on the very address and port the
node will listen on (a port forward or a UPnP mapping is per port), asks each bootstrap in turn, and
stops it before the node starts. An unanswered probe (an older bootstrap, a timeout) counts as not
reachable: a client behind relays works everywhere, a server that cannot be dialled does not.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import socket
from dataclasses import dataclass

import msgpack

from .identity import short_id

log = logging.getLogger(__name__)

REACH = "hetero.reach.v1"
MAX_PORTS = 4
CONNECT_S = 3.0
"""Seconds the bootstrap waits for each TCP connection back (a NAT that drops it sends nothing)."""
MAX_PROBES = 16
"""Probes a bootstrap runs at once; more wait (each holds at most MAX_PORTS x CONNECT_S)."""


@dataclass(frozen=True)
class Reach:
    """What a bootstrap saw: `reachable` is None when no bootstrap answered."""

    reachable: bool | None
    ip: str = ""
    bootstrap: str = ""
    why: str = ""


def serve_reachability(node) -> collections.Counter:
    """Answer `hetero.reach.v1` on a bootstrap's `SwarmNode`; returns its counters (probes run,
    malformed requests, callers whose address it could not tell)."""
    slots = asyncio.Semaphore(MAX_PROBES)
    counts: collections.Counter = collections.Counter()

    async def handler(payload: bytes, remote: str) -> bytes:
        ports = _ports(payload)
        ip = await _observed_ip(node.p2p, remote)
        if ip is None or not ports:
            why = "malformed" if not ports else "no_address"
            counts[why] += 1
            log.info("reachability request from %s refused: %s", short_id(remote), why)
            return msgpack.packb({"ip": ip or "", "open": [], "error": why})
        counts["probes"] += 1
        async with slots:
            results = await asyncio.gather(*(_connects(ip, port) for port in ports))
        open_ports = [port for port, ok in zip(ports, results) if ok]
        log.debug("reachability of %s at %s: open %s of %s", short_id(remote), ip, open_ports, ports)
        return msgpack.packb({"ip": ip, "open": open_ports})

    node.add_handler(REACH, handler)
    return counts


def _ports(payload: bytes) -> list[int]:
    """The ports a request names, or [] if it is malformed (a peer's input: never raises)."""
    try:
        ports = msgpack.unpackb(payload, raw=False, max_array_len=MAX_PORTS, max_map_len=1,
                                max_str_len=16, max_bin_len=0).get("ports")
    except Exception:  # garbage, too long, not a map
        return []
    if not isinstance(ports, list) or not all(type(p) is int and 0 < p < 65536 for p in ports):
        return []
    return sorted(set(ports))[:MAX_PORTS]


async def _observed_ip(p2p, remote: str) -> str | None:
    """The IP of `remote`'s connection to us (the NAT's public side, if it is behind one)."""
    for info in await p2p.list_peers():
        if info.peer_id.to_base58() == remote:
            for addr in info.addrs:
                parts = str(addr).split("/")
                if len(parts) > 2 and parts[1] in ("ip4", "ip6") and "p2p-circuit" not in parts:
                    return parts[2]
    return None


async def _connects(ip: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), CONNECT_S)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True


def probe(host: str, port: int, initial_peers: list[str], timeout: float = 30.0) -> Reach:
    """Ask the bootstraps in `initial_peers`, in turn, whether a peer listening on host:port can be
    dialled from outside. Blocks for at most about `timeout` seconds."""
    return asyncio.run(asyncio.wait_for(_probe(host, port, initial_peers), timeout))


async def _probe(host: str, port: int, initial_peers: list[str]) -> Reach:
    from hivemind.p2p import P2P, PeerID

    p2p = await P2P.create(initial_peers=initial_peers, host_maddrs=[f"/ip4/{host}/tcp/{port}"], auto_nat=False,
                           nat_port_map=False, use_relay=False, check_if_identity_free=False, startup_timeout=20)
    try:
        why = "no bootstrap answered"
        for maddr in initial_peers:
            bootstrap = maddr.rsplit("/p2p/", 1)[-1]
            try:
                reply = msgpack.unpackb(await asyncio.wait_for(_call(p2p, PeerID.from_base58(bootstrap)), 15),
                                        raw=False)
            except Exception as e:  # an older bootstrap, unreachable, slow: try the next
                why = f"{short_id(bootstrap)}: {type(e).__name__}: {e}"
                continue
            return Reach(port in reply.get("open", []), str(reply.get("ip", "")), bootstrap)
        return Reach(None, why=why)
    finally:
        await p2p.shutdown()


async def _call(p2p, bootstrap) -> bytes:
    from google.protobuf.wrappers_pb2 import BytesValue

    maddrs = await p2p.get_visible_maddrs()
    ports = sorted({int(str(m).split("/tcp/")[1].split("/")[0]) for m in maddrs if "/tcp/" in str(m)})
    reply = await p2p.call_protobuf_handler(bootstrap, REACH, BytesValue(value=msgpack.packb({"ports": ports})),
                                            BytesValue)
    return reply.value


def free_port(host: str) -> int:
    """A TCP port free on `host` now: the probe and then the node listen on it (a port forward or a
    router's mapping is per port, so both must use the same one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def all_loopback(maddrs: list[str]) -> bool:
    """Whether every one of `maddrs` is on this machine (no NAT between: nothing to probe)."""
    def loopback(m: str) -> bool:
        parts = m.split("/")
        try:
            return len(parts) > 2 and parts[1] in ("ip4", "ip6") and ipaddress.ip_address(parts[2]).is_loopback
        except ValueError:
            return False
    return bool(maddrs) and all(loopback(m) for m in maddrs)


def settle(net):
    """The network settings a joining node runs with (`NetworkConfig`), its reachability settled:
    public, it serves the DHT and can relay for others; private (behind a NAT), it is a DHT client
    that asks the swarm's relays for a reservation, so that others reach it through them."""
    from dataclasses import replace

    if net.client_mode or net.reachability == "private":
        return replace(net, client_mode=True, use_relay=True, use_auto_relay=True, reachability="private")
    if net.reachability == "public" or net.public_ip or all_loopback(net.initial_peers):
        return net  # said so, or checked on its own (a --public-ip), or nothing between us and the swarm
    port = net.port or free_port(net.host)
    try:
        reach = probe(net.host, port, list(net.initial_peers))
    except Exception as e:  # the daemon did not start, or the whole probe timed out
        reach = Reach(None, why=f"{type(e).__name__}: {e}")
    if reach.reachable:
        log.info("reachability: the bootstrap %s connected to %s:%d: joining as a public peer",
                 short_id(reach.bootstrap), reach.ip, port)
        return replace(net, port=port, use_relay=True, reachability="public")
    if reach.reachable is None:
        log.warning("reachability: no bootstrap could tell whether peers can dial this machine (%s); "
                    "joining behind relays, which works everywhere", reach.why)
    else:
        log.info("reachability: the bootstrap %s could not connect to %s:%d (behind a NAT or a firewall): "
                 "joining as a DHT client, reached through relays", short_id(reach.bootstrap), reach.ip, port)
    return replace(net, port=port, client_mode=True, use_relay=True, use_auto_relay=True, reachability="private")
