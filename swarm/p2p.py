"""A peer on the hivemind swarm: the DHT (its own process with p2pd) plus our P2P RPC handlers.

hivemind is asyncio; the roles are plain blocking code. `SwarmNode` runs one event loop in a
background thread and exposes blocking calls that always take a timeout. Payloads are raw bytes
(msgpack) carried in protobuf `BytesValue`, so no .proto files are needed. One RPC reply is capped
at 4 MiB by hivemind, so callers keep messages under `MAX_MESSAGE`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from google.protobuf.wrappers_pb2 import BytesValue
from hivemind.p2p import P2PContext, PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError
from hivemind.utils.multiaddr import Multiaddr

from .dht import (NetworkConfig, announce, announce_holdings, create_dht, list_holders, list_peers, list_tallies,
                  peer_id_of_maddr, publish_swarm_record, publish_tally, trusted_learners)
from .identity import Identity, short_id

log = logging.getLogger(__name__)

MAX_MESSAGE = 3 * 1024 * 1024
Handler = Callable[[bytes, str], Awaitable[bytes]]
"""async handler(payload, remote_peer_id) -> reply payload."""
StreamHandler = Callable[[bytes, str], AsyncIterator[bytes]]
"""async generator handler(payload, remote_peer_id) yielding reply items (each under MAX_MESSAGE)."""
T = TypeVar("T")


class SwarmNode:
    def __init__(self, identity: Identity, net: NetworkConfig, swarm: str) -> None:
        self.identity = identity
        self.swarm = swarm
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
        return announce(self.dht, self.identity, self.swarm, info, ttl)

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

    def publish_swarm_record(self, learners: list[str], model_id: str = "", ttl: float = 60.0) -> bool:
        return publish_swarm_record(self.dht, self.identity, self.swarm, learners, model_id, ttl)

    def trusted_learners(self, coordinators: set[str]) -> set[str]:
        return trusted_learners(self.dht, self.swarm, coordinators)

    def add_handler(self, name: str, handler: Handler) -> None:
        async def _wrapped(request: BytesValue, context: P2PContext) -> BytesValue:
            return BytesValue(value=await handler(request.value, context.remote_id.to_base58()))

        self.run(self.p2p.add_protobuf_handler(name, _wrapped, BytesValue), timeout=10)

    def add_stream_handler(self, name: str, handler: StreamHandler) -> None:
        """A server-streaming RPC: one request, many reply items on one libp2p stream. Much faster
        than one unary call per item (no per-call round trip through the daemon)."""
        async def _wrapped(request: BytesValue, context: P2PContext):
            async for item in handler(request.value, context.remote_id.to_base58()):
                yield BytesValue(value=item)

        self.run(self.p2p.add_protobuf_handler(name, _wrapped, BytesValue, stream_output=True), timeout=10)

    def call_stream(self, peer_id: str, name: str, payload: bytes, timeout: float,
                    on_item: Callable[[bytes], None]) -> int:
        """Call a streaming RPC; `on_item` runs (on the swarm loop) for each item as it arrives, so
        that a caller can use items before the stream ends. Returns the number of items; raises on
        timeout (for the whole stream) or if the peer cannot be reached."""
        async def _call() -> int:
            n = 0
            replies = await self.p2p.iterate_protobuf_handler(PeerID.from_base58(peer_id), name,
                                                              BytesValue(value=payload), BytesValue)
            async for reply in replies:
                on_item(reply.value)
                n += 1
            return n

        return self._routed(peer_id, _call, timeout)

    def call(self, peer_id: str, name: str, payload: bytes, timeout: float) -> bytes:
        """Call `name` on `peer_id`; raises on timeout or if the peer cannot be reached."""
        async def _call() -> bytes:
            reply = await self.p2p.call_protobuf_handler(PeerID.from_base58(peer_id), name,
                                                         BytesValue(value=payload), BytesValue)
            return reply.value

        return self._routed(peer_id, _call, timeout)

    def _routed(self, peer_id: str, make_call: Callable[[], Awaitable[T]], timeout: float) -> T:
        """Run `make_call()` within `timeout`, waiting for a route to `peer_id` first if need be.

        A peer that has just joined knows only its bootstrap peers: libp2p answers "routing: not
        found" until its routing table learns the target. Rather than fail a user's first call, we
        dial the target at the addresses it announced in the DHT and retry, within the timeout.
        """
        deadline, pause = time.monotonic() + timeout, 0.2
        while True:
            try:
                return self.run(make_call(), max(deadline - time.monotonic(), 0.1))
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
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
