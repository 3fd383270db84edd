"""Which learner a sampler follows, and which samplers are its mates, from the DHT's records.

A peer that merely announces `role = learner` is never followed: a sampler follows a learner its
swarm's coordinator names in the swarm record it signed (the coordinators are the bootstrap peers
the sampler was pointed at: the /p2p/ ids of --initial-peers), or one the user pins (--follow).
"""

from __future__ import annotations

import logging
import time

from .identity import short_id
from .p2p import SwarmNode

log = logging.getLogger(__name__)


class LearnerTracker:
    """The pinned learner, else the first live learner the coordinators trust; re-checked every
    `every` seconds, so that a vanished learner (its record expired) is noticed and another found."""

    def __init__(self, node: SwarmNode, follow: str | None, model_id: str = "", every: float = 10.0) -> None:
        self.node, self.follow, self.model_id, self.every = node, follow, model_id, every
        self.current: str | None = None
        self.mates: list[str] = []
        """Samplers following the same learner with the same model that peers can dial (not private):
        they share version downloads."""
        self.ignored: set[str] = set()
        """Peers announcing role=learner that nobody we trust named (logged once each)."""
        self._checked = 0.0

    def refresh(self, force: bool = False) -> str | None:
        if not force and time.monotonic() - self._checked < self.every:
            return self.current
        self._checked = time.monotonic()
        peers = self.node.peers()
        live = {p["peer_id"] for p in peers if p.get("role") == "learner"}
        trusted = {self.follow} if self.follow else self.node.trusted_learners(self.node.coordinators)
        for impostor in sorted(live - trusted - self.ignored):
            self.ignored.add(impostor)
            log.warning("ignoring learner %s: no coordinator we trust names it (bootstrap --trusted-learner), "
                        "and --follow does not pin it", short_id(impostor))
        pick = min(live & trusted, default=None)
        self.mates = sorted(p["peer_id"] for p in peers if p.get("role") == "sampler" and p.get("learner") == pick
                            and p.get("model_id") == self.model_id and not p.get("private"))
        if pick != self.current and pick:
            log.info("following learner %s", short_id(pick))
        elif pick != self.current:
            log.warning("the learner %s is gone from the swarm; looking for one", short_id(self.current or ""))
        self.current = pick
        return pick
