"""The record API: this peer's records stored, signed and expiring, and others' read back.

Each peer stores its records (PeerInfo, holdings, a learner's tally, a coordinator's swarm record)
at keys of its own, `hetero_<swarm>_<kind>/<peer id>`, and its PeerInfo also in the index
`hetero_<swarm>_peers`, each under a subkey holding its own public key (`[owner:...]`), so hivemind's
RSASignatureValidator makes the record writable only by that key; the schema (schema.py) and
`OwnerValidator` (validation.py) refuse malformed values, oversized ones, and anything under any
other key. Every peer runs the same validators, so such a record is refused by the whole DHT.
Records expire (`ttl`); a peer refreshes its own periodically, and a vanished peer is forgotten.
Every call is bounded in time (`DHT_TIMEOUT`): hivemind's own calls wait without a bound.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec
from hivemind.dht import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import get_dht_time
from msgspec import Struct

from swarm.dht.schema import KINDS, own_key, peers_key
from swarm.identity import Identity
from swarm.wire.peer import PROTOCOL, SOFTWARE, Holder, PeerInfo, SwarmRecord, as_value, from_value
from swarm.wire.tally import Tally

log = logging.getLogger(__name__)


def _owner_subkey(identity: Identity) -> bytes:
    """`[owner:<key>]`: only the holder of this key may write the record (RSASignatureValidator)."""
    return RSASignatureValidator(identity.dht_private_key()).local_public_key


DHT_TIMEOUT = 30.0
"""Seconds a DHT store or get may take: hivemind's own calls wait without a bound (and forever on a
DHT that is shutting down)."""


def _store(dht: DHT, key: str, record: Struct, ttl: float, identity: Identity) -> bool:
    """Store `record` under `key`, signed by our own subkey, expiring in `ttl` s; False if refused or late."""
    value = as_value(record)
    future = dht.store(key, value, expiration_time=get_dht_time() + ttl, subkey=_owner_subkey(identity),
                       return_future=True)
    try:
        stored = bool(future.result(DHT_TIMEOUT))
    except TimeoutError:
        future.cancel()
        log.warning("DHT store of %s timed out after %.0f s", key, DHT_TIMEOUT)
        return False
    if not stored:
        log.warning("the DHT refused our record under %s (%d bytes packed, expiring in %.0f s; swarm/dht/validation.py "
                    "has the bounds), or no DHT peer answered", key, len(msgspec.msgpack.encode(record)), ttl)
    return stored


@dataclass(frozen=True)
class Listed:
    """A row of the swarm's index of peers, as `status` shows it."""

    info: PeerInfo
    expires_in: float
    """Seconds until the row expires (its peer refreshes it while alive)."""
    last_seen_s: float
    """Seconds since its peer announced it."""


def _live_values(dht: DHT, key: str) -> list[tuple[Any, float]]:
    """(value, seconds until expiry) of every unexpired, validated subkey entry under `key`."""
    future = dht.get(key, latest=True, return_future=True)
    try:
        found = future.result(DHT_TIMEOUT)
    except TimeoutError:  # a DHT that is shutting down, or no reply: nothing known now
        future.cancel()
        log.warning("DHT get of %s timed out after %.0f s", key, DHT_TIMEOUT)
        return []
    if found is None or not isinstance(found.value, dict):
        return []
    now = get_dht_time()
    return [(e.value, e.expiration_time - now) for e in found.value.values() if e.expiration_time > now]


def stamped(identity: Identity, info: PeerInfo) -> PeerInfo:
    """`info` with who it is, what it runs and when it said so filled in."""
    return msgspec.structs.replace(info, peer_id=identity.peer_id, software=SOFTWARE, protocol=PROTOCOL,
                                   updated=float(get_dht_time()))


def announce(dht: DHT, identity: Identity, swarm: str, info: PeerInfo, ttl: float = 60.0) -> bool:
    """Store (or refresh) this peer's PeerInfo, signed, expiring in `ttl` seconds: in the index and at
    its own key (`stamped` here if it is not yet)."""
    info = info if info.peer_id == identity.peer_id and info.updated else stamped(identity, info)
    indexed = _store(dht, peers_key(swarm), info, ttl, identity)
    return _store(dht, own_key(swarm, "peer", identity.peer_id), info, ttl, identity) and indexed


def own_records(dht: DHT, swarm: str, kind: str, owners: list[str]) -> dict[str, Struct]:
    """owner -> its live record of `kind` (its struct, swarm/dht/schema.py `KINDS`), for at most
    MAX_OWNERS `owners` (one DHT traversal)."""
    return {owner: record for owner, (record, _) in own_entries(dht, swarm, kind, owners).items()}


