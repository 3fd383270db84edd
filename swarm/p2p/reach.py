"""Can peers dial this one? Asked of a bootstrap before the node starts, so that joining from behind
a home router needs no flag.

  hetero.reach.v1  ReachRequest (TCP ports the caller listens on, at most 4)
                   -> ReachReply (the address the bootstrap sees the caller at, the ports it could
                      connect to): swarm/wire/reach.py

Behind a NAT (a home router, no port forwarded) a peer dials anyone, but nobody dials it: it must
stay a DHT client (others would keep it in their routing tables and time out on it) and be reached
through a circuit relay. libp2p's own check (AutoNAT) needs several peers' dial-backs over minutes,
and hivemind 1.1.12's daemon reported a NAT'd peer reachable (docs/DESIGN.md, "Dependencies"). The
bootstrap's check is direct and takes one round trip and a connect: a TCP connection from the
bootstrap's network to the address it sees the caller at (after any NAT), at the caller's listening
ports. It tries only that address, so no one can make a bootstrap scan someone else's machine, and
it bounds its work: a few ports, `CONNECT_S` each, one probe per peer, `MAX_PROBES_PER_IP` per
address and `MAX_PROBES` in all at once; more are answered "busy" (after a short tarpit), which
the caller reads as "ask again", never as "not reachable". Keys are free but addresses are not:
120 fresh keys probing black-hole ports kept all 16 slots full and an honest joiner was told
"busy" 2 times in 3 and joined as private (issue 39); from one address they now hold 2 slots.

The caller (`probe`) listens with a plain socket on the very address and port the node will then
listen on (a port forward is per port), and asks every bootstrap at once through a bare libp2p
peer with a throwaway key on another port, so that its own call opens no NAT mapping for the port
under test (an address-restricted NAT lets in whoever we sent to: the bootstrap must not pass for
everyone). An unanswered probe (an older bootstrap, a timeout) counts as not reachable: a client
behind relays works everywhere, a server that cannot be dialled does not. Not seen by the probe:
a UPnP mapping the node's daemon would make later (`nat_port_map`): such a node joins as private.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import socket
from dataclasses import dataclass


from swarm.identity import short_id
from swarm.wire.reach import REACH, ReachReply, ReachRequest

log = logging.getLogger(__name__)

CONNECT_S = 3.0
"""Seconds the bootstrap waits for each TCP connection back (a NAT that drops it sends nothing)."""
MAX_PROBES = 16
"""Probes a bootstrap runs at once; more are busy (each holds a slot at most CONNECT_S: its ports
are tried together)."""
MAX_PROBES_PER_IP = 2
"""Probes from one address at once: a NAT's many machines, or one machine's many keys."""
RETRY_S = 1.0
"""A busy bootstrap is asked again after about this long, until the probe's timeout."""


@dataclass(frozen=True)
class Reach:
    """What a bootstrap saw: `reachable` is None when no bootstrap answered."""

    reachable: bool | None
    ip: str = ""
    bootstrap: str = ""
    why: str = ""


def serve_reachability(node) -> collections.Counter:
    """Answer `hetero.reach.v1` on a bootstrap's `SwarmNode`; returns its counters (probes run,
    requests refused by reason: malformed, no_address, busy)."""
    running: set[str] = set()
    by_ip: collections.Counter[str] = collections.Counter()
    counts: collections.Counter = collections.Counter()
    door = node.doors.open(REACH)

    async def handler(payload: bytes, remote: str) -> bytes:
        past = door.enter(remote)
        if past is not None:
            counts["busy"] += 1
            await door.tarpit(remote, past)
            return ReachReply(error="busy").encode()
        ports = ReachRequest.ports_of(payload)
        ip = await _observed_ip(node.p2p, remote)
        why = "malformed" if not ports else "no_address" if ip is None else \
            "busy" if remote in running or by_ip[ip] >= MAX_PROBES_PER_IP or len(running) >= MAX_PROBES else None
        if why is not None:  # the rest not queued: answered (busy: after the tarpit; the caller asks again)
            counts[why] += 1
            log.info("reachability request from %s refused: %s", short_id(remote), why)
            if why == "busy":
                await door.tarpit(remote)
            return ReachReply(ip=ip or "", error=why).encode()
        counts["probes"] += 1
        running.add(remote)
        by_ip[ip] += 1
        try:
            results = await asyncio.gather(*(_connects(ip, port) for port in ports))
        finally:
            running.discard(remote)
            by_ip[ip] -= 1
            if by_ip[ip] <= 0:
                del by_ip[ip]
        open_ports = [port for port, ok in zip(ports, results) if ok]
        log.debug("reachability of %s at %s: open %s of %s", short_id(remote), ip, open_ports, ports)
        return ReachReply(ip=ip, open=open_ports).encode()

    node.add_handler(REACH, handler)
    return counts


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


