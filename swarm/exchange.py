"""The seam between node/ (roles) and swarm/ (network), split by direction.

A sampler holds a `SamplerLink`: it sends encoded rollout records and fetches newer weights. A
learner holds a `LearnerLink`: it receives rollout records and publishes weight versions. Weight
versions cross the seam as `WeightVersion`: the blob plus the metadata the network needs (model,
chain, version, base), passed explicitly so that no layer reads another layer's blob headers.

Two implementations: `swarm.memory.MemoryExchange` (one process, virtual clock, injected delay:
the simulator) and the hivemind swarm (`swarm.swarm_exchange`). Every call returns promptly:
receive calls take a timeout, and nothing here blocks forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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
    """The encoded tensors (node/weights.py); opaque to swarm/."""


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
    def receive_rollouts(self, max_records: int, timeout: float = 0.0) -> list[bytes]:
        """Records that have arrived, oldest first, at most `max_records`."""
        ...

    def publish_weights(self, version: WeightVersion) -> None:
        """Offer a version to the samplers. A keyframe starts a new chain segment."""
        ...


def plan_fetch(chain: str, versions: list[int], have_chain: str, have_version: int) -> list[int]:
    """Versions a sampler must apply, in order, out of `versions` = the learner's current chain
    segment of `chain` (its last keyframe first, then the deltas after it).

    Same chain and a version at or after the keyframe: only the newer deltas. Otherwise (a new
    learner, a restart, or too far behind): the keyframe and every delta after it.
    """
    if not versions:
        return []
    if have_chain == chain and have_version >= versions[0]:
        return [v for v in versions if v > have_version]
    return list(versions)
