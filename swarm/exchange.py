"""The seam between node/ (roles) and swarm/ (network), split by direction.

A sampler holds a `SamplerLink`: it sends encoded rollout records and fetches newer weights. A
learner holds a `LearnerLink`: it receives rollout records and publishes weight versions. Weight
versions cross the seam as `WeightVersion`: the blob plus the metadata the network needs (model,
chain, version, base), passed explicitly so that no layer reads another layer's blob headers.

Two implementations: `swarm.memory.MemoryExchange` (one process, virtual clock, injected delay:
the simulator) and the hivemind swarm (`swarm.links`). Every call returns promptly:
receive calls take a timeout, and nothing here blocks forever.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple, Protocol

from swarm.buckets import TokenBuckets  # noqa: F401  (re-exported: a node's own budgets (node/learner/scoring_time.py) are the doors')
from swarm.wire.reasons import Busy, Drop
from swarm.wire.rollout import RolloutGroup

MiB = 1 << 20


@dataclass(frozen=True)
class WeightVersion:
    """One published version of a learner's weights, as it crosses the seam."""

    model_id: str
    chain: str
    """The learner run's chain id: a delta applies only to weights of the same chain."""
    version: int
    base: int | None
    """The version this delta applies to; None for a keyframe (applies to nothing)."""
    blob: bytes
    """The encoded tensors (node/weights/blob.py); opaque to swarm/."""


class Received(NamedTuple):
    """A rollout record the learner reads: as journaled, and as the receiver decoded it to check it
    before its ack, when it did so in this process (else None: the learner decodes `raw`, as it must
    for what a restart replays from the journal)."""

    raw: bytes
    group: RolloutGroup | None = None


class SamplerLink(Protocol):
    def send_rollouts(self, records: list[tuple[str, bytes]]) -> None:
        """Queue encoded RolloutGroup records, as (record id, bytes), for the learner."""
        ...

    def fetch_weights(self, have_chain: str, have_version: int) -> list[WeightVersion] | None:
        """Versions to apply now, in order, to reach the newest one: only the newer deltas if we
        hold `have_version` of chain `have_chain`, else the last keyframe and the deltas after it;
        None if there is nothing newer (or the injected delay has not passed)."""
        ...


class LearnerLink(Protocol):
    def receive_rollouts(self, max_records: int, timeout: float = 0.0) -> list[Received]:
        """Records that have arrived, oldest first, at most `max_records`."""
        ...

    def publish_weights(self, version: WeightVersion) -> None:
        """Offer a version to the samplers. A keyframe starts a new chain segment."""
        ...


@dataclass(frozen=True)
class IntakeConfig:
    """`[learner.intake]`: what the learner's receiver reads, checks and journals for one sampler,
    and for all unproven samplers together (docs/DESIGN.md, "Trust"). Keys are free, so a key the
    learner has not yet proven (`Intake.is_proven`: it passed its first audits) draws on its own
    budget and on one pool shared by every unproven key; a proven sampler keeps its own budget
    whatever unproven keys send. Past any bound a sampler's records are answered "busy" (kept in
    its outbox for later), so one peer's flood slows only that peer."""

    quota: int = 64
    """Groups one sampler may have received and not yet trained on."""
    rate: float = 64.0
    """Records checked per second for one sampler (burst `quota`): checking costs the learner CPU
    (a signature, a decode, a detokenisation), even for records it then refuses."""
    byte_rate: float = 8.0 * MiB
    """Payload bytes read per second from one sampler, charged at the door before anything is
    decoded, so undecodable bytes cost it as much as records do (burst one second's worth)."""
    journal_bytes: int = 64 * MiB
    """Bytes of one sampler's records in the journal that the learner has not read yet (it reads
    between steps, so they pile up during a long one); one record always fits, whatever its size."""
    unproven_quota: int = 32
    """Groups of all unproven keys together received and not yet trained on (at least a step's
    worth is used, `for_step`: else new samplers could never fill a step and be audited)..."""
    unproven_rate: float = 8.0
    """...records of theirs checked per second, all together (burst `unproven_quota`)..."""
    unproven_byte_rate: float = 1.0 * MiB
    """...their bytes read per second..."""
    unproven_journal_bytes: int = 16 * MiB
    """...and bytes of their records in the journal not yet read."""

    def __post_init__(self) -> None:
        if min(self.quota, self.unproven_quota, self.journal_bytes, self.unproven_journal_bytes) < 1:
            raise ValueError("learner.intake: quota, unproven_quota, journal_bytes and unproven_journal_bytes "
                             "must be >= 1")
        if min(self.rate, self.byte_rate, self.unproven_rate, self.unproven_byte_rate) <= 0:
            raise ValueError("learner.intake: rate, byte_rate, unproven_rate and unproven_byte_rate must be > 0")

    def for_step(self, groups_per_step: int) -> IntakeConfig:
        """These bounds with the unproven pool holding at least one step's groups."""
        return replace(self, unproven_quota=max(self.unproven_quota, groups_per_step))


class Intake(Protocol):
    """What the learner's rollout receiver (swarm/) asks of the learner (node/) before it reads,
    journals and acknowledges a sampler's records. Called from the network thread: each method is
    quick, never raises, and the counters are the learner's own (they live in its checkpoints)."""

    def check(self, group: RolloutGroup) -> Drop | None:
        """The learner's checks of a decoded record, without accepting it: a drop reason or None."""
        ...

    def untrained(self, sampler: str) -> int:
        """Groups of `sampler` the learner accepted and has not yet trained on."""
        ...

    def is_proven(self, peer: str) -> bool:
        """Whether `peer` passed its first audits: until then it also draws on the unproven pool."""
        ...

    def is_refused(self, peer: str) -> bool:
        """Whether `peer` failed an audit: its records are refused unread."""
        ...

    def count_rejected(self, reason: Drop, n: int = 1) -> None:
        """`n` records refused for `reason` (they join the learner's drop counts)."""
        ...

    def count_busy(self, why: Busy, n: int = 1) -> None:
        """`n` records (or a call) answered "busy" by the bound `why`: not refused, sent again later."""
        ...


def plan_fetch(chain: str, versions: list[int], have_chain: str, have_version: int, first: int | None = None) -> list[int]:
    """Versions a sampler must apply, in order, out of `versions`, the versions the learner lists of
    its current chain segment of `chain`: the whole segment (its keyframe `first` first, then the
    deltas after it), or only the tail after the version the sampler told it it holds
    (swarm/wire/manifest.py). `first` is versions[0] when not given.

    Same chain and a version at or after the keyframe: only the newer deltas. Otherwise (a new
    learner, a restart, or too far behind): the keyframe and every delta after it, or nothing when
    the listing lacks the keyframe (a tail answers what the sampler held when it asked).
    """
    if not versions:
        return []
    first = versions[0] if first is None else first
    if have_chain == chain and have_version >= first:
        return [v for v in versions if v > have_version]
    return list(versions) if versions[0] == first else []
