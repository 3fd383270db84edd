"""A learner on the default checkpoint settings (only `checkpoint_interval_s` shortened, so the test
need not wait 10 minutes) checkpoints by time while it trains, compacts its journal on disk, and
after a kill -9 resumes from that checkpoint, not from version 0 (integration: real processes).
The same logic on the in-memory learner: tests/unit/node/test_checkpoint.py."""

from __future__ import annotations

import time


from cli.procs import stop
from helpers.swarmkit import honest_swarm
from node.learner.checkpoint import latest_checkpoint
from node.learner import LearnerConfig
from swarm.rollouts.journal import Journal

INTERVAL_S = 3.0
LEARNER_TOML = f"[learner.checkpoint]\ninterval_s = {INTERVAL_S}\n"  # everything else at its default


def _version(path) -> int:
    return int(path.name[1:])


def test_a_learner_on_the_defaults_checkpoints_by_time_and_resumes_after_kill9(tmp_path):
    with honest_swarm(tmp_path, LEARNER_TOML) as s:  # running: version 3 reached
        folder = s.base / "learner" / "checkpoints"
        deadline = time.monotonic() + 60
        while latest_checkpoint(folder) is None and time.monotonic() < deadline:
            time.sleep(0.5)
        first = latest_checkpoint(folder)
        assert first is not None, f"no checkpoint {INTERVAL_S} s into training; logs in {s.logs}"
        # by time: the versions trigger (every 100 by default) cannot have fired yet
        assert 0 < _version(first) < LearnerConfig().checkpoint.every
        s.wait_version(_version(first) + 2, timeout=60)  # trained on past it, then killed
        s.nodes["learner"].kill9()
        stop([s.nodes["learner"]])  # reap its DHT and p2pd
        killed_at, steps_before = s.version(), sum(r["kind"] == "step" for r in s.metrics())
        resumed_from = _version(latest_checkpoint(folder))
        assert 0 < resumed_from <= killed_at
        kept = [p for p in folder.iterdir() if p.name.startswith("v")]
        assert len(kept) <= LearnerConfig().checkpoint.keep, kept
        journal = Journal(s.base / "learner" / "journal.bin")
        compacted = journal.first  # records a checkpoint held, gone from the file
        journal.close()
        assert compacted > 0
        s.join("learner", "learner", "--config", str(s.base / "learner.toml"))
        deadline = time.monotonic() + 120
        after: list[int] = []
        while len(after) < 2 and time.monotonic() < deadline:  # the restarted learner's own steps
            time.sleep(0.5)
            after = [r["version"] for r in s.metrics() if r["kind"] == "step"][steps_before:]
        assert after[:2] == [resumed_from + 1, resumed_from + 2], (resumed_from, killed_at, after[:5])
        log = (s.logs / "learner.log").read_text()
        assert f"v{resumed_from:08d} at version {resumed_from}" in log  # "resumed from <it> at version N"
