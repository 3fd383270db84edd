"""Calling peers' RPCs: unary, streamed and gated, from blocking code, each within its timeout and
routed (a peer that has just joined may have no route to the target yet)."""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import queue
import threading
import time
from contextlib import closing
from typing import Awaitable, Callable, TypeVar

from google.protobuf.wrappers_pb2 import BytesValue
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError
from hivemind.utils.multiaddr import Multiaddr

from swarm.identity import short_id
from swarm.p2p.framing import (MAX_MESSAGE, NotAnswered, Stall, bytes_value_view, read_frame, read_reply, remote_error,
                      send_ask, send_value)
from swarm.p2p.loop import SwarmLoop

log = logging.getLogger(__package__)  # the package's one logger: its lines read as before the split

T = TypeVar("T")


async def call_unary(p2p: P2P, peer_id: str, name: str, payload: bytes) -> bytes:
    reply = await p2p.call_protobuf_handler(PeerID.from_base58(peer_id), name, BytesValue(value=payload), BytesValue)
    return reply.value


async def call_stream(p2p: P2P, peer_id: str, name: str, payload: bytes, items: queue.SimpleQueue,
                      max_item: int, stall: Stall | None) -> int:
    """One streaming call: put each reply item in `items` as it arrives; the number of items."""
    _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), name)
    with closing(writer):
        # one request frame and no end marker: the server reads exactly one frame, and a
        # marker written after a fast server has answered and closed broke the pipe, which
        # the reader then raised in place of the replies already buffered
        await send_value(writer, payload)
        n = 0
        while True:
            try:
                marker, data = await read_frame(reader, max_item + 16, stall)  # + the BytesValue header
            except asyncio.IncompleteReadError:  # the stream's end (or a reset: the caller verifies)
                return n
            if marker == P2P.ERROR_MARKER:
                raise remote_error(name, peer_id, data)
            items.put(bytes_value_view(data))
            n += 1


async def call_gated(p2p: P2P, peer_id: str, name: str, payload: bytes, max_reply: int = MAX_MESSAGE,
                     eager: bool = False) -> bytes:
    """One gated call on `p2p`: declare the payload's size, send it only if the door says go, and
    return the reply (the door's own, when it said no); `NotAnswered` if the stream ended before the
    door's answer. `eager` sends the payload without waiting for the door, as a flooder would
    (tests use it to show that it gains nothing)."""
    _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), name)
    with closing(writer):
        await send_ask(writer, len(payload))
        if eager:  # the payload is written while the answer is awaited: a door that says no never reads it
            send = asyncio.ensure_future(send_value(writer, payload))
            try:
                answer = await read_reply(reader, name, peer_id, max_reply)
                if answer:
                    return answer
                await send  # go: the handler reads it and replies
                return await read_reply(reader, name, peer_id, max_reply)
            finally:
                send.cancel()
                await asyncio.gather(send, return_exceptions=True)
        try:
            answer = await read_reply(reader, name, peer_id, max_reply)
        except asyncio.IncompleteReadError as e:
            if e.partial:
                raise
            raise NotAnswered(f"{name} at {short_id(peer_id)}: the stream ended before its door answered") from e
        if answer:
            return answer
        await send_value(writer, payload)
        return await read_reply(reader, name, peer_id, max_reply)


class Calls:
    """Blocking calls on `p2p` through `loop`; `record(peer_id)` is a peer's own PeerInfo record
    (where a peer we have no route to yet says it can be dialled)."""

    MAX_ANSWERED = 4096
    """Peers whose last answer is remembered (those called last): a node calls whom it chooses."""

    def __init__(self, loop: SwarmLoop, p2p: P2P, record: Callable[[str], dict | None]) -> None:
        self._loop, self._p2p, self._record = loop, p2p, record
        self._answered: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._answered_lock = threading.Lock()  # several threads call

    def answered(self, peer_id: str) -> float:
        """time.monotonic() of `peer_id`'s last answer to a call of ours (-inf: none remembered): a
        peer that answers is there, whatever its records say (swarm/directory/directory.py)."""
        return self._answered.get(peer_id, -math.inf)

    def _heard(self, peer_id: str) -> None:
        with self._answered_lock:
            self._answered[peer_id] = time.monotonic()
            self._answered.move_to_end(peer_id)
            while len(self._answered) > self.MAX_ANSWERED:
                self._answered.popitem(last=False)

    def call(self, peer_id: str, name: str, payload: bytes, timeout: float, stop: threading.Event | None) -> bytes:
        run = None if stop is None else lambda c, t: self._loop.run_until(c, t, stop)
        return self._routed(peer_id, lambda: call_unary(self._p2p, peer_id, name, payload), timeout, run)

    def call_stream(self, peer_id: str, name: str, payload: bytes, timeout: float,
                    on_item: Callable[[memoryview | bytes], None], max_item: int, stall: Stall | None) -> int:
        items: queue.SimpleQueue = queue.SimpleQueue()
        return self._routed(peer_id, lambda: call_stream(self._p2p, peer_id, name, payload, items, max_item, stall),
                            timeout, lambda c, t: self._loop.run_feeding(c, t, items, on_item))

    def call_gated(self, peer_id: str, name: str, payload: bytes, timeout: float) -> bytes:
        return self._routed(peer_id, lambda: call_gated(self._p2p, peer_id, name, payload), timeout)

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
                result = (run or self._loop.run)(make_call(), max(deadline - time.monotonic(), 0.1))
                self._heard(peer_id)
                return result
            except P2PDaemonError as e:
                if "routing" not in str(e) or time.monotonic() + pause >= deadline:
                    raise
                log.debug("no route to %s yet (%s); dialling its announced addresses", short_id(peer_id), e)
                self._dial(peer_id, min(5.0, max(deadline - time.monotonic(), 0.1)))
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

    def _dial(self, peer_id: str, timeout: float) -> None:
        """Best effort: connect to `peer_id` at the multiaddrs in its PeerInfo record."""
        record = self._record(peer_id)
        maddrs = list(record.maddrs) if record is not None else []
        if not maddrs:
            return
        try:
            self._loop.run(_connect(self._p2p, peer_id, maddrs), timeout)
        except Exception as e:  # the retry that follows says whether it helped
            log.debug("dialling %s failed: %s", short_id(peer_id), e)


async def _connect(p2p: P2P, peer_id: str, maddrs: list[str]) -> None:
    """Connect to `peer_id` at `maddrs`. hivemind's `P2P` (1.1.x) has no public way to dial a peer
    at given addresses, only its daemon client's `connect` (which hivemind itself uses the same way,
    in `P2P.is_identity_taken`): the one private access, kept here."""
    await p2p._client.connect(PeerID.from_base58(peer_id), [Multiaddr(m) for m in maddrs])
