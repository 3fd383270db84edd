"""Many peers in one swarm: how fast a newcomer finds the learner and its mates, what the DHT costs
each peer and the bootstrap, and what grows with the swarm.

    python examples/bench_many.py [--peers 8 64] [--window 60] [--newcomers 3]

For each swarm size N, on 127.0.0.1: the coordinator's real bootstrap process (`hetero-node
bootstrap`, naming the learner), and N + 1 DHT-only peers in this process, each a hivemind DHTNode
on a p2pd of its own with the swarm's validators, running the project's own discovery code
(`swarm/dht/records.py`'s signed records, `LearnerTracker`) as a node does: one announces itself as the
learner every 10 s, N announce themselves as samplers following it every 10 s
(`announce_every_s`), refresh their tracker every 10 s and their holder record every 30 s. (Full
samplers would not fit: each is a model, a DHT process and a p2pd, ~0.4 GB.) After all are up,
for `--window` seconds: bytes each peer's p2pd moves (read + written, sockets; `/proc/<pid>/io`),
and the bootstrap's CPU and bytes. Then `--newcomers` fresh peers join one after another: seconds
until its DHT node is up, and until its tracker knows the learner and all its mates (the goal: 5 s
for the learner and >= 8 mates). Last, what one `get` of the peers index returns (values and bytes):
what grows with N (since protocol 5 only `status` reads it; a tracker reads its coordinators', its
learner's and its credited mates' records at their own keys). Printed per N, side by side.

On a 2-core machine the N + 1 peers share one Python event loop and the cores with N + 2 daemons:
at N = 64 that loop is saturated (every get validates every record: signature, schema, owner), so
the newcomer's times there measure this machine as much as the protocol; the bytes and record
counts do not depend on it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cli.procs import start_node, stop, wait_for_file  # noqa: E402
from swarm import dht as swarm_dht  # noqa: E402
from swarm.wire.peer import PeerInfo  # noqa: E402
from swarm.wire.tally import Tally  # noqa: E402
from swarm.discovery import LearnerTracker  # noqa: E402
from swarm.identity import Identity  # noqa: E402
from node.learner.credit import Credit  # noqa: E402

SWARM, MODEL = "many", "builtin:tiny-arith"
GOAL_FIND_S, GOAL_MATES = 5.0, 8


class Loop:
    """One asyncio loop in a thread for every in-process peer."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="peers", daemon=True).start()

    def future(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro, timeout: float = 120.0):
        return self.future(asyncio.wait_for(coro, timeout)).result(timeout + 5)

    def close(self) -> None:
        """Cancel what hivemind's nodes left running (their cache refreshers), then stop."""
        async def cancel_all():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        try:  # not through `run`: its wait_for wrapper is a task too, and would be cancelled with the rest
            self.future(cancel_all()).result(30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)


class DHTFacade:
    """What swarm/dht/records.py asks of hivemind's `DHT` (store and get, with futures; visible addresses),
    over a DHTNode that runs in this process."""

    def __init__(self, loop: Loop, node, p2p) -> None:
        self.loop, self.node, self.p2p = loop, node, p2p

    def store(self, key, value, expiration_time, subkey=None, return_future=False):
        future = self.loop.future(self.node.store(key, value, expiration_time, subkey=subkey))
        return future if return_future else future.result()

    def get(self, key, latest=False, return_future=False):
        future = self.loop.future(self.node.get(key, latest=latest))
        return future if return_future else future.result()

    def run_coroutine(self, coro, return_future=False):
        future = self.loop.future(coro(None, self.node))
        return future if return_future else future.result()

    def get_visible_maddrs(self):
        return self.loop.run(self.p2p.get_visible_maddrs())