def probe(host: str, port: int, initial_peers: list[str], timeout: float = 20.0) -> tuple[Reach, int]:
    """Whether a peer listening on host:port (port 0: one picked now) can be dialled from outside,
    as the first of the bootstraps in `initial_peers` to answer sees it; and the port. Blocks for
    at most about `timeout` seconds."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as listener:
        # a plain listener, so that the bootstrap's connection back finds something that accepts; our
        # own call goes out from another port: a NAT that lets a peer in once we sent it something
        # (an address-restricted cone) must not pass for an open port
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(16)
        port = listener.getsockname()[1]
        try:
            reach = asyncio.run(asyncio.wait_for(_probe(host, port, initial_peers), timeout))
        except Exception as e:  # the daemon did not start, or nobody answered in time
            reach = Reach(None, why=f"{type(e).__name__}: {e}")
    return reach, port


async def _probe(host: str, port: int, initial_peers: list[str]) -> Reach:
    from hivemind.p2p import P2P, PeerID

    from swarm.dht.network import listen_maddr

    p2p = await P2P.create(initial_peers=initial_peers, host_maddrs=[listen_maddr(host, 0)], auto_nat=False,
                           nat_port_map=False, use_relay=False, check_if_identity_free=False, startup_timeout=15)
    bootstraps = [maddr.rsplit("/p2p/", 1)[-1] for maddr in initial_peers]

    async def ask(bootstrap: str) -> Reach:
        while True:  # "busy" means ask again (until the caller's timeout), never "not reachable"
            reply = ReachReply.decode(await _call(p2p, PeerID.from_base58(bootstrap), port))
            if reply.error != "busy":
                break
            await asyncio.sleep(RETRY_S * random.uniform(0.5, 1.5))
        if reply.error:
            raise RuntimeError(reply.error)
        return Reach(port in reply.open, reply.ip, bootstrap)

    try:  # all at once: the first answer wins (a dead bootstrap must not use up the time)
        pending = {asyncio.ensure_future(ask(b)) for b in bootstraps}
        why = "no bootstrap answered"
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is None:
                    for other in pending:
                        other.cancel()
                    return task.result()
                why = f"{type(task.exception()).__name__}: {task.exception()}"
        return Reach(None, why=why)
    finally:
        await p2p.shutdown()


async def _call(p2p, bootstrap, port: int) -> bytes:
    from google.protobuf.wrappers_pb2 import BytesValue

    reply = await p2p.call_protobuf_handler(bootstrap, REACH, BytesValue(value=ReachRequest(ports=[port]).encode()),
                                            BytesValue)
    return reply.value


def all_loopback(maddrs: list[str]) -> bool:
    """Whether every one of `maddrs` is on this machine (no NAT between: nothing to probe)."""
    from swarm.dht.network import is_loopback

    return bool(maddrs) and all(is_loopback(m) for m in maddrs)


def settle(net, unknown_is_public: bool = False):
    """(the network settings a joining node runs with, `NetworkConfig`, and what the probe found, if
    one ran): public, it serves the DHT and can relay for others; private (behind a NAT), it is a
    DHT client that asks the swarm's relays for a reservation, so that others reach it through them.
    When no bootstrap could tell, private (works everywhere), or public with `unknown_is_public`
    (a learner: its coordinator set it up to be reached)."""
    from dataclasses import replace

    private = dict(client_mode=True, use_relay=True, use_auto_relay=True, reachability="private")
    if net.client_mode or net.reachability == "private":
        return replace(net, **private), None
    if net.reachability == "public" or net.public_ip or net.announce_maddrs or all_loopback(net.initial_peers):
        # said so; or told how peers reach it (a --public-ip, checked on its own; announced addresses:
        # a port forward or a proxy); or nothing between us and the swarm
        return net, None
    reach, port = probe(net.host, net.port, list(net.initial_peers))
    if reach.reachable or (reach.reachable is None and unknown_is_public):
        if reach.reachable:
            log.info("reachability: the bootstrap %s connected to %s:%d: joining as a public peer",
                     short_id(reach.bootstrap), reach.ip, port)
        else:
            log.warning("reachability: no bootstrap could tell whether peers can dial this machine (%s); "
                        "joining as a public peer", reach.why)
        return replace(net, port=port, use_relay=True, reachability="public"), reach
    if reach.reachable is None:
        log.warning("reachability: no bootstrap could tell whether peers can dial this machine (%s); "
                    "joining behind relays, which works everywhere", reach.why)
    else:
        log.info("reachability: the bootstrap %s could not connect to %s:%d (behind a NAT or a firewall): "
                 "joining as a DHT client, reached through relays", short_id(reach.bootstrap), reach.ip, port)
    return replace(net, port=port, **private), reach
