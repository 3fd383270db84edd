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

from cli.procs import NodeProcess, start_node, stop, wait_for_file
from node.learner.phases import phase_table
from node.metrics import Kind, Metric

LEARNER_TOML = """\
tally_every_s = 5.0
[learner]
eval_every = 25
eval_size = 300
[learner.weights]
# keyframes only: on loopback bytes are free and CPU is not. A float32 view at the demo's lr
# changes every weight each step, so a patch saves a third of the bytes at 5x a keyframe's
# encode (and decode, in every sampler): 40 of the learner's 50 ms a version
keyframe_every = 1
"""


def _start_swarm(base: Path, steps: int, n_samplers: int, nodes: list[NodeProcess],
                 console: Console) -> tuple[dict[str, str], str]:
    """The bootstrap peer, the learner and the samplers, started; (sampler peer id -> name, the
    bootstrap's address)."""
    from swarm.identity import Identity

    logs = base / "logs"
    # the coordinator names the learner its samplers may follow: make the learner's key first
    learner_id = Identity.load_or_create(base / "learner" / "identity.key").peer_id
    boot = start_node("bootstrap", ["bootstrap", "--port", "0", "--host", "127.0.0.1", "--no-nat",
                                    "--identity", str(base / "bootstrap.key"), "--addr-file", str(base / "bootstrap.addr"),
                                    "--trusted-learner", learner_id], logs)
    nodes.append(boot)
    names = {Identity.load_or_create(base / f"sampler-{i}" / "identity.key").peer_id: f"sampler-{i}"
             for i in range(n_samplers)}  # the summary's names, made here while the bootstrap starts
    addr = wait_for_file(base / "bootstrap.addr", 90, boot).decode().split()[0]
    console.print("bootstrap peer ready; while the demo runs, list the swarm's peers with:")
    _command(console, f"hetero-node status --initial-peers {addr}")
    (base / "learner.toml").write_text(LEARNER_TOML)
    common = ["--initial-peers", addr, "--no-nat", "--host", "127.0.0.1"]
    nodes.append(start_node("learner", ["join", "--role", "learner", *common, "--workdir", str(base / "learner"),
                                        "--max-steps", str(steps), "--config", str(base / "learner.toml")], logs))
    for i in range(n_samplers):
        nodes.append(start_node(f"sampler-{i}", ["join", "--role", "sampler", *common, "--name", f"sampler-{i}",
                                                  "--workdir", str(base / f"sampler-{i}")], logs))
    return names, addr


class _Board:
    """The leaderboard service, started once the learner trains: while the swarm starts, five
    processes importing torch share the cores, and the learner's first version, which every
    sampler waits for, is the one that matters (the board needs the learner's tallies anyway)."""

    def __init__(self, base: Path, addr: str, nodes: list[NodeProcess]) -> None:
        self.base, self.addr, self.nodes = base, addr, nodes
        self.process: NodeProcess | None = None
        self.url: str | None = None

    def start(self) -> None:
        if self.process is None:
            self.process = start_node("leaderboard", [
                "leaderboard", "--serve", "127.0.0.1:0", "--initial-peers", self.addr, "--poll", "2",
                "--db", str(self.db), "--url-file", str(self.base / "leaderboard.url")], self.base / "logs")
            self.nodes.append(self.process)

    @property
    def db(self) -> Path:
        return self.base / "leaderboard" / "leaderboard.db"

    def poll(self, console: Console) -> None:
        """Say where the board is once it serves (the first call after its URL file appears)."""
        path = self.base / "leaderboard.url"
        if self.process is not None and self.url is None and path.exists() and path.read_bytes().strip():
            self.url = path.read_text().strip()
            console.print(f"leaderboard live at {self.url}", soft_wrap=True)

    def wait(self, console: Console, timeout: float = 90) -> str:
        """Its URL, waited for if it is not up yet (a run shorter than its start)."""
        if self.url is None:
            assert self.process is not None
            wait_for_file(self.base / "leaderboard.url", timeout, self.process)
            self.poll(console)
        return self.url or ""


