"""Which learner a sampler follows, and which samplers are its mates, from the DHT's PeerInfo records."""

from __future__ import annotations

import logging
import time

from .identity import short_id
from .p2p import SwarmNode

log = logging.getLogger(__name__)


class LearnerTracker:
    """The configured learner, else the first one in the DHT; re-checked every `every` seconds, so
    that a vanished learner (its record expired) is noticed and a new one found."""

    def __init__(self, node: SwarmNode, follow: str | None, model_id: str = "", every: float = 10.0) -> None:
        self.node, self.follow, self.model_id, self.every = node, follow, model_id, every
        self.current: str | None = None
        self.mates: list[str] = []
        """Samplers following the same learner with the same model: they share version downloads."""
        self._checked = 0.0

    def refresh(self, force: bool = False) -> str | None:
        if not force and time.monotonic() - self._checked < self.every:
            return self.current
        self._checked = time.monotonic()
        peers = self.node.peers()
        learners = [p["peer_id"] for p in peers if p.get("role") == "learner"]
        pick = self.follow if self.follow in learners else (None if self.follow else (learners[0] if learners else None))
        self.mates = sorted(p["peer_id"] for p in peers if p.get("role") == "sampler" and p.get("learner") == pick
                            and p.get("model_id") == self.model_id)
        if pick != self.current and pick:
            log.info("following learner %s", short_id(pick))
        elif pick != self.current:
            log.warning("the learner %s is gone from the swarm; looking for one", short_id(self.current or ""))
        self.current = pick
        return pick
