"""A swarm of real node processes on 127.0.0.1 for integration tests (test_swarm, test_adversary,
test_leaderboard_browser, test_vllm) and examples/bench_flood.py; and an attacker's forger of rollouts."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

from cli.procs import NodeProcess, start_node, stop, wait_for_file
from node.models import BUILTIN_MODEL, load_tokenizer, tokenizer_hash
from node.tasks import ArithmeticTask
from swarm.wire.envelope import seal
from swarm.identity import Identity
from swarm.wire.rollout import CompletionRecord, RolloutGroup
from helpers.jsonl import read_jsonl


class Swarm:
    def __init__(self, base: Path) -> None:
        self.base, self.nodes, self.logs = base, {}, base / "logs"

    def start(self, name: str, args: list[str], module: str = "cli.main", nofile: int | None = None) -> NodeProcess:
        self.nodes[name] = start_node(name, args, self.logs, module=module, nofile=nofile)
        return self.nodes[name]

    def join(self, name: str, role: str, *extra: str, nofile: int | None = None) -> NodeProcess:
        return self.start(name, ["join", "--role", role, "--initial-peers", self.addr, "--no-nat",
                                 "--workdir", str(self.base / name), *extra], nofile=nofile)

    def join_attacker(self, name: str, mode: str, *extra: str) -> NodeProcess:
        """A sampler process with its own key whose groups tests/helpers/attacker.py tampers with (MODE)."""
        return self.start(name, [mode, "join", "--role", "sampler", "--initial-peers", self.addr, "--no-nat",
                                 "--workdir", str(self.base / name), "--name", name, *extra], module="tests.helpers.attacker")

    def start_learner(self, toml: str, *extra: str, nofile: int | None = None) -> NodeProcess:
        """The learner, with `toml` as its config file (written to the swarm's folder)."""
        (self.base / "learner.toml").write_text(toml)
        return self.join("learner", "learner", "--config", str(self.base / "learner.toml"), *extra, nofile=nofile)

    def stop_all(self) -> None:
        """SIGTERM (then SIGKILL) every node's process group, and check that none is left running."""
        stop(list(self.nodes.values()))
        alive = [n.name for n in self.nodes.values() if n.group_alive()]
        assert not alive, f"orphaned process groups: {alive}"

    def metrics(self) -> list[dict]:
        path = self.base / "learner" / "metrics.jsonl"
        if not path.exists():
            return []
        return read_jsonl(path)

    def version(self) -> int:
        steps = [r["version"] for r in self.metrics() if r["kind"] == "step"]
        return steps[-1] if steps else 0

    def wait_version(self, v: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.version() >= v:
                return self.version()
            time.sleep(0.5)
        raise TimeoutError(f"learner stuck at version {self.version()} (wanted {v}); logs in {self.logs}")

    def status(self) -> list[dict]:
        out = subprocess.run([sys.executable, "-m", "cli.main", "status", "--initial-peers", self.addr, "--json"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout[out.stdout.index("["):])


def start_bootstrap(s: Swarm, learners: tuple[str, ...] = ("learner",)) -> None:
    """The coordinator, naming the learners (by workdir name; their keys are made here) samplers follow."""
    trusted = [arg for name in learners
               for arg in ("--trusted-learner", Identity.load_or_create(s.base / name / "identity.key").peer_id)]
    boot = s.start("bootstrap", ["bootstrap", "--port", "0", "--host", "127.0.0.1", "--no-nat",
                                 "--identity", str(s.base / "boot.key"), "--addr-file", str(s.base / "boot.addr"), *trusted])
    s.addr = wait_for_file(s.base / "boot.addr", 90, boot).decode().split()[0]


VOLUNTEER_NOFILE = 1024
"""A common default soft limit on open files (nothing raises it for a volunteer's shell; the node
raises its soft limit to the hard one, which may be this too)."""


@contextlib.contextmanager
def honest_swarm(base: Path, learner_toml: str):
    """A bootstrap, a learner (with `learner_toml`) and one honest sampler, "honest", run until
    version 3 (its first groups audited: a proven sampler); every process reaped at the end. The
    learner runs at a volunteer's common open-file limit (`VOLUNTEER_NOFILE`): every attack on it
    must leave it alive there, not only at this machine's limit."""
    s = Swarm(base)
    try:
        start_bootstrap(s)
        s.start_learner(learner_toml, nofile=VOLUNTEER_NOFILE)
        s.join("honest", "sampler", "--name", "honest")
        s.wait_version(3, timeout=240)
        yield s
    finally:
        s.stop_all()


def check_books(learner_dir: Path) -> dict:
    """After a learner's graceful stop (it writes a final checkpoint): every acknowledged rollout it
    read from its journal was accepted, and each accepted one was trained on, or is buffered, once
    (or was a partner's, dropped as `foreign_unpaired`).
    Returns the final checkpoint's state (format 2: {part: state})."""
    import msgpack

    from swarm.rollouts.journal import Journal
    from swarm.wire.rollout import decode_rollout_group

    from node.learner.checkpoint import latest_checkpoint

    last = latest_checkpoint(learner_dir / "checkpoints")
    state = json.loads((last / "state.json").read_text())
    journal = Journal(learner_dir / "journal.bin")
    cursor = state["extra"]["journal_cursor"]
    assert 0 < journal.first <= cursor <= len(journal)  # compacted: it keeps what no checkpoint holds
    consumed = {decode_rollout_group(r).id for r in journal.read(journal.first, cursor - journal.first)}
    buffered = len(msgpack.unpackb((last / "buffer.msgpack").read_bytes()))
    seen = set(state["checks"]["seen"])
    assert consumed <= seen  # every acknowledged rollout the learner read was accepted
    # and trained on once, or dropped waiting with none of our model's groups to share a step with
    unpaired = state["books"]["drops"].get("foreign_unpaired", 0)
    assert sum(state["books"]["accepted_by_sampler"].values()) + buffered + unpaired == len(seen), \
        (sum(state["books"]["accepted_by_sampler"].values()), buffered, unpaired, len(seen))
    return state


def owed_now(outbox_db: Path) -> set[str]:
    """The ids a sampler's outbox owes its learner now (what `undelivered` then follows)."""
    from swarm.rollouts.outbox import Outbox

    outbox = Outbox(outbox_db)
    try:
        return outbox.owed_ids()
    finally:
        outbox.close()


def undelivered(outbox_db: Path, waiting: set[str], timeout: float = 60.0) -> set[str]:
    """Which of the records `waiting` in a sampler's outbox are still owed after up to `timeout` s.

    Nothing-stuck is tested this way, not by the outbox's level: the samplers go on generating, so
    the level settles wherever this machine's generation and delivery rates meet."""
    deadline = time.monotonic() + timeout
    while (left := waiting & owed_now(outbox_db)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


def peer_of(s: Swarm, name: str) -> str:
    wait_for_file(s.base / name / "identity.key", 60)
    return Identity.load_or_create(s.base / name / "identity.key").peer_id


class Forger:
    """Valid-looking groups of the swarm's task, model and sampling, signed by the attacker."""

    def __init__(self, identity: Identity) -> None:
        self.identity, self.task, self.tok = identity, ArithmeticTask(), load_tokenizer(BUILTIN_MODEL)
        self.problems = list(self.task.split("train"))

    def group(self, i: int = 0, **over) -> RolloutGroup:
        p = self.problems[i % len(self.problems)]
        ids = self.tok(p.answer, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        comps = [CompletionRecord(p.answer, ids, [-0.5] * len(ids), "stop", 1.0) for _ in range(8)]
        fields = dict(id=uuid.uuid4().hex, swarm="demo", task=self.task.name, prompt_id=p.id, prompt=p.prompt,
                      model_id=BUILTIN_MODEL, tokenizer=tokenizer_hash(self.tok), version=0, sampler=self.identity.peer_id,
                      created=time.time(), completions=comps, sampling={"temperature": 1.0}, chain="")
        return RolloutGroup(**{**fields, **over})

    def item(self, g: RolloutGroup) -> list:
        return [g.id, seal(self.identity, g.encode())]


def flood_rates(metrics: list[dict], peer: str, t0: float, t1: float, t2: float) -> tuple[float, float]:
    """`peer`'s groups trained on per second (learner clock) in [t0, t1] and in [t1, t2]."""
    points = [(r["time_s"], r["accepted_by_sampler"].get(peer, 0)) for r in metrics if r["kind"] == "step"]

    def rate(a: float, b: float) -> float:
        inside = [p for p in points if a <= p[0] <= b]
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]) if len(inside) > 1 else 0.0

    return rate(t0, t1), rate(t1, t2)
