"""`hetero-node join --role learner`: a learner on the swarm, until told to stop.

The learner (node/) and its link (swarm/) are built here, each given the other's part through its
constructor or the `Intake` seam: the link's receiver asks the learner about every record
(`open_intake`), the learner publishes through the link. It checkpoints every `checkpoint_every`
versions or `checkpoint_interval_s` seconds (`Checkpoints`), the journal cursor with it, and then
compacts the journal; on stop it checkpoints, publishes its tally, and the DHT is shut down by the
caller. What its workdir holds, and its bound: docs/DESIGN.md, "Who owns which state".
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import msgpack
import torch
import msgspec

from node.learner.checkpoint import CheckpointSchedule, latest_checkpoint
from node.device import resolve
from node.training.distributed import Leader, follow, init_from_env, shard
from node.learner import Learner, LearnerConfig
from node.metrics import MetricsWriter
from node.config import task_to_dict
from node.models import load_model, load_tokenizer, model_files
from node.weights.blob import untie
from node.tasks import make_task
from swarm.rollouts.journal import Journal
from swarm.p2p import SwarmNode
from swarm.wire.rollout import MAX_RECORD_BYTES
from swarm.wire.peer import PeerInfo
from swarm.links import SwarmLearnerLink
from swarm.model_files import FilesServer
from swarm.wire.model_files import ModelFiles

from cli.roles.common import start_node, volunteer_command
from swarm.pacing import Every, Heartbeat, survive
from cli.config import JoinConfig
from cli.roles.report import LearnerReport

log = logging.getLogger("hetero-node")

QUARANTINE_BYTES = 16 * MAX_RECORD_BYTES
"""What `quarantine.bin` keeps, the newest records (64 MiB: 16 of the largest a sampler may send,
thousands of usual ones). It is kept to be read, never replayed, and a step that fails every time
(out of memory) would quarantine every step's groups: as fast as the journal grows, unbounded."""


def run_learner(cfg: JoinConfig, stop: threading.Event) -> None:
    """One learner process; under torchrun (WORLD_SIZE > 1) rank 0 is the swarm peer and leads,
    the other ranks only follow its training steps (node/training/distributed.py) and join no swarm."""
    place = resolve(cfg.device, cfg.dtype)
    coll = init_from_env(place.device.type)
    if coll is not None and coll.rank > 0:
        try:
            _learner_follower(cfg, place, coll)
        finally:
            coll.close()
        return
    node = start_node(cfg)
    try:
        LearnerRun(cfg, node, place, coll).run(stop)
    finally:
        node.shutdown()
        if coll is not None:
            coll.close()


def _sharded_trainer(cfg: JoinConfig, place, coll):
    """This rank's FSDP2 shard of the model and its AdamW (float32 master weights; bfloat16
    compute through FSDP's mixed-precision policy where the dtype says so)."""
    lm = load_model(cfg.model, torch.float32, coll.device)
    if cfg.learner.gradient_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    module = shard(lm, param_dtype=place.autocast_dtype)
    return module, torch.optim.AdamW(module.parameters(), lr=cfg.learner.lr, weight_decay=0.0)


def _learner_follower(cfg: JoinConfig, place, coll) -> None:
    module, optimizer = _sharded_trainer(cfg, place, coll)
    log.info("learner rank %d of %d: following rank 0", coll.rank, coll.world)
    steps = follow(module, optimizer, coll)
    log.info("learner rank %d: stopped after %d steps", coll.rank, steps)


class JournalCursor:
    """The journal position the newest checkpoint holds: records before it are compactable once
    that checkpoint is on disk, never sooner."""

    def __init__(self, journal: Journal, link: SwarmLearnerLink) -> None:
        self.journal, self.link = journal, link
        self.saved = link.cursor
        """The cursor of the checkpoint being written (`checkpoint_extra`), or of the newest one."""

    def checkpoint_extra(self) -> dict:
        self.saved = self.link.cursor  # what this checkpoint has consumed
        return {"journal_cursor": self.saved}

    def compact(self) -> int:
        """Drop the journal's records the newest checkpoint holds: call it only once that checkpoint
        is on disk (a write that failed after `checkpoint_extra` must not compact)."""
        return self.journal.compact(self.saved)


