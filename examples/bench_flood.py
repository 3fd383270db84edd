"""What a flooding peer costs an honest sampler: its rollouts trained on per second, before and during.

    python examples/bench_flood.py [--seconds 30] [--keys 16]
    python examples/bench_flood.py --garbage 2.5 --concurrency 64     # undecodable bytes, many calls at once

A loopback swarm of real processes (bootstrap naming the learner, learner, one honest sampler) and
an attacker process with `--keys` fresh keys of its own (one bare libp2p peer each, dialled straight
to the learner) that send valid-looking signed groups (signed once, resent) as fast as the rollout
RPC answers, all keys at once, for `--seconds`. Printed beside the honest sampler's baseline rate:
its rate during the flood, what the learner did with the flood (accepted / busy / refused), and the
learner's memory and journal. The honest sampler has passed its first audits by then (proven); the
attacker's keys are new, so they share the learner's one pool for unproven keys however many they
are. With `--garbage`, every call is that many MiB that msgpack cannot read. Run twice in one go: the attacker at the same CPU priority as the swarm, and at nice 19. On one
2-core machine the attacker's own CPU (its Python and its p2pds pushing megabytes a second) is taken
from the honest peers too; the niced run approximates an attacker on machines of its own, which is
what the learner faces on the internet.
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
from helpers.swarmkit import Forger, Swarm, flood_rates, peer_of, start_bootstrap  # noqa: E402
from helpers.sybils import learner_maddrs  # noqa: E402

LEARNER_TOML = "[learner]\ncheckpoint = { every = 10 }\neval_every = 0\nmax_staleness = 100000\n"


def attack(learner: str, maddrs: str, keys: int, seconds: float, nice: int, garbage_mib: float,
           concurrency: int) -> None:
    """The attacker process: `keys` fresh keys flood `learner` for `seconds`; prints "ready" once its
    keys are up and its groups signed, then what it got back, as JSON."""
    from helpers.sybils import Sybils, batches_of

    os.nice(nice)
    # garbage is sent eagerly, without waiting for the door: the worst a flooder can do
    sybils = Sybils(keys, maddrs.split(","), Path(tempfile.mkdtemp()), eager=bool(garbage_mib))
    if garbage_mib:  # bytes msgpack cannot read, behind a list header that promises 3 items
        batches = {i: [b"\x93" + bytes(range(256)) * int(garbage_mib * 4096)] for i in range(keys)}
    else:  # valid-looking groups, signed once; at least a quota's worth per call
        forgers = [Forger(ident) for ident in sybils.identities]
        batches = {i: batches_of([f.item(f.group(j)) for j in range(512 if keys == 1 else 128)])
                   for i, f in enumerate(forgers)}
    print("ready", flush=True)
    try:
        counts = sybils.flood(learner, batches, seconds, concurrency)
    finally:
        sybils.shutdown()
    print(json.dumps(counts), flush=True)


def flood(s: Swarm, args: argparse.Namespace, nice: int) -> tuple[dict, float, float]:
    """Run the attacker; its counts and the learner's clock when the flood started and ended."""
    learner = peer_of(s, "learner")
    maddrs = ",".join(learner_maddrs(s.status(), learner))
    proc = subprocess.Popen([sys.executable, __file__, "--attack", learner, maddrs, "--keys", str(args.keys),
                             "--seconds", str(args.seconds), "--nice", str(nice), "--garbage", str(args.garbage),
                             "--concurrency", str(args.concurrency)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL if args.garbage else None, text=True)
    try:
        while proc.stdout.readline().strip() != "ready":
            if proc.poll() is not None:
                raise RuntimeError("the attacker process ended before its flood began")
        t1 = s.metrics()[-1]["time_s"]
        out, _ = proc.communicate(timeout=args.seconds + 300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return json.loads(out.strip().splitlines()[-1]), t1, s.metrics()[-1]["time_s"]


def learner_memory_mb(s: Swarm) -> float:
    status = Path(f"/proc/{s.nodes['learner'].popen.pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def p2pd_read_mib(s: Swarm) -> float:
    """MiB read so far (`rchar`) by the learner's p2pd: every byte from the network, as Go reads
    sockets with read(2), which `rchar` counts (Python's recv(2), in the learner itself, it does not)."""
    total = 0.0
    todo = [s.nodes["learner"].popen.pid]
    while todo:
        pid = todo.pop()
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            rchar = int(Path(f"/proc/{pid}/io").read_text().split("rchar:")[1].split()[0])
            todo += [int(c) for t in Path(f"/proc/{pid}/task").iterdir()
                     for c in (t / "children").read_text().split()]
        except (OSError, IndexError):  # gone meanwhile
            continue
        total += rchar / 2**20 if "p2pd" in name else 0.0
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--keys", type=int, default=1, help="fresh keys the attacker floods with, all at once")
    ap.add_argument("--garbage", type=float, default=0.0, metavar="MIB",
                    help="send calls of this many MiB of undecodable bytes instead of valid-looking groups")
    ap.add_argument("--concurrency", type=int, default=1, help="calls in flight at once per key")
    ap.add_argument("--attack", nargs=2, metavar=("LEARNER", "MADDRS"), help=argparse.SUPPRESS)
    ap.add_argument("--nice", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.attack:
        return attack(*args.attack, args.keys, args.seconds, args.nice, args.garbage, args.concurrency)
    s = Swarm(Path(tempfile.mkdtemp(prefix="bench-flood-")))
    try:
        start_bootstrap(s)
        (s.base / "learner.toml").write_text(LEARNER_TOML)
        s.join("learner", "learner", "--config", str(s.base / "learner.toml"))
        s.join("honest", "sampler")
        s.wait_version(3, timeout=240)  # its first groups were audited: the honest sampler is proven
        honest = peer_of(s, "honest")
        what = f"{args.garbage:g} MiB calls of garbage" if args.garbage else "valid-looking groups"
        print(f"honest sampler vs {args.keys} flooding key(s) ({what}, {args.concurrency} call(s) at once per key), "
              f"{args.seconds:.0f} s each, 2 CPU cores shared by all")
        print(f"{'attacker':<26} {'honest groups/s':>16} {'of baseline':>12} {'flood sent':>11} {'accepted':>9} "
              f"{'busy':>9} {'refused':>8} {'learner RSS before -> after':>29} {'journal':>9}")
        for nice in (0, 19):
            t0 = s.metrics()[-1]["time_s"]
            time.sleep(args.seconds)
            t_end_base, rss_before = s.metrics()[-1]["time_s"], learner_memory_mb(s)
            read0 = p2pd_read_mib(s)
            counts, t1, t2 = flood(s, args, nice)
            read = p2pd_read_mib(s) - read0
            base, _ = flood_rates(s.metrics(), honest, t0, t_end_base, t_end_base)
            _, during = flood_rates(s.metrics(), honest, t1, t1, t2)
            journal = (s.base / "learner" / "journal.bin").stat().st_size / 2**20
            label = f"{args.keys} key(s), " + ("same priority" if nice == 0 else f"nice {nice}")
            # (no two steps in the baseline window: a window too short for this machine's learner)
            share = f"{during / base:>12.0%}" if base else f"{'n/a':>12}"
            print(f"{label:<26} {base:7.2f} -> {during:6.2f} {share} {counts['sent']:>11} "
                  f"{counts['ok']:>9} {counts['busy']:>9} {counts['rejected']:>8} {rss_before:>17.0f} -> "
                  f"{learner_memory_mb(s):>5.0f} MB "
                  f"{journal:>6.2f} MB")
            let_in = (f"; garbage let in by the door and decoded: {counts['error'].get('batch_undecodable', 0)} calls, "
                      f"the rest answered at the door, unread by the learner's process" if args.garbage else "")
            print(f"{'':<26} read by the learner's p2pd {read:.0f} MiB (the network's bytes, flood and "
                  f"honest, {t2 - t1:.0f} s){let_in}")
            print(f"{'':<26} flood: {counts['calls']} calls, {counts['bytes'] / 2**20:.0f} MiB; busy by bound "
                  f"{counts['why']}; refused {counts['reasons']}; batch errors {counts['error']}")
    finally:
        stop(list(s.nodes.values()))


if __name__ == "__main__":
    main()
