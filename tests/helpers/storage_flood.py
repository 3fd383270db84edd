"""An attacker that stores records at their largest under many fresh keys, as issue 58 measured it:

    python -m tests.helpers.storage_flood KEYDIR N SWARM INITIAL_PEER...

N fresh keys (made in KEYDIR beforehand with fake_records.make_keys, or now), each storing the five
records one key may store, each at the largest the validators let through (swarm/dht/validation.py
MAX_BYTES): its index row and peer record (4 KiB each), a holder record (8 KiB), a tally (1 MiB) and
a swarm record (64 KiB), expiring an hour ahead (MAX_TTL), about 1.1 MB a key. One DHT server node
(its own id, in the swarm's routing tables) signs for every key, and stores each key's records in
one call per replica, as hivemind's store_many does; it prints "stored S of R records in T s" once
a round is done, and stores them all again every `REPEAT_S` until stopped.
"""

from __future__ import annotations

import os
import sys
import time
from functools import partial
from pathlib import Path

import msgspec
from hivemind.dht import DHT
from hivemind.utils import get_dht_time

from swarm.dht.schema import own_key, peers_key
from swarm.dht.validation import MAX_BYTES, MAX_TTL, OwnerValidator
from swarm.identity import Identity
from swarm.wire.peer import PROTOCOL, SOFTWARE, PeerInfo, SwarmRecord, as_value
from swarm.wire.tally import Contribution, Tally
from tests.helpers.fake_records import BLACK_HOLE, ManyKeys, make_keys

REPEAT_S = 60.0
_identities: list[Identity] = []
"""Set before the DHT's process forks: the records are built there."""


def _fill(make, limit: int, lo: int = 0, hi: int = 1 << 20):
    """make(n) for the largest n whose packed record is within `limit` bytes (a binary search)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(msgspec.msgpack.encode(make(mid))) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return make(lo)


def largest(ident: Identity) -> dict[str, object]:
    """kind -> the largest record of that kind `ident` may store (each just within its bound)."""
    me = ident.peer_id
    peer = _fill(lambda n: PeerInfo(peer_id=me, role="sampler", model_id="m", version=0, engine="x" * n, throughput=1.0,
                                    software=SOFTWARE, protocol=PROTOCOL, maddrs=[BLACK_HOLE],
                                    updated=float(get_dht_time())), MAX_BYTES["peer"] - 64, hi=8192)
    holds = _fill(lambda n: {"peer_id": me, "chain": "c", "versions": list(range(n))}, MAX_BYTES["holds"] - 64, hi=8192)
    one = Contribution(groups=1, rollouts=1, tokens=1, first=1.0, last=1.0, models=["m"])
    tally = _fill(lambda n: Tally(learner=me, seq=1, time=1.0, model_id="m",
                                  peers={f"Qm{i:044d}": one for i in range(n)}), MAX_BYTES["tally"] - 64, hi=20000)
    swarm = _fill(lambda n: SwarmRecord(coordinator=me, learners=[f"Qm{i:044d}" for i in range(n)]),
                  MAX_BYTES["swarm"] - 64, hi=4096)
    return {"peers": peer, "peer": peer, "holds": holds, "tally": tally, "swarm": swarm}


async def store_round(swarm: str, _dht, node, kinds: tuple[str, ...] = ()) -> tuple[int, int]:
    """Each key in `_identities` stores its largest records (only `kinds`, if given), in the DHT's
    process (a 1 MiB value through the DHT's pipe blocks); (records stored, records sent)."""
    expires = get_dht_time() + MAX_TTL - 60
    stored = sent = 0
    template = {k: v for k, v in largest(_identities[0]).items() if not kinds or k in kinds}
    for ident in _identities:
        subkey = ManyKeys.PUBLIC_KEY_FORMAT.replace(b"_key_", ident.dht_private_key().get_public_key().to_bytes())
        keys, values = [], []
        for kind, record in template.items():
            value = as_value(record)
            for field in ("peer_id", "learner", "coordinator"):  # each record names its own signer
                if field in value:
                    value[field] = ident.peer_id
            keys.append(peers_key(swarm) if kind == "peers" else own_key(swarm, kind, ident.peer_id))
            values.append(value)
        done = await node.store_many(keys, values, expires, subkeys=[subkey] * len(keys))
        stored += sum(bool(ok) for ok in done.values())
        sent += len(keys)
    return stored, sent


def main(keydir: str, n: int, swarm: str, initial_peers: list[str]) -> None:
    identities = make_keys(Path(keydir), n)
    _identities.extend(identities)
    os.nice(19)
    dht = DHT(initial_peers=initial_peers, start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
              record_validators=[ManyKeys(identities), OwnerValidator(swarm)])
    print(f"{n} keys ready", flush=True)
    while True:
        t0 = time.monotonic()
        stored, sent = dht.run_coroutine(partial(store_round, swarm))
        print(f"stored {stored} of {sent} records in {time.monotonic() - t0:.1f} s", flush=True)
        time.sleep(REPEAT_S)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:])
