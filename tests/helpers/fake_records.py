"""An attacker that fills the DHT with valid records under fresh keys, as issue 39 measured it:

    python -m tests.helpers.fake_records KEYDIR N SWARM LEARNER MODEL INITIAL_PEER...

N fresh keys (made in KEYDIR with `make_keys` beforehand, or now), each with a signed peer record (a
sampler following LEARNER with MODEL, at a black-hole address: nobody answers there; in the index and
at its own key, as honest peers store theirs) and a holder record announcing the versions the learner
will publish next (its chain and newest version read from its public manifest on each round). Records are stored
again every 20 s (in batches of `BATCH`, one DHT call each), until the process is stopped. One DHT node signs
for all keys (a validator that holds every key): keys are free, and so is a record per key.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from functools import partial
from pathlib import Path

from google.protobuf.wrappers_pb2 import BytesValue
from hivemind.dht import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time

from swarm.dht.schema import own_key, peers_key
from swarm.dht.validation import OwnerValidator
from swarm.identity import Identity
from swarm.wire.manifest import MANIFEST, Manifest
from swarm.wire.peer import PROTOCOL, SOFTWARE

BLACK_HOLE = "/ip4/192.0.2.1/tcp/9"  # TEST-NET-1: routed nowhere


class ManyKeys(RSASignatureValidator):
    """Signs each record with the key its subkey names (hivemind's validator holds one key)."""

    def __init__(self, identities: list[Identity]) -> None:
        super().__init__(identities[0].dht_private_key())
        self.keys = {}
        for ident in identities:
            key = ident.dht_private_key()
            self.keys[self.PUBLIC_KEY_FORMAT.replace(b"_key_", key.get_public_key().to_bytes())] = key

    def sign_value(self, record: DHTRecord) -> bytes:
        for public, key in self.keys.items():
            if public in record.subkey:
                return record.value + self.SIGNATURE_FORMAT.replace(b"_value_", key.sign(self._serialize_record(record)))
        return record.value


def newest(dht: DHT, learner: str) -> tuple[str, int]:
    """The learner's chain and newest version, from its manifest (anyone may ask for it)."""
    async def ask(_dht, _node):
        p2p = await _dht.replicate_p2p()
        reply = await p2p.call_protobuf_handler(PeerID.from_base58(learner), MANIFEST, BytesValue(value=b""), BytesValue)
        return reply.value
    try:
        m = Manifest.open(dht.run_coroutine(ask), learner)
        return m.chain, max(e.version for e in m.versions)
    except Exception:  # not published yet, or refused: announce nothing this round
        return "", 0


def _key(path: Path) -> str:
    return Identity.load_or_create(path).peer_id


def make_keys(keydir: Path, n: int, load: bool = True) -> list[Identity]:
    """N keys in `keydir` (made on both cores if missing: 0.1 s each), loaded (0.08 s each) if `load`."""
    keydir.mkdir(parents=True, exist_ok=True)
    paths = [keydir / f"k{i}.key" for i in range(n)]
    missing = [p for p in paths if not p.exists()]
    if missing:
        with multiprocessing.Pool(2) as pool:
            pool.map(_key, missing)
    return [Identity.load_or_create(p) for p in paths] if load else []


def main(keydir: str, n: int, swarm: str, learner: str, model: str, initial_peers: list[str]) -> None:
    identities = make_keys(Path(keydir), n)
    _identities.extend(identities)  # before the DHT's process forks: it builds the records
    os.nice(19)  # the attack is in the records, not in starving this 2-core machine
    dht = DHT(initial_peers=initial_peers, start=True, client_mode=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
              record_validators=[ManyKeys(identities), OwnerValidator(swarm)])
    print(f"{n} keys ready", flush=True)
    while True:
        chain, version = newest(dht, learner)
        t0 = time.monotonic()
        stored, sent = dht.run_coroutine(partial(_store_round, swarm, learner, model, chain, version))
        print(f"stored {stored} of {sent} records in {time.monotonic() - t0:.1f} s", flush=True)
        time.sleep(20)


BATCH = 200
"""Records per store_many: one DHT RPC to each node carries them all (~1 KB each, signature included)."""
_identities: list[Identity] = []
"""The keys, set before the DHT's process forks: the records are built there (hivemind's pipe to it
fails on a call carrying hundreds of records: BlockingIOError)."""


async def _store_round(swarm: str, learner: str, model: str, chain: str, version: int, _dht, node) -> tuple[int, int]:
    expires = get_dht_time() + 300  # outlives a round of thousands of records (and the 20 s pause)
    keys, values, subkeys = [], [], []
    for ident in _identities:
        subkey = ManyKeys.PUBLIC_KEY_FORMAT.replace(b"_key_", ident.dht_private_key().get_public_key().to_bytes())
        peer = {"peer_id": ident.peer_id, "role": "sampler", "model_id": model, "version": 0, "engine": "hf",
                "throughput": 100.0, "software": SOFTWARE, "protocol": PROTOCOL, "maddrs": [BLACK_HOLE],
                "learner": learner, "name": "", "private": False, "accepts": [], "updated": float(get_dht_time())}
        for key in (peers_key(swarm), own_key(swarm, "peer", ident.peer_id)):  # as an honest peer announces
            keys.append(key), values.append(peer), subkeys.append(subkey)
        if chain:
            held = {"peer_id": ident.peer_id, "chain": chain, "versions": [int(version) + k for k in range(1, 6)]}
            keys.append(own_key(swarm, "holds", ident.peer_id)), values.append(held), subkeys.append(subkey)
    stored = 0
    for i in range(0, len(keys), BATCH):
        done = await node.store_many(keys[i : i + BATCH], values[i : i + BATCH], expires, subkeys=subkeys[i : i + BATCH])
        stored += sum(bool(ok) for ok in done.values())
    return stored, len(keys)

if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:])
