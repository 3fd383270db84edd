"""However a parent process ends, what it started ends with it (integration: real processes).

`hetero-node demo` starts a swarm of processes in sessions of their own (so a terminal's Ctrl-C
reaches the demo, which stops them in order); `join --nproc-per-node` starts torchrun and its
ranks. A SIGTERM, a SIGKILL (nothing of the parent's code runs) or a closed terminal must not
leave any of them training with no parent: cli/procs.py asks the kernel to signal each child when
its parent dies, and the demo stops its swarm on SIGTERM/SIGHUP as on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from cli.procs import start_node, stop, wait_for_file
from swarm.lifetime import descendants
from tests.helpers.procs import alive, wait_gone


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise TimeoutError(f"no {what} within {timeout:.0f} s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGHUP], ids=lambda s: s.name)
def test_a_demo_stopped_any_way_leaves_no_process(tmp_path, sig):
    demo = start_node("demo", ["demo", "--steps", "100000", "--workdir", str(tmp_path / "demo")], tmp_path / "logs")
    try:
        metrics = tmp_path / "demo" / "learner" / "metrics.jsonl"
        wait_until(lambda: metrics.exists() and '"step"' in metrics.read_text(), 240, "learner step")
        board = tmp_path / "demo" / "leaderboard.url"  # (the demo starts its leaderboard once the learner trains)
        wait_until(lambda: board.exists() and board.read_bytes().strip(), 120, "the leaderboard's address")
        swarm = set(descendants(demo.popen.pid))
        assert len(swarm) >= 5, f"bootstrap, learner, 2 samplers and the leaderboard, with their DHTs: {swarm}"
        demo.popen.send_signal(sig)
        left = wait_gone(swarm, 60)
        assert not left, f"{len(left)} of the demo's {len(swarm)} processes still run {sig.name} later"
        rc = demo.popen.wait(30)
        if sig != signal.SIGKILL:  # it stopped its swarm itself, said so, and did not claim success
            out = demo.log_path.read_text()
            assert f"stopped by {sig.name}" in out and "stopped 5 processes" in out and "still alive" not in out, out[-2000:]
            assert rc == 1
    finally:
        stop([demo])


def test_a_killed_multi_rank_learner_takes_torchrun_and_its_ranks_with_it(tmp_path):
    """SIGKILL of `join --nproc-per-node 2` (the process a user started): torchrun and both ranks,
    with rank 0's DHT and p2pd, stop gracefully (torchrun gets SIGTERM when its parent dies)."""
    from helpers.swarmkit import Swarm, start_bootstrap

    s = Swarm(tmp_path)
    try:
        start_bootstrap(s)
        learner = s.start_learner("[learner]\neval_every = 0\neval_size = 30\nmax_tokens_per_microbatch = 256\n",
                                  "--nproc-per-node", "2", "--device", "cpu")
        wait_until(lambda: "FSDP2 over 2 processes" in learner.log_path.read_text(), 240, "two ranks")
        ranks = set(descendants(learner.popen.pid))
        assert len(ranks) >= 3, f"torchrun and two ranks: {ranks}"
        learner.popen.send_signal(signal.SIGKILL)
        learner.popen.wait(10)
        left = wait_gone(ranks, 90)
        assert not left, f"{len(left)} of {len(ranks)} processes of the killed learner still run:\n" + \
            learner.log_path.read_text()[-3000:]
    finally:
        s.stop_all()


@pytest.mark.parametrize("command", [
    ["bootstrap", "--port", "0", "--host", "127.0.0.1", "--no-nat", "--identity", "{tmp}/boot.key",
     "--addr-file", "{tmp}/ready"],
    ["leaderboard", "--serve", "127.0.0.1:0", "--db", "{tmp}/board/leaderboard.db", "--url-file", "{tmp}/ready"],
], ids=lambda c: c[0])
def test_one_ctrl_c_stops_a_command(tmp_path, command):
    """The first Ctrl-C stops it, cleanly (exit 0, nothing logged as an error, nothing left)."""
    proc = start_node(command[0], [a.replace("{tmp}", str(tmp_path)) for a in command], tmp_path / "logs")
    try:
        wait_for_file(tmp_path / "ready", 90, proc)
        proc.popen.send_signal(signal.SIGINT)
        assert proc.popen.wait(30) == 0
        assert not proc.group_alive()
        log = proc.log_path.read_text()
        assert "Traceback" not in log and "ERROR" not in log, log
    finally:
        stop([proc])


def test_a_node_killed_with_its_output_piped_to_a_reader_that_died_leaves_no_process(tmp_path):
    """A bootstrap whose stdout and stderr are pipes (a supervisor, a test's capture), killed with
    -9, its reader gone with it: its DHT process logs that it stops, the broken pipe made rich's
    handler raise SystemExit in the DHT's watch thread, and the DHT and p2pd lived on for good."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "bootstrap", "--port", "0", "--host", "127.0.0.1",
                             "--no-nat", "--identity", str(tmp_path / "b.key"), "--addr-file", str(tmp_path / "addr")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    helpers: set[int] = set()
    try:
        wait_until(lambda: (tmp_path / "addr").exists(), 90, "the bootstrap's address")
        helpers = set(descendants(proc.pid))  # its DHT process, p2pd, torch's shared-memory manager
        assert helpers, "no DHT process or p2pd"
        proc.kill()
        proc.wait()
        proc.stdout.close()  # the reader is gone: the helpers' next write meets a broken pipe
        proc.stderr.close()
        assert not wait_gone(helpers, 30), "the DHT process or p2pd outlived the node"
    finally:
        proc.kill()
        for pid in alive(helpers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
