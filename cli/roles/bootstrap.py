"""`hetero-node bootstrap`: a coordinator's peer, and the learners its swarm record names."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from cli.errors import UserError
from swarm.dht.network import NetworkConfig
from swarm.identity import Identity, is_peer_id, short_id
from swarm.p2p import SwarmNode
from swarm.p2p.reach import serve_reachability
from swarm.wire.peer import PeerInfo

from cli.roles.common import open_file_limit

log = logging.getLogger("hetero-node")


def parse_learners(entries: list[str], where: str = "--trusted-learner") -> dict[str, str]:
    """`PEER_ID` or `PEER_ID=MODEL` entries -> {peer id: model ("" = unstated)}; a peer id must be one
    (`is_peer_id`: a typo would name a learner nobody can be, and samplers would follow none)."""
    out: dict[str, str] = {}
    for entry in entries:
        peer, _, model = entry.strip().partition("=")
        peer, model = peer.strip(), model.strip()
        if not is_peer_id(peer):
            raise UserError(f"{where}: {entry!r} is not a peer id",
                            "give PEER_ID or PEER_ID=MODEL, as `hetero-node peer-id <learner workdir>` prints it")
        out[peer] = model
    return out


def read_learners_file(path: Path) -> dict[str, str]:
    """A coordinator's learners file: one `PEER_ID` or `PEER_ID=MODEL` per line, `#` comments."""
    try:
        lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read the learners file {path}: {e}",
                        "give a text file with one <peer id>[=<model>] per line") from None
    return parse_learners([line for line in lines if line], str(path))


def run_bootstrap(identity_path: str, net: NetworkConfig, swarm: str, stop: threading.Event,
                  on_ready: Callable[[list[str]], None] | None = None, learners: dict[str, str] | None = None,
                  model_id: str = "", learners_file: Path | None = None, every_s: float = 20.0) -> None:
    """A coordinator's entry point; it signs the swarm record naming the `learners` samplers follow,
    each with its model, and those of `learners_file`, re-read every `every_s` seconds, so that a
    learner is added to (or removed from) a running swarm by editing that file."""
    open_file_limit()
    node = SwarmNode(Identity.load_or_create(identity_path), net, swarm)
    serve_reachability(node)  # joining peers ask it whether they can be dialled (swarm/p2p/reach.py)
    named, listed = dict(learners or {}), LearnersFile(learners_file)
    if not named and learners_file is None:
        log.warning("no --trusted-learner given: samplers of swarm %r will follow only a learner they pin "
                    "with --follow", swarm)
    try:
        if on_ready:
            on_ready(node.maddrs())
        while not stop.is_set():
            node.announce(PeerInfo(peer_id=node.peer_id, role="bootstrap", model_id="", version=0, engine="",
                                   throughput=0.0, maddrs=node.maddrs()), ttl=60)
            current = {**named, **listed.read()}
            if current and not node.publish_swarm_record(current, model_id, ttl=60):
                log.warning("the DHT did not store the swarm record; retrying in %.0f s", every_s)
            stop.wait(every_s)
    finally:
        node.shutdown()


class LearnersFile:
    """A coordinator's learners file, re-read on every call; on an unreadable or malformed file, the
    last good entries (logged), so a typo does not drop the swarm's learners."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.last = path, {}

    def read(self) -> dict[str, str]:
        if self.path is None:
            return {}
        try:
            now = read_learners_file(self.path) if self.path.exists() else {}
        except UserError as e:
            log.warning("learners file %s: %s; keeping the learners it named before", self.path, e)
            return self.last
        if now != self.last:
            log.info("learners file %s names %d learner(s): %s", self.path, len(now),
                     ", ".join(f"{short_id(k)}{'=' + v if v else ''}" for k, v in sorted(now.items())) or "none")
        self.last = now
        return now
