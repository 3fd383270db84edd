"""What every role's process does the same: pacing, joining the swarm, telling volunteers how to join."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

from cli.errors import UserError
from swarm.identity import Identity
from swarm.p2p import SwarmNode, raise_nofile_limit
from swarm.p2p.reach import settle

from cli.config import JoinConfig

log = logging.getLogger("hetero-node")
T = TypeVar("T")


class Every:
    """True once every `seconds` (the first call too): the pacing of periodic work in role loops."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self._last = seconds, float("-inf")

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.seconds:
            return False
        self._last = now
        return True


class Heartbeat:
    """A role's periodic DHT work (its announcement) on a thread of its own.

    At real size a learner's step or a sampler's generation batch takes minutes, and work paced
    by the role's loop ran only between them: a peer record of `peer_ttl_s` (30 s) expired
    mid-step, and samplers dropped a learner that was training for them ("gone from the swarm").
    Each job runs once every `every_s` (the first at once) through `survive`; a bug ends the
    thread and `check` raises it in the role's loop, as it would have been raised there before.
    A job reads only what the loop hands it whole (a dict it replaces, never mutates): the loop's
    own structures change under a second thread."""

    def __init__(self, jobs: list[tuple[str, float, Callable[[], object]]]) -> None:
        self._jobs = [(what, Every(every_s), work) for what, every_s, work in jobs]
        self._stop, self._error = threading.Event(), None
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for what, due, work in self._jobs:
                    if due():
                        survive(what, work)
                self._stop.wait(0.2)
        except Exception as e:  # a bug: the role's loop raises it (`check`)
            self._error = e

    def check(self) -> None:
        """Raise what ended the heartbeat, if anything did."""
        if self._error is not None:
            raise RuntimeError("the role's heartbeat (its DHT announcements) failed") from self._error

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)


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


def survive(what: str, work: Callable[[], T]) -> T | None:
    """Run a role's periodic network work (announce, publish a tally, ask the DHT); a resource the
    process ran out of (EMFILE, ENOMEM, a socket error) is logged and the loop goes on: it is
    retried on its next turn. Bugs (anything else) still end the role."""
    try:
        return work()
    except (OSError, MemoryError) as e:
        log.warning("%s failed (%s: %s); trying again on the next turn", what, type(e).__name__, e)
        return None


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
