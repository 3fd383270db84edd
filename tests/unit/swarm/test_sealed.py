"""A DHT record carried outside the DHT is checked as the DHT checks it (swarm/dht/sealed.py)."""


import msgspec
import pytest
from hivemind.utils import get_dht_time

from swarm.dht.sealed import Sealer
from swarm.dht.validation import MAX_TTL
from swarm.identity import Identity
from swarm.wire.directory import Entry
from swarm.wire.peer import PeerInfo, SwarmRecord


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    base = tmp_path_factory.mktemp("keys")
    return [Identity.load_or_create(base / f"{i}.key") for i in range(2)]


def _info(peer_id: str, **over) -> PeerInfo:
    return PeerInfo(peer_id=peer_id, role="learner", model_id="m", version=3, engine="hf", throughput=1.0, **over)


def test_a_sealed_record_opens_as_its_owners(keys):
    me = Sealer(keys[0], "s")
    entry = me.seal("peer", _info(keys[0].peer_id), keys[0].peer_id, ttl=60)
    owner, record = Sealer(keys[1], "s").unseal(entry)  # anyone opens it
    assert owner == keys[0].peer_id and record == _info(keys[0].peer_id)
    assert Sealer.owner_of(entry) == keys[0].peer_id


def test_an_altered_or_misplaced_record_is_refused(keys):
    me, other = Sealer(keys[0], "s"), Sealer(keys[1], "s")
    entry = me.seal("peer", _info(keys[0].peer_id), keys[0].peer_id, ttl=60)
    value = bytearray(entry.value)
    value[value.index(b"hf")] = ord("H")
    for bad in (msgspec.structs.replace(entry, value=bytes(value)),  # the value changed
                msgspec.structs.replace(entry, expires=entry.expires + 10),  # its expiration changed
                msgspec.structs.replace(entry, kind="swarm"),  # another kind's key: not a swarm record
                msgspec.structs.replace(entry, subkey=other.seal("peer", _info(keys[1].peer_id), keys[1].peer_id,
                                                                 60).subkey)):  # another key's subkey
        with pytest.raises(ValueError):
            other.unseal(bad)
    with pytest.raises(ValueError):  # the same record in another swarm is at another key
        Sealer(keys[1], "t").unseal(entry)


def test_a_record_naming_another_peer_or_too_long_lived_is_refused(keys):
    me = Sealer(keys[0], "s")
    naming = me.seal("peer", _info(keys[1].peer_id), keys[0].peer_id, ttl=60)  # signed by 0, says it is 1
    with pytest.raises(ValueError):
        me.unseal(naming)
    ahead = me.seal("swarm", SwarmRecord(coordinator=keys[0].peer_id, learners=[]), keys[0].peer_id, ttl=MAX_TTL + 60)
    with pytest.raises(ValueError):
        me.unseal(ahead)
    assert me.unseal(me.seal("swarm", SwarmRecord(coordinator=keys[0].peer_id, learners=[]), keys[0].peer_id,
                             ttl=MAX_TTL - 60))[0] == keys[0].peer_id


def test_an_expired_record_still_opens(keys):
    """Freshness is the reader's to judge (a last good copy is used while its owner answers)."""
    me = Sealer(keys[0], "s")
    entry = me.seal("peer", _info(keys[0].peer_id), keys[0].peer_id, ttl=-5)
    assert entry.expires < get_dht_time()
    assert me.unseal(entry)[0] == keys[0].peer_id


def test_garbage_is_a_value_error(keys):
    me = Sealer(keys[0], "s")
    for entry in (Entry("peer", b"\xc1", b"", 0.0), Entry("tally", b"\xa3abc", b"x", 1.0)):
        with pytest.raises(ValueError):
            me.unseal(entry)
