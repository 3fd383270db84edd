"""The learner's books: what it refused, throttled, trained on and credited, per reason and per
sampler. The rollout receiver (swarm/, on the network thread) counts into them through the
learner's `Intake` methods, the learner's loop through its own: one lock keeps both exact."""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable

from node.learner.credit import MAX_KEPT, Credit
from node.algorithms import has_signal
from node.learner.groups import BufferedGroup, Verdict
from swarm.wire.reasons import Busy, Drop


METRICS_PEERS = 32
"""Samplers a step's metrics name in `accepted_by_sampler` and `credited` (the most groups first);
the rest are summed in `accepted_others` and `credited_others` ({"samplers", "groups"}): a line per
version, so a dict per key there would grow the run's record with the number of keys (~70 bytes
a name: at most ~4.5 kB a line for both)."""


def top(counts: dict[str, int], n: int = METRICS_PEERS) -> tuple[dict[str, int], dict[str, int]]:
    """The `n` largest of `counts` (ties by id) and the rest summed: {"samplers", "groups"}."""
    named = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]) if len(counts) > n else dict(counts)
    return named, {"samplers": len(counts) - len(named), "groups": sum(counts.values()) - sum(named.values())}


class Books:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.drops: collections.Counter[str] = collections.Counter()
        """Records refused or groups dropped, by reason (never trained on)."""
        self.throttled: collections.Counter[str] = collections.Counter()
        """Rollouts the receiver answered "busy" (not drops: the sampler sends them again later),
        by the bound they met."""
        self.accepted_by_sampler: collections.Counter[str] = collections.Counter()
        """Groups trained on, per sampler: the `MAX_KEPT` trained on last (foreign groups and a new
        key's first ones are trained on unchecked, so a key costs an entry here); the rest in
        `accepted_others`."""
        self.accepted_others = {"samplers": 0, "groups": 0}
        """The samplers forgotten past `MAX_KEPT` (least recently trained on first), summed."""
        self.credit = Credit()
        """Credit per sampler for checked groups trained on (published to the DHT for the leaderboard)."""
        self.reward_claim_mismatch = 0
        """Completions whose claimed reward differed from the verifier's (the claim is never used)."""
        self.version_clamped = 0
        """Rollouts from a previous run's versions beyond our resumed version (node/learner/scoring.py)."""

    def drop(self, reason: Drop, n: int = 1) -> None:
        with self._lock:
            self.drops[reason] += n

    def throttle(self, why: Busy, n: int = 1) -> None:
        with self._lock:
            self.throttled[why] += n

    def count_trained(self, taken: list[BufferedGroup], auditable: Callable[[str, int], bool], own_peer: str) -> None:
        """Count the groups a step trained on; credit only what passed every check: zero-variance
        groups (garbage included) carry no gradient, a group with a sequence over the log-prob gap
        earns nothing, nor unchecked work (foreign groups, versions the learner cannot rebuild to
        audit: `auditable(chain, version)`), nor the learner's own sampler's (`own_peer`)."""
        for b in taken:
            self.count_accepted(b.sampler)
            checked = b.own and auditable(b.chain, b.claimed_version)
            if (has_signal(b.group.rewards) and not b.gap_dropped and b.verdict is not Verdict.UNAUDITABLE
                    and checked and b.sampler != own_peer):
                self.credit.credit(b.sampler, len(b.group.completions),
                                  sum(len(c.token_ids) for c in b.group.completions), b.group.model_id)

    def count_accepted(self, sampler: str, groups: int = 1) -> None:
        """`groups` of `sampler`'s trained on: re-inserted last, so the order is recency and the least
        recently trained on is the one forgotten past `MAX_KEPT`."""
        self.accepted_by_sampler[sampler] = self.accepted_by_sampler.pop(sampler, 0) + groups
        self._trim()

    def _trim(self) -> None:
        while len(self.accepted_by_sampler) > MAX_KEPT:
            self.accepted_others["samplers"] += 1
            self.accepted_others["groups"] += self.accepted_by_sampler.pop(next(iter(self.accepted_by_sampler)))

    def samplers(self) -> int:
        """Samplers ever trained on, those forgotten past `MAX_KEPT` included."""
        return len(self.accepted_by_sampler) + self.accepted_others["samplers"]

    def trained(self) -> int:
        """Groups trained on, all samplers."""
        return sum(self.accepted_by_sampler.values()) + self.accepted_others["groups"]

    def counters(self) -> dict[str, Any]:
        """The books as a step's metrics show them: the `METRICS_PEERS` samplers trained on (and
        credited) most by name, the rest summed, forgotten ones included."""
        with self._lock:
            accepted, others = top(self.accepted_by_sampler)
            credited, credited_others = top({p: c["groups"] for p, c in self.credit.peers.items()})
            forgotten = self.credit.forgotten
            return {"drops": dict(self.drops), "throttled": dict(self.throttled),
                    "accepted_by_sampler": accepted,
                    "accepted_others": {"samplers": others["samplers"] + self.accepted_others["samplers"],
                                        "groups": others["groups"] + self.accepted_others["groups"]},
                    "credited": credited,
                    "credited_others": {"samplers": credited_others["samplers"] + forgotten["count"],
                                        "groups": credited_others["groups"] + forgotten["groups"]}}

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"drops": dict(self.drops), "accepted_by_sampler": dict(self.accepted_by_sampler),
                    "accepted_others": dict(self.accepted_others),
                    "tally": {"peers": self.credit.peers, "seq": self.credit.seq, "forgotten": self.credit.forgotten},
                    "reward_claim_mismatch": self.reward_claim_mismatch, "version_clamped": self.version_clamped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.drops = collections.Counter(state["drops"])
            self.accepted_by_sampler = collections.Counter(state["accepted_by_sampler"])
            self.accepted_others = {"samplers": 0, "groups": 0, **state.get("accepted_others", {})}
            self._trim()  # a checkpoint from before the bound
            self.credit = Credit(**state["tally"])
            self.reward_claim_mismatch = state["reward_claim_mismatch"]
            self.version_clamped = state["version_clamped"]
