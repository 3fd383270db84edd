"""The DHT's storage is budgeted (swarm/dht/storage.py): pools per kind of owner, refusals past them,
favoured rows first, a bounded push to newcomers."""

import inspect
import tracemalloc

import pytest
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.utils import get_dht_time

from swarm.dht.storage import LARGE, ROW_OVERHEAD, BudgetedStorage, StorageBudget
from swarm.identity import Identity

KiB = 1024


@pytest.fixture(scope="module")
def owners(tmp_path_factory):
    """(peer id, [owner:...] subkey) of three keys."""
    from hivemind.dht.crypto import RSASignatureValidator

    base = tmp_path_factory.mktemp("owners")
    out = []
    for i in range(3):
        ident = Identity.load_or_create(base / f"{i}.key")
        out.append((ident.peer_id, RSASignatureValidator(ident.dht_private_key()).local_public_key))
    return out


def _key(i: int) -> DHTID:
    return DHTID.generate(source=f"key{i}")


def test_rows_are_charged_to_their_owners_pool_and_refused_past_it(owners):
    (fav, fav_sub), (other, other_sub), _ = owners
    budget = StorageBudget(favoured_bytes=64 * KiB, unproven_bytes=16 * KiB, large_bytes=0, rows_per_key=8)
    s = BudgetedStorage(budget)
    s.favour(frozenset({fav}))
    later = get_dht_time() + 60
    row = 4 * KiB - len(other_sub)  # a value that makes a row of 4 KiB + overhead
    charged = 4 * KiB + ROW_OVERHEAD
    fits = 16 * KiB // charged  # 3 rows of an unproven key
    assert all(s.store_subkey(_key(i), other_sub, b"x" * row, later) for i in range(fits))
    assert not s.store_subkey(_key(99), other_sub, b"x" * row, later)  # the unproven pool is full
    assert s.refused["unproven"] == 1 and s.used["unproven"] == fits * charged
    assert s.store_subkey(_key(99), fav_sub, b"x" * row, later)  # a favoured key is not held back by it
    assert s.used["favoured"] == charged


def test_a_refreshed_row_replaces_its_charge(owners):
    (_, sub), _, _ = owners
    s = BudgetedStorage(StorageBudget(unproven_bytes=8 * KiB, large_bytes=0))
    now = get_dht_time()
    for i in range(50):  # an owner storing its record again and again costs one row
        assert s.store_subkey(_key(0), sub, b"y" * 1000, now + 60 + i)
    assert s.used["unproven"] == 1000 + len(sub) + ROW_OVERHEAD and len(s._rows) == 1
    assert not s.store_subkey(_key(0), sub, b"y" * 1000, now + 10)  # an older one is not kept


def test_large_rows_of_unproven_keys_share_a_small_pool(owners):
    (_, sub), _, _ = owners
    s = BudgetedStorage(StorageBudget(unproven_bytes=1 << 20, large_bytes=64 * KiB))
    later = get_dht_time() + 60
    assert s.store_subkey(_key(0), sub, b"t" * (40 * KiB), later)
    assert not s.store_subkey(_key(1), sub, b"t" * (40 * KiB), later)  # a second 40 KiB tally: past 64 KiB
    assert s.refused["large"] == 1
    assert s.store_subkey(_key(2), sub, b"p" * (LARGE - 2 * KiB), later)  # a small row still fits


def test_a_favoured_row_evicts_an_unproven_one_where_a_key_is_full(owners):
    (fav, fav_sub), (a, a_sub), (b, b_sub) = owners
    s = BudgetedStorage(StorageBudget(rows_per_key=2))
    s.favour(frozenset({fav}))
    now = get_dht_time()
    assert s.store_subkey(_key(0), a_sub, b"a", now + 30)
    assert s.store_subkey(_key(0), b_sub, b"b", now + 60)
    assert s.store_subkey(_key(0), fav_sub, b"f", now + 60)  # evicts a's (it expires first)
    rows = s.get(_key(0)).value
    assert set(k for k, _ in rows.items()) == {b_sub, fav_sub} and s.evicted == 1
    s.favour(frozenset())
    assert not s.store_subkey(_key(0), a_sub, b"a", now + 90)  # an unproven row never evicts
    assert s.refused["rows"] == 1


