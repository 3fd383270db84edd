"""Which learner a sampler follows, which learners it also feeds, and which samplers are its mates,
from the DHT's records.

A peer that merely announces `role = learner` is never followed: a sampler follows a learner its
swarm's coordinator names in the swarm record it signed (the coordinators are the bootstrap peers
the sampler was pointed at: the /p2p/ ids of --initial-peers), or one the user pins (--follow).

A swarm may name several learners, each training its own model (docs/DESIGN.md, "Several
learners"). A sampler follows the one of its own model (it loads that learner's weights) and
sends a copy of each group to every other named learner that says it takes its model (`accepts`
in its peer record): its *partners*, which correct those groups with F-TIS. With no learner of
its own model, a sampler only feeds partners and keeps its own weights.

Peers of another wire protocol (`PeerInfo.protocol`: swarm/wire/peer.py says what each changed) are
neither followed, nor fed, nor mates: their calls would fail one by one (a manifest a sampler cannot
read, chunks it cannot ask for), so a node says once which learners it skips and why.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Protocol

from swarm.identity import short_id
from swarm.p2p import SwarmNode
from swarm.dht.records import named_by
from swarm.wire.peer import PROTOCOL, PeerInfo, SwarmRecord
from swarm.wire.tally import Tally

log = logging.getLogger(__name__)


def takes(learner: PeerInfo, model_id: str) -> bool:
    """Whether a learner's peer record names `model_id` among the other models it trains on (learners
    name them one by one: cli/roles/learner.py, `accepted_models`)."""
    return learner.model_id != model_id and model_id in learner.accepts


@dataclass
class Choice:
    """What a sampler of one model makes of the swarm's records (`choose`)."""

    follow: str | None
    """The learner it follows (loads the weights of, sends every group to)."""
    partners: list[str]
    """Learners of other models that take its model: each gets a copy of every group."""
    mates: list[str]
    """Samplers following the same learner with the same model that peers can dial (not private):
    they share version downloads."""
    disputed: list[str]
    """Named learners announcing another model than the swarm record gives them: followed and fed by
    no one (the coordinator's word and the learner's disagree: a misconfiguration, or a lie)."""
    models: list[str]
    """Models the live named learners train (what a sampler of another model could join with)."""
    other_protocol: dict[str, int]
    """Named (or pinned) learners speaking another wire protocol than ours -> theirs: skipped."""


def choose(peers: list[PeerInfo], trusted: dict[str, str], model_id: str, pin: str | None = None) -> Choice:
    """From live peer records and the learners our coordinators name (-> the model each record gives
    it, "" if none), the learner a sampler of `model_id` follows and the ones it feeds: the pinned
    one if live (whatever its model: the user said so), else the first named one of its model."""
    trusted = {pin: ""} if pin else trusted
    other = {p.peer_id: p.protocol for p in peers if p.role == "learner" and p.peer_id in trusted and p.protocol != PROTOCOL}
    live = {p.peer_id: p for p in peers if p.role == "learner" and p.protocol == PROTOCOL}
    disputed = sorted(pid for pid, p in live.items() if trusted.get(pid) and trusted[pid] != p.model_id)
    named = {pid: p for pid, p in live.items() if pid in trusted and pid not in disputed}
    ours = sorted(pid for pid, p in named.items() if p.model_id == model_id)
    pick = pin if pin in named else (ours[0] if ours else None)
    return Choice(
        follow=pick,
        partners=sorted(pid for pid, p in named.items() if pid != pick and takes(p, model_id)),
        mates=sorted(p.peer_id for p in peers if is_mate(p, pick, model_id)) if pick else [],
        disputed=disputed,
        models=sorted({p.model_id for p in named.values()}),
        other_protocol=other)


def protocol_mismatch(theirs: int) -> str:
    """What a peer of wire protocol `theirs` means for this node, and what would fix it."""
    if theirs > PROTOCOL:
        return (f"wire protocol {theirs} there, {PROTOCOL} here: this hetero-node is older than the swarm's; "
                "update it (git pull, then the README's install line again)")
    return (f"wire protocol {theirs} there, {PROTOCOL} here: the swarm runs an older hetero-node; "
            "run the version it runs, or wait for its coordinator to update")


