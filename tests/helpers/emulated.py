"""What the swarms on an emulated network share (tests/integration/swarm/test_wan.py, on
examples/wan.py, and test_internet.py, on examples/internet.py): the peers' configs, and a learner's
metrics, a sampler's status lines and a wait that stops at the first peer that died, read from
outside."""

from __future__ import annotations

import re
import time
from pathlib import Path

from cli.procs import NodeProcess
from helpers.jsonl import read_jsonl

LEARNER_TOML = "[learner]\ncheckpoint = { every = 50 }\neval_every = 0\nmax_staleness = 1000\ngroups_per_step = 8\n"
SAMPLER_TOML = "status_every_s = 2.0\nannounce_every_s = 5.0\n"


def metrics(work: Path) -> list[dict]:
    """The records of the metrics.jsonl in workdir `work` (none yet: [])."""
    path = work / "metrics.jsonl"
    return read_jsonl(path)


def last_step(work: Path) -> dict:
    steps = [r for r in metrics(work) if r["kind"] == "step"]
    return steps[-1] if steps else {"version": 0, "accepted_by_sampler": {}}


def sampler_version(proc: NodeProcess) -> int:
    """The version in the sampler's latest status line (`sampler v<N> | ...`, every 2 s)."""
    found = re.findall(r"sampler v(\d+) \|", proc.log_path.read_text(errors="replace"))
    return int(found[-1]) if found else 0


def wait(cond, timeout: float, what: str, procs: list[NodeProcess]) -> None:
    """Until `cond()`; fails naming `what` after `timeout` s, or at once if one of `procs` exited."""
    deadline = time.monotonic() + timeout
    while not cond():
        dead = [p.name for p in procs if p.popen.poll() is not None]
        assert not dead, f"{dead} exited early; logs in {procs[0].log_path.parent}"
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s; logs in {procs[0].log_path.parent}"
        time.sleep(1.0)
