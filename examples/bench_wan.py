"""How fast a new version spreads to N samplers across an emulated WAN, and what it costs the learner.

    sudo python examples/bench_wan.py [--samplers 8] [--rate-mbit 100] [--rtt-ms 80] [--loss 0]
                                      [--patch-mb 12] [--versions 6] [--interval 20] [--blob-dir DIR]
    sudo python examples/bench_wan.py --behind-nat 6      # 6 of the 8 behind home routers (real NAT)

Every peer is a real process in a network namespace of its own on `examples/wan.py`'s emulated WAN
(shaped veth links, a relay that adds the RTT; its docstring says what is and is not modelled): a
bootstrap, a learner that runs `WeightServer`, and N fetch-only samplers that run the real
`WeightFetcher` (holders, mates, `chunk_owner`) with a `LearnerTracker` pinned to the learner, once a
second, as a sampler between batches does. The learner publishes a small keyframe v0, waits until every
sampler holds it (a new swarm: no sampler has earned anything, so none is another's mate), then
credits them all in its signed tally, as a learner does once it has trained on a sampler's checked
groups (the samplers here only fetch), so that they share downloads as mates, and publishes one
patch every `--interval` seconds: `--patch-mb` MB of random bytes (spread
depends on the size, not the content), or the files of `--blob-dir` (v1, v2, ... in the order of the
number in their names; a v0 there is used as the keyframe), e.g. real encoded 0.6B patches.

Printed per sampler, once: seconds from its process start until its imports are done, it is in the
DHT (reachability settled), has found the learner, holds the keyframe. Printed per version:
seconds until 50 / 90 / 100% of the samplers hold it (verified; samplers long-poll the learner, as
`join` does, so they hear of it when it is published; with `--long-poll 0` they poll once a second
and up to 1 s of it is the poll), the median time one fetch took (from the publication or the
poll, whichever is later), the learner's
upload in copies of the version (counted by its ChunkStore, and on the wire at the relay: libp2p's
framing and encryption included), the largest download of one sampler in copies (verified bytes, and
on the wire), beside the physical limit (one copy at the link rate plus one RTT), and the CPU the spread took: the
machine's busy share, the swarm's processes' CPU seconds (their DHT and p2pd daemons included) and
the relay's (at ~100% busy the machine's cores, which every process here shares, set the pace, not
the links; on volunteers' machines each sampler has its own CPU); and the staleness
the samplers see (learner's newest version minus the one held, sampled every second). Last, the
goals beside the measured figures, and with `--behind-nat` the limit NAT leaves: every copy but the
learner's over the public samplers' uplinks (`nat_copy_times`). Needs root (network namespaces); says why and exits otherwise.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import math
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.internet import Home, Internet, skip_reason as internet_skip_reason  # noqa: E402
from examples.wan import Wan, received_by, sent_by, skip_reason  # noqa: E402

SWARM, MODEL = "bench", "bench-model"
GOAL_SPREAD_S, GOAL_UPLOAD, GOAL_DOWNLOAD = 60.0, 1.1, 1.0
GOAL_UPLOAD_NAT = 1.5
"""With most samplers behind NAT (they serve no one), the learner's upload goal per version."""


# ---- the roles, each in its own namespace -----------------------------------------------------------

def _stop_event() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _node(args, workdir: Path):
    from swarm.dht.network import NetworkConfig
    from swarm.identity import Identity
    from swarm.p2p import SwarmNode

    if args.home:  # behind a home router: settled as `join` settles it (asks the bootstrap)
        from swarm.p2p.reach import settle

        net, _ = settle(NetworkConfig(host="0.0.0.0", initial_peers=[args.boot]))
    else:
        net = NetworkConfig(host=args.host, port=args.port, announce_maddrs=[args.announce],
                            initial_peers=[args.boot] if args.boot else [])
    return SwarmNode(Identity.load_or_create(workdir / "identity.key"), net, SWARM)


def _event(path: Path, **fields) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"t": time.time(), **fields}) + "\n")


def role_bootstrap(args) -> None:
    stop, work = _stop_event(), Path(args.dir) / "bootstrap"
    node = _node(args, work)
    from swarm.p2p.reach import serve_reachability
    from swarm.wire.peer import PeerInfo

    serve_reachability(node)  # samplers behind NAT ask it (--behind-nat)
    try:
        (work / "addr").write_text(node.maddrs()[0])
        while not stop.is_set():
            node.announce(PeerInfo(peer_id=node.peer_id, role="bootstrap", model_id="", version=0, engine="",
                                   throughput=0.0, maddrs=node.maddrs()), ttl=60)
            stop.wait(20)
    finally:
        node.shutdown()


