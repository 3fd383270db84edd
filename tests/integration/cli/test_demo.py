"""`hetero-node demo`, the first command a newcomer runs, as they run it (integration).

A short demo in an 80-column terminal: it learns, what it prints agrees with itself (the progress
line's final eval is the summary's, one name per sampler in every table, no empty header row),
everything a user must copy is on one line (a wrapped command pastes broken), it names its
bootstrap address and the folder it wrote, stops every process it started, and no process logs
an error on that clean stop.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def test_a_short_demo_learns_and_prints_what_a_user_needs(tmp_path):
    env = {**os.environ, "COLUMNS": "80", "LINES": "40"}
    out = subprocess.run([sys.executable, "-m", "cli.main", "demo", "--steps", "60", "--workdir", str(tmp_path)],
                         capture_output=True, text=True, timeout=540, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text  # 0 only if eval accuracy rose

    final_eval = re.search(r"final eval (\d+\.\d)%", text).group(1)
    summary = re.search(r"eval accuracy\s*│\s*\d+\.\d% -> (\d+\.\d)%", text).group(1)
    assert final_eval == summary, text

    assert not re.search(r"┃\s+┃\s+┃", text), "the summary has an empty header row"
    groups = re.search(r"groups accepted\s*│\s*\d+ \((.*?)\)", text).group(1)
    assert re.findall(r"sampler-\d", groups) == ["sampler-0", "sampler-1"], groups
    board_names = re.findall(r"│\s*\d\s*│\s*\S+\s*│\s*(sampler-\d)\s*│", text)
    assert sorted(board_names) == ["sampler-0", "sampler-1"], text

    commands = [line.strip() for line in text.splitlines() if line.strip().startswith("hetero-node ")]
    kinds = {c.split()[1] for c in commands}
    assert {"status", "leaderboard", "plot"} <= kinds, commands
    status = next(c for c in commands if c.split()[1] == "status")
    assert re.fullmatch(r"hetero-node status --initial-peers /ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+", status), status
    plot = next(c for c in commands if c.split()[1] == "plot")
    assert str(tmp_path) in plot and str(tmp_path) in text.splitlines()[0]

    assert "stopped 5 processes" in text and "still alive" not in text, text
    assert not any(str(tmp_path).encode() in c for c in _cmdlines()), "a process of the demo's is still running"
    for log in (tmp_path / "logs").glob("*.log"):
        bad = [line for line in log.read_text().splitlines() if re.search(r"\bERROR\b|Traceback", line)]
        assert not bad, f"{log.name}: " + "\n".join(bad[:10])

    # the plot command it printed works as printed
    plotted = subprocess.run([sys.executable, "-m", "cli.main", *plot.split()[1:]], capture_output=True, text=True,
                             timeout=300)
    assert plotted.returncode == 0, plotted.stderr
    assert list((tmp_path / "plots").glob("*.png"))


def _cmdlines() -> list[bytes]:
    out = []
    for c in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            out.append(c.read_bytes())
        except OSError:  # exited while we looked
            pass
    return out
