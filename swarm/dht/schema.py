"""What the swarm's DHT records must be: the protocol version and the schema of each record kind.

Every peer runs the same validators (swarm/dht/validation.py), so a record that does not parse to
its kind's model exactly is refused by the whole DHT. hivemind's schema check refuses a record with
a field more or less than the reader's schema, so a swarm runs one protocol.
"""

from __future__ import annotations

from typing import Dict, List

import pydantic.v1 as pydantic
from hivemind.dht.schema import conbytes

from swarm.wire.tally import TallyModel


PROTOCOL_VERSION = 5
"""2: rollouts over a gated call (hetero.rollouts.v2), peer records say whether the peer is private.
3: weight patches entropy-coded (node/weights/entropy.py): a protocol-2 sampler cannot apply them.
4: several learners: peer records say which models a learner takes (`accepts`), swarm records which
model each learner trains (`models`). hivemind's schema check refuses a record with a field more
or less than the reader's schema, so a swarm runs one protocol.
5: records also at their owner's own key (peer, holds, tally, swarm: ownership.py), where readers
who know the owner read them; holder and swarm records only there; the DHT refuses anything else."""
SOFTWARE = "hetero-node/0.1.0"


class PeerInfoModel(pydantic.BaseModel):
    peer_id: pydantic.StrictStr
    role: pydantic.constr(regex=r"^(sampler|learner|bootstrap)$", strict=True)
    model_id: pydantic.StrictStr
    version: pydantic.conint(ge=0, strict=True)
    engine: pydantic.StrictStr
    throughput: pydantic.confloat(ge=0, strict=True)
    software: pydantic.StrictStr
    protocol: pydantic.StrictInt
    maddrs: List[pydantic.StrictStr]
    learner: pydantic.StrictStr = ""
    """For samplers: the learner peer id they follow."""
    name: pydantic.constr(max_length=64, strict=True) = ""
    """Optional display name (leaderboard); untrusted text, escaped wherever it is shown."""
    updated: pydantic.StrictFloat = 0.0
    """DHT time of the announcement (status shows 'last seen')."""
    private: pydantic.StrictBool = False
    """Behind a NAT (swarm/p2p/reach.py): no peer can dial it, so no mate asks it for weight chunks."""
    accepts: List[pydantic.constr(max_length=256, strict=True)] = []
    """For learners: other models whose rollouts it trains on ("*": any it can check), so samplers
    of those models send it a copy of each group (docs/DESIGN.md, "Several learners")."""


class HolderModel(pydantic.BaseModel):
    """Which versions of which weight chain a peer holds and serves (content it can upload)."""

    peer_id: pydantic.StrictStr
    chain: pydantic.StrictStr
    versions: List[pydantic.StrictInt]


class SwarmRecordModel(pydantic.BaseModel):
    """What a swarm is, signed by its coordinator (a bootstrap peer's key): the learners samplers
    may follow. A sampler trusts the coordinators named by its --initial-peers (their /p2p/ ids)."""

    coordinator: pydantic.StrictStr
    learners: List[pydantic.StrictStr]
    model_id: pydantic.StrictStr = ""
    """The model the swarm trains ("" = not fixed)."""
    models: Dict[pydantic.StrictStr, pydantic.StrictStr] = {}
    """Learner -> the model it trains, where the coordinator says (a sampler follows only its own
    model's learner; a learner the record names without a model is taken at its word)."""
    updated: pydantic.StrictFloat = 0.0


_OWN = conbytes(regex=rb"^\[owner:.+\]$")


class SwarmSchema(pydantic.BaseModel):
    """The index (ownership.py, `INDEXES`): hivemind's SchemaValidator checks its rows."""

    peers: Dict[_OWN, PeerInfoModel]


OWN_MODELS = {"peer": PeerInfoModel, "holds": HolderModel, "tally": TallyModel, "swarm": SwarmRecordModel}
"""What a record at an owner's own key must parse to (ownership.py's `OwnerValidator` checks it)."""
