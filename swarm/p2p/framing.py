"""The wire framing of our streamed and gated calls: hivemind's protobuf stream, written and read by hand.

A frame of hivemind's protobuf stream is a marker byte (`P2P.MESSAGE_MARKER`, or `P2P.ERROR_MARKER`
before an `RPCError`), the 8-byte big-endian length of a serialized protobuf, and that protobuf: for
us a `BytesValue` holding raw bytes (msgpack), so no .proto files are needed. Items are written after
a hand-made header and read back as views: hivemind would copy each item three times (into a
BytesValue, into its serialization, and the caller's slice), which on a memory-bound host costs more
than the transfer itself (examples/bench_distribution.py). The bytes are exactly what hivemind's own
`send_protobuf` writes and `receive_protobuf` reads (tests/unit/swarm/test_framing.py).
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from dataclasses import dataclass
from typing import Awaitable, TypeVar

from google.protobuf.wrappers_pb2 import BytesValue
from hivemind.p2p import P2P
from hivemind.proto.p2pd_pb2 import RPCError

from swarm.identity import short_id
from swarm.wire import MAX_MESSAGE

T = TypeVar("T")


class RemoteError(RuntimeError):
    """A peer's handler failed, or it broke the stream protocol."""


class NotAnswered(ConnectionError):
    """A gated call's stream ended before the callee's door said a word. The payload goes only after
    the door's go, so the callee read none of it: the call may be made again at once, as gRPC
    retries a call that never reached the server's application."""


class StreamStalled(TimeoutError):
    """A peer sent nothing for `Stall.idle_s`, or an item slower than `Stall.min_rate`."""


@dataclass(frozen=True)
class Stall:
    """Bounds on a stream reply, per item: its frame header within `idle_s` of the previous item
    (or of the request), and its payload within `idle_s + length / min_rate` of its header, so an
    item must average about `min_rate` bytes/s once `idle_s` of slack is spent. One deadline per
    payload rather than per piece read: reading a frame in pieces would copy it twice."""
    idle_s: float
    min_rate: float

    def within_s(self, nbytes: int) -> float:
        """The longest an item of `nbytes` may take, its header included, under these bounds."""
        return 2 * self.idle_s + nbytes / self.min_rate


GATED_BODY = Stall(idle_s=10.0, min_rate=64 * 1024)
"""A gated call's payload, once the door let it in (`SwarmNode.add_gated_handler`): it must start
within 10 s and average 64 KiB/s (~0.5 Mbit/s, under any volunteer's uplink), so a trickle holds no
handler; what a caller allows for its call follows from it (`gated_call_s`)."""
GATED_ASK_S = 10.0
"""What a gated call's ask (its declared size) may take to arrive: the handler's request timeout."""


def gated_call_s(nbytes: int, reply_s: float) -> float:
    """What a caller of a gated call with a payload of `nbytes` waits at most: the ask, the door's
    tarpit (at most 10 s), the payload at the handler's slowest rate (`GATED_BODY`), and `reply_s`
    for the handler's work and the reply. A fixed 30 s gave up on a 3 MiB batch below ~0.8 Mbit/s,
    which the learner would still have taken."""
    return GATED_ASK_S + 10.0 + GATED_BODY.within_s(nbytes) + reply_s


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of `n` >= 0: 7 bits a byte, low first, the high bit set on all but the last."""
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def item_header(n: int) -> bytes:
    """What precedes an item of `n` bytes in hivemind's protobuf stream: the message marker, the
    8-byte length of the serialized BytesValue, and that BytesValue's own header (field 1,
    length-delimited; proto3 writes nothing at all for an empty value)."""
    pb = b"\x0a" + varint(n) if n else b""
    return P2P.MESSAGE_MARKER + (len(pb) + n).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER) + pb


def bytes_value_view(data: bytes) -> memoryview | bytes:
    """The value of a serialized BytesValue: a view when it is the usual single field 1, else
    (an empty value, any other valid encoding) what protobuf's own parser says."""
    if data[:1] == b"\x0a":
        n, shift, pos = 0, 0, 1
        while pos < min(len(data), 11):  # the varint length
            byte, pos = data[pos], pos + 1
            n, shift = n | (byte & 0x7F) << shift, shift + 7
            if byte < 0x80:
                if pos + n == len(data):
                    return memoryview(data)[pos:]
                break
    return BytesValue.FromString(data).value


