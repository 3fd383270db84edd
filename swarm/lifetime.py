"""The node's helper processes end when the node does, however it ends.

hivemind runs the DHT in a forked process, which starts p2pd. When the node is killed with -9 (or
by the kernel's OOM killer, the common way a volunteer's node dies), nothing of its code runs, and
both used to live on, re-parented to init, holding the node's port and identity: a restarted node
then met its own ghost in the swarm. `end_with_parent`, called in the DHT's process, watches for
the node's death and stops p2pd and itself, and removes the sockets hivemind left in /tmp; it also
stops them on a SIGTERM (hivemind's last resort when the DHT does not shut down in time), which
used to leave p2pd running.

The watch polls the parent's pid rather than asking the kernel (PR_SET_PDEATHSIG): the kernel sends
that signal when the *thread* that forked the child exits, and the DHT may be created from any
thread.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

SOCKET_PREFIX = "/tmp/hivemind-"
"""hivemind's unix sockets between a process and p2pd (its daemon's and each client's): files that
outlive a killed process. Only these are removed."""


def proc_table() -> list[tuple[int, str, int, int]]:
    """(pid, state, ppid, pgid) of every process, from /proc (Linux)."""
    rows = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        state, ppid, pgid = stat[stat.rindex(")") + 2 :].split()[:3]  # after "pid (comm) "
        rows.append((int(entry.name), state, int(ppid), int(pgid)))
    return rows


def children(pid: int) -> list[int]:
    """Live (non-zombie) direct children of `pid`."""
    return [p for p, state, parent, _ in proc_table() if parent == pid and state != "Z"]


def descendants(pid: int) -> list[int]:
    """Live (non-zombie) descendants of `pid`, each after its parent."""
    kids: dict[int, list[int]] = {}
    for child, state, parent, _ in proc_table():
        if state != "Z":
            kids.setdefault(parent, []).append(child)
    found, todo = [], list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo += kids.get(p, [])
    return found


def unix_socket_paths(pid: int) -> list[str]:
    """Paths of the unix sockets `pid` holds open (its fds matched to its namespace's socket table)."""
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
        lines = Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]
    except OSError:  # gone, or not ours to read
        return []
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:  # closed since listed (the listing's own fd, when pid is us)
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    # Num RefCount Protocol Flags Type St Inode [Path]
    return [cols[7] for cols in (line.split() for line in lines) if len(cols) >= 8 and cols[6] in inodes]


def hivemind_sockets(pid: int) -> set[str]:
    return {p for p in unix_socket_paths(pid) if p.startswith(SOCKET_PREFIX)}


def stop_children_and_exit(code: int, grace_s: float = 3.0, also_remove: set[str] = frozenset()) -> None:
    """SIGTERM this process's children (p2pd), SIGKILL what is left after `grace_s`, remove the
    hivemind sockets they and we held (and `also_remove`), and exit with `code` at once."""
    kids = children(os.getpid())
    paths = set(also_remove).union(*(hivemind_sockets(pid) for pid in (os.getpid(), *kids)))
    for pid in kids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(pid in children(os.getpid()) for pid in kids):
        time.sleep(0.05)
    for pid in children(os.getpid()):
        _signal(pid, signal.SIGKILL)
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass
    os._exit(code)


def end_with_parent(poll_s: float = 1.0) -> None:
    """In a helper process: end (with its children) within `poll_s` of the parent's death, and on
    SIGTERM. The parent's own hivemind socket (its p2p client's, for incoming streams) is removed too:
    the last one seen while it lived, looked up every `5 * poll_s`."""
    parent = os.getppid()

    def watch() -> None:
        theirs: set[str] = set()
        for tick in itertools.count():
            if os.getppid() != parent:
                break
            if tick % 5 == 0:
                with contextlib.suppress(Exception):  # a look at /proc that failed: the last one seen stays
                    theirs = hivemind_sockets(parent) or theirs
            time.sleep(poll_s)
        # stderr may be a pipe whose reader died with the node: rich's handler then raises
        # SystemExit (its answer to a broken pipe), which ended this thread silently and left the
        # DHT and p2pd running for good (seen: a bootstrap killed by a test's timeout, its output captured)
        with contextlib.suppress(Exception, SystemExit):
            log.warning("the node's process %d is gone: stopping its DHT and p2pd", parent)
        stop_children_and_exit(0, also_remove=theirs)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop_children_and_exit(128 + signum))


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
