"""A sampler given no --model runs the swarm's: the model of the learner its coordinators name, from
the bundle that learner serves (config, generation config, tokenizer; swarm/model_files.py) and the
weights of its keyframe. So the command a coordinator prints is all a volunteer pastes: no model
flag, no hub access, and a learner that trains a local checkpoint can be joined."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from node.config import from_dict, task_from_dict
from node.sampling.params import SamplingConfig
from swarm.directory.directory import REFRESH_S
from swarm.discovery import find_swarm_model, other_protocol_learners, skipped_for_protocol
from swarm.identity import short_id
from swarm.model_files import FetchFailed, fetch_from, held, unpack_to
from swarm.p2p import SwarmNode
from swarm.wire.model_files import ModelFiles
from swarm.wire.peer import PeerInfo

from cli.config import JoinConfig

log = logging.getLogger("hetero-node")

BUILT_IN_TASKS = ("arithmetic", "chain")
"""Tasks a sampler takes from the learner's bundle as they are: made from their table alone (a
dataset task reads files and may name a reward plugin, which is code: a sampler never runs a peer's)."""
ASK_EVERY_SECOND_S = 15.0
"""A sampler asks for the swarm's model every second this long, then backs off: samplers started
with their learner (`hetero-node demo`, a coordinator's script) find it seconds after it starts,
and a doubling wait would add up to as much again (1, 2, 4 s: the demo's samplers lost 2-3 s).
A lookup a second for 15 s is a few reads of the DHT's directory records a waiting sampler makes."""
FOLDER = "swarm-model"
"""Where in a sampler's workdir the bundle is unpacked, one folder per digest (the current one kept)."""


@dataclass(frozen=True)
class SwarmModel:
    """The swarm's model as this sampler runs it."""

    cfg: JoinConfig
    """The sampler's config with the learner's model name, task and sampling."""
    folder: Path
    """Its config and tokenizer files (no weights: they come as the learner's keyframe)."""
    learner: str


def adopt_swarm_model(cfg: JoinConfig, node: SwarmNode, stop: threading.Event) -> SwarmModel | None:
    """Wait for a named learner that serves a bundle, fetch it (or find it in the workdir) and say
    what this sampler now runs; None if stopped first."""
    backoff, t0, told, say_at = 1.0, time.monotonic(), None, 0.0
    while not stop.is_set():
        learner = find_swarm_model(node, cfg.follow)
        if learner is not None:
            try:
                bundle, folder = _bundle(cfg, node, learner, stop)
                return _adopted(cfg, bundle, folder, learner.peer_id)
            except (FetchFailed, ValueError) as e:  # a peer's bytes or tables: said, and asked again
                if stop.is_set():
                    return None
                log.warning("could not take the swarm's model from learner %s: %s; asking again in %.0f s",
                            short_id(learner.peer_id), e, backoff)
        elif skipped := other_protocol_learners(node, cfg.follow):
            if skipped != told:  # said once (again if it changes): the retries say nothing new
                told = skipped
                log.warning("waiting for a learner this node can talk to: %s", skipped_for_protocol(skipped))
        elif (waited := time.monotonic() - t0) >= say_at:  # said at 0, 1, 3, 7... s: not at every ask
            say_at = 2 * say_at + 1
            log.info("waiting for a learner the coordinator names to say which model this swarm trains (for %.0f s; "
                     "asking every %.0f s)", waited, backoff)
        stop.wait(backoff)
        if time.monotonic() - t0 >= ASK_EVERY_SECOND_S:
            # no longer than the directory takes to hear of a new learner: more only delays a volunteer
            backoff = min(backoff * 2, REFRESH_S)
    return None


def _bundle(cfg: JoinConfig, node: SwarmNode, learner: PeerInfo, stop: threading.Event) -> tuple[ModelFiles, Path]:
    """The bundle `learner`'s record names: the workdir's copy, else fetched from it (older copies removed)."""
    root = Path(cfg.workdir) / FOLDER
    folder = root / learner.files[:16]
    bundle = held(folder, learner.files)
    if bundle is None:
        t0 = time.monotonic()
        bundle = unpack_to(fetch_from(node, learner, stop), folder)
        log.info("took the swarm's model files from learner %s: %d files, %.1f MB in %.1f s", short_id(learner.peer_id),
                 len(bundle.files), learner.files_bytes / 1e6, time.monotonic() - t0)
    for old in root.iterdir():  # one model's files kept: the one run now
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)
    return bundle, folder


def _adopted(cfg: JoinConfig, bundle: ModelFiles, folder: Path, learner: str) -> SwarmModel:
    """`cfg` running the bundle's model, with the task and sampling the learner checks rollouts against."""
    adopted = adopt_bundle_tables(cfg, bundle)
    log.info("running the swarm's model %r (learner %s's config and tokenizer; its weights as it publishes them)",
             bundle.model_id, short_id(learner))
    return SwarmModel(adopted, folder, learner)


def adopt_bundle_tables(cfg: JoinConfig, bundle: ModelFiles) -> JoinConfig:
    """`cfg` with the bundle's model name, and its [task] (a built-in one) and [sampling]."""
    task = cfg.task
    if bundle.task.get("kind") in BUILT_IN_TASKS:
        task = task_from_dict(bundle.task, "the learner's task")
    elif bundle.task:  # its files are the coordinator's to hand out, and a reward plugin is code: never a peer's
        log.warning("the learner trains on a %r task: this sampler draws from its own [task] (%s), which must be the "
                    "learner's, with its files here; the coordinator says where to get them",
                    bundle.task.get("kind"), type(cfg.task).__name__)
    sampling = from_dict(SamplingConfig, bundle.sampling, "the learner's sampling") if bundle.sampling else cfg.sampling
    if task != cfg.task or sampling != cfg.sampling:
        log.info("drawing with the learner's task and sampling (%s; group size %d, temperature %g, top-p %g, "
                 "top-k %d, %d new tokens)", type(task).__name__, sampling.group_size, sampling.temperature,
                 sampling.top_p, sampling.top_k, sampling.max_new_tokens)
    return dataclasses.replace(cfg, model=bundle.model_id, task=task, sampling=sampling)