def _blobs(args) -> tuple[bytes, list[bytes]]:
    """The keyframe v0 and the patches v1..vK: files of --blob-dir, else random bytes."""
    if not args.blob_dir:
        return os.urandom(int(args.keyframe_mb * 2**20)), [os.urandom(int(args.patch_mb * 2**20))
                                                           for _ in range(args.versions)]
    files = {int(m.group(1)): f for f in Path(args.blob_dir).iterdir() if (m := re.search(r"(\d+)", f.name))}
    key = files.pop(0).read_bytes() if 0 in files else os.urandom(int(args.keyframe_mb * 2**20))
    return key, [files[v].read_bytes() for v in sorted(files)][: args.versions]


def role_learner(args) -> None:
    from swarm.exchange import WeightVersion
    from swarm.wire.peer import PeerInfo
    from swarm.weights import WeightServer

    stop, work = _stop_event(), Path(args.dir) / "learner"
    events = work / "events.jsonl"
    keyframe, patches = _blobs(args)
    node = _node(args, work)
    server = WeightServer(node)
    chain, newest = uuid.uuid4().hex, {"v": 0}

    def announce_forever() -> None:  # so that samplers' trackers see a live learner
        while not stop.is_set():
            node.announce(PeerInfo(peer_id=node.peer_id, role="learner", model_id=MODEL, version=newest["v"], engine="",
                                   throughput=0.0, maddrs=node.maddrs()), ttl=30)
            credited, seeders = _credited(Path(args.dir)), server.store.seeders()
            if credited or seeders:  # mates are earned: this learner's signed tally names them, and until
                # then the seeders it served a version whole to (swarm/discovery.py `earned`)
                node.publish_tally(_tally(node.peer_id, credited, seeders))
            stop.wait(5)

    threading.Thread(target=announce_forever, name="announce", daemon=True).start()
    try:
        for v, blob in enumerate([keyframe, *patches]):
            if v == 1 and not _wait_file(Path(args.dir) / "go", 600, stop,
                                         lambda: _event(events, event="served", served=server.store.served_bytes)):
                return
            server.publish(WeightVersion(MODEL, chain, v, None if v == 0 else v - 1, blob))
            newest["v"] = v
            _event(events, event="publish", version=v, size=len(blob), served=server.store.served_bytes)
            deadline = time.monotonic() + (args.interval if v else 0)
            while time.monotonic() < deadline and not stop.is_set():
                _event(events, event="served", served=server.store.served_bytes)
                stop.wait(0.5)
        _event(events, event="published_all", served=server.store.served_bytes)
        while not stop.is_set():
            _event(events, event="served", served=server.store.served_bytes)
            stop.wait(0.5)
    finally:
        _event(events, event="end", served=server.store.served_bytes)
        node.shutdown()


def _credited(out: Path) -> list[str]:
    """The samplers the driver says earned credit (`credit.json`), [] before it does."""
    try:
        return json.loads((out / "credit.json").read_text())
    except (OSError, ValueError):
        return []


def _tally(learner: str, samplers: list[str], seeders: list[str]):
    """The learner's tally (node/learner/credit.py, as `join`'s learner makes it) crediting each of
    `samplers` with one group, and naming `seeders` (its ChunkStore's) it has not credited: what a
    learner publishes once it has trained on a sampler's checked groups. The bench's samplers only
    fetch, so the driver says when they have earned it: once every sampler holds v0, i.e. at the
    first patch, where a real swarm's samplers would have sent their first groups."""
    from node.learner.credit import Credit

    credit = Credit()
    for s in samplers:
        credit.credit(s, 8, 64, MODEL)
    return credit.tally(learner, MODEL, seeders=seeders)


def _wait_file(path: Path, timeout: float, stop: threading.Event, tick=lambda: None) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if stop.is_set() or time.monotonic() > deadline:
            return False
        tick()
        stop.wait(0.5)
    return True


