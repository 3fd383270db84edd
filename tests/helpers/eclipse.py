"""An attacker that hides records by placing withholding DHT nodes next to their keys, as issue 58
measured it:

    python -m tests.helpers.eclipse READY_FILE INITIAL_PEER N KEY... [--control]

For each KEY (a DHT key as the swarm names it, e.g. hetero_<swarm>_peer/<learner id>), N DHT nodes
(each its own key and p2pd, one process for all) whose ids sit next to the key by XOR: hivemind
lets a node choose its id, so they are the key's nearest replicas however many honest peers there
are. They answer every store "ok" and keep nothing, and every find "not found", naming only each
other as nearer nodes, so a lookup that reaches them goes no further. READY_FILE gets the number
of nodes up once all have joined; they stay until the process is stopped (SIGTERM). With
`--control`, as many honest DHT nodes at random ids (the same load on the machine, no attack).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from pathlib import Path

from hivemind.dht.node import DHTNode
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.p2p import P2P, PeerID
from hivemind.proto import dht_pb2

LIARS: dict[DHTID, PeerID] = {}


async def withhold_store(self, request: dht_pb2.StoreRequest, context) -> dht_pb2.StoreResponse:
    """"ok" to everything, kept nowhere."""
    return dht_pb2.StoreResponse(store_ok=[True] * len(request.keys), peer=self.node_info)


async def withhold_find(self, request: dht_pb2.FindRequest, context) -> dht_pb2.FindResponse:
    """"not found" for every key, and only liars as nearer nodes."""
    response = dht_pb2.FindResponse(results=[], peer=self.node_info)
    for key in map(DHTID.from_bytes, request.keys):
        item = dht_pb2.FindResult(type=dht_pb2.NOT_FOUND)
        for node_id in sorted(LIARS, key=key.xor_distance)[:self.bucket_size]:
            item.nearest_node_ids.append(node_id.to_bytes())
            item.nearest_peer_ids.append(LIARS[node_id].to_bytes())
        response.results.append(item)
    return response


def next_to(key: str, i: int) -> DHTID:
    """A node id sharing all but the lowest 32 bits with `key`'s id (distinct for each i)."""
    target = DHTID.generate(source=key)
    return DHTID(target ^ (random.getrandbits(24) << 8 | i + 1))


async def main(ready: Path, initial_peer: str, n: int, keys: list[str], control: bool = False) -> None:
    """With `control`, as many honest DHT nodes at random ids: the same load on this machine, no attack."""
    os.nice(19)  # an attacker's own machines would not take the honest peers' CPU
    if not control:
        DHTProtocol.rpc_store = withhold_store  # before any node registers its handlers
        DHTProtocol.rpc_find = withhold_find
    nodes = []
    for key in keys:
        for i in range(n):
            p2p = await P2P.create(initial_peers=[initial_peer], host_maddrs=["/ip4/127.0.0.1/tcp/0"])
            node_id = DHTID.generate() if control else next_to(key, i)
            LIARS[node_id] = p2p.peer_id
            nodes.append(await DHTNode.create(p2p=p2p, node_id=node_id, initial_peers=[initial_peer],
                                              record_validator=None, cache_locally=control, cache_nearest=0))
    ready.write_text(str(len(nodes)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for node in nodes:
        p2p = node.p2p
        await node.shutdown()
        await p2p.shutdown()


if __name__ == "__main__":
    control = "--control" in sys.argv
    ready_file, peer, count, *targets = [a for a in sys.argv[1:] if a != "--control"]
    asyncio.run(main(Path(ready_file), peer, int(count), targets, control))
