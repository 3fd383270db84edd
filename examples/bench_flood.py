"""What a flooding peer costs an honest sampler: its rollouts trained on per second, before and during.

    python examples/bench_flood.py [--seconds 30]

A loopback swarm of real processes (bootstrap naming the learner, learner, one honest sampler) and
an attacker process with its own key that sends valid-looking signed groups (signed once, resent)
as fast as the rollout RPC answers, for `--seconds`. Printed beside the honest sampler's baseline
rate: its rate during the flood, what the learner did with the flood (accepted / busy / refused),
and the learner's memory and journal. Run twice in one go: the attacker at the same CPU priority
as the swarm, and at nice 19. On one 2-core machine the attacker's own CPU (its Python and its
p2pd pushing megabytes a second) is taken from the honest peers too; the niced run approximates an
attacker on a machine of its own, which is what the learner faces on the internet.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from cli.procs import stop  # noqa: E402
from swarmkit import Forger, Swarm, flood_rates, peer_of, start_bootstrap  # noqa: E402

LEARNER_TOML = "[learner]\ncheckpoint_every = 10\neval_every = 0\nmax_staleness = 100000\n"


def attack(addr: str, learner: str, seconds: float, nice: int) -> None:
    """The attacker process: flood `learner` for `seconds`, print what it got back as JSON."""
    import msgpack

    from swarm.dht import NetworkConfig
    from swarm.identity import Identity
    from swarm.p2p import SwarmNode
    from swarm.rollout_rpc import ROLLOUTS

    os.nice(nice)
    node = SwarmNode(Identity.load_or_create(Path(tempfile.mkdtemp()) / "attacker.key"),
                     NetworkConfig(initial_peers=[addr]), "demo")
    forger = Forger(node.identity)
    pool = [forger.item(forger.group(i)) for i in range(512)]
    counts = {"calls": 0, "ok": 0, "busy": 0, "rejected": 0, "sent": 0}
    deadline, i = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        batch = pool[i % 512: i % 512 + 256]
        reply = msgpack.unpackb(node.call(learner, ROLLOUTS, msgpack.packb(batch), timeout=60), raw=False)
        i, counts["calls"], counts["sent"] = i + 256, counts["calls"] + 1, counts["sent"] + len(batch)
        for k in ("ok", "busy", "rejected"):
            counts[k] += len(reply[k])
    node.shutdown()
    print(json.dumps(counts))


def flood(s: Swarm, seconds: float, nice: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--attack", s.addr, peer_of(s, "learner"), "--seconds",
                          str(seconds), "--nice", str(nice)], capture_output=True, text=True, timeout=seconds + 300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def learner_memory_mb(s: Swarm) -> float:
    status = Path(f"/proc/{s.nodes['learner'].popen.pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--attack", nargs=2, metavar=("ADDR", "LEARNER"), help=argparse.SUPPRESS)
    ap.add_argument("--nice", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.attack:
        return attack(*args.attack, args.seconds, args.nice)
    s = Swarm(Path(tempfile.mkdtemp(prefix="bench-flood-")))
    try:
        start_bootstrap(s)
        (s.base / "learner.toml").write_text(LEARNER_TOML)
        s.join("learner", "learner", "--config", str(s.base / "learner.toml"))
        s.join("honest", "sampler")
        s.wait_version(3, timeout=240)
        honest = peer_of(s, "honest")
        print(f"honest sampler vs a flooding peer, {args.seconds:.0f} s each, 2 CPU cores shared by all peers")
        print(f"{'attacker':<22} {'honest groups/s':>16} {'of baseline':>12} {'flood sent':>11} {'accepted':>9} "
              f"{'busy':>9} {'refused':>8} {'learner RSS':>12} {'journal':>9}")
        for nice in (0, 19):
            t0 = s.metrics()[-1]["time_s"]
            time.sleep(args.seconds)
            t1 = s.metrics()[-1]["time_s"]
            counts = flood(s, args.seconds, nice)
            counts["busy"] = counts["sent"] - counts["ok"] - counts["rejected"]  # unread batches list no ids
            t2 = s.metrics()[-1]["time_s"]
            base, during = flood_rates(s.metrics(), honest, t0, t1, t2)
            journal = (s.base / "learner" / "journal.bin").stat().st_size / 2**20
            label = "same priority" if nice == 0 else f"nice {nice}"
            print(f"{label:<22} {base:7.2f} -> {during:6.2f} {during / base:>12.0%} {counts['sent']:>11} "
                  f"{counts['ok']:>9} {counts['busy']:>9} {counts['rejected']:>8} {learner_memory_mb(s):>9.0f} MB "
                  f"{journal:>6.2f} MB")
    finally:
        stop(list(s.nodes.values()))


if __name__ == "__main__":
    main()
