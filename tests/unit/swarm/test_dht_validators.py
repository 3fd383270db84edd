"""The validator chain every DHT peer runs (swarm/dht/validation.py OwnerValidator,
hivemind's signatures): the leaderboard's tallies only learners can sign, and each key's one record.

Forged, edited and self-crediting tallies refused; a learner's version and eval accepted in bounds,
refused out of them (by the store too), and older tallies without them still accepted; a peer record
naming another peer, a second subkey of one key, a comment after the key, another key's record at an
owner's own key, records larger or longer-lived than their kind allows. Real in-process DHT peers
keeping a learner's tally and refusing a forged one:
tests/integration/swarm/test_dht_validators_wire.py.
"""

from __future__ import annotations

from swarm.wire.peer import as_value

import dataclasses
import math

import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.utils import MSGPackSerializer, get_dht_time

from helpers.leaderboard import tally
from node.learner.credit import Credit
from swarm.dht.validation import own_key
from swarm.identity import Identity
from swarm.leaderboard import LeaderboardStore, render_rows
from swarm.dht.validation import MAX_TTL, OwnerValidator, owner_peer_id


def _chain(identity: Identity) -> CompositeValidator:
    return CompositeValidator([RSASignatureValidator(identity.dht_private_key()), OwnerValidator("t")])


def _record(signer: Identity, owner: Identity, value: dict, key: str | None = None, prefix: bytes = b"",
            ttl: float = 60.0) -> DHTRecord:
    """`value` under `key` (default: the owner's own tally key), signed by `signer` as `owner`'s."""
    key = key or own_key("t", "tally", owner.peer_id)
    subkey = prefix + RSASignatureValidator(owner.dht_private_key()).local_public_key
    record = DHTRecord(DHTID.generate(source=key).to_bytes(), MSGPackSerializer.dumps(subkey),
                       MSGPackSerializer.dumps(value), get_dht_time() + ttl)
    return DHTRecord(record.key, record.subkey, _chain(signer).sign_value(record), record.expiration_time)


def test_validators_accept_a_learners_own_tally_and_refuse_forged_edited_and_self_credit(tmp_path):
    learner, forger = (Identity.load_or_create(tmp_path / f"{n}.key") for n in ("l", "f"))
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    t = Credit()
    t.credit("sampler-A", 8, 40, "m")
    good = _record(learner, learner, as_value(t.tally(learner.peer_id, "m")))
    assert owner_peer_id(MSGPackSerializer.loads(good.subkey)) == learner.peer_id
    assert reader.validate(good)
    edited = DHTRecord(good.key, good.subkey, good.value.replace(b"sampler-A", b"sampler-Z"), good.expiration_time)
    assert not reader.validate(edited)  # value changed after signing
    # under the learner's subkey but signed by another key (hivemind signs only its own subkeys)
    assert not reader.validate(_record(forger, learner, as_value(t.tally(learner.peer_id, "m"))))
    # the forger's own subkey, claiming to be the learner
    assert not reader.validate(_record(forger, forger, as_value(t.tally(learner.peer_id, "m"))))
    # a learner crediting itself
    t.credit(learner.peer_id, 8, 40, "m")
    selfish = as_value(t.tally(learner.peer_id, "m"))
    selfish["peers"][learner.peer_id] = selfish["peers"]["sampler-A"]
    assert not reader.validate(_record(learner, learner, selfish))
    assert learner.peer_id not in as_value(t.tally(learner.peer_id, "m"))["peers"]  # and Tally never writes one


def test_validators_accept_a_learners_version_and_eval_and_still_accept_a_tally_without_them(tmp_path):
    learner = Identity.load_or_create(tmp_path / "l.key")
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    t = Credit()
    t.credit("sampler-A", 8, 40, "m")
    history = [{"kind": "eval", "version": 0, "eval_acc": 0.25}, {"kind": "step", "version": 1},
               {"kind": "eval", "version": 3, "eval_acc": 0.625}, {"kind": "step", "version": 4}]
    value = as_value(t.tally(learner.peer_id, "m", 4, history))
    assert (value["version"], value["eval_acc"], value["eval_version"]) == (4, 0.625, 3)  # the latest eval
    assert reader.validate(_record(learner, learner, value))
    before_eval = as_value(t.tally(learner.peer_id, "m", 0, []))
    assert "eval_acc" not in before_eval and reader.validate(_record(learner, learner, before_eval))
    older = as_value(t.tally(learner.peer_id, "m"))  # as a learner from before these fields publishes it
    assert "version" not in older and reader.validate(_record(learner, learner, older))
    signed = _record(learner, learner, value)
    edited = signed.value.replace(MSGPackSerializer.dumps(value), MSGPackSerializer.dumps({**value, "eval_acc": 0.99}))
    assert edited != signed.value
    assert not reader.validate(DHTRecord(signed.key, signed.subkey, edited, signed.expiration_time))  # after signing


