"""What the learner holds of an accepted record, and the closed sets that describe it.

A `Route` says which loss corrects a group (by who made it), a `GroupKind` which share of a step it
may fill (by what was checked of it), a `Verdict` what its audit found. One word, one meaning:
"stale" is only a drop reason (too many versions old), never a route.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from node.training.batch import ScoredGroup


class Route(str, enum.Enum):
    """Which loss corrects a group: the learner's `own_loss` for its own model's rollouts of any
    version, `foreign_loss` for another model's (token level in a shared tokenizer, sequence level
    once re-tokenized). The value names the route in the step's metrics (`routes/<value>/...`)."""

    OWN = "own"
    FOREIGN = "foreign"
    FOREIGN_SEQ = "foreign_seq"


class GroupKind(str, enum.Enum):
    """Which share of a step a group may fill (`GroupBuffer.pick`)."""

    CHECKED = "checked"
    """Auditable own-model work, or a proven sampler's: uncapped."""
    FOREIGN = "foreign"
    """Another model's: never audited, within `foreign_step_share` and `foreign_per_sampler`."""
    UNAUDITED = "unaudited"
    """A version the learner cannot rebuild, from a key not yet proven: within `unaudited_per_step`."""
    NEW = "new"
    """An auditable version from a key short of its first audits: taken only while the audit budget
    admits new keys (node/audit/budget.py), and audited before it is trained on."""


class Verdict(str, enum.Enum):
    """What an audit of a group found (node/audit/auditor.py)."""

    PASS = "pass"
    UNAUDITABLE = "unauditable"
    """Made by weights the learner no longer holds (an earlier run's chain): trained on, not credited."""
    FAILED = "failed"
    """Its tokens are not what its randomness selects, or its log-probs are not the version's: the
    sampler is refused for good."""


@dataclass
class BufferedGroup:
    """One accepted group waiting in the buffer, and what the step learns of it."""

    group: ScoredGroup
    route: Route
    sampler: str
    raw: bytes
    """The record as received, kept for checkpoints (they re-accept it on resume)."""
    chain: str = ""
    claimed_version: int = 0
    """The version the record names (group.version may be clamped, see `score_group`): audits rebuild it."""
    verdict: Verdict | None = None
    """Set when the step audits it (None: not chosen)."""
    gap_dropped: bool = False
    """Set when the step's log-prob check dropped one of its sequences: it earns no credit."""

    @property
    def own(self) -> bool:
        return self.route is Route.OWN
