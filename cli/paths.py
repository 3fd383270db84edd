"""The paths a user names on the command line: checked before anything starts, and claimed by one process.

Every command checks the files and folders it will write (`writable_dir`, `writable_file`) before
it loads a model or joins a swarm, so a path it cannot write is one line, not a traceback later.

A workdir, or a bootstrap's identity file, belongs to one process at a time (`claim_dir`,
`claim_file`): two runs sharing one would take the same peer id (the second is refused by the
DHT) and overwrite each other's outbox, addresses and metrics. The claim is an OS lock
(fcntl.flock on `<dir>/.lock`), which the kernel drops when the process dies however it dies, so
a crashed run never leaves a stale lock; the file's text (pid and command) only names the
holder in the refusal. When the claim ends (the process exits, or the claim is closed) the lock
file goes, and so do the folders the claim made if they are still empty: a command refused after
its claim (a wrong --model, a busy port) leaves nothing behind. A forked child (hivemind's DHT
process) shares the lock: it never removes the file, and its parent leaves it while the child
still holds it.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import tempfile
import weakref
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


def claim_dir(path: str | Path, flag: str, command: str) -> Claim | None:
    """Check `path` is a writable folder and lock `<path>/.lock` for this process's lifetime.

    Keep the returned claim referenced: closing it (or dropping it) releases the claim. None when a
    process that started this one (e.g. `join --nproc-per-node` for its torchrun ranks) holds it already."""
    path = writable_dir(path, flag)
    made = _missing(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _remove_empty(made)
        raise UserError(f"cannot make {flag} {path} ({e.strerror or e})", f"pass another {flag}") from None
    return _claim(path / ".lock", path, flag, command, made)


def claim_file(path: str | Path, flag: str, command: str) -> Claim | None:
    """As `claim_dir`, for one file (a bootstrap's identity): locks `.<name>.lock` beside it."""
    path = writable_file(path, flag)
    made = _missing(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)  # writable_file found it can be made
    return _claim(path.parent / f".{path.name}.lock", path, flag, command, made)


class Claim:
    """A held claim: its lock file stays locked until `close()`, until the claim is dropped, or until
    the process exits; then the lock file is removed, and the folders `made` for the claim if empty."""

    _held: "weakref.WeakSet[Claim]" = weakref.WeakSet()

    def __init__(self, file: IO[str], lock_path: Path, made: list[Path]) -> None:
        self._file, self.lock_path, self._made, self._pid = file, lock_path, made, os.getpid()
        Claim._held.add(self)

    def close(self) -> None:
        file, self._file = self._file, None
        if file is None:
            return
        file.close()
        if os.getpid() == self._pid:  # a forked child leaves its parent's claim alone
            _remove_lock(self.lock_path, self._made)

    def __del__(self) -> None:
        self.close()


@atexit.register
def _close_claims() -> None:
    for claim in list(Claim._held):
        claim.close()


def _claim(lock_path: Path, shown: Path, flag: str, command: str, made: list[Path]) -> Claim | None:
    for _ in range(8):  # the lock file was removed by a holder that just ended: lock the new one
        try:
            f = open(lock_path, "a+")  # not "w": that would erase the holder's pid before we know it holds the lock
        except OSError as e:
            _remove_empty(made)
            raise UserError(f"cannot lock {shown}: {lock_path} ({e.strerror or e})", f"pass another {flag}") from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().split(maxsplit=1)
            f.close()
            if holder and holder[0].isdigit() and int(holder[0]) in _ancestors():
                return None
            raise UserError(f"{shown} is in use by {_holder(holder)}", f"stop it or pass another {flag}") from None
        if _is_at(f.fileno(), lock_path):
            break
        f.close()
    else:
        raise UserError(f"{shown} is in use by another process", f"stop it or pass another {flag}")
    f.truncate(0)
    f.write(f"{os.getpid()} {command}\n")
    f.flush()
    return Claim(f, lock_path, made)


def _holder(holder: list[str]) -> str:
    """Who holds a lock, from its file's text (pid and command)."""
    if len(holder) != 2 or not holder[0].isdigit():
        return "another process"
    # a forked child (e.g. hivemind's DHT) shares the lock, and may outlive the process named in the file
    return (f"hetero-node {holder[1].strip()} (pid {holder[0]})" if _alive(int(holder[0])) else
            f"a process left by hetero-node {holder[1].strip()} (pid {holder[0]}, exited)")


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is still the one at `path` (not removed by the holder before us)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _remove_lock(lock_path: Path, made: list[Path]) -> None:
    """Remove an ended claim's lock file, unless someone holds it still (a forked child shares our lock:
    it outlives our own handle, closed by now), then the folders the claim made, if empty."""
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _is_at(fd, lock_path):
            os.unlink(lock_path)  # while locked: a process that opened it meanwhile sees it is gone (_is_at)
    except OSError:  # held by a child, or already gone
        return
    finally:
        os.close(fd)
    _remove_empty(made)


def _missing(folder: Path) -> list[Path]:
    """`folder` and its ancestors that do not exist yet, deepest first (what a claim would make)."""
    folder = folder.absolute()
    return [p for p in (folder, *folder.parents) if not p.exists()]


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first: stops at the first one something else was put in
        try:
            folder.rmdir()
        except OSError:
            return


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
