"""Signed envelopes: a record's bytes, its signer's public key and the signature, in msgpack.

`open_envelope` checks the signature and returns the signer's peer id, derived from the key
(swarm.identity.peer_id_of); the caller then checks that the record names that same peer (a
sampler can sign only its own rollouts, a learner only its own tallies).
"""

from __future__ import annotations

import msgpack

from swarm.identity import Identity, peer_id_of, verify
from swarm.wire.rollout import MAX_RECORD_BYTES, RecordError

_MAX_KEY = 1024
MAX_ENVELOPE_BYTES = MAX_RECORD_BYTES + 4096
"""A record of the largest size, its key and its signature."""
_MAX_SIGNATURE = 1024
"""A 2048-bit RSA key's DER is 294 bytes and its signature 256: room for larger keys, not for padding."""


def seal(identity: Identity, record: bytes) -> bytes:
    return msgpack.packb({"r": record, "k": identity.public_key_der, "s": identity.sign(record)}, use_bin_type=True)


def open_envelope(data: bytes) -> tuple[bytes, str]:
    """(record bytes, signer peer id), or RecordError('undecodable' | 'oversize' | 'signature')."""
    if len(data) > MAX_ENVELOPE_BYTES:
        raise RecordError("oversize", f"envelope of {len(data)} bytes")
    try:
        env = msgpack.unpackb(data, raw=False)
        record, key, sig = env["r"], env["k"], env["s"]
    except Exception as e:
        raise RecordError("undecodable", f"envelope: {type(e).__name__}") from None
    if not all(isinstance(x, bytes) for x in (record, key, sig)):
        raise RecordError("undecodable", "envelope fields must be bytes")
    if len(env) != 3 or len(key) > _MAX_KEY or len(sig) > _MAX_SIGNATURE:
        raise RecordError("oversize", "an envelope is exactly a record, a key and a signature of bounded size")
    if not verify(key, record, sig):
        raise RecordError("signature", "the signature does not match the record")
    return record, peer_id_of(key)
