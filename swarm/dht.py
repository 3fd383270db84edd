"""DHT discovery: signed, schema-validated, expiring PeerInfo records (docs/DESIGN.md, "Dependencies" and "Wire records").

Each peer stores its records (PeerInfo, holdings, a learner's tally, a coordinator's swarm record)
at keys of its own, `hetero_<swarm>_<kind>/<peer id>`, and its PeerInfo also in the index
`hetero_<swarm>_peers`, each under a subkey holding its own public key (`[owner:...]`), so hivemind's
RSASignatureValidator makes the record writable only by that key; the pydantic.v1 SchemaValidator
and ownership.py's OwnerValidator refuse malformed values, oversized ones, and anything under any
other key. Every peer runs the same validators, so such a record is refused by the whole DHT.
Records expire (`ttl`); a peer refreshes its own periodically, and a vanished peer is forgotten.

Networking defaults are safe: loopback only and no UPnP/NAT-PMP gateway probing unless the
caller opts in (`NetworkConfig`), which a real `join` on the internet does.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Dict, List

import msgpack
import pydantic.v1 as pydantic
from hivemind.dht import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.schema import SchemaValidator, conbytes
from hivemind.utils import get_dht_time

from swarm.identity import Identity
from swarm.lifetime import end_with_parent
from swarm.ownership import OwnerValidator, own_key
from swarm.tally import TallyModel

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 5
"""2: rollouts over a gated call (hetero.rollouts.v2), peer records say whether the peer is private.
3: weight patches entropy-coded (node/entropy.py): a protocol-2 sampler cannot apply them.
4: several learners: peer records say which models a learner takes (`accepts`), swarm records which
model each learner trains (`models`). hivemind's schema check refuses a record with a field more
or less than the reader's schema, so a swarm runs one protocol.
5: records also at their owner's own key (peer, holds, tally, swarm: ownership.py), where readers
who know the owner read them; holder and swarm records only there; the DHT refuses anything else."""
SOFTWARE = "hetero-node/0.1.0"


class PeerInfoModel(pydantic.BaseModel):
    peer_id: pydantic.StrictStr
    role: pydantic.constr(regex=r"^(sampler|learner|bootstrap)$", strict=True)
    model_id: pydantic.StrictStr
    version: pydantic.conint(ge=0, strict=True)
    engine: pydantic.StrictStr
    throughput: pydantic.confloat(ge=0, strict=True)
    software: pydantic.StrictStr
    protocol: pydantic.StrictInt
    maddrs: List[pydantic.StrictStr]
    learner: pydantic.StrictStr = ""
    """For samplers: the learner peer id they follow."""
    name: pydantic.constr(max_length=64, strict=True) = ""
    """Optional display name (leaderboard); untrusted text, escaped wherever it is shown."""
    updated: pydantic.StrictFloat = 0.0
    """DHT time of the announcement (status shows 'last seen')."""
    private: pydantic.StrictBool = False
    """Behind a NAT (swarm/reach.py): no peer can dial it, so no mate asks it for weight chunks."""
    accepts: List[pydantic.constr(max_length=256, strict=True)] = []
    """For learners: other models whose rollouts it trains on ("*": any it can check), so samplers
    of those models send it a copy of each group (docs/DESIGN.md, "Several learners")."""


class HolderModel(pydantic.BaseModel):
    """Which versions of which weight chain a peer holds and serves (content it can upload)."""

    peer_id: pydantic.StrictStr
    chain: pydantic.StrictStr
    versions: List[pydantic.StrictInt]


class SwarmRecordModel(pydantic.BaseModel):
    """What a swarm is, signed by its coordinator (a bootstrap peer's key): the learners samplers
    may follow. A sampler trusts the coordinators named by its --initial-peers (their /p2p/ ids)."""

    coordinator: pydantic.StrictStr
    learners: List[pydantic.StrictStr]
    model_id: pydantic.StrictStr = ""
    """The model the swarm trains ("" = not fixed)."""
    models: Dict[pydantic.StrictStr, pydantic.StrictStr] = {}
    """Learner -> the model it trains, where the coordinator says (a sampler follows only its own
    model's learner; a learner the record names without a model is taken at its word)."""
    updated: pydantic.StrictFloat = 0.0


_OWN = conbytes(regex=rb"^\[owner:.+\]$")


class SwarmSchema(pydantic.BaseModel):
    """The index (ownership.py, `INDEXES`): hivemind's SchemaValidator checks its rows."""

    peers: Dict[_OWN, PeerInfoModel]


OWN_MODELS = {"peer": PeerInfoModel, "holds": HolderModel, "tally": TallyModel, "swarm": SwarmRecordModel}
"""What a record at an owner's own key must parse to (ownership.py's `OwnerValidator` checks it)."""


class SwarmConnectError(ConnectionError):
    """This peer could not join the swarm: `str(e)` says why, `fix` what to do about it."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(what)
        self.fix = fix


class BadAddressError(ValueError):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.fix = ("pass the address a bootstrap peer prints at start-up, like "
                    "/ip4/1.2.3.4/tcp/31337/p2p/QmXyz... (hetero-node bootstrap shows it)")


def is_loopback(maddr: str) -> bool:
    """Whether a multiaddr is on this machine (127.0.0.0/8, ::1)."""
    import ipaddress

    parts = maddr.split("/")
    try:
        return len(parts) > 2 and parts[1] in ("ip4", "ip6") and ipaddress.ip_address(parts[2]).is_loopback
    except ValueError:
        return False


def check_multiaddr(addr: str) -> str:
    """`addr` if it is a multiaddr that names a peer (/ip4/1.2.3.4/tcp/31337/p2p/Qm...)."""
    from hivemind.utils.multiaddr import Multiaddr

    try:
        protocols = {p.name for p in Multiaddr(addr).protocols()}
    except Exception:
        raise BadAddressError(f"initial peer {addr!r} is not a multiaddr") from None
    if "p2p" not in protocols:
        raise BadAddressError(f"initial peer {addr!r} has no /p2p/<peer id> part")
    return addr


def check_announce_maddr(addr: str) -> str:
    """`addr` if it is a multiaddr with a TCP port other than 0 (what hivemind can announce)."""
    from hivemind.utils.multiaddr import Multiaddr

    try:
        port = int(Multiaddr(addr).value_for_protocol("tcp"))
    except Exception:
        port = 0
    if port == 0:
        e = BadAddressError(f"announce address {addr!r} is not a multiaddr with an explicit /tcp/<port>")
        e.fix = "announce where peers reach this one, e.g. --announce-maddr /ip4/1.2.3.4/tcp/31337"
        raise e
    return addr


@dataclass
class NetworkConfig:
    host: str = ""
    """Listen address: 127.0.0.1 (this machine only) or 0.0.0.0 (all interfaces); empty: 0.0.0.0 when
    a bootstrap is on another machine (on 127.0.0.1 nobody there could dial us), else 127.0.0.1."""
    port: int = 0
    """0 picks a free port (tests); a fixed port on a public machine."""
    public_ip: str | None = None
    """Announce this address to others (machines behind a public IP or port forward)."""
    nat_port_map: bool = False
    """UPnP/NAT-PMP gateway probing: off on loopback and in tests, on for a real `join`."""
    use_relay: bool = False
    use_auto_relay: bool = False
    client_mode: bool = False
    """Behind NAT with no open port: make outgoing connections only (reached through relays)."""
    reachability: str = "auto"
    """Whether peers can dial this one: auto (a joining node asks a bootstrap, swarm/reach.py, unless
    every bootstrap is on this machine), public, or private (= client_mode: a DHT client, reached
    through relays)."""
    initial_peers: list[str] = field(default_factory=list)
    """Multiaddrs of bootstrap peers, each with its /p2p/<peer id>."""
    announce_maddrs: list[str] = field(default_factory=list)
    """Announce exactly these multiaddrs (with an explicit port, e.g. /ip4/1.2.3.4/tcp/4001) instead of the
    listen address: a port forward or proxy in front of this peer (examples/wan.py's delaying relay)."""

    def __post_init__(self) -> None:
        for addr in self.initial_peers:
            check_multiaddr(addr)
        for addr in self.announce_maddrs:
            check_announce_maddr(addr)
        if not self.host:
            remote = any(not is_loopback(m) for m in self.initial_peers)
            self.host = "0.0.0.0" if remote or self.public_ip else "127.0.0.1"
        if self.reachability not in ("auto", "public", "private"):
            raise ValueError(f"reachability must be auto, public or private, not {self.reachability!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, not {self.port}")


def peers_key(swarm: str) -> str:
    return f"hetero_{swarm}_peers"


def create_dht(identity: Identity, net: NetworkConfig, swarm: str) -> DHT:
    """Start the DHT (a forked process with its p2pd). Create it before CUDA is initialised."""
    validators = swarm_validators(identity, swarm)
    announce = list(net.announce_maddrs) + ([f"/ip4/{net.public_ip}/tcp/{net.port}"] if net.public_ip else [])
    try:
        return _dht(identity, net, validators, announce)
    except Exception as e:  # hivemind reports both as a failed daemon start
        if "bootstrap peers" in str(e):
            raise SwarmConnectError(f"could not reach any of the initial peers {', '.join(net.initial_peers)}",
                                    "check the address and that the bootstrap peer is running and reachable "
                                    "(firewall, port); a coordinator prints the address to use") from None
        if "address already in use" in str(e).lower():
            raise SwarmConnectError(f"port {net.port} on {net.host} is already in use",
                                    "pick another --port, or 0 for any free one") from None
        raise


def swarm_validators(identity: Identity, swarm: str) -> list:
    """What every peer checks of the swarm's DHT records: signatures, the schema, owners."""
    return [RSASignatureValidator(identity.dht_private_key()), SchemaValidator(SwarmSchema, prefix=f"hetero_{swarm}"),
            OwnerValidator(swarm)]


class _DHT(DHT):
    """hivemind's DHT, whose process and p2pd end when the node's process does (swarm/lifetime.py),
    callable from several threads at once."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # every call is a message down one pipe to the DHT process, and a Connection is not safe
        # for two threads: a message over 16 KiB (a tally) goes in two writes that another
        # thread's can split. A role's heartbeat, its fetcher's announcer and its loop all call
        self._outer_pipe = _LockedSend(self._outer_pipe)

    def run(self) -> None:
        end_with_parent()
        super().run()


class _LockedSend:
    """A pipe's sending end whose `send` one thread at a time may use (the rest passes through)."""

    def __init__(self, conn) -> None:
        self._conn, self._lock = conn, threading.Lock()

    def send(self, obj) -> None:
        with self._lock:
            self._conn.send(obj)

    def close(self) -> None:  # not while another thread is halfway through a message
        with self._lock:
            self._conn.close()

    def __getattr__(self, name: str):
        return getattr(self._conn, name)


def _dht(identity: Identity, net: NetworkConfig, validators: list, announce: list[str] | None) -> DHT:
    return _DHT(
        initial_peers=net.initial_peers or None, start=True, record_validators=validators,
        identity_path=str(identity.path), host_maddrs=[f"/ip4/{net.host}/tcp/{net.port}"],
        announce_maddrs=announce or None, nat_port_map=net.nat_port_map, use_relay=net.use_relay,
        use_auto_relay=net.use_auto_relay, client_mode=net.client_mode, startup_timeout=30,
        # behind a NAT: ask for a relay at once rather than after AutoNAT's verdict (which 1.1.12's
        # daemon got wrong for a NAT'd peer: docs/DESIGN.md, "Dependencies")
        force_reachability="private" if net.client_mode and net.use_auto_relay else None,
    )


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
    """Store this learner's cumulative tally (swarm/tally.py), signed, at its own key: its samplers
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


def peer_id_of_maddr(addr: str) -> str:
    """The /p2p/<peer id> of a bootstrap multiaddr (checked by `check_multiaddr`)."""
    return addr.rstrip("/").rsplit("/p2p/", 1)[1].split("/")[0]
