"""`SwarmNode`: one peer's face to the swarm, composed of the parts of this package.

It owns the DHT (its own process with p2pd, swarm/dht/), the swarm loop (loop.py) and the P2P
client of that daemon; its methods delegate: DHT records to swarm/dht/records.py's functions, serving to
handlers.py, calling to calls.py.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Awaitable, Callable, TypeVar

import msgspec
from google.protobuf.wrappers_pb2 import BytesValue

from hivemind.utils import get_dht_time

from swarm.dht.network import NetworkConfig, peer_id_of_maddr
from swarm.dht.records import (Listed, announce, announce_holdings, holdings_of, list_peers, named_by, own_entries,
                               publish_swarm_record, publish_tally, stamped, swarm_record)
from swarm.dht.process import create_dht
from swarm.dht.storage import favour_in_process, stats_in_process
from swarm.directory.book import LastGood
from swarm.directory.directory import Directory
from swarm.identity import Identity
from swarm.p2p.budget import StreamBudget
from swarm.p2p.doors import Doors
from swarm.p2p.calls import Calls
from swarm.p2p.framing import GATED_ASK_S, GATED_BODY, MAX_MESSAGE, Stall
from swarm.p2p.handlers import Gate, GatedHandler, Handler, StreamHandler, streaming, unary
from swarm.p2p.loop import SwarmLoop
from swarm.wire.directory import DIRECTORY
from swarm.wire.peer import Holder, PeerInfo, SwarmRecord
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
        self._calls = Calls(self._loop, self.p2p, lambda peer: self._records("peer", [peer]).get(peer))
        self.doors = Doors()
        """Every inbound door's calls and bytes, per peer and for unproven keys (swarm/p2p/doors.py)."""
        self.streams = StreamBudget(proven=self.doors.is_proven)
        """Inbound streams held open, per peer and protocol, of unknown keys, and in all (budget.py)."""
        self.directory = Directory(
            identity, swarm, self.coordinators, call=lambda peer, payload, t: self.call(peer, DIRECTORY, payload, t),
            answered=self._calls.answered,
            door=self.doors.open(DIRECTORY, proven=lambda peer: self.directory.book.favours(peer)))
        """The records that decide who trains, from the peers that hold them (swarm/directory/)."""
        self.add_handler(DIRECTORY, self.directory.on_call)
        self._last_good = LastGood()
        """What the DHT gave last, per record: used while no newer one is read and its owner answers."""
        self._favoured: frozenset[str] = frozenset()

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

    # the swarm's signed records: from the directory (swarm/directory/) first, the DHT (swarm/dht/records.py)
    # for the rest, the last good copy while its owner answers

    def announce(self, info: PeerInfo, ttl: float = 60.0) -> bool:
        """`info` with whether this peer can be dialled (`private`: the node knows, swarm/p2p/reach.py);
        a learner's also offered to its coordinators (they keep it if they name it)."""
        info = stamped(self.identity, msgspec.structs.replace(info, private=self.private))
        if info.role == "learner":  # the only peer records a directory asks for (a signature each)
            self.directory.hold_own("peer", info, ttl)
            self.directory.push(("peer",))
        return announce(self.dht, self.identity, self.swarm, info, ttl)

    def peers(self) -> list[Listed]:
        """Every row of the peers index: for listings (status, the leaderboard). Its size is any key's
        to grow: a reader that knows whom it wants calls `peer_records`. The learners our coordinators
        name are listed even where the DHT hides them."""
        listed = list_peers(self.dht, self.swarm)
        have = {p.info.peer_id for p in listed}
        now = get_dht_time()
        for learner in sorted(set(self.directory.book.named()) - have):
            held = self.directory.book.get("peer", learner)
            if held is not None and held.entry.expires > now:
                info = held.record
                listed.append(Listed(info, round(held.entry.expires - now, 1), round(now - info.updated, 1)))
        return sorted(listed, key=lambda p: (p.info.role, p.info.peer_id))

    def peer_records(self, peer_ids: list[str]) -> dict[str, PeerInfo]:
        self.refresh_directory()
        return self._records("peer", peer_ids)

    def peer_record(self, peer_id: str) -> PeerInfo | None:
        return self.peer_records([peer_id]).get(peer_id)

    def announce_holdings(self, chain: str, versions: list[int], ttl: float = 60.0) -> bool:
        return announce_holdings(self.dht, self.identity, self.swarm, chain, versions, ttl)

    def holdings_of(self, peer_ids: list[str]) -> list[Holder]:
        return holdings_of(self.dht, self.swarm, peer_ids)

    def publish_tally(self, tally: Tally, ttl: float = 600.0) -> bool:
        """Our tally, offered to our coordinators and served to whoever asks, and in the DHT."""
        self.directory.hold_own("tally", tally, ttl)
        self.directory.push(("tally",))
        self._favour()
        return publish_tally(self.dht, self.identity, self.swarm, tally, ttl)

    def tally_of(self, learner: str) -> Tally | None:
        self.directory.want_tally(learner)
        self.refresh_directory()
        return self._records("tally", [learner]).get(learner)

    def publish_swarm_record(self, learners: dict[str, str], model_id: str = "", ttl: float = 60.0) -> bool:
        """As a coordinator: the learners we name, served to whoever asks (our book keeps the records
        they offer us), and in the DHT."""
        record = swarm_record(self.identity, learners, model_id)
        self.directory.hold_own("swarm", record, ttl)
        self._favour()
        return publish_swarm_record(self.dht, self.identity, self.swarm, record, ttl)

    def trusted_learners(self, coordinators: set[str]) -> dict[str, str]:
        """The learners the swarm records of `coordinators` name, with their models (`named_by`)."""
        return named_by(self.swarm_records(coordinators))

    def swarm_records(self, coordinators: set[str]) -> list[SwarmRecord]:
        """The swarm records `coordinators` signed, those we could read, by coordinator."""
        self.refresh_directory()
        records = self._records("swarm", sorted(coordinators))
        return [r for _, r in sorted(records.items()) if isinstance(r, SwarmRecord)]

    def answers(self, peer_id: str) -> bool:
        """Whether `peer_id` answered a call of ours lately (directory.LAST_GOOD_S): it is there,
        whatever its records say."""
        return self.directory.answered_lately(peer_id)

    def refresh_directory(self, force: bool = False) -> None:
        """Ask our coordinators and the learners we read for newer records (at most every
        directory.REFRESH_S), and tell the DHT's storage whom to favour."""
        self.directory.refresh(force)
        self._favour()

    def dht_storage(self) -> dict[str, dict[str, int]]:
        """The DHT storage's and cache's figures (swarm/dht/storage.py): bytes by pool, rows, refusals."""
        return self.dht.run_coroutine(stats_in_process)

    def _favour(self) -> None:
        favoured = self.directory.book.favoured()
        if favoured is not self._favoured:  # the book makes a new set only when it changed
            self._favoured = favoured
            self.dht.run_coroutine(functools.partial(favour_in_process, favoured), return_future=True)

    def _records(self, kind: str, owners: list[str]) -> dict[str, object]:
        """owner -> its record of `kind`: the directory's if unexpired, else the DHT's, else the last
        good one (either's) while its owner answers us."""
        out = {o: r for o in owners if (r := self.directory.record(kind, o)) is not None}
        rest = [o for o in owners if o not in out]
        if rest:
            for owner, (record, expires) in own_entries(self.dht, self.swarm, kind, rest).items():
                self._last_good.put(kind, owner, record, expires)
                out[owner] = record
        for owner in [o for o in rest if o not in out]:
            if not self.directory.answered_lately(owner):
                continue
            held = self.directory.record(kind, owner, stale_ok=True)
            last = self._last_good.get(kind, owner)
            if held is not None or last is not None:
                out[owner] = held if held is not None else last[0]
        return out

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
