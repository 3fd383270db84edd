"""hetero.reach.v1's messages: can peers dial this one? (a joining node -> a bootstrap, and back).

    ReachRequest  {"ports": [TCP ports the caller listens on, at most MAX_PORTS]}
    ReachReply    {"ip": the address the bootstrap sees the caller at, "open": [ports it could connect to]
                   [, "error": why it did not probe: malformed, no_address, busy]}

What the bootstrap does with them: swarm/p2p/reach.py.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from swarm.wire import decode_message

REACH = "hetero.reach.v1"
MAX_PORTS = 4
MAX_REPLY_BYTES = 1024
"""A reply's bytes at most: an address and a few ports."""

Port = Annotated[int, Meta(gt=0, lt=65536)]


class ReachRequest(Struct, forbid_unknown_fields=True, gc=False):
    ports: Annotated[list[Port], Meta(min_length=1, max_length=MAX_PORTS)]

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def ports_of(cls, payload: bytes) -> list[int]:
        """The ports a request names, sorted, or [] if it is malformed (a peer's input: never raises)."""
        try:
            request = _REQUEST.decode(payload)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):  # garbage, too long, not a map
            return []
        return sorted(set(request.ports))


class ReachReply(Struct, gc=False):
    ip: Annotated[str, Meta(max_length=64)] = ""
    open: Annotated[list[Port], Meta(max_length=MAX_PORTS)] = []
    error: str | UnsetType = UNSET
    """Why the bootstrap did not probe; "busy" means ask again, never "not reachable"."""

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> ReachReply:
        """A bootstrap's reply; ValueError if it is none."""
        return decode_message(_REPLY, data, MAX_REPLY_BYTES, "a reach reply")


_REQUEST = msgspec.msgpack.Decoder(ReachRequest)
_REPLY = msgspec.msgpack.Decoder(ReachReply)