def skipped_for_protocol(other: dict[str, int]) -> str:
    """What a node waiting with only learners of another protocol (-> theirs) tells its user."""
    return f"the {len(other)} learner(s) named speak another wire protocol: {protocol_mismatch(max(other.values()))}"


def swarm_model(records: list[SwarmRecord], peers: list[PeerInfo], pin: str | None = None) -> PeerInfo | None:
    """The learner whose model a sampler given no model runs (its bundle: swarm/model_files.py), from
    our coordinators' swarm `records` and the live `peers`' records: the pinned one if live, else the
    first named learner (by id) that serves a bundle of the model the records name (`model_id`), else of
    any model; never one whose announced model the records contradict. None while there is none."""
    trusted = {pin: ""} if pin else named_by(records)
    wanted = next((r.model_id for r in records if r.model_id), "")
    serving = sorted((p for p in peers if p.role == "learner" and p.files and p.peer_id in trusted
                      and trusted[p.peer_id] in ("", p.model_id) and p.protocol == PROTOCOL), key=lambda p: p.peer_id)
    return next((p for p in serving if p.model_id == wanted), None) or (serving[0] if serving else None)


def find_swarm_model(node: SwarmNode, pin: str | None = None) -> PeerInfo | None:
    """`swarm_model` on what `node` reads now: its coordinators' swarm records and the peer records of
    the learners they name (or of the pinned one)."""
    records, learners = _named_learners(node, pin)
    return swarm_model(records, learners, pin)


def _named_learners(node: SwarmNode, pin: str | None) -> tuple[list[SwarmRecord], list[PeerInfo]]:
    """Our coordinators' swarm records, and the peer records of the learners they name (or of the pinned one)."""
    records = node.swarm_records(node.coordinators)
    named = [pin] if pin else sorted({learner for r in records for learner in r.learners})
    return records, list(node.peer_records(named).values())


def other_protocol_learners(node: SwarmNode, pin: str | None = None) -> dict[str, int]:
    """The learners our coordinators name (or the pinned one) that speak another wire protocol than
    ours -> theirs: why `find_swarm_model` finds none (read again on the waiting path only)."""
    return {p.peer_id: p.protocol for p in _named_learners(node, pin)[1] if p.role == "learner" and p.protocol != PROTOCOL}


def is_mate(peer: PeerInfo, learner: str | None, model_id: str) -> bool:
    """Whether a peer record is a sampler of `model_id` following `learner` that peers can dial, and
    that speaks our protocol."""
    return (peer.role == "sampler" and peer.learner == learner and peer.model_id == model_id and not peer.private
            and peer.protocol == PROTOCOL)


MAX_MATES = 64
"""Mates one sampler shares downloads with: a version's chunks are spread over them (`chunk_owner`),
so more would only make each one's share smaller than a chunk."""


def earned(mates: list[str], tallies: list[Tally], learner: str | None) -> list[str]:
    """The `mates` that `learner`'s own signed tally credits (it trained on their checked groups),
    at most MAX_MATES, the most credited first, then sorted (every sampler computes the same owners);
    while it credits none of them, the `mates` it names as seeders (`seeders`: a new swarm).

    A peer record costs a fresh key and nothing else: 2,000 of them (our learner and model, a
    black-hole address) became every sampler's mates, each version waited on dead chunk owners,
    the honest rate fell to x0.20 and then 0 (issue 39). Credit costs checked work, and only the
    learner can give it (a tally's `learner` is its signer). A new sampler is a mate once the
    learner has trained on its groups and published its tally (`tally_every_s`)."""
    tally = next((t for t in tallies if t.learner == learner), None)
    credit = credits(tally)
    ranked = sorted((m for m in mates if credit.get(m, 0) > 0), key=lambda m: (-credit[m], m))
    if ranked:
        return sorted(ranked[:MAX_MATES])
    checked = set(mates)
    return sorted([m for m in seeders(tally) if m in checked][:SEEDER_MATES])


