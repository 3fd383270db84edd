"""Contribution tallies: what each learner credits each sampler with, as signed DHT records.

Only learners credit work, and only work they trained on (the record passed every check, its
reward was recomputed, it was not dropped as too stale). A learner publishes its cumulative
per-sampler tally under `hetero_<swarm>_tallies`, subkey = its own `[owner:<public key>]`, so:
  - hivemind's RSASignatureValidator refuses a tally not signed by the subkey's key (a forged or
    edited tally, or one written under another learner's subkey);
  - `TallyValidator` (below, run by every peer) refuses a tally whose `learner` field is not the
    peer id of that key, or that credits the learner itself;
  - `SwarmSchema` (dht.py) refuses malformed values.
Tallies are cumulative and carry a sequence number, so a replayed older tally can never add
credit: readers keep the newest per learner and count older ones as replays (leaderboard.py).
"""

from __future__ import annotations

import logging
import re
from typing import Dict, List

import pydantic.v1 as pydantic
from cryptography.hazmat.primitives import serialization
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer

from .identity import peer_id_of

log = logging.getLogger(__name__)

_OWNER_RE = re.compile(rb"\[owner:(.+?)\]")


class ContributionModel(pydantic.BaseModel):
    groups: pydantic.conint(ge=0, strict=True)
    rollouts: pydantic.conint(ge=0, strict=True)
    """Completions trained on (a group holds G of them)."""
    tokens: pydantic.conint(ge=0, strict=True)
    """Completion tokens trained on."""
    first: pydantic.StrictFloat
    last: pydantic.StrictFloat
    """Unix time of the first and last credited group."""
    models: List[pydantic.StrictStr]


class TallyModel(pydantic.BaseModel):
    learner: pydantic.StrictStr
    seq: pydantic.conint(ge=0, strict=True)
    """Increases with every publication: a reader refuses anything older than what it has."""
    time: pydantic.StrictFloat
    model_id: pydantic.StrictStr
    peers: Dict[pydantic.StrictStr, ContributionModel]


def tallies_key(swarm: str) -> str:
    return f"hetero_{swarm}_tallies"


def owner_peer_id(subkey: bytes) -> str | None:
    """The peer id of the `[owner:<ssh-format RSA key>]` in a DHT subkey (None if there is none)."""
    found = _OWNER_RE.findall(subkey)
    if len(found) != 1:
        return None
    try:
        key = serialization.load_ssh_public_key(found[0])
    except Exception:
        return None
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return peer_id_of(der)


class TallyValidator(RecordValidatorBase):
    """A tally must name the key that signed it as its learner and must not credit that learner."""

    def __init__(self, swarm: str) -> None:
        self._key = DHTID.generate(source=tallies_key(swarm)).to_bytes()

    def validate(self, record: DHTRecord) -> bool:
        if record.key != self._key:
            return True  # not a tally: other validators decide
        try:
            value = MSGPackSerializer.loads(record.value)
            owner = owner_peer_id(MSGPackSerializer.loads(record.subkey))
            ok = isinstance(value, dict) and owner is not None and value.get("learner") == owner \
                and isinstance(value.get("peers"), dict) and owner not in value["peers"]
        except Exception:
            ok = False
        if not ok:  # refused by every peer; the leaderboard counts what reaches it (leaderboard.py)
            log.debug("refused a tally: its learner is not its signer, or it credits itself")
        return ok

    @property
    def priority(self) -> int:
        return 5  # after the signature check strips the signature (10), before the schema (0)

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return isinstance(other, TallyValidator) and other._key == self._key
