"""What peers tell the swarm's DHT about themselves: typed records, one struct each, with their direction.

    PeerInfo     any peer -> DHT     `hetero_<swarm>_peers` (a row per peer) and `hetero_<swarm>_peer/<id>`
    Holder       sampler  -> DHT     `hetero_<swarm>_holds/<id>`: the versions it serves
    SwarmRecord  coordinator -> DHT  `hetero_<swarm>_swarm/<id>`: the learners it names

Every DHT peer decodes each stored value into its kind's struct before it keeps or returns it
(swarm/dht/validation.py), and readers get the structs back (swarm/dht/records.py), never dicts. A
value is msgpack: fields missing take their defaults, and fields this version does not know are
ignored, so a newer peer may add one (the kind's byte bound, `validation.MAX_BYTES`, bounds them),
while a field of the wrong type refuses the whole record (a bool is never an int or a float).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from swarm.wire.model_files import MAX_BUNDLE

PROTOCOL = 9
"""2: rollouts over a gated call (hetero.rollouts.v2), peer records say whether the peer is private.
3: weight patches entropy-coded (node/weights/entropy.py): a protocol-2 sampler cannot apply them.
4: several learners: peer records say which models a learner takes (`accepts`), swarm records which
model each learner trains (`models`).
5: records also at their owner's own key (peer, holds, tally, swarm: swarm/dht/validation.py), where
readers who know the owner read them; holder and swarm records only there; the DHT refuses anything
else. Peers of protocol 5 from before these structs refuse a record with a field they do not know:
a new field needs every peer upgraded, or a new protocol.
6: a learner's peer record names the model bundle it serves (`files`, `files_bytes`: hetero.model.v1),
so a sampler given no --model runs the learner's model.
7: weight versions cut by their size (`swarm.wire.chunks.chunk_size`), served on hetero.chunks.v2: a
protocol-6 peer exchanges no chunk with a protocol-7 one; a long poll with nothing newer is answered
b"" (swarm/weights/server.py).
8: a manifest lists only the versions after the one the asker holds (hetero.manifest.v2, with the
segment's `first` version): a protocol-7 sampler's hetero.manifest.v1 finds no handler, and peers
of another protocol skip each other (swarm/discovery.py).
9: a manifest's chunk hashes are raw sha256 bytes, not hex, and a tail may come as a notice naming
the samplers that relay it (hetero.manifest.v3, hetero.tail.v1): the learner uploads a few tails a
version, not one per sampler, and versions up to 90 GiB pass (`swarm.wire.chunks.MAX_INDICES`)."""
SOFTWARE = "hetero-node/0.1.0"

NonNegative = Annotated[int, Meta(ge=0)]
Role = Literal["sampler", "learner", "bootstrap"]
MAX_DISPLAY_NAME = 64
MAX_MODEL_NAME = 256


class PeerInfo(Struct, kw_only=True, gc=False):
    """A peer's announcement (any peer -> DHT), refreshed every few seconds, expiring (`ttl`)."""

    peer_id: str
    role: Role
    model_id: str
    version: NonNegative
    """The weights' version it holds (a learner: publishes)."""
    engine: str
    """What it generates with (HF, vLLM and their settings): for `status`, never trusted."""
    throughput: Annotated[float, Meta(ge=0)]
    software: str = SOFTWARE
    protocol: int = PROTOCOL
    maddrs: list[str] = []
    learner: str = ""
    """For samplers: the learner peer id they follow."""
    name: Annotated[str, Meta(max_length=MAX_DISPLAY_NAME)] = ""
    """Optional display name (leaderboard, status): a peer's text, never shown raw."""
    updated: float = 0.0
    """DHT time of the announcement (status shows 'last seen')."""
    private: bool = False
    """Behind a NAT (swarm/p2p/reach.py): no peer can dial it, so no mate asks it for weight chunks."""
    accepts: list[Annotated[str, Meta(max_length=MAX_MODEL_NAME)]] = []
    """For learners: other models whose rollouts it trains on ("*": any it can check), so samplers
    of those models send it a copy of each group (docs/DESIGN.md, "Several learners")."""
    files: Annotated[str, Meta(pattern=r"^([0-9a-f]{64})?$")] = ""
    """For learners: the sha256 of the model bundle it serves (swarm/wire/model_files.py: what a
    sampler needs to run its model besides the weights); "" for none."""
    files_bytes: Annotated[int, Meta(ge=0, le=MAX_BUNDLE)] = 0


class Holder(Struct, kw_only=True, gc=False):
    """Which versions of which weight chain a peer holds and serves (sampler -> DHT)."""

    peer_id: str
    chain: str
    versions: list[int]


class SwarmRecord(Struct, kw_only=True, gc=False):
    """What a swarm is, signed by its coordinator (a bootstrap peer's key): the learners samplers
    may follow. A sampler trusts the coordinators named by its --initial-peers (their /p2p/ ids)."""

    coordinator: str
    learners: list[str]
    model_id: str = ""
    """The model the swarm trains ("" = not fixed)."""
    models: dict[str, str] = {}
    """Learner -> the model it trains, where the coordinator says (a sampler follows only its own
    model's learner; a learner the record names without a model is taken at its word)."""
    updated: float = 0.0


def as_value(record: Struct) -> dict:
    """A record as the DHT stores it: plain msgpack-able builtins (hivemind packs them itself)."""
    return msgspec.to_builtins(record)


def from_value(kind: type[Struct], value: object) -> Struct | None:
    """A value the DHT returned (validated where it was stored and again on the way back) as
    `kind`, or None if it is not one (a peer of another version, or a bug: never raised)."""
    try:
        return msgspec.convert(value, kind)
    except (msgspec.ValidationError, TypeError, ValueError, RecursionError):
        return None
