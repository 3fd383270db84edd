"""Records a peer signs are its own: the DHT validator every peer runs on the swarm's keys.

hivemind's RSASignatureValidator makes a subkey `[owner:<public key>]` writable only by that key;
it does not stop a key from writing many subkeys, nor a record from *naming* another peer, nor any
key from storing anything under any other key. On top of it, `OwnerValidator` (run by every peer,
so the whole DHT refuses what it refuses) requires of every record:
  - the subkey is exactly `[owner:<key>]`, canonically packed: one key, one record per DHT key (no
    sybil subkeys);
  - it is under one of the swarm's keys: an index every peer writes its row of (`INDEXES`:
    `hetero_<swarm>_peers`), or a key of its owner's own (`OWN_KINDS`:
    `hetero_<swarm>_<kind>/<owner's peer id>`, which no other key can write at all); nothing else
    (the swarm's DHT is not free storage for anyone with a key);
  - the record names its signer: PeerInfo and holder records' `peer_id`, a tally's `learner`, the
    swarm record's `coordinator` is the owner's peer id (a peer cannot speak for another, e.g. put
    its display name on an honest peer's row); a tally does not credit its own learner;
  - it decodes as its kind's struct (swarm/dht/schema.py `KINDS`: the index's rows too, which
    hivemind's SchemaValidator checked before);
  - at most `MAX_BYTES` of its kind, expiring at most `MAX_TTL` from now: keys are free, so what
    one key can store is what the DHT holds per fresh key (before: one key stored a 2.5 MB peer
    record, and every get of the index took seconds).

Readers who know whom they want (a sampler: its coordinators' swarm records, its learner's peer
record and tally, its mates' records) read those owners' own keys, one get each: however many
records fresh keys put in the indexes, what such a reader reads is bounded (issue 39).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

import msgspec
from cryptography.hazmat.primitives import serialization
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer, get_dht_time
from msgspec import Struct

from swarm.dht.schema import INDEXES, KINDS, OWN_KINDS, own_key
from swarm.wire.tally import TALLY_BYTES, Tally
from swarm.identity import peer_id_of

log = logging.getLogger(__name__)

_OWNER_RE = re.compile(rb"^\[owner:(.+)\]$", re.DOTALL)


MAX_SUBKEY = 1024
"""Bytes of an owner subkey: a 2048-bit RSA key in OpenSSH form is 380 (4096-bit: 724)."""


def owner_peer_id(subkey: bytes) -> str | None:
    """The peer id of a subkey that is exactly `[owner:<ssh-format RSA key>]`, else None. Exactly:
    the key in its canonical OpenSSH form, nothing after it. The parser ignores a trailing comment,
    which hivemind's signature check accepts too, so `...AAAA 1]`, `...AAAA 2]` were as many rows of
    one key, and a 500 KB comment passed the value's size bound."""
    found = _OWNER_RE.match(subkey) if isinstance(subkey, bytes) and len(subkey) <= MAX_SUBKEY else None
    if found is None:
        return None
    try:
        key = serialization.load_ssh_public_key(found.group(1))
    except Exception:
        return None
    if key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) != found.group(1):
        return None
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return peer_id_of(der)


def _names_owner(field: str) -> Callable[[Struct, str], bool]:
    return lambda record, owner: getattr(record, field) == owner


def _tally_ok(tally: Tally, owner: str) -> bool:
    return tally.learner == owner and owner not in tally.peers


RULES: dict[str, Callable[[Any, str], bool]] = {
    "peers": _names_owner("peer_id"), "peer": _names_owner("peer_id"),
    "holds": _names_owner("peer_id"),
    "tally": _tally_ok,
    "swarm": _names_owner("coordinator"),
}
"""What a record under each of the swarm's keys must say of its signer, by the key's name."""
MAX_BYTES = {"peers": 4096, "peer": 4096, "holds": 8192, "tally": TALLY_BYTES, "swarm": 65536}
"""A record's serialized value at most, by kind: a peer record is ~500 bytes (16 addresses of 200
characters fit), a holder record lists at most 512 versions (`dht.MAX_HELD`), a tally credits
~6,700 peers in 1 MiB (~157 bytes each), a swarm record names a few dozen learners. A record past
its bound is refused, and its writer logs it (dht.py `_store`)."""
MAX_TTL = 3600.0
"""Seconds ahead a record may expire: peers refresh theirs every few seconds to minutes (tallies:
600 s), so a record outliving its writer by an hour is already stale; without a bound, a key could
leave records behind for good."""


_DECODERS = {kind: msgspec.msgpack.Decoder(struct) for kind, struct in KINDS.items()}


def decode(kind: str, value: bytes) -> Struct | None:
    """A stored value (msgpack, its signature stripped) as its kind's struct, or None: what no
    exception of a peer's bytes escapes (msgspec raises UnicodeDecodeError and RecursionError
    besides its own errors)."""
    try:
        return _DECODERS[kind].decode(value)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError, ValueError, TypeError):
        return None


class OwnerValidator(RecordValidatorBase):
    """Run by every peer on every record it is asked to store and every one it reads back (the
    index's rows included: they decode as `PeerInfo` like the owners' own records)."""

    def __init__(self, swarm: str) -> None:
        self.swarm = swarm
        self._indexes = {DHTID.generate(source=f"hetero_{swarm}_{name}").to_bytes(): name for name in INDEXES}

    def _kind(self, key: bytes, owner: str) -> str | None:
        """Which of the swarm's keys `key` is for a record of `owner`: an index, the owner's own key of
        some kind, or None (not the swarm's, or another owner's own key)."""
        if key in self._indexes:
            return self._indexes[key]
        return next((k for k in OWN_KINDS if DHTID.generate(source=own_key(self.swarm, k, owner)).to_bytes() == key),
                    None)

    def validate(self, record: DHTRecord) -> bool:
        why = self._refusal(record)
        if why is not None:  # refused by every peer's DHT, so it is stored nowhere
            log.debug("refused a DHT record: %s", why)
        return why is None

    def _refusal(self, record: DHTRecord) -> str | None:
        try:
            subkey = MSGPackSerializer.loads(record.subkey)
            # the canonical encoding only: the same key packed as bin32, or as an ext hivemind does not
            # know, decodes to the same bytes and was a row of its own under the same DHT key
            owner = owner_peer_id(subkey) if MSGPackSerializer.dumps(subkey) == record.subkey else None
        except Exception:
            owner = None
        if owner is None:
            return "not exactly one [owner:<key>] subkey"
        kind = self._kind(record.key, owner)
        if kind is None:
            return "not under one of the swarm's keys, or under another peer's own key"
        if len(record.value) > MAX_BYTES[kind]:
            return f"a {kind} record of {len(record.value)} bytes (at most {MAX_BYTES[kind]})"
        if record.expiration_time > get_dht_time() + MAX_TTL:
            return f"a {kind} record expiring more than {MAX_TTL:.0f} s ahead"
        decoded = decode(kind, record.value)
        if decoded is None:
            return f"a {kind} record that does not decode as a {KINDS[kind].__name__}"
        return None if RULES[kind](decoded, owner) else f"a {kind} record that does not name its own signer"

    @property
    def priority(self) -> int:
        return 5  # after the signature check strips the signature (10)

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return isinstance(other, OwnerValidator) and other.swarm == self.swarm
