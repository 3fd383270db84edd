"""Start swarm nodes as child processes and reap them, with everything they started, by process group.

Each node runs in its own session (`start_new_session=True`), so its DHT process and p2pd share
its process group: `stop` sends SIGTERM to the group (graceful), waits, then SIGKILLs the group,
so nothing is orphaned even when a node was killed with -9 and could not clean up itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class NodeProcess:
    name: str
    popen: subprocess.Popen
    log_path: Path

    @property
    def pgid(self) -> int:
        return self.popen.pid  # session leader: its pid is the group id

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
            return True
        except ProcessLookupError:
            return False

    def kill9(self) -> None:
        """Only the node process itself, as a crash would (its DHT and p2pd are left behind)."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)


def start_node(name: str, args: list[str], log_dir: Path, threads: int = 1) -> NodeProcess:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HETERO_NODE_THREADS": str(threads),
           "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    with open(log_path, "ab") as log:
        popen = subprocess.Popen([sys.executable, "-m", "cli.main", *args], stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    return NodeProcess(name, popen, log_path)


def stop(nodes: list[NodeProcess], grace: float = 15.0) -> None:
    """SIGTERM every group, wait up to `grace` seconds, then SIGKILL what is left."""
    for n in nodes:
        if n.group_alive():
            try:
                os.killpg(n.pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for n in nodes:
        while n.group_alive() and time.monotonic() < deadline:
            n.popen.poll()
            time.sleep(0.1)
        if n.group_alive():
            try:
                os.killpg(n.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            n.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass


def wait_for_file(path: Path, timeout: float, proc: NodeProcess | None = None) -> bytes:
    """Contents of `path` once it exists and is non-empty; raises after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            return path.read_bytes()
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited early; see {proc.log_path}")
        time.sleep(0.2)
    raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")


if __name__ == "__main__":  # pragma: no cover
    sys.exit("not a script")