class Quarantine:
    """Where a record that broke ingest or a step goes, with the reason: `quarantine.bin`, its
    newest `QUARANTINE_BYTES`."""

    def __init__(self, path: Path, max_bytes: int = QUARANTINE_BYTES) -> None:
        self.journal, self.max_bytes = Journal(path), max_bytes

    def __call__(self, raw: bytes, why: str) -> None:
        self.journal.append([msgpack.packb([why, raw])])
        if self.journal.nbytes > self.max_bytes:
            # down to half: at the bound, a rewrite every max_bytes / 2 appended, not at each one
            self.journal.keep_newest(self.max_bytes // 2)


class Checkpoints:
    """The learner's periodic checkpoints: after a step, one if `checkpoint_every` versions or
    `checkpoint_interval_s` seconds have passed since the last (`CheckpointSchedule`), then the
    journal compacted to it; so a kill -9 loses at most that much training, and the journal holds
    only what came in since. A write that fails for want of a resource (an OSError: a full disk) is
    logged and tried again when the next one is due; the journal keeps every record until a
    checkpoint on disk holds it."""

    def __init__(self, learner: Learner, directory: Path, cursor: JournalCursor,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.learner, self.directory, self.cursor = learner, Path(directory), cursor
        lc = learner.cfg
        self.schedule = CheckpointSchedule(lc.checkpoint.every, lc.checkpoint.interval_s, learner.version, clock)

    def after_step(self) -> Path | None:
        """Checkpoint if one is due; where it went, or None."""
        if not self.schedule.due(self.learner.version):
            return None
        return survive("writing a checkpoint", self.save)

    def save(self) -> Path:
        self.schedule.saved(self.learner.version)
        t0 = time.monotonic()
        path = self.learner.save_checkpoint(self.directory)
        dropped = self.cursor.compact()
        log.info("checkpoint %s written in %.1f s; %d journal records it holds compacted away (journal %.1f MB)",
                 path.name, time.monotonic() - t0, dropped, self.cursor.journal.nbytes / 1e6)
        return path


def door_counters(node: SwarmNode) -> dict:
    """What the node's doors turned away so far (cumulative, for plots): per door and bound, the
    streams closed unread (swarm/p2p/doors.py, budget.py), and how late its loop ran (loop.py)."""
    for _ in range(3):  # the counters grow in the node's loop: a copy may meet a new key; try again
        try:
            return {"doors": node.doors.stats(), "streams_refused": dict(node.streams.refused),
                    "loop": node.loop_lag()}
        except RuntimeError:
            continue
    return {}


def make_learner(cfg: JoinConfig, node: SwarmNode, place, coll=None) -> tuple[Learner, SwarmLearnerLink, bool,
                                                                               JournalCursor]:
    """The learner and its link, resumed from the newest checkpoint if any; whether it resumed;
    and the journal cursor that checkpoint holds."""
    work = Path(cfg.workdir)
    metrics = MetricsWriter(work / "metrics.jsonl", work / "tensorboard" if cfg.tensorboard else None)
    log.info("learner computes on %s (float32 master weights)", place)
    tok = load_tokenizer(cfg.model)
    leader = None
    if coll is not None:
        leader = Leader(*_sharded_trainer(cfg, place, coll), coll)
        log.info("learner rank 0 of %d: FSDP2 over %d processes", coll.world, coll.world)
    journal = Journal(work / "journal.bin")
    # unproven samplers must be able to fill a step, to be audited at all
    link = SwarmLearnerLink(node, journal, cfg.learner.intake.for_step(cfg.learner.groups_per_step))
    cursor = JournalCursor(journal, link)
    learner = Learner(cfg.learner, load_model(cfg.model, torch.float32, place.device), tok, make_task(cfg.task, tok),
                      model_id=cfg.model, sampling=cfg.sampling, swarm=cfg.swarm, link=link, peer_id=node.peer_id,
                      checkpoint_dir=work / "checkpoints", metrics=metrics,
                      compute_dtype=place.autocast_dtype, leader=leader,
                      quarantine=Quarantine(work / "quarantine.bin"), checkpoint_extra=cursor.checkpoint_extra,
                      step_extra=lambda: door_counters(node),
                      # the folder's weights, loaded when an audit needs them: no copy held at size
                      base_weights=lambda: untie(load_model(cfg.model, torch.float32).state_dict())[0])
    ckpt = latest_checkpoint(work / "checkpoints")
    if ckpt is not None:
        learner.load_checkpoint(ckpt)
        log.info("resumed from %s at version %d", ckpt, learner.version)
    link.open_intake(learner, learner.restored_extra.get("journal_cursor", 0))
    cursor.saved = link.cursor
    cursor.compact()  # killed between a checkpoint and its compaction, say
    return learner, link, ckpt is not None, cursor


class LearnerRun:
    """A learner's loop: announce, read rollouts, step while a step's groups are in, give the
    device to its own sampler if it has one (`sampler,learner`), report; until stopped or done."""

    def __init__(self, cfg: JoinConfig, node: SwarmNode, place, coll=None,
                 make_local: Callable[[Learner], "LocalSampler"] | None = None) -> None:  # noqa: F821
        self.cfg, self.node = cfg, node
        self.learner, self.link, self.resumed, cursor = make_learner(cfg, node, place, coll)
        self.checkpoints = Checkpoints(self.learner, Path(cfg.workdir) / "checkpoints", cursor)
        self.local = make_local(self.learner) if make_local else None
        self.files = serve_model_files(cfg, node, self.learner.tok)
        self.report = LearnerReport(self.learner)
        self.last_data = time.monotonic()
        self.named = False
        """Whether a coordinator's swarm record names us (checked on each status line until it does)."""

    def run(self, stop: threading.Event) -> None:
        learner, cfg = self.learner, self.cfg
        self.card = self._card()
        heartbeat = Heartbeat([("announcing the learner", cfg.announce_every_s, self._announce)])
        try:  # announced while the first version is encoded and the first eval runs (minutes at size)
            learner.start()
            if not self.resumed:
                learner.run_eval()
        except BaseException:
            heartbeat.close()  # and no checkpoint: a learner that never started has nothing to keep
            raise
        tally, status = Every(cfg.tally_every_s), Every(cfg.status_every_s)
        peers = cfg.network.initial_peers
        log.info("volunteers join with: %s", volunteer_command(peers[:1], cfg.swarm, peers[1:]))
        made = False
        try:
            while not stop.is_set() and not self.done:
                heartbeat.check()
                self._between_steps(tally)
                survive("reading rollouts", lambda: self._read(self._wait_s(made)))
                while not self.done and learner.step() is not None:
                    with learner.phases("checkpoint"):
                        self.checkpoints.after_step()
                    self._between_steps(tally)  # steps back to back can take many minutes at size
                made = self._own_turn()
                if learner.leader is not None:
                    learner.leader.keepalive()
                if status():
                    log.info(self.report.line(time.monotonic() - self.last_data))
                    self.named = self.named or bool(survive("reading the swarm record",
                                                            lambda: check_named(self.node, cfg.model)))
            if self.done:
                if not learner.history or learner.history[-1].get("kind") != "eval":
                    learner.run_eval()
                log.info("reached version %d: stopping", learner.version)
        finally:
            heartbeat.close()
            self._close()

    @property
    def done(self) -> bool:
        return self.cfg.max_steps is not None and self.learner.version >= self.cfg.max_steps

    def _wait_s(self, made: bool) -> float:
        """How long to wait for rollouts: alone, half a second; beside our own sampler, only while
        it has no turn to take (it made nothing last time)."""
        if self.local is None:
            return 0.5
        return 0.0 if made else 0.2

    def _read(self, timeout: float) -> None:
        with self.learner.phases("waiting"):
            records = self.link.receive_rollouts(1000, timeout=timeout)
        if records:
            self.learner.ingest_many(records)
            self.last_data = time.monotonic()

    def _own_turn(self) -> bool:
        """The device's other turn: one batch of our own sampler's; whether it made any."""
        if self.local is None or self.done:
            return False
        with self.learner.phases("sampling"):
            made = self.local.turn() > 0
        if made:
            self.last_data = time.monotonic()
        return made

    def _between_steps(self, tally: Every) -> None:
        """What the announcement says now, and the tally when it is due."""
        self.card = self._card()
        if not tally():
            return
        # a new swarm's stand-in mates (swarm/discovery.py `seeders`); never a key an audit refused
        seeders = [s for s in self.link.weights.store.seeders() if not self.learner.is_refused(s)]
        if self.learner.credit.peers or seeders:
            survive("publishing the tally", lambda: publish_tally(self.node, self.learner, self.cfg.model, seeders))

    def _card(self) -> PeerInfo:
        """What the learner announces, made by the loop (the heartbeat's thread reads only this)."""
        learner, cfg = self.learner, self.cfg
        return PeerInfo(peer_id=self.node.peer_id, role="learner", model_id=cfg.model, version=learner.version,
                        engine="hf", throughput=round(self.report.rate() * cfg.sampling.group_size, 3),
                        accepts=accepted_models(cfg.learner, learner.checks.other_tokenizer_models()),
                        files=self.files.digest, files_bytes=self.files.nbytes)

    def _announce(self) -> None:
        self.node.announce(msgspec.structs.replace(self.card, maddrs=self.node.maddrs()), ttl=self.cfg.peer_ttl_s)

    def _close(self) -> None:
        learner = self.learner
        if self.local is not None:
            self.local.close()
        if learner.credit.peers:
            survive("publishing the tally", lambda: publish_tally(self.node, learner, self.cfg.model))
        learner.save_checkpoint(Path(self.cfg.workdir) / "checkpoints")
        if learner.leader is not None:
            learner.leader.stop()
        learner.metrics.close()
        log.info(self.report.summary())


def serve_model_files(cfg: JoinConfig, node: SwarmNode, tokenizer) -> FilesServer:
    """Serve what a sampler given no --model needs to run ours besides the weights (config,
    generation config, tokenizer) and the task and sampling it must draw with: its digest goes in
    our peer record (swarm/model_files.py)."""
    import dataclasses

    bundle = ModelFiles(model_id=cfg.model, files=model_files(cfg.model, tokenizer), task=task_to_dict(cfg.task),
                        sampling=dataclasses.asdict(cfg.sampling))
    server = FilesServer(node, bundle)
    log.info("serving %s's config and tokenizer to samplers (%d files, %.1f MB packed)", cfg.model,
             len(bundle.files), server.nbytes / 1e6)
    return server


def accepted_models(lc: LearnerConfig, other_tokenizers: set[str] = frozenset()) -> list[str]:
    """The other models a learner tells samplers it takes, so they send it their groups: those it
    names, and with "*" those of `foreign_tokenizers` whose tokenizer is not its own
    (`other_tokenizers`: what "*" admits as foreign). Never "*" itself, nor a model in its own
    tokenizer that it does not name: that sampler's groups are checked as the learner's own (audited
    against weights it never ran, and refused), so it must not be invited. Nothing when it drops them."""
    if lc.foreign_loss == "drop":
        return []
    named = {m for m in lc.foreign.accept_models if m != "*"}
    return sorted(named | (set(other_tokenizers) if "*" in lc.foreign.accept_models else set()))


def check_named(node: SwarmNode, model: str) -> bool:
    """Whether a coordinator we joined through names this learner, with our model or none; if not,
    samplers will not follow it (swarm/discovery.py), so say how to fix that, once per status line
    until it is fixed."""
    said = node.trusted_learners(node.coordinators).get(node.peer_id)
    if said in ("", model):
        log.info("the coordinator's swarm record names this learner: samplers will follow it")
        return True
    if said is None:
        log.warning("no coordinator names this learner (%s), so samplers will not follow it: restart the bootstrap "
                    "with --trusted-learner %s=%s (or add that line to its --learners-file; or samplers pin it with "
                    "--follow %s)", node.peer_id, node.peer_id, model, node.peer_id)
    else:
        log.warning("the swarm record says this learner (%s) trains %r, but it runs --model %r (or two coordinators "
                    "disagree), so no sampler will follow it: name it with --trusted-learner %s=%s", node.peer_id,
                    said, model, node.peer_id, model)
    return False


def publish_tally(node: SwarmNode, learner: Learner, model_id: str, seeders: Sequence[str] = ()) -> None:
    try:
        if not node.publish_tally(learner.credit.tally(node.peer_id, model_id, learner.version, learner.history,
                                                       seeders)):
            log.warning("the DHT did not store our contribution tally; retrying later")
    except Exception as e:  # the leaderboard can wait; training must not
        log.warning("could not publish the contribution tally: %s", e)
