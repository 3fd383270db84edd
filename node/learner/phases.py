"""Where a learner's time goes: seconds per phase since it started, in every step record.

    with learner.phases("train"): ...
    rec["phase_s"] = learner.phases.snapshot()   # {"waiting": 12.3, "intake": 4.1, "train": 30.2, ...}

The learner is the swarm's bottleneck by design: every second it spends on anything but training
is a second every sampler waits for the next version. Phases are wall-clock and never nest (the
outermost one counts); what no phase covers is reported as "other" (the loop itself, the
heartbeat's and the DHT's threads contending for the same cores).
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

PHASES = ("waiting", "intake", "audit", "recompute", "train", "publish", "eval", "checkpoint", "sampling")
"""waiting: for rollouts to arrive; intake: checking and scoring them; audit: spot audits;
recompute: the learner's own behaviour log-probs; train: the optimizer step; publish: encoding and
announcing a version; eval: held-out evaluations; checkpoint: saving state; sampling: the turns of
the learner's own sampler (`--role sampler,learner`)."""


class Phases:
    def __init__(self, clock=time.perf_counter) -> None:
        self._clock = clock
        self._t0 = clock()
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._open: str | None = None

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if phase not in self.seconds:
            raise ValueError(f"unknown phase {phase!r}; one of {PHASES}")
        if self._open is not None:  # inside another phase: that one is counting
            yield
            return
        self._open, t0 = phase, self._clock()
        try:
            yield
        finally:
            self.seconds[phase] += self._clock() - t0
            self._open = None

    def snapshot(self) -> dict[str, float]:
        """Seconds per phase so far, and "other": the wall time since start that no phase covers."""
        out = {k: round(v, 3) for k, v in self.seconds.items()}
        out["other"] = round(max(0.0, self._clock() - self._t0 - sum(self.seconds.values())), 3)
        return out


def phase_table(seconds: dict[str, float]) -> list[tuple[str, float, float]]:
    """(phase, seconds, share of the total) for each phase with any time, largest first."""
    total = sum(seconds.values()) or 1.0
    rows = [(k, v, v / total) for k, v in seconds.items() if v > 0]
    return sorted(rows, key=lambda r: -r[1])
