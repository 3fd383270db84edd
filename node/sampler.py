"""The sampler role: generate groups with the policy it holds, score them, emit RolloutGroup records.

A sampler holds weights at a known version and reports that version on every record it makes,
so a learner can tell exactly how stale each rollout is. It swaps to newer weights only between
generation batches, and only weights of its own model (a sampler serving another model keeps its
own weights; the learner treats its rollouts as foreign).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from swarm.exchange import Exchange
from swarm.records import CompletionRecord, RolloutGroup
from swarm.weights_meta import weights_metadata

from .engines.base import Engine, SamplingParams
from .tasks import PromptStream, Task
from .weight_codec import apply_version
from .weights import decode_version, retie

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplerConfig:
    swarm: str = "local"
    group_size: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 6
    prompts_per_batch: int = 8
    seed: int = 0

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(n=self.group_size, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, max_new_tokens=self.max_new_tokens)


class Sampler:
    def __init__(self, peer_id: str, cfg: SamplerConfig, task: Task, engine: Engine, tokenizer_id: str) -> None:
        self.peer_id = peer_id
        self.cfg = cfg
        self.task = task
        self.engine = engine
        self.tokenizer_id = tokenizer_id
        self.stream = PromptStream(task.split("train"), seed=f"{cfg.seed}:{peer_id}")
        self.stats = {"groups": 0, "completions": 0, "weight_updates": 0, "weights_refused": 0, "chain_breaks": 0}
        self.published: dict | None = None
        """The learner's published weights as reconstructed here (float32), bit-exact."""
        self.chain = ""

    @property
    def version(self) -> int:
        return self.engine.version

    def maybe_update(self, exchange: Exchange) -> bool:
        """Apply newer versions of our own model (a keyframe and/or deltas) if the exchange offers them."""
        have = self.engine.version if self.published is not None else -1
        blobs = exchange.fetch_weights(self.peer_id, self.chain, have)
        if not blobs:
            return False
        if weights_metadata(blobs[0]).get("model_id") != self.engine.model_id:
            self.stats["weights_refused"] += 1  # another model's weights: not ours to load
            return False
        published, version, chain, aliases = self.published, have, self.chain, {}
        for blob in blobs:
            enc, aliases = decode_version(blob)
            if enc.base is not None and (enc.base != version or weights_metadata(blob).get("chain") != chain):
                self.stats["chain_breaks"] += 1  # missed a base: the next fetch starts from a keyframe
                self.chain = ""
                log.warning("%s: delta v%d does not apply to v%d; will refetch from a keyframe", self.peer_id, enc.version, version)
                return False
            published = apply_version(published if enc.base is not None else None, enc)
            version, chain = enc.version, weights_metadata(blob).get("chain", "")
        self.published, self.chain = published, chain
        self.engine.load_weights(retie(published, aliases), version)
        self.stats["weight_updates"] += 1
        log.debug("%s: now at version %d", self.peer_id, version)
        return True

    def produce(self, n_prompts: int | None = None) -> list[RolloutGroup]:
        """Generate and score one batch of groups with the current weights."""
        problems = self.stream.take(n_prompts or self.cfg.prompts_per_batch)
        params = self.cfg.sampling
        version = self.engine.version  # fixed for the whole batch: weights swap only between batches
        results = self.engine.generate([p.prompt for p in problems], params)
        groups = []
        for p, r in zip(problems, results):
            comps = [CompletionRecord(c.text, c.token_ids, c.logprobs, c.finish_reason, self.task.reward(c.text, p.answer))
                     for c in r.completions]
            groups.append(RolloutGroup(
                id=uuid.uuid4().hex, swarm=self.cfg.swarm, task=self.task.name, prompt_id=p.id, prompt=p.prompt,
                model_id=self.engine.model_id, tokenizer=self.tokenizer_id, version=version, sampler=self.peer_id,
                chain=self.chain,
                created=time.time(), completions=comps,
                sampling={"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
                          "max_new_tokens": params.max_new_tokens},
            ))
        self.stats["groups"] += len(groups)
        self.stats["completions"] += sum(len(g.completions) for g in groups)
        return groups

    def run_once(self, exchange: Exchange, n_prompts: int | None = None) -> int:
        """Update if possible, produce one batch, send it; returns the number of groups sent."""
        self.maybe_update(exchange)
        groups = self.produce(n_prompts)
        exchange.send_rollouts(self.peer_id, [(g.id, g.encode()) for g in groups])
        return len(groups)
