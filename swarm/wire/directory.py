"""hetero.directory.v1's messages: the records that decide who trains, passed peer to peer with
their owners' DHT signatures (any node -> a coordinator, a learner, any node holding them; and back).

    DirectoryRequest  {"wants": [(kind, owner, have)], "offer": [entries of the caller's own records]}
    DirectoryReply    {"entries": [entries the server holds, newer than the asker's], "taken": offers kept
                       [, "error": why it answered nothing: busy, malformed]}

An `Entry` is a DHT record as its owner signed it for the DHT: its kind, its owner subkey, its
value with the signature, and its expiration. A reader checks it with the very validators every DHT
peer runs (swarm/directory/sealed.py), at the owner's own key, so a record reads the same, and is
refused for the same reasons, whichever path it came by. What a node does with them:
swarm/directory/.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from swarm.wire import MAX_MESSAGE, decode_message

DIRECTORY = "hetero.directory.v1"

Kind = Literal["swarm", "peer", "tally"]
"""The kinds a directory passes: a coordinator's swarm record (which learners train), a named
learner's peer record (where to reach it) and its tally (whom it credited: who shares downloads,
and whose DHT records a node favours)."""
MAX_WANTS = 64
"""Records one request asks for: its coordinators' swarm records, and a peer record and a tally of
each learner they name (a swarm names a few at most; swarm/directory/book.py keeps 16 a coordinator)."""
MAX_OFFER = 4
"""Entries one request offers: a learner's own peer record and tally."""
MAX_OWNER = 64
"""Characters of a peer id (base58 of a 2048-bit RSA key's multihash: 46)."""
MAX_SUBKEY = 1024
"""Bytes of an owner subkey, packed (swarm/dht/validation.py)."""
MAX_VALUE = 1 * 1024 * 1024 + 2048
"""Bytes of a signed value: the largest record the DHT keeps (a 1 MiB tally) and its signature."""
MAX_REPLY = MAX_MESSAGE
"""A reply's bytes at most: the server stops adding entries before it (two full tallies fit); the
asker asks again for the rest."""

Owner = Annotated[str, Meta(min_length=1, max_length=MAX_OWNER)]


class Want(Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    kind: Kind
    owner: Owner
    have: float = 0.0
    """The expiration of the copy the asker holds (0: none): only a newer one is sent."""


class Entry(Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    kind: Kind
    subkey: Annotated[bytes, Meta(max_length=MAX_SUBKEY)]
    """`[owner:<key>]`, packed as the DHT packs it (what the signature covers)."""
    value: Annotated[bytes, Meta(max_length=MAX_VALUE)]
    """The record's msgpack and its `[signature:...]`."""
    expires: float
    """DHT time it expires at (signed with the rest)."""

    @property
    def nbytes(self) -> int:
        return len(self.subkey) + len(self.value) + 32


class DirectoryRequest(Struct, forbid_unknown_fields=True, gc=False):
    wants: Annotated[list[Want], Meta(max_length=MAX_WANTS)] = []
    offer: Annotated[list[Entry], Meta(max_length=MAX_OFFER)] = []

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> DirectoryRequest:
        """ValueError if it is not one (a peer's bytes: nothing else escapes)."""
        return _decode(_REQUEST, data)


class DirectoryReply(Struct, forbid_unknown_fields=True, gc=False):
    entries: Annotated[list[Entry], Meta(max_length=MAX_WANTS)] = []
    taken: Annotated[int, Meta(ge=0, le=MAX_OFFER)] = 0
    error: Literal["busy", "malformed"] | UnsetType = UNSET

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> DirectoryReply:
        return _decode(_REPLY, data)


def _decode(decoder: msgspec.msgpack.Decoder, data: bytes):
    return decode_message(decoder, data, MAX_MESSAGE, "a directory message")


_REQUEST = msgspec.msgpack.Decoder(DirectoryRequest)
_REPLY = msgspec.msgpack.Decoder(DirectoryReply)
