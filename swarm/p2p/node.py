"""`SwarmNode`: one peer's face to the swarm, composed of the parts of this package.

It owns the DHT (its own process with p2pd, swarm/dht/), the swarm loop (loop.py) and the P2P
client of that daemon; its methods delegate: DHT records to swarm/dht/records.py's functions, serving to
handlers.py, calling to calls.py.
"""

from __future__ import annotations

import logging
import threading
from typing import Awaitable, Callable, TypeVar

import msgspec
from google.protobuf.wrappers_pb2 import BytesValue

from swarm.dht.network import NetworkConfig, peer_id_of_maddr
from swarm.dht.records import (Listed, announce, announce_holdings, holdings_of, list_peers, peer_records,
                               publish_swarm_record, publish_tally, tally_of, trusted_learners)
from swarm.dht.process import create_dht
from swarm.identity import Identity
from swarm.p2p.budget import StreamBudget
from swarm.p2p.doors import Doors
from swarm.p2p.calls import Calls
from swarm.p2p.framing import GATED_ASK_S, GATED_BODY, MAX_MESSAGE, Stall
from swarm.p2p.handlers import Gate, GatedHandler, Handler, StreamHandler, streaming, unary
from swarm.p2p.loop import SwarmLoop
from swarm.wire.peer import Holder, PeerInfo
from swarm.wire.tally import Tally

log = logging.getLogger(__package__)  # the package's one logger: its lines read as before the split

T = TypeVar("T")


