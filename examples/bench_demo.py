"""Where `hetero-node demo`'s time goes: one run, each of its processes' CPU time and lifetime (read
from /proc while it runs), the share of the machine's cores they used, and the learner's own split
(its `phase_s`: training, waiting for rollouts, publishing...) beside the time before its loop
started and after it ended. Linux only (/proc).

    python examples/bench_demo.py               # the demo as a newcomer runs it (200 versions)
    python examples/bench_demo.py --steps 20    # a short one
    python examples/bench_demo.py --keep        # and keep its folder (logs, metrics, checkpoints)

What it prints is what docs/BENCHMARKS.md ("The demo") reads a run's time from."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from node.metrics import Kind, Metric

TICK = os.sysconf("SC_CLK_TCK")
GOAL_POINTS, GOAL_S = 20.0, 60.0
"""What a newcomer's first command should show on an idle 2-core machine, and how fast (issue 60)."""


def _processes() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, command line, CPU seconds) of every process readable now."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if cmd.strip():  # (a zombie has no command line: its CPU is its parent's to reap)
            out[int(entry)] = (int(stat[1]), cmd, (int(stat[11]) + int(stat[12])) / TICK)
    return out


def _role(cmd: str) -> str:
    """A node the demo started, by its command line: learner, sampler-N (its --name), bootstrap, leaderboard."""
    words = cmd.split()
    for name in ("learner", "bootstrap", "leaderboard"):
        if name in words[3:5] or ("--role" in words and words[words.index("--role") + 1] == name):
            return name
    return words[words.index("--name") + 1] if "--name" in words[:-1] else Path(words[0]).name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=None, help="the demo's --steps (default: its own, 200)")
    ap.add_argument("--every", type=float, default=0.25, help="seconds between two reads of /proc")
    ap.add_argument("--keep", action="store_true", help="keep the run's folder (logs, metrics), named at the end")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-demo-"))
    argv = [sys.executable, "-m", "cli.main", "demo", "--workdir", str(work / "demo")]
    if args.steps:
        argv += ["--steps", str(args.steps)]
    t0, t0_wall = time.monotonic(), time.time()
    with open(work / "demo.out", "w") as out:
        demo = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[1])
    seen: dict[int, dict] = {demo.pid: {"name": "demo", "node": "demo", "first": 0.0, "last": 0.0, "cpu": 0.0}}
    while demo.poll() is None:
        now = time.monotonic() - t0
        for pid, (ppid, cmd, cpu) in _processes().items():
            if pid not in seen and ppid in seen:  # the demo's descendants: nodes, and each node's helpers (p2pd)
                seen[pid] = {"parent": ppid, "first": now}
            if pid not in seen:
                continue
            rec = seen[pid]
            if pid != demo.pid and rec.get("cmd") != cmd:
                # named by its command line, again if it changes: one read between a child's fork and
                # its exec sees its parent's (a sampler once went into the table as "python")
                node = seen[rec["parent"]]["node"]
                rec.update(cmd=cmd, name=_role(cmd) if node == "demo" else f"{node}: {Path(cmd.split()[0]).name}",
                           node=_role(cmd) if node == "demo" else node)
            rec.update(cpu=cpu, last=now)
        time.sleep(args.every)
    wall, cores = time.monotonic() - t0, os.cpu_count() or 1
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)  # every process under the demo, each reaped by its parent
    print(f"hetero-node demo{' --steps ' + str(args.steps) if args.steps else ''}: {wall:.1f} s, exit code "
          f"{demo.returncode}; its processes, as /proc last saw them (CPU to within {args.every} s):")
    print(f"{'process':32s} {'CPU s':>7} {'alive from - to (s)':>20}")
    by_name: dict[str, list[dict]] = {}
    for rec in seen.values():
        by_name.setdefault(rec["name"], []).append(rec)
    total = 0.0
    for name, recs in sorted(by_name.items()):
        cpu = sum(r.get("cpu", 0.0) for r in recs)
        total += cpu
        print(f"{name:32s} {cpu:7.1f} {min(r['first'] for r in recs):9.1f} - {max(r['last'] for r in recs):5.1f}")
    every = reaped.ru_utime + reaped.ru_stime
    # the kernel adds a child's CPU to its parent's count when the parent waits for it: a process no
    # one in the chain waited for (reparented to init, or left to exit after its parent) is missing
    # from it (38.8 against /proc's 72.3 s in one run), so the share takes the larger
    used = max(total, every)
    print(f"all: {total:.1f} CPU s as /proc last saw them ({every:.1f} s by the kernel's count of the processes "
          f"the demo started and reaped, those too short-lived to be seen included), of the {cores * wall:.1f} that "
          f"{cores} cores give in {wall:.1f} s ({used / (cores * wall):.0%})")
    metrics = work / "demo" / "learner" / "metrics.jsonl"
    records = [json.loads(line) for line in open(metrics)] if metrics.exists() else []
    steps = [r for r in records if r[Metric.KIND] == Kind.STEP]
    evals = [(r[Metric.VERSION], r[Metric.EVAL_ACC]) for r in records if r[Metric.KIND] == Kind.EVAL]
    if steps and steps[-1].get(Metric.WEIGHTS_PUBLISHED_AT):
        # time_s: seconds since the learner was made (its v0 and first evaluation included);
        # weights_published_at: the wall clock when that step's version went out, a moment before
        last = steps[-1]
        run_s = last[Metric.TIME_S]
        began = last[Metric.WEIGHTS_PUBLISHED_AT] - run_s - t0_wall
        print(f"the learner's run: {run_s:.1f} s, from {began:.1f} s after the command started to "
              f"{wall - began - run_s:.1f} s before it ended; in it:")
        for k, v in sorted(last[Metric.PHASE_S].items(), key=lambda kv: -kv[1]):
            if v >= 0.05:
                print(f"  {k:12s} {v:6.1f} s  {v / run_s:4.0%}")
    if len(evals) < 2:
        tail = (work / "demo.out").read_text().splitlines()
        print(f"fewer than two evaluations in {metrics}; the demo's output ends\n" + "\n".join(tail[-20:]))
    else:
        (v0, first), (v1, final) = evals[0], evals[-1]
        points = (final - first) * 100
        print(f"eval accuracy (the learner's metrics): v{v0} {first:.1%} -> v{v1} {final:.1%} ({points:+.1f} points)")
        met = points >= GOAL_POINTS and wall <= GOAL_S
        print(f"goal (issue 60): +{GOAL_POINTS:g} points within {GOAL_S:g} s on an idle 2-core machine; this run "
              f"{points:+.1f} points in {wall:.1f} s: {'met' if met else 'not met'}")
    if args.keep:
        print(f"the run's files: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
