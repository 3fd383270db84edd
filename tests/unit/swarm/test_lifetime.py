"""A node's helper process (hivemind's DHT, and the p2pd it starts) ends with the node, however the
node ends (swarm/lifetime.py). Real processes: a "node" that starts a "DHT" process, which binds a
hivemind-named unix socket and starts a long-lived child in p2pd's place."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from swarm.lifetime import children, descendants, unix_socket_paths
from helpers.repo import ROOT
from helpers.wait import PATIENCE_S

HELPER = """
import socket, subprocess, sys, time
from swarm.lifetime import end_with_parent
end_with_parent(poll_s=0.1)
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()
daemon = subprocess.Popen(["sleep", "120"])
print(daemon.pid, flush=True)
time.sleep(120)
"""
NODE = """
import socket, subprocess, sys, time
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[2] + ".node"); s.listen()
helper = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
print(helper.pid, flush=True)
time.sleep(120)
"""


def _gone(pid: int, timeout: float = PATIENCE_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def node(tmp_path):
    sock = f"/tmp/hivemind-test-{uuid.uuid4().hex[:8]}.sock"
    proc = subprocess.Popen([sys.executable, "-c", NODE, HELPER, sock], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    helper = int(proc.stdout.readline())
    deadline = time.monotonic() + 30
    while not children(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    (daemon,) = children(helper)
    yield proc, helper, daemon, sock
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(PATIENCE_S)
    for path in (sock, sock + ".node"):
        if os.path.exists(path):
            os.unlink(path)


def test_a_helper_process_ends_with_its_daemon_when_the_node_is_killed_9(node):
    proc, helper, daemon, sock = node
    assert sock in unix_socket_paths(helper)
    proc.kill()  # SIGKILL: nothing of the node's code runs
    proc.wait(PATIENCE_S)
    assert _gone(helper) and _gone(daemon), "the helper or its daemon outlived the node"
    assert not os.path.exists(sock), "the helper's hivemind socket was left in /tmp"
    assert not os.path.exists(sock + ".node"), "the node's hivemind socket was left in /tmp"


def test_a_helper_process_stops_its_daemon_on_sigterm(node):
    proc, helper, daemon, sock = node
    os.kill(helper, signal.SIGTERM)  # hivemind's DHT.shutdown, when the DHT did not stop in time
    assert _gone(helper) and _gone(daemon)
    assert not os.path.exists(sock)
    assert proc.poll() is None  # the node itself is left alone


def test_descendants_walks_the_whole_tree_parents_first():
    # a shell that starts a shell that starts `sleep`: three generations of real processes
    top = subprocess.Popen(["sh", "-c", "sh -c 'sleep 60; true' & wait"])
    try:
        deadline = time.monotonic() + PATIENCE_S
        while len(descendants(top.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = descendants(top.pid)
        assert len(tree) == 2, tree
        middle, leaf = tree
        assert children(top.pid) == [middle] and children(middle) == [leaf]
    finally:
        for pid in [*reversed(descendants(top.pid)), top.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        top.wait(PATIENCE_S)