class SwarmNode:
    def __init__(self, identity: Identity, net: NetworkConfig, swarm: str) -> None:
        self.identity = identity
        self.swarm = swarm
        self.private = net.client_mode
        """Behind a NAT (swarm/p2p/reach.py): peers cannot dial us, except through a relay."""
        self.coordinators = {peer_id_of_maddr(m) for m in net.initial_peers}
        """Peers whose swarm record this node trusts: the bootstrap peers it was pointed at."""
        self.dht = create_dht(identity, net, swarm)  # forks: do this before CUDA is initialised
        self._loop = SwarmLoop()
        self.p2p = self.run(self.dht.replicate_p2p(), timeout=30)
        self._calls = Calls(self._loop, self.p2p, self.peer_record)
        self.doors = Doors()
        """Every inbound door's calls and bytes, per peer and for unproven keys (swarm/p2p/doors.py)."""
        self.streams = StreamBudget(proven=self.doors.is_proven)
        """Inbound streams held open, per peer and protocol, of unknown keys, and in all (budget.py)."""

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def run(self, coro: Awaitable[T], timeout: float) -> T:
        """Run a coroutine on the swarm loop and wait for it, at most `timeout` seconds."""
        return self._loop.run(coro, timeout)

    def loop_lag(self) -> dict[str, float]:
        """How late the swarm loop ran, cumulative (`SwarmLoop.lag`): a node whose loop is late
        answers its peers late, and their calls to it may time out."""
        return self._loop.lag()

    def maddrs(self) -> list[str]:
        return [str(m) for m in self.dht.get_visible_maddrs()]

    # the swarm's signed records in the DHT (swarm/dht/records.py)

    def announce(self, info: PeerInfo, ttl: float = 60.0) -> bool:
        """`info` with whether this peer can be dialled (`private`: the node knows, swarm/p2p/reach.py)."""
        return announce(self.dht, self.identity, self.swarm, msgspec.structs.replace(info, private=self.private), ttl)

    def peers(self) -> list[Listed]:
        """Every row of the peers index: for listings (status, the leaderboard). Its size is any key's
        to grow: a reader that knows whom it wants calls `peer_records`."""
        return list_peers(self.dht, self.swarm)

    def peer_records(self, peer_ids: list[str]) -> dict[str, PeerInfo]:
        return peer_records(self.dht, self.swarm, peer_ids)

    def peer_record(self, peer_id: str) -> PeerInfo | None:
        return self.peer_records([peer_id]).get(peer_id)

    def announce_holdings(self, chain: str, versions: list[int], ttl: float = 60.0) -> bool:
        return announce_holdings(self.dht, self.identity, self.swarm, chain, versions, ttl)

    def holdings_of(self, peer_ids: list[str]) -> list[Holder]:
        return holdings_of(self.dht, self.swarm, peer_ids)

    def publish_tally(self, tally: Tally, ttl: float = 600.0) -> bool:
        return publish_tally(self.dht, self.identity, self.swarm, tally, ttl)

    def tally_of(self, learner: str) -> Tally | None:
        return tally_of(self.dht, self.swarm, learner)

    def publish_swarm_record(self, learners: dict[str, str], model_id: str = "", ttl: float = 60.0) -> bool:
        return publish_swarm_record(self.dht, self.identity, self.swarm, learners, model_id, ttl)

    def trusted_learners(self, coordinators: set[str]) -> dict[str, str]:
        return trusted_learners(self.dht, self.swarm, coordinators)

    # serving (handlers.py)

    def add_handler(self, name: str, handler: Handler) -> None:
        self.run(self.p2p.add_protobuf_handler(name, unary(handler), BytesValue), timeout=10)

    def add_stream_handler(self, name: str, handler: StreamHandler, request_timeout: float = 30.0,
                           send_timeout: float = 60.0) -> None:
        """A server-streaming RPC: one request, many reply items on one libp2p stream. Much faster
        than one unary call per item (no per-call round trip through the daemon). On the wire this
        is exactly hivemind's protobuf stream of `BytesValue`s (swarm/p2p/framing.py)."""
        self.run(self.p2p.add_binary_stream_handler(name, streaming(name, handler, request_timeout, send_timeout,
                                                                     self.streams)),
                 timeout=10)

    def add_gated_handler(self, name: str, door: Gate, handler: Handler, request_timeout: float = GATED_ASK_S,
                          body: Stall = GATED_BODY, send_timeout: float = 30.0) -> None:
        """A request/reply RPC whose payload is read only once `door` lets it in (`call_gated`).

        A unary hivemind call hands the handler a payload that p2pd has already read whole, so a peer
        past its byte budget still costs the receiver every byte it sends (64 calls of 2.5 MiB at once
        did). Here the caller first declares the payload's size; the door answers (busy, say) before a
        byte of it is read, and a caller that sends it anyway is not read: the stream's flow control
        (p2pd's socket and yamux's window) stops it after a few hundred KiB. The payload then must
        come within `body` (a trickle does not hold a handler) and be no longer than declared.
        """
        gated = GatedHandler(name, door, handler, request_timeout, body, send_timeout, self.streams)
        self.run(self.p2p.add_binary_stream_handler(name, gated), timeout=10)

    # calling (calls.py)

    def call(self, peer_id: str, name: str, payload: bytes, timeout: float,
             stop: threading.Event | None = None) -> bytes:
        """Call `name` on `peer_id`; raises on timeout or if the peer cannot be reached, and
        `CallStopped` as soon as `stop` is set (a long poll must not hold up a shutdown)."""
        return self._calls.call(peer_id, name, payload, timeout, stop)

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
        return self._calls.call_stream(peer_id, name, payload, timeout, on_item, max_item, stall)

    def call_gated(self, peer_id: str, name: str, payload: bytes, timeout: float) -> bytes:
        """Call a gated RPC (`add_gated_handler`): the door's answer, or the handler's reply."""
        return self._calls.call_gated(peer_id, name, payload, timeout)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Graceful: stop p2p and the DHT process (which stops its p2pd)."""
        try:
            self.run(self.p2p.shutdown(), timeout=timeout)
        except Exception as e:  # shutting down anyway; say why it was not clean
            log.warning("p2p shutdown: %s", e)
        self.dht.shutdown()
        self._loop.close(timeout)