def _read_new(path: Path, pos: int) -> tuple[list[dict], int]:
    if not path.exists():
        return [], pos
    with open(path) as f:
        f.seek(pos)
        chunk = f.read()
    complete = chunk[: chunk.rfind("\n") + 1]
    return [json.loads(x) for x in complete.splitlines() if x.strip()], pos + len(complete)


def _follow(base: Path, steps: int, learner: NodeProcess, console: Console, timeout: float, board: _Board) -> list[dict]:
    metrics, pos, records, t0 = base / "learner" / "metrics.jsonl", 0, [], time.monotonic()
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console) as progress:
        bar = progress.add_task("learner versions", total=steps, info="starting peers...")
        last_step, last_eval = None, None
        while True:
            new, pos = _read_new(metrics, pos)
            records += new
            for r in new:
                if r[Metric.KIND] == Kind.EVAL:
                    last_eval = r[Metric.EVAL_ACC]
                else:
                    last_step = r
            if last_step is not None:
                board.start()
            board.poll(console)
            if last_step is not None:
                progress.update(bar, completed=last_step[Metric.VERSION],
                                info=f"reward {last_step['reward']:.2f}  staleness {last_step['staleness_mean']:.1f}"
                                     + (f"  eval {last_eval:.1%}" if last_eval is not None else ""))
            if learner.popen.poll() is not None:
                new, pos = _read_new(metrics, pos)
                records += new
                last_eval = next((r[Metric.EVAL_ACC] for r in reversed(records) if r[Metric.KIND] == Kind.EVAL), last_eval)
                if last_step is not None and last_eval is not None:
                    progress.update(bar, info=f"reward {last_step['reward']:.2f}  final eval {last_eval:.1%}")
                return records
            if time.monotonic() - t0 > timeout:
                console.print(f"[red]timed out after {timeout:.0f} s[/]")
                return records
            time.sleep(0.5)


def _summary(console: Console, records: list[dict], names: dict[str, str], wall: float, log: Path) -> bool:
    evals = [(r[Metric.VERSION], r[Metric.EVAL_ACC]) for r in records if r[Metric.KIND] == Kind.EVAL]
    steps = [r for r in records if r[Metric.KIND] == Kind.STEP]
    if len(evals) < 2 or not steps:
        console.print(f"[red]the learner did not finish; see {log}[/]", soft_wrap=True)
        return False
    stale = collections.Counter()
    for r in steps:
        stale.update({int(k): v for k, v in r[Metric.STALENESS_HIST].items()})
    last = steps[-1]
    table = Table(title="hetero-node demo: summary", show_header=False)
    table.add_row("eval accuracy", f"{evals[0][1]:.1%} -> {evals[-1][1]:.1%} ({(evals[-1][1] - evals[0][1]) * 100:+.1f} points)")
    table.add_row("versions published", str(last[Metric.VERSION]))
    got = last[Metric.ACCEPTED_BY_SAMPLER]
    per_sampler = sorted((names.get(peer, short_id(peer)), n) for peer, n in got.items())
    table.add_row("groups accepted", f"{sum(got.values())} ({', '.join(f'{name} {n}' for name, n in per_sampler)})")
    total = sum(stale.values())
    table.add_row("staleness (versions)", f"mean {sum(k * v for k, v in stale.items()) / total:.1f}, max {max(stale)}")
    table.add_row("dropped", ", ".join(f"{k}: {v}" for k, v in last[Metric.DROPS].items()) or "none")
    table.add_row("wall time", f"{wall:.0f} s")
    if phases := last.get(Metric.PHASE_S):
        table.add_row("learner's time", ", ".join(f"{k} {v:.0f} s ({share:.0%})" for k, v, share in phase_table(phases)
                                                 if share >= 0.01))
    console.print(table)
    curve = "  ".join(f"v{v}: {a:.0%}" for v, a in evals)
    console.print(f"eval curve: {curve}")
    return evals[-1][1] > evals[0][1]