def role_sampler(args) -> None:
    from swarm.discovery import LearnerTracker
    from swarm.pacing import Heartbeat
    from swarm.wire.peer import PeerInfo
    from swarm.weights import WeightFetcher

    stop, work = _stop_event(), Path(args.dir) / args.name
    _event(work / "joined.jsonl", step="python", spawned=args.spawned)  # imports done
    node = _node(args, work)
    _event(work / "joined.jsonl", step="dht", spawned=args.spawned)  # in the swarm's DHT, reachability settled
    tracker = LearnerTracker(node, args.follow, MODEL, every=5.0)
    fetcher = WeightFetcher(node, lambda: tracker.current, mates=lambda: tracker.mates, seeding=lambda: tracker.seeding)
    chain, version, found = "", -1, False
    held = {"version": 0}  # what the heartbeat announces: replaced whole by this loop

    def announce() -> None:  # mates find each other by these records
        learner = tracker.current  # (read once: a refresh may change it meanwhile)
        if learner:
            node.announce(PeerInfo(peer_id=node.peer_id, role="sampler", model_id=MODEL, version=held["version"],
                                   engine="", throughput=0.0, maddrs=node.maddrs(), learner=learner), ttl=30)

    # join's sampler's heartbeat (swarm/pacing.py), on a thread of its own, not from this loop, where
    # a long poll and a slow download (~15 s at 25 Mbit/s) stand between two announcements of a record
    # that lives 30 s. (In one run announced from here, each sampler's mates came to lack itself, the
    # samplers disagreed on owners, and a version went to the learner 8 times over.)
    heartbeat = Heartbeat([("announcing the sampler", 5.0, announce)])
    try:
        while not stop.is_set():
            t0 = time.time()
            heartbeat.check()
            if tracker.refresh() and not found:
                found = True
                _event(work / "joined.jsonl", step="learner", spawned=args.spawned)
            (work / "mates.json").write_text(json.dumps(tracker.mates))  # the driver waits until all agree
            before = dict(fetcher.stats)
            wait = 0.0 if args.sync_polls else args.long_poll  # the learner answers once it publishes
            got = fetcher.fetch(chain, version, wait=wait, stop=stop) if tracker.current else None
            if got:
                chain, version = got[-1].chain, got[-1].version
                held = {"version": version}
                _event(work / "fetches.jsonl", versions=[w.version for w in got], sizes=[len(w.blob) for w in got],
                       started=t0, **{k: fetcher.stats[k] - before.get(k, 0) for k in
                                      ("bytes_from_learner", "bytes_from_holders", "weight_fetch_failures",
                                       "bytes_duplicate", "hedged_streams", "hedged_slow_streams", "chunks_not_held",
                                       "superseded_streams", "stalled_streams", "chunks_failed", "demotions")},
                       pace=fetcher.pace,
                       chunks=[[round(t, 3), i, src] for t, i, src in fetcher.chunk_arrivals] if len(got) == 1 else [])
            # free: each sampler on its own 1 s cycle (as independent samplers are); sync: all at each
            # whole second of the shared clock, as if told of a new version at the same instant
            stop.wait(1.0 - time.time() % 1.0 if args.sync_polls else max(0.05, 1.0 - (time.time() - t0)))
    finally:
        stop.set()
        heartbeat.close()
        fetcher.close()
        node.shutdown()


# ---- the driver -------------------------------------------------------------------------------------

def _role_args(wan: Wan, i: int, out: Path, boot: str | None) -> list[str]:
    if isinstance(wan, Internet) and wan.is_home(i):
        return ["--dir", str(out), "--home", "--boot", boot]
    return ["--dir", str(out), "--host", wan.ip(i), "--port", str(31337), "--announce", wan.maddr(i),
            *(["--boot", boot] if boot else [])]


def _mates(out: Path, name: str) -> list[str]:
    try:
        return json.loads((out / name / "mates.json").read_text())
    except (OSError, ValueError):  # not written yet, or being written
        return []


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _held(out: Path, name: str) -> dict[int, float]:
    """version -> time sampler `name` first held it (verified)."""
    held: dict[int, float] = {}
    for r in _jsonl(out / name / "fetches.jsonl"):
        for v in r["versions"]:
            held.setdefault(v, r["t"])
    return held


def _wait(cond, timeout: float, what: str, procs, quiet: bool = False) -> None:
    """Until `cond()`, at most `timeout` s (`quiet`: then return), while every one of `procs` runs."""
    deadline = time.monotonic() + timeout
    while not cond():
        dead = [p.name for p in procs if p.popen.poll() is not None]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited early; logs in {procs[0].log_path.parent}")
        if time.monotonic() > deadline:
            if quiet:
                return
            raise TimeoutError(f"{what} within {timeout:.0f} s; logs in {procs[0].log_path.parent}")
        time.sleep(0.5)


