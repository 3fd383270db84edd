"""What a step record says of the learner: the batch it trained on and the learner's books."""

from __future__ import annotations

import time
from typing import Any

from node.audit.auditor import Auditor
from node.learner.books import Books
from node.learner.groups import BufferedGroup
from node.training.trainer import Training
from node.metrics import Metric


def batch_stats(taken: list[BufferedGroup], version: int) -> dict[str, Any]:
    """Rewards, groups by route and staleness of the groups a step at `version` took."""
    own = [b for b in taken if b.own]
    staleness = [version - b.group.version for b in own]
    rewards = [r for b in taken for r in b.group.rewards]
    return {
        Metric.REWARD: sum(rewards) / len(rewards),
        "reward_own": _mean([r for b in own for r in b.group.rewards]),
        "reward_foreign": _mean([r for b in taken if not b.own for r in b.group.rewards]),
        "groups_own": len(own), Metric.GROUPS_FOREIGN: len(taken) - len(own),
        Metric.STALENESS_HIST: {str(k): staleness.count(k) for k in sorted(set(staleness))},
        Metric.STALENESS_MEAN: _mean(staleness),
    }


def counters(books: Books, auditor: Auditor, training: Training, buffered: int, t0: float) -> dict[str, Any]:
    """The learner's running counts, as each step record carries them."""
    return {**books.counters(), "audit": {**auditor.stats, **auditor.budget.stats()}, "claim_gaps": auditor.claim_gaps.stats(),
            "logprob_gap_drops": dict(training.gap_drops), "train_time_s": round(training.time_s, 3),
            "refused_samplers": len(auditor.refusals.refused),
            "reward_claim_mismatch": books.reward_claim_mismatch, "buffered": buffered,
            "version_clamped": books.version_clamped, Metric.TIME_S: round(time.time() - t0, 2)}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0
