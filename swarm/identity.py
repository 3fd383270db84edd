"""One key per peer: the libp2p identity, the DHT record owner and the rollout signer are the same.

The identity file is libp2p's serialized RSA private key (the format hivemind's p2pd reads with
`identity_path`), so the peer id that p2pd announces is exactly
    multihash(sha256(PublicKey protobuf(RSA, DER))),
and anyone holding a record's public key can check that it belongs to the peer id the record
names: no lookup, no trust in the relaying peer.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import base58
import multihash
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

if TYPE_CHECKING:
    from hivemind.utils.crypto import RSAPrivateKey

_PAD = padding.PKCS1v15()
_HASH = hashes.SHA256()

RSA_KEY = 0
"""libp2p's KeyType of RSA keys."""


def key_proto(key_type: int, data: bytes) -> bytes:
    """libp2p's PublicKey and PrivateKey message (proto2: `required KeyType Type = 1; required bytes
    Data = 2`), as protobuf encodes it: field 1 a varint, field 2 length-delimited. By hand rather
    than through hivemind's crypto_pb2, whose import loads all of hivemind and torch (1.9 s): the
    demo makes its learner's key before it starts a process, and waited for that. The bytes equal
    crypto_pb2's (tests/unit/swarm/test_identity.py)."""
    return b"\x08" + _varint(key_type) + b"\x12" + _varint(len(data)) + data


def parse_key_proto(raw: bytes) -> tuple[int, bytes]:
    """(key type, data) of a `key_proto` message; ValueError if it is not one. Fields may come in any
    order, the last of each kept, as protobuf reads them; unlike protobuf, a field of another wire
    type (fixed 32 or 64 bits, a group) is refused rather than skipped: no key message has one."""
    fields: dict[int, int | bytes] = {}
    i = 0
    while i < len(raw):
        tag, i = _read_varint(raw, i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            fields[number], i = _read_varint(raw, i)
        elif wire == 2:
            n, i = _read_varint(raw, i)
            if i + n > len(raw):
                raise ValueError("a key message cut short")
            fields[number], i = raw[i : i + n], i + n
        else:
            raise ValueError(f"a key message with a field of wire type {wire}")
    key_type, data = fields.get(1), fields.get(2)
    if not isinstance(key_type, int) or not isinstance(data, bytes):
        raise ValueError("a key message needs its type (field 1) and data (field 2)")
    return key_type, data


def _varint(n: int) -> bytes:
    if n < 0:
        raise ValueError(f"a varint of {n}: key types and lengths are never negative")
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(raw: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= len(raw) or shift > 63:
            raise ValueError("a key message with a broken varint")
        byte = raw[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not byte & 0x80:
            return value, i


def peer_id_of(public_key_der: bytes) -> str:
    """libp2p peer id (base58) of an RSA public key in DER SubjectPublicKeyInfo form."""
    proto = key_proto(RSA_KEY, public_key_der)
    return base58.b58encode(multihash.encode(hashlib.sha256(proto).digest(), "sha2-256")).decode()


SHA2_256, IDENTITY = 0x12, 0x00
"""The multihash codes of peer ids."""
MAX_INLINED_KEY = 42
"""libp2p inlines a public key of at most 42 bytes in its peer id (the identity multihash: ed25519's
ids, 12D3KooW...); a larger key's id is its sha2-256 (Qm..., the RSA keys hivemind and we use)."""


class PeerIdError(ValueError):
    """Text given as a peer id that is none: `str(e)` says where, `fix` where to get a real one."""

    fix = "give the peer id as `hetero-node peer-id <its workdir>` prints it (Qm...)"


def is_peer_id(text: str) -> bool:
    """Whether `text` is a libp2p peer id as hivemind prints it: base58btc of a multihash, either
    sha2-256 (32 bytes) of the public key or the key itself inlined (identity, 1..42 bytes)."""
    if not 0 < len(text) <= 64:
        return False
    try:
        mh = multihash.decode(base58.b58decode(text))
    except (ValueError, multihash.MultihashError):  # not base58 (UnicodeEncodeError too), not a multihash
        return False
    return (mh.code == SHA2_256 and mh.length == 32) or (mh.code == IDENTITY and 0 < mh.length <= MAX_INLINED_KEY)


def check_peer_id(text: str, where: str) -> str:
    """`text` if it is a peer id (`is_peer_id`), else PeerIdError naming `where` (a flag, a file)."""
    if not is_peer_id(text):
        raise PeerIdError(f"{where}: {text!r} is not a peer id")
    return text


def verify(public_key_der: bytes, data: bytes, signature: bytes) -> bool:
    try:
        key = serialization.load_der_public_key(public_key_der)
        if not isinstance(key, rsa.RSAPublicKey):
            return False
        key.verify(signature, data, _PAD, _HASH)
        return True
    except (ValueError, TypeError, InvalidSignature):
        return False


class Identity:
    def __init__(self, private_key: rsa.RSAPrivateKey, path: Path | None = None) -> None:
        self._key = private_key
        self.path = path
        self.public_key_der = private_key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        self.peer_id = peer_id_of(self.public_key_der)

    @classmethod
    def load_or_create(cls, path: str | Path) -> "Identity":
        """Read the identity file, or create it (mode 0400) with a fresh 2048-bit RSA key."""
        path = Path(path)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL,
                                    serialization.NoEncryption())
            path.write_bytes(key_proto(RSA_KEY, der))
            os.chmod(path, 0o400)
        key_type, data = parse_key_proto(path.read_bytes())
        if key_type != RSA_KEY:
            raise ValueError(f"{path}: only RSA identities are supported (got key type {key_type})")
        return cls(serialization.load_der_private_key(data, password=None), path)

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data, _PAD, _HASH)

    def dht_private_key(self) -> RSAPrivateKey:
        """This key as hivemind's RSAPrivateKey, for RSASignatureValidator (DHT record owner)."""
        from hivemind.utils.crypto import RSAPrivateKey

        k = RSAPrivateKey.__new__(RSAPrivateKey)
        k._private_key = self._key  # hivemind's class keeps the cryptography key here
        return k


def short_id(peer_id: str) -> str:
    """How logs, `status` and the leaderboard print a peer id: its last 8 characters (libp2p ids of
    RSA keys all start alike, so the tail is what tells peers apart). `grep` finds it in full ids."""
    return "…" + peer_id[-8:]
