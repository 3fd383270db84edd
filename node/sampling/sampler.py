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

from swarm.exchange import SamplerLink
from swarm.wire.rollout import CompletionRecord, RolloutGroup

from node.sampling.race import BASE_NONCE, group_seeds
from node.sampling.params import SamplingConfig
from node.engines.base import Engine
from node.tasks import PromptStream, Task
from node.weights.codec import apply_version
from node.weights.blob import decode_version, retie, version_nonce

log = logging.getLogger(__name__)


class Sampler:
    def __init__(self, peer_id: str, task: Task, engine: Engine, tokenizer_id: str, *,
                 sampling: SamplingConfig = SamplingConfig(), swarm: str = "local", prompts_per_batch: int = 8,
                 seed: int = 0, weightless: bool = False) -> None:
        self.peer_id = peer_id
        self.task = task
        self.engine = engine
        self.tokenizer_id = tokenizer_id
        self.sampling = sampling
        self.swarm = swarm
        self.prompts_per_batch = prompts_per_batch
        self.stream = PromptStream(task.split("train"), seed=f"{seed}:{peer_id}")
        self.stats = {"groups": 0, "completions": 0, "tokens": 0, "generate_s": 0.0, "weight_updates": 0,
                      "weights_refused": 0, "chain_breaks": 0, "load_s": 0.0}
        self.published = None
        """The learner's published view as rebuilt here (a flat tensor in the view's dtype, bit-exact)."""
        self.chain = ""
        self.nonce = BASE_NONCE
        """Nonce of the version held (node/sampling/race.py): the hash of its published bytes."""
        self.weightless = weightless
        """Whether the engine's weights are not the learner's until its first keyframe is loaded (a
        model built from the learner's files: cli/roles/swarm_model.py): nothing is generated before."""

    @property
    def version(self) -> int:
        return self.engine.version

    def maybe_update(self, link: SamplerLink) -> bool:
        """Apply newer versions of our own model (a keyframe and/or patches) if the link offers them.
        A version that does not decode, or rebuilds a view whose digest is not the published one,
        is refused (counted) and the next fetch starts from a keyframe; the weights held stay."""
        have = self.engine.version if self.published is not None else -1
        versions = link.fetch_weights(self.chain, have)
        if not versions:
            return False
        if versions[0].model_id != self.engine.model_id:
            self.stats["weights_refused"] += 1  # another model's weights: not ours to load
            return False
        if versions[0].base is None:  # a keyframe replaces the view: not two of them (2 B/param each) at once
            self.published = None
        published, version, chain, aliases, nonce, layout = self.published, have, self.chain, {}, self.nonce, None
        for wv in versions:
            if wv.base is not None and (wv.base != version or wv.chain != chain):
                self.stats["chain_breaks"] += 1  # missed a base: the next fetch starts from a keyframe
                self.chain = ""
                log.warning("delta v%d does not apply to v%d; will refetch from a keyframe", wv.version, version)
                return False
            try:
                enc, aliases = decode_version(wv.blob)
                published = apply_version(published if wv.base is not None else None, enc)
            except ValueError as e:
                self.stats["weights_refused"] += 1
                self.chain = ""
                log.warning("version %d of the learner's weights is refused: %s", wv.version, e)
                return False
            version, chain, nonce, layout = wv.version, wv.chain, version_nonce(wv.blob), enc.layout
        self.published, self.chain, self.nonce = published, chain, nonce
        t0 = time.perf_counter()
        self.engine.load_weights(retie(layout.tensors(published), aliases), version)
        self.stats["load_s"] += time.perf_counter() - t0
        self.stats["weight_updates"] += 1
        log.debug("now at version %d", version)
        return True

    def produce(self, n_prompts: int | None = None) -> list[RolloutGroup]:
        """Generate and score one batch of groups with the current weights."""
        problems = self.stream.take(n_prompts or self.prompts_per_batch)
        params = self.sampling.params
        version = self.engine.version  # fixed for the whole batch: weights swap only between batches
        # checkable sampling: the randomness of each completion comes from the version's nonce, the
        # prompt, our peer id and the completion's index, so the learner can audit every token
        seeds = [group_seeds(self.nonce, p.id, self.peer_id, params.n) for p in problems]
        t0 = time.perf_counter()
        results = self.engine.generate([p.prompt for p in problems], params, seeds)
        self.stats["generate_s"] += time.perf_counter() - t0
        groups = []
        for p, r in zip(problems, results):
            comps = [CompletionRecord(c.text, c.token_ids, c.logprobs, c.finish_reason, self.task.reward(c.text, p.answer))
                     for c in r.completions]
            groups.append(RolloutGroup(
                id=uuid.uuid4().hex, swarm=self.swarm, task=self.task.name, prompt_id=p.id, prompt=p.prompt,
                model_id=self.engine.model_id, tokenizer=self.tokenizer_id, version=version, sampler=self.peer_id,
                chain=self.chain,
                created=time.time(), completions=comps,
                sampling={"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
                          "max_new_tokens": params.max_new_tokens},
            ))
        self.stats["groups"] += len(groups)
        self.stats["completions"] += sum(len(g.completions) for g in groups)
        self.stats["tokens"] += sum(len(c.token_ids) for g in groups for c in g.completions)
        return groups

    @property
    def waiting_for_weights(self) -> bool:
        return self.weightless and self.published is None

    def run_once(self, link: SamplerLink, n_prompts: int | None = None) -> int:
        """Update if possible, produce one batch, send it; returns the number of groups sent (none
        while `waiting_for_weights`: an audit would refuse what uninitialised weights generate)."""
        self.maybe_update(link)
        if self.waiting_for_weights:
            return 0
        groups = self.produce(n_prompts)
        link.send_rollouts([(g.id, g.encode()) for g in groups])
        return len(groups)