def run(args) -> None:
    from swarm.identity import Identity

    reason = internet_skip_reason() if args.behind_nat else skip_reason()
    if reason:
        sys.exit(f"bench_wan: {reason}")
    if not 0 <= args.behind_nat <= args.samplers:
        sys.exit("bench_wan: --behind-nat must be 0..--samplers")
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-wan-"))
    names = [f"s{k}" for k in range(args.samplers)]
    learner_id = _peer(out / "learner")
    public = args.samplers - args.behind_nat  # samplers 0..public-1 are public, the rest at home
    sampler_ids = sorted(Identity.load_or_create(out / n / "identity.key").peer_id for n in names[:public])
    me = [sys.executable, str(Path(__file__).resolve())]
    relay_series: list[tuple[float, dict]] = []
    # (time, CPU seconds by role, and the whole machine's busy seconds): are the cores the bound, whose work is it?
    work: list[tuple[float, dict[str, float]]] = []
    if args.behind_nat:  # real NAT, no added delay (examples/internet.py says why)
        args.rtt_ms = 0.0
        net = Internet(2 + public, [Home()] * args.behind_nat, args.rate_mbit, workdir=out / "wan")
    else:
        net = Wan(2 + args.samplers, args.rate_mbit, args.rtt_ms, args.loss, workdir=out / "wan",
                  window=int(args.relay_queue_kib * 1024), sockbuf=int(args.relay_sockbuf_kib * 1024))
    with net as wan:
        logs = out / "logs"
        boot = wan.spawn("bootstrap", wan.ns(0), [*me, "bootstrap", *_role_args(wan, 0, out, None)], logs)
        _wait(lambda: (out / "bootstrap" / "addr").exists(), 120, "the bootstrap did not start", [boot])
        addr = (out / "bootstrap" / "addr").read_text().strip()
        roles = [wan.spawn("learner", wan.ns(1), [*me, "learner", *_role_args(wan, 1, out, addr), *_learner_flags(args)],
                           logs)]
        print(f"{args.samplers} samplers, learner and bootstrap in namespaces of {wan.tag}; logs in {logs}")
        for k, n in enumerate(names):  # a new swarm: they join at once, or one every --join-every s
            if k and args.join_every:
                _wait(lambda: False, args.join_every, "", roles, quiet=True)
            roles.append(wan.spawn(n, wan.ns(2 + k), [*me, "sampler", *_role_args(wan, 2 + k, out, addr), "--name", n,
                                                      "--follow", learner_id, "--spawned", str(time.time()),
                                                      "--long-poll", str(args.long_poll),
                                                      *(["--sync-polls"] if args.sync_polls else [])], logs))
        _wait(lambda: all(0 in _held(out, n) for n in names), 300, "not every sampler got v0", roles)
        t_v0 = time.monotonic()
        # the samplers have now earned credit, as a real swarm's would have by their first groups
        # trained on: the learner's tally names them, and each sampler's mates are the credited ones
        (out / "credit.json").write_text(json.dumps(sampler_ids))
        # steady state: every sampler knows all its mates (their DHT records; private samplers are
        # nobody's mates), so that all compute the same chunk owners; before that, a version costs the
        # learner more (mates disagree on owners)
        _wait(lambda: all(_mates(out, n) == sampler_ids for n in names), 120, "samplers did not agree on mates", roles)
        print(f"every sampler holds v0 and knows its {len(sampler_ids)} public mates ({time.monotonic() - t_v0:.0f} s after the "
              f"last got v0); the learner publishes a patch every {args.interval:g} s")
        (out / "go").touch()
        kinds = {boot.popen.pid: "bootstrap", roles[0].popen.pid: "learner",
                 **{r.popen.pid: "samplers" for r in roles[1:]}}
        if getattr(wan, "relay", None) is not None:  # (examples/internet.py routes: no relay)
            kinds[wan.relay.popen.pid] = "relay"

        def sample() -> None:
            relay_series.append((time.time(), wan.relay_stats()))
            work.append((time.time(), {**_cpu_by_role(kinds), "machine": _cpu_busy_s()}))

        def published_all() -> bool:
            sample()
            return any(e["event"] == "published_all" for e in _jsonl(out / "learner" / "events.jsonl"))

        _wait(published_all, args.interval * (args.versions + 2) + 120, "the learner did not publish every version",
              roles)
        last = max(e["version"] for e in _jsonl(out / "learner" / "events.jsonl") if e["event"] == "publish")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(last in _held(out, n) for n in names):
            sample()
            time.sleep(0.5)
        sample()
    report(args, out, names, relay_series, wan, work)


def _learner_flags(args) -> list[str]:
    return ["--patch-mb", str(args.patch_mb), "--keyframe-mb", str(args.keyframe_mb), "--versions", str(args.versions),
            "--interval", str(args.interval), *(["--blob-dir", args.blob_dir] if args.blob_dir else [])]