def _leaderboard(console: Console, url: str, records: list[dict], db: Path, wait: float = 20.0) -> None:
    """The leaderboard as the service shows it, once it has the learner's final tally."""
    import urllib.request

    steps = [r for r in records if r[Metric.KIND] == Kind.STEP]
    # credited = trained on: the groups each step took, less those without signal (zero variance)
    want = sum(r["groups_own"] + r[Metric.GROUPS_FOREIGN] - r[Metric.GROUPS_SKIPPED_ZERO_VAR] for r in steps)
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
    from rich.markup import escape

    from swarm.wire.text import printable

    table = Table(title="leaderboard: rollouts credited per peer")
    for col in ("#", "peer", "name", "credited rollouts", "tokens", "share"):
        table.add_column(col, justify="left" if col in ("peer", "name") else "right")
    for p in board["peers"]:  # a name is its peer's text: escaped, and never rich markup
        table.add_row(str(p["rank"]), short_id(p["peer_id"]), escape(printable(p["name"])), str(p["rollouts"]), str(p["tokens"]),
                      f"{p['share']:.1%}")
    console.print(table)
    console.print("Credited: the rollouts of groups the learner trained on (a group whose rollouts all scored the "
                  "same carries no signal and earns nothing).")
    console.print(f"It was live at {url} during the demo. Browse it again (history kept in SQLite):")
    _command(console, f"hetero-node leaderboard --db {db} --serve 127.0.0.1:8080")


def _command(console: Console, command: str) -> None:
    """A command to copy: on one line whatever the terminal's width (a wrapped one pastes broken)."""
    console.print(f"  {command}", soft_wrap=True, highlight=False, markup=False)


class _Stopped(BaseException):  # like KeyboardInterrupt: no `except Exception` on the way swallows it
    """SIGTERM or SIGHUP (a closed terminal) reached the demo: stop the swarm as Ctrl-C does."""


def _stop_on_signals() -> None:
    """SIGTERM/SIGHUP end the demo like Ctrl-C (its `finally` stops every process it started).
    Children die with the demo even on SIGKILL (cli/procs.py)."""
    import signal

    def handler(signum, frame):
        raise _Stopped(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def _force_on_signals() -> None:
    """While the swarm is being stopped, another Ctrl-C or signal kills it at once."""
    import signal

    from cli.procs import STOP_SIGNALS, force_exit

    for sig in STOP_SIGNALS:
        signal.signal(sig, force_exit)


def run_demo(steps: int, n_samplers: int, workdir: Path | None, timeout: float) -> int:
    console = Console()
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="hetero-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    _stop_on_signals()
    console.print(f"[bold]hetero-node demo[/]: 1 bootstrap, 1 learner, {n_samplers} samplers on 127.0.0.1; "
                  f"logs, checkpoints and metrics in {base}", soft_wrap=True)
    nodes: list[NodeProcess] = []
    t0 = time.monotonic()
    ok = False
    try:
        names, addr = _start_swarm(base, steps, n_samplers, nodes, console)
        learner, samplers, board = nodes[1], nodes[2:], _Board(base, addr, nodes)
        records = _follow(base, steps, learner, console, timeout, board)
        for sampler in samplers:  # nothing left for them to do: they stop while the summary is shown
            sampler.terminate()
        ok = _summary(console, records, names, time.monotonic() - t0, learner.log_path)
        if board.process is not None:  # (not started: the learner never trained, nothing was credited)
            try:
                _leaderboard(console, board.wait(console), records, board.db)
            except (RuntimeError, TimeoutError) as e:  # the service failed to start: its log says why
                console.print(f"[yellow]the leaderboard did not start ({e}); see {base / 'logs' / 'leaderboard.log'}[/]",
                              soft_wrap=True)
    except KeyboardInterrupt:
        console.print("interrupted (Ctrl-C): stopping the swarm")
    except _Stopped as e:
        console.print(f"stopped by {e}: stopping the swarm")
    finally:
        _force_on_signals()
        stop(nodes)
        left = [n.name for n in nodes if n.group_alive()]
        console.print(f"stopped {len(nodes)} processes" + (f"; [red]still alive: {left}[/]" if left else ""))
    console.print(f"Everything this run wrote is in {base} (logs/, learner/metrics.jsonl, checkpoints). Plot it:",
                  soft_wrap=True)
    _command(console, f"hetero-node plot {base / 'learner'} --out {base / 'plots'}")
    return 0 if ok else 1
