"""The learner's books: what it refused, throttled, trained on and credited, per reason and per
sampler. The rollout receiver (swarm/, on the network thread) counts into them through the
learner's `Intake` methods, the learner's loop through its own: one lock keeps both exact."""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable

from ..accounting import Tally
from ..algorithms import has_signal
from .groups import BufferedGroup, Verdict


class Books:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.drops: collections.Counter[str] = collections.Counter()
        """Records refused or groups dropped, by reason (never trained on)."""
        self.throttled: collections.Counter[str] = collections.Counter()
        """Rollouts the receiver answered "busy" (not drops: the sampler sends them again later),
        by the bound they met."""
        self.accepted_by_sampler: collections.Counter[str] = collections.Counter()
        """Groups trained on, per sampler."""
        self.tally = Tally()
        """Credit per sampler for checked groups trained on (published to the DHT for the leaderboard)."""
        self.reward_claim_mismatch = 0
        """Completions whose claimed reward differed from the verifier's (the claim is never used)."""
        self.version_clamped = 0
        """Rollouts from a previous run's versions beyond our resumed version (node/learner/scoring.py)."""

    def drop(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self.drops[reason] += n

    def throttle(self, why: str, n: int = 1) -> None:
        with self._lock:
            self.throttled[why] += n

    def count_trained(self, taken: list[BufferedGroup], auditable: Callable[[str, int], bool], own_peer: str) -> None:
        """Count the groups a step trained on; credit only what passed every check: zero-variance
        groups (garbage included) carry no gradient, a group with a sequence over the log-prob gap
        earns nothing, nor unchecked work (foreign groups, versions the learner cannot rebuild to
        audit: `auditable(chain, version)`), nor the learner's own sampler's (`own_peer`)."""
        for b in taken:
            self.accepted_by_sampler[b.sampler] += 1
            checked = b.own and auditable(b.chain, b.claimed_version)
            if (has_signal(b.group.rewards) and not b.gap_dropped and b.verdict is not Verdict.UNAUDITABLE
                    and checked and b.sampler != own_peer):
                self.tally.credit(b.sampler, len(b.group.completions),
                                  sum(len(c.token_ids) for c in b.group.completions), b.group.model_id)

    def trained(self) -> int:
        """Groups trained on, all samplers."""
        return sum(self.accepted_by_sampler.values())

    def counters(self) -> dict[str, Any]:
        """The books as a step's metrics show them."""
        with self._lock:
            return {"drops": dict(self.drops), "throttled": dict(self.throttled),
                    "accepted_by_sampler": dict(self.accepted_by_sampler)}

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"drops": dict(self.drops), "accepted_by_sampler": dict(self.accepted_by_sampler),
                    "tally": {"peers": self.tally.peers, "seq": self.tally.seq},
                    "reward_claim_mismatch": self.reward_claim_mismatch, "version_clamped": self.version_clamped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.drops = collections.Counter(state["drops"])
            self.accepted_by_sampler = collections.Counter(state["accepted_by_sampler"])
            self.tally = Tally(**state["tally"])
            self.reward_claim_mismatch = state["reward_claim_mismatch"]
            self.version_clamped = state["version_clamped"]
