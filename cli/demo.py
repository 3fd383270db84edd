"""`hetero-node demo`: a bootstrap peer, a learner and samplers as processes on 127.0.0.1."""

from __future__ import annotations

import collections
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from swarm.identity import short_id

from .procs import NodeProcess, start_node, stop, wait_for_file

LEARNER_TOML = """\
tally_every_s = 5.0
[learner]
eval_every = 25
eval_size = 300
"""


def _peer_id(workdir: Path, timeout: float = 60) -> str:
    from swarm.identity import Identity

    wait_for_file(workdir / "identity.key", timeout)
    return Identity.load_or_create(workdir / "identity.key").peer_id


def _start_swarm(base: Path, steps: int, n_samplers: int, nodes: list[NodeProcess]) -> tuple[dict[str, str], str]:
    from swarm.identity import Identity

    logs = base / "logs"
    # the coordinator names the learner its samplers may follow: make the learner's key first
    learner_id = Identity.load_or_create(base / "learner" / "identity.key").peer_id
    boot = start_node("bootstrap", ["bootstrap", "--port", "0", "--host", "127.0.0.1", "--no-nat",
                                    "--identity", str(base / "bootstrap.key"), "--addr-file", str(base / "bootstrap.addr"),
                                    "--trusted-learner", learner_id], logs)
    nodes.append(boot)
    addr = wait_for_file(base / "bootstrap.addr", 90, boot).decode().split()[0]
    (base / "learner.toml").write_text(LEARNER_TOML)
    common = ["--initial-peers", addr, "--no-nat", "--host", "127.0.0.1"]
    nodes.append(start_node("learner", ["join", "--role", "learner", *common, "--workdir", str(base / "learner"),
                                        "--max-steps", str(steps), "--config", str(base / "learner.toml")], logs))
    for i in range(n_samplers):
        nodes.append(start_node(f"sampler-{i}", ["join", "--role", "sampler", *common, "--name", f"demo sampler {i}",
                                                  "--workdir", str(base / f"sampler-{i}")], logs))
    board = start_node("leaderboard", ["leaderboard", "--serve", "127.0.0.1:0", "--initial-peers", addr, "--poll", "2",
                                       "--db", str(base / "leaderboard" / "leaderboard.db"),
                                       "--url-file", str(base / "leaderboard.url")], logs)
    nodes.append(board)
    url = wait_for_file(base / "leaderboard.url", 90, board).decode().strip()
    return {_peer_id(base / f"sampler-{i}"): f"sampler-{i}" for i in range(n_samplers)}, url


def _read_new(path: Path, pos: int) -> tuple[list[dict], int]:
    if not path.exists():
        return [], pos
    with open(path) as f:
        f.seek(pos)
        chunk = f.read()
    complete = chunk[: chunk.rfind("\n") + 1]
    return [json.loads(x) for x in complete.splitlines() if x.strip()], pos + len(complete)


def _follow(base: Path, steps: int, learner: NodeProcess, console: Console, timeout: float) -> list[dict]:
    metrics, pos, records, t0 = base / "learner" / "metrics.jsonl", 0, [], time.monotonic()
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console) as progress:
        bar = progress.add_task("learner versions", total=steps, info="starting peers...")
        last_eval = None
        while True:
            new, pos = _read_new(metrics, pos)
            records += new
            for r in new:
                if r["kind"] == "eval":
                    last_eval = r["eval_acc"]
                else:
                    progress.update(bar, completed=r["version"],
                                    info=f"reward {r['reward']:.2f}  staleness {r['staleness_mean']:.1f}"
                                         + (f"  eval {last_eval:.1%}" if last_eval is not None else ""))
            if learner.popen.poll() is not None:
                new, pos = _read_new(metrics, pos)
                return records + new
            if time.monotonic() - t0 > timeout:
                console.print(f"[red]timed out after {timeout:.0f} s[/]")
                return records
            time.sleep(0.5)


