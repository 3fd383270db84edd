"""cli/procs.py's last resort: a forced exit kills every descendant of a process, grandchildren
included. What ends with a parent however it ends, as real processes:
tests/integration/cli/test_stop.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.wait import until


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and f" {pid} " in (p / "stat").read_text().split(")")[-1][:40]:
                out.append(int(p.name))
        except OSError:  # gone while read
            pass
    return out


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "gone"


def test_forced_exit_kills_all_descendants(tmp_path):
    from cli.procs import kill_descendants

    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"])
    try:
        until(lambda: _children(parent.pid), "the grandchild started")
        kids = _children(parent.pid)
        kill_descendants(parent.pid)
        until(lambda: all(_state(k) in ("Z", "gone") for k in kids), f"descendants {kids} dead")
    finally:
        parent.kill()
        parent.wait()
