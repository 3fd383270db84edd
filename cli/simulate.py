"""One process, one learner, N virtual samplers, an in-memory exchange and a virtual clock.

The sampler and learner code is the same as on the real swarm; only the exchange differs
(`swarm.memory.MemoryExchange`), so this is assembly, like `cli/roles.py` for the real swarm. Time advances `seconds_per_step` virtual seconds per learner
step. At each tick every sampler first loads the newest weights if its weight delay has passed
(the GEPO paper's model, docs/DESIGN.md "Delay"), then generates its share of one step's groups and
sends them (optionally with a rollout delay); the learner then ingests what has arrived and takes
a step if it has enough. "Online" (no delay) is exactly the on-policy loop: staleness 0.

Deterministic under `seed`: delays, prompt streams and sampling all draw from seeded generators
in a fixed order.
"""

from __future__ import annotations

import logging
import random
import time
import zlib
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from node.config import SamplingConfig, TaskConfig
from node.engines.hf import HFEngine
from node.learner import Learner, LearnerConfig
from node.metrics import MetricsWriter
from node.models import BUILTIN_MODEL, load_model, load_tokenizer, tokenizer_hash
from node.sampling.sampler import Sampler
from node.tasks import ArithmeticConfig, make_task
from swarm.delay import DelayConfig
from swarm.memory import MemoryExchange, VirtualClock
from swarm.wire.rollout import decode_rollout_group
from swarm.wire.reasons import Drop

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimSamplerSpec:
    """One `[[samplers]]` entry: `count` virtual samplers alike."""

    name: str = "sampler"
    model: str = ""
    """Model they serve; "" = the learner's. Another model's rollouts are foreign (F-TIS)."""
    count: int = 1
    share: float = 1.0
    """Relative rollout rate: a sampler with share 2 makes twice the groups of one with share 1."""
    weight_delay: DelayConfig = field(default_factory=DelayConfig)
    rollout_delay: DelayConfig = field(default_factory=DelayConfig)
    dtype: str = "float32"
    """The precision their engine computes in: "bfloat16" is a GPU volunteer's sampler (behaviour
    log-probs from another precision than the learner's)."""
    logit_error: float = 0.0
    """Standard deviation (logits) of Gaussian noise added to every logit their engine computes, at
    every position: an emulated engine error. A small model in bfloat16 errs far less than a large
    one (the behaviour log-probs' k3 against the learner's: ~1e-4 on the built-in model, ~5e-3 on a
    151k-vocabulary model in bfloat16, docs/BENCHMARKS.md), so this gives a small model a large
    one's gap, to ask on a CPU what that gap does to training. 0.3 on the built-in chain model at
    T = 0.6: k3 ~3e-3 a token, 1.2% of tokens past GRPO's clip (docs/RESULTS.md, section 6)."""

    def __post_init__(self) -> None:
        if self.count < 1 or self.share <= 0:
            raise ValueError("samplers: need count >= 1 and share > 0")
        if not 0 <= self.logit_error < 10:
            raise ValueError(f"samplers: logit_error {self.logit_error} is not in [0, 10) logits")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"samplers: dtype {self.dtype!r} is not float32, bfloat16 or float16")


