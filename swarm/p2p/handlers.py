"""What serves our three kinds of RPC on hivemind's P2P: unary, server-streaming, and gated.

Each builds the callable hivemind registers (`add_protobuf_handler`, `add_binary_stream_handler`)
around a handler that sees raw bytes and the caller's peer id; `SwarmNode` registers them.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from contextlib import closing, suppress
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable

from google.protobuf.message import DecodeError
from google.protobuf.wrappers_pb2 import BytesValue
from hivemind.p2p import P2P, P2PContext

from swarm.identity import short_id
from swarm.p2p.budget import StreamBudget
from swarm.p2p.framing import MAX_MESSAGE, RemoteError, Stall, declared_size, read_frame, send_error, send_item

log = logging.getLogger(__package__)  # the package's one logger: its lines read as before the split

Handler = Callable[[bytes, str], Awaitable[bytes]]
"""async handler(payload, remote_peer_id) -> reply payload."""
StreamHandler = Callable[[bytes, str], AsyncIterator[bytes | memoryview]]
"""async generator handler(payload, remote_peer_id) yielding reply items (each under MAX_MESSAGE)."""
Gate = Callable[[str, int, int], Awaitable["bytes | None"]]
"""async door(remote_peer_id, declared payload bytes, its calls past the door now) -> a reply that
ends the call before its payload is read, or None to read it (the door then owns the cost)."""


def decrement(counter: collections.Counter, key, n: int = 1) -> None:
    """Take `n` from `counter[key]`, dropping the key at zero (per-peer counters must not grow)."""
    counter[key] -= n
    if counter[key] <= 0:
        del counter[key]


def quiet_on_shutdown(handle):
    """A stream handler whose task ends quietly when cancelled (`shutdown` cancels the calls still
    being served): asyncio's stream callback would log a cancelled handler task as an error."""
    @functools.wraps(handle)
    async def wrapped(*args) -> None:
        try:
            await handle(*args)
        except asyncio.CancelledError:
            log.debug("a stream handler was cancelled (shutting down)")
    return wrapped


def unary(handler: Handler):
    """hivemind's protobuf handler for `handler`: payloads travel in a BytesValue each way."""
    async def _wrapped(request: BytesValue, context: P2PContext) -> BytesValue:
        return BytesValue(value=await handler(request.value, context.remote_id.to_base58()))
    return _wrapped


@dataclass(frozen=True)
class BoundedStream:
    """A streaming handler whose door bounds the request itself (the chunk door, swarm/weights/chunks.py):
    a request frame over `max_request` bytes is refused from its header, its payload left unread, and
    it (or a frame that is not a BytesValue) goes to `refused(remote, why)`, which charges, counts and
    tarpits it as the door does a call past its budget; no item is sent. Passed where a
    `StreamHandler` is (`SwarmNode.add_stream_handler`): it is one."""
    handler: StreamHandler
    max_request: int
    """The largest request payload a caller that follows the protocol sends."""
    refused: Callable[[str, str], Awaitable[None]]

    def __call__(self, payload: bytes, remote: str) -> AsyncIterator[bytes | memoryview]:
        return self.handler(payload, remote)