def test_expired_rows_free_their_charge(owners, monkeypatch):
    (_, sub), _, _ = owners
    s = BudgetedStorage(StorageBudget(unproven_bytes=6 * KiB, large_bytes=0))  # one row of ~4.4 KiB
    now = get_dht_time()
    assert s.store_subkey(_key(0), sub, b"z" * 2000, now + 5)
    assert not s.store_subkey(_key(1), sub, b"z" * 2000, now + 60)
    monkeypatch.setattr("swarm.dht.storage.get_dht_time", lambda: now + 10)
    monkeypatch.setattr("hivemind.utils.timed_storage.get_dht_time", lambda: now + 10)
    assert s.store_subkey(_key(1), sub, b"z" * 2000, now + 60)
    assert s.used["unproven"] == 2000 + len(sub) + ROW_OVERHEAD


def test_favouring_moves_stored_rows_between_pools(owners):
    (fav, sub), _, _ = owners
    s = BudgetedStorage()
    assert s.store_subkey(_key(0), sub, b"q" * 100, get_dht_time() + 60)
    cost = 100 + len(sub) + ROW_OVERHEAD
    assert s.used == {"favoured": 0, "unproven": cost, "large": 0}
    s.favour(frozenset({fav}))
    assert s.used == {"favoured": cost, "unproven": 0, "large": 0}


class _Table:
    """A routing table where nobody else is near any key: this node is every key's nearest."""

    def get_nearest_neighbors(self, key, k, exclude=None):
        return []


class _Protocol:
    routing_table, num_replicas, node_id = _Table(), 5, DHTID.generate()


def test_a_newcomer_is_pushed_a_bounded_share_favoured_first(owners):
    (fav, fav_sub), (a, a_sub), _ = owners
    s = BudgetedStorage(StorageBudget(push_bytes=3 * (1000 + ROW_OVERHEAD + 500), pushes_per_s=2.0))
    s.favour(frozenset({fav}))
    later = get_dht_time() + 60
    for i in range(10):
        assert s.store_subkey(_key(i), a_sub, b"u" * 1000, later)
    assert s.store_subkey(_key(10), fav_sub, b"f" * 1000, later)
    pushed = s.newcomer_rows(_Protocol(), DHTID.generate())
    assert len(pushed) == 3 and pushed[0][0] == _key(10)  # the favoured key first, then what fits
    for _ in range(20):  # a stream of fresh node ids: past the burst, nobody is pushed anything
        s.newcomer_rows(_Protocol(), DHTID.generate())
    assert s.newcomer_rows(_Protocol(), DHTID.generate()) == []


def test_the_charge_per_row_covers_what_a_row_takes(owners):
    """ROW_OVERHEAD is what the budget assumes a row costs besides its bytes: measured here."""
    (_, sub), _, _ = owners
    s = BudgetedStorage(StorageBudget(unproven_bytes=1 << 30, rows_per_key=1 << 20))
    later = get_dht_time() + 600
    values = [bytes([i % 256]) * 64 for i in range(20000)]
    keys = [_key(i) for i in range(20000)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for k, v in zip(keys, values):
        s.store_subkey(k, sub, v, later)
    per_row = (tracemalloc.get_traced_memory()[0] - before) / len(keys)
    tracemalloc.stop()
    assert per_row <= ROW_OVERHEAD, per_row  # (the values were made before: what is measured is the rest)


def test_hivemind_still_builds_its_storage_where_install_replaces_it():
    """install() swaps hivemind.dht.protocol's DHTLocalStorage and DHTProtocol.update_routing_table:
    an upgrade of hivemind that builds them otherwise must fail here, not leave storage unbounded."""
    source = inspect.getsource(DHTProtocol.create)
    assert "DHTLocalStorage(), DHTLocalStorage(maxsize=cache_size)" in source
    assert list(inspect.signature(DHTProtocol.update_routing_table).parameters) == ["self", "node_id", "peer_id",
                                                                                 "responded"]