def test_validators_take_a_tally_naming_max_seeders_and_refuse_more_or_malformed_ones(tmp_path):
    """A tally's seeders are a new swarm's stand-in mates (swarm/discovery.py `seeders`): bounded on
    the wire, so every DHT peer refuses a learner's tally naming more than MAX_SEEDERS, or non-ids."""
    from swarm.wire.tally import MAX_SEEDERS
    learner = Identity.load_or_create(tmp_path / "l.key")
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    ids = [f"QmSeeder{i:038d}" for i in range(MAX_SEEDERS + 1)]
    value = as_value(Credit().tally(learner.peer_id, "m", 0, [], seeders=ids))
    assert value["seeders"] == ids[:MAX_SEEDERS] and reader.validate(_record(learner, learner, value))
    for bad in (ids, [*ids[:3], 7], ["x" * 129]):
        assert not reader.validate(_record(learner, learner, {**value, "seeders": bad})), bad


BAD_PROGRESS = {
    "accuracy above 1": {"version": 4, "eval_acc": 1.5, "eval_version": 3},
    "accuracy below 0": {"version": 4, "eval_acc": -0.01, "eval_version": 3},
    "accuracy NaN": {"version": 4, "eval_acc": math.nan, "eval_version": 3},
    "accuracy infinite": {"version": 4, "eval_acc": math.inf, "eval_version": 3},
    "accuracy a bool": {"version": 4, "eval_acc": True, "eval_version": 3},
    "accuracy null": {"version": 4, "eval_acc": None, "eval_version": 3},
    "negative version": {"version": -1},
    "version a float": {"version": 4.0},
    "negative eval version": {"version": 4, "eval_acc": 0.5, "eval_version": -1},
    "eval newer than the version": {"version": 4, "eval_acc": 0.5, "eval_version": 5},
    "accuracy without its version": {"version": 4, "eval_acc": 0.5},
    "eval without a current version": {"eval_acc": 0.5, "eval_version": 3},
}


@pytest.mark.parametrize("why", list(BAD_PROGRESS))
def test_validators_and_the_store_refuse_a_learners_out_of_range_or_incoherent_eval(tmp_path, why):
    learner = Identity.load_or_create(tmp_path / "l.key")
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    bad = {**tally(learner.peer_id, 5, {"sampler-A": (8, 40)}), **BAD_PROGRESS[why]}
    assert not reader.validate(_record(learner, learner, bad)), f"the DHT took a tally with {why}: {bad}"
    store = LeaderboardStore(tmp_path / "lb.db")
    assert store.ingest(bad) == "invalid", why
    assert store.learners() == [] and store.counters() == {"invalid": 1}


def test_validators_refuse_a_peer_record_naming_another_peer_and_a_second_subkey_of_one_key(tmp_path):
    honest, attacker = (Identity.load_or_create(tmp_path / f"{n}.key") for n in ("h", "a"))
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))

    def info(peer_id: str, name: str) -> dict:
        return {"peer_id": peer_id, "role": "sampler", "model_id": "m", "version": 0, "engine": "hf", "throughput": 0.0,
                "software": "x", "protocol": 2, "maddrs": [], "learner": "", "name": name, "updated": 0.0, "private": False,
                "accepts": []}

    assert reader.validate(_record(attacker, attacker, info(attacker.peer_id, "me"), "hetero_t_peers"))
    # under its own key, naming the honest peer (to put its name on the honest peer's leaderboard row)
    assert not reader.validate(_record(attacker, attacker, info(honest.peer_id, "evil"), "hetero_t_peers"))
    # a second subkey of the same key (sybil peer records): only exactly [owner:<key>] is accepted
    assert not reader.validate(_record(attacker, attacker, info(attacker.peer_id, "me"), "hetero_t_peers", b"2"))
    # a swarm record names its coordinator, and only the signer can be it
    rec = {"coordinator": attacker.peer_id, "learners": [attacker.peer_id], "model_id": "", "models": {}, "updated": 0.0}
    assert reader.validate(_record(attacker, attacker, rec, own_key("t", "swarm", attacker.peer_id)))
    assert not reader.validate(_record(attacker, attacker, {**rec, "coordinator": honest.peer_id},
                                       own_key("t", "swarm", attacker.peer_id)))


