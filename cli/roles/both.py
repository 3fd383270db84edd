"""`hetero-node join --role sampler,learner`: a learner and a sampler of its model in one process
on one device, as an RL Swarm node is. They take turns (a training step when a step's groups are
in, then one batch of generation) and share the weights: the sampler generates with the learner's
own model object, so it is always on-policy and nothing is copied or sent to it. The node is a
learner on the swarm (named by the coordinator, followed by samplers of its model, fed by samplers
of the models it takes); its own groups go to its learner in memory and a copy of each to the
partner learners that take its model, as a sampler's do."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from node.device import resolve
from node.engines.hf import HFEngine
from node.learner import Learner
from node.sampling.sampler import Sampler
from swarm.discovery import LearnerTracker
from swarm.identity import short_id
from swarm.rollouts.outbox import Outbox
from swarm.p2p import SwarmNode
from swarm.rollouts import RolloutSender

from cli.roles.common import start_node
from cli.config import JoinConfig
from cli.roles.learner import LearnerRun

log = logging.getLogger("hetero-node")


def run_both(cfg: JoinConfig, stop: threading.Event) -> None:
    place = resolve(cfg.device, cfg.dtype)
    node = start_node(cfg)
    outbox = Outbox(Path(cfg.workdir) / "outbox.db")
    try:
        LearnerRun(cfg, node, place, make_local=lambda learner: LocalSampler(cfg, node, learner, outbox)).run(stop)
    finally:
        outbox.close()
        node.shutdown()


class LocalSampler:
    """The sampler half of `run_both`."""

    def __init__(self, cfg: JoinConfig, node: SwarmNode, learner: Learner, outbox: Outbox) -> None:
        self.learner = learner
        self.engine = HFEngine(learner.model, learner.tok, cfg.model)  # the learner's weights, not a copy
        self.sampler = Sampler(node.peer_id, learner.task, self.engine, learner.checks.tokenizer_id,
                               sampling=cfg.sampling, swarm=cfg.swarm, prompts_per_batch=cfg.sampler.prompts_per_batch,
                               seed=cfg.seed)
        self.tracker = LearnerTracker(node, None, cfg.model)
        self.sender = RolloutSender(node, outbox, lambda: None, partners=lambda: self.tracker.partners,
                                    max_partner_owed=cfg.sampler.max_outbox)
        self.room = cfg.learner.groups_per_step  # a step's worth: enough for the next step, never staler
        self.groups = 0

    def turn(self) -> int:
        """One batch, if fewer than a step's worth of our own groups wait untrained (fresher data
        than running ahead); returns the groups made."""
        learner = self.learner
        self.tracker.refresh()
        if learner.untrained(learner.peer_id) >= self.room:
            return 0
        # the records say which weights made them: the learner's, now (train_step leaves the model in eval mode)
        self.engine.version, self.sampler.chain = learner.version, learner.chain
        records = [(g, g.encode()) for g in self.sampler.produce()]  # encoded once, for both
        for g, raw in records:
            learner.ingest_own(g, raw)  # a refusal (a full buffer) is counted there
        self.sender.send([(g.id, raw) for g, raw in records])
        self.groups += len(records)
        return len(records)

    def close(self) -> None:
        self.sender.close()
        fed = "; ".join(f"{short_id(p)} took {st['delivered']}" for p, st in sorted(self.sender.partner_stats.items()))
        log.info("own sampler made %d groups%s", self.groups, f"; partner learners: {fed}" if fed else "")
