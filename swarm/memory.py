"""In-memory exchange on a virtual clock, with the paper's injected delays (the simulator's swarm).

Weights follow the GEPO paper's delay model: a sampler keeps generating with the weights it has
until a sampled delay D has passed since it last loaded, then loads the newest published
version and draws a new D. Rollouts can be delayed per message as well. Delays are per receiver
(weights) or per sender (rollouts) and deterministic under the seed.
"""

from __future__ import annotations

import heapq
import itertools
import random

from .delay import DelayConfig, ReloadTimer, sample_delay
from .weights_meta import plan_fetch, weights_metadata


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)


class MemoryExchange:
    def __init__(self, clock: VirtualClock, seed: int = 0) -> None:
        self.clock = clock
        self._rng = random.Random(seed)
        self._timers: dict[str, ReloadTimer] = {}
        self._rollout_delay: dict[str, DelayConfig] = {}
        self._chain: list[tuple[int, dict, bytes]] = []  # the last keyframe and the deltas after it
        self._inflight: list[tuple[float, int, bytes]] = []  # (arrival time, seq, record) heap
        self._seq = itertools.count()

    def set_delays(self, peer: str, weights: DelayConfig | None = None, rollouts: DelayConfig | None = None) -> None:
        if weights is not None:
            self._timers[peer] = ReloadTimer(weights, self._rng)
        if rollouts is not None:
            self._rollout_delay[peer] = rollouts

    # --- sampler side ---------------------------------------------------------------------------
    def send_rollouts(self, sender: str, records: list[tuple[str, bytes]]) -> None:
        for _, rec in records:
            delay = sample_delay(self._rollout_delay.get(sender, DelayConfig()), self._rng)
            heapq.heappush(self._inflight, (self.clock.now + delay, next(self._seq), rec))

    def fetch_weights(self, receiver: str, have_chain: str, have_version: int) -> list[bytes] | None:
        timer = self._timers.setdefault(receiver, ReloadTimer(DelayConfig(), self._rng))
        if not timer.due(self.clock.now):
            return None  # still generating with the old weights (delay D not yet passed)
        timer.arm(self.clock.now)
        by_version = {v: blob for v, _, blob in self._chain}
        wanted = plan_fetch([(v, m) for v, m, _ in self._chain], have_chain, have_version)
        return [by_version[v] for v in wanted] or None

    # --- learner side ---------------------------------------------------------------------------
    def receive_rollouts(self, receiver: str, max_records: int, timeout: float = 0.0) -> list[bytes]:
        out = []
        while self._inflight and self._inflight[0][0] <= self.clock.now and len(out) < max_records:
            out.append(heapq.heappop(self._inflight)[2])
        return out

    def publish_weights(self, sender: str, version: int, blob: bytes) -> None:
        meta = weights_metadata(blob)
        if not meta.get("base"):
            self._chain = []
        self._chain.append((version, meta, blob))
