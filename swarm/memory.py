"""In-memory exchange on a virtual clock, with the paper's injected delays (the simulator's swarm).

Weights follow the GEPO paper's delay model: a sampler keeps generating with the weights it has
until a sampled delay D has passed since it last loaded, then loads the newest published
version and draws a new D. Rollouts can be delayed per message as well. Delays are per receiver
(weights) or per sender (rollouts) and deterministic under the seed.

`MemoryExchange` is the learner's link; `MemoryExchange.sampler(peer)` gives each sampler its own.
"""

from __future__ import annotations

import heapq
import itertools
import random

from swarm.delay import DelayConfig, ReloadTimer, sample_delay
from swarm.exchange import Received, WeightVersion, plan_fetch


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)


class MemoryExchange:
    """One learner's side of the in-memory swarm (a `LearnerLink`), and the bus samplers share."""

    def __init__(self, clock: VirtualClock, seed: int = 0) -> None:
        self.clock = clock
        self._rng = random.Random(seed)
        self._segment: list[WeightVersion] = []  # the last keyframe and the deltas after it
        self._inflight: list[tuple[float, int, bytes]] = []  # (arrival time, seq, record) heap
        self._seq = itertools.count()

    def sampler(self, peer: str, weight_delay: DelayConfig = DelayConfig(),
                rollout_delay: DelayConfig = DelayConfig()) -> "MemorySamplerLink":
        return MemorySamplerLink(self, ReloadTimer(weight_delay, self._rng), rollout_delay)

    # ---- LearnerLink ---------------------------------------------------------------------------
    def receive_rollouts(self, max_records: int, timeout: float = 0.0) -> list[Received]:
        out = []
        while self._inflight and self._inflight[0][0] <= self.clock.now and len(out) < max_records:
            out.append(Received(heapq.heappop(self._inflight)[2]))
        return out

    def publish_weights(self, version: WeightVersion) -> None:
        if version.base is None:
            self._segment = []
        self._segment.append(version)

    # ---- for the sampler links -----------------------------------------------------------------
    def _deliver(self, records: list[tuple[str, bytes]], delay: DelayConfig) -> None:
        for _, rec in records:
            arrival = self.clock.now + sample_delay(delay, self._rng)
            heapq.heappush(self._inflight, (arrival, next(self._seq), rec))

    def _versions_after(self, have_chain: str, have_version: int) -> list[WeightVersion]:
        if not self._segment:
            return []
        by_version = {v.version: v for v in self._segment}
        wanted = plan_fetch(self._segment[0].chain, list(by_version), have_chain, have_version)
        return [by_version[v] for v in wanted]


class MemorySamplerLink:
    """One sampler's `SamplerLink` on the in-memory swarm, with its own injected delays."""

    def __init__(self, bus: MemoryExchange, timer: ReloadTimer, rollout_delay: DelayConfig) -> None:
        self._bus, self._timer, self._rollout_delay = bus, timer, rollout_delay

    def send_rollouts(self, records: list[tuple[str, bytes]]) -> None:
        self._bus._deliver(records, self._rollout_delay)

    def fetch_weights(self, have_chain: str, have_version: int) -> list[WeightVersion] | None:
        now = self._bus.clock.now
        if not self._timer.due(now):
            return None  # still generating with the old weights (delay D not yet passed)
        self._timer.arm(now)
        return self._bus._versions_after(have_chain, have_version) or None
