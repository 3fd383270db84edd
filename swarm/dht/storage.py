"""A node's DHT storage, budgeted like every other door: what any crowd of fresh keys can make a node
hold, and push to each newcomer, is a figure here, whatever the number of keys.

hivemind's storage has no bound (issue 58): 300 fresh keys storing their 5 records at their largest
(~1.1 MB a key) cost every replica ~330 MB, and the next node to join was pushed every record it
should hold at once (each node +1 to +2.6 GB, the honest sampler lost its learner). Here, in the
DHT's process (process.py installs it):
  - every stored row is charged its value, subkey and `ROW_OVERHEAD` to its owner's pool: the
    favoured pool for the peers the node favours (its coordinators, the learners they name, the
    peers those credited: swarm/directory/book.py, pushed here by the node), the unproven pool shared
    by every other key, and within it `large_bytes` for rows over `LARGE` (a tally, a swarm record:
    only a learner or a coordinator has a use for them, and both are favoured);
  - a row that does not fit its pool is refused (the store answers False); a favoured row evicts
    an unproven one where a key's rows are at `rows_per_key`, never the reverse;
  - a get returns at most `rows_per_key` rows of a key (the one key many peers write, the index);
  - a newcomer is pushed at most `push_bytes` (favoured keys first), and newcomers at most
    `pushes_per_s`: owners store their records again on their own (every few seconds to minutes),
    so what a newcomer is not pushed it gets from its owner.
The memory this bounds is `StorageBudget.total` for the storage and again for the cache (docs/DESIGN.md
"Discovery" has the figures and their measurement).
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import time
from dataclasses import dataclass

from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.utils import get_dht_time

from swarm.dht.validation import owner_peer_id

log = logging.getLogger(__name__)

KiB, MiB = 1 << 10, 1 << 20
ROW_OVERHEAD = 2048
"""Bytes a stored row costs besides its value and subkey: a key's own dictionary (a row at an owner's
own key is alone in it), its entries in hivemind's dictionaries and expiration heaps, and ours:
~1.6 KiB measured (tests/unit/swarm/test_dht_storage.py: 20,000 rows of one subkey each under
tracemalloc; it fails if the charge no longer covers them)."""
LARGE = 16 * KiB
"""A row over this is a tally or a swarm record (a peer record is 4 KiB at most, a holder record 8)."""


@dataclass(frozen=True)
class StorageBudget:
    favoured_bytes: int = 96 * MiB
    """Rows of favoured peers together: 32 named learners' 1 MiB tallies, and ~4,000 credited peers' rows."""
    unproven_bytes: int = 32 * MiB
    """Rows of every other key together: ~2,000 keys' peer, index and holder rows (16 KiB a key)."""
    large_bytes: int = 4 * MiB
    """Of the unproven pool, rows over LARGE: four tallies' worth."""
    rows_per_key: int = 512
    """Rows one DHT key holds (only an index has more than one): a get of it returns 2 MiB at most."""
    push_bytes: int = 4 * MiB
    """What one newcomer is pushed at most."""
    pushes_per_s: float = 2.0
    """Newcomers pushed to a second (burst: 8): each push walks the whole storage."""

    @property
    def total(self) -> int:
        return self.favoured_bytes + self.unproven_bytes


STORAGE = StorageBudget()
CACHE = StorageBudget(favoured_bytes=16 * MiB, unproven_bytes=8 * MiB, large_bytes=2 * MiB, rows_per_key=128)
"""The cache (rows a node keeps after its own gets, and those peers push `in_cache`): a convenience,
so smaller."""


@functools.lru_cache(maxsize=8192)
def _owner(subkey) -> str:
    """The peer id a subkey names ("" if none: such a row is never favoured)."""
    return (owner_peer_id(subkey) if isinstance(subkey, bytes) else None) or ""


@dataclass
class _Row:
    owner: str
    cost: int
    expires: float
    favoured: bool
    large: bool