def _cpu_busy_s() -> float:
    """Seconds of CPU the whole machine has spent busy (all cores; /proc/stat: not idle, not iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _cpu_by_role(kinds: dict[int, str]) -> dict[str, float]:
    """CPU seconds (user + system) that the live processes of each role have spent, by the session
    each role's process leads (`Wan.spawn` starts a session; its DHT process and p2pd daemons stay
    in it): `kinds` maps a session to its role; every other process on the machine is "other"."""
    hz, by = os.sysconf("SC_CLK_TCK"), collections.Counter()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()  # after the command's name
            except OSError:  # gone meanwhile
                continue
            by[kinds.get(int(stat[3]), "other")] += (int(stat[11]) + int(stat[12])) / hz  # session; utime, stime
    return dict(by)


def _work(work: list[tuple[float, dict[str, float]]], t0: float, t1: float) -> dict[str, float]:
    """CPU seconds each role spent between `t0` and `t1`, each end read off the cumulative series
    between the samples around it (every 0.5 s: a spread of a few seconds would lose up to a second
    to its ends otherwise); {} if the series does not cover both ends."""
    def at(t: float) -> dict[str, float] | None:
        for (ta, a), (tb, b) in zip(work, work[1:]):
            if ta <= t <= tb:
                f = (t - ta) / (tb - ta) if tb > ta else 1.0
                return {k: a.get(k, 0.0) + f * (b.get(k, 0.0) - a.get(k, 0.0)) for k in b}
        return None
    start, end = at(t0), at(t1)
    if start is None or end is None:
        return {}
    return {k: max(end[k] - start.get(k, 0.0), 0.0) for k in end}


def _queued(relay_series: list[tuple[float, dict]], t0: float, t1: float, hosts) -> float:
    """The most bytes the relay's own queues held toward one of `hosts` between t0 and t1, as sampled:
    per source host, the peak of its connections' queues in a 0.5 s stats interval, summed over the
    sources. A lower bound: intervals the bench did not read and the relay's kernel socket buffers
    are not in it. Bytes that crossed their sender's uplink and wait for the host's downlink, where
    the internet would hold them in the downlink's one queue."""
    seen = []
    for t, stats in relay_series:
        if t0 <= t <= t1 + 0.5 and "peak" in stats:
            into = collections.Counter()
            for key, n in stats["peak"].items():
                into[int(key.split("->")[1])] += n
            seen.append(max((into[h] for h in hosts), default=0))
    return max(seen, default=math.nan)


def _at(series: list[tuple[float, int]], t: float) -> int:
    """The last value of a (time, cumulative value) series at or before `t`."""
    before = [v for s, v in series if s <= t]
    return before[-1] if before else 0