@dataclass
class SimulatorConfig:
    model: str = BUILTIN_MODEL
    task: TaskConfig = field(default_factory=ArithmeticConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    samplers: tuple[SimSamplerSpec, ...] = (SimSamplerSpec(count=2),)
    steps: int = 300
    seconds_per_step: float = 30.0
    """Virtual seconds per learner step: maps delays in seconds to staleness in steps."""
    max_delay_steps: int | None = None
    """The paper's 'max delay': caps every weight delay at this many learner steps (0 = online)."""
    max_ticks_factor: float = 3.0
    """Give up after steps * this many ticks without enough data (rollout delays can starve)."""
    seed: int = 0
    threads: int = 2
    device: str = "cpu"
    """Where the learner and every sampler's engine run ("cuda" on a GPU)."""
    time_budget_s: float | None = None
    metrics_path: str | None = None
    """JSONL file with one line per step (and per evaluation)."""
    tensorboard_dir: str | None = None
    """Also write TensorBoard event files here."""

    def __post_init__(self) -> None:
        if not self.samplers:
            raise ValueError("simulator: give at least one sampler in [[samplers]]")
        if self.seconds_per_step <= 0 or self.steps < 1:
            raise ValueError("simulator: need seconds_per_step > 0 and steps >= 1")
        if self.max_delay_steps is not None and self.max_delay_steps < 0:
            raise ValueError(f"max_delay_steps must be >= 0 (0 = online), not {self.max_delay_steps}")


def add_logit_error(model: torch.nn.Module, std: float, seed: int) -> None:
    """Make `model`'s every forward add N(0, std^2) to each logit it outputs (SimSamplerSpec.
    logit_error), drawn from a generator of its own so that the run's other randomness (prompts,
    delays, the learner) is the same as without it."""
    head = model.get_output_embeddings()
    gen = torch.Generator(device=head.weight.device).manual_seed(seed)

    def noisy(_module, _inputs, logits: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(logits.shape, generator=gen, device=logits.device, dtype=torch.float32)
        return (logits.float() + std * noise).to(logits.dtype)

    head.register_forward_hook(noisy)


def emulated_engine_audit(learner: LearnerConfig, logit_error: float, temperature: float) -> dict:
    """What the learner's audit needs to pass an honest engine that errs by N(0, logit_error^2)
    per logit (SimSamplerSpec.logit_error), as a learner's tolerances are derived from its engines'
    measured error: a margin of 6 sigma (an honest margin is the difference of two errors, ~4.9 sigma
    at most over 12 steps' audits at sigma 0.6); a claimed log-prob gap of 2 sigma / T per token (a
    token's log-prob moves by e_token - E_q[e], whose mean |.| is at most 1.13 sigma / T); and the flip
    rate measured across models, since node/audit.FlipRate measures this model's own bfloat16 rate,
    not the emulated engine's."""
    if not logit_error:
        return {}
    out = {"audit_margin": max(learner.audit_margin, 6 * logit_error),
           "audit_logprob_gap": max(learner.audit_logprob_gap, 2 * logit_error / (temperature or 1.0)),
           "audit_calibrate": False}
    log.info("samplers emulate an engine error of %.3g logits: the learner's audit takes %s", logit_error, out)
    return out


MAKE_UP_ROUNDS = 3
"""Tries, per tick, to make again the groups the learner refused (Simulator._ingest)."""


class Simulator:
    def __init__(self, cfg: SimulatorConfig) -> None:
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        torch.set_num_threads(cfg.threads)
        self.clock = VirtualClock()
        self.exchange = MemoryExchange(self.clock, seed=cfg.seed)
        tok = load_tokenizer(cfg.model)
        self.task = make_task(cfg.task, tok)
        self.metrics = MetricsWriter(cfg.metrics_path, cfg.tensorboard_dir)
        # the cohorts' other models are the operator's own: named, they are taken as foreign (F-TIS), not audited
        others = tuple(s.model for s in cfg.samplers if s.model and s.model != cfg.model)
        lcfg = replace(cfg.learner, accept_models=(*cfg.learner.accept_models, *others),
                       **emulated_engine_audit(cfg.learner, max(s.logit_error for s in cfg.samplers),
                                               cfg.sampling.temperature))
        self.learner = Learner(lcfg, load_model(cfg.model, device=cfg.device), tok, self.task, model_id=cfg.model,
                               sampling=cfg.sampling, link=self.exchange, metrics=self.metrics, on_record=self._record,
                               chain=f"sim-seed-{cfg.seed}",  # sampling randomness hangs off the chain
                               keep_records=None)  # a finite run: its history is its result
        self._on_record: Callable[[dict], None] | None = None
        self.samplers: list[tuple[Sampler, object, float]] = []
        for spec in cfg.samplers:
            for i in range(spec.count):
                self.samplers.append(self._make_sampler(spec, i))

    def _make_sampler(self, spec: SimSamplerSpec, i: int) -> tuple[Sampler, object, float]:
        peer = f"{spec.name}-{i}" if spec.count > 1 else spec.name
        model = spec.model or self.cfg.model
        tok = load_tokenizer(model)
        net = load_model(model, device=self.cfg.device).to(getattr(torch, spec.dtype))
        if spec.logit_error:
            add_logit_error(net, spec.logit_error, seed=zlib.crc32(f"{self.cfg.seed}/{peer}".encode()))
        engine = HFEngine(net, tok, model)
        link = self.exchange.sampler(peer, weight_delay=self._capped(spec.weight_delay), rollout_delay=spec.rollout_delay)
        sampler = Sampler(peer, self.task, engine, tokenizer_hash(tok), sampling=self.cfg.sampling,
                          swarm=self.learner.swarm, seed=self.cfg.seed)
        return sampler, link, spec.share

    def _capped(self, delay: DelayConfig) -> DelayConfig:
        if self.cfg.max_delay_steps is None:
            return delay
        cap = self.cfg.max_delay_steps * self.cfg.seconds_per_step
        return replace(delay, max_s=cap if delay.max_s is None else min(delay.max_s, cap))

    def _shares(self) -> list[int]:
        """Groups per tick for each sampler, summing to the learner's groups_per_step."""
        n = self.cfg.learner.groups_per_step
        total = sum(s for _, _, s in self.samplers)
        exact = [n * s / total for _, _, s in self.samplers]
        counts = [int(x) for x in exact]
        for i in sorted(range(len(exact)), key=lambda i: exact[i] - counts[i], reverse=True)[: n - sum(counts)]:
            counts[i] += 1
        return counts

    def _ingest(self) -> None:
        """Everything delivered by now, into the learner. A group it refuses as a duplicate of one
        it took (a peaked model answers a problem drawn again as it did before) is made again by its
        sampler, up to MAKE_UP_ROUNDS times: else the learner is one group short each tick and
        trains one version behind from then on (4 of 30 cells of an on-policy grid did). Other
        refusals are what a run measures (a dropped route, a full buffer): not made up."""
        by_peer = {s.peer_id: (s, link) for s, link, _ in self.samplers}
        for round_ in range(MAKE_UP_ROUNDS + 1):
            again = []
            for raw in self.exchange.receive_rollouts(10_000):
                if self.learner.ingest(raw) == Drop.DUPLICATE_CONTENT:
                    again.append(decode_rollout_group(raw).sampler)
            if not again or round_ == MAKE_UP_ROUNDS:
                return
            for peer in again:  # (with a rollout delay, they arrive as late as the first try would)
                sampler, link = by_peer[peer]
                sampler.run_once(link, 1)

    def _record(self, rec: dict) -> None:
        if self._on_record is not None:
            self._on_record(rec)

    def run(self, on_record: Callable[[dict], None] | None = None) -> list[dict]:
        self._on_record = on_record
        self.learner.start()
        self.learner.run_eval()
        shares, t0, tick = self._shares(), time.time(), 0
        while self.learner.version < self.cfg.steps and tick < self.cfg.steps * self.cfg.max_ticks_factor:
            self.clock.advance_to(tick * self.cfg.seconds_per_step)
            for (sampler, link, _), n in zip(self.samplers, shares):
                if n:
                    sampler.run_once(link, n)
            self._ingest()
            self.learner.step()
            if self.learner.refusals.refused:
                # every simulated sampler is honest: a refusal is the audit's error, and the run
                # would go on without it and measure something else
                raise RuntimeError(f"the learner refused an honest simulated sampler: {self.learner.refusals.refused}")
            tick += 1
            if self.cfg.time_budget_s is not None and time.time() - t0 > self.cfg.time_budget_s:
                log.info("time budget reached at version %d", self.learner.version)
                break
        if self.learner.history[-1].get("kind") != "eval":
            self.learner.run_eval()
        self.metrics.close()
        return list(self.learner.history)
