"""An attacker with one fresh key that opens many streams to a peer's handler and sends nothing:

    python -m tests.helpers.idle_streams KEYFILE PROTOCOL N HOLD_S MADDR...

It raises its own open-file limit (each stream costs it a descriptor too), opens N streams one
after another, waits a second, counts those the peer closed, holds the rest HOLD_S seconds, and
prints one JSON line: {"opened", "failed", "closed_by_peer"}."""

from __future__ import annotations

import asyncio
import json
import sys

from hivemind.p2p import P2P, PeerID

from swarm.p2p.budget import raise_nofile_limit


async def _closed(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), 2.0) == b""
    except (asyncio.TimeoutError, ConnectionError):
        return False


async def main(key: str, protocol: str, n: int, hold_s: float, maddrs: list[str]) -> dict:
    raise_nofile_limit()
    p2p = await P2P.create(initial_peers=maddrs, identity_path=key, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                           auto_nat=False, nat_port_map=False)
    peer = PeerID.from_base58(maddrs[0].rsplit("/p2p/", 1)[1])
    streams, failed = [], 0
    for _ in range(n):
        try:
            _, reader, writer = await asyncio.wait_for(p2p.call_binary_stream_handler(peer, protocol), 10)
            streams.append((reader, writer))
        except Exception:  # the peer's daemon or ours refused: counted
            failed += 1
    await asyncio.sleep(1.0)
    closed = sum(await asyncio.gather(*[_closed(r) for r, _ in streams]))
    out = {"opened": len(streams), "failed": failed, "closed_by_peer": closed}
    print(json.dumps(out), flush=True)
    await asyncio.sleep(hold_s)
    for _, w in streams:
        w.close()
    await p2p.shutdown()
    return out


if __name__ == "__main__":
    key, protocol, n, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    asyncio.run(main(key, protocol, n, hold, sys.argv[5:]))
