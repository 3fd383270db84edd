"""The README's "Join a swarm" commands, run as typed: a coordinator and two volunteers.

The commands are read from README.md itself, so the page and this test cannot drift apart. Only
the addresses are substituted: the coordinator's public IP becomes 127.0.0.1, its ports free
ones, and the bootstrap address the one the bootstrap prints. Each "machine" runs in a folder of
its own (the coordinator's bootstrap, learner and leaderboard share one, as the README says), with
default workdirs. The test sees rollouts flow from both volunteers, the leaderboard fill, and a
clean stop: SIGTERM as Ctrl-C would, no error in any log, no process left.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from cli.procs import NodeProcess, die_with_parent, stop
from helpers.readme import BOOT_ADDR, PUBLIC_IP, readme_commands
from helpers.jsonl import read_jsonl


def _free_ports(n: int) -> list[str]:
    """n distinct ports free now, below the kernel's ephemeral range. The commands take ports as text,
    so a port is checked, released and then bound by a node; one the kernel hands out for bind(0) or
    an outgoing connection could be taken by any process in between. Below that range only an
    explicit bind to that very port can take it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default start of the range
    picked: list[str] = []
    for port in random.Random().sample(range(20000, low), k=min(200, low - 20000)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        picked.append(str(port))
        if len(picked) == n:
            return picked
    raise RuntimeError(f"no {n} free ports in 20000-{low}")


def _start(name: str, command: str, cwd: Path, logs: Path) -> NodeProcess:
    """`command` as a user's shell runs it (bash: the README uses $(...)), in `cwd`, logging to logs/NAME.log."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HETERO_NODE_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "COLUMNS": "200", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    cwd.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as log:
        # exec: the command replaces bash, so the node itself is the group's leader that `stop` signals
        popen = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                 preexec_fn=die_with_parent())
    return NodeProcess(name, popen, logs / f"{name}.log")


def _wait_for(what: str, check, timeout: float, nodes: list[NodeProcess]):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        dead = [n.name for n in nodes if n.popen.poll() is not None]
        assert not dead, f"{dead} exited while waiting for {what}"
        time.sleep(1)
    raise TimeoutError(f"no {what} within {timeout:.0f} s")


def _metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return read_jsonl(path)


def _board(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url + "api/leaderboard", timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None


def test_the_readme_join_commands_make_a_learning_swarm(tmp_path):
    volunteer, bootstrap, learner, board = readme_commands()
    ports = dict(zip(("31337", "31338", "8080"), _free_ports(3)))
    sub = lambda c: re.sub(r"\b(31337|31338|8080)\b", lambda m: ports[m.group(1)], c).replace(PUBLIC_IP, "127.0.0.1")
    logs, coord = tmp_path / "logs", tmp_path / "coordinator"
    logs.mkdir()
    nodes: list[NodeProcess] = []
    try:
        nodes.append(_start("bootstrap", sub(bootstrap), coord, logs))
        printed = _wait_for("bootstrap address", lambda: re.search(
            r"volunteers join with:\s+(hetero-node join .*)", nodes[0].log_path.read_text()), 90, nodes)
        paste = printed.group(1).strip()
        addr = re.search(r"--initial-peers (\S+)", paste).group(1)
        assert addr.startswith(f"/ip4/127.0.0.1/tcp/{ports['31337']}/p2p/")
        real = lambda c: BOOT_ADDR.sub(addr, c)
        # what the bootstrap tells volunteers to paste is the README's volunteer line, address filled in
        assert paste == real(volunteer), (paste, volunteer)
        nodes.append(_start("learner", sub(real(learner)), coord, logs))
        # the page on loopback only: this test opens nothing to the machine's network
        nodes.append(_start("leaderboard", sub(real(board)).replace("0.0.0.0:", "127.0.0.1:"), coord, logs))
        for i in (1, 2):
            nodes.append(_start(f"volunteer-{i}", paste, tmp_path / f"volunteer-{i}", logs))

        metrics = coord / "hetero-node-learner" / "metrics.jsonl"
        samplers = lambda: {p for r in _metrics(metrics) if r["kind"] == "step" for p, n in r["accepted_by_sampler"].items() if n}
        _wait_for("rollouts from both volunteers", lambda: len(samplers()) == 2, 300, nodes)
        url = f"http://127.0.0.1:{ports['8080']}/"
        filled = _wait_for("a leaderboard crediting both volunteers",
                           lambda: (b := _board(url)) and len([p for p in b["peers"] if p["rollouts"] > 0]) == 2 and b,
                           120, nodes)
        assert {p["peer_id"] for p in filled["peers"]} == samplers()
        steps = [r for r in _metrics(metrics) if r["kind"] == "step"]
        assert steps[-1]["version"] >= 2, "the learner published new versions"
        status = subprocess.run([sys.executable, "-m", "cli.main", "status", "--initial-peers", addr, "--json"],
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        roles = sorted(p["role"] for p in json.loads(status.stdout[status.stdout.index("["):]))
        assert roles.count("sampler") == 2 and "learner" in roles, roles
        learner_log = " ".join(nodes[1].log_path.read_text().split())  # rich wraps long lines
        assert f"volunteers join with: {paste}" in learner_log  # the learner prints the same command
        assert "the coordinator's swarm record names this learner" in learner_log
    finally:
        stop(nodes)  # SIGTERM to each node, as Ctrl-C: graceful
    left = [n.name for n in nodes if n.group_alive()]
    assert not left, f"still running: {left}"
    for n in nodes:
        text = n.log_path.read_text()
        bad = [line for line in text.splitlines() if re.search(r"\bERROR\b|Traceback|\[ERROR\]", line)]
        assert not bad, f"{n.name} logged errors during a clean run and stop:\n" + "\n".join(bad[:20])