async def send_item(writer: asyncio.StreamWriter, item: bytes | memoryview, timeout: float) -> None:
    """One item of hivemind's protobuf stream, written as it is (no copy into a BytesValue)."""
    writer.write(item_header(len(item)))
    writer.write(item)
    await asyncio.wait_for(writer.drain(), timeout)


async def send_value(writer: asyncio.StreamWriter, payload: bytes) -> None:
    """One request frame, through hivemind's own writer (requests are small or sent once)."""
    await P2P.send_protobuf(BytesValue(value=payload), writer)


async def send_error(writer: asyncio.StreamWriter, e: Exception) -> None:
    """Tell the caller that its call failed, as hivemind does (an error frame, not a silent end);
    best effort: the caller may be gone."""
    with suppress(Exception):
        await P2P.send_protobuf(RPCError(message=str(e)), writer)


def remote_error(name: str, peer_id: str, data: bytes) -> RemoteError:
    """The failure a peer reported in an error frame's `RPCError`."""
    return RemoteError(f"{name} at {short_id(peer_id)} failed: {RPCError.FromString(data).message}")


async def _within(read: Awaitable[T], seconds: float | None, what: str) -> T:
    if seconds is None:
        return await read
    try:
        return await asyncio.wait_for(read, seconds)
    except asyncio.TimeoutError:
        raise StreamStalled(f"{what} not read in {seconds:.1f} s") from None


async def read_frame(reader: asyncio.StreamReader, max_len: int, stall: Stall | None = None) -> tuple[bytes, bytes]:
    """(marker, payload) of one frame of hivemind's protobuf stream, refusing a length over `max_len`
    before reading it: the length is the peer's claim. `stall` bounds the time each part may take."""
    idle = None if stall is None else stall.idle_s
    marker = await _within(reader.readexactly(1), idle, "a frame header")
    if marker not in (P2P.MESSAGE_MARKER, P2P.ERROR_MARKER):
        raise RemoteError(f"not a protobuf stream frame (marker {marker!r})")
    length = int.from_bytes(await _within(reader.readexactly(P2P.HEADER_LEN), idle, "a frame header"), P2P.BYTEORDER)
    if length > max_len:
        raise RemoteError(f"a frame of {length} bytes, over the {max_len} allowed")
    payload_s = None if stall is None else stall.idle_s + length / stall.min_rate
    return marker, await _within(reader.readexactly(length), payload_s, f"a frame of {length} bytes")


async def read_reply(reader: asyncio.StreamReader, name: str, peer_id: str, max_reply: int) -> bytes:
    """One reply frame of `name` at `peer_id`, its value copied; raises the peer's error frame."""
    marker, data = await read_frame(reader, max_reply + 16)  # + the BytesValue header
    if marker == P2P.ERROR_MARKER:
        raise remote_error(name, peer_id, data)
    return bytes(bytes_value_view(data))


async def send_ask(writer: asyncio.StreamWriter, size: int) -> None:
    """A gated call's first frame: the size of the payload it would send (8 bytes, big-endian)."""
    await send_value(writer, size.to_bytes(8, "big"))


def declared_size(ask: bytes) -> int | None:
    """The payload size a gated call declares (`send_ask`), if it is one we read at all."""
    value = BytesValue.FromString(ask).value
    n = int.from_bytes(value, "big") if len(value) == 8 else -1
    return n if 0 <= n <= MAX_MESSAGE else None
