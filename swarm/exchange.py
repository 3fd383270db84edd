"""The seam between node/ (roles) and swarm/ (network): records and blobs in, records and blobs out.

Samplers send encoded rollout records and fetch the newest weights blob; learners receive rollout
records and publish weights blobs. Two implementations: `MemoryExchange` (one process, virtual
clock, injected delay; the simulator) and the hivemind swarm. Every call returns promptly:
receive calls take a timeout, and nothing here blocks forever.
"""

from __future__ import annotations

from typing import Protocol


class Exchange(Protocol):
    def send_rollouts(self, sender: str, records: list[tuple[str, bytes]]) -> None:
        """Queue encoded RolloutGroup records, as (record id, bytes), for the learners."""
        ...

    def receive_rollouts(self, receiver: str, max_records: int, timeout: float = 0.0) -> list[bytes]:
        """Records that have arrived for `receiver`, oldest first, at most `max_records`."""
        ...

    def publish_weights(self, sender: str, version: int, blob: bytes) -> None:
        """Offer weights `version` (an encoded blob) to the samplers."""
        ...

    def fetch_weights(self, receiver: str, have_chain: str, have_version: int) -> list[bytes] | None:
        """Encoded versions `receiver` should apply now, in order, to reach the newest one: only
        the newer deltas if it holds `have_version` of chain `have_chain`, else the last keyframe
        and the deltas after it; None if there is nothing newer (or its delay has not passed)."""
        ...