def _summary(console: Console, records: list[dict], names: dict[str, str], wall: float) -> bool:
    evals = [(r["version"], r["eval_acc"]) for r in records if r["kind"] == "eval"]
    steps = [r for r in records if r["kind"] == "step"]
    if len(evals) < 2 or not steps:
        console.print("[red]the learner did not finish; see the logs[/]")
        return False
    stale = collections.Counter()
    for r in steps:
        stale.update({int(k): v for k, v in r["staleness_hist"].items()})
    last = steps[-1]
    table = Table(title="hetero-node demo: summary")
    table.add_column("")
    table.add_column("")
    table.add_row("eval accuracy", f"{evals[0][1]:.1%} -> {evals[-1][1]:.1%} ({(evals[-1][1] - evals[0][1]) * 100:+.1f} points)")
    table.add_row("versions published", str(last["version"]))
    for peer, n in sorted(last["accepted_by_sampler"].items()):
        table.add_row(f"groups accepted from {names.get(peer, short_id(peer))}", str(n))
    total = sum(stale.values())
    table.add_row("staleness (versions)", f"mean {sum(k * v for k, v in stale.items()) / total:.1f}, max {max(stale)}")
    table.add_row("dropped", ", ".join(f"{k}: {v}" for k, v in last["drops"].items()) or "none")
    table.add_row("wall time", f"{wall:.0f} s")
    console.print(table)
    curve = "  ".join(f"v{v}: {a:.0%}" for v, a in evals)
    console.print(f"eval curve: {curve}")
    return evals[-1][1] > evals[0][1]


def _leaderboard(console: Console, url: str, records: list[dict], db: Path, wait: float = 20.0) -> None:
    """The leaderboard as the service shows it, once it has the learner's final tally."""
    import urllib.request

    steps = [r for r in records if r["kind"] == "step"]
    # credited = trained on: the groups each step took, less those without signal (zero variance)
    want = sum(r["groups_own"] + r["groups_foreign"] - r["groups_skipped_zero_var"] for r in steps)
    deadline, board = time.monotonic() + wait, None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "api/leaderboard", timeout=5) as r:
                board = json.loads(r.read())
        except OSError:
            pass
        if board and sum(p["groups"] for p in board["peers"]) >= want:
            break
        time.sleep(1)
    if not board or not board["peers"]:
        console.print(f"[yellow]the leaderboard at {url} had no tallies yet[/]")
        return
    table = Table(title="leaderboard: rollouts the learner accepted, per peer")
    for col in ("#", "peer", "name", "accepted rollouts", "tokens", "share"):
        table.add_column(col, justify="right" if col in ("#", "accepted rollouts", "tokens", "share") else "left")
    for p in board["peers"]:
        table.add_row(str(p["rank"]), short_id(p["peer_id"]), p["name"], str(p["rollouts"]), str(p["tokens"]),
                      f"{p['share']:.1%}")
    console.print(table)
    console.print(f"It was live at {url} during the demo. Browse it again (history kept in SQLite):\n"
                  f"  hetero-node leaderboard --db {db} --serve 127.0.0.1:8080")


def run_demo(steps: int, n_samplers: int, workdir: Path | None, timeout: float) -> int:
    console = Console()
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="hetero-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    console.print(f"[bold]hetero-node demo[/]: 1 bootstrap, 1 learner, {n_samplers} samplers on 127.0.0.1 "
                  f"(logs in {base / 'logs'})")
    nodes: list[NodeProcess] = []
    t0 = time.monotonic()
    try:
        names, url = _start_swarm(base, steps, n_samplers, nodes)
        console.print(f"leaderboard live at {url}")
        records = _follow(base, steps, nodes[1], console, timeout)
        ok = _summary(console, records, names, time.monotonic() - t0)
        _leaderboard(console, url, records, base / "leaderboard" / "leaderboard.db")
    except KeyboardInterrupt:
        console.print("interrupted")
        ok = False
    finally:
        stop(nodes)
        left = [n.name for n in nodes if n.group_alive()]
        console.print(f"stopped {len(nodes)} processes" + (f"; [red]still alive: {left}[/]" if left else ""))
    return 0 if ok else 1