def _info(peer_id: str, maddrs: list[str] | None = None) -> dict:
    return {"peer_id": peer_id, "role": "sampler", "model_id": "m", "version": 0, "engine": "hf", "throughput": 0.0,
            "software": "x", "protocol": 5, "maddrs": maddrs or [], "learner": "", "name": "", "updated": 0.0,
            "private": False, "accepts": []}


def test_an_owners_own_key_takes_its_record_and_nobody_elses(tmp_path):
    """Readers who know whom they want read that owner's own key (issue 39): it must hold the
    owner's one record, whatever other keys try to put there."""
    honest, attacker = (Identity.load_or_create(tmp_path / f"{n}.key") for n in ("h", "a"))
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    mine = own_key("t", "peer", honest.peer_id)
    assert reader.validate(_record(honest, honest, _info(honest.peer_id), mine))
    held = {"peer_id": honest.peer_id, "chain": "c", "versions": [1, 2]}
    assert reader.validate(_record(honest, honest, held, own_key("t", "holds", honest.peer_id)))
    t = Credit()
    t.credit("sampler-A", 8, 40, "m")
    assert reader.validate(_record(honest, honest, as_value(t.tally(honest.peer_id, "m")), own_key("t", "tally", honest.peer_id)))
    # another key's record at the honest peer's own key: refused by every DHT peer, so stored nowhere
    assert not reader.validate(_record(attacker, attacker, _info(attacker.peer_id), mine))
    # a holder record where a peer record belongs (the kind is the key's), and a mandatory field missing
    # (an optional one takes its default: a newer peer may leave out what it no longer sends)
    assert not reader.validate(_record(honest, honest, held, mine))
    assert not reader.validate(_record(honest, honest, {k: v for k, v in _info(honest.peer_id).items() if k != "role"}, mine))
    assert reader.validate(_record(honest, honest, {k: v for k, v in _info(honest.peer_id).items() if k != "name"}, mine))
    # any other key: the swarm's DHT is not free storage
    assert not reader.validate(_record(attacker, attacker, _info(attacker.peer_id), "hetero_t_anything"))
    assert not reader.validate(_record(attacker, attacker, _info(attacker.peer_id), "hetero_t_holders"))


def test_one_key_has_one_subkey_not_one_per_comment_after_its_public_key(tmp_path):
    """The OpenSSH parser ignores a comment after the key, and hivemind's signature check accepts
    it: `...AAAA 1]`, `...AAAA 2]` were as many rows of one key, and a 500 KB comment passed the
    value's size bound. Only the key's canonical form is an owner."""
    peer = Identity.load_or_create(tmp_path / "p.key")
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    own = RSASignatureValidator(peer.dht_private_key()).local_public_key
    for key in ("hetero_t_peers", own_key("t", "peer", peer.peer_id)):
        for subkey in (own[:-1] + b" 1]", own[:-1] + b" " + b"x" * 5000 + b"]"):
            record = DHTRecord(DHTID.generate(source=key).to_bytes(), MSGPackSerializer.dumps(subkey),
                               MSGPackSerializer.dumps(_info(peer.peer_id)), get_dht_time() + 60)
            signature = peer.dht_private_key().sign(MSGPackSerializer.dumps(dataclasses.astuple(record)))
            signed = dataclasses.replace(record, value=record.value + b"[signature:" + signature + b"]")
            assert not reader.validate(signed), (key, len(subkey))
        assert reader.validate(_record(peer, peer, _info(peer.peer_id), key))


def test_one_key_has_one_subkey_not_one_per_msgpack_encoding_of_it(tmp_path):
    """The same `[owner:<key>]` packed as bin32, or as an ext type hivemind does not know (it decodes
    those to their bytes), unpacks to the canonical subkey and passed every check, but is another
    row under the same DHT key: hundreds of rows for one key. Only the canonical packing is taken."""
    import struct
    peer = Identity.load_or_create(tmp_path / "p.key")
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    own = RSASignatureValidator(peer.dht_private_key()).local_public_key
    packings = {"bin32": b"\xc6" + struct.pack(">I", len(own)) + own,
                "ext32, an unknown type": b"\xc9" + struct.pack(">I", len(own)) + b"\x7f" + own}
    for key in ("hetero_t_peers", own_key("t", "peer", peer.peer_id)):
        for how, subkey in packings.items():
            record = DHTRecord(DHTID.generate(source=key).to_bytes(), subkey, MSGPackSerializer.dumps(_info(peer.peer_id)),
                               get_dht_time() + 60)
            signature = peer.dht_private_key().sign(MSGPackSerializer.dumps(dataclasses.astuple(record)))
            signed = dataclasses.replace(record, value=record.value + b"[signature:" + signature + b"]")
            assert not reader.validate(signed), (key, how)
        assert reader.validate(_record(peer, peer, _info(peer.peer_id), key))


