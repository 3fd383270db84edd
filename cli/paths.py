"""The paths a user names on the command line: checked before anything starts, and claimed by one process.

Every command checks the files and folders it will write (`writable_dir`, `writable_file`) before
it loads a model or joins a swarm, so a path it cannot write is one line, not a traceback later.

A workdir, or a bootstrap's identity file, belongs to one process at a time (`claim_dir`,
`claim_file`): two runs sharing one would take the same peer id (the second is refused by the
DHT) and overwrite each other's outbox, addresses and metrics. The claim is an OS lock
(fcntl.flock on `<dir>/.lock`), which the kernel drops when the process dies however it dies, so
a crashed run never leaves a stale lock; the file's text (pid and command) only names the
holder in the refusal.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import IO

from cli.errors import UserError


def writable_dir(path: str | Path, flag: str) -> Path:
    """`path` as a folder this process can write or create; else UserError naming `flag`. Creates
    nothing: a command that stops on a later mistake leaves no empty folders behind."""
    path = Path(path)
    _check_dir(path, flag, path)
    return path


def writable_file(path: str | Path, flag: str) -> Path:
    """`path` as a file this process can create or append to, in a folder it can write or create."""
    path = Path(path)
    _stat(path, flag)
    if path.is_dir():
        raise UserError(f"{flag} {path} is a folder, not a file", f"pass a file path to {flag}")
    _check_dir(path.parent, flag, path)
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"cannot write {flag} {path} (permission denied)", f"pass a {flag} file you can write")
    return path


def _check_dir(folder: Path, flag: str, shown: Path) -> None:
    """`folder` exists and takes a new file, or its nearest existing ancestor does (so it can be made).
    A probe file, not os.access: root passes os.access on a read-only mount or on /proc."""
    fix = f"pass a {flag} path in a folder you can write"
    for p in (folder, *folder.parents):
        _stat(p, flag)
    existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"cannot write {flag} {shown}: {existing} is a file, not a folder", fix)
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".hetero-node-probe"):
            pass
    except OSError as e:
        raise UserError(f"cannot write {flag} {shown}: cannot create files in {existing} ({e.strerror or e})",
                        fix) from None


def _stat(path: Path, flag: str) -> None:
    """A path we may not even look at (EACCES on a parent: exists() and is_dir() would raise)."""
    try:
        path.exists()
    except OSError as e:
        raise UserError(f"cannot write {flag} {path}: {e.strerror or e}", f"pass a {flag} path you can write") from None


def claim_dir(path: str | Path, flag: str, command: str) -> IO[str] | None:
    """Check `path` is a writable folder and lock `<path>/.lock` for this process's lifetime.

    Keep the returned file referenced: closing it releases the claim. None when a process that
    started this one (e.g. `join --nproc-per-node` for its torchrun ranks) holds it already."""
    path = writable_dir(path, flag)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot make {flag} {path} ({e.strerror or e})", f"pass another {flag}") from None
    return _claim(path / ".lock", path, flag, command)


def claim_file(path: str | Path, flag: str, command: str) -> IO[str] | None:
    """As `claim_dir`, for one file (a bootstrap's identity): locks `.<name>.lock` beside it."""
    path = writable_file(path, flag)
    path.parent.mkdir(parents=True, exist_ok=True)  # writable_file found it can be made
    return _claim(path.parent / f".{path.name}.lock", path, flag, command)


def _claim(lock_path: Path, shown: Path, flag: str, command: str) -> IO[str] | None:
    try:
        f = open(lock_path, "a+")  # not "w": that would erase the holder's pid before we know it holds the lock
    except OSError as e:
        raise UserError(f"cannot lock {shown}: {lock_path} ({e.strerror or e})", f"pass another {flag}") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().split(maxsplit=1)
        f.close()
        if holder and holder[0].isdigit() and int(holder[0]) in _ancestors():
            return None
        who = "another process"
        # a forked child (e.g. hivemind's DHT) shares the lock, and may outlive the process named in the file
        if len(holder) == 2 and holder[0].isdigit():
            who = (f"hetero-node {holder[1].strip()} (pid {holder[0]})" if _alive(int(holder[0])) else
                   f"a process left by hetero-node {holder[1].strip()} (pid {holder[0]}, exited)")
        raise UserError(f"{shown} is in use by {who}", f"stop it or pass another {flag}") from None
    f.truncate(0)
    f.write(f"{os.getpid()} {command}\n")
    f.flush()
    return f


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _ancestors() -> set[int]:
    """The pids of this process's parent, grandparent, ... (Linux /proc; elsewhere the parent only)."""
    pids, pid = set(), os.getppid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after ')'
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids
