"""A peer on the hivemind swarm: the DHT (its own process with p2pd) plus our P2P RPC handlers.

hivemind is asyncio; the roles are plain blocking code. `SwarmNode` runs one event loop in a
background thread and exposes blocking calls that always take a timeout. Payloads are raw bytes
(msgpack) carried in protobuf `BytesValue`, so no .proto files are needed. One RPC reply is capped
at 4 MiB by hivemind, so callers keep messages under `MAX_MESSAGE`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import logging
import queue
import threading
import time
from contextlib import closing, suppress
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from google.protobuf.message import DecodeError
from google.protobuf.wrappers_pb2 import BytesValue
from hivemind.p2p import P2P, P2PContext, PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError
from hivemind.proto.p2pd_pb2 import RPCError
from hivemind.utils.multiaddr import Multiaddr

from .dht import (NetworkConfig, announce, announce_holdings, create_dht, list_holders, list_peers, list_tallies,
                  peer_id_of_maddr, publish_swarm_record, publish_tally, trusted_learners)
from .identity import Identity, short_id

log = logging.getLogger(__name__)

MAX_MESSAGE = 3 * 1024 * 1024
Handler = Callable[[bytes, str], Awaitable[bytes]]
"""async handler(payload, remote_peer_id) -> reply payload."""
StreamHandler = Callable[[bytes, str], AsyncIterator[bytes | memoryview]]
"""async generator handler(payload, remote_peer_id) yielding reply items (each under MAX_MESSAGE)."""
Door = Callable[[str, int, int], Awaitable["bytes | None"]]
"""async door(remote_peer_id, declared payload bytes, its calls past the door now) -> a reply that
ends the call before its payload is read, or None to read it (the door then owns the cost)."""
T = TypeVar("T")
_END = object()


class CallStopped(Exception):
    """A call given up because the caller is stopping (`SwarmNode.call`'s `stop`)."""


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


class SwarmNode:
    def __init__(self, identity: Identity, net: NetworkConfig, swarm: str) -> None:
        self.identity = identity
        self.swarm = swarm
        self.private = net.client_mode
        """Behind a NAT (swarm/reach.py): peers cannot dial us, except through a relay."""
        self.coordinators = {peer_id_of_maddr(m) for m in net.initial_peers}
        """Peers whose swarm record this node trusts: the bootstrap peers it was pointed at."""
        self.dht = create_dht(identity, net, swarm)  # forks: do this before CUDA is initialised
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="swarm-loop", daemon=True)
        self._thread.start()
        self.p2p = self.run(self.dht.replicate_p2p(), timeout=30)

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def run(self, coro, timeout: float):
        """Run a coroutine on the swarm loop and wait for it, at most `timeout` seconds."""
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self._loop).result(timeout + 1)

    def maddrs(self) -> list[str]:
        return [str(m) for m in self.dht.get_visible_maddrs()]



    def announce(self, info: dict, ttl: float = 60.0) -> bool:
        return announce(self.dht, self.identity, self.swarm, {"private": self.private, **info}, ttl)

    def peers(self) -> list[dict]:
        return list_peers(self.dht, self.swarm)

    def announce_holdings(self, chain: str, versions: list[int], ttl: float = 60.0) -> bool:
        return announce_holdings(self.dht, self.identity, self.swarm, chain, versions, ttl)

    def holders(self) -> list[dict]:
        return list_holders(self.dht, self.swarm)

    def publish_tally(self, value: dict, ttl: float = 600.0) -> bool:
        return publish_tally(self.dht, self.identity, self.swarm, value, ttl)

    def tallies(self) -> list[dict]:
        return list_tallies(self.dht, self.swarm)

    def publish_swarm_record(self, learners: dict[str, str], model_id: str = "", ttl: float = 60.0) -> bool:
        return publish_swarm_record(self.dht, self.identity, self.swarm, learners, model_id, ttl)

    def trusted_learners(self, coordinators: set[str]) -> dict[str, str]:
        return trusted_learners(self.dht, self.swarm, coordinators)

    def add_handler(self, name: str, handler: Handler) -> None:
        async def _wrapped(request: BytesValue, context: P2PContext) -> BytesValue:
            return BytesValue(value=await handler(request.value, context.remote_id.to_base58()))

        self.run(self.p2p.add_protobuf_handler(name, _wrapped, BytesValue), timeout=10)

    def add_stream_handler(self, name: str, handler: StreamHandler, request_timeout: float = 30.0,
                           send_timeout: float = 60.0) -> None:
        """A server-streaming RPC: one request, many reply items on one libp2p stream. Much faster
        than one unary call per item (no per-call round trip through the daemon).

        On the wire this is exactly hivemind's protobuf stream of `BytesValue`s, but items are written
        as they are (bytes or memoryviews) after a hand-made frame header: hivemind would copy each
        item three times (into a BytesValue, into its serialization, and the caller's slice), which
        on a memory-bound host costs more than the transfer itself (examples/bench_distribution.py).
        """
        @_quiet_on_shutdown
        async def _handle(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with closing(writer):
                try:
                    marker, data = await asyncio.wait_for(_read_frame(reader, MAX_MESSAGE), request_timeout)
                    request = BytesValue.FromString(data)
                except Exception as e:  # nothing in time, a closed stream, an oversized or broken frame
                    log.debug("%s: no request from %s (%s)", name, short_id(info.peer_id.to_base58()), e)
                    return
                if marker != P2P.MESSAGE_MARKER:  # the caller sent its end of stream (or an error) and nothing else
                    return
                try:
                    async for item in handler(request.value, info.peer_id.to_base58()):
                        await _send_item(writer, item, send_timeout)
                except (ConnectionError, asyncio.TimeoutError) as e:  # the caller left or stopped reading
                    log.debug("%s: stream to %s ended: %s", name, short_id(info.peer_id.to_base58()), e)
                except Exception as e:  # as hivemind does: the caller gets the error, not a silent end
                    log.warning("%s handler failed: %s", name, e, exc_info=True)
                    with suppress(Exception):
                        await P2P.send_protobuf(RPCError(message=str(e)), writer)

        self.run(self.p2p.add_binary_stream_handler(name, _handle), timeout=10)

    def add_gated_handler(self, name: str, door: Door, handler: Handler, request_timeout: float = 10.0,
                          body: Stall = Stall(idle_s=10.0, min_rate=64 * 1024), send_timeout: float = 30.0) -> None:
        """A request/reply RPC whose payload is read only once `door` lets it in (`call_gated`).

        A unary hivemind call hands the handler a payload that p2pd has already read whole, so a peer
        past its byte budget still costs the receiver every byte it sends (64 calls of 2.5 MiB at once
        did). Here the caller first declares the payload's size; the door answers (busy, say) before a
        byte of it is read, and a caller that sends it anyway is not read: the stream's flow control
        (p2pd's socket and yamux's window) stops it after a few hundred KiB. The payload then must
        come within `body` (a trickle does not hold a handler) and be no longer than declared.
        """
        open_calls: collections.Counter[str] = collections.Counter()

        @_quiet_on_shutdown
        async def _handle(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            remote = info.peer_id.to_base58()
            with closing(writer):
                try:
                    marker, ask = await asyncio.wait_for(_read_frame(reader, 32), request_timeout)
                    declared = _declared_size(ask) if marker == P2P.MESSAGE_MARKER else None
                except Exception as e:  # nothing in time, a closed stream, a broken or oversized ask
                    log.debug("%s: no request from %s (%s)", name, short_id(remote), e)
                    return
                if declared is None:
                    return
                try:
                    refusal = await door(remote, declared, open_calls[remote])
                except Exception as e:  # a bug of ours: the call ends, the node goes on
                    log.warning("%s door failed: %s", name, e, exc_info=True)
                    return
                if refusal is not None:  # its payload, if it sent it anyway, stays unread
                    assert refusal, "a door's refusal must not be empty: the caller reads that as go"
                    with suppress(ConnectionError, asyncio.TimeoutError):
                        await _send_item(writer, refusal, send_timeout)
                    return
                open_calls[remote] += 1
                try:
                    await _send_item(writer, b"", send_timeout)  # go
                    marker, data = await _read_frame(reader, declared + 16, body)
                    try:
                        payload = BytesValue.FromString(data).value if marker == P2P.MESSAGE_MARKER else None
                    except DecodeError:
                        payload = None
                    if payload is None or len(payload) > declared:
                        log.debug("%s: %s broke the protocol (not a frame of at most its declared size)",
                                  name, short_id(remote))
                        return
                    await _send_item(writer, await handler(payload, remote), send_timeout)
                except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, RemoteError) as e:
                    log.debug("%s: call from %s ended: %s", name, short_id(remote), e)
                except Exception as e:  # as hivemind does: the caller gets the error, not a silent end
                    log.warning("%s handler failed: %s", name, e, exc_info=True)
                    with suppress(Exception):
                        await P2P.send_protobuf(RPCError(message=str(e)), writer)
                finally:
                    decrement(open_calls, remote)

        self.run(self.p2p.add_binary_stream_handler(name, _handle), timeout=10)

    def call_gated(self, peer_id: str, name: str, payload: bytes, timeout: float) -> bytes:
        """Call a gated RPC (`add_gated_handler`): the door's answer, or the handler's reply."""
        return self._routed(peer_id, lambda: call_gated(self.p2p, peer_id, name, payload), timeout)

    def call_stream(self, peer_id: str, name: str, payload: bytes, timeout: float,
                    on_item: Callable[[memoryview | bytes], None], max_item: int = MAX_MESSAGE,
                    stall: Stall | None = None) -> int:
        """Call a streaming RPC; `on_item` runs in the calling thread for each item as it arrives, so
        that a caller can use items before the stream ends while the swarm loop goes on reading (work
        such as hashing on the loop would stall the stream). Items are read-only views of the
        received frames (no copy). Returns the number of items; raises on timeout (for the whole
        stream), if the peer cannot be reached, on an item over `max_item` bytes (hivemind's own
        reader would buffer whatever length a peer announces), and `StreamStalled` when `stall`'s
        bounds are broken (a peer that trickles bytes must not hold the caller for `timeout`)."""
        items: queue.SimpleQueue = queue.SimpleQueue()

        async def _call() -> int:
            _, reader, writer = await self.p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), name)
            with closing(writer):
                # one request frame and no end marker: the server reads exactly one frame, and a
                # marker written after a fast server has answered and closed broke the pipe, which
                # the reader then raised in place of the replies already buffered
                await P2P.send_protobuf(BytesValue(value=payload), writer)
                n = 0
                while True:
                    try:
                        marker, data = await _read_frame(reader, max_item + 16, stall)  # + the BytesValue header
                    except asyncio.IncompleteReadError:  # the stream's end (or a reset: the caller verifies)
                        return n
                    if marker == P2P.ERROR_MARKER:
                        raise RemoteError(f"{name} at {short_id(peer_id)} failed: {RPCError.FromString(data).message}")
                    items.put(_bytes_value_view(data))
                    n += 1

        return self._routed(peer_id, _call, timeout, lambda coro, t: self._run_feeding(coro, t, items, on_item))

    def _run_feeding(self, coro, timeout: float, items: queue.SimpleQueue, on_item: Callable) -> T:
        """As `run`, calling `on_item` here for each item the coroutine puts in `items` meanwhile."""
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self._loop)
        future.add_done_callback(lambda _: items.put(_END))
        deadline = time.monotonic() + timeout + 1
        try:
            while (item := items.get(timeout=max(deadline - time.monotonic(), 0))) is not _END:
                on_item(item)
        except queue.Empty:  # wait_for ends the call at `timeout`: only a stuck loop gets here
            raise TimeoutError(f"no end of stream in {timeout:.1f} s") from None
        finally:
            future.cancel()  # if on_item raised: stop reading (a no-op once done)
        return future.result(0)

    def call(self, peer_id: str, name: str, payload: bytes, timeout: float,
             stop: threading.Event | None = None) -> bytes:
        """Call `name` on `peer_id`; raises on timeout or if the peer cannot be reached, and
        `CallStopped` as soon as `stop` is set (a long poll must not hold up a shutdown)."""
        async def _call() -> bytes:
            reply = await self.p2p.call_protobuf_handler(PeerID.from_base58(peer_id), name,
                                                         BytesValue(value=payload), BytesValue)
            return reply.value

        return self._routed(peer_id, _call, timeout, None if stop is None else lambda c, t: self._run_until(c, t, stop))

    def _run_until(self, coro, timeout: float, stop: threading.Event) -> T:
        """As `run`, but given up (the call cancelled) as soon as `stop` is set."""
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self._loop)
        deadline = time.monotonic() + timeout + 1
        while not stop.is_set():
            try:
                return future.result(min(0.2, max(deadline - time.monotonic(), 0)))
            except concurrent.futures.TimeoutError:
                if time.monotonic() >= deadline:
                    future.cancel()
                    raise TimeoutError(f"no reply in {timeout:.1f} s") from None
        future.cancel()
        raise CallStopped("stopped while waiting for a reply")

    def _routed(self, peer_id: str, make_call: Callable[[], Awaitable[T]], timeout: float,
                run: Callable[[Awaitable[T], float], T] | None = None) -> T:
        """Run `make_call()` within `timeout`, waiting for a route to `peer_id` first if need be.

        A peer that has just joined knows only its bootstrap peers: libp2p answers "routing: not
        found" until its routing table learns the target. Rather than fail a user's first call, we
        dial the target at the addresses it announced in the DHT and retry, within the timeout.
        """
        deadline, pause = time.monotonic() + timeout, 0.2
        while True:
            try:
                return (run or self.run)(make_call(), max(deadline - time.monotonic(), 0.1))
            except P2PDaemonError as e:
                if "routing" not in str(e) or time.monotonic() + pause >= deadline:
                    raise
                log.debug("no route to %s yet (%s); dialling its announced addresses", short_id(peer_id), e)
                self._dial(peer_id, min(5.0, max(deadline - time.monotonic(), 0.1)))
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

    def _dial(self, peer_id: str, timeout: float) -> None:
        """Best effort: connect to `peer_id` at the multiaddrs in its PeerInfo record."""
        maddrs = [m for p in self.peers() if p.get("peer_id") == peer_id for m in p.get("maddrs", [])]
        if not maddrs:
            return
        try:
            self.run(self.p2p._client.connect(PeerID.from_base58(peer_id), [Multiaddr(m) for m in maddrs]), timeout)
        except Exception as e:  # the retry that follows says whether it helped
            log.debug("dialling %s failed: %s", short_id(peer_id), e)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Graceful: stop p2p and the DHT process (which stops its p2pd)."""
        try:
            self.run(self.p2p.shutdown(), timeout=timeout)
        except Exception as e:  # shutting down anyway; say why it was not clean
            log.warning("p2p shutdown: %s", e)
        self.dht.shutdown()
        try:  # end the calls still running: their callers' threads wait on them (process exit joins those)
            # not self.run: its wait_for task would be one of the "others" and cancel this very call
            asyncio.run_coroutine_threadsafe(_cancel_others(timeout), self._loop).result(timeout + 1)
        except Exception as e:
            log.warning("cancelling calls at shutdown: %s", e)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)


async def _cancel_others(timeout: float) -> None:
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in others:
        t.cancel()
    if others:
        await asyncio.wait(others, timeout=timeout)


def _quiet_on_shutdown(handle):
    """A stream handler whose task ends quietly when cancelled (`shutdown` cancels the calls still
    being served): asyncio's stream callback would log a cancelled handler task as an error."""
    @functools.wraps(handle)
    async def wrapped(*args) -> None:
        try:
            await handle(*args)
        except asyncio.CancelledError:
            log.debug("a stream handler was cancelled (shutting down)")
    return wrapped


async def call_gated(p2p: P2P, peer_id: str, name: str, payload: bytes, max_reply: int = MAX_MESSAGE,
                     eager: bool = False) -> bytes:
    """One gated call on `p2p`: declare the payload's size, send it only if the door says go, and
    return the reply (the door's own, when it said no). `eager` sends the payload without waiting
    for the door, as a flooder would (tests use it to show that it gains nothing)."""
    _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), name)
    with closing(writer):
        await P2P.send_protobuf(BytesValue(value=len(payload).to_bytes(8, "big")), writer)
        if eager:  # the payload is written while the answer is awaited: a door that says no never reads it
            send = asyncio.ensure_future(P2P.send_protobuf(BytesValue(value=payload), writer))
            try:
                answer = await _read_reply(reader, name, peer_id, max_reply)
                if answer:
                    return answer
                await send  # go: the handler reads it and replies
                return await _read_reply(reader, name, peer_id, max_reply)
            finally:
                send.cancel()
                await asyncio.gather(send, return_exceptions=True)
        answer = await _read_reply(reader, name, peer_id, max_reply)
        if answer:
            return answer
        await P2P.send_protobuf(BytesValue(value=payload), writer)
        return await _read_reply(reader, name, peer_id, max_reply)


async def _read_reply(reader: asyncio.StreamReader, name: str, peer_id: str, max_reply: int) -> bytes:
    marker, data = await _read_frame(reader, max_reply + 16)
    if marker == P2P.ERROR_MARKER:
        raise RemoteError(f"{name} at {short_id(peer_id)} failed: {RPCError.FromString(data).message}")
    return bytes(_bytes_value_view(data))