def streaming(name: str, handler: StreamHandler, request_timeout: float, send_timeout: float, budget: StreamBudget):
    """hivemind's binary stream handler for a server-streaming `handler`: one request frame, then
    each item `handler` yields, written after a hand-made frame header (swarm/p2p/framing.py). The
    stream is counted against `budget` before a byte is read, and closed unread past it. The request
    is read up to MAX_MESSAGE, or a `BoundedStream`'s own bound."""
    bounded = handler if isinstance(handler, BoundedStream) else None
    max_request = bounded.max_request if bounded is not None else MAX_MESSAGE

    @quiet_on_shutdown
    async def _handle(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        remote = info.peer_id.to_base58()
        with closing(writer), budget.hold(remote, name) as admitted:
            if not admitted:
                return
            try:  # the bound (+ the BytesValue header) is checked on the frame's header, before its payload is read
                marker, data = await asyncio.wait_for(read_frame(reader, max_request + 16), request_timeout)
                request = BytesValue.FromString(data) if marker == P2P.MESSAGE_MARKER else None
            except (RemoteError, DecodeError) as e:  # a frame over the bound (unread), not a frame, not a BytesValue
                log.debug("%s: a broken request from %s (%s)", name, short_id(remote), e)
                if bounded is not None:
                    try:
                        await bounded.refused(remote, f"{type(e).__name__}: {e}")
                    except Exception as bug:  # a bug of ours: the call ends, the node goes on
                        log.warning("%s door failed: %s", name, bug, exc_info=True)
                return
            except Exception as e:  # nothing in time, a closed stream
                log.debug("%s: no request from %s (%s)", name, short_id(remote), e)
                return
            if request is None:  # the caller sent its end of stream (or an error) and nothing else
                return
            try:
                async for item in handler(request.value, remote):
                    await send_item(writer, item, send_timeout)
            except (ConnectionError, asyncio.TimeoutError) as e:  # the caller left or stopped reading
                log.debug("%s: stream to %s ended: %s", name, short_id(remote), e)
            except Exception as e:  # as hivemind does: the caller gets the error, not a silent end
                log.warning("%s handler failed: %s", name, e, exc_info=True)
                await send_error(writer, e)
    return _handle


@dataclass
class GatedHandler:
    """hivemind's binary stream handler for a gated call (`calls.call_gated`): the caller declares
    its payload's size, `door` answers before a byte of it is read (a refusal, or go), and only then
    is the payload read, within `body` and no longer than declared, and handed to `handler`. The
    stream is counted against `budget` before a byte is read, and closed unread past it."""
    name: str
    door: Gate
    handler: Handler
    request_timeout: float
    body: Stall
    send_timeout: float
    budget: StreamBudget
    open_calls: collections.Counter = field(default_factory=collections.Counter, init=False)
    """Per peer: its calls past the door now (what `door` is told)."""

    @quiet_on_shutdown
    async def __call__(self, info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        remote = info.peer_id.to_base58()
        with closing(writer), self.budget.hold(remote, self.name) as admitted:
            if admitted:
                await self._call(remote, reader, writer)

    async def _call(self, remote: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The ask, the door's answer, then (past the door) the call itself."""
        declared = await self._declared(remote, reader)
        if declared is None:
            return
        try:
            refusal = await self.door(remote, declared, self.open_calls[remote])
        except Exception as e:  # a bug of ours: the call ends, the node goes on
            log.warning("%s door failed: %s", self.name, e, exc_info=True)
            return
        if refusal is not None:  # its payload, if it sent it anyway, stays unread
            assert refusal, "a door's refusal must not be empty: the caller reads that as go"
            with suppress(ConnectionError, asyncio.TimeoutError):
                await send_item(writer, refusal, self.send_timeout)
            return
        self.open_calls[remote] += 1
        try:
            await self._serve(remote, declared, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, RemoteError) as e:
            log.debug("%s: call from %s ended: %s", self.name, short_id(remote), e)
        except Exception as e:  # as hivemind does: the caller gets the error, not a silent end
            log.warning("%s handler failed: %s", self.name, e, exc_info=True)
            await send_error(writer, e)
        finally:
            decrement(self.open_calls, remote)

    async def _declared(self, remote: str, reader: asyncio.StreamReader) -> int | None:
        """The payload size the caller declares, or None if it sent no valid ask in time."""
        try:
            marker, ask = await asyncio.wait_for(read_frame(reader, 32), self.request_timeout)
            return declared_size(ask) if marker == P2P.MESSAGE_MARKER else None
        except Exception as e:  # nothing in time, a closed stream, a broken or oversized ask
            log.debug("%s: no request from %s (%s)", self.name, short_id(remote), e)
            return None

    async def _serve(self, remote: str, declared: int, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        """Past the door: say go, read the payload, reply with what `handler` makes of it."""
        await send_item(writer, b"", self.send_timeout)  # go
        marker, data = await read_frame(reader, declared + 16, self.body)
        try:
            payload = BytesValue.FromString(data).value if marker == P2P.MESSAGE_MARKER else None
        except DecodeError:
            payload = None
        if payload is None or len(payload) > declared:
            log.debug("%s: %s broke the protocol (not a frame of at most its declared size)",
                      self.name, short_id(remote))
            return
        await send_item(writer, await self.handler(payload, remote), self.send_timeout)
