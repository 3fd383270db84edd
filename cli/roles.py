"""What `hetero-node join` and `bootstrap` run: a role on the real swarm, until told to stop.

This is where a running node is assembled: the swarm side (`SwarmNode`, links, discovery) and the
node side (`Learner`, `Sampler`, engines) meet here and nowhere else. Order matters: the DHT
(which forks) starts before the model is loaded; every network wait has a timeout; a peer that
loses its counterpart waits and retries with backoff and says so; every `status_every_s` a role
logs one status line, and a summary when it stops; on stop the learner checkpoints, the sampler
closes its outbox, and the DHT and p2pd are shut down.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import msgpack

from node.config import SamplingConfig, TaskConfig
from node.device import check_spec, resolve
from node.engines import ENGINES
from node.engines.vllm import VLLMConfig
from node.learner import LearnerConfig
from node.models import BUILTIN_MODEL
from node.tasks import ArithmeticConfig
from cli.errors import UserError
from swarm.delay import DelayConfig
from swarm.dht import NetworkConfig
from swarm.discovery import LearnerTracker
from swarm.identity import Identity, short_id
from swarm.journal import Journal
from swarm.outbox import Outbox
from swarm.p2p import SwarmNode
from swarm.reach import serve_reachability, settle
from swarm.rollout_rpc import ReceiverConfig
from swarm.swarm_exchange import SwarmLearnerLink, SwarmSamplerLink
from swarm.weights import FetchConfig

log = logging.getLogger("hetero-node")

ROLES = ("sampler", "learner", "sampler,learner")
"""sampler,learner: both in one process on one device, sharing the weights (`run_both`)."""


@dataclass(frozen=True)
class SamplerRoleConfig:
    """The `[sampler]` table: how a sampler paces itself and what WAN delay it injects."""

    prompts_per_batch: int = 8
    """Prompts per generation batch (each gets sampling.group_size completions)."""
    max_outbox: int = 256
    """Pause generating while this many rollouts wait undelivered (learner away)."""
    max_learner_backlog: int = 32
    """Pause while the learner holds this many untrained groups, so that samplers do not run
    ahead of the learner and feed it ever staler rollouts (an async level bound)."""
    weight_delay: DelayConfig = field(default_factory=DelayConfig)
    """Injected delay before loading newer weights (docs/DESIGN.md, "Delay")."""
    rollout_delay: DelayConfig = field(default_factory=DelayConfig)
    """Injected delay before each rollout is sent."""
    fetch: FetchConfig = field(default_factory=FetchConfig)
    """How long a weight source may stall before the sampler asks the next (swarm/weight_rpc.py)."""

    def __post_init__(self) -> None:
        if self.prompts_per_batch < 1 or self.max_outbox < 1 or self.max_learner_backlog < 1:
            raise ValueError("sampler: prompts_per_batch, max_outbox and max_learner_backlog must be >= 1")


@dataclass
class JoinConfig:
    role: str = "sampler"
    """sampler (generate rollouts), learner (train on them), or sampler,learner (both in one
    process on one device, taking turns and sharing the weights, as an RL Swarm node does)."""
    swarm: str = "demo"
    model: str = BUILTIN_MODEL
    workdir: str = ""
    """Identity key, outbox, journal, checkpoints and metrics; default ./hetero-node-<role>."""
    name: str = ""
    """Sampler: display name on the leaderboard (at most 64 characters; shown escaped)."""
    device: str = "auto"
    """auto (a CUDA GPU where torch sees one, else the CPU), cpu, cuda or cuda:N."""
    dtype: str = "auto"
    """Compute dtype: float32 or bfloat16; auto is bfloat16 for a learner on a GPU (float32 master
    weights, bfloat16 forward) and float32 otherwise, samplers included (audits compare sampled
    tokens with the learner's float32 distribution)."""
    engine: str = "hf"
    """Sampler: 'hf' (transformers, anywhere) or 'vllm' (the vllm extra; settings in [vllm])."""
    follow: str | None = None
    """Learner peer id a sampler follows; default: the first learner found in the swarm."""
    nproc_per_node: int = 1
    """Learner: processes (GPUs) one learner trains on, with FSDP2 under torchrun; rank 0 is the
    swarm peer. `join` starts torchrun itself when this is > 1."""
    max_steps: int | None = None
    """Learner: stop (after a final eval and checkpoint) at this version."""
    seed: int = 0
    threads: int | None = None
    """torch CPU threads (default: $HETERO_NODE_THREADS, else torch's own choice)."""
    status_every_s: float = 30.0
    """Seconds between the one-line status reports in the log."""
    tally_every_s: float = 15.0
    """Learner: how often it publishes its per-sampler credit to the DHT (the leaderboard reads it)."""
    announce_every_s: float = 10.0
    peer_ttl_s: float = 30.0
    """PeerInfo records expire after this; a vanished peer is forgotten then."""
    tensorboard: bool = False
    """Learner: also write TensorBoard event files to <workdir>/tensorboard."""
    task: TaskConfig = field(default_factory=ArithmeticConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sampler: SamplerRoleConfig = field(default_factory=SamplerRoleConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {self.role!r}")
        check_spec(self.device, self.dtype)
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
        if len(self.name) > 64:
            raise ValueError(f"name has {len(self.name)} characters; at most 64")
        if self.nproc_per_node < 1 or (self.nproc_per_node > 1 and self.role != "learner"):
            raise ValueError("nproc_per_node must be >= 1, and > 1 only for a learner (not sampler,learner: one device)")
        if self.role == "sampler,learner" and self.engine != "hf":
            raise ValueError("sampler,learner generates with the learner's own model in memory: engine must be hf")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        if min(self.status_every_s, self.tally_every_s, self.announce_every_s, self.peer_ttl_s) <= 0:
            raise ValueError("status_every_s, tally_every_s, announce_every_s and peer_ttl_s must be > 0")
        self.workdir = self.workdir or f"hetero-node-{self.role.replace(',', '-')}"

    @property
    def identity_path(self) -> Path:
        return Path(self.workdir) / "identity.key"


class Every:
    """True once every `seconds` (the first call too): the pacing of periodic work in role loops."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self._last = seconds, float("-inf")

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.seconds:
            return False
        self._last = now
        return True


def _start_node(cfg: JoinConfig) -> SwarmNode:
    threads = cfg.threads or int(os.environ.get("HETERO_NODE_THREADS", "0"))
    if threads:
        import torch

        torch.set_num_threads(threads)
    Path(cfg.workdir).mkdir(parents=True, exist_ok=True)
    identity = Identity.load_or_create(cfg.identity_path)
    learns = cfg.role in ("learner", "sampler,learner")
    net, _ = settle(cfg.network, unknown_is_public=learns)
    if learns and net.client_mode:
        # every sampler must reach it; through a relay all of it would cross the coordinator's
        # bootstrap, within the relay's limits (docs/DESIGN.md, "The real internet")
        raise UserError("a learner behind a NAT cannot be reached by samplers",
                        f"forward TCP port {net.port or 31338} on your router to this machine and pass --public-ip "
                        f"<your public address> --port {net.port or 31338}, or run the learner on a machine with a "
                        "public address")
    node = SwarmNode(identity, net, cfg.swarm)
    log.info("%s %s joined swarm %r; listening on %s", cfg.role, node.peer_id, cfg.swarm, " ".join(node.maddrs()))
    if cfg.network.public_ip:  # now that we listen (on the port we were given, or the one picked for us)
        reachability_check(cfg.network.port or tcp_port(node.maddrs()), cfg.network.public_ip)
    return node


def tcp_port(maddrs: list[str]) -> int:
    """The TCP port of the first of `maddrs` that has one (0 if none)."""
    return next((int(m.split("/tcp/")[1].split("/")[0]) for m in maddrs if "/tcp/" in m), 0)


def reachability_check(port: int, public_ip: str | None) -> None:
    """Petals-style self-check: can this machine be reached at the address it announces?"""
    import socket

    if not public_ip:
        return
    try:
        with socket.create_connection((public_ip, port), timeout=3):
            log.info("reachability: %s:%d accepts connections", public_ip, port)
    except OSError as e:
        log.warning(
            "reachability: cannot connect to %s:%d (%s). Open TCP port %d in your firewall and forward it on "
            "your router to this machine, or run with --client-mode to reach the swarm through relays.",
            public_ip, port, e, port)


def _public_first(maddrs: list[str]) -> list[str]:
    """Addresses a volunteer elsewhere can dial first: loopback ones only work on this machine."""
    return sorted(maddrs, key=lambda m: m.startswith(("/ip4/127.", "/ip6/::1/")))


def volunteer_command(maddrs: list[str], swarm: str, others: list[str] = ()) -> str:
    """The exact command volunteers paste to join this swarm as samplers: this bootstrap's first
    public address, then the coordinator's `others` (a volunteer joins through any one alive)."""
    where = f" --swarm {swarm}" if swarm != "demo" else ""
    peers = "".join(f" --initial-peers {m}" for m in [_public_first(maddrs)[0], *others])
    return f"hetero-node join --role sampler{where}{peers}"


def parse_learners(entries: list[str], where: str = "--trusted-learner") -> dict[str, str]:
    """`PEER_ID` or `PEER_ID=MODEL` entries -> {peer id: model ("" = unstated)}."""
    out: dict[str, str] = {}
    for entry in entries:
        peer, _, model = entry.strip().partition("=")
        peer, model = peer.strip(), model.strip()
        if not peer or len(peer) > 64 or any(c.isspace() for c in peer):
            raise UserError(f"{where}: {entry!r} is not a peer id",
                            "give PEER_ID or PEER_ID=MODEL, as `hetero-node peer-id <learner workdir>` prints it")
        out[peer] = model
    return out


def read_learners_file(path: Path) -> dict[str, str]:
    """A coordinator's learners file: one `PEER_ID` or `PEER_ID=MODEL` per line, `#` comments."""
    try:
        lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read the learners file {path}: {e}",
                        "give a text file with one <peer id>[=<model>] per line") from None
    return parse_learners([line for line in lines if line], str(path))


def run_bootstrap(identity_path: str, net: NetworkConfig, swarm: str, stop: threading.Event,
                  on_ready: Callable[[list[str]], None] | None = None, learners: dict[str, str] | None = None,
                  model_id: str = "", learners_file: Path | None = None, every_s: float = 20.0) -> None:
    """A coordinator's entry point; it signs the swarm record naming the `learners` samplers follow,
    each with its model, and those of `learners_file`, re-read every `every_s` seconds, so that a
    learner is added to (or removed from) a running swarm by editing that file."""
    node = SwarmNode(Identity.load_or_create(identity_path), net, swarm)
    serve_reachability(node)  # joining peers ask it whether they can be dialled (swarm/reach.py)
    named, listed = dict(learners or {}), LearnersFile(learners_file)
    if not named and learners_file is None:
        log.warning("no --trusted-learner given: samplers of swarm %r will follow only a learner they pin "
                    "with --follow", swarm)
    try:
        if on_ready:
            on_ready(node.maddrs())
        while not stop.is_set():
            node.announce({"role": "bootstrap", "model_id": "", "version": 0, "engine": "", "throughput": 0.0,
                           "maddrs": node.maddrs()}, ttl=60)
            current = {**named, **listed.read()}
            if current and not node.publish_swarm_record(current, model_id, ttl=60):
                log.warning("the DHT did not store the swarm record; retrying in %.0f s", every_s)
            stop.wait(every_s)
    finally:
        node.shutdown()


class LearnersFile:
    """A coordinator's learners file, re-read on every call; on an unreadable or malformed file, the
    last good entries (logged), so a typo does not drop the swarm's learners."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.last = path, {}

    def read(self) -> dict[str, str]:
        if self.path is None:
            return {}
        try:
            now = read_learners_file(self.path) if self.path.exists() else {}
        except UserError as e:
            log.warning("learners file %s: %s; keeping the learners it named before", self.path, e)
            return self.last
        if now != self.last:
            log.info("learners file %s names %d learner(s): %s", self.path, len(now),
                     ", ".join(f"{short_id(k)}{'=' + v if v else ''}" for k, v in sorted(now.items())) or "none")
        self.last = now
        return now


# ---- learner ---------------------------------------------------------------------------------------

def run_learner(cfg: JoinConfig, stop: threading.Event) -> None:
    """One learner process; under torchrun (WORLD_SIZE > 1) rank 0 is the swarm peer and leads,
    the other ranks only follow its training steps (node/distributed.py) and join no swarm."""
    from node.distributed import init_from_env

    place = resolve(cfg.device, cfg.dtype)
    coll = init_from_env(place.device.type)
    if coll is not None and coll.rank > 0:
        try:
            _learner_follower(cfg, place, coll)
        finally:
            coll.close()
        return
    node = _start_node(cfg)
    try:
        _learner_loop(cfg, node, stop, place, coll)
    finally:
        node.shutdown()
        if coll is not None:
            coll.close()


def _sharded_trainer(cfg: JoinConfig, place, coll):
    """This rank's FSDP2 shard of the model and its AdamW (float32 master weights; bfloat16
    compute through FSDP's mixed-precision policy where the dtype says so)."""
    import torch

    from node.distributed import shard
    from node.models import load_model

    lm = load_model(cfg.model, torch.float32, coll.device)
    if cfg.learner.gradient_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    module = shard(lm, param_dtype=place.autocast_dtype)
    return module, torch.optim.AdamW(module.parameters(), lr=cfg.learner.lr, weight_decay=0.0)


def _learner_follower(cfg: JoinConfig, place, coll) -> None:
    from node.distributed import follow

    module, optimizer = _sharded_trainer(cfg, place, coll)
    log.info("learner rank %d of %d: following rank 0", coll.rank, coll.world)
    steps = follow(module, optimizer, coll)
    log.info("learner rank %d: stopped after %d steps", coll.rank, steps)


def _make_learner(cfg: JoinConfig, node: SwarmNode, place, coll=None):
    from node.checkpoint import latest_checkpoint
    from node.learner import Learner
    from node.metrics import MetricsWriter
    from node.models import load_model, load_tokenizer
    from node.tasks import make_task

    import torch

    work = Path(cfg.workdir)
    metrics = MetricsWriter(work / "metrics.jsonl", work / "tensorboard" if cfg.tensorboard else None)
    log.info("learner computes on %s (float32 master weights)", place)
    tok = load_tokenizer(cfg.model)
    leader = None
    if coll is not None:
        from node.distributed import Leader

        leader = Leader(*_sharded_trainer(cfg, place, coll), coll)
        log.info("learner rank 0 of %d: FSDP2 over %d processes", coll.world, coll.world)
    learner = Learner(cfg.learner, load_model(cfg.model, torch.float32, place.device), tok, make_task(cfg.task, tok),
                      model_id=cfg.model, sampling=cfg.sampling, swarm=cfg.swarm, peer_id=node.peer_id,
                      checkpoint_dir=work / "checkpoints", metrics=metrics,
                      compute_dtype=None if leader else place.autocast_dtype, leader=leader)
    ckpt = latest_checkpoint(work / "checkpoints")
    if ckpt is not None:
        learner.load_checkpoint(ckpt)
        log.info("resumed from %s at version %d", ckpt, learner.version)
    journal, quarantine = Journal(work / "journal.bin"), Journal(work / "quarantine.bin")
    lc = cfg.learner
    intake = ReceiverConfig(  # unproven samplers must be able to fill a step, to be audited at all
        quota=lc.quota_per_sampler, rate=lc.rate_per_sampler, byte_rate=lc.byte_rate_per_sampler,
        journal_bytes=lc.journal_bytes_per_sampler, unproven_quota=max(lc.unproven_quota, lc.groups_per_step),
        unproven_rate=lc.unproven_rate, unproven_byte_rate=lc.unproven_byte_rate,
        unproven_journal_bytes=lc.unproven_journal_bytes)
    link = SwarmLearnerLink(node, journal, cursor=learner.restored_extra.get("journal_cursor", 0),
                            rejected=learner.drops, untrained=learner.untrained_by, check=learner.precheck,
                            intake=intake, is_proven=learner.is_proven, is_refused=lambda peer: peer in learner.refusals,
                            throttled=learner.throttled)
    learner.link = link
    learner.quarantine = lambda raw, why: quarantine.append([msgpack.packb([why, raw])])
    saved = {"cursor": link.cursor}

    def checkpoint_extra() -> dict:
        saved["cursor"] = link.cursor  # what this checkpoint has consumed: compactable once it is on disk
        return {"journal_cursor": saved["cursor"]}

    learner.checkpoint_extra = checkpoint_extra
    return learner, link, ckpt is not None, lambda: journal.compact(saved["cursor"])


def _learner_loop(cfg: JoinConfig, node: SwarmNode, stop: threading.Event, place, coll=None,
                  make_local: Callable[[object], "LocalSampler"] | None = None) -> None:
    learner, link, resumed, compact_journal = _make_learner(cfg, node, place, coll)
    local = make_local(learner) if make_local else None
    report = LearnerReport(learner)
    learner.start()
    if not resumed:
        learner.run_eval()
    announce, tally, status = Every(cfg.announce_every_s), Every(cfg.tally_every_s), Every(cfg.status_every_s)
    last_data, named, made = time.monotonic(), False, False
    peers = cfg.network.initial_peers
    log.info("volunteers join with: %s", volunteer_command(peers[:1], cfg.swarm, peers[1:]))
    try:
        while not stop.is_set():
            if announce():
                node.announce({"role": "learner", "model_id": cfg.model, "version": learner.version, "engine": "hf",
                               "throughput": round(report.rate() * cfg.sampling.group_size, 3), "maddrs": node.maddrs(),
                               "accepts": accepted_models(cfg.learner, _other_tokenizers(learner))}, ttl=cfg.peer_ttl_s)
            if tally() and learner.tally.peers:
                _publish_tally(node, learner, cfg.model)
            # alone, the loop waits for rollouts; beside our own sampler, only while it has no turn to take
            records = link.receive_rollouts(1000, timeout=0.5 if local is None else (0.0 if made else 0.2))
            if records:
                learner.ingest_many(records)
                last_data = time.monotonic()
            while not _done(cfg, learner) and learner.step() is not None:
                pass
            made = local is not None and not _done(cfg, learner) and local.turn() > 0
            if made:
                last_data = time.monotonic()  # the device's other turn: one batch of our own
            compact_journal()  # the journal keeps only what no checkpoint holds yet
            if learner.leader is not None:
                learner.leader.keepalive()
            if status():
                log.info(report.line(time.monotonic() - last_data))
                named = named or _check_named(node, cfg.model)
            if _done(cfg, learner):
                if learner.history[-1].get("kind") != "eval":
                    learner.run_eval()
                log.info("reached version %d: stopping", learner.version)
                break
    finally:
        if local is not None:
            local.close()
        if learner.tally.peers:
            _publish_tally(node, learner, cfg.model)
        learner.save_checkpoint(Path(cfg.workdir) / "checkpoints")
        if learner.leader is not None:
            learner.leader.stop()
        learner.metrics.close()
        log.info(report.summary())


def accepted_models(lc: LearnerConfig, other_tokenizers: set[str] = frozenset()) -> list[str]:
    """The other models a learner tells samplers it takes, so they send it their groups: those it
    names, and with "*" those of `foreign_tokenizers` whose tokenizer is not its own
    (`other_tokenizers`: what "*" admits as foreign). Never "*" itself, nor a model in its own
    tokenizer that it does not name: that sampler's groups are checked as the learner's own (audited
    against weights it never ran, and refused), so it must not be invited. Nothing when it drops them."""
    if lc.foreign_loss == "drop":
        return []
    named = {m for m in lc.accept_models if m != "*"}
    return sorted(named | (set(other_tokenizers) if "*" in lc.accept_models else set()))


def _other_tokenizers(learner) -> set[str]:
    """Models of `foreign_tokenizers` whose tokenizer differs from the learner's own."""
    return {m for m, (_, h) in learner.foreign_toks.items() if h != learner.tokenizer_id}


# ---- sampler and learner in one process ----------------------------------------------------------

def run_both(cfg: JoinConfig, stop: threading.Event) -> None:
    """`join --role sampler,learner`: a learner and a sampler of its model in one process on one
    device, as an RL Swarm node is. They take turns (a training step when a step's groups are in,
    then one batch of generation) and share the weights: the sampler generates with the learner's
    own model object, so it is always on-policy and nothing is copied or sent to it. The node is a
    learner on the swarm (named by the coordinator, followed by samplers of its model, fed by
    samplers of the models it takes); its own groups go to its learner in memory and a copy of
    each to the partner learners that take its model, as a sampler's do."""
    place = resolve(cfg.device, cfg.dtype)
    node = _start_node(cfg)
    outbox = Outbox(Path(cfg.workdir) / "outbox.db")
    try:
        _learner_loop(cfg, node, stop, place, make_local=lambda learner: LocalSampler(cfg, node, learner, outbox))
    finally:
        outbox.close()
        node.shutdown()


class LocalSampler:
    """The sampler half of `run_both`."""

    def __init__(self, cfg: JoinConfig, node: SwarmNode, learner, outbox: Outbox) -> None:
        from node.engines.hf import HFEngine
        from node.models import tokenizer_hash
        from node.sampler import Sampler
        from swarm.rollout_rpc import RolloutSender

        self.learner = learner
        self.engine = HFEngine(learner.model, learner.tok, cfg.model)  # the learner's weights, not a copy
        self.sampler = Sampler(node.peer_id, learner.task, self.engine, tokenizer_hash(learner.tok),
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
        lr = self.learner
        self.tracker.refresh()
        if lr.untrained_by(lr.peer_id) >= self.room:
            return 0
        # the records say which weights made them: the learner's, now (train_step leaves the model in eval mode)
        self.engine.version, self.sampler.chain = lr.version, lr.chain
        records = [(g, g.encode()) for g in self.sampler.produce()]  # encoded once, for both
        for g, raw in records:
            if (why := lr.ingest_own(g, raw)) is not None:
                lr.drops[why] += 1
        self.sender.send([(g.id, raw) for g, raw in records])
        self.groups += len(records)
        return len(records)

    def close(self) -> None:
        self.sender.close()
        fed = "; ".join(f"{short_id(p)} took {st['delivered']}" for p, st in sorted(self.sender.partner_stats.items()))
        log.info("own sampler made %d groups%s", self.groups, f"; partner learners: {fed}" if fed else "")


def _check_named(node: SwarmNode, model: str) -> bool:
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


def _done(cfg: JoinConfig, learner) -> bool:
    return cfg.max_steps is not None and learner.version >= cfg.max_steps


def _publish_tally(node: SwarmNode, learner, model_id: str) -> None:
    try:
        if not node.publish_tally(learner.tally.record(node.peer_id, model_id, learner.version, learner.history)):
            log.warning("the DHT did not store our contribution tally; retrying later")
    except Exception as e:  # the leaderboard can wait; training must not
        log.warning("could not publish the contribution tally: %s", e)


class LearnerReport:
    """The learner's status line and exit summary, from its own counters."""

    def __init__(self, learner) -> None:
        self.learner, self.t0 = learner, time.monotonic()
        self.v0, self.trained0 = learner.version, self._trained()

    def _trained(self) -> int:
        return sum(self.learner.accepted_by_sampler.values())

    def _evals(self) -> list[float]:
        return [r["eval_acc"] for r in self.learner.history if r["kind"] == "eval"]

    def rate(self) -> float:
        """Groups trained on per second since this session started."""
        return round((self._trained() - self.trained0) / max(time.monotonic() - self.t0, 1e-6), 3)

    def line(self, idle_s: float) -> str:
        lr = self.learner
        steps = [r for r in lr.history if r["kind"] == "step"]
        evals = self._evals()
        parts = [f"learner v{lr.version}",
                 f"reward {steps[-1]['reward']:.2f}" if steps else "reward -",
                 f"eval {evals[-1]:.1%}" if evals else "eval -",
                 f"samplers {len(lr.accepted_by_sampler)}",
                 f"{self.rate() * lr.sampling.group_size:.1f} rollouts/s",
                 f"buffer {len(lr.buffer)}", f"dropped {sum(lr.drops.values())}"]
        if idle_s > 30:
            parts.append(f"no rollouts for {idle_s:.0f} s: waiting for samplers")
        return " | ".join(parts)

    def summary(self) -> str:
        lr, evals = self.learner, self._evals()
        acc = f"eval {evals[0]:.1%} -> {evals[-1]:.1%}" if evals else "no eval"
        drops = ", ".join(f"{k} {v}" for k, v in sorted(lr.drops.items())) or "none"
        return (f"learner stopped at version {lr.version} ({lr.version - self.v0} this session, "
                f"{time.monotonic() - self.t0:.0f} s): {self._trained() - self.trained0} groups trained on from "
                f"{len(lr.accepted_by_sampler)} samplers; {acc}; dropped: {drops}; checkpoint in "
                f"{lr.checkpoint_dir}")


# ---- sampler ---------------------------------------------------------------------------------------

def run_sampler(cfg: JoinConfig, stop: threading.Event) -> None:
    node = _start_node(cfg)
    outbox = Outbox(Path(cfg.workdir) / "outbox.db")
    link = None
    try:
        tracker = LearnerTracker(node, cfg.follow, cfg.model)
        link = SwarmSamplerLink(node, outbox, lambda: tracker.current, cfg.sampler.weight_delay,
                                cfg.sampler.rollout_delay, cfg.seed, mates=lambda: tracker.mates,
                                fetch=cfg.sampler.fetch, partners=lambda: tracker.partners,
                                max_partner_owed=cfg.sampler.max_outbox)
        sampler = _make_sampler(cfg, node)
        _sampler_loop(cfg, node, outbox, link, sampler, tracker, stop)
    finally:
        if link is not None:
            link.close()
            log.info("sampler stopped: %d groups delivered, %d refused by the learner, %d left in the outbox "
                     "(sent when you join again)%s", link.rollouts.stats["delivered"], link.rollouts.stats["rejected"],
                     len(outbox), _partner_summary(link))
        outbox.close()
        node.shutdown()


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
    if tracker.follow:
        return f"waiting for the learner --follow names ({short_id(tracker.follow)}) to appear in swarm {swarm!r}"
    if tracker.ignored:
        return (f"waiting for a learner the coordinator names: {len(tracker.ignored)} learner(s) seen in swarm "
                f"{swarm!r}, none named by the bootstrap's swarm record (its --trusted-learner), so none is followed; "
                "pin one with --follow PEER_ID")
    if tracker.named_models:
        return (f"waiting for a learner of model {tracker.model_id!r} or one that takes its rollouts: the learners "
                f"in swarm {swarm!r} train {', '.join(map(repr, tracker.named_models))} and none names "
                f"{tracker.model_id!r} in its learner.accept_models; join with --model set to one of theirs")
    return f"waiting for a learner to join swarm {swarm!r} (none seen yet; is --swarm the coordinator's?)"


def _make_sampler(cfg: JoinConfig, node: SwarmNode):
    from node.engines import make_engine
    from node.models import load_tokenizer, tokenizer_hash
    from node.sampler import Sampler
    from node.tasks import make_task

    tok = load_tokenizer(cfg.model)
    # auto is float32 for samplers on every device: learners audit sampled tokens against their
    # float32 distribution, and bfloat16 numerics move the CDF intervals by more than the
    # audit's tolerance on some tokens (docs/DESIGN.md, "Scale"); bfloat16 only when asked for
    place = resolve(cfg.device, "float32" if cfg.dtype == "auto" else cfg.dtype)
    log.info("sampler generates on %s", place)
    engine = make_engine(cfg.engine, cfg.model, tok, cfg.vllm, placement=place)
    return Sampler(node.peer_id, make_task(cfg.task, tok), engine, tokenizer_hash(tok), sampling=cfg.sampling,
                   swarm=cfg.swarm, prompts_per_batch=cfg.sampler.prompts_per_batch, seed=cfg.seed)


def _sampler_loop(cfg: JoinConfig, node: SwarmNode, outbox: Outbox, link: SwarmSamplerLink, sampler,
                  tracker: LearnerTracker, stop: threading.Event) -> None:
    announce, status = Every(cfg.announce_every_s), Every(cfg.status_every_s)
    backoff, groups, t0, force = 1.0, 0, time.monotonic(), True
    while not stop.is_set():
        rate = groups * cfg.sampling.group_size / max(time.monotonic() - t0, 1e-6)  # rollouts/s
        if announce():
            node.announce({"role": "sampler", "model_id": cfg.model, "version": sampler.version, "engine": cfg.engine,
                           "throughput": round(rate, 3), "maddrs": node.maddrs(), "name": cfg.name,
                           "learner": tracker.current or ""}, ttl=cfg.peer_ttl_s)
        if status():
            log.info("sampler v%d | groups made %d | acknowledged %d | outbox %d | learner %s | partners %d | "
                     "%.1f rollouts/s", sampler.version, groups, link.rollouts.stats["delivered"], len(outbox),
                     short_id(tracker.current) if tracker.current else "none yet", len(tracker.partners), rate)
        tracker.refresh(force=force)
        if not tracker.any:
            log.info("%s (for %.0f s; retrying in %.0f s)", _waiting_for(tracker, cfg.swarm), time.monotonic() - t0,
                     backoff)
            stop.wait(backoff)
            backoff, force = min(backoff * 2, 30.0), True
            continue
        backoff, force = 1.0, False
        if _held_back(cfg, outbox, link, tracker):
            stop.wait(0.2)  # the learner is behind or away: do not generate without bound
            continue
        groups += sampler.run_once(link)
