"""cli/procs.py's last resort: a forced exit kills every descendant of a process, grandchildren
included. What ends with a parent however it ends, as real processes:
tests/integration/cli/test_stop.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def test_forced_exit_kills_all_descendants(tmp_path):
    from cli.procs import kill_descendants

    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"])
    time.sleep(1.0)
    kids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
            and (p / "stat").exists() and f" {parent.pid} " in (p / "stat").read_text().split(")")[-1][:40]]
    assert kids, "the grandchild did not start"
    kill_descendants(parent.pid)
    time.sleep(0.3)
    for k in kids:
        state = Path(f"/proc/{k}/stat").read_text().split(")")[-1].split()[0] if Path(f"/proc/{k}").exists() else "gone"
        assert state in ("Z", "gone")
    parent.kill()
    parent.wait()
