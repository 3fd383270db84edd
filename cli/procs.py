"""Start swarm nodes as child processes and reap them, with everything they started, by process group.

Each node runs in its own session (`start_new_session=True`), so its DHT process and p2pd share
its process group. `stop` sends SIGTERM to the node alone (it shuts its DHT and p2pd down itself,
in order: a SIGTERM to the whole group would stop p2pd under the node's feet and make every
process of the group log its own "stopping"), waits, then SIGKILLs the group, so nothing is
orphaned even when a node was killed with -9 and could not clean up itself.

A child also dies with its parent, however the parent ends (SIGKILL, a closed terminal): on Linux
it asks the kernel for a SIGTERM when its parent dies (PR_SET_PDEATHSIG), so a killed `demo` or
`join --nproc-per-node` never leaves a swarm training with no one to stop it.

The node's side: `stop_on_signals` turns the first stop signal into a graceful stop, the second
into `force_exit`.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from swarm.lifetime import descendants, proc_table as _proc_table


@dataclass
class NodeProcess:
    name: str
    popen: subprocess.Popen
    log_path: Path
    terminated: bool = False
    """SIGTERM sent (`terminate`)."""

    @property
    def pgid(self) -> int:
        return self.popen.pid  # session leader: its pid is the group id

    def group_alive(self) -> bool:
        """Any live (non-zombie) process left in the node's group: itself, its DHT or p2pd."""
        self.popen.poll()  # reap our own child if it has exited
        return bool(group_members(self.pgid))

    def terminate(self) -> None:
        """Ask the node to stop (SIGTERM: it stops its own DHT and p2pd), once: a second SIGTERM
        would force it (`stop_on_signals`)."""
        if not self.terminated and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            self.terminated = True

    def kill9(self) -> None:
        """Only the node process itself, as a crash would (its DHT process then stops itself and p2pd)."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid`. Zombies do not count: an orphan killed with its
    group stays a zombie until PID 1 reaps it, but it is already gone."""
    return [pid for pid, state, _, group in _proc_table() if group == pgid and state != "Z"]


def kill_descendants(pid: int | None = None) -> None:
    """SIGKILL every descendant of `pid` (default: this process), deepest first."""
    for p in reversed(descendants(pid or os.getpid())):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl-C, kill, and a closed terminal: every command stops on each."""


def force_exit(signum: int, frame=None) -> None:
    """A signal handler for the second stop signal: kill everything this process started (its DHT
    process and p2pd, or a demo's swarm) and exit at once, 128 + the signal as a shell reports it."""
    kill_descendants()
    os._exit(128 + signum)


def stop_on_signals() -> threading.Event:
    """A threading.Event set by SIGINT/SIGTERM/SIGHUP (a node's graceful stop); a second signal
    exits at once through `force_exit` (taking our DHT process and p2pd down with us)."""
    stop = threading.Event()

    def handler(signum, frame):
        if stop.is_set():
            force_exit(signum)
        logging.getLogger("hetero-node").info("stopping (signal %d); again to force", signum)
        stop.set()

    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    return stop


def die_with_parent() -> Callable[[], None]:
    """A Popen preexec_fn: the child gets SIGTERM when its parent (this process) dies (Linux).

    The kernel sends it when the thread that forked the child exits, so call Popen from the main
    thread. libc is loaded here, in the parent: the child only calls prctl between fork and exec.
    Where there is no prctl it does nothing, and `stop` and the parent's signal handlers remain."""
    import ctypes

    parent = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None

    def in_child() -> None:
        prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        if os.getppid() != parent:  # the parent died before prctl took effect: nobody will send it
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


def grid_pool(workers: int):
    """A spawn Pool of one-task workers for an experiment grid (examples/paper_*) that never outlives
    its parent: SIGTERM or SIGHUP to the parent exits it through the pool's `with`, whose exit
    terminates the workers, and each worker ends within a second of the parent's death by any other
    way (SIGKILL, the OOM killer). Call from the main thread, which then owns those two signals.

    Not PR_SET_PDEATHSIG: the kernel sends it when the *thread* that forked a worker exits, and the
    pool's worker-handler thread, which forks the replacements of one-task workers, exits at the
    pool's own terminate(), killing a worker that may hold the result queue's lock: terminate() then
    waits on that lock forever (seen: 5 of 17 tiny grids hung)."""
    import multiprocessing as mp

    from swarm.lifetime import end_with_parent

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    return mp.get_context("spawn").Pool(workers, maxtasksperchild=1, initializer=end_with_parent)


P2PD_LOGS = "HETERO_P2PD_LOGS"
"""Set (to anything) in the environment of a process that starts nodes: each node's p2pd writes its
own debug log (streams it reset or could not hand to the node) to log_dir/NAME.p2pd.log."""


def start_node(name: str, args: list[str], log_dir: Path, threads: int = 1, module: str = "cli.main",
               nofile: int | None = None) -> NodeProcess:
    """`python -m module args` in its own session, logging to log_dir/name.log; `nofile`: its
    open-file limit, soft and hard (a volunteer's default, for tests of exhaustion)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HETERO_NODE_THREADS": str(threads),
           "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    if os.environ.get(P2PD_LOGS):  # p2pd's own log beside the node's (hivemind keeps only its errors)
        env.setdefault("GOLOG_LOG_LEVEL", "error,p2pd=debug,basichost=debug")
        env["GOLOG_FILE"] = str(log_dir / f"{name}.p2pd.log")
    with open(log_path, "ab") as log:
        popen = subprocess.Popen([sys.executable, "-m", module, *args], stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                 preexec_fn=_with_nofile(die_with_parent(), nofile))
    return NodeProcess(name, popen, log_path)


def _with_nofile(preexec: Callable[[], None], nofile: int | None) -> Callable[[], None]:
    if nofile is None:
        return preexec

    def in_child() -> None:
        preexec()
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    return in_child


def stop(nodes: list[NodeProcess], grace: float = 15.0) -> None:
    """SIGTERM every node (each stops its own DHT and p2pd), wait up to `grace` seconds, then
    SIGKILL whatever is left of each group."""
    for n in nodes:
        if n.popen.poll() is None:
            n.terminate()
        elif n.group_alive():  # the node is gone (killed -9?): nothing will stop its DHT and p2pd gently
            _killpg(n.pgid)
    deadline = time.monotonic() + grace
    for n in nodes:
        while n.group_alive() and time.monotonic() < deadline:
            n.popen.poll()
            time.sleep(0.1)
        if n.group_alive():
            _killpg(n.pgid)
        kill_deadline = time.monotonic() + 10
        while n.group_alive() and time.monotonic() < kill_deadline:
            time.sleep(0.05)  # SIGKILL is asynchronous: wait until the members are really gone


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
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
