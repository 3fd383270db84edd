"""`hetero-node join --role sampler`: a sampler on the swarm, until told to stop: it follows its
model's learner, generates while the learner keeps up, and feeds partner learners of its model."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
import msgspec

from node.device import resolve
from node.engines import make_engine
from node.metrics import MetricsWriter
from node.models import load_tokenizer, tokenizer_hash
from node.sampling.sampler import Sampler
from node.tasks import make_task
from swarm.discovery import LearnerTracker, skipped_for_protocol
from swarm.identity import short_id
from swarm.rollouts.outbox import Outbox
from swarm.p2p import SwarmNode
from swarm.wire.peer import PeerInfo
from swarm.links import SwarmSamplerLink

from cli.roles.common import start_node
from swarm.pacing import Every, Heartbeat
from cli.roles.swarm_model import adopt_swarm_model
from cli.doctor import refuse_unfit
from cli.config import JoinConfig
from cli.roles.report import SamplerReport

log = logging.getLogger("hetero-node")


def run_sampler(cfg: JoinConfig, stop: threading.Event) -> None:
    node = start_node(cfg)
    outbox = Outbox(Path(cfg.workdir) / "outbox.db")
    metrics = MetricsWriter(Path(cfg.workdir) / "metrics.jsonl")
    link = None
    try:
        folder = None
        if not cfg.model:  # no --model: the swarm's, from its learner (cli/roles/swarm_model.py)
            warming = _warm_imports()
            adopted = adopt_swarm_model(cfg, node, stop)
            if adopted is None:  # stopped: no need to wait for the imports (a daemon thread)
                return
            warming.join()  # (its imports done before the model's files are read: no two threads import transformers)
            cfg, folder = adopted.cfg, adopted.folder
            refuse_unfit(cfg, str(folder))  # the swarm's model must fit here too: said in one line if not
        tracker = LearnerTracker(node, cfg.follow, cfg.model)
        link = SwarmSamplerLink(node, outbox, tracker, cfg.sampler.weight_delay, cfg.sampler.rollout_delay, cfg.seed,
                                fetch=cfg.sampler.fetch, max_partner_owed=cfg.sampler.max_outbox,
                                pause_at=cfg.sampler.max_learner_backlog)
        sampler = _make_sampler(cfg, node, folder)
        SamplerLoop(cfg, node, outbox, link, sampler, tracker, SamplerReport(metrics, sampler, link)).run(stop)
    finally:
        if link is not None:
            link.close()
            log.info("sampler stopped: %d groups delivered, %d refused by the learner, %d left in the outbox "
                     "(sent when you join again)%s", link.rollouts.stats["delivered"], link.rollouts.stats["rejected"],
                     len(outbox), _partner_summary(link))
        outbox.close()
        metrics.close()
        node.shutdown()


def _warm_imports() -> threading.Thread:
    """Import, in a thread, what a sampler loads once it knows the swarm's model: transformers'
    tokenizer and model classes, ~3 s of a core. While it waits for the learner's record, not after:
    by then the learner's first version is waiting for its rollouts (the demo's samplers took 5 s
    from finding the learner to generating, most of it these imports)."""

    def imports() -> None:
        try:
            import transformers.generation.utils  # noqa: F401
            import transformers.modeling_utils  # noqa: F401
            from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401
        except Exception as e:  # a head start only: the import that needs it says what is wrong
            log.debug("warming transformers' imports failed: %s", e)

    thread = threading.Thread(target=imports, name="warm-imports", daemon=True)
    thread.start()
    return thread


def _partner_summary(link: SwarmSamplerLink) -> str:
    """'; partner learners: Qm1234 took 40, ...' for the learners of other models this sampler fed."""
    parts = [f"{short_id(p)} took {st['delivered']}" + (f", gave up {st['given_up']}" if st["given_up"] else "")
             for p, st in sorted(link.rollouts.partner_stats.items())]
    return f"; partner learners: {'; '.join(parts)}" if parts else ""


def _held_back(cfg: JoinConfig, outbox: Outbox, link: SwarmSamplerLink, tracker: LearnerTracker) -> bool:
    """Whether to stop generating for now: our learner is behind or away (its rollouts wait without
    bound), or, with no live learner of our model, every partner already has all it can take from us."""
    if tracker.current is not None:
        return outbox.owed() >= cfg.sampler.max_outbox or link.learner_backlog >= cfg.sampler.max_learner_backlog
    # our learner is gone (its record expired): what we make now goes to partners only (ours keeps
    # what it was owed), so a dead learner of our model does not starve the others
    return all(outbox.owed(p) >= cfg.sampler.max_outbox for p in tracker.partners)


def _waiting_for(tracker: LearnerTracker, swarm: str) -> str:
    """What a sampler with no learner to follow waits for, and what would end the wait."""
    if tracker.other_protocol and (tracker.follow or not tracker.named_models):
        return f"waiting for a learner this node can talk to in swarm {swarm!r}: {skipped_for_protocol(tracker.other_protocol)}"
    if tracker.follow:
        return f"waiting for the learner --follow names ({short_id(tracker.follow)}) to appear in swarm {swarm!r}"
    unnamed = tracker.unnamed_learners() if not tracker.named_models else []
    if unnamed:
        return (f"waiting for a learner the coordinator names: {len(unnamed)} learner(s) seen in swarm "
                f"{swarm!r}, none named by the bootstrap's swarm record (its --trusted-learner), so none is followed; "
                "pin one with --follow PEER_ID")
    if tracker.named_models:
        return (f"waiting for a learner of model {tracker.model_id!r} or one that takes its rollouts: the learners "
                f"in swarm {swarm!r} train {', '.join(map(repr, tracker.named_models))} and none names "
                f"{tracker.model_id!r} in its learner.foreign.accept_models: rejoin without --model to run the swarm's")
    return f"waiting for a learner to join swarm {swarm!r} (none seen yet; is --swarm the coordinator's?)"


def _make_sampler(cfg: JoinConfig, node: SwarmNode, folder: Path | None = None) -> Sampler:
    """The sampler of `cfg.model`, or of the swarm's model from the learner's files in `folder`: built
    from its config with no weights, it generates nothing until the learner's keyframe is loaded."""
    where = str(folder) if folder is not None else cfg.model
    tok = load_tokenizer(where)
    # auto: bfloat16 on a GPU (what every RL system samples in), float32 on the CPU. Audits by race
    # margin pass honest bfloat16 engines (docs/DESIGN.md, "The audit across precisions")
    place = resolve(cfg.device, cfg.dtype)
    task, vllm = make_task(cfg.task, tok), cfg.vllm
    if cfg.engine == "vllm":  # [vllm]'s "auto" settled from the model, this GPU, --dtype and the batch; logged
        from cli.doctor import vllm_for_sampler

        vllm = vllm_for_sampler(cfg, place, where, tok, task)
    else:
        log.info("sampler generates on %s", place)
    engine = make_engine(cfg.engine, cfg.model, tok, vllm, placement=place, path=where)
    return Sampler(node.peer_id, task, engine, tokenizer_hash(tok), sampling=cfg.sampling,
                   swarm=cfg.swarm, prompts_per_batch=cfg.sampler.prompts_per_batch, seed=cfg.seed,
                   weightless=folder is not None)