class LightPeer:
    """A DHT-only peer: the slice of `SwarmNode` that discovery uses (`peers`, `peer_records`,
    `tally_of`, `trusted_learners`, `coordinators`, `announce`), on an in-process DHTNode."""

    def __init__(self, loop: Loop, identity: Identity, boot: str) -> None:
        from hivemind.dht.node import DHTNode
        from hivemind.dht.validation import CompositeValidator
        from hivemind.p2p import P2P

        self.identity, self.peer_id, self.coordinators = identity, identity.peer_id, {swarm_dht.peer_id_of_maddr(boot)}
        self.loop = loop

        async def create():
            p2p = await P2P.create(initial_peers=[boot], identity_path=str(identity.path), host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                                   auto_nat=False, nat_port_map=False, use_relay=False, check_if_identity_free=False)
            node = await DHTNode.create(p2p=p2p, initial_peers=[boot],
                                        record_validator=CompositeValidator(swarm_dht.swarm_validators(identity, SWARM)))
            return p2p, node

        self.p2p, self.node = loop.run(create())
        self.dht = DHTFacade(loop, self.node, self.p2p)

    def p2pd_pid(self) -> int:
        return self.p2p._child.pid

    def peers(self) -> list[swarm_dht.Listed]:
        return swarm_dht.list_peers(self.dht, SWARM)

    def peer_records(self, peer_ids: list[str]) -> dict[str, PeerInfo]:
        return swarm_dht.peer_records(self.dht, SWARM, peer_ids)

    def tally_of(self, learner: str) -> Tally | None:
        return swarm_dht.tally_of(self.dht, SWARM, learner)

    def credit(self, samplers: list[str]) -> bool:
        """As a learner that trained on one group of each: its tally credits them (mates are earned)."""
        tally = Credit()
        for s in samplers:
            tally.credit(s, 8, 64, MODEL)
        return swarm_dht.publish_tally(self.dht, self.identity, SWARM, tally.tally(self.peer_id, MODEL))

    def trusted_learners(self, coordinators: set[str]) -> dict[str, str]:
        return swarm_dht.trusted_learners(self.dht, SWARM, coordinators)

    def announce(self, role: str, learner: str = "") -> bool:
        return swarm_dht.announce(self.dht, self.identity, SWARM, PeerInfo(
            peer_id=self.peer_id, role=role, model_id=MODEL, version=0, engine="hf", throughput=1.0, learner=learner),
            ttl=60)

    def hold(self, versions: list[int]) -> bool:
        return swarm_dht.announce_holdings(self.dht, self.identity, SWARM, "chain", versions, ttl=60)

    def shutdown(self) -> None:
        async def down():
            await self.node.shutdown()
            await self.p2p.shutdown()
        try:
            self.loop.run(down(), 30)
        except Exception:  # shutting down anyway
            pass


