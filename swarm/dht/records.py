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
from functools import partial
from typing import Any

import msgpack
from hivemind.dht import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import get_dht_time

from swarm.identity import Identity
from swarm.dht.schema import PROTOCOL_VERSION, SOFTWARE
from swarm.dht.validation import own_key

log = logging.getLogger(__name__)


def peers_key(swarm: str) -> str:
    return f"hetero_{swarm}_peers"


def _owner_subkey(identity: Identity) -> bytes:
    """`[owner:<key>]`: only the holder of this key may write the record (RSASignatureValidator)."""
    return RSASignatureValidator(identity.dht_private_key()).local_public_key


DHT_TIMEOUT = 30.0
"""Seconds a DHT store or get may take: hivemind's own calls wait without a bound (and forever on a
DHT that is shutting down)."""


def _store(dht: DHT, key: str, value: dict[str, Any], ttl: float, identity: Identity) -> bool:
    """Store `value` under `key`, signed by our own subkey, expiring in `ttl` s; False if refused or late."""
    future = dht.store(key, value, expiration_time=get_dht_time() + ttl, subkey=_owner_subkey(identity),
                       return_future=True)
    try:
        stored = bool(future.result(DHT_TIMEOUT))
    except TimeoutError:
        future.cancel()
        log.warning("DHT store of %s timed out after %.0f s", key, DHT_TIMEOUT)
        return False
    if not stored:
        log.warning("the DHT refused our record under %s (%d bytes packed, expiring in %.0f s; ownership.py "
                    "has the bounds), or no DHT peer answered", key, len(msgpack.packb(value, use_bin_type=True)), ttl)
    return stored


def _live_values(dht: DHT, key: str) -> list[tuple[dict[str, Any], float]]:
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
    return [(e.value, e.expiration_time - now) for e in found.value.values()
            if isinstance(e.value, dict) and e.expiration_time > now]


def announce(dht: DHT, identity: Identity, swarm: str, info: dict[str, Any], ttl: float = 60.0) -> bool:
    """Store (or refresh) this peer's PeerInfo, signed, expiring in `ttl` seconds."""
    # every field explicitly: SchemaValidator refuses values that parse to anything different
    info = {"learner": "", "name": "", "private": False, "accepts": [], **info, "peer_id": identity.peer_id, "software": SOFTWARE, "protocol": PROTOCOL_VERSION,
            "updated": float(get_dht_time())}
    indexed = _store(dht, peers_key(swarm), info, ttl, identity)
    return _store(dht, own_key(swarm, "peer", identity.peer_id), info, ttl, identity) and indexed


def own_records(dht: DHT, swarm: str, kind: str, owners: list[str]) -> dict[str, dict[str, Any]]:
    """owner -> its live record of `kind`, for at most MAX_OWNERS `owners` (one DHT traversal)."""
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
        live = [v for v, expires in entries if expires > now and isinstance(v, dict)]
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


def peer_records(dht: DHT, swarm: str, peer_ids: list[str]) -> dict[str, dict[str, Any]]:
    """peer id -> its own live PeerInfo record, read one key per peer (not the whole index)."""
    return own_records(dht, swarm, "peer", peer_ids)


def list_peers(dht: DHT, swarm: str) -> list[dict[str, Any]]:
    """The swarm's live peers (records the validators accepted and that have not expired)."""
    now = get_dht_time()
    peers = [{**v, "expires_in": round(left, 1), "last_seen_s": round(now - v.get("updated", now), 1)}
             for v, left in _live_values(dht, peers_key(swarm))]
    return sorted(peers, key=lambda p: (p.get("role", ""), p.get("peer_id", "")))


def announce_holdings(dht: DHT, identity: Identity, swarm: str, chain: str, versions: list[int], ttl: float = 60.0) -> bool:
    """Say (signed, expiring) which versions of `chain` this peer serves."""
    value = {"peer_id": identity.peer_id, "chain": chain, "versions": [int(v) for v in versions][-MAX_HELD:]}
    return _store(dht, own_key(swarm, "holds", identity.peer_id), value, ttl, identity)


MAX_HELD = 512
"""Versions one holder record lists (the newest): a chain segment runs at most `keyframe_every` (100
by default) versions, and the validators refuse a longer list."""


def holdings_of(dht: DHT, swarm: str, peer_ids: list[str]) -> list[dict[str, Any]]:
    """The live holder records of `peer_ids` (a fetcher's mates), read one key per peer."""
    return list(own_records(dht, swarm, "holds", peer_ids).values())


def publish_tally(dht: DHT, identity: Identity, swarm: str, value: dict[str, Any], ttl: float = 600.0) -> bool:
    """Store this learner's cumulative tally (swarm/wire/tally.py), signed, at its own key: its samplers
    and the leaderboard read it there, knowing the learner from the coordinators' swarm records."""
    return _store(dht, own_key(swarm, "tally", identity.peer_id), value, ttl, identity)


def tally_of(dht: DHT, swarm: str, learner: str) -> dict[str, Any] | None:
    """`learner`'s own live tally, or None."""
    return own_records(dht, swarm, "tally", [learner]).get(learner)


def publish_swarm_record(dht: DHT, identity: Identity, swarm: str, learners: dict[str, str], model_id: str = "",
                         ttl: float = 60.0) -> bool:
    """As this swarm's coordinator, name the learners its samplers may follow, each with the model it
    trains ("" = unstated), signed and expiring."""
    value = {"coordinator": identity.peer_id, "learners": sorted(learners), "model_id": model_id,
             "models": {k: v for k, v in sorted(learners.items()) if v}, "updated": float(get_dht_time())}
    return _store(dht, own_key(swarm, "swarm", identity.peer_id), value, ttl, identity)


def trusted_learners(dht: DHT, swarm: str, coordinators: set[str]) -> dict[str, str]:
    """Learners named by the swarm records of `coordinators` (every other record is ignored), each
    with the model a record says it trains ("" where none says; two coordinators that disagree
    about a learner's model: "?", which matches no model, so no sampler follows it)."""
    out: dict[str, str] = {}
    for v in own_records(dht, swarm, "swarm", sorted(coordinators)).values():
        models = v.get("models", {})
        for learner in v.get("learners", []):
            model, have = models.get(learner, ""), out.get(learner, "")
            out[learner] = "?" if model and have and model != have else (have or model)
    return out
