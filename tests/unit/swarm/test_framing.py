"""The wire framing of streamed and gated calls (swarm/p2p/framing.py) against bytes worked out by
hand: a change here changes the protocol, which every peer of a swarm must share."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf.wrappers_pb2 import BytesValue

from swarm.p2p.framing import (MAX_MESSAGE, RemoteError, Stall, StreamStalled, bytes_value_view, declared_size,
                               item_header, read_frame, read_reply, send_ask, send_error, send_item, varint)

ZERO_LEN = bytes(8)


@pytest.mark.parametrize("n, encoded", [
    (0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"), (300, b"\xac\x02"),
    (16383, b"\xff\x7f"), (16384, b"\x80\x80\x01"), (1 << 20, b"\x80\x80\x40"),
])
def test_varint_is_protobufs_base_128_low_group_first(n, encoded):
    assert varint(n) == encoded


@pytest.mark.parametrize("n, header", [
    (0, b"\x00" + ZERO_LEN),  # proto3 writes nothing for an empty value: a frame of length 0
    (3, b"\x00" + (5).to_bytes(8, "big") + b"\x0a\x03"),  # marker, 2 + 3 bytes, field 1 of length 3
    (300, b"\x00" + (303).to_bytes(8, "big") + b"\x0a\xac\x02"),
])
def test_an_item_header_is_the_marker_the_frame_length_and_the_bytes_value_header(n, header):
    assert item_header(n) == header
    value = bytes(i % 251 for i in range(n))
    assert item_header(n)[9:] + value == BytesValue(value=value).SerializeToString()


def test_a_bytes_value_is_read_as_a_view_without_a_copy():
    data = b"\x0a\x03abc"
    view = bytes_value_view(data)
    assert isinstance(view, memoryview) and view.obj is data and bytes(view) == b"abc"
    assert bytes_value_view(b"") == b""  # the empty value
    assert bytes_value_view(b"\x0a\x03abc\x10\x01") == b"abc"  # another valid encoding: protobuf's parser


def test_a_gated_ask_declares_eight_big_endian_bytes_up_to_max_message():
    assert declared_size(b"\x0a\x08" + (5).to_bytes(8, "big")) == 5
    assert declared_size(b"\x0a\x08" + MAX_MESSAGE.to_bytes(8, "big")) == MAX_MESSAGE
    assert declared_size(b"\x0a\x08" + (MAX_MESSAGE + 1).to_bytes(8, "big")) is None
    assert declared_size(b"\x0a\x07" + bytes(7)) is None
    assert declared_size(b"\x0a\x08" + bytes(8)) == 0  # an empty payload may be declared
    assert declared_size(b"") is None  # an empty value declares nothing
    # what a caller writes
    writer = _Writer()
    asyncio.run(send_ask(writer, 5))
    assert writer.data == b"\x00" + (10).to_bytes(8, "big") + b"\x0a\x08" + (5).to_bytes(8, "big")


def test_a_frame_written_is_the_frame_read():
    writer = _Writer()
    asyncio.run(send_item(writer, memoryview(b"hello"), timeout=1))
    assert writer.data == b"\x00" + (7).to_bytes(8, "big") + b"\x0a\x05hello"
    assert asyncio.run(_read(writer.data, 16)) == (b"\x00", b"\x0a\x05hello")


def test_a_frame_over_its_bound_or_with_a_foreign_marker_is_refused_before_its_body():
    with pytest.raises(RemoteError, match="over the 6 allowed"):
        asyncio.run(_read(b"\x00" + (7).to_bytes(8, "big"), 6))  # the body is never needed
    with pytest.raises(RemoteError, match="not a protobuf stream frame"):
        asyncio.run(_read(b"\x02" + ZERO_LEN, 16))


def test_a_trickled_frame_stalls():
    with pytest.raises(StreamStalled, match="a frame header not read"):
        asyncio.run(_read(b"", 16, Stall(idle_s=0.05, min_rate=1.0), eof=False))
    with pytest.raises(StreamStalled, match="a frame of 7 bytes not read"):
        asyncio.run(_read(b"\x00" + (7).to_bytes(8, "big") + b"\x0a", 16, Stall(idle_s=0.05, min_rate=1000.0),
                          eof=False))


def test_an_error_frame_is_raised_with_the_peers_message():
    writer = _Writer()

    async def fail_and_read():
        await send_error(writer, ValueError("boom"))
        return await _reply(writer.data)

    with pytest.raises(RemoteError, match="t.rpc at .* failed: boom"):
        asyncio.run(fail_and_read())
    assert writer.data[:1] == b"\x01"


class _Writer:
    """The part of asyncio.StreamWriter that the framing uses."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data) -> None:
        self.data += bytes(data)

    async def drain(self) -> None:
        pass


async def _read(data: bytes, max_len: int, stall: Stall | None = None, eof: bool = True):
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return await read_frame(reader, max_len, stall)


async def _reply(data: bytes) -> bytes:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return await read_reply(reader, "t.rpc", "QmPeer", 64)


def test_a_gated_calls_wait_follows_its_payload_at_the_handlers_slowest_rate():
    """A fixed 30 s gave up on a 3 MiB batch below ~0.8 Mbit/s, which the learner would still take:
    the caller allows the ask, the door's tarpit, the payload at GATED_BODY's rate, and the reply."""
    from swarm.p2p.framing import GATED_ASK_S, GATED_BODY, gated_call_s

    assert (GATED_ASK_S, GATED_BODY.idle_s, GATED_BODY.min_rate) == (10.0, 10.0, 64 * 1024)
    assert gated_call_s(0, 30.0) == 10 + 10 + 2 * 10 + 30  # ask, tarpit, the body's two idle windows, the reply
    three_mib = 3 * 1024 * 1024
    assert gated_call_s(three_mib, 30.0) == 70 + three_mib / (64 * 1024) == 118.0
    # the slowest link the handler takes (64 KiB/s) delivers the largest batch within the caller's wait
    assert three_mib / (64 * 1024) < gated_call_s(three_mib, 30.0) - GATED_ASK_S - 10.0


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 1 << 20])
def test_hand_made_stream_frames_are_hivemind_protobuf_frames(n):
    """The chunk server writes items without protobuf and the fetcher reads them as views; both
    must stay byte-for-byte what hivemind's own protobuf stream writes and reads."""
    from hivemind.p2p import P2P

    value = bytes(range(256)) * (n // 256) + bytes(n % 256)
    serialized = BytesValue(value=value).SerializeToString()
    assert item_header(n) + value == P2P.MESSAGE_MARKER + len(serialized).to_bytes(8, "big") + serialized
    assert bytes(bytes_value_view(serialized)) == value
    # any other valid encoding (here an unknown extra field) still parses, through protobuf
    assert bytes(bytes_value_view(serialized + b"\x10\x01")) == value