SEEDER_MATES = 16
"""Seeders a sampler shares downloads with at most (the first public ones its learner's tally
names): each owns 1/16 of a version, taken from the learner and forwarded to the rest."""


def seeders(tally: Tally | None) -> list[str]:
    """The peers a tally names as seeders, in its order: the first its learner served its newest
    keyframe whole to, not credited or refused (swarm/weights/chunks.py `ChunkStore.seeders`). While
    no sampler the learner credits is a mate we can read, every sampler of a new swarm fetched every
    version whole from it, one upload per sampler (a 0.6B keyframe to 1,000 samplers at 100 Mbit/s:
    27 hours); its seeders stand in for mates then.

    Not reopening issue 39: a seeder costs a key the keyframe, whole, from the learner, within its
    door's pool for unproven keys (swarm/weights/chunks.py NEWCOMERS_AT_ONCE), before the first
    MAX_SEEDERS that did; the list is fixed until the next keyframe. A seeder that never serves is
    hedged to the learner, not to other seeders (swarm/weights/fetcher.py), once per download
    before it is demoted: what a new swarm cost before seeders, plus one hedge time."""
    return list(tally.seeders) if tally is not None and tally.seeders else []


def credits(tally: Tally | None) -> dict[str, int]:
    """peer -> rollouts a tally credits it with (those credited at all)."""
    peers = tally.peers if tally is not None else {}
    return {peer: c.rollouts for peer, c in peers.items() if c.rollouts > 0}


def most_recent(tally: Tally | None, n: int) -> list[str]:
    """The `n` credited peers a tally credited last (ties by id): whose records a sampler reads for
    mates. By time, not by credit: a tally is cumulative, so after 128 long-gone samplers earned more
    than a newcomer, the newcomer would never be read (and never be anyone's mate)."""
    credit = credits(tally)
    return sorted(credit, key=lambda m: (-tally.peers[m].last, m))[:n]


class Peers(Protocol):
    """Whom a sampler deals with, as discovery keeps it up to date (`LearnerTracker`): what its link's
    sender and fetcher read each time they act."""

    @property
    def current(self) -> str | None:
        """The learner it follows (None: none yet)."""
        ...

    @property
    def partners(self) -> list[str]:
        """Learners of other models that take its model's groups."""
        ...

    @property
    def mates(self) -> list[str]:
        """Samplers it shares version downloads with (credited by its learner, or its seeders)."""
        ...

    @property
    def seeding(self) -> bool:
        """Whether `mates` are its learner's seeders (a new swarm), not samplers it credits."""
        ...