class BudgetedStorage(DHTLocalStorage):
    """hivemind's local storage (or cache), whose rows are charged to pools and refused past them."""

    def __init__(self, budget: StorageBudget = STORAGE, maxsize: int | None = None) -> None:
        super().__init__(maxsize=maxsize)
        self.budget = budget
        self.favoured: frozenset[str] = frozenset()
        self._rows: dict[tuple[DHTID, object], _Row] = {}
        self._by_key: dict[DHTID, set] = {}
        self._expiry: list[tuple[float, DHTID, object]] = []
        self.used = {"favoured": 0, "unproven": 0, "large": 0}
        self.refused = {"favoured": 0, "unproven": 0, "large": 0, "rows": 0}
        self.evicted = 0
        self._pushes = budget.pushes_per_s * 4
        self._pushed_at = time.monotonic()

    # accounting

    def favour(self, peers: frozenset[str]) -> None:
        """The peers whose rows go to the favoured pool from now on (their rows stored so far move)."""
        self.favoured = frozenset(peers)
        self.used = {"favoured": 0, "unproven": 0, "large": 0}
        for row in self._rows.values():
            row.favoured = row.owner in self.favoured
            self._charge(row, +1)

    def _charge(self, row: _Row, sign: int) -> None:
        if row.favoured:
            self.used["favoured"] += sign * row.cost
        else:
            self.used["unproven"] += sign * row.cost
            if row.large:
                self.used["large"] += sign * row.cost

    def _fits(self, row: _Row, old: _Row | None) -> str | None:
        """Which pool `row` would overflow (replacing `old`), or None."""
        freed = {"favoured": 0, "unproven": 0, "large": 0}
        if old is not None:
            freed["favoured" if old.favoured else "unproven"] = old.cost
            freed["large"] = old.cost if old.large and not old.favoured else 0
        b = self.budget
        if row.favoured:
            return "favoured" if self.used["favoured"] - freed["favoured"] + row.cost > b.favoured_bytes else None
        if self.used["unproven"] - freed["unproven"] + row.cost > b.unproven_bytes:
            return "unproven"
        if row.large and self.used["large"] - freed["large"] + row.cost > b.large_bytes:
            return "large"
        return None

    def _forget(self, key: DHTID, subkey) -> None:
        row = self._rows.pop((key, subkey), None)
        if row is not None:
            self._charge(row, -1)
            rows = self._by_key.get(key)
            if rows is not None:
                rows.discard(subkey)
                if not rows:
                    del self._by_key[key]

    def _expire(self) -> None:
        now = get_dht_time()
        while self._expiry and self._expiry[0][0] < now:
            expires, key, subkey = heapq.heappop(self._expiry)
            row = self._rows.get((key, subkey))
            if row is not None and row.expires == expires:
                self._forget(key, subkey)
        if len(self._expiry) > 2 * len(self._rows) + 1024:  # refreshes leave stale entries: compact
            self._expiry = [(r.expires, k, s) for (k, s), r in self._rows.items()]
            heapq.heapify(self._expiry)

    # hivemind's storage interface

    def store(self, key: DHTID, value: bytes, expiration_time: float, subkey=None) -> bool:
        if subkey is not None:
            return self.store_subkey(key, subkey, value, expiration_time)
        return self._admit(key, None, value, expiration_time, lambda: super(BudgetedStorage, self).store(
            key, value, expiration_time))

    def store_subkey(self, key: DHTID, subkey, value: bytes, expiration_time: float) -> bool:
        return self._admit(key, subkey, value, expiration_time, lambda: super(BudgetedStorage, self).store_subkey(
            key, subkey, value, expiration_time))

    def _admit(self, key: DHTID, subkey, value: bytes, expiration_time: float, store) -> bool:
        self._expire()
        owner = _owner(subkey)
        size = len(value) + (len(subkey) if isinstance(subkey, bytes) else 0)
        row = _Row(owner, size + ROW_OVERHEAD, expiration_time, bool(owner) and owner in self.favoured, size > LARGE)
        old = self._rows.get((key, subkey))
        if old is not None and old.expires >= expiration_time:
            return False  # hivemind keeps the newer row (its heap would still grow by one: not here)
        over = self._fits(row, old)
        if over is None and old is None and len(self._by_key.get(key, ())) >= self.budget.rows_per_key:
            over = "rows" if not row.favoured or not self._evict_unproven(key) else None
        if over is not None:
            self.refused[over] += 1
            return False
        if not store():
            return False
        self._forget(key, subkey)
        self._rows[(key, subkey)] = row
        self._by_key.setdefault(key, set()).add(subkey)
        self._charge(row, +1)
        heapq.heappush(self._expiry, (expiration_time, key, subkey))
        self._compact(key)
        return True

    def _evict_unproven(self, key: DHTID) -> bool:
        """Make room under `key` for a favoured row: drop its unproven row expiring first."""
        victims = [(self._rows[(key, s)].expires, s) for s in self._by_key.get(key, ()) if not self._rows[(key, s)].favoured]
        if not victims:
            return False
        _, subkey = min(victims, key=lambda v: v[0])
        item = self.data.get(key)
        if item is not None and isinstance(item.value, DictionaryDHTValue):
            del item.value[subkey]
        self._forget(key, subkey)
        self.evicted += 1
        return True

    def _compact(self, key: DHTID) -> None:
        """hivemind's expiration heaps keep an entry per store, even a replaced one, until it expires
        (an hour ahead, at most): rebuild one that grew, ours and the key's dictionary's."""
        item = self.data.get(key)
        for timed in (self, item.value if item is not None else None):
            if isinstance(timed, (DHTLocalStorage, DictionaryDHTValue)) and \
                    len(timed.expiration_heap) > 2 * len(timed.data) + 64:
                timed.expiration_heap = list(timed.key_to_heap.values())
                heapq.heapify(timed.expiration_heap)

    # what it pushes

    def newcomer_rows(self, protocol, node_id: DHTID) -> list[tuple[DHTID, object, float]]:
        """The rows a node that just met `node_id` hands it (it is now among each key's nearest, and
        this node was the nearest): at most `push_bytes`, favoured keys first; none past `pushes_per_s`."""
        now = time.monotonic()
        self._pushes = min(self.budget.pushes_per_s * 4, self._pushes + (now - self._pushed_at) * self.budget.pushes_per_s)
        self._pushed_at = now
        if self._pushes < 1:
            return []
        self._pushes -= 1
        picked = []
        for key, item in list(self.items()):
            neighbors = protocol.routing_table.get_nearest_neighbors(key, protocol.num_replicas, exclude=protocol.node_id)
            if neighbors:
                newcomer_near = node_id.xor_distance(key) < neighbors[-1][0].xor_distance(key)
                we_nearest = protocol.node_id.xor_distance(key) < neighbors[0][0].xor_distance(key)
                if not (newcomer_near and we_nearest):
                    continue
            rows = [self._rows[(key, s)] for s in self._by_key.get(key, ())]
            picked.append((not any(r.favoured for r in rows), sum(r.cost for r in rows), key, item))
        out, size = [], 0
        for _, cost, key, item in sorted(picked, key=lambda p: (p[0], p[1])):
            if size + cost > self.budget.push_bytes:
                continue
            size += cost
            out.append((key, item.value, item.expiration_time))
        return out

    def stats(self) -> dict[str, int]:
        return {**{f"{k}_bytes": v for k, v in self.used.items()}, "rows": len(self._rows),
                **{f"refused_{k}": v for k, v in self.refused.items()}, "evicted": self.evicted}


