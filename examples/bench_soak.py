"""Hours, not minutes: does a node's memory, threads, descriptors or disk grow while it runs?

    python examples/bench_soak.py --minutes 120
    python examples/bench_soak.py --minutes 600 --checkpoint-interval-s 60 --no-attack
    python examples/bench_soak.py --minutes 3 --churn-s 60 --attack-every-s 90 --sample-s 5   # a smoke run

RL Swarm's volunteers report their nodes killed for memory after 3 to 18 hours; our tests run for
minutes. This runs a real loopback swarm of processes (`cli.procs.start_node`: a bootstrap naming
the learner, the learner with its default config, `--samplers` samplers) for `--minutes`, under:
  churn     every `--churn-s`, one sampler (drawn among all but the first `--steady`, which stay
            up the whole run: a volunteer's node that never restarts) is stopped, gracefully and
            with kill -9 in turn, and started again a few seconds later on the same workdir;
  attacker  every `--attack-every-s`, a process with a fresh key, at nice 19 (this file with
            `--attacker`), opens 200 idle streams to the learner's rollout door and asks its
            manifest 16 calls at a time for 30 s, then exits (a door that leaks leaks here).
Every `--sample-s`, for each role's process together with its descendants and its process group
(the DHT process, p2pd; from /proc): resident memory (summed, so pages shared after the DHT's fork
count twice: a constant, not a slope), threads, open descriptors, and the disk its workdir holds;
one JSON line each to `--out` (default RUN_DIR/soak.jsonl): {t, name, rss_mb, threads, fds,
disk_mb, version, procs, life} (+ metrics_mb for the learner). At the end, or at Ctrl-C (every
process is stopped and reaped either way), per process: each value at the end of warm-up
(`--warmup-frac` of the run) and at the end, and its least-squares slope per hour after warm-up,
marked GROWS past `GROWS_PER_H`. The learner's metrics.jsonl grows by design (~1.7 kB a version),
so the learner's disk is judged net of it. A churned sampler's memory, thread and descriptor slopes
span its restarts (each restart starts from scratch): judge those on the steady samplers.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cli.procs import NodeProcess, die_with_parent, start_node, stop, stop_on_signals, wait_for_file  # noqa: E402
from swarm.identity import Identity  # noqa: E402
from swarm.lifetime import proc_table  # noqa: E402

GROWS_PER_H = {"rss_mb": 10.0, "threads": 1.0, "fds": 5.0, "disk_mb": 50.0}
"""Slopes per hour past which a metric is marked GROWS. 10 MB/h is 180 MB in the 18 hours after
which volunteers report OOM kills, and 1.7 GB in a week; 5 descriptors/h reach a 1,024 limit in
about 8 days; a thread an hour is a loop started and never joined; 50 MB/h of disk is 1.2 GB a day
(the learner's net of its metrics.jsonl, which grows by design)."""
ATTACK_S, ATTACK_STREAMS, ATTACK_CONCURRENCY = 30.0, 200, 16
RESTART_AFTER_S = 5.0
"""A churned sampler comes back after this long: long enough that its peers notice it gone."""
MB = 2 ** 20
SHORT_S = 3600.0
"""Below this much time after warm-up, per-hour slopes extrapolate startup, not a trend."""


# ---- what a process tree holds, from /proc ----

def tree_pids(root: int, table: list[tuple[int, str, int, int]]) -> list[int]:
    """`root`, its descendants, and what is left of its process group (a p2pd orphaned by a kill
    -9 is re-parented to init but keeps its group); zombies excluded."""
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for pid, _, ppid, _ in table:
        kids[ppid].append(pid)
    found, todo = set(), [root]
    while todo:
        p = todo.pop()
        found.add(p)
        todo += kids[p]
    found |= {pid for pid, _, _, pgid in table if pgid == root}
    return sorted(found & {pid for pid, state, _, _ in table if state != "Z"})


def usage(pids: list[int]) -> tuple[float, int, int]:
    """Summed resident MB, threads and open descriptors of `pids`."""
    rss_kb = threads = fds = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            n_fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:  # exited while we looked
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        rss_kb += int(fields.get("VmRSS", "0 kB").split()[0])  # kernel threads and zombies have none
        threads += int(fields["Threads"])
        fds += n_fds
    return rss_kb / 1024, threads, fds


def disk_mb(folder: Path) -> float:
    """MB of disk the files under `folder` hold (allocated blocks, as du counts; hard links once)."""
    seen, total = set(), 0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except OSError:  # a checkpoint pruned while we walked
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total / MB


def last_version(metrics: Path) -> int:
    """The learner's newest version, from the tail of its metrics.jsonl (the file grows for hours:
    reading it whole every sample would cost more than what it measures)."""
    try:
        with open(metrics, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            tail = f.read()
    except OSError:
        return 0
    for line in reversed(tail.splitlines()):
        try:
            rec = json.loads(line)
        except ValueError:  # the tail's first, cut line, or one being written
            continue
        if rec.get("kind") == "step":
            return int(rec["version"])
    return 0


# ---- the attacker process ----

async def attacker(key: Path, maddrs: list[str]) -> dict:
    """One fresh key: ATTACK_STREAMS idle streams to the learner's rollout door, held while it asks
    the learner's manifest ATTACK_CONCURRENCY calls at a time for ATTACK_S; what it got."""
    from google.protobuf.wrappers_pb2 import BytesValue
    from hivemind.p2p import P2P, PeerID

    from swarm.p2p.budget import raise_nofile_limit
    from swarm.wire.batch import ROLLOUTS
    from swarm.wire.manifest import MANIFEST

    raise_nofile_limit()  # each stream costs the attacker a descriptor too
    Identity.load_or_create(key)
    p2p = await P2P.create(initial_peers=maddrs, identity_path=str(key), host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                           auto_nat=False, nat_port_map=False)
    peer = PeerID.from_base58(maddrs[0].rsplit("/p2p/", 1)[1])
    counts: collections.Counter = collections.Counter()
    writers = []
    try:
        for _ in range(ATTACK_STREAMS):
            try:
                _, _, writer = await asyncio.wait_for(p2p.call_binary_stream_handler(peer, ROLLOUTS), 10)
                writers.append(writer)
                counts["streams_opened"] += 1
            except Exception:  # refused by the learner's daemon or ours: counted
                counts["streams_failed"] += 1
        deadline = time.monotonic() + ATTACK_S

        async def ask() -> None:
            while time.monotonic() < deadline:
                try:
                    reply = await asyncio.wait_for(
                        p2p.call_protobuf_handler(peer, MANIFEST, BytesValue(value=b""), BytesValue), 10)
                    counts["manifest_sealed" if reply.value else "manifest_empty"] += 1
                except Exception:  # a reset or a timeout: an attacker asks again, after a breath
                    counts["manifest_failed"] += 1
                    await asyncio.sleep(0.1)
        await asyncio.gather(*(ask() for _ in range(ATTACK_CONCURRENCY)))
    finally:
        for w in writers:
            w.close()
        await p2p.shutdown()
    return dict(counts)


# ---- the swarm under soak ----

class Soak:
    """The swarm's processes, their churn, the attacker's visits, and the samples."""

    def __init__(self, base: Path, args: argparse.Namespace) -> None:
        self.base, self.args, self.logs = base, args, base / "logs"
        self.nodes: dict[str, NodeProcess] = {}
        self.lives: dict[str, int] = collections.Counter()
        self.restart_at: dict[str, float] = {}
        self.exited: list[str] = []
        self.attacker: NodeProcess | None = None
        self.attacks: list[dict] = []
        self.maddrs: list[str] = []
        self.version, self.churns, self.addr = 0, 0, ""
        self.samples: list[dict] = []
        self.out = open(args.out, "a")

    def start(self) -> None:
        """A bootstrap naming the learner (its key made here first), the learner, the samplers."""
        learner_key = Identity.load_or_create(self.base / "learner" / "identity.key")
        boot_dir = self.base / "bootstrap"
        boot_dir.mkdir(parents=True, exist_ok=True)
        boot = self._start("bootstrap", ["bootstrap", "--port", "0", "--host", "127.0.0.1", "--no-nat",
                                         "--identity", str(boot_dir / "boot.key"), "--addr-file", str(boot_dir / "boot.addr"),
                                         "--trusted-learner", learner_key.peer_id])
        self.addr = wait_for_file(boot_dir / "boot.addr", 90, boot).decode().split()[0]
        extra = []
        if self.args.checkpoint_interval_s is not None:
            (self.base / "learner.toml").write_text(f"[learner.checkpoint]\ninterval_s = {self.args.checkpoint_interval_s}\n")
            extra = ["--config", str(self.base / "learner.toml")]
        self._join("learner", "learner", *extra)
        for i in range(self.args.samplers):
            self._sampler(f"s{i}")

    def _start(self, name: str, args: list[str]) -> NodeProcess:
        self.nodes[name] = start_node(name, args, self.logs)
        return self.nodes[name]

    def _join(self, name: str, role: str, *extra: str) -> NodeProcess:
        return self._start(name, ["join", "--role", role, "--initial-peers", self.addr, "--no-nat",
                                  "--workdir", str(self.base / name), *extra])

    def _sampler(self, name: str) -> NodeProcess:
        return self._join(name, "sampler", "--name", name)

    def sample(self, t: float) -> None:
        """One JSON line per role's process tree; a node found dead (not by our churn) is noted."""
        self.version = max(self.version, last_version(self.base / "learner" / "metrics.jsonl"))
        table = proc_table()
        for name, node in list(self.nodes.items()):
            if node.popen.poll() is not None:
                self.exited.append(f"{name} (exit {node.popen.returncode}, at {t / 60:.1f} min; see {node.log_path})")
                print(f"!! {self.exited[-1]}", flush=True)
                stop([node])  # reap what is left of its group
                del self.nodes[name]
                continue
            pids = tree_pids(node.pgid, table)
            rss, threads, fds = usage(pids)
            rec = {"t": round(t, 1), "name": name, "rss_mb": round(rss, 1), "threads": threads, "fds": fds,
                   "disk_mb": round(disk_mb(self.base / name), 3), "version": self.version, "procs": len(pids),
                   "life": self.lives[name]}
            if name == "learner":
                metrics = self.base / "learner" / "metrics.jsonl"
                rec["metrics_mb"] = round(metrics.stat().st_size / MB, 3) if metrics.exists() else 0.0
            self.samples.append(rec)
            self.out.write(json.dumps(rec) + "\n")
        self.out.flush()

    def churn(self) -> None:
        """Stop one sampler (not a steady one): gracefully, and with kill -9 every other time."""
        pool = [f"s{i}" for i in range(self.args.steady, self.args.samplers) if f"s{i}" in self.nodes]
        if not pool:
            return
        name, hard = random.choice(pool), self.churns % 2 == 1
        node = self.nodes.pop(name)
        if hard:
            node.popen.kill()  # as the OOM killer would: nothing of its code runs
        stop([node])  # reap it and its group (its DHT process and p2pd)
        self.churns += 1
        self.restart_at[name] = time.monotonic() + RESTART_AFTER_S
        print(f"   churn: {name} stopped ({'kill -9' if hard else 'graceful'}), back in {RESTART_AFTER_S:.0f} s", flush=True)

    def restart_due(self) -> None:
        for name, at in list(self.restart_at.items()):
            if time.monotonic() >= at:
                del self.restart_at[name]
                self.lives[name] += 1
                self._sampler(name)

    def learner_maddrs(self) -> list[str]:
        """The learner's announced addresses (`hetero-node status --json`), once found."""
        if self.maddrs:
            return self.maddrs
        learner = Identity.load_or_create(self.base / "learner" / "identity.key").peer_id
        # its own session, reaped with its DHT process and p2pd whatever happens
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "status", "--initial-peers", self.addr, "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
                                cwd=ROOT, start_new_session=True, preexec_fn=die_with_parent())
        try:
            out, _ = proc.communicate(timeout=90)
            peers = json.loads(out[out.index("["):])
        except (subprocess.TimeoutExpired, ValueError):  # no answer yet, or no JSON: try at the next attack
            peers = []
        finally:
            stop([NodeProcess("status", proc, Path(os.devnull))])
        maddrs = [m for p in peers if p.get("peer_id") == learner for m in p.get("maddrs", [])]
        self.maddrs = [m if "/p2p/" in m else f"{m}/p2p/{learner}" for m in maddrs]
        return self.maddrs

    def attack(self) -> None:
        maddrs = self.learner_maddrs()
        if not maddrs:
            print("   attack skipped: the learner has not announced its addresses yet", flush=True)
            return
        key = self.base / "attacker" / f"key{len(self.attacks)}.key"  # a fresh key each visit
        key.parent.mkdir(exist_ok=True)
        log_path = self.logs / "attacker.log"
        with open(log_path, "ab") as log:  # in its own session, so `stop` reaps its p2pd with it
            popen = subprocess.Popen(["nice", "-n", "19", sys.executable, __file__, "--attacker", str(key), *maddrs],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                                     start_new_session=True, preexec_fn=die_with_parent())
        self.attacker = NodeProcess("attacker", popen, log_path)
        self.attacks.append({"started": time.monotonic()})
        print(f"   attack {len(self.attacks)}: {ATTACK_STREAMS} idle streams + manifest x{ATTACK_CONCURRENCY} "
              f"for {ATTACK_S:.0f} s", flush=True)

    def attack_done(self) -> None:
        """Reap an attacker that has finished (or overrun its time by two minutes); note its counts."""
        a = self.attacker
        if a is None or (a.popen.poll() is None and time.monotonic() - self.attacks[-1]["started"] < ATTACK_S + 120):
            return
        stop([a])
        self.attacker = None
        lines = [x for x in a.log_path.read_text(errors="replace").splitlines() if x.startswith("{")]
        self.attacks[-1] = json.loads(lines[-1]) if a.popen.returncode == 0 and lines else {"failed": a.popen.returncode}
        print(f"   attack {len(self.attacks)} done: {self.attacks[-1]}", flush=True)

    def stop_all(self) -> list[str]:
        """Stop every process (gracefully, then by group SIGKILL); the names of any group left."""
        procs = list(self.nodes.values()) + ([self.attacker] if self.attacker else [])
        stop(procs)
        self.out.close()
        return [n.name for n in procs if n.group_alive()]


def run(soak: Soak, args: argparse.Namespace, stop_evt) -> float:
    """The soak's clock: samples, churn and attacks until `--minutes` or Ctrl-C; seconds run."""
    t0 = time.monotonic()
    next_sample, next_churn, next_attack, next_log = t0, t0 + args.churn_s, t0 + args.attack_every_s, t0 + 60
    while not stop_evt.is_set() and (now := time.monotonic()) - t0 < args.minutes * 60:
        if now >= next_sample:
            soak.sample(now - t0)
            next_sample = now + args.sample_s
        if now >= next_log:
            progress(soak, now - t0)
            next_log += 60
        soak.restart_due()
        if args.churn_s > 0 and now >= next_churn:
            soak.churn()
            next_churn += args.churn_s
        if args.attack and now >= next_attack:
            if soak.attacker is None:
                soak.attack()
            next_attack += args.attack_every_s
        soak.attack_done()
        stop_evt.wait(0.5)
    return time.monotonic() - t0


def progress(soak: Soak, t: float) -> None:
    last = {r["name"]: r for r in soak.samples if t - r["t"] < 60}
    parts = [f"{n} {r['rss_mb']:.0f} MB {r['threads']} thr {r['fds']} fd" for n, r in last.items()]
    print(f"[{t / 60:6.1f} min] v{soak.version} | " + " | ".join(parts), flush=True)


# ---- the report ----

def slope_per_h(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t seconds, y) points, per hour."""
    if len(points) < 2:
        return float("nan")
    tm = sum(t for t, _ in points) / len(points)
    ym = sum(y for _, y in points) / len(points)
    den = sum((t - tm) ** 2 for t, _ in points)
    return sum((t - tm) * (y - ym) for t, y in points) / den * 3600 if den else float("nan")


def report(soak: Soak, seconds: float, warmup_frac: float) -> None:
    if not soak.samples:
        print("no samples: the swarm did not start; see the logs")
        return
    warm = warmup_frac * seconds
    after = [r for r in soak.samples if r["t"] >= warm]
    print(f"\nsoak of {seconds / 60:.1f} min, warm-up {warm / 60:.1f} min; slopes: least squares over the "
          f"{len(after)} samples after warm-up (per process tree: node + DHT process + p2pd)")
    learner = [r for r in after if r["name"] == "learner"]
    metrics_h = slope_per_h([(r["t"], r["metrics_mb"]) for r in learner])
    print(f"{'process':<10} {'restarts':>8} {'metric':<8} {'warm-up':>10} {'end':>10} {'per hour':>10}")
    for name in dict.fromkeys(r["name"] for r in soak.samples):
        rows = [r for r in after if r["name"] == name]
        if not rows:
            continue
        restarts = rows[-1]["life"] - rows[0]["life"]
        for k, metric in enumerate(GROWS_PER_H):
            per_h = slope_per_h([(r["t"], r[metric]) for r in rows])
            net = per_h - metrics_h if name == "learner" and metric == "disk_mb" else per_h
            flag = "GROWS" if net > GROWS_PER_H[metric] else ""
            if restarts and metric != "disk_mb":
                flag = "(spans restarts)"  # each restart starts from scratch: a sawtooth, not a trend
            if name == "learner" and metric == "disk_mb":
                flag = f"net of metrics.jsonl {net:+.1f} {flag}".rstrip()
            print(f"{name if k == 0 else '':<10} {restarts if k == 0 else '':>8} {metric:<8} {rows[0][metric]:>10.1f} "
                  f"{rows[-1][metric]:>10.1f} {per_h:>+10.2f}  {flag}".rstrip())
    versions(learner, soak, seconds, metrics_h)
    if soak.attacks:
        print(f"attacks: {len(soak.attacks)}; each: {soak.attacks}")
    print(f"logs (outside the workdirs): {disk_mb(soak.logs):.2f} MB")
    if seconds - warm < SHORT_S:
        print(f"note: {(seconds - warm) / 60:.1f} min after warm-up: startup (model loading, the first checkpoints) "
              f"still dominates, so these slopes say little; GROWS means something after >= {SHORT_S / 3600:.0f} h")
    for line in soak.exited:
        print(f"EXITED unexpectedly: {line}")


def versions(learner: list[dict], soak: Soak, seconds: float, metrics_h: float) -> None:
    """The learner's pace, and its metrics.jsonl's growth per version beside the expected ~1.7 kB."""
    print(f"learner: version {soak.version} reached, {soak.version / (seconds / 60):.1f} versions/min over the run", end="")
    if len(learner) < 2 or learner[-1]["version"] == learner[0]["version"]:
        print()
        return
    dv, dt = learner[-1]["version"] - learner[0]["version"], learner[-1]["t"] - learner[0]["t"]
    grew = (learner[-1]["metrics_mb"] - learner[0]["metrics_mb"]) * MB
    print(f", {dv / (dt / 60):.1f} after warm-up\nmetrics.jsonl (grows by design): {grew / dv / 1e3:.2f} kB/version "
          f"(expected ~1.7), {metrics_h:+.2f} MB/h")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=120.0, help="how long the swarm runs (startup included)")
    ap.add_argument("--samplers", type=int, default=2)
    ap.add_argument("--steady", type=int, default=1, help="samplers (the first ones) never churned: a long-lived volunteer")
    ap.add_argument("--churn-s", type=float, default=120.0, help="stop and restart one other sampler this often (0: never)")
    ap.add_argument("--attack", action=argparse.BooleanOptionalAction, default=True, help="the background attacker")
    ap.add_argument("--attack-every-s", type=float, default=300.0, help=f"an attacker visit ({ATTACK_S:.0f} s) this often")
    ap.add_argument("--sample-s", type=float, default=10.0)
    # the learner's bounded structures (its newest records, the replay check's seen ids) fill for
    # the first ~40 minutes of a 2-hour run at the built-in model's pace: a quarter was too short
    ap.add_argument("--warmup-frac", type=float, default=0.5, help="share of the run left out of the slopes")
    ap.add_argument("--checkpoint-interval-s", type=float, default=None,
                    help="the learner's checkpoint_interval_s (default: its config's, 600)")
    ap.add_argument("--run-dir", type=Path, default=None, help="workdirs and logs (default: a fresh temp folder)")
    ap.add_argument("--out", type=Path, default=None, help="samples, JSON lines (default: RUN_DIR/soak.jsonl)")
    ap.add_argument("--attacker", nargs="+", metavar="KEYFILE MADDR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.attacker:
        print(json.dumps(asyncio.run(attacker(Path(args.attacker[0]), args.attacker[1:]))), flush=True)
        return
    base = (args.run_dir or Path(tempfile.mkdtemp(prefix="bench-soak-"))).resolve()
    base.mkdir(parents=True, exist_ok=True)
    args.out = args.out or base / "soak.jsonl"
    print(f"soak: {args.minutes:g} min in {base}; samples to {args.out}; Ctrl-C stops early and reports", flush=True)
    stop_evt = stop_on_signals()  # Ctrl-C: stop and report; a second one: kill everything at once
    soak, seconds = Soak(base, args), 0.0
    try:
        soak.start()
        seconds = run(soak, args, stop_evt)
    finally:
        left = soak.stop_all()
    report(soak, seconds, args.warmup_frac)
    if left:
        print(f"ORPHANED process groups: {left}")


if __name__ == "__main__":
    main()
