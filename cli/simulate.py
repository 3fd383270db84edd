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
import time
import zlib
from dataclasses import replace
from typing import Callable

import torch

from node.device import resolve
from node.engines.hf import HFEngine
from node.learner import Learner
from node.metrics import MetricsWriter
from node.models import load_model, load_tokenizer, tokenizer_hash
from node.sampling.sampler import Sampler
from node.tasks import make_task
from swarm.delay import DelayConfig
from swarm.memory import MemoryExchange, VirtualClock
from swarm.wire.rollout import decode_rollout_group
from swarm.wire.reasons import Drop

from cli.config import SimSamplerSpec, SimulatorConfig
from node.learner.config import AuditConfig

log = logging.getLogger(__name__)


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


class Float32Linear(torch.nn.Module):
    """A reduced-precision `nn.Linear` (bfloat16, float16) that multiplies in float32 and rounds
    its output to its own dtype once: fp32 accumulation and one rounding, as a GPU's bf16 GEMM does.

    Why: torch's bf16 kernel on a CPU without AVX512-BF16 is slow: a bf16 sampler of the built-in
    model generated a batch 3.2x faster this way (`examples/bench_sim_bf16.py`), and the bf16 grids'
    runs spent 54% of their time in that kernel. The two agree on all but 2e-5 of a forward's
    linear outputs, by one bf16 step (presumably their float32 sums run in another order). The weight stays
    the module's own parameter (loaded as before); its float32 copy is remade whenever the
    parameter changes (its version counter). Not an `nn.Linear` (no `in_features`): for a sampler's
    engine only, not a model a learner trains or scores with.
    """

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self._copy: tuple[tuple, torch.Tensor, torch.Tensor | None] | None = None

    def _float32(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        # which tensors, and how often each was changed in place (load_state_dict copies into them);
        # a write through `.data` bumps no counter, and nothing here makes one
        seen = tuple((t.data_ptr(), t._version) for t in (self.weight, self.bias) if t is not None)
        if self._copy is None or self._copy[0] != seen:
            self._copy = (seen, self.weight.detach().float(),
                          None if self.bias is None else self.bias.detach().float())
        return self._copy[1], self._copy[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self._float32()
        return torch.nn.functional.linear(x.float(), weight, bias).to(x.dtype)


def float32_matmuls(model: torch.nn.Module) -> int:
    """Swap every bfloat16 or float16 `nn.Linear` of `model` for a `Float32Linear` (in place); how many."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.weight.dtype in (torch.bfloat16, torch.float16):
                setattr(parent, name, Float32Linear(child))
                swapped += 1
    return swapped


def emulated_engine_audit(audit: AuditConfig, logit_error: float, temperature: float) -> AuditConfig:
    """What the learner's audit needs to pass an honest engine that errs by N(0, logit_error^2)
    per logit (SimSamplerSpec.logit_error), as a learner's tolerances are derived from its engines'
    measured error: a margin of 6 sigma (an honest margin is the difference of two errors, ~4.9 sigma
    at most over 12 steps' audits at sigma 0.6), and a hard bound at least twice that; a claimed
    log-prob gap of 2 sigma / T per token (a token's log-prob moves by e_token - E_q[e], whose mean
    |.| is at most 1.13 sigma / T); and the flip
    rate measured across models, since node/audit.FlipRate measures this model's own bfloat16 rate,
    not the emulated engine's."""
    if not logit_error:
        return audit
    margin = max(audit.margin, 6 * logit_error)
    out = replace(audit, margin=margin, margin_hard=max(audit.margin_hard, 2 * margin),
                  logprob_gap=max(audit.logprob_gap, 2 * logit_error / (temperature or 1.0)), calibrate=False)
    log.info("samplers emulate an engine error of %.3g logits: the learner's audit takes %s", logit_error, out)
    return out


MAKE_UP_ROUNDS = 3
"""Tries, per tick, to make again the groups the learner refused (Simulator._ingest)."""


class Simulator:
    def __init__(self, cfg: SimulatorConfig) -> None:
        self.cfg = cfg
        cfg.apply()  # seeds and threads (ProcessBlock)
        self.place = resolve(cfg.device, cfg.dtype)
        self.clock = VirtualClock()
        self.exchange = MemoryExchange(self.clock, seed=cfg.seed)
        tok = load_tokenizer(cfg.model)
        self.task = make_task(cfg.task, tok)
        self.metrics = MetricsWriter(cfg.metrics_path, cfg.tensorboard_dir)
        # the cohorts' other models are the operator's own: named, they are taken as foreign (F-TIS), not audited
        others = tuple(s.model for s in cfg.samplers if s.model and s.model != cfg.model)
        lc = cfg.learner
        lcfg = replace(lc, foreign=replace(lc.foreign, accept_models=(*lc.foreign.accept_models, *others)),
                       audit=emulated_engine_audit(lc.audit, max(s.logit_error for s in cfg.samplers),
                                                   cfg.sampling.temperature))
        self.learner = Learner(lcfg, load_model(cfg.model, device=self.place.device), tok, self.task, model_id=cfg.model,
                               sampling=cfg.sampling, link=self.exchange, metrics=self.metrics, on_record=self._record,
                               compute_dtype=self.place.autocast_dtype,
                               chain=f"sim-seed-{cfg.seed}",  # sampling randomness hangs off the chain
                               keep_records=None)  # a finite run: its history is its result
        self._on_record: Callable[[dict], None] | None = None
        self.sampler_matmul = "native"
        """How the samplers' reduced-precision layers multiplied: "float32" if any sampler's were
        swapped for `Float32Linear` (SimSamplerSpec.matmul on a CPU), else "native"."""
        self.samplers: list[tuple[Sampler, object, float]] = []
        for spec in cfg.samplers:
            for i in range(spec.count):
                self.samplers.append(self._make_sampler(spec, i))

    def _make_sampler(self, spec: SimSamplerSpec, i: int) -> tuple[Sampler, object, float]:
        peer = f"{spec.name}-{i}" if spec.count > 1 else spec.name
        model = spec.model or self.cfg.model
        tok = load_tokenizer(model)
        net = load_model(model, device=self.place.device).to(getattr(torch, spec.dtype))
        if spec.dtype != "float32" and spec.matmul == "float32" and self.place.device.type == "cpu":
            float32_matmuls(net)
            self.sampler_matmul = "float32"
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
            for raw, group in self.exchange.receive_rollouts(10_000):
                if self.learner.ingest(raw, group) == Drop.DUPLICATE_CONTENT:
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