def own_entries(dht: DHT, swarm: str, kind: str, owners: list[str]) -> dict[str, tuple[Struct, float]]:
    """owner -> (its live record of `kind`, the DHT time it expires at), as `own_records`."""
    owners = list(dict.fromkeys(owners))[:MAX_OWNERS]
    if not owners:
        return {}
    keys = {own_key(swarm, kind, o): o for o in owners}
    future = dht.run_coroutine(partial(_get_many, list(keys)), return_future=True)
    try:
        found = future.result(DHT_TIMEOUT)
    except TimeoutError:
        future.cancel()
        log.warning("DHT get of %d %s records timed out after %.0f s", len(keys), kind, DHT_TIMEOUT)
        return {}
    now = get_dht_time()
    out = {}
    for key, entries in found.items():
        owner = keys.get(key)
        live = [(r, expires) for r, expires in ((from_value(KINDS[kind], v), expires) for v, expires in entries
                                                if expires > now) if r is not None]
        if owner is not None and live:
            out[owner] = live[0]  # the validators let exactly one record live there: its owner's
    return out


MAX_OWNERS = 256
"""Owners one `own_records` call reads: a sampler asks its named learners and its (at most 64) mates."""


async def _get_many(keys: list[str], _dht, node) -> dict[str, list[tuple[Any, float]]]:
    """In the DHT's process: key -> [(value, expiration)] of its dictionary's entries (plain data:
    hivemind's value objects do not travel back through its pipe)."""
    found = await node.get_many(keys, sufficient_expiration_time=float("inf"))  # as get(latest=True)
    out: dict[str, list[tuple[Any, float]]] = {}
    for key, item in found.items():
        if item is not None and isinstance(item.value, dict):
            out[key] = [(e.value, e.expiration_time) for e in item.value.values()]
    return out


def peer_records(dht: DHT, swarm: str, peer_ids: list[str]) -> dict[str, PeerInfo]:
    """peer id -> its own live PeerInfo record, read one key per peer (not the whole index)."""
    return own_records(dht, swarm, "peer", peer_ids)


def list_peers(dht: DHT, swarm: str) -> list[Listed]:
    """The swarm's live peers (records the validators accepted and that have not expired)."""
    now = get_dht_time()
    rows = [(from_value(PeerInfo, v), left) for v, left in _live_values(dht, peers_key(swarm))]
    listed = [Listed(info, round(left, 1), round(now - info.updated, 1)) for info, left in rows if info is not None]
    return sorted(listed, key=lambda p: (p.info.role, p.info.peer_id))


def announce_holdings(dht: DHT, identity: Identity, swarm: str, chain: str, versions: list[int], ttl: float = 60.0) -> bool:
    """Say (signed, expiring) which versions of `chain` this peer serves."""
    holder = Holder(peer_id=identity.peer_id, chain=chain, versions=[int(v) for v in versions][-MAX_HELD:])
    return _store(dht, own_key(swarm, "holds", identity.peer_id), holder, ttl, identity)


MAX_HELD = 512
"""Versions one holder record lists (the newest): a chain segment runs at most `keyframe_every` (100
by default) versions; the validators bound the record's bytes (8 KiB: ~2,700 versions)."""


def holdings_of(dht: DHT, swarm: str, peer_ids: list[str]) -> list[Holder]:
    """The live holder records of `peer_ids` (a fetcher's mates), read one key per peer."""
    return list(own_records(dht, swarm, "holds", peer_ids).values())


def publish_tally(dht: DHT, identity: Identity, swarm: str, tally: Tally, ttl: float = 600.0) -> bool:
    """Store this learner's cumulative tally (swarm/wire/tally.py), signed, at its own key: its samplers
    and the leaderboard read it there, knowing the learner from the coordinators' swarm records."""
    return _store(dht, own_key(swarm, "tally", identity.peer_id), tally, ttl, identity)


def tally_of(dht: DHT, swarm: str, learner: str) -> Tally | None:
    """`learner`'s own live tally, or None."""
    return own_records(dht, swarm, "tally", [learner]).get(learner)


def swarm_record(identity: Identity, learners: dict[str, str], model_id: str = "") -> SwarmRecord:
    """As this swarm's coordinator, name the learners its samplers may follow, each with the model it
    trains ("" = unstated)."""
    return SwarmRecord(coordinator=identity.peer_id, learners=sorted(learners), model_id=model_id,
                       models={k: v for k, v in sorted(learners.items()) if v}, updated=float(get_dht_time()))


def publish_swarm_record(dht: DHT, identity: Identity, swarm: str, record: SwarmRecord, ttl: float = 60.0) -> bool:
    """Store our swarm record (`swarm_record`), signed and expiring."""
    return _store(dht, own_key(swarm, "swarm", identity.peer_id), record, ttl, identity)


def trusted_learners(dht: DHT, swarm: str, coordinators: set[str]) -> dict[str, str]:
    """Learners named by the swarm records of `coordinators` in the DHT (every other record is
    ignored), each with its model as `named_by` gives it."""
    return named_by(list(own_records(dht, swarm, "swarm", sorted(coordinators)).values()))


def named_by(records: list[SwarmRecord]) -> dict[str, str]:
    """Learners the swarm `records` name, each with the model a record says it trains ("" where none
    says; two coordinators that disagree about a learner's model: "?", which matches no model, so no
    sampler follows it)."""
    out: dict[str, str] = {}
    for record in records:
        for learner in record.learners:
            model, have = record.models.get(learner, ""), out.get(learner, "")
            out[learner] = "?" if model and have and model != have else (have or model)
    return out