def report(args, out: Path, names: list[str], relay_series: list[tuple[float, dict]], wan: Wan,
           work: list[tuple[float, dict[str, float]]]) -> None:
    events = _jsonl(out / "learner" / "events.jsonl")
    pubs = {e["version"]: e for e in events if e["event"] == "publish"}
    served = [(e["t"], e["served"]) for e in events if "served" in e]
    up_wire = [(t, sent_by(s, 1)) for t, s in relay_series]
    down_wire = {n: [(t, received_by(s, 2 + k)) for t, s in relay_series] for k, n in enumerate(names)}
    held = {n: _held(out, n) for n in names}
    fetches = {n: _jsonl(out / n / "fetches.jsonl") for n in names}
    end = relay_series[-1][0]
    versions = sorted(v for v in pubs if v > 0)
    nat = f", {args.behind_nat} behind NAT (wire: the kernel's shapers)" if args.behind_nat else ""
    polls = "in sync" if args.sync_polls else f"long polls of {args.long_poll:g} s" if args.long_poll else "free"
    print(f"\n{args.samplers} samplers{nat}, {args.rate_mbit:g} Mbit/s each way, {args.rtt_ms:g} ms RTT, loss {args.loss:g}, "
          f"polls {polls}; limit = one copy at the link rate + 1 RTT")
    print(f"{'ver':>3} {'MB':>6} {'limit s':>7} {'50% s':>6} {'90% s':>6} {'100% s':>6} {'held':>5} "
          f"{'fetch s':>7} {'upload x':>8} {'wire x':>6} {'max down x':>10} {'wire x':>6} {'cpu':>4} "
          f"{'swarm cpu s':>11} {'relay cpu s':>11} {'queue MiB':>9}")
    rows, spent = [], []
    for v in versions:
        t0, size = pubs[v]["t"], pubs[v]["size"]
        t1 = pubs[v + 1]["t"] if v + 1 in pubs else end
        times = sorted(h[v] - t0 for h in held.values() if v in h)
        pct = [(times[math.ceil(q * len(names)) - 1] if len(times) >= math.ceil(q * len(names)) else math.inf)
               for q in (0.5, 0.9, 1.0)]
        upload = (_at(served, t1) - _at(served, t0)) / size
        wire_up = (_at(up_wire, t1) - _at(up_wire, t0)) / size
        down = max((sum(r["bytes_from_learner"] + r["bytes_from_holders"] for r in fetches[n] if r["versions"] == [v])
                    for n in names), default=0) / size
        wire_down = max(_at(down_wire[n], t1) - _at(down_wire[n], t0) for n in names) / size
        # from the later of the poll's start and the publication: a long poll waits for the version
        took = [r["t"] - max(r["started"], t0) for n in names for r in fetches[n] if r["versions"] == [v]]
        # while it spread (from the publication to the last sampler holding it): the machine's busy
        # share, the swarm's own work (its processes, their DHT and p2pd daemons) and the relay's
        # (the emulator's, not the swarm's)
        w = _work(work, t0, t0 + pct[2]) if math.isfinite(pct[2]) else {}
        busy = w["machine"] / (pct[2] * (os.cpu_count() or 1)) if w and pct[2] > 0 else math.nan
        swarm = sum(w.get(k, math.nan) for k in ("learner", "samplers", "bootstrap")) if w else math.nan
        relay = w.get("relay", 0.0) if w and getattr(wan, "relay", None) is not None else math.nan  # NAT: routed
        queue = _queued(relay_series, t0, t0 + pct[2], range(2, 2 + len(names))) / 2**20
        spent.append((swarm, relay, w.get("samplers", math.nan), w.get("learner", math.nan), busy))
        rows.append((pct, upload, wire_up, down, wire_down, wan.one_copy_s(size)))
        print(f"{v:>3} {size / 2**20:6.1f} {wan.one_copy_s(size):7.2f} {_s(pct[0]):>6} {_s(pct[1]):>6} {_s(pct[2]):>6} "
              f"{len(times):>2}/{len(names):<2} {statistics.median(took) if took else math.nan:7.2f} {upload:8.2f} "
              f"{wire_up:6.2f} {down:10.2f} {wire_down:6.2f} {busy:4.0%} {swarm:11.2f} {relay:11.2f} {queue:9.1f}")
    _report_cpu(spent)
    _report_trace(pubs, fetches, args.samplers, wan, _peer(out / "learner"))
    _report_join(args, out, names, held)
    _report_keyframe(args, out, pubs, served, held, wan)
    stale = _staleness(pubs, held, end)
    print(f"staleness samplers see (newest published - held, every second from v1 on, {len(stale)} samples): "
          f"mean {statistics.fmean(stale):.2f}, p90 {_q(stale, 0.9)}, max {max(stale)}")
    spread90 = max(r[0][1] for r in rows)
    print(f"\ngoals:  >= 90% of samplers hold each version within {GOAL_SPREAD_S:.0f} s: worst {_s(spread90)} s "
          f"[{'met' if spread90 <= GOAL_SPREAD_S else 'MISSED'}]")
    ratio = max(r[0][2] / r[5] for r in rows)
    print(f"        every sampler holds each version within 2x the limit: worst {ratio:.2f}x "
          f"[{'met' if ratio <= 2 else 'MISSED'}]")
    if args.behind_nat:
        _report_nat_limit(args, rows)
    worst_up = max(max(r[1], r[2]) for r in rows)
    goal_up = GOAL_UPLOAD_NAT if args.behind_nat else GOAL_UPLOAD
    print(f"        learner upload <= {goal_up} copies per version: worst {worst_up:.2f} (ChunkStore and wire) "
          f"[{'met' if worst_up <= goal_up else 'MISSED'}]")
    worst_down = max(r[3] for r in rows)
    worst_wire = max(r[4] for r in rows)
    print(f"        no sampler downloads more than {GOAL_DOWNLOAD:g} copy: worst {worst_down:.2f} verified, {worst_wire:.2f} "
          f"on the wire with framing, encryption and the DHT [{'met' if worst_down <= GOAL_DOWNLOAD + 1e-9 else 'MISSED'}]")
    print(f"records and logs: {out}")


def nat_copy_times(samplers: int, private: int, learner_copies: float) -> tuple[float, float]:
    """The fewest copy-times (one copy at the link rate) in which every sampler can hold a version
    when `private` of them are behind NATs that no one can dial through (no hole punching in the
    bundled p2pd), the learner uploading `learner_copies`: (as the swarm runs, where private
    samplers serve no one, so every copy but the learner's crosses a public sampler's uplink;
    at best, were private samplers to serve public ones over the connections they dial, so only
    the private samplers' copies must). Each at least 1: a sampler's own downlink."""
    public = samplers - private
    if public <= 0:
        return math.inf, math.inf
    return (max(1.0, (samplers - learner_copies) / public), max(1.0, (private - learner_copies) / public))


