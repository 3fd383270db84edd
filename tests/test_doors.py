"""The doors of a real learner against a stranger with its own fresh key (issue 39): real
processes on 127.0.0.1, the learner at a volunteer's default open-file limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.swarmkit import Swarm, peer_of, start_bootstrap
from helpers.sybils import learner_maddrs
from swarm.rollouts import ROLLOUTS

ROOT = Path(__file__).resolve().parents[1]
LEARNER_TOML = "[learner]\ncheckpoint_every = 10\neval_every = 0\nmax_staleness = 1000\ngroups_per_step = 4\n"
NOFILE = 1024


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.integration
def test_1500_idle_streams_from_one_key_cannot_exhaust_a_learners_descriptors(tmp_path):
    """Before: the learner's descriptors went 23 -> 1,023, accept() failed and the learner exited.
    Now its stream budget closes every stream of that key past 16 unread: its descriptors stay far
    below the limit, it keeps training on the honest sampler's groups, and it says what it refused."""
    s = Swarm(tmp_path)
    try:
        start_bootstrap(s)
        learner = s.start_learner(LEARNER_TOML, nofile=NOFILE)
        s.join("honest", "sampler", "--name", "honest")
        s.wait_version(2, timeout=240)
        maddrs = learner_maddrs(s.status(), peer_of(s, "learner"))
        attack = subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-m", "tests.helpers.idle_streams", str(tmp_path / "attacker.key"),
             ROLLOUTS, "1500", "20", *maddrs], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        peak, deadline = 0, time.monotonic() + 240
        while attack.poll() is None and time.monotonic() < deadline:
            peak = max(peak, _fds(learner.popen.pid))
            time.sleep(0.2)
        out, _ = attack.communicate(timeout=60)
        seen = json.loads(out.strip().splitlines()[-1])
        print(f"\nidle streams: {seen}, learner's peak descriptors {peak} at a limit of {NOFILE}")
        assert seen["opened"] + seen["failed"] == 1500 and seen["opened"] >= 1000, seen
        assert seen["closed_by_peer"] >= seen["opened"] - 16, seen  # all but its 16 closed unread
        assert learner.popen.poll() is None, "the learner died"
        assert peak < NOFILE // 2, f"the learner held {peak} descriptors at a limit of {NOFILE}"
        before = s.version()
        s.wait_version(before + 2, timeout=180)  # and it goes on training
        log = (s.logs / "learner.log").read_text()
        assert "refused a stream of" in log and "past the peer bound" in log
        assert "Too many open files" not in log
    finally:
        s.stop_all()
