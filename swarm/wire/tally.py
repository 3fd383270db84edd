"""Contribution tallies: what each learner credits each sampler with (learner -> DHT
`hetero_<swarm>_tally/<its peer id>`; read by its samplers, for mates, and by the leaderboard).

Only learners credit work, and only work they trained on (the record passed every check, its
reward was recomputed, it was not dropped as too stale). A learner publishes its cumulative
per-sampler tally (the peers it credited most and last, by name; the rest as one aggregate,
`others`: node/learner/credit.py) at its own key, subkey = its own `[owner:<public key>]`, so:
  - hivemind's RSASignatureValidator refuses a tally not signed by the subkey's key (a forged or
    edited tally, or one written under another learner's subkey);
  - `OwnerValidator` (swarm/dht/validation.py, run by every peer) refuses a tally whose `learner`
    is not the peer id of that key, one that credits the learner itself, one that does not decode
    as a `Tally`, one over `TALLY_BYTES`, and one under another learner's key;
  - readers read the tallies of the learners they know, one key each: a tally of a key nobody
    named is never read.
Tallies are cumulative and carry a sequence number, so a replayed older tally can never add
credit: readers keep the newest per learner and count older ones as replays (the leaderboard).

A tally also says how the learner is doing, so the leaderboard can show whether the swarm learns:
its model `version` and its latest held-out `eval_acc` with the `eval_version` that eval measured.
These are the learner's own claims, signed like the rest: the signature proves who claims them, not
that they are true (a coordinator that distrusts a learner leaves it out with --trusted-learner).
They are optional (UNSET: never encoded when absent, so a tally without them is what peers from
before them accept), and bounded (versions >= 0, 0 <= eval_acc <= 1, an eval no newer than the
version, eval_acc and eval_version together). Adding a figure is one field here and its producer
(node/learner/credit.py); peers of this version ignore fields they do not know.
"""

from __future__ import annotations

import math
from typing import Annotated, Union

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

MiB = 1 << 20
TALLY_BYTES = 1 * MiB
"""The most a learner's published tally may be (swarm/dht/validation.py MAX_BYTES["tally"]: every DHT
peer refuses a bigger one): node/learner/credit.py keeps its tally under it."""

NonNegative = Annotated[int, Meta(ge=0)]
PeerId = Annotated[str, Meta(max_length=128)]
"""A base58 peer id is ~46-53 characters."""
MAX_SEEDERS = 64
"""Seeders a tally names at most (swarm/weights/chunks.py `ChunkStore.seeders`: the first peers the
learner served its newest keyframe whole to), for a new swarm's samplers to share downloads with
until it credits any; they use at most swarm/discovery.py SEEDER_MATES of them, the first that are
public samplers of its model (the learner cannot tell who is behind NAT; samplers read records)."""


class Contribution(Struct, kw_only=True, gc=False):
    """One sampler's credit."""

    groups: NonNegative
    rollouts: NonNegative
    """Completions trained on (a group holds G of them)."""
    tokens: NonNegative
    """Completion tokens trained on."""
    first: float
    last: float
    """Unix time of the first and last credited group."""
    models: list[str]


class Others(Struct, kw_only=True, gc=False):
    """The peers a tally does not name, together (a tally names at most 2,048, so it fits the DHT's
    bound whatever the number of keys credited)."""

    count: NonNegative
    """How many peers."""
    groups: NonNegative
    rollouts: NonNegative
    tokens: NonNegative


class Tally(Struct, kw_only=True, gc=False):
    learner: str
    seq: NonNegative
    """Increases with every publication: a reader refuses anything older than what it has."""
    time: float
    model_id: str
    peers: dict[str, Contribution]
    version: Union[NonNegative, UnsetType] = UNSET
    """The learner's model version when it published."""
    eval_acc: Union[Annotated[float, Meta(ge=0.0, le=1.0)], UnsetType] = UNSET
    """Its latest held-out eval accuracy, a fraction (NaN fails both bounds)."""
    eval_version: Union[NonNegative, UnsetType] = UNSET
    """The version that eval measured."""
    others: Union[Others, UnsetType] = UNSET
    """What it credited the peers it does not name with, together (absent: it names them all)."""
    seeders: Union[Annotated[list[PeerId], Meta(max_length=MAX_SEEDERS)], UnsetType] = UNSET
    """The first peers it served its newest keyframe whole to, in that order, that it has not
    credited or refused (swarm/weights/chunks.py `ChunkStore.seeders`): a new swarm's samplers share
    downloads with them while no sampler it credits is a mate they can read (swarm/discovery.py
    `earned`). Absent when none, so a tally without them is what peers from before them accept."""

    def __post_init__(self) -> None:
        acc, at, version = self.eval_acc, self.eval_version, self.version
        if (acc is UNSET) != (at is UNSET):
            raise ValueError("eval_acc and eval_version come together")
        if at is not UNSET and (version is UNSET or at > version):
            raise ValueError(f"an eval at version {at} needs a current version at least as new (got {version})")
        if not all(math.isfinite(x) for x in (self.time, *(c.first for c in self.peers.values()),
                                              *(c.last for c in self.peers.values()))):
            raise ValueError("a tally's times are finite")

    def encode(self) -> bytes:
        """The tally as msgpack: what the DHT stores (hivemind packs `as_value` the same way) and
        what `TALLY_BYTES` bounds."""
        return msgspec.msgpack.encode(self)