def _report_nat_limit(args, rows: list[tuple]) -> None:
    """Beside the one-copy limit, what NAT leaves reachable (`nat_copy_times`) at the learner
    copies measured: the 2x goal is for a swarm whose samplers can all serve each other."""
    worst = max(rows, key=lambda r: r[0][2] / r[5])
    pct, upload, size_s = worst[0], worst[1], worst[5]
    copy_s, public = size_s - args.rtt_ms / 1e3, args.samplers - args.behind_nat
    as_run, best = nat_copy_times(args.samplers, args.behind_nat, max(upload, 1.0))
    print(f"        behind NAT, {args.behind_nat} of {args.samplers} samplers reach only the learner and the "
          f"{public} public ones: the limit is {as_run:.2f} copy-times as the swarm runs "
          f"(private samplers serve no one), {best:.2f} were they to serve public ones; the slowest version "
          f"({pct[2]:.2f} s at {upload:.2f} learner copies) is {pct[2] / (as_run * copy_s + args.rtt_ms / 1e3):.2f}x the "
          f"first, {pct[2] / (best * copy_s + args.rtt_ms / 1e3):.2f}x the second (2x the one-copy limit needs "
          f"the learner to upload {max(1, args.samplers - 2 * public)} copies as the swarm runs, "
          f"{max(1, args.behind_nat - 2 * public)} were private samplers to serve public ones)")


def _report_cpu(spent: list[tuple[float, float, float, float, float]]) -> None:
    """The CPU a version's spread took (median over versions), by role, and how busy the machine was:
    all of this machine's processes share its cores, so at ~100% the cores, not the links, set the
    pace. That CPU includes whatever the spread wasted (a hedge's copy, a wait), so it is what the
    spread cost here, not a floor; the work itself is the CPU a version takes where the cores are not
    the bound (a slower link: docs/BENCHMARKS.md). On volunteers' machines each sampler has its own
    CPU. A process that exits mid-spread drops out of the sum (none does here)."""
    ok = [x for x in spent if math.isfinite(x[0])]
    if not ok:
        return
    swarm, relay, samplers, learner, busy = (statistics.median(x[k] for x in ok) for k in range(5))
    print(f"CPU per version while it spread (median): the swarm {swarm:.2f} s (samplers {samplers:.2f}, learner "
          f"{learner:.2f}), the WAN's relay {relay:.2f} s; this machine's {os.cpu_count() or 1} cores "
          f"{busy:.0%} busy")


def _peer(workdir: Path) -> str:
    from swarm.identity import Identity

    return Identity.load_or_create(workdir / "identity.key").peer_id


def _report_trace(pubs: dict, fetches: dict[str, list[dict]], n: int, wan: Wan, learner: str) -> None:
    """Where each version's spread spent its time, from the chunks' arrival times at every sampler
    (`WeightFetcher.chunk_arrivals`): when the learner's upload of the chunks ended (each chunk's
    first copy from the learner, at its owner), how long a mate's copy came after its owner had the
    chunk, and what each sampler's last chunk was."""
    for v in sorted(v for v in pubs if v > 0):
        t0, size = pubs[v]["t"], pubs[v]["size"]
        got = [r["chunks"] for rs in fetches.values() for r in rs if r["versions"] == [v] and r.get("chunks")]
        if len(got) < n:
            continue
        own: dict[int, float] = {}  # chunk -> when its first copy from the learner arrived
        for chunks in got:
            for t, i, src in chunks:
                if src == learner:
                    own[i] = min(own.get(i, math.inf), t - t0)
        lags = sorted(t - t0 - own[i] for chunks in got for t, i, src in chunks if src != learner and i in own)
        last = [max(chunks) for chunks in got]
        from_mate = sum(src != learner for _, _, src in last)
        if not own or not lags:
            continue
        print(f"v{v} trace: the learner's chunks out {min(own.values()):.1f}-{max(own.values()):.1f} s (the limit "
              f"{wan.one_copy_s(size):.2f} s); a mate's copy {statistics.median(lags):.1f} s after its "
              f"owner had it (p90 {_q(lags, 0.9):.1f}, max {lags[-1]:.1f}); each sampler's last chunk "
              f"{min(t for t, _, _ in last) - t0:.1f}-{max(t for t, _, _ in last) - t0:.1f} s, {from_mate} of {len(last)} "
              f"from a mate")


def _report_join(args, out: Path, names: list[str], held: dict[str, dict[int, float]]) -> None:
    """Seconds from a sampler's process start to: imports done, in the DHT (reachability settled),
    the learner found, the keyframe v0 held. Samplers that start at once (the default) wait for the
    CPU here on a small machine (imports)."""
    since: dict[str, list[float]] = {"python": [], "dht": [], "learner": [], "v0": []}
    for n in names:
        events = _jsonl(out / n / "joined.jsonl")
        for e in events:
            since[e["step"]].append(e["t"] - e["spawned"])
        if events and 0 in held[n]:
            since["v0"].append(held[n][0] - events[0]["spawned"])
    print(f"join, s from each sampler's process start ({'one every %g s' % args.join_every if args.join_every else 'all at once'}): " + ", ".join(
        f"{what} median {statistics.median(xs):.1f} max {max(xs):.1f}" for what, xs in
        (("imports done", since["python"]), ("in the DHT", since["dht"]), ("learner found", since["learner"]), ("v0 held", since["v0"])) if xs))