class SamplerLoop:
    """The sampler's loop: follow the learner, generate while it keeps up, report. Its announcement
    goes out on a heartbeat of its own: a generation batch at real size takes minutes."""

    def __init__(self, cfg: JoinConfig, node: SwarmNode, outbox: Outbox, link: SwarmSamplerLink, sampler: Sampler,
                 tracker: LearnerTracker, report: SamplerReport) -> None:
        self.cfg, self.node, self.outbox, self.link = cfg, node, outbox, link
        self.sampler, self.tracker, self.report = sampler, tracker, report
        self.status = Every(cfg.status_every_s)
        self.backoff, self.groups, self.t0, self.force = 1.0, 0, time.monotonic(), True
        self.told_models = False
        self.card: PeerInfo | None = None
        """What the heartbeat announces: replaced whole by the loop, never changed in place."""

    def run(self, stop: threading.Event) -> None:
        self.card = self._card()  # before the heartbeat's first beat, which comes at once
        heartbeat = Heartbeat([("announcing the sampler", self.cfg.announce_every_s, self._announce)])
        try:
            while not stop.is_set():
                heartbeat.check()
                self._turn(stop)
        finally:
            heartbeat.close()

    @property
    def rate(self) -> float:
        """Rollouts per second since the start."""
        return self.groups * self.cfg.sampling.group_size / max(time.monotonic() - self.t0, 1e-6)

    def _card(self) -> PeerInfo:
        cfg = self.cfg
        return PeerInfo(peer_id=self.node.peer_id, role="sampler", model_id=cfg.model, version=self.sampler.version,
                        engine=cfg.engine, throughput=round(self.rate, 3), name=cfg.name,
                        learner=self.tracker.current or "")

    def _announce(self) -> None:
        self.node.announce(msgspec.structs.replace(self.card, maddrs=self.node.maddrs()), ttl=self.cfg.peer_ttl_s)

    def _turn(self, stop: threading.Event) -> None:
        cfg, sampler, tracker, link = self.cfg, self.sampler, self.tracker, self.link
        self.card = self._card()
        if self.status():
            log.info("sampler v%d | groups made %d | acknowledged %d | outbox %d | learner %s | partners %d | "
                     "%.1f rollouts/s", sampler.version, self.groups, link.rollouts.stats["delivered"], len(self.outbox),
                     short_id(tracker.current) if tracker.current else "none yet", len(tracker.partners), self.rate)
        self.report.arrivals()
        tracker.refresh(force=self.force)
        if not tracker.any:
            why = _waiting_for(tracker, cfg.swarm)
            # the first time a swarm of other models is seen, a warning: this sampler's work helps no one
            (log.warning if tracker.named_models and not self.told_models else log.info)(
                "%s (for %.0f s; retrying in %.0f s)", why, time.monotonic() - self.t0, self.backoff)
            self.told_models = self.told_models or bool(tracker.named_models)
            stop.wait(self.backoff)
            self.backoff, self.force = min(self.backoff * 2, 30.0), True
            return
        self.backoff, self.force = 1.0, False
        if _held_back(cfg, self.outbox, link, tracker):
            stop.wait(0.2)  # the learner is behind or away: do not generate without bound
            return
        made = sampler.run_once(link)
        if sampler.waiting_for_weights:
            stop.wait(0.2)  # the learner's keyframe is on its way (the link's prefetcher fetches it)
            return
        self.groups += made
        self.report.batch(made)