async def _send_item(writer: asyncio.StreamWriter, item: bytes | memoryview, timeout: float) -> None:
    """One item of hivemind's protobuf stream, written as it is (no copy into a BytesValue)."""
    writer.write(_item_header(len(item)))
    writer.write(item)
    await asyncio.wait_for(writer.drain(), timeout)


def _declared_size(ask: bytes) -> int | None:
    """The payload size a gated call declares (8 bytes, big-endian), if it is one we read at all."""
    value = BytesValue.FromString(ask).value
    n = int.from_bytes(value, "big") if len(value) == 8 else -1
    return n if 0 <= n <= MAX_MESSAGE else None


def decrement(counter: collections.Counter, key, n: int = 1) -> None:
    """Take `n` from `counter[key]`, dropping the key at zero (per-peer counters must not grow)."""
    counter[key] -= n
    if counter[key] <= 0:
        del counter[key]


class RemoteError(RuntimeError):
    """A peer's handler failed, or it broke the stream protocol."""


async def _within(read: Awaitable[T], seconds: float | None, what: str) -> T:
    if seconds is None:
        return await read
    try:
        return await asyncio.wait_for(read, seconds)
    except asyncio.TimeoutError:
        raise StreamStalled(f"{what} not read in {seconds:.1f} s") from None


async def _read_frame(reader: asyncio.StreamReader, max_len: int, stall: Stall | None = None) -> tuple[bytes, bytes]:
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


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _item_header(n: int) -> bytes:
    """What precedes an item of `n` bytes in hivemind's protobuf stream: the message marker, the
    8-byte length of the serialized BytesValue, and that BytesValue's own header (field 1,
    length-delimited; proto3 writes nothing at all for an empty value)."""
    pb = b"\x0a" + _varint(n) if n else b""
    return P2P.MESSAGE_MARKER + (len(pb) + n).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER) + pb


def _bytes_value_view(data: bytes) -> memoryview | bytes:
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
