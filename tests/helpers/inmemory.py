"""A learner of the built-in tiny model and its samplers in one process, wired to an in-memory
exchange (swarm.memory.MemoryExchange on a virtual clock that stays at 0 unless a test moves it):
the assembly cli/simulate.py does, without its ticks, for tests that drive the learner by hand.

    s = tiny_swarm(tmp_path, groups_per_step=2, samplers=1, audit_rate=0.0)
    s.samplers[0].run_once(s.link("s0"))
    s.learner.ingest_many(s.exchange.receive_rollouts(100))
    s.learner.step()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable
from pathlib import Path

import torch

from node.sampling.params import SamplingConfig
from node.engines.hf import HFEngine
from node.learner import Learner, LearnerConfig
from node.models import BUILTIN_MODEL, load_model, load_tokenizer, tokenizer_hash
from node.sampling.sampler import Sampler
from node.tasks import ArithmeticConfig, Task, make_task
from swarm.memory import MemoryExchange, MemorySamplerLink, VirtualClock


@dataclass
class TinySwarm:
    learner: Learner
    samplers: list[Sampler]
    exchange: MemoryExchange
    task: Task
    tok: object
    """The learner's tokenizer (each sampler's engine loads its own, as a process of its own would)."""
    clock: VirtualClock
    sampling: SamplingConfig
    prompts_per_batch: int
    started: bool
    """Whether the learner was started (version 0 published): new samplers then load it."""
    links: dict[str, MemorySamplerLink] = field(default_factory=dict)

    def link(self, peer: str) -> MemorySamplerLink:
        """`peer`'s SamplerLink to the learner, made on first use."""
        if peer not in self.links:
            self.links[peer] = self.exchange.sampler(peer)
        return self.links[peer]

    def add_sampler(self, peer: str, model_id: str = BUILTIN_MODEL, *, prompts_per_batch: int | None = None,
                    follow: bool | None = None) -> Sampler:
        """A sampler named `peer` serving `model_id` with the HF engine. With `follow` (by default,
        once the learner has started) it loads the learner's published weights through its link."""
        tok = load_tokenizer(model_id)
        sampler = Sampler(peer, self.task, HFEngine(load_model(model_id), tok, model_id), tokenizer_hash(tok),
                          sampling=self.sampling, swarm=self.learner.swarm,
                          prompts_per_batch=prompts_per_batch or self.prompts_per_batch)
        if self.started if follow is None else follow:
            sampler.maybe_update(self.link(peer))
        self.samplers.append(sampler)
        return sampler


def tiny_swarm(tmp_path: str | Path | None = None, groups_per_step: int = 2, samplers: int = 1, *,
               task: Task | None = None, group_size: int = 4, prompts_per_batch: int = 2, start: bool = False,
               seed: int = 0, quarantine: Callable[[bytes, str], None] | None = None,
               checkpoint_extra: Callable[[], dict] = dict, **learner_overrides) -> TinySwarm:
    """The built-in tiny model's Learner (LearnerConfig: `groups_per_step`, no evaluations, 20 eval
    problems, then `learner_overrides`; checkpoints in `tmp_path` if given) on a MemoryExchange,
    and `samplers` HF samplers named s0, s1, ... with `prompts_per_batch` prompts a batch.

    `task` defaults to the arithmetic task; sampling is SamplingConfig(group_size=`group_size`).
    torch is seeded with `seed` first; `quarantine(raw, why)` gets what breaks ingest or a step;
    `checkpoint_extra()` is saved with each checkpoint (the runner's journal cursor). With `start`,
    the learner starts (publishes version 0) before the samplers are made, and they load it."""
    torch.manual_seed(seed)
    tok = load_tokenizer(BUILTIN_MODEL)
    task = task if task is not None else make_task(ArithmeticConfig(), tok)
    sampling = SamplingConfig(group_size=group_size)
    clock = VirtualClock()
    exchange = MemoryExchange(clock)
    cfg = LearnerConfig(**{"groups_per_step": groups_per_step, "eval_every": 0, "eval_size": 20, **learner_overrides})
    learner = Learner(cfg, load_model(BUILTIN_MODEL), tok, task, model_id=BUILTIN_MODEL, sampling=sampling,
                      link=exchange, checkpoint_dir=tmp_path, checkpoint_extra=checkpoint_extra,
                      **({"quarantine": quarantine} if quarantine else {}))
    if start:
        learner.start()
    swarm = TinySwarm(learner, [], exchange, task, tok, clock, sampling, prompts_per_batch, start)
    for i in range(samplers):
        swarm.add_sampler(f"s{i}")
    return swarm
