"""The learner's status line and exit summary, from its own books."""

from __future__ import annotations

import time

from node.learner import Learner


class LearnerReport:
    def __init__(self, learner: Learner) -> None:
        self.learner, self.t0 = learner, time.monotonic()
        self.v0, self.trained0 = learner.version, learner.books.trained()
        self._first_eval: float | None = None
        """The session's first eval accuracy (the learner keeps only its newest records)."""

    def _evals(self) -> list[float]:
        evals = [r["eval_acc"] for r in self.learner.history if r["kind"] == "eval"]
        if self._first_eval is None and evals:
            self._first_eval = evals[0]
        return evals

    def rate(self) -> float:
        """Groups trained on per second since this session started."""
        return round((self.learner.books.trained() - self.trained0) / max(time.monotonic() - self.t0, 1e-6), 3)

    def line(self, idle_s: float) -> str:
        lr = self.learner
        steps = [r for r in lr.history if r["kind"] == "step"]
        evals = self._evals()
        parts = [f"learner v{lr.version}",
                 f"reward {steps[-1]['reward']:.2f}" if steps else "reward -",
                 f"eval {evals[-1]:.1%}" if evals else "eval -",
                 f"samplers {len(lr.books.accepted_by_sampler)}",
                 f"{self.rate() * lr.sampling.group_size:.1f} rollouts/s",
                 f"buffer {len(lr.buffer)}", f"dropped {sum(lr.drops.values())}"]
        if idle_s > 30:
            parts.append(f"no rollouts for {idle_s:.0f} s: waiting for samplers")
        return " | ".join(parts)

    def summary(self) -> str:
        lr, evals = self.learner, self._evals()
        acc = f"eval {self._first_eval:.1%} -> {evals[-1]:.1%}" if evals else "no eval"
        drops = ", ".join(f"{k} {v}" for k, v in sorted(lr.drops.items())) or "none"
        return (f"learner stopped at version {lr.version} ({lr.version - self.v0} this session, "
                f"{time.monotonic() - self.t0:.0f} s): {lr.books.trained() - self.trained0} groups trained on from "
                f"{len(lr.books.accepted_by_sampler)} samplers; {acc}; dropped: {drops}; checkpoint in "
                f"{lr.checkpoint_dir}")