def _report_keyframe(args, out: Path, pubs: dict, served: list[tuple[float, int]], held: dict[str, dict[int, float]],
                     wan: Wan) -> None:
    """A new swarm's first version, v0: what the learner uploaded until every sampler held it, in
    copies, beside one copy per sampler (each took it whole from the learner before seeders stood in
    for mates: swarm/discovery.py `seeders`) and one copy (the goal)."""
    size, got = pubs[0]["size"], [h[0] for h in held.values() if 0 in h]
    if len(got) < len(held) or not served:
        print("v0: not every sampler held it")
        return
    last = max(got)
    after = [b for t, b in served if t >= last]
    if not after:
        print("v0: the learner's count after the last sampler held it was not recorded")
        return
    up = after[0] / size
    how = f"one every {args.join_every:g} s" if args.join_every else "all at once"
    first = min((e["spawned"] for n in held for e in _jsonl(out / n / "joined.jsonl")[:1]), default=math.nan)
    print(f"v0, a new swarm's keyframe ({size / 2**20:.1f} MB, limit {wan.one_copy_s(size):.2f} s), {len(held)} samplers "
          f"joining {how}: the learner uploaded {up:.2f} copies (one a sampler: {len(held)}); the last held it "
          f"{last - first:.1f} s after the first sampler started")


def _staleness(pubs: dict, held: dict[str, dict[int, float]], end: float) -> list[int]:
    t, out = pubs[1]["t"], []
    while t <= end:
        newest = max(v for v, e in pubs.items() if e["t"] <= t)
        for h in held.values():
            out.append(newest - max((v for v, ht in h.items() if ht <= t), default=-1))
        t += 1.0
    return out


def _q(xs: list[int], q: float) -> int:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def _s(x: float) -> str:
    return "never" if math.isinf(x) else f"{x:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", nargs="?", default="run", choices=["run", "bootstrap", "learner", "sampler"],
                    help="run (the benchmark); the others are its processes")
    ap.add_argument("--samplers", type=int, default=8)
    ap.add_argument("--rate-mbit", type=float, default=100.0)
    ap.add_argument("--rtt-ms", type=float, default=80.0)
    ap.add_argument("--loss", type=float, default=0.0, help="per segment (examples/wan.py: what stands in for it)")
    ap.add_argument("--patch-mb", type=float, default=12.0)
    ap.add_argument("--keyframe-mb", type=float, default=1.0)
    ap.add_argument("--versions", type=int, default=6)
    ap.add_argument("--interval", type=float, default=20.0, help="seconds between patches")
    ap.add_argument("--blob-dir", help="real encoded versions: files v1..vK (and v0, the keyframe)")
    ap.add_argument("--out", help="records and logs (default: a new temp folder)")
    ap.add_argument("--behind-nat", type=int, default=0, metavar="K",
                    help="put K of the samplers behind home routers that NAT and drop inbound connections "
                         "(examples/internet.py; no added RTT there)")
    ap.add_argument("--long-poll", type=float, default=10.0, metavar="S",
                    help="samplers ask the learner to hold each manifest request up to S s until it publishes, as "
                         "`join` does; 0: a plain poll once a second (as before)")
    ap.add_argument("--join-every", type=float, default=0.0, metavar="S",
                    help="a new swarm whose samplers join one every S s (default: all at once); the learner names "
                         "the first to hold v0 as seeders, the others' mates until it credits anyone")
    ap.add_argument("--relay-queue-kib", type=float, default=4096, metavar="KIB",
                    help="bytes the WAN's relay queues each way of each connection (examples/wan.py, `window`)")
    ap.add_argument("--relay-sockbuf-kib", type=float, default=0, metavar="KIB",
                    help="the relay's kernel socket buffers each way of each connection (Linux doubles it, up to "
                         "net.core.rmem_max/wmem_max; default 0: the kernel's autotuning)")
    ap.add_argument("--sync-polls", action="store_true", help="samplers poll at the same instants (an experiment: "
                    "as if every sampler learnt of a new version at once); default: each on its own 1 s cycle")
    # the roles' own flags
    for flag in ("--dir", "--host", "--announce", "--boot", "--name", "--follow"):
        ap.add_argument(flag, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=31337, help=argparse.SUPPRESS)
    ap.add_argument("--home", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--spawned", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role != "run":
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.role} %(name)s %(message)s")
        os.environ.setdefault("HIVEMIND_LOGLEVEL", "WARNING")
        (Path(args.dir) / (args.name or args.role)).mkdir(parents=True, exist_ok=True)
    {"run": run, "bootstrap": role_bootstrap, "learner": role_learner, "sampler": role_sampler}[args.role](args)


if __name__ == "__main__":
    main()
