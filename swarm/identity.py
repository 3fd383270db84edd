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

import base58
import multihash
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey

_PAD = padding.PKCS1v15()
_HASH = hashes.SHA256()


def peer_id_of(public_key_der: bytes) -> str:
    """libp2p peer id (base58) of an RSA public key in DER SubjectPublicKeyInfo form."""
    proto = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=public_key_der).SerializeToString()
    return base58.b58encode(multihash.encode(hashlib.sha256(proto).digest(), "sha2-256")).decode()


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
            path.write_bytes(crypto_pb2.PrivateKey(key_type=crypto_pb2.RSA, data=der).SerializeToString())
            os.chmod(path, 0o400)
        proto = crypto_pb2.PrivateKey.FromString(path.read_bytes())
        if proto.key_type != crypto_pb2.RSA:
            raise ValueError(f"{path}: only RSA identities are supported (got key type {proto.key_type})")
        return cls(serialization.load_der_private_key(proto.data, password=None), path)

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data, _PAD, _HASH)

    def dht_private_key(self) -> RSAPrivateKey:
        """This key as hivemind's RSAPrivateKey, for RSASignatureValidator (DHT record owner)."""
        k = RSAPrivateKey.__new__(RSAPrivateKey)
        k._private_key = self._key  # hivemind's class keeps the cryptography key here
        return k


def short_id(peer_id: str) -> str:
    """How logs, `status` and the leaderboard print a peer id: its last 8 characters (libp2p ids of
    RSA keys all start alike, so the tail is what tells peers apart). `grep` finds it in full ids."""
    return "…" + peer_id[-8:]
