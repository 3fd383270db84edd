"""A DHT record carried outside the DHT: signed by its owner exactly as the DHT stores it, and
checked by the very validators every DHT peer runs (validation.py, after hivemind's signature check).

`seal` makes an owner's record into an `Entry` (swarm/wire/directory.py): its owner subkey, its
value with the signature over (key, subkey, value, expiration), the expiration. `unseal` takes one
from any peer and returns its owner and struct only if the DHT itself would have stored it at that
owner's own key (`own_key`): signed by the subkey's key, canonical subkey, the kind's byte bound and
struct, naming its signer, expiring at most `MAX_TTL` ahead. Whoever relays an entry can drop it or
replay an older one (readers keep the newest by expiration), never alter it.
"""

from __future__ import annotations

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.utils import MSGPackSerializer, get_dht_time
from msgspec import Struct

from swarm.dht.schema import own_key
from swarm.dht.validation import OwnerValidator, decode, owner_peer_id
from swarm.identity import Identity
from swarm.wire.directory import Entry
from swarm.wire.peer import as_value


class Sealer:
    """Seals this peer's own records and unseals anyone's, for one swarm."""

    def __init__(self, identity: Identity, swarm: str) -> None:
        self.swarm = swarm
        self._signer = RSASignatureValidator(identity.dht_private_key())
        self._subkey = MSGPackSerializer.dumps(self._signer.local_public_key)
        self._check = CompositeValidator([RSASignatureValidator(identity.dht_private_key()), OwnerValidator(swarm)])
        # CompositeValidator strips the signature as it goes: the validator sees the bare value
        self._strip = self._signer.strip_value

    def _record(self, kind: str, owner: str, subkey: bytes, value: bytes, expires: float) -> DHTRecord:
        return DHTRecord(key=DHTID.generate(source=own_key(self.swarm, kind, owner)).to_bytes(), subkey=subkey,
                         value=value, expiration_time=expires)

    def seal(self, kind: str, record: Struct, owner: str, ttl: float) -> Entry:
        """Our own `record` of `kind` (`owner` = our peer id), expiring `ttl` seconds from now."""
        expires = float(get_dht_time() + ttl)
        bare = self._record(kind, owner, self._subkey, MSGPackSerializer.dumps(as_value(record)), expires)
        return Entry(kind, self._subkey, self._signer.sign_value(bare), expires)

    @staticmethod
    def owner_of(entry: Entry) -> str | None:
        """The peer id an entry's subkey names (not yet checked against anything), or None."""
        try:
            return owner_peer_id(MSGPackSerializer.loads(entry.subkey))
        except Exception:  # a peer's bytes: whatever msgpack raises
            return None

    def unseal(self, entry: Entry) -> tuple[str, Struct]:
        """(owner, record) of a peer's entry, or ValueError saying why the DHT would refuse it."""
        owner = self.owner_of(entry)
        if owner is None:
            raise ValueError("not exactly one [owner:<key>] subkey")
        record = self._record(entry.kind, owner, entry.subkey, entry.value, entry.expires)
        if not self._check.validate(record):
            raise ValueError(f"a {entry.kind} record of {owner[-8:]} that the DHT's validators refuse (signature, "
                             f"bounds, struct or signer)")
        decoded = decode(entry.kind, self._strip(record))
        if decoded is None:  # validate() decoded it already: only a validator changed under us gets here
            raise ValueError(f"a {entry.kind} record that does not decode")
        return owner, decoded