def io_bytes(pid: int) -> int:
    """read + written bytes of process `pid` (sockets included)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["rchar"]) + int(fields["wchar"])


def cpu_s(pid: int) -> float:
    """CPU seconds of `pid` and its children that were waited for."""
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in parts[11:15]) / 100.0  # utime stime cutime cstime, in clock ticks


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for t in Path(f"/proc/{p}/task").iterdir():
            todo += [int(c) for c in (t / "children").read_text().split()]
    return out


def one_size(n: int, base: Path, window: float, newcomers: int) -> dict:
    import msgpack

    loop = Loop()
    learner_ident = Identity.load_or_create(base / "learner.key")
    boot_proc = start_node("bootstrap", ["bootstrap", "--port", "0", "--host", "127.0.0.1", "--no-nat", "--swarm", SWARM,
                                         "--identity", str(base / "boot.key"), "--addr-file", str(base / "boot.addr"),
                                         "--trusted-learner", learner_ident.peer_id], base / "logs")
    peers: list[LightPeer] = []
    stop_evt = threading.Event()
    try:
        boot = wait_for_file(base / "boot.addr", 90, boot_proc).decode().split()[0]
        learner = LightPeer(loop, learner_ident, boot)
        peers.append(learner)
        t0 = time.monotonic()
        for k in range(n):
            peers.append(LightPeer(loop, Identity.load_or_create(base / f"s{k}.key"), boot))
        up_s = time.monotonic() - t0
        trackers = [LearnerTracker(p, None, MODEL, every=10.0) for p in peers[1:]]

        def life(i: int) -> None:  # each peer's own schedule, spread over the 10 s period
            p, tr = peers[i], trackers[i - 1] if i else None
            stop_evt.wait((i * 10.0 / len(peers)) % 10.0)
            k = 0
            while not stop_evt.is_set():
                p.announce("learner" if i == 0 else "sampler", "" if i == 0 else (tr.current or ""))
                if i == 0:
                    p.credit([q.peer_id for q in peers[1:]])
                if tr is not None:
                    tr.refresh(force=True)
                    if k % 3 == 0:
                        p.hold([k, k + 1])
                k += 1
                stop_evt.wait(10.0)

        threads = [threading.Thread(target=life, args=(i,), daemon=True) for i in range(len(peers))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(len(tr.mates) == n and tr.current for tr in trackers):
            time.sleep(1.0)
        settled = sum(len(tr.mates) == n and tr.current == learner.peer_id for tr in trackers)
        pids = [p.p2pd_pid() for p in peers]
        boot_pids = tree(boot_proc.popen.pid)
        io0, bio0, bcpu0 = [io_bytes(p) for p in pids], sum(io_bytes(p) for p in boot_pids), sum(cpu_s(p) for p in boot_pids)
        time.sleep(window)
        io1, bio1, bcpu1 = [io_bytes(p) for p in pids], sum(io_bytes(p) for p in boot_pids), sum(cpu_s(p) for p in boot_pids)
        per_peer = [(b - a) / window for a, b in zip(io0, io1)]
        finds, ups = [], []
        for j in range(newcomers):
            t0 = time.monotonic()
            fresh = LightPeer(loop, Identity.load_or_create(base / f"new{j}.key"), boot)
            t1 = time.monotonic()
            tr = LearnerTracker(fresh, None, MODEL, every=0.0)
            while time.monotonic() - t1 < 60 and not (tr.refresh(force=True) and len(tr.mates) >= min(n, GOAL_MATES)):
                time.sleep(0.2)
            ups.append(t1 - t0)
            finds.append(time.monotonic() - t1 if tr.current else float("inf"))
            fresh.shutdown()
        got = learner.dht.get(swarm_dht.peers_key(SWARM), latest=True)
        size = lambda found: len(msgpack.packb({k: (v.value, v.expiration_time) for k, v in found.value.items()},  # noqa: E731
                                              use_bin_type=True)) if found else 0
        return {"n": n, "up_s": up_s, "settled": settled, "peer_bps": statistics.median(per_peer),
                "peer_bps_max": max(per_peer), "boot_bps": (bio1 - bio0) / window, "boot_cpu": (bcpu1 - bcpu0) / window,
                "dht_up_s": statistics.median(ups), "find_s": statistics.median(finds), "find_max_s": max(finds),
                "peer_records": len(got.value) if got else 0, "peer_bytes": size(got)}
    finally:
        stop_evt.set()
        for p in peers:
            p.shutdown()
        stop([boot_proc])
        loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, nargs="+", default=[8, 64], help="swarm sizes (samplers), run in turn")
    ap.add_argument("--window", type=float, default=60.0, help="seconds of steady state measured per size")
    ap.add_argument("--newcomers", type=int, default=3)
    args = ap.parse_args()
    rows = [one_size(n, Path(tempfile.mkdtemp(prefix=f"bench-many-{n}-")), args.window, args.newcomers)
            for n in args.peers]
    print(f"\nDHT-only peers running the project's discovery code, on 127.0.0.1 ({args.window:.0f} s of steady state "
          f"each; bytes: a p2pd's socket reads + writes)")
    lines = [("samplers", "n", "{:d}"), ("all up (s, sequential)", "up_s", "{:.0f}"),
             ("trackers knowing learner + all mates", "settled", "{:d}"),
             ("DHT bytes/s per peer, median", "peer_bps", "{:,.0f}"), ("DHT bytes/s per peer, max", "peer_bps_max", "{:,.0f}"),
             ("bootstrap bytes/s", "boot_bps", "{:,.0f}"), ("bootstrap CPU (cores)", "boot_cpu", "{:.3f}"),
             ("newcomer: DHT up (s)", "dht_up_s", "{:.2f}"),
             (f"newcomer: learner + >= {GOAL_MATES} mates (s), median", "find_s", "{:.2f}"),
             ("newcomer: the same, worst", "find_max_s", "{:.2f}"),
             ("peer records in the index (status's listing)", "peer_records", "{:d}"), ("  their bytes", "peer_bytes", "{:,d}")]
    for label, key, fmt in lines:
        print(f"{label:<44}" + "".join(f"{fmt.format(r[key]):>14}" for r in rows))
    worst = max(r["find_max_s"] for r in rows)
    print(f"\ngoal: a newcomer knows the learner and >= {GOAL_MATES} mates within {GOAL_FIND_S:.0f} s: worst "
          f"{worst:.2f} s [{'met' if worst <= GOAL_FIND_S else 'MISSED'}]")


if __name__ == "__main__":
    main()
