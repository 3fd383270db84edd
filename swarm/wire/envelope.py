"""Signed envelopes (any signer -> any reader): a record's bytes, its signer's public key and the
signature, a msgpack map {"r", "k", "s"}.

`open_envelope` checks the signature and returns the signer's peer id, derived from the key
(swarm.identity.peer_id_of); the caller then checks that the record names that same peer (a
sampler can sign only its own rollouts, a learner only its own manifests).
"""

from __future__ import annotations

import msgspec

from swarm.identity import Identity, peer_id_of, verify
from swarm.wire.rollout import MAX_RECORD_BYTES, RecordError
from swarm.wire.reasons import Drop

MAX_KEY = 1024
MAX_SIGNATURE = 1024
"""A 2048-bit RSA key's DER is 294 bytes and its signature 256: room for larger keys, not for padding."""
MAX_ENVELOPE_BYTES = MAX_RECORD_BYTES + 4096
"""A record of the largest size, its key and its signature."""


class Envelope(msgspec.Struct, forbid_unknown_fields=True, frozen=True, gc=False):
    r: bytes
    """The record."""
    k: bytes
    """The signer's public key (DER)."""
    s: bytes
    """The signature of `r` by `k`."""


_DECODER = msgspec.msgpack.Decoder(Envelope)


def seal(identity: Identity, record: bytes) -> bytes:
    return msgspec.msgpack.encode(Envelope(record, identity.public_key_der, identity.sign(record)))


def open_envelope(data: bytes) -> tuple[bytes, str]:
    """(record bytes, signer peer id), or RecordError: 'oversize' (the envelope, its key or its
    signature over their bounds, or a field besides the three), 'undecodable' (not such a map),
    'signature' (it does not verify)."""
    if len(data) > MAX_ENVELOPE_BYTES:
        raise RecordError(Drop.OVERSIZE, f"envelope of {len(data)} bytes")
    try:
        env = _DECODER.decode(data)
    except msgspec.ValidationError as e:
        reason = Drop.OVERSIZE if "unknown field" in str(e).lower() else Drop.UNDECODABLE
        raise RecordError(reason, f"envelope: {e}") from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as e:
        raise RecordError(Drop.UNDECODABLE, f"envelope: {type(e).__name__}") from None
    if len(env.k) > MAX_KEY or len(env.s) > MAX_SIGNATURE:
        raise RecordError(Drop.OVERSIZE, "an envelope is exactly a record, a key and a signature of bounded size")
    if not verify(env.k, env.r, env.s):
        raise RecordError(Drop.SIGNATURE, "the signature does not match the record")
    return env.r, peer_id_of(env.k)