def test_a_record_larger_or_longer_lived_than_its_kind_allows_is_refused(tmp_path):
    """Before: one key stored a 2.5 MB peer record (16 addresses of 200 characters is ~3.5 KB)."""
    peer = Identity.load_or_create(tmp_path / "p.key")
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    fits = _info(peer.peer_id, ["/ip4/1.2.3.4/tcp/1/" + "x" * 180] * 16)
    assert reader.validate(_record(peer, peer, fits, "hetero_t_peers"))
    assert reader.validate(_record(peer, peer, fits, own_key("t", "peer", peer.peer_id)))
    big = _info(peer.peer_id, ["/ip4/1.2.3.4/tcp/1/" + "x" * 980] * 5)
    assert not reader.validate(_record(peer, peer, big, "hetero_t_peers"))
    assert not reader.validate(_record(peer, peer, big, own_key("t", "peer", peer.peer_id)))
    assert reader.validate(_record(peer, peer, _info(peer.peer_id), "hetero_t_peers", ttl=MAX_TTL - 60))
    assert not reader.validate(_record(peer, peer, _info(peer.peer_id), "hetero_t_peers", ttl=MAX_TTL + 60))


def test_a_tally_crediting_10000_keys_fits_validates_and_the_board_counts_the_unnamed(tmp_path):
    """Keys are free: past ~6,700 credited keys a tally naming each was over the DHT's 1 MiB and
    refused everywhere. Now it names the most credited and the latest, and sums the rest."""
    from node.learner.credit import MAX_PUBLISHED, PUBLISHED_RECENT
    from swarm.discovery import most_recent
    from swarm.dht.validation import MAX_BYTES
    learner = Identity.load_or_create(tmp_path / "l.key")
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    model = "an-organisation/a-rather-long-model-name-Instruct-v0.3-GPTQ-Int4"
    t = Credit()
    keys = [f"QmSybil{i:039d}" for i in range(10_000)]  # as long as a real peer id (46 characters)
    for i, k in enumerate(keys):
        t.credit(k, 8 + i % 97, 10**9 + i, model, now=1e9 + i)  # large token counts: 9 bytes each
    t.credit(keys[0], 8, 40, model, now=2e9)  # long ago the least credited, now the newest
    published = t.tally(learner.peer_id, model, 5, [])
    value = as_value(published)
    assert len(MSGPackSerializer.dumps(value)) == len(published.encode()) <= MAX_BYTES["tally"]
    assert len(value["peers"]) == MAX_PUBLISHED and value["others"]["count"] == 10_000 - MAX_PUBLISHED
    assert keys[0] in value["peers"] and most_recent(published, 128)[0] == keys[0]  # a newcomer is read for mates
    assert set(keys[-(PUBLISHED_RECENT - 1):]) <= set(value["peers"])
    everyone = {k: sum(c[k] for c in t.peers.values()) for k in ("groups", "rollouts", "tokens")}
    named = {k: sum(c[k] for c in value["peers"].values()) for k in ("groups", "rollouts", "tokens")}
    assert {k: named[k] + value["others"][k] for k in named} == everyone  # nothing lost, nothing twice
    assert reader.validate(_record(learner, learner, value))
    assert not reader.validate(_record(learner, learner, {**value, "others": {**value["others"], "count": -1}}))
    assert reader.validate(_record(learner, learner, {k: v for k, v in value.items() if k != "others"}))  # as before
    store = LeaderboardStore(tmp_path / "lb.db")
    assert store.ingest(value) == "new"
    board = store.board()
    assert board["total_rollouts"] == everyone["rollouts"] and len(board["peers"]) == MAX_PUBLISHED
    assert board["others"] == {"count": 10_000 - MAX_PUBLISHED, **{k: value["others"][k] for k in named}}
    assert board["learner_progress"][0]["rollouts"] == everyone["rollouts"]
    assert board["learner_progress"][0]["contributors"] == 10_000
    assert f"from {10_000 - MAX_PUBLISHED} more peer(s)" in render_rows(board)
    assert sum(p["share"] for p in board["peers"]) < 1.0
