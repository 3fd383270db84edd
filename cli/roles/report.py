"""The learner's status line and exit summary, from its own books; a sampler's metrics records."""

from __future__ import annotations

import time

from node.learner import Learner
from node.metrics import Kind, Metric, MetricsWriter
from node.sampling.sampler import Sampler
from swarm.links import SwarmSamplerLink


class LearnerReport:
    def __init__(self, learner: Learner) -> None:
        self.learner, self.t0 = learner, time.monotonic()
        self.v0, self.trained0 = learner.version, learner.books.trained()
        self._first_eval: float | None = None
        """The session's first eval accuracy (the learner keeps only its newest records)."""

    def _evals(self) -> list[float]:
        evals = [r[Metric.EVAL_ACC] for r in self.learner.history if r[Metric.KIND] == Kind.EVAL]
        if self._first_eval is None and evals:
            self._first_eval = evals[0]
        return evals

    def rate(self) -> float:
        """Groups trained on per second since this session started."""
        return round((self.learner.books.trained() - self.trained0) / max(time.monotonic() - self.t0, 1e-6), 3)

    def line(self, idle_s: float) -> str:
        lr = self.learner
        steps = [r for r in lr.history if r[Metric.KIND] == Kind.STEP]
        evals = self._evals()
        parts = [f"learner v{lr.version}",
                 f"reward {steps[-1]['reward']:.2f}" if steps else "reward -",
                 f"eval {evals[-1]:.1%}" if evals else "eval -",
                 f"samplers {lr.books.samplers()}",
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
                f"{lr.books.samplers()} samplers; {acc}; dropped: {drops}; checkpoint in "
                f"{lr.checkpoint_dir}")


class SamplerReport:
    """A sampler's metrics.jsonl: one "batch" record per generation batch (its version, tokens,
    tokens/s, the fetcher's and sender's running counts: hedges, stalls, demotions, busy answers)
    and one "weights" record per version fetched (when it was held whole and checked, its bytes,
    its download's seconds): what `hetero-node plot` and examples/rehearsal.py read."""

    def __init__(self, metrics: MetricsWriter, sampler: Sampler, link: SwarmSamplerLink) -> None:
        self.metrics, self.sampler, self.link = metrics, sampler, link
        self._tokens, self._gen_s, self._reported = 0, 0.0, 0
        """Tokens and generation seconds at the last batch; the arrival number last reported."""

    def arrivals(self) -> None:
        """A "weights" record for each version fetched since the last call (called every turn of
        the loop, batch or not: a sampler held back by its learner still fetches)."""
        for number, version, held_at, nbytes, fetch_s in list(self.link.weights.arrivals):
            if number > self._reported:  # each arrival once (versions repeat when a chain restarts)
                self.metrics.write({Metric.KIND: Kind.WEIGHTS, Metric.VERSION: version, Metric.HELD_AT: round(held_at, 3),
                                    "bytes": nbytes, "fetch_s": round(fetch_s, 3)})
                self._reported = number

    def batch(self, groups: int) -> None:
        st, fetcher = self.sampler.stats, self.link.weights
        self.arrivals()
        tokens, gen_s = st["tokens"] - self._tokens, st["generate_s"] - self._gen_s
        self._tokens, self._gen_s = st["tokens"], st["generate_s"]
        self.metrics.write({Metric.KIND: Kind.BATCH, Metric.VERSION: self.sampler.version, Metric.AT: round(time.time(), 3),
                            "groups": groups, "tokens": tokens, "generate_s": round(gen_s, 3),
                            "tokens_per_s": round(tokens / gen_s, 2) if gen_s > 0 else 0.0,
                            "load_s": round(st["load_s"], 3), "weight_updates": st["weight_updates"],
                            "fetch": dict(fetcher.stats), "rollouts": dict(self.link.rollouts.stats),
                            "demoted": len(fetcher.demoted), "loop": self.link.rollouts.node.loop_lag()})
