"""Records a peer signs are its own: the DHT validator every peer runs on the swarm's keys.

hivemind's RSASignatureValidator makes a subkey `[owner:<public key>]` writable only by that key;
it does not stop a key from writing many subkeys, nor a record from *naming* another peer. On top
of it, `OwnerValidator` (run by every peer, so the whole DHT refuses what it refuses) requires for
each of the swarm's keys:
  - the subkey is exactly `[owner:<key>]`: one key, one record per DHT key (no sybil subkeys);
  - the record names its signer: PeerInfo and holder records' `peer_id`, a tally's `learner`, the
    swarm record's `coordinator` is the owner's peer id (a peer cannot speak for another, e.g. put
    its display name on an honest peer's row);
  - a tally does not credit its own learner.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

from cryptography.hazmat.primitives import serialization
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer

from .identity import peer_id_of

log = logging.getLogger(__name__)

_OWNER_RE = re.compile(rb"^\[owner:(.+)\]$", re.DOTALL)


def owner_peer_id(subkey: bytes) -> str | None:
    """The peer id of a subkey that is exactly `[owner:<ssh-format RSA key>]`, else None."""
    found = _OWNER_RE.match(subkey) if isinstance(subkey, bytes) else None
    if found is None:
        return None
    try:
        key = serialization.load_ssh_public_key(found.group(1))
    except Exception:
        return None
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return peer_id_of(der)


def _names_owner(field: str) -> Callable[[dict[str, Any], str], bool]:
    return lambda value, owner: value.get(field) == owner


def _tally_ok(value: dict[str, Any], owner: str) -> bool:
    return value.get("learner") == owner and isinstance(value.get("peers"), dict) and owner not in value["peers"]


RULES: dict[str, Callable[[dict[str, Any], str], bool]] = {
    "peers": _names_owner("peer_id"),
    "holders": _names_owner("peer_id"),
    "tallies": _tally_ok,
    "swarm": _names_owner("coordinator"),
}
"""The swarm's DHT keys (`hetero_<swarm>_<name>`) and what a record under each must satisfy."""


class OwnerValidator(RecordValidatorBase):
    def __init__(self, swarm: str) -> None:
        self.swarm = swarm
        self._rules = {DHTID.generate(source=f"hetero_{swarm}_{name}").to_bytes(): (name, rule)
                       for name, rule in RULES.items()}

    def validate(self, record: DHTRecord) -> bool:
        if record.key not in self._rules:
            return True  # not one of ours: other validators decide
        name, rule = self._rules[record.key]
        try:
            value = MSGPackSerializer.loads(record.value)
            owner = owner_peer_id(MSGPackSerializer.loads(record.subkey))
            ok = isinstance(value, dict) and owner is not None and rule(value, owner)
        except Exception:
            ok = False
        if not ok:  # refused by every peer's DHT, so it is stored nowhere
            log.debug("refused a %s record: not exactly one record naming its own signer", name)
        return ok

    @property
    def priority(self) -> int:
        return 5  # after the signature check strips the signature (10), before the schema (0)

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return isinstance(other, OwnerValidator) and other.swarm == self.swarm