async def update_routing_table(self, node_id, peer_id, responded: bool = True) -> None:
    """hivemind's DHTProtocol.update_routing_table, with the newcomer's push bounded (`newcomer_rows`)."""
    node_id = node_id if node_id is not None else self.routing_table.get(peer_id=peer_id)
    if not responded:  # an outgoing request the peer did not answer
        if node_id is not None and node_id in self.routing_table:
            del self.routing_table[node_id]
        return
    if node_id is None:
        return
    if node_id not in self.routing_table and isinstance(self.storage, BudgetedStorage):
        rows = self.storage.newcomer_rows(self, node_id)
        if rows:
            asyncio.create_task(self.call_store(peer_id, *zip(*rows), in_cache=False))
    to_ping = self.routing_table.add_or_update_node(node_id, peer_id)
    if to_ping is not None:  # a full bucket: Kademlia keeps its old node if it still answers
        asyncio.create_task(self.call_ping(to_ping[1]))


CACHE_ROWS = 1 << 17
"""The DHT's `cache_size` (rows): given so that `install` tells the cache from the storage; the
cache's bytes bound it well before (`CACHE`: 24 MiB at >= 1 KiB a row)."""


def install(budget: StorageBudget = STORAGE, cache: StorageBudget = CACHE) -> None:
    """In the DHT's process, before its node starts: hivemind's protocol makes its storage and cache
    with these, and pushes newcomers through the bounded `update_routing_table`. hivemind builds both
    in DHTProtocol.create, as `DHTLocalStorage()` and `DHTLocalStorage(maxsize=cache_size)` (1.1.x;
    tests/unit/swarm/test_dht_storage.py fails if that changes): the DHT is started with
    `cache_size=CACHE_ROWS` (process.py)."""
    from hivemind.dht import protocol

    def make(maxsize: int | None = None) -> BudgetedStorage:
        return BudgetedStorage(cache if maxsize == CACHE_ROWS else budget, maxsize)

    protocol.DHTLocalStorage = make
    protocol.DHTProtocol.update_routing_table = update_routing_table


async def stats_in_process(_dht, node) -> dict[str, dict[str, int]]:
    """For `DHT.run_coroutine`: the storage's and the cache's figures."""
    return {name: s.stats() for name, s in (("storage", node.protocol.storage), ("cache", node.protocol.cache))
            if isinstance(s, BudgetedStorage)}


async def favour_in_process(peers: frozenset[str], _dht, node) -> None:
    """For `DHT.run_coroutine(partial(favour_in_process, peers))`: the peers the node favours now."""
    for s in (node.protocol.storage, node.protocol.cache):
        if isinstance(s, BudgetedStorage):
            s.favour(peers)