class LearnerTracker:
    """`choose` on the DHT's records, re-checked every `every` seconds, so that a vanished learner
    (its record expired) is noticed and another found; says what changed, once.

    Each refresh reads a bounded number of records, whatever the DHT holds (issue 39): the swarm
    records of our coordinators, the peer records of the learners they name, our learner's tally,
    and the peer records of the `2 * MAX_MATES` samplers it credited last, each at its owner's own
    key (swarm/dht/validation.py). A record any other key stores is never read here: 2,000 fresh keys'
    records cost a sampler nothing it reads."""

    def __init__(self, node: SwarmNode, follow: str | None, model_id: str = "", every: float = 10.0) -> None:
        self.node, self.follow, self.model_id, self.every = node, follow, model_id, every
        self.current: str | None = None
        self.partners: list[str] = []
        self.mates: list[str] = []
        self.seeding = False
        """Whether `mates` are the learner's seeders (a new swarm), not samplers it credits."""
        self.named_models: list[str] = []
        self._disputed: set[str] = set()
        self.other_protocol: dict[str, int] = {}
        """Named learners skipped for speaking another wire protocol (-> theirs), as of the last refresh."""
        self._told: set[tuple[str, int]] = set()
        self._checked = 0.0
        self._kept: str | None = None
        """The learner followed though its records could not be read (said once)."""

    def refresh(self, force: bool = False) -> str | None:
        if not force and time.monotonic() - self._checked < self.every:
            return self.current
        self._checked = time.monotonic()
        trusted = {} if self.follow else self.node.trusted_learners(self.node.coordinators)
        named = [self.follow] if self.follow else sorted(trusted)
        c = choose(list(self.node.peer_records(named).values()), trusted, self.model_id, self.follow)
        if c.follow is None and self.current not in (*c.disputed, *c.other_protocol) and self._still_there(trusted):
            c.follow = self.current  # its record is unreadable, but it answers us: never dropped for that
        else:
            self._kept = None
        for pid in sorted(set(c.disputed) - self._disputed):
            self._disputed.add(pid)
            log.warning("ignoring learner %s: it announces another model than the swarm record gives it", short_id(pid))
        for pid, theirs in sorted(c.other_protocol.items()):
            if (pid, theirs) not in self._told:
                self._told.add((pid, theirs))
                log.warning("ignoring learner %s: %s", short_id(pid), protocol_mismatch(theirs))
        if set(c.partners) != set(self.partners):
            log.info("partner learners (other models that take %s): %s", self.model_id,
                     ", ".join(map(short_id, c.partners)) or "none")
        if c.follow != self.current and c.follow:
            log.info("following learner %s", short_id(c.follow))
        elif c.follow != self.current:
            log.warning("the learner %s is gone from the swarm; looking for one", short_id(self.current or ""))
        self.current, self.partners, self.named_models, self.other_protocol = c.follow, c.partners, c.models, c.other_protocol
        self.mates, self.seeding = self._mates(c.follow)
        return self.current

    def _still_there(self, trusted: dict[str, str]) -> bool:
        """Whether the learner we follow still answers us and no record we read says otherwise: our
        coordinators' records still name it (or none could be read), with our model."""
        learner = self.current
        if learner is None or not self.node.answers(learner):
            return False
        if trusted and learner not in trusted:
            return False
        if trusted.get(learner, "") not in ("", self.model_id):
            return False
        if self._kept != learner:
            self._kept = learner
            log.warning("cannot read the records of learner %s, but it answers us: still following it",
                        short_id(learner))
        return True

    def unnamed_learners(self) -> list[str]:
        """Peers in the index announcing role=learner that no coordinator we trust names: what a
        sampler waiting with nobody to follow tells its user about (the one read of the whole peers
        index, and only while it waits)."""
        trusted = self.node.trusted_learners(self.node.coordinators)
        return sorted(p.info.peer_id for p in self.node.peers() if p.info.role == "learner" and p.info.peer_id not in trusted)

    def _mates(self, learner: str | None) -> tuple[list[str], bool]:
        """(the samplers of our model following `learner` that it credits, or while none of them is a
        mate we can read the seeders it names (`earned`), from its tally and the records of those it
        names; whether they are seeders)."""
        if learner is None:
            return [], False
        tally = self.node.tally_of(learner)
        recent = most_recent(tally, 2 * MAX_MATES)
        records = self.node.peer_records([*recent, *seeders(tally)])
        checked = [pid for pid, p in records.items() if is_mate(p, learner, self.model_id)]
        me = self.node.peer_id
        if me in recent and me not in checked and not self.node.private:
            # credited lately, so our mates read our record too, but here it did not read (lapsed,
            # or not yet stored): we know what it says. A sampler that left itself out owned no chunk
            # in its own eyes while its mates asked it for its share (bench_wan, docs/BENCHMARKS.md:
            # a version went to the learner 8 times over)
            checked.append(me)
        mates = earned(checked, [tally] if tally else [], learner)
        return mates, bool(mates) and not any(credits(tally).get(m, 0) > 0 for m in mates)

    @property
    def any(self) -> bool:
        """Whether there is anyone to send groups to: the learner we follow or a partner."""
        return self.current is not None or bool(self.partners)
