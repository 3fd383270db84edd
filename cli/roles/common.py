"""What every role's process does the same: joining the swarm, telling volunteers how to join (pacing and
the heartbeat: swarm/pacing.py)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

from cli.errors import UserError
from swarm.identity import Identity
from swarm.p2p import SwarmNode, raise_nofile_limit
from swarm.p2p.reach import settle

from cli.config import JoinConfig

log = logging.getLogger("hetero-node")


def start_node(cfg: JoinConfig) -> SwarmNode:
    open_file_limit()
    cfg.apply()  # seeds and threads (ProcessBlock); the role's work needs torch anyway, a bootstrap never gets here
    Path(cfg.workdir).mkdir(parents=True, exist_ok=True)
    identity = Identity.load_or_create(cfg.identity_path)
    net, _ = settle(cfg.network, unknown_is_public=cfg.learns)
    if cfg.learns and net.client_mode:
        # every sampler must reach it; through a relay all of it would cross the coordinator's
        # bootstrap, within the relay's limits (docs/DESIGN.md, "The real internet")
        raise UserError("a learner behind a NAT cannot be reached by samplers",
                        f"forward TCP port {net.port or 31338} on your router to this machine and pass --public-ip "
                        f"<your public address> --port {net.port or 31338}, or run the learner on a machine with a "
                        "public address")
    node = SwarmNode(identity, net, cfg.swarm)
    log.info("%s %s joined swarm %r; listening on %s", cfg.role, node.peer_id, cfg.swarm, " ".join(node.maddrs()))
    if cfg.network.public_ip:  # now that we listen (on the port we were given, or the one picked for us)
        reachability_check(cfg.network.port or tcp_port(node.maddrs()), cfg.network.public_ip)
    return node


def open_file_limit() -> None:
    """A public node's streams each cost a descriptor: take the hard open-file limit, not the soft
    default (often 1,024), before the DHT starts (swarm/p2p/budget.py bounds what peers may hold)."""
    before, after = raise_nofile_limit()
    if after > before:
        log.info("open-file limit raised from %d to %d", before, after)


def tcp_port(maddrs: list[str]) -> int:
    """The TCP port of the first of `maddrs` that has one (0 if none)."""
    return next((int(m.split("/tcp/")[1].split("/")[0]) for m in maddrs if "/tcp/" in m), 0)


def reachability_check(port: int, public_ip: str | None) -> None:
    """Petals-style self-check: can this machine be reached at the address it announces?"""
    if not public_ip:
        return
    try:
        with socket.create_connection((public_ip, port), timeout=3):
            log.info("reachability: %s:%d accepts connections", public_ip, port)
    except OSError as e:
        log.warning(
            "reachability: cannot connect to %s:%d (%s). Open TCP port %d in your firewall and forward it on "
            "your router to this machine, or run with --client-mode to reach the swarm through relays.",
            public_ip, port, e, port)


def _public_first(maddrs: list[str]) -> list[str]:
    """Addresses a volunteer elsewhere can dial first: loopback ones only work on this machine."""
    return sorted(maddrs, key=lambda m: m.startswith(("/ip4/127.", "/ip6/::1/")))


def volunteer_command(maddrs: list[str], swarm: str, others: list[str] = ()) -> str:
    """The exact command volunteers paste to join this swarm as samplers: this bootstrap's first
    public address, then the coordinator's `others` (a volunteer joins through any one alive)."""
    where = f" --swarm {swarm}" if swarm != "demo" else ""
    peers = "".join(f" --initial-peers {m}" for m in [_public_first(maddrs)[0], *others])
    return f"hetero-node join --role sampler{where}{peers}"
