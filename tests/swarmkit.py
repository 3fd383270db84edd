"""A swarm of real node processes on 127.0.0.1 for integration tests (test_swarm, test_vllm)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from cli.procs import NodeProcess, start_node, wait_for_file
from swarm.identity import Identity


class Swarm:
    def __init__(self, base: Path) -> None:
        self.base, self.nodes, self.logs = base, {}, base / "logs"

    def start(self, name: str, args: list[str]) -> NodeProcess:
        self.nodes[name] = start_node(name, args, self.logs)
        return self.nodes[name]

    def join(self, name: str, role: str, *extra: str) -> NodeProcess:
        return self.start(name, ["join", "--role", role, "--initial-peers", self.addr, "--no-nat",
                                 "--workdir", str(self.base / name), *extra])

    def metrics(self) -> list[dict]:
        path = self.base / "learner" / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]

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


def peer_of(s: Swarm, name: str) -> str:
    wait_for_file(s.base / name / "identity.key", 60)
    return Identity.load_or_create(s.base / name / "identity.key").peer_id
